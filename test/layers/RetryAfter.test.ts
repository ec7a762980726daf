import { Duration, Option } from "effect"
import { describe, expect, it } from "vitest"
import * as RetryAfter from "../../packages/pgfiber/src/layers/RetryAfter.js"

const now = Date.parse("2026-03-01T12:00:00Z")
const millis = (value: string | undefined) =>
  Option.map(RetryAfter.parse(value, now), Duration.toMillis).pipe(Option.getOrUndefined)

describe("RetryAfter.parse", () => {
  it("reads delay-seconds, whole or with a fraction, around spaces", () => {
    expect(millis(" 3 ")).toBe(3_000)
    expect(millis("0")).toBe(0)
    expect(millis("120")).toBe(120_000)
    expect(millis("1.5")).toBe(1_500)
    // digits are seconds, never a year
    expect(millis("2026")).toBe(2_026_000)
  })

  it("reads the three HTTP-date forms as the time until them", () => {
    expect(millis("Sun, 01 Mar 2026 12:00:30 GMT")).toBe(30_000)
    expect(millis("Sunday, 01-Mar-26 12:01:00 GMT")).toBe(60_000)
    // asctime has no zone: read as local time, so only its being a date is asserted
    expect(millis("Sun Mar  1 12:00:05 2026")).toBeDefined()
  })

  it("a date in the past is zero: retry now", () => {
    expect(millis("Sun, 01 Mar 2026 11:00:00 GMT")).toBe(0)
    expect(millis("Thu, 01 Jan 1970 00:00:00 GMT")).toBe(0)
  })

  it("negative, unreadable or missing is none (the caller's default applies)", () => {
    // Date.parse would take these as years or dates; neither is delay-seconds nor an HTTP-date
    expect(millis("-1")).toBeUndefined()
    expect(millis("2026-03-01")).toBeUndefined()
    expect(millis("1e3")).toBeUndefined()
    expect(millis("soon")).toBeUndefined()
    expect(millis("Sun, 01 Mar 2026")).toBeUndefined()
    expect(millis("")).toBeUndefined()
    expect(millis("   ")).toBeUndefined()
    expect(millis(undefined)).toBeUndefined()
  })
})
