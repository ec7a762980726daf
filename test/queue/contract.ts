/**
 * The Queue contract: one suite, two callers (MemoryQueue and PgQueue), so the twin cannot drift.
 * Each test uses its own stage names, so tests sharing one queue never see each other's jobs.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Duration, Effect, Either, Layer } from "effect"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import { completeAll, settleOne } from "../support/settle.js"

export interface ContractTarget {
  readonly name: string
  readonly layer: Layer.Layer<Queue.Queue>
  /** A fresh, empty queue for tests that need to see the whole table. */
  readonly fresh: () => Layer.Layer<Queue.Queue>
  /** Lets time pass: TestClock.adjust for both (Postgres's statements take the TestClock's time: SqlClock.layerTest). */
  readonly advance: (d: Duration.DurationInput) => Effect.Effect<void>
  /** it.effect (TestClock) or it.live (real clock). */
  readonly live: boolean
}

let stageCounter = 0
const freshStage = (base: string) => `${base}_${stageCounter++}`
const worker = (id: string, leaseMs = 30_000) => ({ workerId: id, leaseFor: Duration.millis(leaseMs) })

export const contract = (target: ContractTarget) =>
  describe(`Queue contract: ${target.name}`, () => {
    // live targets run on the real clock: no TestClock in their environment
    layer(target.layer, { timeout: 120_000, excludeTestServices: target.live as false })((it) => {
      const test = it.effect

      test("8 concurrent claimers over 5,000 jobs claim each job exactly once", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("race")
          for (let i = 0; i < 5; i++) {
            yield* q.enqueue(Array.from({ length: 1000 }, (_, n) => ({ stage, payload: { n: i * 1000 + n } })))
          }
          const claimer = (w: number) =>
            Effect.gen(function*() {
              const seen: Array<string> = []
              while (true) {
                const jobs = yield* q.claim(stage, 25, worker(`w${w}`))
                if (jobs.length === 0) return seen
                seen.push(...jobs.map((j) => j.id))
                const done = yield* completeAll(q, jobs)
                expect(done.length).toBe(jobs.length)
              }
            })
          const all = (yield* Effect.all(Array.from({ length: 8 }, (_, w) => claimer(w)), { concurrency: "unbounded" })).flat()
          expect(all.length).toBe(5000)
          expect(new Set(all).size).toBe(5000)
          expect(yield* q.list({ stage })).toEqual([])
        }))

      test("claims by priority, then available_at, then insertion", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("order")
          const [bulk] = yield* q.enqueue([{ stage, priority: "bulk", payload: { n: "bulk" } }])
          const [normal1] = yield* q.enqueue([{ stage, payload: { n: "normal1" } }])
          yield* target.advance("20 millis")
          const [normal2] = yield* q.enqueue([{ stage, priority: "normal", payload: { n: "normal2" } }])
          const [fast] = yield* q.enqueue([{ stage, priority: "fast" }])
          const [urgent] = yield* q.enqueue([{ stage, priority: 0 }])
          const claimed = yield* q.claim(stage, 10, worker("w"))
          expect(claimed.map((j) => j.id)).toEqual([urgent!.id, fast!.id, normal1!.id, normal2!.id, bulk!.id])
          expect(claimed.map((j) => j.priority)).toEqual([0, 10, 50, 50, 90])
        }))

      test("a delayed job is not claimable before it is due, and is after", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("delay")
          yield* q.enqueue([{ stage, delay: "300 millis" }])
          expect(yield* q.claim(stage, 10, worker("w"))).toEqual([])
          // on the TestClock (both targets) time moves only when the test moves it: due in exactly 300 ms
          expect((yield* q.nextWake([stage])).jobDueInMs).toBe(300)
          yield* target.advance("299 millis")
          expect(yield* q.claim(stage, 10, worker("w"))).toEqual([])
          expect((yield* q.nextWake([stage])).jobDueInMs).toBe(1)
          yield* target.advance("1 millis")
          expect((yield* q.claim(stage, 10, worker("w"))).length).toBe(1)
        }))

      test("runAt in the future waits; runAt in the past runs now", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("runat")
          const now = yield* Effect.clockWith((c) => c.currentTimeMillis)
          const base = target.live ? Date.now() : now
          yield* q.enqueue([{ stage, runAt: new Date(base + 3_600_000), payload: { later: true } }])
          yield* q.enqueue([{ stage, runAt: new Date(base - 1000), payload: { later: false } }])
          const claimed = yield* q.claim(stage, 10, worker("w"))
          expect(claimed.map((j) => j.payload)).toEqual([{ later: false }])
        }))

      test("dedupe returns the live job while queued or running, and allows a new one after", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("dedupe")
          const key = Queue.makeDedupeKey(stage, "org1", { b: 2, a: 1 })
          expect(key).toBe(Queue.makeDedupeKey(stage, "org1", { a: 1, b: 2 }))
          const [first] = yield* q.enqueue([{ stage, dedupeKey: key }])
          const [again] = yield* q.enqueue([{ stage, dedupeKey: key }])
          expect(first!.deduped).toBe(false)
          expect(again).toEqual({ id: first!.id, deduped: true })
          const batch = yield* q.enqueue([{ stage, dedupeKey: "other" + stage }, { stage, dedupeKey: "other" + stage }])
          expect(batch[1]).toEqual({ id: batch[0]!.id, deduped: true })
          const [job] = yield* q.claim(stage, 1, worker("w"))
          expect(job!.id).toBe(first!.id)
          expect((yield* q.enqueue([{ stage, dedupeKey: key }]))[0]).toEqual({ id: first!.id, deduped: true })
          expect(yield* completeAll(q, [job!])).toEqual([job!.id])
          const [fresh] = yield* q.enqueue([{ stage, dedupeKey: key }])
          expect(fresh!.deduped).toBe(false)
          expect(fresh!.id).not.toBe(first!.id)
        }))

      test("dedupe mode replace: a duplicate gives the queued job its payload, priority and run time; a running job is left alone", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("replace")
          const [early, late] = [new Date("2098-12-31T00:00:00Z"), new Date("2099-01-01T00:00:00Z")]
          const [first] = yield* q.enqueue([{ stage, dedupeKey: "k", payload: { v: 1 }, runAt: late }])
          const [again] = yield* q.enqueue([{ stage, dedupeKey: "k", payload: { v: 2 }, runAt: early, priority: "fast", dedupeMode: "replace" }])
          expect(again).toEqual({ id: first!.id, deduped: true })
          const replaced = (yield* q.get(first!.id))!
          expect([replaced.payload, replaced.availableAt.toISOString(), replaced.priority]).toEqual([{ v: 2 }, early.toISOString(), 10])
          // in one batch the newest enqueue wins too
          const batch = yield* q.enqueue([
            { stage, dedupeKey: "b", payload: { v: 1 } },
            { stage, dedupeKey: "b", payload: { v: 2 }, dedupeMode: "replace" }
          ])
          expect(batch[1]).toEqual({ id: batch[0]!.id, deduped: true })
          expect((yield* q.get(batch[0]!.id))!.payload).toEqual({ v: 2 })
          // once claimed, nothing changes it
          const [running] = yield* q.claim(stage, 1, worker("w"))
          expect(running!.id).toBe(batch[0]!.id)
          const [onRunning] = yield* q.enqueue([{ stage, dedupeKey: "b", payload: { v: 3 }, dedupeMode: "replace" }])
          expect(onRunning).toEqual({ id: running!.id, deduped: true })
          const still = (yield* q.get(running!.id))!
          expect([still.status, still.payload]).toEqual(["running", { v: 2 }])
          // the default mode is still first-wins
          yield* q.enqueue([{ stage, dedupeKey: "k", payload: { v: 9 } }])
          expect((yield* q.get(first!.id))!.payload).toEqual({ v: 2 })
          // keys are per org: another org's replace makes its own job and leaves this one alone
          const [other] = yield* q.enqueue([{ stage, dedupeKey: "k", orgId: "org-x", payload: { v: 5 }, dedupeMode: "replace" }])
          expect(other!.deduped).toBe(false)
          expect((yield* q.get(first!.id))!.payload).toEqual({ v: 2 })
        }))

      test("dedupe mode debounce: a duplicate pushes the run time later, never earlier, and takes the newest payload", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("debounce")
          const at = (day: number) => new Date(Date.UTC(2099, 0, day))
          const [first] = yield* q.enqueue([{ stage, dedupeKey: "d", payload: { v: 1 }, runAt: at(2) }])
          yield* q.enqueue([{ stage, dedupeKey: "d", payload: { v: 2 }, runAt: at(5), dedupeMode: "debounce" }])
          const pushed = (yield* q.get(first!.id))!
          expect([pushed.payload, pushed.availableAt.toISOString()]).toEqual([{ v: 2 }, at(5).toISOString()])
          const [again] = yield* q.enqueue([{ stage, dedupeKey: "d", payload: { v: 3 }, runAt: at(3), dedupeMode: "debounce" }])
          expect(again).toEqual({ id: first!.id, deduped: true })
          const kept = (yield* q.get(first!.id))!
          expect([kept.payload, kept.availableAt.toISOString()]).toEqual([{ v: 3 }, at(5).toISOString()])
          expect((yield* q.list({ stage })).length).toBe(1)
          // a mode without a key is refused, nothing written
          const refused = yield* Effect.either(q.enqueue([{ stage, payload: {}, dedupeMode: "debounce" }]))
          expect(Either.isLeft(refused) && refused.left._tag === "InvalidJob" && refused.left.field).toBe("dedupeMode")
        }))

      test("dedupe keys are per org: two orgs (and the no-org space) each get their own job, one org its live one", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("dedupeorg")
          const key = `invoice-124-${stage}`
          const [acme] = yield* q.enqueue([{ stage, orgId: "acme", dedupeKey: key }])
          const [beta] = yield* q.enqueue([{ stage, orgId: "beta", dedupeKey: key }])
          const [system] = yield* q.enqueue([{ stage, dedupeKey: key }])
          expect([acme!.deduped, beta!.deduped, system!.deduped]).toEqual([false, false, false])
          expect(new Set([acme!.id, beta!.id, system!.id]).size).toBe(3)
          // one batch mixing orgs collapses per org only
          const batch = yield* q.enqueue([
            { stage, orgId: "acme", dedupeKey: key },
            { stage, orgId: "beta", dedupeKey: key },
            { stage, dedupeKey: key },
            { stage, orgId: "gamma", dedupeKey: key },
            { stage, orgId: "gamma", dedupeKey: key }
          ])
          expect(batch.slice(0, 3)).toEqual([
            { id: acme!.id, deduped: true },
            { id: beta!.id, deduped: true },
            { id: system!.id, deduped: true }
          ])
          expect(batch[3]!.deduped).toBe(false)
          expect(batch[4]).toEqual({ id: batch[3]!.id, deduped: true })
        }))

      test("an expired lease is requeued by the reaper and counts an attempt", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("expire")
          const [created] = yield* q.enqueue([{ stage, maxAttempts: 3 }])
          const [job] = yield* q.claim(stage, 1, worker("dead-worker", 100))
          expect(job!.attempts).toBe(0)
          const early = yield* q.reapExpired
          expect(early.requeued).toBe(0)
          yield* target.advance("250 millis")
          const reaped = yield* q.reapExpired
          expect(reaped.requeued).toBeGreaterThanOrEqual(1)
          const after = yield* q.get(created!.id)
          expect(after!.status).toBe("queued")
          expect(after!.attempts).toBe(1)
          expect(after!.errors[0]!.tag).toBe("LeaseExpired")
          // the dead worker's late completion is fenced out; the new claim's is accepted
          const [again] = yield* q.claim(stage, 1, worker("w2"))
          expect(yield* completeAll(q, [job!])).toEqual([])
          expect(yield* completeAll(q, [again!])).toEqual([again!.id])
        }))

      test("an expired lease on the last attempt is requeued spent; dead-lettering it keeps its count and history", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("expire_last")
          const [created] = yield* q.enqueue([{ stage, maxAttempts: 1 }])
          yield* q.claim(stage, 1, worker("killed", 100))
          yield* target.advance("250 millis")
          expect((yield* q.reapExpired).deadLettered).toBe(0)
          expect(yield* q.get(created!.id)).toMatchObject({ status: "queued", attempts: 1 })
          expect(yield* q.deadLetters.list({ stage })).toEqual([])
          // the stage's claim finds it spent and dead-letters it (JobRun does this, with the stage's hook)
          const [again] = yield* q.claim(stage, 1, worker("w2"))
          expect(again!.attempts).toBe(again!.maxAttempts)
          let heard = 0
          expect(yield* settleOne(q, Queue.Outcome.deadLetter(again!, { tag: "LeaseExpired", message: "exhausted" }), Effect.sync(() => heard++))).toBe("deadLettered")
          expect(heard).toBe(1)
          const [dead] = yield* q.deadLetters.list({ stage })
          expect(dead!.attempts).toBe(1)
          expect(dead!.errorHistory.map((e) => e.tag)).toEqual(["LeaseExpired"])
        }))

      test("exhausted attempts land in the dead-letter table with the whole error history", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("exhaust")
          const [created] = yield* q.enqueue([{ stage, maxAttempts: 3, payload: { file: "a.wav" }, orgId: "o1", subjectId: "s1" }])
          const outcomes: Array<string> = []
          for (let i = 0; i < 3; i++) {
            const [job] = yield* q.claim(stage, 1, worker("w"))
            expect(job!.attempts).toBe(i)
            outcomes.push(yield* settleOne(q, Queue.Outcome.retry(job!, Duration.zero, { tag: "Transient", message: `boom ${i + 1}` })))
          }
          expect(outcomes).toEqual(["retried", "retried", "deadLettered"])
          // it left the live table; the history keeps it as dead, with every attempt's error and its worker
          const kept = (yield* q.get(created!.id))!
          expect([kept.status, kept.attempts, kept.finishedAt !== null]).toEqual(["dead", 3, true])
          expect(kept.errors.map((e) => [e.message, e.worker])).toEqual([["boom 1", "w"], ["boom 2", "w"], ["boom 3", "w"]])
          const [dead] = (yield* q.deadLetters.list({ stage }))
          expect(dead!.jobId).toBe(created!.id)
          expect(dead!.payload).toEqual({ file: "a.wav" })
          expect(dead!.orgId).toBe("o1")
          expect(dead!.reason).toBe("boom 3")
          expect(dead!.attempts).toBe(3)
          expect(dead!.errorHistory.map((e) => [e.attempt, e.tag, e.message])).toEqual([
            [1, "Transient", "boom 1"],
            [2, "Transient", "boom 2"],
            [3, "Transient", "boom 3"]
          ])
          const stats = (yield* q.stats).find((s) => s.stage === stage)
          expect(stats?.deadLetters).toBe(1)
        }))

      test("retry puts the job back after its delay with the error recorded", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("retry")
          const [created] = yield* q.enqueue([{ stage }])
          const [job] = yield* q.claim(stage, 1, worker("w"))
          expect(yield* settleOne(q, Queue.Outcome.retry(job!, Duration.millis(300), { tag: "Transient", message: "503" }))).toBe("retried")
          const after = yield* q.get(created!.id)
          expect(after!.status).toBe("queued")
          expect(after!.lastError).toBe("503")
          expect(yield* q.claim(stage, 1, worker("w"))).toEqual([])
          yield* target.advance("400 millis")
          const [again] = yield* q.claim(stage, 1, worker("w"))
          expect(again!.attempts).toBe(1)
          expect(again!.lease).toBeGreaterThan(job!.lease)
        }))

      test("reschedule (a poll not done yet) spends no attempt and counts the poll", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("poll")
          const [created] = yield* q.enqueue([{ stage, maxAttempts: 1 }])
          for (let i = 0; i < 3; i++) {
            const [job] = yield* q.claim(stage, 1, worker("w"))
            expect(yield* settleOne(q, Queue.Outcome.reschedule(job!, Duration.zero))).toBe("rescheduled")
          }
          const after = yield* q.get(created!.id)
          expect(after!.attempts).toBe(0)
          expect(after!.polls).toBe(3)
        }))

      test("dead-letter at once (Permanent) and a fenced-out worker cannot fail the job", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("permanent")
          yield* q.enqueue([{ stage, maxAttempts: 5 }])
          const [job] = yield* q.claim(stage, 1, worker("w"))
          expect(yield* settleOne(q, Queue.Outcome.deadLetter({ id: job!.id, lease: job!.lease + 1 }, { tag: "Permanent", message: "x" }))).toBe("fenced")
          expect(yield* settleOne(q, Queue.Outcome.retry({ id: job!.id, lease: job!.lease + 1 }, Duration.zero, { tag: "Transient", message: "x" }))).toBe("fenced")
          expect(yield* settleOne(q, Queue.Outcome.reschedule({ id: job!.id, lease: job!.lease + 1 }, Duration.zero))).toBe("fenced")
          expect(yield* settleOne(q, Queue.Outcome.deadLetter(job!, { tag: "Permanent", message: "no audio stream" }))).toBe("deadLettered")
          const [dead] = yield* q.deadLetters.list({ stage })
          expect(dead!.reason).toBe("no audio stream")
          expect(dead!.attempts).toBe(1)
        }))

      test("a fenced-out completion is rejected and leaves the new holder's job alone", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("fence")
          const [created] = yield* q.enqueue([{ stage }])
          const [job] = yield* q.claim(stage, 1, worker("slow", 50))
          yield* target.advance("150 millis")
          yield* q.reapExpired
          const [taken] = yield* q.claim(stage, 1, worker("fast"))
          expect(taken!.id).toBe(job!.id)
          expect(yield* settleOne(q, Queue.Outcome.complete(job!))).toBe("fenced")
          expect(yield* settleOne(q, Queue.Outcome.complete(job!, [{ stage: stage + "_next" }]))).toBe("fenced")
          expect(yield* q.list({ stage: stage + "_next" })).toEqual([])
          expect((yield* q.get(created!.id))!.status).toBe("running")
          expect(yield* q.heartbeat([job!], Duration.seconds(30))).toEqual([])
          expect(yield* q.heartbeat([taken!], Duration.seconds(30))).toEqual([taken!.id])
          expect(yield* settleOne(q, Queue.Outcome.complete(taken!))).toBe("completed")
        }))

      test("complete-with-follow-ups removes the job and adds its follow-ups together", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("handoff")
          const next = stage + "_next"
          yield* q.enqueue([{ stage, subjectId: "call-1" }, { stage, subjectId: "call-2" }])
          const [job, badJob] = yield* q.claim(stage, 2, worker("w"))
          // a bad follow-up fails the whole hand-off: the job is dead-lettered (settle refuses no batch for one job's
          // follow-ups), and none of its follow-ups is added, not even the valid one
          expect(yield* settleOne(q, Queue.Outcome.complete(badJob!, [{ stage: next }, { stage: "" }]))).toBe("deadLettered")
          const [letter] = yield* q.deadLetters.list({ stage })
          expect([letter!.jobId, letter!.errorHistory.map((e) => e.tag)]).toEqual([badJob!.id, ["InvalidFollowUp"]])
          expect(letter!.reason).toContain("follow-up rejected")
          expect(yield* q.list({ stage: next })).toEqual([])
          expect(yield* settleOne(q, Queue.Outcome.complete(job!, [{ stage: next, subjectId: "call-1", payload: { op: "abc" } }]))).toBe("completed")
          expect((yield* q.get(job!.id))!.status).toBe("completed")
          expect(yield* q.list({ stage })).toEqual([])
          const followUps = yield* q.list({ stage: next })
          expect(followUps.map((j) => [j.subjectId, j.payload])).toEqual([["call-1", { op: "abc" }]])
        }))

      test("settle writes a mixed batch in one call: complete + follow-ups, retry, exhausted retry, reschedule, dead-letter, release, fenced", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("settle")
          const next = stage + "_next"
          const created = yield* q.enqueue([
            { stage, payload: { n: 0 } },
            { stage, payload: { n: 1 } },
            { stage, payload: { n: 2 }, maxAttempts: 1 },
            { stage, payload: { n: 3 } },
            { stage, payload: { n: 4 }, orgId: "o1" },
            { stage, payload: { n: 5 } },
            { stage, payload: { n: 6 } },
            { stage, payload: { n: 7 } }
          ])
          // in insertion order: fairness off, or o1's job would take its turn second
          const jobs = yield* q.claim(stage, 10, { ...worker("w"), shares: { ...Queue.Limits.defaultShares, fair: false } })
          expect(jobs.map((j) => j.id)).toEqual(created.map((c) => c.id))
          const [done, retried, exhausted, polled, dead, released, stale, badHandOff] = jobs
          const settled = yield* q.settle([
            Queue.Outcome.complete(done!, [{ stage: next, payload: { from: 0 } }]),
            Queue.Outcome.retry(retried!, Duration.millis(300), { tag: "Transient", message: "503" }),
            Queue.Outcome.retry(exhausted!, Duration.zero, { tag: "Transient", message: "last try" }),
            Queue.Outcome.reschedule(polled!, Duration.zero),
            Queue.Outcome.deadLetter(dead!, { tag: "Permanent", message: "no audio stream" }),
            Queue.Outcome.release(released!),
            // fenced: a lease this worker never held
            Queue.Outcome.complete({ id: stale!.id, lease: stale!.lease + 1 }, [{ stage: next, payload: { from: 6 } }]),
            Queue.Outcome.complete(badHandOff!, [{ stage: "" }])
          ])
          expect(settled).toEqual(["completed", "retried", "deadLettered", "rescheduled", "deadLettered", "released", "fenced", "deadLettered"])
          // completed: out of the live table (into the history), and its follow-up (only its) is queued; the
          // fenced one's follow-up was not written
          expect((yield* q.get(done!.id))!.status).toBe("completed")
          expect((yield* q.list({ stage })).map((j) => j.id)).not.toContain(done!.id)
          expect((yield* q.list({ stage: next })).map((j) => j.payload)).toEqual([{ from: 0 }])
          const r = yield* q.get(retried!.id)
          expect([r!.status, r!.attempts, r!.lastError, r!.errors.map((e) => e.tag)]).toEqual(["queued", 1, "503", ["Transient"]])
          const p = yield* q.get(polled!.id)
          expect([p!.status, p!.attempts, p!.polls]).toEqual(["queued", 0, 1])
          const back = yield* q.get(released!.id)
          expect([back!.status, back!.attempts, back!.lockedBy]).toEqual(["queued", 0, null])
          // the fenced job is still running under its lease, untouched
          const s = yield* q.get(stale!.id)
          expect([s!.status, s!.lease]).toEqual(["running", stale!.lease])
          const letters = yield* q.deadLetters.list({ stage })
          expect(letters.map((d) => [d.jobId, d.reason, d.attempts])).toEqual([
            [exhausted!.id, "last try", 1],
            [dead!.id, "no audio stream", 1],
            [badHandOff!.id, expect.stringContaining("follow-up rejected"), 1]
          ])
          expect(letters[1]!.orgId).toBe("o1")
          expect(letters[0]!.errorHistory.map((e) => e.tag)).toEqual(["Transient"])
          // the released and rescheduled jobs are claimable now; the retried one after its delay
          const again = yield* q.claim(stage, 10, worker("w2"))
          expect(again.map((j) => j.id).sort()).toEqual([polled!.id, released!.id].sort())
          // the fenced job's own holder still settles it
          expect(yield* q.settle([Queue.Outcome.complete(stale!)])).toEqual(["completed"])
        }))

      test("settle removes a job cancelled while it ran, whatever the outcome but completion", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("settle_cancel")
          yield* q.enqueue([{ stage }, { stage }, { stage }])
          const [a, b, c] = yield* q.claim(stage, 3, worker("w"))
          for (const j of [a!, b!, c!]) expect(yield* q.cancel(j.id)).toBe("cancelling")
          expect(yield* q.settle([
            Queue.Outcome.retry(a!, Duration.zero, { tag: "Transient", message: "x" }),
            Queue.Outcome.release(b!),
            Queue.Outcome.complete(c!)
          ])).toEqual(["released", "released", "completed"])
          expect(yield* q.list({ stage })).toEqual([])
          expect(yield* q.deadLetters.list({ stage })).toEqual([])
        }))

      test("a claimed job is the job as get reads it, every field", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("claimed_fields")
          const [a] = yield* q.enqueue([{
            stage, orgId: "org-a", subjectId: "subject-1", dedupeKey: "k-1", priority: 10, maxAttempts: 3,
            timeout: "45 seconds", payload: { n: 1, text: "a \"quoted\" é" }
          }])
          const [first] = yield* q.claim(stage, 1, worker("w-1"))
          expect(yield* settleOne(q, Queue.Outcome.retry(first!, Duration.zero, { tag: "Transient", message: "503" }))).toBe("retried")
          const [again] = yield* q.claim(stage, 1, worker("w-2"))
          expect(again!.id).toBe(a!.id)
          expect(again).toEqual(yield* q.get(a!.id))
          expect([again!.status, again!.attempts, again!.lockedBy, again!.errors.map((e) => e.tag), again!.timeoutMs])
            .toEqual(["running", 1, "w-2", ["Transient"], 45_000])
          expect(again!.startedAt!.getTime()).toBe(first!.startedAt!.getTime())
        }))

      test("a batch of completions only: each kept with its output and run time, one cancelled while it ran completes, a fenced one is refused", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("complete_batch")
          yield* q.enqueue([{ stage, payload: { n: 1 } }, { stage, payload: { n: 2 } }, { stage, payload: { n: 3 } }, { stage }])
          const [a, b, c, d] = yield* q.claim(stage, 4, worker("w"))
          expect(yield* q.cancel(b!.id)).toBe("cancelling")
          expect(yield* q.settle([
            { ...Queue.Outcome.complete(c!, [], { words: 3 }), runMs: 40 },
            Queue.Outcome.complete({ id: d!.id, lease: d!.lease + 1 }),
            Queue.Outcome.complete(b!),
            Queue.Outcome.complete(a!)
          ], { retain: Duration.minutes(5) })).toEqual(["completed", "fenced", "completed", "completed"])
          // the fenced job is still its holder's, running
          expect((yield* q.list({ stage })).map((j) => [j.id, j.status])).toEqual([[d!.id, "running"]])
          const kept = (yield* q.get(c!.id))!
          expect([kept.status, kept.output, kept.lastRunMs, kept.payload]).toEqual(["completed", { words: 3 }, 40, { n: 3 }])
          expect([(yield* q.get(a!.id))!.status, (yield* q.get(b!.id))!.status]).toEqual(["completed", "completed"])
          expect(yield* settleOne(q, Queue.Outcome.complete(d!))).toBe("completed")
        }))

      test("settle's onDeadLettered runs in the settle's transaction: its enqueues commit with the dead letters", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("settle_hook")
          const marks = stage + "_marks"
          yield* q.enqueue([{ stage, maxAttempts: 1 }, { stage }, { stage }])
          const [a, b, c] = yield* q.claim(stage, 3, worker("w"))
          const seen: Array<ReadonlyArray<Queue.Outcome.DeadLettered>> = []
          const settled = yield* q.settle([
            Queue.Outcome.retry(a!, Duration.zero, { tag: "Transient", message: "out of attempts" }),
            Queue.Outcome.complete(b!),
            Queue.Outcome.deadLetter(c!, { tag: "Permanent", message: "bad input" })
          ], {
            onDeadLettered: (dead) =>
              Effect.gen(function*() {
                seen.push(dead)
                // one hook's writes roll back to its savepoint; the other's commit
                yield* Effect.ignore(q.savepoint(Effect.zipRight(q.enqueue([{ stage: marks, payload: { lost: true } }]), Effect.fail("hook failed"))))
                yield* q.savepoint(q.enqueue(dead.map((d) => ({ stage: marks, payload: { index: d.index, exhausted: d.exhausted } }))))
              }).pipe(Effect.orDie)
          })
          expect(settled).toEqual(["deadLettered", "completed", "deadLettered"])
          expect(seen).toEqual([[
            { index: 0, reason: "out of attempts", exhausted: true },
            { index: 2, reason: "bad input", exhausted: false }
          ]])
          expect((yield* q.list({ stage: marks })).map((j) => j.payload)).toEqual([
            { index: 0, exhausted: true },
            { index: 2, exhausted: false }
          ])
        }))

      test("an enqueue in a rolled-back transaction leaves no job and wakes nobody; a committed one does both", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("tx")
          const woken: Array<string> = []
          yield* Effect.scoped(
            Effect.gen(function*() {
              yield* q.listen({ onWake: (s) => woken.push(s), onListening: () => undefined })
              const failed = yield* Effect.either(
                q.transaction(Effect.zipRight(q.enqueue([{ stage, payload: { n: 1 } }]), Effect.fail("rollback" as const)))
              )
              expect(Either.isLeft(failed)).toBe(true)
              yield* target.advance("300 millis")
              expect(yield* q.list({ stage })).toEqual([])
              expect(woken.filter((s) => s === stage)).toEqual([])
              yield* q.transaction(q.enqueue([{ stage, payload: { n: 2 } }, { stage, payload: { n: 3 } }]))
              for (let i = 0; i < 50 && !woken.includes(stage); i++) yield* target.advance("20 millis")
              expect((yield* q.list({ stage })).map((j) => j.payload)).toEqual([{ n: 2 }, { n: 3 }])
              expect(woken.filter((s) => s === stage)).toEqual([stage])
            })
          )
        }))

      test("cancel removes a queued job and marks a running one; release hands a job back without an attempt", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("cancel")
          const [a, b, c] = yield* q.enqueue([{ stage }, { stage }, { stage }])
          expect(yield* q.cancel(a!.id)).toBe("cancelled")
          const cancelled = (yield* q.get(a!.id))!
          expect([cancelled.status, cancelled.finishedAt !== null]).toEqual(["cancelled", true])
          expect(yield* q.cancel(a!.id)).toBe("not-found")
          const [jb, jc] = yield* q.claim(stage, 2, worker("w"))
          expect([jb!.id, jc!.id]).toEqual([b!.id, c!.id])
          expect(yield* q.cancel(b!.id)).toBe("cancelling")
          expect((yield* q.get(b!.id))!.status).toBe("cancelled")
          // the cancelled job's heartbeat no longer holds, which tells its worker to stop
          expect(yield* q.heartbeat([jb!, jc!], Duration.seconds(30))).toEqual([jc!.id])
          expect(yield* q.settle([Queue.Outcome.release(jb!), Queue.Outcome.release(jc!)])).toEqual(["released", "released"])
          expect((yield* q.get(b!.id))!.finishedAt).not.toBeNull()
          const released = yield* q.get(c!.id)
          expect(released!.status).toBe("queued")
          expect(released!.attempts).toBe(0)
          expect(released!.lockedBy).toBeNull()
          expect((yield* q.claim(stage, 1, worker("w2")))[0]!.id).toBe(c!.id)
        }))

      test("bad input gets a typed error and writes nothing", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("bad")
          const bad: ReadonlyArray<[Queue.NewJob, string]> = [
            [{ stage, payload: { f: () => 1 } }, "payload"],
            [{ stage, payload: { n: Number.NaN } }, "payload"],
            [{ stage, payload: { d: new Date() } }, "payload"],
            [{ stage, payload: { big: "x".repeat(Queue.defaultMaxPayloadBytes) } }, "payload"],
            [{ stage: "" }, "stage"],
            [{ stage: "Not A Stage!" }, "stage"],
            [{ stage, delay: -5 }, "delay"],
            [{ stage, priority: 101 }, "priority"],
            [{ stage, maxAttempts: 0 }, "maxAttempts"]
          ]
          for (const [job, field] of bad) {
            const result = yield* Effect.either(q.enqueue([{ stage, payload: { ok: true } }, job]))
            expect(Either.isLeft(result) && result.left._tag === "InvalidJob" && result.left.field).toBe(field)
          }
          const circular: Record<string, unknown> = {}
          circular.self = circular
          const circ = yield* Effect.either(q.enqueue([{ stage, payload: circular }]))
          expect(Either.isLeft(circ) && circ.left.message).toContain("circular")
          expect(yield* q.list({ stage })).toEqual([])
        }))

      test("dead letters: list, retry as a fresh job, resolve, purge", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("dlq")
          yield* q.enqueue([{ stage, payload: { n: 1 } }, { stage, payload: { n: 2 } }])
          for (const job of yield* q.claim(stage, 2, worker("w"))) {
            yield* settleOne(q, Queue.Outcome.deadLetter(job, { tag: "Permanent", message: `bad ${JSON.stringify(job.payload)}` }))
          }
          const [d1, d2] = yield* q.deadLetters.list({ stage })
          const retriedId = yield* q.deadLetters.retry(d1!.id)
          const retried = yield* q.get(retriedId)
          expect(retried!.payload).toEqual(d1!.payload)
          expect(retried!.attempts).toBe(0)
          expect((yield* q.deadLetters.get(d1!.id))!.resolutionStatus).toBe("retried")
          expect((yield* q.deadLetters.get(d1!.id))!.retriedJobId).toBe(retriedId)
          const twice = yield* Effect.either(q.deadLetters.retry(d1!.id))
          expect(Either.isLeft(twice)).toBe(true)
          yield* q.deadLetters.resolve(d2!.id, "bad input, customer told")
          expect((yield* q.deadLetters.get(d2!.id))!.resolutionNotes).toBe("bad input, customer told")
          expect(yield* q.deadLetters.list({ stage })).toEqual([])
          expect((yield* q.deadLetters.list({ stage, unresolvedOnly: false })).length).toBe(2)
          const missing = yield* Effect.either(q.deadLetters.resolve("999999999", "x"))
          expect(Either.isLeft(missing) && missing.left._tag).toBe("JobNotFound")
          expect(yield* q.deadLetters.purge({ olderThan: Duration.hours(1) })).toBe(0)
          expect(yield* q.deadLetters.purge()).toBeGreaterThanOrEqual(2)
          expect(yield* q.deadLetters.get(d2!.id)).toBeNull()
        }))

      test("a finished job stays readable with its output and timestamps until its retention passes, then is pruned", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("history")
          const [a, b, c] = yield* q.enqueue([{ stage, payload: { n: 1 } }, { stage, payload: { n: 2 } }, { stage, payload: { n: 3 } }])
          const [ja, jb, jc] = yield* q.claim(stage, 3, worker("w-hist"))
          expect(ja!.startedAt).not.toBeNull()
          const settled = yield* q.settle([
            { ...Queue.Outcome.complete(ja!, [], { words: 42, text: "hello" }), runMs: 125 },
            Queue.Outcome.deadLetter(jb!, { tag: "Permanent", message: "no audio" }),
            Queue.Outcome.complete(jc!)
          ], { retain: Duration.millis(400) })
          expect(settled).toEqual(["completed", "deadLettered", "completed"])
          const done = (yield* q.get(a!.id))!
          expect([done.status, done.output, done.lastRunMs, done.payload]).toEqual(["completed", { words: 42, text: "hello" }, 125, { n: 1 }])
          expect(done.startedAt!.getTime()).toBeLessThanOrEqual(done.finishedAt!.getTime())
          const dead = (yield* q.get(b!.id))!
          expect([dead.status, dead.attempts, dead.lastError, dead.errors.map((e) => [e.tag, e.worker])])
            .toEqual(["dead", 1, "no audio", [["Permanent", "w-hist"]]])
          expect((yield* q.get(c!.id))!.output).toBeNull()
          // the hot table holds none of them; the history lists them newest first
          expect(yield* q.list({ stage })).toEqual([])
          expect((yield* q.history.list({ stage })).map((j) => j.id)).toEqual([c!.id, b!.id, a!.id])
          expect((yield* q.history.list({ stage, status: "dead" })).map((j) => j.id)).toEqual([b!.id])
          // not yet due: pruning leaves them
          yield* q.history.prune()
          expect((yield* q.get(a!.id))?.status).toBe("completed")
          yield* target.advance("600 millis")
          expect(yield* q.history.prune({ batch: 2 })).toBeGreaterThanOrEqual(3)
          expect(yield* q.get(a!.id)).toBeNull()
          expect(yield* q.get(b!.id)).toBeNull()
          expect(yield* q.history.list({ stage })).toEqual([])
          // the dead letter is its own record, kept until it is handled
          expect((yield* q.deadLetters.list({ stage })).map((d) => d.jobId)).toEqual([b!.id])
        }))

      test("retention zero deletes a finished job at once, as a queue without history", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("nohistory")
          const [a] = yield* q.enqueue([{ stage }])
          const [ja] = yield* q.claim(stage, 1, worker("w"))
          expect(yield* q.settle([Queue.Outcome.complete(ja!, [], { ok: true })], { retain: Duration.zero })).toEqual(["completed"])
          expect(yield* q.get(a!.id)).toBeNull()
        }))

      test("progress reported with a heartbeat is visible while the job runs, and kept in its history", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("progress")
          const [a] = yield* q.enqueue([{ stage, timeout: "90 seconds" }])
          const [ja] = yield* q.claim(stage, 1, worker("w"))
          expect([ja!.progress, ja!.timeoutMs]).toEqual([null, 90_000])
          expect(yield* q.heartbeat([{ ...ja!, reported: { value: 40, message: "transcribing 2 of 5" } }], Duration.seconds(30))).toEqual([a!.id])
          const running = (yield* q.get(a!.id))!
          expect([running.status, running.progress, running.progressMessage]).toEqual(["running", 40, "transcribing 2 of 5"])
          // a beat with nothing new reported leaves it as it was
          yield* q.heartbeat([ja!], Duration.seconds(30))
          expect((yield* q.get(a!.id))!.progress).toBe(40)
          yield* settleOne(q, Queue.Outcome.complete(ja!))
          const done = (yield* q.get(a!.id))!
          expect([done.status, done.progress, done.progressMessage, done.timeoutMs]).toEqual(["completed", 40, "transcribing 2 of 5", 90_000])
        }))

      test("the run's last progress report, not yet written by a heartbeat, is written with its outcome", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("last_progress")
          const [a, b, c] = yield* q.enqueue([{ stage }, { stage }, { stage, maxAttempts: 3 }])
          const [ja, jb, jc] = yield* q.claim(stage, 3, worker("w"))
          yield* q.heartbeat([{ ...ja!, reported: { value: 88, message: "step 7/8" } }], Duration.seconds(30))
          const last = { value: 100, message: "step 8/8" }
          // a completion beside one that reports nothing: the nothing keeps what the heartbeat wrote
          expect(yield* q.settle([
            { ...Queue.Outcome.complete(ja!), progress: last },
            Queue.Outcome.complete(jb!),
            { ...Queue.Outcome.retry(jc!, Duration.zero, { tag: "Transient", message: "again" }), progress: { value: 30, message: null } }
          ])).toEqual(["completed", "completed", "retried"])
          const done = (yield* q.get(a!.id))!
          expect([done.status, done.progress, done.progressMessage]).toEqual(["completed", 100, "step 8/8"])
          expect((yield* q.get(b!.id))!.progress).toBeNull()
          const retried = (yield* q.get(c!.id))!
          expect([retried.status, retried.progress, retried.progressMessage]).toEqual(["queued", 30, null])
        }))

      test("a paused stage claims nothing while enqueues succeed; resume lets claims through, and listeners hear both", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("paused")
          const other = freshStage("paused_other")
          const heard: Array<string> = []
          yield* Effect.scoped(Effect.gen(function*() {
            yield* q.listen({ onWake: (s) => heard.push(s), onListening: () => undefined })
            yield* q.stageControls.setPaused(stage, true, "ops")
            for (let i = 0; i < 500 && !heard.includes(Queue.stageControlsTopic); i++) yield* target.advance("20 millis")
            expect(heard).toContain(Queue.stageControlsTopic)
            const [queued] = yield* q.enqueue([{ stage }, { stage: other }])
            expect(yield* q.claim(stage, 10, worker("w"))).toEqual([])
            expect((yield* q.claim(other, 10, worker("w"))).length).toBe(1)
            const control = (yield* q.stageControls.list).find((c) => c.stage === stage)!
            expect([control.paused, control.changedBy]).toEqual([true, "ops"])
            expect((yield* q.stats).find((s) => s.stage === stage)).toMatchObject({ ready: 1, paused: true })
            heard.length = 0
            yield* q.stageControls.setPaused(stage, false, "ops")
            for (let i = 0; i < 500 && !heard.includes(Queue.stageControlsTopic); i++) yield* target.advance("20 millis")
            expect(heard).toContain(Queue.stageControlsTopic)
            expect((yield* q.claim(stage, 10, worker("w"))).map((j) => j.id)).toEqual([queued!.id])
            expect((yield* q.stats).find((s) => s.stage === stage)?.paused).toBe(false)
          }))
        }))

      test("purge deletes only the stage's queued jobs: its running ones and other stages' stay", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("purge")
          const other = freshStage("purge_other")
          yield* q.enqueue([{ stage }, { stage }, { stage }, { stage, delay: "1 hour" }, { stage: other }])
          const [running] = yield* q.claim(stage, 1, worker("w"))
          expect(yield* q.stageControls.purge(stage, "ops")).toBe(3)
          expect((yield* q.list({ stage })).map((j) => [j.id, j.status])).toEqual([[running!.id, "running"]])
          expect((yield* q.list({ stage: other })).length).toBe(1)
          // the purged jobs are kept in the history, cancelled, saying who purged them
          const purged = yield* q.history.list({ stage })
          expect(purged.map((j) => [j.status, j.lastError])).toEqual(Array.from({ length: 3 }, () => ["cancelled", "purged by ops"]))
          expect(yield* settleOne(q, Queue.Outcome.complete(running!))).toBe("completed")
        }))

      test("run now: a delayed job becomes due at once and its stage is woken; a due, running or unknown job is left alone", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("runnow")
          const [delayed, due] = yield* q.enqueue([{ stage, delay: "1 hour" }, { stage }])
          expect(yield* q.runNow(due!.id)).toBe("not-delayed")
          expect(yield* q.runNow(delayed!.id)).toBe("due")
          expect((yield* q.claim(stage, 10, worker("w"))).map((j) => j.id).sort()).toEqual([delayed!.id, due!.id].sort())
          expect(yield* q.runNow(delayed!.id)).toBe("not-delayed")
          expect(yield* q.runNow("999999999")).toBe("not-found")
          expect(yield* q.runNow("not-an-id")).toBe("not-found")
        }))

      test("stage registry: a process registers its stages, the sweep's next-due question marks them seen, unregistering leaves the stage known", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("registered")
          const entry: Queue.Registry.StageEntry = {
            name: stage, visibility: "public", concurrency: 3, limits: { ...Queue.Limits.defaultShares, maxRunning: 5 },
            retainMs: null, maxAttempts: 4, priority: 10,
            payloadSchema: { type: "object", required: ["n"], properties: { n: { type: "number" } } }
          }
          yield* q.registry.register({ workerId: "proc-a", sweepMs: 60_000 }, [entry])
          yield* q.registry.register({ workerId: "proc-b", sweepMs: 60_000 }, [{ ...entry, concurrency: 6 }])
          const mine = (list: ReadonlyArray<Queue.Registry.RegisteredStage>) => list.find((r) => r.name === stage)
          const listed = mine(yield* q.registry.list)
          expect(listed).toMatchObject({
            name: stage, visibility: "public", concurrency: 6, limits: { maxRunning: 5 }, maxAttempts: 4, priority: 10,
            payloadSchema: entry.payloadSchema, registeredBy: "proc-b"
          })
          expect(listed!.processes.map((p) => [p.workerId, p.concurrency, p.live])).toEqual([["proc-a", 3, true], ["proc-b", 6, true]])
          // its jobs enqueue as any stage's
          yield* q.enqueue([{ stage, payload: { n: 1 } }])
          yield* q.nextWake([stage], { seenBy: "proc-a" })
          const seen = mine(yield* q.registry.list)!.processes.find((p) => p.workerId === "proc-a")!
          expect(seen.lastSeenAt.getTime()).toBeGreaterThanOrEqual(listed!.processes[0]!.lastSeenAt.getTime())
          yield* q.registry.unregister("proc-a", [stage])
          yield* q.registry.unregister("proc-b", [stage])
          expect(mine(yield* q.registry.list)).toMatchObject({ name: stage, processes: [] })
          expect(Queue.Registry.isLive(mine(yield* q.registry.list)!)).toBe(false)
          // a purge keeps the stage's jobs for its registered retention: none here
          const unkept = freshStage("registered_unkept")
          yield* q.registry.register({ workerId: "proc-a", sweepMs: 60_000 }, [{ ...entry, name: unkept, retainMs: 0 }])
          yield* q.enqueue([{ stage: unkept, payload: { n: 1 } }])
          expect(yield* q.stageControls.purge(unkept, "ops")).toBe(1)
          expect(yield* q.history.list({ stage: unkept })).toEqual([])
        }))

      test("fair claiming: orgs take turns within a priority, each org's r-th job before any org's (r+1)-th", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("fair")
          yield* q.enqueue(Array.from({ length: 30 }, () => ({ stage, orgId: "big" })))
          yield* q.enqueue(Array.from({ length: 3 }, () => ({ stage, orgId: "small" })))
          yield* q.enqueue([{ stage }, { stage, orgId: "urgent", priority: "fast" }])
          // priority still wins (fairness applies within one; the rest of a claim follows in age order)
          expect((yield* q.claim(stage, 3, worker("w"))).map((j) => j.orgId)).toEqual(["urgent", "big", "big"])
          // three orgs (no org is a group of its own) take turns, ceil(10 / 3) = 4 each at most, and the one
          // that filled its share makes up the shortfall of those that could not
          const batch = yield* q.claim(stage, 10, worker("w"))
          expect(batch.map((j) => j.orgId)).toEqual(["big", "small", null, "big", "small", "big", "small", "big", "big", "big"])
          // fairness off: age order
          const unfair = yield* q.claimBatch(stage, 3, { ...worker("w"), shares: { ...Queue.Limits.defaultShares, fair: false } })
          expect(unfair.jobs.map((j) => j.orgId)).toEqual(["big", "big", "big"])
        }))

      test("caps: running jobs per stage and per org never exceed the caps; a settled job frees its slot", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("capped")
          const shares = { ...Queue.Limits.defaultShares, maxRunning: 3, maxRunningPerOrg: 2 }
          const opts = { ...worker("w"), shares }
          yield* q.enqueue(Array.from({ length: 5 }, () => ({ stage, orgId: "a" })))
          yield* q.enqueue(Array.from({ length: 5 }, () => ({ stage, orgId: "b" })))
          const first = yield* q.claimBatch(stage, 10, opts)
          expect(first.jobs.length).toBe(3)
          expect(first.capped).toBe(true)
          const second = yield* q.claimBatch(stage, 10, opts)
          expect(second.jobs).toEqual([])
          expect(second.capped).toBe(true)
          yield* completeAll(q, [first.jobs[0]!])
          const third = yield* q.claimBatch(stage, 10, opts)
          expect(third.jobs.length).toBe(1)
          const running = [...first.jobs.slice(1), ...third.jobs]
          expect(running.filter((j) => j.orgId === "a").length).toBeLessThanOrEqual(2)
          expect(running.filter((j) => j.orgId === "b").length).toBeLessThanOrEqual(2)
        }))

      test("rate limit: a token bucket spent by claims, refilled with time, and how long until the next token", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("rated")
          const shares = { ...Queue.Limits.defaultShares, rate: { limit: 2, perMs: 2_000, burst: 2, perOrg: false } }
          const opts = { ...worker("w"), shares }
          yield* q.enqueue(Array.from({ length: 6 }, () => ({ stage })))
          const first = yield* q.claimBatch(stage, 10, opts)
          expect(first.jobs.length).toBe(2)
          expect(first.rateLimitedForMs).not.toBeNull()
          expect(first.rateLimitedForMs!).toBeGreaterThan(500)
          expect(first.rateLimitedForMs!).toBeLessThanOrEqual(1_000)
          expect((yield* q.stats).find((s) => s.stage === stage)!.rateLimited).toBe(true)
          const dry = yield* q.claimBatch(stage, 10, opts)
          expect(dry.jobs).toEqual([])
          yield* target.advance(first.rateLimitedForMs! + 50)
          expect((yield* q.claimBatch(stage, 10, opts)).jobs.length).toBe(1)
          // an override lifts it at run time
          yield* q.limits.set(stage, { rateLimit: 0 })
          if (target.live) yield* target.advance("1100 millis")
          expect((yield* q.claimBatch(stage, 10, opts)).jobs.length).toBe(3)
          expect(yield* q.limits.clear(stage)).toBe(true)
        }))

      test("stats: depth by stage and status, and the age of the oldest ready job", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("stats")
          yield* q.enqueue([{ stage }, { stage }, { stage }, { stage, delay: "1 hour" }])
          yield* q.claim(stage, 1, worker("w"))
          yield* target.advance("100 millis")
          const row = (yield* q.stats).find((s) => s.stage === stage)!
          expect([row.ready, row.running, row.scheduled, row.deadLetters]).toEqual([2, 1, 1, 0])
          expect(row.oldestReadyAgeMs).toBeGreaterThanOrEqual(90)
        }))

      test("nextWake: when the next job of the given stages falls due, which of them have jobs due now, and when the first lease expires", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("wake")
          const other = freshStage("wake_other")
          const third = freshStage("wake_third")
          const near = (ms: number | null, expected: number) => ms !== null && Math.abs(ms - expected) < 5_000
          expect(yield* q.nextWake([stage])).toEqual({ jobDueInMs: null, dueNow: [], leaseExpiresInMs: null })
          yield* q.enqueue([{ stage: other, delay: "1 minute" }, { stage, delay: "2 hours" }])
          expect(near((yield* q.nextWake([stage])).jobDueInMs, 7_200_000)).toBe(true)
          expect(near((yield* q.nextWake([stage, other])).jobDueInMs, 60_000)).toBe(true)
          expect((yield* q.nextWake([stage, other])).dueNow).toEqual([])
          yield* q.enqueue([{ stage: third }])
          expect((yield* q.nextWake([third])).jobDueInMs).toBe(0)
          // only the stage with a due job is due now: the timer wakes only its pool
          const mixed = yield* q.nextWake([stage, other, third])
          expect([mixed.jobDueInMs, mixed.dueNow]).toEqual([0, [third]])
          yield* q.claim(third, 1, worker("w", 10_000))
          const next = yield* q.nextWake([stage])
          expect(near(next.leaseExpiresInMs, 10_000)).toBe(true)
          expect(near(next.jobDueInMs, 7_200_000)).toBe(true)
}).pipe(Effect.provide(target.fresh())))
    })
  })
