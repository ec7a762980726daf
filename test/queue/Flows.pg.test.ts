import { describe, expect, layer } from "@effect/vitest"
import { Context, Deferred, Duration, Effect, Fiber, Layer, Redacted, TestClock } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import * as SqlClock from "../../packages/pgfiber/src/queue/SqlClock.js"
import { databaseUrl, freshSchemaName, layerDb, rawSql } from "../support/pg.js"
import { waitFor } from "../support/waitFor.js"
import { flowsContract } from "./flowsContract.js"
import { completeAll } from "../support/settle.js"

// on the TestClock: the statements take its time (SqlClock.layerTest), so nothing sleeps
flowsContract({
  name: "PgQueue",
  layer: PgQueue.layer().pipe(Layer.provide(layerDb({ poolMax: 12 })), Layer.provide(SqlClock.layerTest)),
  fresh: () => PgQueue.layer().pipe(Layer.provide(layerDb({ poolMax: 2 })), Layer.provide(SqlClock.layerTest)),
  advance: (d) => TestClock.adjust(d),
  live: false
})

const worker = { workerId: "w", leaseFor: Duration.seconds(30) }

describe("Flows on PostgreSQL: enqueues and settles racing in different sessions", () => {
  const schema = freshSchemaName("flows_race")
  layer(PgQueue.layer().pipe(Layer.provide(layerDb({ schema, poolMax: 6 }))), { timeout: 120_000, excludeTestServices: true })((it) => {
    it.scoped("a settle that waited for the enqueue's lock on the parent still releases the new dependent", () =>
      Effect.gen(function*() {
        const q = yield* Queue.Queue
        const sql = rawSql(schema)
        yield* Effect.addFinalizer(() => Effect.promise(() => sql.end({ timeout: 5 })))
        for (let round = 0; round < 3; round++) {
          yield* q.enqueue([{ stage: "race_parent" }])
          const [parent] = yield* q.claim("race_parent", 1, worker)
          // the enqueue locks the parent; the settle starts (takes its snapshot) and waits for that lock; then the
          // enqueue commits: the settle's snapshot cannot see the dependent, settle_dependents' must
          const locked = yield* Deferred.make<void>()
          const settleWaits = yield* Deferred.make<void>()
          const enqueue = yield* Effect.fork(q.transaction(Effect.gen(function*() {
            const written = yield* q.enqueue([{ stage: "race_child", dependsOn: [parent!.id] }])
            yield* Deferred.succeed(locked, undefined)
            yield* Deferred.await(settleWaits)
            return written
          })))
          yield* Deferred.await(locked)
          const settle = yield* Effect.fork(completeAll(q, [parent!]))
          yield* waitFor("the settle to wait for the parent's lock", Effect.promise(async () => {
            const [row] = await sql`select count(*)::int as n from pg_stat_activity
              where wait_event_type = 'Lock' and query like '%with deleted as%'`
            return row!.n > 0
          }), Duration.seconds(60))
          yield* Deferred.succeed(settleWaits, undefined)
          const [dependent] = yield* Fiber.join(enqueue)
          expect(yield* Fiber.join(settle)).toEqual([parent!.id])
          const [ready] = yield* q.claim("race_child", 10, worker)
          expect(ready?.id).toBe(dependent!.id)
          yield* completeAll(q, [ready!])
        }
      }))

    it.scoped("enqueues and settles of the same parents at once never leave a dependent waiting for a finished parent", () =>
      Effect.gen(function*() {
        const q = yield* Queue.Queue
        for (let round = 0; round < 30; round++) {
          yield* q.enqueue([{ stage: "mix_parent" }, { stage: "mix_parent" }])
          const parents = yield* q.claim("mix_parent", 2, worker)
          const [, , [dependent]] = yield* Effect.all([
            completeAll(q, [parents[0]!]),
            completeAll(q, [parents[1]!]),
            q.enqueue([{ stage: "mix_child", dependsOn: parents.map((p) => p.id) }])
          ], { concurrency: "unbounded" })
          const [ready] = yield* q.claim("mix_child", 10, worker)
          expect(ready?.id).toBe(dependent!.id)
          yield* completeAll(q, [ready!])
        }
      }))
  
    it.scoped("a batch of 100 settled at once by two queues on their own pools (as two processes) calls back exactly once", () =>
      Effect.gen(function*() {
        const q = yield* Queue.Queue
        // a second queue with a pool of its own on the same schema: another process, as far as PostgreSQL can tell
        const other = yield* Layer.build(PgQueue.layer().pipe(
          Layer.provide(Layer.scoped(Db.Db, Db.make({ url: Redacted.make(databaseUrl()), schema, poolMax: 2 })))
        )).pipe(Effect.orDie)
        const q2 = Context.get(other, Queue.Queue)
        for (let round = 0; round < 5; round++) {
          const batch = yield* q.batches.create({
            onComplete: { stage: "two_done", payload: { round } },
            jobs: Array.from({ length: 100 }, (_, n) => ({ stage: "two_jobs", payload: { n } }))
          })
          const mine = yield* q.claim("two_jobs", 50, { ...worker, workerId: "p1" })
          const theirs = yield* q2.claim("two_jobs", 50, { ...worker, workerId: "p2" })
          expect(mine.length + theirs.length).toBe(100)
          // each settles its half in five settles of ten, all at once
          const settles = [...chunks(mine).map((c) => completeAll(q, c)), ...chunks(theirs).map((c) => completeAll(q2, c))]
          yield* Effect.all(settles, { concurrency: "unbounded" })
          const callbacks = yield* q.claim("two_done", 10, worker)
          expect(callbacks.map((j) => j.payload)).toEqual([{ round, batch: { id: batch.id, total: 100, completed: 100, failed: 0 } }])
          yield* completeAll(q, callbacks)
        }
      }))
  })
})

const chunks = <A>(xs: ReadonlyArray<A>): Array<ReadonlyArray<A>> =>
  Array.from({ length: Math.ceil(xs.length / 10) }, (_, i) => xs.slice(i * 10, i * 10 + 10))
