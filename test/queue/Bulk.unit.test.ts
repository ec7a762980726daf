/**
 * The bulk filter as the faces read it (Bulk.ts): payload searches as JSON or key=value, ages, the checks every
 * face shares, and the in-memory containment that stands in for PostgreSQL's `@>`.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Either } from "effect"
import * as Bulk from "../../packages/pgfiber/src/queue/Bulk.js"

const right = <A, E>(e: Either.Either<A, E>): A => {
  if (Either.isLeft(e)) throw new Error(`expected Right, got ${JSON.stringify(e.left)}`)
  return e.right
}
const leftField = <A>(e: Either.Either<A, Bulk.InvalidFilter>) => (Either.isLeft(e) ? e.left.field : "accepted")

describe("Bulk filters", () => {
  it("reads a payload search as JSON or as key=value pairs, values as JSON when they parse", () => {
    expect(right(Bulk.parsePayloadSearch(`{"customer":42}`))).toEqual({ customer: 42 })
    expect(right(Bulk.parsePayloadSearch("customer=42"))).toEqual({ customer: 42 })
    expect(right(Bulk.parsePayloadSearch(`customer="42"`))).toEqual({ customer: "42" })
    expect(right(Bulk.parsePayloadSearch("region=eu, vip=true & note=null"))).toEqual({ region: "eu", vip: true, note: null })
    expect(right(Bulk.parsePayloadSearch("order.id=7,order.kind=pro"))).toEqual({ order: { id: 7, kind: "pro" } })
    expect(right(Bulk.parsePayloadSearch("url=a=b"))).toEqual({ url: "a=b" })
    for (const bad of ["", "customer", "=1", "a.=1", "{oops", "[1]", "a=1,a.b=2"]) expect(leftField(Bulk.parsePayloadSearch(bad)), bad).toBe("payload")
  })

  it("reads ages in short units or Effect's words, and refuses anything else", () => {
    expect(Duration.toMillis(right(Bulk.parseAge("olderThan", "90s")))).toBe(90_000)
    expect(Duration.toMillis(right(Bulk.parseAge("olderThan", "2h")))).toBe(7_200_000)
    expect(Duration.toMillis(right(Bulk.parseAge("olderThan", "1.5d")))).toBe(129_600_000)
    expect(Duration.toMillis(right(Bulk.parseAge("olderThan", "30 minutes")))).toBe(1_800_000)
    for (const bad of ["yesterday", "-1h", "2 fortnights", ""]) expect(leftField(Bulk.parseAge("olderThan", bad)), bad).toBe("olderThan")
  })

  it("checks every field the same way for the CLI, HTTP and the dashboard", () => {
    expect(leftField(Bulk.filterFromText({ stage: "Not A Stage" }))).toBe("stage")
    expect(leftField(Bulk.filterFromText({ status: "dead" }))).toBe("status")
    expect(leftField(Bulk.filterFromText({ error: "x".repeat(201) }))).toBe("error")
    expect(leftField(Bulk.filterFromText({ subject: "a\u0000b" }))).toBe("subject")
    expect(leftField(Bulk.filterFromText({ payload: { s: "\ud800" } }))).toBe("payload")
    expect(leftField(Bulk.validateAction({ kind: "priority", priority: 101 }))).toBe("priority")
    // empty text is no condition at all
    const empty = right(Bulk.filterFromText({ stage: " ", payload: "", error: "" }))
    expect(Bulk.narrows(empty)).toBe(false)
    expect(Bulk.narrows(right(Bulk.filterFromText({ olderThan: "1h" })))).toBe(true)
  })

  it("matches containment as PostgreSQL's @> does, and escapes LIKE's wildcards in the error search", () => {
    expect(Bulk.jsonContains({ a: 1, b: { c: [1, 2, { d: 3 }] } }, { b: { c: [{ d: 3 }, 2] } })).toBe(true)
    expect(Bulk.jsonContains({ a: 1 }, { a: "1" })).toBe(false)
    expect(Bulk.jsonContains({ a: [1, 2] }, { a: 1 })).toBe(false)
    expect(Bulk.jsonContains({ a: null }, { a: null })).toBe(true)
    expect(Bulk.jsonContains({}, { a: null })).toBe(false)
    expect(Bulk.containsPattern("100%_\\x")).toBe("%100\\%\\_\\\\x%")
  })
})
