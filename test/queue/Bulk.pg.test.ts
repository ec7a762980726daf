import { describe, expect, layer } from "@effect/vitest"
import { Effect, Fiber, Layer, TestClock } from "effect"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import * as SqlClock from "../../packages/pgfiber/src/queue/SqlClock.js"
import { layerDb } from "../support/pg.js"
import { waitFor } from "../support/waitFor.js"
import { bulkContract } from "./BulkContract.js"

// on the TestClock: the statements take its time (SqlClock.layerTest), so nothing sleeps
bulkContract({
  name: "PgQueue",
  layer: PgQueue.layer().pipe(Layer.provide(layerDb({ poolMax: 4 })), Layer.provide(SqlClock.layerTest)),
  fresh: () => PgQueue.layer().pipe(Layer.provide(layerDb({ poolMax: 2 })), Layer.provide(SqlClock.layerTest)),
  advance: (d) => TestClock.adjust(d),
  live: false
})

describe("PgQueue bulk actions, batch by batch", () => {
  layer(PgQueue.layer().pipe(Layer.provide(layerDb({ poolMax: 4 }))), { timeout: 120_000, excludeTestServices: true })((it) => {
    it.effect("an action cut short stays recorded as interrupted, with the jobs it did change", () =>
      Effect.gen(function*() {
        const q = yield* Queue.Queue
        const stage = "bulk_interrupted"
        yield* q.enqueue(Array.from({ length: 20 }, (_, n) => ({ stage, payload: { n }, delay: "1 hour" })))
        // one job per batch, resting long after each: it is still running when interrupted
        const fiber = yield* Effect.fork(q.bulk.apply({ stage }, { kind: "run-now" }, { actor: "test", batch: 1, pace: 100 }))
        const due = q.bulk.preview({ stage }, { kind: "run-now" }).pipe(Effect.map((left) => 20 - left))
        yield* waitFor("the first batch", Effect.map(due, (n) => n >= 1))
        const [running] = yield* q.bulk.actions({ limit: 1 })
        expect(running).toMatchObject({ action: "run-now", matched: 20, finishedAt: null, interrupted: false })
        yield* Fiber.interrupt(fiber)
        const changed = yield* due
        expect(changed).toBeGreaterThanOrEqual(1)
        expect(changed).toBeLessThan(20)
        const [record] = yield* q.bulk.actions({ limit: 1 })
        expect(record).toMatchObject({ id: running!.id, matched: 20, affected: changed, interrupted: true })
        expect(record!.finishedAt).toBeInstanceOf(Date)
      }))
  })
})
