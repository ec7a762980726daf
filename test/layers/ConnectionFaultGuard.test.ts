/**
 * The guard swallows only porsager's own connection faults, which no caller can observe; anything else keeps
 * Node's default.
 */
import { describe, expect, it } from "@effect/vitest"
import { isKnownConnectionFault } from "../../packages/pgfiber/src/layers/ConnectionFaultGuard.js"

const withStack = <E extends Error>(error: E, stack: string): E => Object.assign(error, { stack })

describe("ConnectionFaultGuard", () => {
  it("knows porsager's connection faults", () => {
    const terminated = withStack(
      Object.assign(new Error("terminating connection due to administrator command"), { name: "PostgresError", code: "57P01" }),
      "PostgresError: terminating connection due to administrator command\n    at ErrorResponse (node_modules/postgres/src/connection.js:794:26)"
    )
    expect(isKnownConnectionFault(terminated)).toBe(true)
    const closed = withStack(
      Object.assign(new Error("write CONNECTION_CLOSED 127.0.0.1:5432"), { code: "CONNECTION_CLOSED" }),
      "Error: write CONNECTION_CLOSED\n    at Socket.closed (node_modules/postgres/src/connection.js:453:57)"
    )
    expect(isKnownConnectionFault(closed)).toBe(true)
    // porsager/postgres#1208
    const nullSocket = withStack(
      new TypeError("Cannot read properties of null (reading 'write')"),
      "TypeError: Cannot read properties of null (reading 'write')\n    at Immediate.nextWrite (node_modules/postgres/src/connection.js:255:22)"
    )
    expect(isKnownConnectionFault(nullSocket)).toBe(true)
  })

  it("leaves everything else alone", () => {
    expect(isKnownConnectionFault(new TypeError("Cannot read properties of undefined (reading 'write')"))).toBe(false)
    expect(isKnownConnectionFault(withStack(new TypeError("x is not a function"), "TypeError\n    at nextWrite (node_modules/postgres/src/connection.js:1:1)"))).toBe(false)
    expect(isKnownConnectionFault(Object.assign(new Error("socket hang up"), { code: "ECONNRESET" }))).toBe(false)
    // a socket's own error, as porsager rejects a reserve() with it: the system call, the code, Node's frames only
    const raw = withStack(Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET", errno: -104, syscall: "read" }),
      "Error: read ECONNRESET\n    at TCP.onStreamRead (node:internal/stream_base_commons:218:20)")
    expect(isKnownConnectionFault(raw)).toBe(true)
    // the same code thrown from code of ours is not
    expect(isKnownConnectionFault(withStack(Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET", syscall: "read" }),
      "Error: read ECONNRESET\n    at handler (/app/src/mine.ts:1:1)"))).toBe(false)
    expect(isKnownConnectionFault(Object.assign(new Error("duplicate key"), { name: "PostgresError", code: "23505" }))).toBe(false)
    expect(isKnownConnectionFault("57P01")).toBe(false)
    expect(isKnownConnectionFault(undefined)).toBe(false)
  })
})
