/**
 * The Waker's state (src/runtime/waker/State.ts) through its transitions: the listener's modes and what they
 * report, a stage's lead (forgotten with the connection, taken from a follower's place, given back when the pool
 * leaves), presence once per sweep interval, and the invariants checked on every transition.
 */
import { describe, expect, it } from "@effect/vitest"
import { InvariantBroken } from "../../packages/pgfiber/src/runtime/pool/Held.js"
import * as State from "../../packages/pgfiber/src/runtime/waker/State.js"

const pool = (woken: Array<string> = []): State.Pool => ({
  wake: (reason) => void woken.push(reason),
  paused: () => false,
  blocked: () => null,
  busy: () => false
})

describe("the Waker's state", () => {
  it("connecting → down → listening → down → listening: since, reason and reconnects as health reports them", () => {
    const s = State.make({ check: true })
    expect(s.health()).toMatchObject({ listener: "connecting", listenerDownReason: "LISTEN not established yet", listenerReconnects: 0 })
    const started = s.listener.since!
    expect(s.down("LISTEN failed: refused", new Date(started.getTime() + 5))).toBe(true)
    // down while connecting keeps the time it has been down since; a second drop is no news, only a new reason
    expect(s.listener).toEqual({ mode: "down", since: started, reason: "LISTEN failed: refused" })
    expect(s.down("LISTEN failed: again", new Date(started.getTime() + 10))).toBe(false)
    expect(s.listener.reason).toBe("LISTEN failed: again")
    // the first time up is no reconnect to report
    expect(s.up(new Date(started.getTime() + 20))).toEqual({ downForMs: null })
    expect(s.health()).toMatchObject({ listener: "listening", listenerDownSince: null, listenerDownReason: null, listenerReconnects: 1 })
    const dropped = new Date(started.getTime() + 1000)
    expect(s.down("the LISTEN connection closed", dropped)).toBe(true)
    expect(s.listener.since).toEqual(dropped)
    expect(s.up(new Date(dropped.getTime() + 1500))).toEqual({ downForMs: 1500 })
    expect(s.reconnects).toBe(2)
  })

  it("a stage's lead: answered only while listening, forgotten with the connection; a follower that becomes leader catches up", () => {
    const s = State.make({ check: true })
    const woken: Array<string> = []
    s.register("a", pool(woken))
    s.register("b", pool())
    // not listening: an answer that comes back is of a connection that is gone
    expect(s.leadAnswered(["a", "b"], ["a"])).toEqual({ nowLeading: [], stale: [] })
    expect(s.stage("a")!.lead).toBe("unknown")
    s.up(new Date())
    s.leadAnswered(["a", "b"], ["a"])
    expect([s.stage("a")!.lead, s.stage("b")!.lead]).toEqual(["leader", "follower"])
    const { nowLeading } = s.leadAnswered(["b"], ["b"])
    expect(nowLeading.map((r) => r.stage)).toEqual(["b"])
    s.down("the LISTEN connection closed", new Date())
    expect([s.stage("a")!.lead, s.stage("b")!.lead]).toEqual(["unknown", "unknown"])
    s.up(new Date())
    // a stage led that has left since is given back
    expect(s.unregister("b")!.stage).toBe("b")
    expect(s.leadAnswered(["a", "b"], ["a", "b"])).toMatchObject({ stale: ["b"] })
    expect(woken).toEqual([])
  })

  it("one retry of the lead planned at a time, only for a registered stage", () => {
    const s = State.make({ check: true })
    s.register("a", pool())
    expect(s.retryPlanned("a")).toBe(true)
    expect(s.retryPlanned("a")).toBe(false)
    s.retryEnded("a")
    expect(s.retryPlanned("a")).toBe(true)
    expect(s.retryPlanned("gone")).toBe(false)
  })

  it("presence is asked once per sweep interval (a tenth of slack), and only when asked for", () => {
    const s = State.make({ check: true })
    s.swept(60_000, 60_000)
    expect([s.takePresence(), s.takePresence()]).toEqual([true, false])
    s.swept(100_000, 60_000)
    expect(s.takePresence()).toBe(false)
    s.swept(60_000 + 54_000, 60_000)
    expect(s.takePresence()).toBe(true)
    s.swept(1_000_000, null)
    expect(s.takePresence()).toBe(false)
    expect(s.health().lastSweepAt).toEqual(new Date(1_000_000))
  })

  it("a broken invariant is named: a lead held while the listener is down", () => {
    const s = State.make({ check: true })
    s.register("a", pool())
    s.up(new Date())
    s.leadAnswered(["a"], ["a"])
    s.down("the LISTEN connection closed", new Date())
    // what no transition can do: a lead kept across the drop
    ;(s.stage("a") as { lead: State.Lead }).lead = "leader"
    expect(() => s.check()).toThrow(InvariantBroken)
    expect(() => s.check()).toThrow(/stage a leader while down/)
  })
})
