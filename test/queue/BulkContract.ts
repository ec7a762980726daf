/**
 * The bulk-action and search contract (Queue.bulk, Queue.list's payload and error search): one suite, run on
 * MemoryQueue and PgQueue (Bulk.memory.test.ts, Bulk.pg.test.ts). Each test uses its own stage names.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Duration, Effect } from "effect"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import type { ContractTarget } from "./contract.js"
import { settleOne } from "../support/settle.js"

let stageCounter = 0
const freshStage = (base: string) => `${base}_${stageCounter++}`
const worker = { workerId: "w", leaseFor: Duration.seconds(30) }
const cancel = { kind: "cancel" } as const

export const bulkContract = (target: ContractTarget) =>
  describe(`Bulk contract: ${target.name}`, () => {
    layer(target.layer, { timeout: 120_000, excludeTestServices: target.live as false })((it) => {
      const test = it.effect

      /** Two jobs waiting to retry (failed once), in `stage`, with the given error messages. */
      const failedOnce = (q: Queue.Queue["Type"], stage: string, messages: ReadonlyArray<string>) =>
        Effect.gen(function*() {
          yield* q.enqueue(messages.map((m) => ({ stage, payload: { m } })))
          const claimed = yield* q.claim(stage, messages.length, worker)
          for (const job of claimed) {
            const m = (job.payload as { m: string }).m
            expect(yield* settleOne(q, Queue.Outcome.retry(job, Duration.hours(1), { tag: "Transient", message: m }))).toBe("retried")
          }
        })

      test("each filter narrows the preview: stage, org, subject, payload containment, error text, state", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const a = freshStage("bulk_filter_a")
          const b = freshStage("bulk_filter_b")
          yield* q.enqueue([
            { stage: a, orgId: "org1", subjectId: "s1", payload: { customer: 42, region: "eu", tags: ["x", "y"] } },
            { stage: a, orgId: "org1", subjectId: "s2", payload: { customer: 42, region: "us" } },
            { stage: a, orgId: "org2", subjectId: "s1", payload: { customer: 7, nested: { id: 1 } } },
            { stage: a, orgId: "org2", payload: { customer: 7 }, delay: "1 hour" },
            { stage: b, orgId: "org1", payload: { customer: 42 } }
          ])
          const count = (f: Queue.Bulk.JobFilter) => q.bulk.preview(f, cancel)
          expect(yield* count({ stage: a })).toBe(4)
          expect(yield* count({ stage: b })).toBe(1)
          expect(yield* count({ stage: a, org: "org1" })).toBe(2)
          expect(yield* count({ stage: a, subject: "s1" })).toBe(2)
          expect(yield* count({ stage: a, payload: { customer: 42 } })).toBe(2)
          expect(yield* count({ payload: { customer: 42 }, org: "org1" })).toBeGreaterThanOrEqual(3)
          expect(yield* count({ stage: a, payload: { customer: 42, region: "eu" } })).toBe(1)
          expect(yield* count({ stage: a, payload: { tags: ["y"] } })).toBe(1)
          expect(yield* count({ stage: a, payload: { nested: { id: 1 } } })).toBe(1)
          expect(yield* count({ stage: a, payload: { customer: "42" } })).toBe(0)
          expect(yield* count({ stage: a, status: "queued" })).toBe(3)
          expect(yield* count({ stage: a, status: "delayed" })).toBe(1)
          expect(yield* count({ stage: a, hiddenStages: [a] })).toBe(0)

          const e = freshStage("bulk_filter_err")
          yield* failedOnce(q, e, ["Connection TIMEOUT after 30s", "permission denied", "100% _odd_ text"])
          expect(yield* count({ stage: e, error: "timeout" })).toBe(1)
          expect(yield* count({ stage: e, error: "DENIED" })).toBe(1)
          // LIKE's wildcards are taken literally
          expect(yield* count({ stage: e, error: "100%" })).toBe(1)
          expect(yield* count({ stage: e, error: "_odd_" })).toBe(1)
          expect(yield* count({ stage: e, error: "%" })).toBe(1)
          expect(yield* count({ stage: e, error: "nothing like it" })).toBe(0)
          expect(yield* count({ stage: e, status: "delayed" })).toBe(3)
        }))

      test("age filters: older than and newer than a duration, by creation time", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("bulk_age")
          yield* q.enqueue([{ stage, payload: { n: "old" } }])
          // on Postgres the clock is real: the new job must stay younger than the threshold until the action ends,
          // so the threshold leaves it 10 s of slack on a loaded machine (3 s was not enough in CI at load ~6;
          // the old one is always past it)
          yield* target.advance("20 seconds")
          yield* q.enqueue([{ stage, payload: { n: "new" } }])
          const threshold = Duration.seconds(10)
          expect(yield* q.bulk.preview({ stage, olderThan: threshold }, cancel)).toBe(1)
          expect(yield* q.bulk.preview({ stage, newerThan: threshold }, cancel)).toBe(1)
          const r = yield* q.bulk.apply({ stage, olderThan: threshold }, cancel, { actor: "test" })
          expect(r.affected).toBe(1)
          const left = yield* q.list({ stage })
          expect(left.map((j) => j.payload)).toEqual([{ n: "new" }])
        }))

      test("cancel removes queued jobs into the history, marks running ones, and touches nothing else", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("bulk_cancel")
          const other = freshStage("bulk_cancel_other")
          yield* q.enqueue(Array.from({ length: 30 }, (_, n) => ({ stage, payload: { customer: n % 3 === 0 ? 42 : 1, n } })))
          yield* q.enqueue(Array.from({ length: 5 }, (_, n) => ({ stage: other, payload: { customer: 42, n } })))
          // one matching job is running
          const [running] = yield* q.claim(stage, 1, worker)
          expect((running!.payload as { customer: number }).customer).toBe(42)
          const filter = { stage, payload: { customer: 42 } }
          expect(yield* q.bulk.preview(filter, cancel)).toBe(10)
          const r = yield* q.bulk.apply(filter, cancel, { actor: "ops@example", batch: 3 })
          expect(r).toMatchObject({ matched: 10, affected: 10, cancelling: 1 })
          expect(yield* q.bulk.preview(filter, cancel)).toBe(0)
          const live = yield* q.list({ stage, limit: 1000 })
          expect(live.length).toBe(21)
          expect(live.find((j) => j.id === running!.id)?.status).toBe("cancelled")
          expect(live.filter((j) => (j.payload as { customer: number }).customer === 42).length).toBe(1)
          expect((yield* q.list({ stage: other })).length).toBe(5)
          const kept = yield* q.history.list({ stage, status: "cancelled", limit: 100 })
          expect(kept.length).toBe(9)
          // the running one stops at its next heartbeat, as a single cancel's does
          expect(yield* q.heartbeat([running!], Duration.seconds(30))).toEqual([])
          const [record] = yield* q.bulk.actions({ limit: 1 })
          expect(record).toMatchObject({ id: r.actionId, action: "cancel", actor: "ops@example", matched: 10, affected: 10 })
          expect(record!.filter).toEqual({ stage, payload: { customer: 42 } })
        }))

      test("cancel scoped to an org changes and counts only that org's jobs", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("bulk_org")
          yield* q.enqueue([
            ...Array.from({ length: 4 }, () => ({ stage, orgId: "acme", payload: { k: 1 } })),
            ...Array.from({ length: 6 }, () => ({ stage, orgId: "globex", payload: { k: 1 } }))
          ])
          expect(yield* q.bulk.preview({ stage, org: "acme" }, cancel)).toBe(4)
          const r = yield* q.bulk.apply({ stage, org: "acme" }, cancel, { actor: "t" })
          expect(r.affected).toBe(4)
          const left = yield* q.list({ stage })
          expect(left.map((j) => j.orgId)).toEqual(Array(6).fill("globex"))
        }))

      test("retry now makes failed jobs waiting for their next attempt due, keeping their attempts", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("bulk_retry")
          yield* failedOnce(q, stage, ["timeout a", "timeout b", "bad gateway"])
          // a job delayed by its producer has no error: retry leaves it (run-now is for those)
          yield* q.enqueue([{ stage, payload: { m: "scheduled" }, delay: "1 hour" }])
          expect(yield* q.claim(stage, 10, worker)).toEqual([])
          const retry = { kind: "retry" } as const
          expect(yield* q.bulk.preview({ stage }, retry)).toBe(3)
          expect(yield* q.bulk.preview({ stage, error: "timeout" }, retry)).toBe(2)
          const r = yield* q.bulk.apply({ stage, error: "timeout" }, retry, { actor: "t" })
          expect(r.affected).toBe(2)
          const claimed = yield* q.claim(stage, 10, worker)
          expect(claimed.map((j) => (j.payload as { m: string }).m).sort()).toEqual(["timeout a", "timeout b"])
          expect(claimed.every((j) => j.attempts === 1)).toBe(true)
        }))

      test("run now makes delayed jobs due; jobs already due are not counted", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("bulk_runnow")
          yield* q.enqueue([
            { stage, payload: { n: 1 }, delay: "1 hour" },
            { stage, payload: { n: 2 }, runAt: new Date(Date.now() + 86_400_000) },
            { stage, payload: { n: 3 } }
          ])
          const runNow = { kind: "run-now" } as const
          expect(yield* q.bulk.preview({ stage }, runNow)).toBe(2)
          expect(yield* q.bulk.preview({ stage, status: "queued" }, runNow)).toBe(0)
          const r = yield* q.bulk.apply({ stage, status: "delayed" }, runNow, { actor: "t" })
          expect(r.affected).toBe(2)
          expect((yield* q.claim(stage, 10, worker)).length).toBe(3)
        }))

      test("priority changes queued jobs' priority and so the claim order", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("bulk_priority")
          yield* q.enqueue([
            { stage, payload: { n: 1 } },
            { stage, payload: { n: 2 } },
            { stage, payload: { n: 3, vip: true } }
          ])
          const urgent = { kind: "priority", priority: 5 } as const
          expect(yield* q.bulk.preview({ stage, payload: { vip: true } }, urgent)).toBe(1)
          expect((yield* q.bulk.apply({ stage, payload: { vip: true } }, urgent, { actor: "t" })).affected).toBe(1)
          // already at that priority: nothing left to change
          expect(yield* q.bulk.preview({ stage, payload: { vip: true } }, urgent)).toBe(0)
          const [first] = yield* q.claim(stage, 1, worker)
          expect(first!.payload).toEqual({ n: 3, vip: true })
          expect(first!.priority).toBe(5)
        }))

      test("a batched action reaches every matching job (batches smaller than the match)", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("bulk_batches")
          yield* q.enqueue(Array.from({ length: 250 }, (_, n) => ({ stage, payload: { even: n % 2 === 0 }, delay: "1 hour" })))
          const r = yield* q.bulk.apply({ stage, payload: { even: true } }, { kind: "run-now" }, { actor: "t", batch: 7 })
          expect(r).toMatchObject({ matched: 125, affected: 125 })
          expect((yield* q.claim(stage, 1000, worker)).length).toBe(125)
        }))

      test("the job list searches payloads by containment and errors by substring", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("bulk_search")
          yield* q.enqueue([
            { stage, payload: { customer: 42, order: { id: 7 } } },
            { stage, payload: { customer: 43 } }
          ])
          const found = yield* q.list({ stage, payload: { order: { id: 7 } } })
          expect(found.map((j) => j.payload)).toEqual([{ customer: 42, order: { id: 7 } }])
          expect((yield* q.list({ stage, payload: { customer: 44 } })).length).toBe(0)
          const e = freshStage("bulk_search_err")
          yield* failedOnce(q, e, ["upstream said 503", "schema mismatch"])
          const errs = yield* q.list({ stage: e, error: "503" })
          expect(errs.map((j) => j.lastError)).toEqual(["upstream said 503"])
        }))
    })
  })
