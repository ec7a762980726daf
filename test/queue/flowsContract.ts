/**
 * The flows contract: jobs that wait for other jobs (fan-in, diamonds, failure policies down chains, flows whose
 * parent reads its children's typed outputs), on both queues, so the twin cannot drift. Each test uses its own
 * stage names.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Duration, Effect, Either, Schema } from "effect"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import * as Stage from "../../packages/pgfiber/src/runtime/Stage.js"
import type { ContractTarget } from "./contract.js"
import { completeAll, settleOne } from "../support/settle.js"

let stageCounter = 0
const freshStage = (base: string) => `${base}_${stageCounter++}`
const worker = { workerId: "w", leaseFor: Duration.seconds(30) }

/** Claims the one ready job of `stage` and completes it with `output`. */
const runOne = (stage: string, output?: unknown) =>
  Effect.gen(function*() {
    const q = yield* Queue.Queue
    const [job] = yield* q.claim(stage, 1, worker)
    expect(job).toBeDefined()
    expect(yield* q.settle([Queue.Outcome.complete(job!, [], output)])).toEqual(["completed"])
    return job!
  })

const statusOf = (id: string) => Effect.flatMap(Queue.Queue, (q) => Effect.map(q.get(id), (j) => j?.status ?? null))

export const flowsContract = (target: ContractTarget) =>
  describe(`Flows contract: ${target.name}`, () => {
    layer(target.layer, { timeout: 120_000, excludeTestServices: target.live as false })((it) => {
      const test = it.effect

      test("a fan-in of 3: the dependent waits until its last parent completes, then is claimable", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const parents = freshStage("fanin_parent")
          const child = freshStage("fanin_child")
          const ids = (yield* q.enqueue([0, 1, 2].map((n) => ({ stage: parents, payload: { n } })))).map((r) => r.id)
          const [dependent] = yield* q.enqueue([{ stage: child, dependsOn: ids }])
          const waiting = yield* q.get(dependent!.id)
          expect(waiting?.status).toBe("waiting")
          expect(waiting?.waitingOn).toBe(3)
          expect(yield* q.claim(child, 10, worker)).toEqual([])
          expect((yield* q.list({ stage: child, status: "waiting" })).map((j) => j.id)).toEqual([dependent!.id])
          yield* runOne(parents)
          yield* runOne(parents)
          expect((yield* q.get(dependent!.id))?.waitingOn).toBe(1)
          expect(yield* q.claim(child, 10, worker)).toEqual([])
          yield* runOne(parents)
          expect(yield* statusOf(dependent!.id)).toBe("queued")
          const [claimed] = yield* q.claim(child, 10, worker)
          expect(claimed?.id).toBe(dependent!.id)
          const deps = yield* q.dependencies(dependent!.id)
          expect(deps?.parents.map((p) => [p.id, p.status])).toEqual(ids.map((id) => [id, "completed"]))
          expect((yield* q.dependencies(ids[0]!))?.children.map((c) => c.id)).toEqual([dependent!.id])
        }))

      test("a diamond: the join is released once when its two parents complete in one settle", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const top = freshStage("diamond_top")
          const side = freshStage("diamond_side")
          const join = freshStage("diamond_join")
          const [a] = yield* q.enqueue([{ stage: top }])
          const [b, c] = yield* q.enqueue([{ stage: side, dependsOn: [a!.id] }, { stage: side, dependsOn: [a!.id] }])
          const [d] = yield* q.enqueue([{ stage: join, dependsOn: [b!.id, c!.id] }])
          expect(yield* q.claim(side, 10, worker)).toEqual([])
          yield* runOne(top)
          const sides = yield* q.claim(side, 10, worker)
          expect(sides.map((j) => j.id).sort()).toEqual([b!.id, c!.id].sort())
          expect(yield* completeAll(q, sides)).toHaveLength(2)
          const joined = yield* q.claim(join, 10, worker)
          expect(joined.map((j) => j.id)).toEqual([d!.id])
          expect(yield* q.claim(join, 10, worker)).toEqual([])
        }))

      test("parents completing at once in separate settles release their dependents exactly once", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const parents = freshStage("race_parent")
          const child = freshStage("race_child")
          for (let round = 0; round < 10; round++) {
            const ids = (yield* q.enqueue([{ stage: parents }, { stage: parents }, { stage: parents }])).map((r) => r.id)
            // two dependents sharing all three parents (in opposite orders): each settle decrements both
            const dependents = yield* q.enqueue([{ stage: child, dependsOn: ids }, { stage: child, dependsOn: [...ids].reverse() }])
            const claimed = yield* q.claim(parents, 3, worker)
            expect(claimed).toHaveLength(3)
            yield* Effect.all(claimed.map((j) => completeAll(q, [j])), { concurrency: "unbounded" })
            const ready = yield* q.claim(child, 10, worker)
            expect(ready.map((j) => j.id).sort()).toEqual(dependents.map((d) => d.id).sort())
            yield* completeAll(q, ready)
          }
        }))

      test("a parent dead-lettered cancels its dependents with the reason, down the chain", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("chain")
          const [a] = yield* q.enqueue([{ stage }])
          const [b] = yield* q.enqueue([{ stage, dependsOn: [a!.id] }])
          const [c] = yield* q.enqueue([{ stage, dependsOn: [b!.id] }])
          const [dl] = yield* q.enqueue([{ stage, dependsOn: [{ id: a!.id, onFailure: "deadLetter" }] }])
          const [job] = yield* q.claim(stage, 10, worker)
          expect(job?.id).toBe(a!.id)
          expect(yield* settleOne(q, Queue.Outcome.deadLetter(job!, { tag: "Permanent", message: "bad input" }))).toBe("deadLettered")
          const cancelledB = yield* q.get(b!.id)
          expect(cancelledB?.status).toBe("cancelled")
          expect(cancelledB?.lastError).toBe(`parent job ${a!.id} was dead-lettered: bad input`)
          const cancelledC = yield* q.get(c!.id)
          expect(cancelledC?.status).toBe("cancelled")
          expect(cancelledC?.lastError).toBe(`parent job ${b!.id} was cancelled: parent job ${a!.id} was dead-lettered: bad input`)
          expect(yield* statusOf(dl!.id)).toBe("dead")
          const letters = yield* q.deadLetters.list({ stage })
          expect(letters.map((l) => [l.jobId, l.reason])).toContainEqual([dl!.id, `parent job ${a!.id} was dead-lettered: bad input`])
          expect(yield* q.claim(stage, 10, worker)).toEqual([])
        }))

      test("continueOnFailure: a dependent runs anyway when its parent dies", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("cont_parent")
          const child = freshStage("cont_child")
          const [a] = yield* q.enqueue([{ stage, maxAttempts: 1 }])
          const [b] = yield* q.enqueue([{ stage: child, dependsOn: [{ id: a!.id, onFailure: "continue" }] }])
          const [job] = yield* q.claim(stage, 1, worker)
          expect(yield* settleOne(q, Queue.Outcome.retry(job!, Duration.zero, { tag: "Transient", message: "timeout" }))).toBe("deadLettered")
          const [ran] = yield* q.claim(child, 10, worker)
          expect(ran?.id).toBe(b!.id)
          expect((yield* q.dependencies(b!.id))?.parents.map((p) => [p.id, p.status, p.onFailure])).toEqual([[a!.id, "dead", "continue"]])
        }))

      test("cancelling a parent cascades to its waiting dependents", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("cancel_cascade")
          const [a] = yield* q.enqueue([{ stage }])
          const [b] = yield* q.enqueue([{ stage, dependsOn: [a!.id] }])
          const [c] = yield* q.enqueue([{ stage, dependsOn: [b!.id] }])
          expect(yield* q.cancel(a!.id)).toBe("cancelled")
          expect(yield* statusOf(b!.id)).toBe("cancelled")
          expect((yield* q.get(c!.id))?.lastError).toBe(`parent job ${b!.id} was cancelled: parent job ${a!.id} was cancelled`)
          // purging a stage's queued jobs cancels what waits on them
          const purgedStage = freshStage("purged")
          const [p] = yield* q.enqueue([{ stage: purgedStage }])
          const [w] = yield* q.enqueue([{ stage, dependsOn: [p!.id] }])
          expect(yield* q.stageControls.purge(purgedStage)).toBe(1)
          expect((yield* q.get(w!.id))?.lastError).toBe(`parent job ${p!.id} was cancelled: purged`)
          // a waiting job can be cancelled itself
          const [d] = yield* q.enqueue([{ stage }])
          const [e] = yield* q.enqueue([{ stage, dependsOn: [d!.id] }])
          expect(yield* q.cancel(e!.id)).toBe("cancelled")
          yield* runOne(stage)
          expect(yield* q.claim(stage, 10, worker)).toEqual([])
        }))

      test("parents must exist in the job's org; a completed one counts as done, a dead one refuses", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("exists")
          const [done] = yield* q.enqueue([{ stage, orgId: "org-a" }])
          yield* runOne(stage)
          const [after] = yield* q.enqueue([{ stage, orgId: "org-a", dependsOn: [done!.id] }])
          expect(yield* statusOf(after!.id)).toBe("queued")
          yield* runOne(stage)
          const [other] = yield* q.enqueue([{ stage, orgId: "org-b" }])
          const crossOrg = yield* Effect.either(q.enqueue([{ stage, orgId: "org-a", dependsOn: [other!.id] }]))
          const missing = yield* Effect.either(q.enqueue([{ stage, orgId: "org-a", dependsOn: ["999999999"] }]))
          expect(Either.isLeft(crossOrg) && crossOrg.left._tag === "InvalidJob" && crossOrg.left.message).toBe(`dependsOn: job ${other!.id} not found`)
          expect(Either.isLeft(missing) && missing.left._tag === "InvalidJob" && missing.left.message).toBe("dependsOn: job 999999999 not found")
          yield* runOne(stage)
          const [doomed] = yield* q.enqueue([{ stage, orgId: "org-a" }])
          const [claimed] = yield* q.claim(stage, 1, worker)
          yield* settleOne(q, Queue.Outcome.deadLetter(claimed!, { tag: "Permanent", message: "no" }))
          const onDead = yield* Effect.either(q.enqueue([{ stage, orgId: "org-a", dependsOn: [doomed!.id] }]))
          expect(Either.isLeft(onDead) && onDead.left.message).toBe(`dependsOn: job ${doomed!.id} was dead-lettered, and onFailure is cancel`)
          const [anyway] = yield* q.enqueue([{ stage, orgId: "org-a", dependsOn: [{ id: doomed!.id, onFailure: "continue" }] }])
          expect(yield* statusOf(anyway!.id)).toBe("queued")
          const bad = yield* Effect.either(q.enqueue([{ stage, dependsOn: ["x1"] }]))
          expect(Either.isLeft(bad) && bad.left._tag === "InvalidJob" && bad.left.field).toBe("dependsOn")
        }))

      test("a 3-level flow: each parent runs after its children and reads their outputs, typed by their stages", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const leaf = Stage.make({
            name: freshStage("flow_leaf"),
            payload: Schema.Struct({ n: Schema.Number }),
            output: Schema.Struct({ squared: Schema.Number }),
            handler: ({ n }) => Effect.succeed({ squared: n * n })
          })
          const mid = Stage.make({
            name: freshStage("flow_mid"),
            payload: Schema.Struct({}),
            output: Schema.Struct({ sum: Schema.Number }),
            handler: () => Effect.succeed({ sum: 0 })
          })
          const root = freshStage("flow_root")
          const ids = yield* Queue.enqueueFlow({
            job: { stage: root },
            children: [
              { job: { stage: mid.name }, children: [1, 2].map((n) => ({ job: { stage: leaf.name, payload: { n } } })) },
              { job: { stage: mid.name }, children: [3, 4, 5].map((n) => ({ job: { stage: leaf.name, payload: { n } } })) }
            ]
          })
          expect(ids.children.map((c) => c.children.length)).toEqual([2, 3])
          expect(yield* statusOf(ids.id)).toBe("waiting")
          expect(yield* q.claim(mid.name, 10, worker)).toEqual([])
          const leaves = yield* q.claim(leaf.name, 10, worker)
          expect(leaves).toHaveLength(5)
          yield* q.settle(leaves.map((j) => Queue.Outcome.complete(j, [], { squared: (j.payload as { n: number }).n ** 2 })))
          const mids = yield* q.claim(mid.name, 10, worker)
          expect(mids).toHaveLength(2)
          expect(yield* q.claim(root, 10, worker)).toEqual([])
          const sums = yield* Effect.forEach(mids, (m) =>
            Effect.map(Stage.childOutputs(m.id, leaf), (outs) => outs.reduce((s, o) => s + o.output.squared, 0)))
          expect(sums.sort((a, b) => a - b)).toEqual([5, 50])
          yield* q.settle(mids.map((m, i) => Queue.Outcome.complete(m, [], { sum: sums[i] })))
          const [top] = yield* q.claim(root, 10, worker)
          expect(top?.id).toBe(ids.id)
          const outputs = yield* Stage.childOutputs(top!.id, mid)
          expect(outputs.map((o) => o.output.sum).sort((a, b) => a - b)).toEqual([5, 50])
        }))

      test("uniqueness over a window: one job per key per period, counting finished jobs, per org", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("window")
          // a window of 366 days: both enqueues fall in one unless the test straddles its boundary (once a year)
          const long = { stage, dedupeKey: "report", uniqueFor: Duration.days(366) }
          const [first] = yield* q.enqueue([{ ...long, orgId: "org-a" }])
          expect(first!.deduped).toBe(false)
          yield* runOne(stage)
          expect(yield* statusOf(first!.id)).toBe("completed")
          // finished, yet still this window's job; duplicates within one batch follow the first
          const again = yield* q.enqueue([{ ...long, orgId: "org-a" }, { ...long, orgId: "org-a" }])
          expect(again).toEqual([{ id: first!.id, deduped: true }, { id: first!.id, deduped: true }])
          const [otherOrg] = yield* q.enqueue([{ ...long, orgId: "org-b" }])
          expect(otherOrg!.deduped).toBe(false)
          const [otherKey] = yield* q.enqueue([{ ...long, orgId: "org-a", dedupeKey: "other" }])
          expect(otherKey!.deduped).toBe(false)
          // a window of a second: after more than one, the next window takes a new job
          // (a live job with the key still dedupes, as without a window: run it first)
          const ticks = freshStage("window_tick")
          const short = { stage: ticks, dedupeKey: "tick", uniqueFor: "1 second" as const }
          const [a] = yield* q.enqueue([short])
          expect((yield* q.enqueue([short]))[0]!.id).toBe(a!.id)
          yield* runOne(ticks)
          yield* target.advance("1100 millis")
          const [b] = yield* q.enqueue([short])
          expect(b!.deduped).toBe(false)
          expect(b!.id).not.toBe(a!.id)
          const refused = yield* Effect.either(q.enqueue([{ stage, uniqueFor: "1 hour" }]))
          expect(Either.isLeft(refused) && refused.left._tag === "InvalidJob" && refused.left.field).toBe("uniqueFor")
        }))

      test("a batch of 100 finishing at once in two settles enqueues its callback exactly once, with its counts", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("batch_jobs")
          const done = freshStage("batch_done")
          const failedStage = freshStage("batch_failed")
          const batch = yield* q.batches.create({
            orgId: "org-a",
            onComplete: { stage: done, payload: { report: "daily" } },
            onFailure: { stage: failedStage },
            jobs: Array.from({ length: 100 }, (_, n) => ({ stage, payload: { n } }))
          })
          expect(batch.jobs).toHaveLength(100)
          expect((yield* q.get(batch.jobs[0]!.id))?.batchId).toBe(batch.id)
          // two workers hold half each, and settle at once
          const first = yield* q.claim(stage, 50, { ...worker, workerId: "a" })
          const second = yield* q.claim(stage, 50, { ...worker, workerId: "b" })
          expect(first.length + second.length).toBe(100)
          yield* Effect.all([completeAll(q, first), completeAll(q, second)], { concurrency: "unbounded" })
          const callbacks = yield* q.claim(done, 10, worker)
          expect(callbacks).toHaveLength(1)
          expect(callbacks[0]!.orgId).toBe("org-a")
          expect(callbacks[0]!.payload).toEqual({ report: "daily", batch: { id: batch.id, total: 100, completed: 100, failed: 0 } })
          expect(yield* q.claim(failedStage, 10, worker)).toEqual([])
          const finished = yield* q.batches.get(batch.id)
          expect(finished).toMatchObject({ total: 100, completed: 100, failed: 0, sealed: true, callbacks: [callbacks[0]!.id] })
          expect(finished?.finishedAt).not.toBeNull()
        }))

      test("an open batch takes more jobs until sealed; failures and cascades count; onFailure runs beside onComplete", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("open_batch")
          const done = freshStage("open_batch_done")
          const failedStage = freshStage("open_batch_failed")
          const batch = yield* q.batches.create({
            onComplete: { stage: done },
            onFailure: { stage: failedStage },
            open: true,
            jobs: [{ stage }, { stage }]
          })
          const [a, b] = yield* q.claim(stage, 2, worker)
          yield* completeAll(q, [a!])
          yield* settleOne(q, Queue.Outcome.deadLetter(b!, { tag: "Permanent", message: "no" }))
          // all finished, but open: no callback yet
          expect(yield* q.claim(done, 10, worker)).toEqual([])
          const [late] = yield* q.batches.add(batch.id, [{ stage }])
          // a dependent of the late job, in the batch too: cancelled with it, counted as failed
          const [dependent] = yield* q.batches.add(batch.id, [{ stage, dependsOn: [late!.id] }])
          expect((yield* q.batches.seal(batch.id)).finishedAt).toBeNull()
          expect(yield* q.cancel(late!.id)).toBe("cancelled")
          expect(yield* statusOf(dependent!.id)).toBe("cancelled")
          const [onComplete] = yield* q.claim(done, 10, worker)
          const [onFailure] = yield* q.claim(failedStage, 10, worker)
          const counts = { id: batch.id, total: 4, completed: 1, failed: 3 }
          expect(onComplete?.payload).toEqual({ batch: counts })
          expect(onFailure?.payload).toEqual({ batch: counts })
          const sealedAdd = yield* Effect.either(q.batches.add(batch.id, [{ stage }]))
          expect(Either.isLeft(sealedAdd) && sealedAdd.left.message).toBe(`batch ${batch.id} is sealed`)
          const otherOrg = yield* Effect.either(q.enqueue([{ stage, orgId: "org-z", batchId: batch.id }]))
          expect(Either.isLeft(otherOrg) && otherOrg.left.message).toBe(`batch ${batch.id} not found`)
          // a batch sealed after its jobs finished calls back as it is sealed
          const quick = yield* q.batches.create({ onComplete: { stage: done }, open: true, jobs: [{ stage }] })
          yield* runOne(stage)
          expect((yield* q.batches.seal(quick.id)).callbacks).toHaveLength(1)
          expect((yield* q.batches.seal(quick.id)).callbacks).toHaveLength(1)
          expect(yield* q.claim(done, 10, worker)).toHaveLength(1)
        }))

      test("a flow enqueued in a transaction that fails leaves nothing behind", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const stage = freshStage("flow_rollback")
          // the children are written, then the root's unknown parent fails the transaction
          const failed = yield* Effect.either(Queue.enqueueFlow({
            job: { stage, dependsOn: ["999999998"] },
            children: [{ job: { stage }, children: [{ job: { stage } }] }, { job: { stage } }]
          }))
          expect(Either.isLeft(failed)).toBe(true)
          expect(yield* q.list({ stage })).toEqual([])
        }))
    })
  })
