/**
 * The pool's pure parts: the claim-ahead rule (pool/ClaimSizing.ts) and the held jobs' modes and invariants
 * (pool/Held.ts), without a queue or a clock.
 */
import { describe, expect, it } from "@effect/vitest"
import * as fc from "fast-check"
import type { Job } from "../../packages/pgfiber/src/queue/Job.js"
import * as ClaimSizing from "../../packages/pgfiber/src/runtime/pool/ClaimSizing.js"
import { maxAheadFor } from "../../packages/pgfiber/src/runtime/pool/Core.js"
import * as Held from "../../packages/pgfiber/src/runtime/pool/Held.js"

const sizing = (concurrency: number, runMs: ReadonlyArray<number>, claimMs: ReadonlyArray<number>) => {
  let s = ClaimSizing.initial(concurrency, maxAheadFor(concurrency))
  for (const ms of runMs) s = ClaimSizing.ran(s, ms)
  for (const ms of claimMs) s = ClaimSizing.claimed(s, ms)
  return s
}

describe("claim sizing", () => {
  it("starts at the concurrency, before anything is measured", () => {
    expect(ClaimSizing.ahead(ClaimSizing.initial(10, 500))).toBe(10)
  })

  it("fast jobs: the whole buffer (500), however the handler is written (run times of 0-1 ms)", () => {
    expect(ClaimSizing.ahead(sizing(10, Array(50).fill(0), [2]))).toBe(500)
    expect(ClaimSizing.ahead(sizing(10, Array.from({ length: 50 }, (_, i) => i % 3 === 0 ? 1 : 0), [2]))).toBe(500)
    // refilled at half of it: claims of at least 250
    expect(ClaimSizing.refillAt(ClaimSizing.ahead(sizing(10, Array(50).fill(0), [2])))).toBe(250)
  })

  it("jobs that wait 20 ms on 100 slots: 25 ms of work ahead (125 jobs)", () => {
    expect(ClaimSizing.ahead(sizing(100, Array(50).fill(20), [1]))).toBe(125)
  })

  it("a slow claim lengthens the horizon to four round trips", () => {
    expect(ClaimSizing.ahead(sizing(100, Array(50).fill(20), Array(50).fill(20)))).toBe(400)
  })

  it("long jobs hold one job ahead, so others stay claimable by other processes", () => {
    expect(ClaimSizing.ahead(sizing(10, Array(50).fill(1_000), [2]))).toBe(1)
    expect(ClaimSizing.refillAt(ClaimSizing.ahead(sizing(10, Array(50).fill(1_000), [2])))).toBe(0)
  })

  it("stays within 1 and maxAhead (the fairness and crash bound) for any measurements", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 200 }),
        fc.array(fc.double({ min: 0, max: 1e6, noNaN: true }), { maxLength: 30 }),
        fc.array(fc.double({ min: 0, max: 1e5, noNaN: true }), { maxLength: 30 }),
        (concurrency, runs, claims) => {
          const s = sizing(concurrency, runs, claims)
          const ahead = ClaimSizing.ahead(s)
          expect(ahead).toBeGreaterThanOrEqual(1)
          expect(ahead).toBeLessThanOrEqual(maxAheadFor(concurrency))
          expect(ClaimSizing.refillAt(ahead)).toBeLessThan(Math.max(ahead, 1))
        }
      )
    )
  })
})

const job = (id: number): Job => ({ id: String(id), lease: 1, attempts: 0 }) as unknown as Job
const slot = (): Held.Slot => ({ current: undefined, fiber: undefined })

describe("held jobs", () => {
  it("each job moves waiting → running → settling → gone, and the counts follow", () => {
    const held = Held.make(2, { check: true })
    const a = held.accept(job(1), 1000).entry
    const b = held.accept(job(2), 1000).entry
    expect([held.waiting, held.running, held.settling]).toEqual([2, 0, 0])
    expect(held.nextWaiting()).toBe(a)
    const s = slot()
    held.start(a, s, 0)
    expect(s.current).toBe(a)
    expect([held.waiting, held.running, held.settling]).toEqual([1, 1, 0])
    held.finish(a)
    expect(s.current).toBeUndefined()
    expect([held.waiting, held.running, held.settling]).toEqual([1, 0, 1])
    // a job that never starts goes straight to settling (released, or a payload that fails its Schema)
    expect(held.finishWaiting()).toEqual([b])
    held.settled(a.job)
    held.settled(b.job)
    expect(held.size).toBe(0)
  })

  it("a job claimed again under a new lease is not let go by its old outcome", () => {
    const held = Held.make(1, { check: true })
    const first = job(7)
    held.accept(first, 1000)
    held.finishWaiting()
    held.settled(first)
    const again = { ...first, lease: 2 } as Job
    held.accept(again, 1000)
    held.settled(first)
    expect(held.get("7")?.job).toBe(again)
  })

  it("a job claimed again while its old entry is held (its lease expired meanwhile) supersedes it, in any mode", () => {
    const held = Held.make(2, { check: true })
    const claim = (id: number, lease: number) => ({ ...job(id), lease }) as Job
    // waiting: the old entry is gone at once, the new one waits in its place
    const w1 = held.accept(claim(1, 1), 1000).entry
    const w2 = held.accept(claim(1, 2), 1000)
    expect(w2.superseded).toBe(w1)
    expect([held.size, held.waiting]).toEqual([1, 1])
    expect(held.nextWaiting()).toBe(w2.entry)
    // running: the old run keeps its slot until stopped, then its (fenced) outcome settles it away
    const r1 = held.accept(claim(2, 1), 1000).entry
    held.start(r1, slot(), 0)
    const r2 = held.accept(claim(2, 2), 1000)
    expect(r2.superseded).toBe(r1)
    expect([held.size, held.running, held.waiting]).toEqual([3, 1, 2])
    held.finish(r1)
    held.settled(r1.job)
    expect(held.get("2")).toBe(r2.entry)
    // settling: likewise
    held.start(r2.entry, slot(), 0)
    held.finish(r2.entry)
    const r3 = held.accept(claim(2, 3), 1000)
    expect(r3.superseded).toBe(r2.entry)
    held.settled(r2.entry.job)
    expect([held.size, held.settling, held.get("2")]).toEqual([2, 0, r3.entry])
  })

  it("refuses a transition from the wrong mode, and a slot too many", () => {
    const held = Held.make(1, { check: true })
    const a = held.accept(job(1), 1000).entry
    const b = held.accept(job(2), 1000).entry
    expect(() => held.settled(a.job)).toThrow(Held.InvariantBroken)
    held.start(a, slot(), 0)
    expect(() => held.start(a, slot(), 0)).toThrow(/running, expected waiting/)
    expect(() => held.start(b, slot(), 0)).toThrow(/2 running jobs on 1 slots/)
  })

  it("keeps its invariants through any sequence of transitions", () => {
    type Step = { kind: "accept" } | { kind: "reclaim"; pick: number } | { kind: "start" } | { kind: "finish"; pick: number } | { kind: "settle"; pick: number } | { kind: "drop"; pick: number } | { kind: "release" }
    const step: fc.Arbitrary<Step> = fc.oneof(
      fc.constant({ kind: "accept" as const }),
      fc.nat().map((pick) => ({ kind: "reclaim" as const, pick })),
      fc.constant({ kind: "start" as const }),
      fc.nat().map((pick) => ({ kind: "finish" as const, pick })),
      fc.nat().map((pick) => ({ kind: "settle" as const, pick })),
      fc.nat().map((pick) => ({ kind: "drop" as const, pick })),
      fc.constant({ kind: "release" as const })
    )
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 5 }), fc.array(step, { maxLength: 80 }), (concurrency, steps) => {
        const held = Held.make(concurrency, { check: true })
        let next = 0
        // every entry still held, superseded ones included (they are no longer reachable by id)
        const live = new Set<Held.Entry>()
        const inMode = (mode: Held.Mode) => [...live].filter((e) => e.mode === mode)
        for (const s of steps) {
          if (s.kind === "accept") live.add(held.accept(job(next++), 1000).entry)
          else if (s.kind === "reclaim") {
            // the same job claimed again under a newer lease
            const ids = [...held.entries()]
            if (ids.length > 0) {
              const old = ids[s.pick % ids.length]!
              const { entry, superseded } = held.accept({ ...old.job, lease: old.job.lease + 1 } as Job, 1000)
              if (superseded?.mode === "waiting") live.delete(superseded)
              live.add(entry)
            }
          } else if (s.kind === "start") {
            const entry = held.nextWaiting()
            if (entry && held.running < concurrency) held.start(entry, slot(), 0)
          } else if (s.kind === "finish") {
            const candidates = [...inMode("waiting"), ...inMode("running")]
            if (candidates.length > 0) held.finish(candidates[s.pick % candidates.length]!)
          } else if (s.kind === "settle") {
            const candidates = inMode("settling")
            if (candidates.length > 0) {
              const entry = candidates[s.pick % candidates.length]!
              held.settled(entry.job)
              live.delete(entry)
            }
          } else if (s.kind === "drop") {
            const candidates = [...inMode("running"), ...inMode("settling")]
            if (candidates.length > 0) {
              const entry = candidates[s.pick % candidates.length]!
              held.drop(entry)
              live.delete(entry)
            }
          } else held.finishWaiting()
          held.check()
          expect(held.waiting + held.running + held.settling).toBe(held.size)
          expect(held.size).toBe(live.size)
        }
      })
    )
  })
})
