import { ConfigProvider, Duration, Effect, Either } from "effect"
import { describe, expect, it } from "vitest"
import * as Millis from "../../packages/pgfiber/src/layers/Millis.js"

const read = <A>(config: import("effect").Config.Config<A>, env: Record<string, string>) =>
  Effect.runSync(Effect.either(Effect.withConfigProvider(config, ConfigProvider.fromMap(new Map(Object.entries(env))))))

const millisOf = (either: Either.Either<Duration.Duration, unknown>) => Either.map(either, Duration.toMillis)

describe("Millis.config", () => {
  const bounded = Millis.config("X_MS", { min: 100, max: 60_000, fallback: 1000 })

  it("reads the variable as milliseconds; a missing one takes the fallback", () => {
    expect(millisOf(read(bounded, { X_MS: "250" }))).toEqual(Either.right(250))
    expect(millisOf(read(bounded, { X_MS: "100" }))).toEqual(Either.right(100))
    expect(millisOf(read(bounded, { X_MS: "60000" }))).toEqual(Either.right(60_000))
    expect(millisOf(read(bounded, {}))).toEqual(Either.right(1000))
    expect(millisOf(read(Millis.config("X_MS", { min: 0, fallback: "10 minutes" }), {}))).toEqual(Either.right(600_000))
  })

  it("an invalid value fails naming the variable and its bounds, never falling back", () => {
    for (const value of ["99", "60001", "1.5", "soon", ""]) {
      const result = read(bounded, { X_MS: value })
      expect(Either.isLeft(result), value).toBe(true)
      expect(String(Either.isLeft(result) ? result.left : ""), value).toContain("X_MS")
    }
    const below = read(bounded, { X_MS: "99" })
    expect(String(Either.isLeft(below) ? below.left : "")).toContain("must be a number of milliseconds from 100 to 60000")
  })

  it("says the bounds it holds to", () => {
    expect(Millis.message({ min: 100, max: 60_000 })).toBe("must be a number of milliseconds from 100 to 60000")
    expect(Millis.message({ min: 1 })).toBe("must be a positive number of milliseconds")
    expect(Millis.message({ min: 1000 })).toBe("must be a number of milliseconds, 1000 or more")
    const positive = read(Millis.config("Y_MS", { min: 1, fallback: 5 }), { Y_MS: "0" })
    expect(String(Either.isLeft(positive) ? positive.left : "")).toMatch(/Y_MS.*must be a positive number of milliseconds/s)
    expect(millisOf(read(Millis.config("Z_MS", { min: 0 }), { Z_MS: "0" }))).toEqual(Either.right(0))
  })

  it("with no fallback a missing variable is an error (the caller makes it optional)", () => {
    const result = read(Millis.config("Y_MS", { min: 1 }), {})
    expect(Either.isLeft(result)).toBe(true)
    expect(String(Either.isLeft(result) ? result.left : "")).toContain("Y_MS")
  })
})
