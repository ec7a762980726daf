import { Either } from "effect"
import { describe, expect, it } from "vitest"
import * as Limits from "../../packages/pgfiber/src/queue/Limits.js"

describe("Limits.parseRate", () => {
  it("reads the rates the configuration and the CLI accept", () => {
    expect(Limits.parseRate("20/s")).toEqual(Either.right({ limit: 20, perMs: 1000 }))
    expect(Limits.parseRate("500/1h")).toEqual(Either.right({ limit: 500, perMs: 3_600_000 }))
    expect(Limits.parseRate(" 5 / 10m ")).toEqual(Either.right({ limit: 5, perMs: 600_000 }))
  })

  it("refuses what the database could not hold with a message, instead of failing later", () => {
    for (const text of ["9999999999/s", "1/99999999d", "0/s", "1/0s", "fast"]) {
      const parsed = Limits.parseRate(text)
      expect(Either.isLeft(parsed), text).toBe(true)
      if (Either.isLeft(parsed)) expect(parsed.left).toContain(JSON.stringify(text.trim() === text ? text : text))
    }
  })
})
