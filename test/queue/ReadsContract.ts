/**
 * The Reads contract: one suite, two callers (Reads over MemoryQueue, and Reads over Postgres), so what the faces
 * read cannot drift between the twin and the product. Each test uses its own stage names (the layer is shared);
 * the snapshot and stats cover every stage, so assertions pick their own stage out of them.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Duration, Effect, type Layer } from "effect"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import * as Reads from "../../packages/pgfiber/src/queue/Reads.js"
import { completeAll, settleOne } from "../support/settle.js"

export interface ReadsTarget {
  readonly name: string
  readonly layer: Layer.Layer<Queue.Queue | Reads.Reads>
  /** it.effect on the real clock (Postgres) or TestClock (memory). */
  readonly live: boolean
}

let counter = 0
const freshStage = (base: string) => `${base}_${counter++}`
const worker = (id: string) => ({ workerId: id, leaseFor: Duration.seconds(30) })

export const contract = (target: ReadsTarget) =>
  describe(`Reads contract: ${target.name}`, () => {
    layer(target.layer, { timeout: 120_000, excludeTestServices: target.live as false })((it) => {
      it.effect("browse lists live jobs, the kept history and dead letters as one list, newest first", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const reads = yield* Reads.Reads
          const stage = freshStage("browse")
          const [done] = yield* q.enqueue([{ stage, payload: { n: 1 }, subjectId: "s1" }])
          const claimedDone = yield* q.claim(stage, 1, worker("w"))
          yield* completeAll(q, claimedDone)
          const [dead] = yield* q.enqueue([{ stage, payload: { n: 2 }, maxAttempts: 1 }])
          const [lease] = yield* q.claim(stage, 1, worker("w"))
          yield* settleOne(q, Queue.Outcome.deadLetter(lease!, { tag: "Permanent", message: "Broken Widget" }))
          const [running] = yield* q.enqueue([{ stage, payload: { n: 3 } }])
          yield* q.claim(stage, 1, worker("w"))
          const [later] = yield* q.enqueue([{ stage, payload: { n: 4, tag: "x" }, delay: "1 hour" }])
          const [ready] = yield* q.enqueue([{ stage, payload: { n: 5 }, subjectId: "s1" }])

          const all = yield* reads.browse(Reads.operator, { ...Queue.browseAll, stage }, 50)
          expect(all.map((j) => [j.id, j.status])).toEqual([
            [ready!.id, "queued"],
            [later!.id, "delayed"],
            [running!.id, "running"],
            [dead!.id, "dead"],
            [done!.id, "completed"]
          ])
          const deadRow = all.find((j) => j.id === dead!.id)!
          expect(deadRow.lastError).toContain("Broken Widget")
          expect(deadRow.availableAt).toBeNull()
          expect(all.find((j) => j.id === later!.id)!.availableAt).toBeInstanceOf(Date)

          const only = (filter: Partial<Queue.BrowseFilter>) =>
            Effect.map(reads.browse(Reads.operator, { ...Queue.browseAll, stage, ...filter }, 50), (rows) => rows.map((j) => j.id))
          expect(yield* only({ status: "delayed" })).toEqual([later!.id])
          expect(yield* only({ status: "completed" })).toEqual([done!.id])
          expect(yield* only({ subject: "s1" })).toEqual([ready!.id, done!.id])
          expect(yield* only({ payload: JSON.stringify({ tag: "x" }) })).toEqual([later!.id])
          expect(yield* only({ error: "broken widget" })).toEqual([dead!.id])
          expect(yield* only({ id: running!.id })).toEqual([running!.id])
          // the next page: smaller ids than the last one shown
          expect(yield* only({ before: running!.id })).toEqual([dead!.id, done!.id])
          expect(yield* Effect.map(reads.browse(Reads.operator, { ...Queue.browseAll, stage }, 2), (rows) => rows.length)).toBe(2)
        }))

      it.effect("an org's viewer reads its own org's rows only; an operator reads every org's", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const reads = yield* Reads.Reads
          const stage = freshStage("orgs")
          const [mine] = yield* q.enqueue([{ stage, orgId: "org-a", payload: { n: 1 }, maxAttempts: 1 }])
          const [theirs] = yield* q.enqueue([{ stage, orgId: "org-b", payload: { n: 2 } }])
          const [lease] = yield* q.claim(stage, 1, worker("w"))
          expect(lease!.id).toBe(mine!.id)
          yield* settleOne(q, Queue.Outcome.deadLetter(lease!, { tag: "Permanent", message: "no" }))

          const ids = (rows: ReadonlyArray<{ readonly id: string }>) => rows.map((r) => r.id)
          const browse = (viewer: Reads.Viewer) => reads.browse(viewer, { ...Queue.browseAll, stage }, 50)
          expect(ids(yield* browse(Reads.org("org-a")))).toEqual([mine!.id])
          expect(ids(yield* browse(Reads.org("org-b")))).toEqual([theirs!.id])
          expect(ids(yield* browse(Reads.operator))).toEqual([theirs!.id, mine!.id])
          // an operator's org filter narrows; an org's viewer cannot widen its view with one
          expect(ids(yield* reads.browse(Reads.operator, { ...Queue.browseAll, stage, org: "org-b" }, 50))).toEqual([theirs!.id])
          expect(ids(yield* reads.browse(Reads.org("org-a"), { ...Queue.browseAll, stage, org: "org-b" }, 50))).toEqual([])

          expect(ids(yield* reads.list(Reads.org("org-b"), { stage }))).toEqual([theirs!.id])
          expect(ids(yield* reads.list(Reads.org("org-a"), { stage }))).toEqual([])

          const dl = yield* reads.deadLetterOfJob(Reads.org("org-a"), mine!.id)
          expect(dl).not.toBeNull()
          expect(yield* reads.deadLetterOfJob(Reads.org("org-b"), mine!.id)).toBeNull()
          expect(yield* reads.deadLetterOfJob(Reads.operator, mine!.id)).toBe(dl)
          expect(yield* reads.deadLetterOfJob(Reads.operator, theirs!.id)).toBeNull()

          expect(yield* reads.openDeadLetterIds(Reads.org("org-a"), { stage, org: null }, 10)).toEqual([dl])
          expect(yield* reads.openDeadLetterIds(Reads.org("org-b"), { stage, org: null }, 10)).toEqual([])
          expect(yield* reads.openDeadLetterIds(Reads.operator, { stage, org: "org-b" }, 10)).toEqual([])
        }))

      it.effect("counts what a purge would delete: queued jobs of a stage, resolved dead letters", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const reads = yield* Reads.Reads
          const stage = freshStage("counts")
          yield* q.enqueue([{ stage, payload: { n: 1 } }, { stage, payload: { n: 2 } }, { stage, payload: { n: 3 } }])
          yield* q.claim(stage, 1, worker("w"))
          expect(yield* reads.countQueued(stage)).toBe(2)
          expect(yield* reads.countQueued(freshStage("none"))).toBe(0)

          const org = `org-${stage}`
          const [a] = yield* q.enqueue([{ stage: `${stage}_dl`, orgId: org, payload: { n: 1 } }])
          yield* q.enqueue([{ stage: `${stage}_dl`, orgId: org, payload: { n: 2 } }])
          for (const lease of yield* q.claim(`${stage}_dl`, 2, worker("w"))) {
            yield* settleOne(q, Queue.Outcome.deadLetter(lease, { tag: "Permanent", message: "no" }))
          }
          const viewer = Reads.org(org)
          expect(yield* reads.countPurgeable(viewer, { olderThanMs: null, includeUnresolved: true })).toBe(2)
          expect(yield* reads.countPurgeable(viewer, { olderThanMs: null, includeUnresolved: false })).toBe(0)
          const dl = yield* reads.deadLetterOfJob(viewer, a!.id)
          yield* q.deadLetters.resolve(dl!, "handled")
          expect(yield* reads.countPurgeable(viewer, { olderThanMs: null, includeUnresolved: false })).toBe(1)
          // older than an hour: none yet
          expect(yield* reads.countPurgeable(viewer, { olderThanMs: 3_600_000, includeUnresolved: true })).toBe(0)
        }))

      it.effect("the live snapshot: depth per stage and org, workers, watched jobs, paused stages", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const reads = yield* Reads.Reads
          const stage = freshStage("snap")
          const [run] = yield* q.enqueue([{ stage, orgId: "org-s", payload: { n: 1 } }])
          yield* q.claim(stage, 1, worker("snap-worker"))
          yield* q.enqueue([{ stage, orgId: "org-s", payload: { n: 2 } }, { stage, orgId: "org-s", payload: { n: 3 }, delay: "1 hour" }])
          const [gone] = yield* q.enqueue([{ stage, payload: { n: 4 } }])
          yield* q.cancel(gone!.id)
          yield* q.stageControls.setPaused(stage, true, "test")

          const snap = yield* reads.snapshot([run!.id, gone!.id], 60)
          expect(snap.now).toBeInstanceOf(Date)
          const depth = snap.depth.filter((d) => d.stage === stage)
          expect(depth).toHaveLength(1)
          expect(depth[0]).toMatchObject({ org: "org-s", ready: 1, delayed: 1, running: 1, cancelling: 0, dead: 0 })
          expect(snap.workers.filter((w) => w.stage === stage)).toEqual([{ worker: "snap-worker", stage, org: "org-s", running: 1 }])
          // the running job is watched as it is now; the cancelled one has left the live table
          expect(snap.watched.map((j) => [j.id, j.status, j.locked_by])).toEqual([[run!.id, "running", "snap-worker"]])
          expect(snap.paused).toContain(stage)
        }))

      it.effect("list, history and stats read what the queue holds", () =>
        Effect.gen(function*() {
          const q = yield* Queue.Queue
          const reads = yield* Reads.Reads
          const stage = freshStage("lists")
          const [first] = yield* q.enqueue([{ stage, payload: { n: 1 } }])
          const [second] = yield* q.enqueue([{ stage, payload: { n: 2 } }])
          yield* completeAll(q, yield* q.claim(stage, 1, worker("w")))
          expect((yield* reads.list(Reads.operator, { stage })).map((j) => j.id)).toEqual([second!.id])
          expect((yield* reads.history(Reads.operator, { stage })).map((j) => [j.id, j.status])).toEqual([[first!.id, "completed"]])
          const stats = (yield* reads.stats).find((s) => s.stage === stage)
          expect(stats).toMatchObject({ ready: 1, running: 0, deadLetters: 0 })
        }))
    })
  })
