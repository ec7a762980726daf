import { describe, expect, layer } from "@effect/vitest"
import { Deferred, Duration, Effect, Fiber, Layer } from "effect"
import * as PgQueue from "../../src/queue/PgQueue.js"
import * as Queue from "../../src/queue/Queue.js"
import { freshSchemaName, layerDb, rawSql } from "../support/pg.js"
import { waitFor } from "../support/waitFor.js"
import { flowsContract } from "./flowsContract.js"

flowsContract({
  name: "PgQueue",
  layer: PgQueue.layer().pipe(Layer.provide(layerDb({ poolMax: 12 }))),
  fresh: () => PgQueue.layer().pipe(Layer.provide(layerDb({ poolMax: 2 }))),
  advance: (d) => Effect.sleep(d),
  live: true
})

const worker = { workerId: "w", leaseFor: Duration.seconds(30) }

describe("Flows on PostgreSQL: an enqueue racing its parent's settle", () => {
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
          const settle = yield* Effect.fork(q.completeMany([parent!]))
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
          yield* q.completeMany([ready!])
        }
      }))

    it.scoped("enqueues and settles of the same parents at once never leave a dependent waiting for a finished parent", () =>
      Effect.gen(function*() {
        const q = yield* Queue.Queue
        for (let round = 0; round < 30; round++) {
          yield* q.enqueue([{ stage: "mix_parent" }, { stage: "mix_parent" }])
          const parents = yield* q.claim("mix_parent", 2, worker)
          const [, , [dependent]] = yield* Effect.all([
            q.completeMany([parents[0]!]),
            q.completeMany([parents[1]!]),
            q.enqueue([{ stage: "mix_child", dependsOn: parents.map((p) => p.id) }])
          ], { concurrency: "unbounded" })
          const [ready] = yield* q.claim("mix_child", 10, worker)
          expect(ready?.id).toBe(dependent!.id)
          yield* q.completeMany([ready!])
        }
      }))
  })
})
