/**
 * The failed-authentication limit as a value: per address, per window, forgetting the oldest addresses first.
 */
import { describe, expect, it } from "@effect/vitest"
import * as AuthLimiter from "../../src/http/AuthLimiter.js"

describe("AuthLimiter", () => {
  it("blocks an address after maxFailures in its window, until the window ends; other addresses are not affected", () => {
    const limiter = AuthLimiter.make({ maxFailures: 3, windowMs: 1000, maxClients: 100 })
    for (let i = 0; i < 3; i++) {
      expect(limiter.blockedForMs("10.0.0.1", 100 + i)).toBe(0)
      limiter.recordFailure("10.0.0.1", 100 + i)
    }
    expect(limiter.blockedForMs("10.0.0.1", 500)).toBe(600)
    expect(limiter.blockedForMs("10.0.0.2", 500)).toBe(0)
    expect(limiter.blockedForMs("10.0.0.1", 1100)).toBe(0)
    // a new window starts from scratch
    limiter.recordFailure("10.0.0.1", 1100)
    expect(limiter.blockedForMs("10.0.0.1", 1101)).toBe(0)
  })

  it("remembers at most maxClients addresses, forgetting the oldest window first", () => {
    const limiter = AuthLimiter.make({ maxFailures: 1, windowMs: 60_000, maxClients: 2 })
    limiter.recordFailure("a", 1)
    limiter.recordFailure("b", 2)
    limiter.recordFailure("c", 3)
    expect(["a", "b", "c"].map((address) => limiter.blockedForMs(address, 4) > 0)).toEqual([false, true, true])
  })
})
