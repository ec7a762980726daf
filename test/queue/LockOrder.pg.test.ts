/**
 * Heartbeats and settles take their row locks in one order (by id), so a pool's heartbeat and its own settle —
 * or two heartbeats — touching the same leases at the same moment never deadlock. Each round sends the leases to
 * the heartbeats in descending and in shuffled order while a settle completes them in another shuffled order,
 * all at once on separate connections; a lock order that followed the input would deadlock (40P01).
 */
import { describe, expect, layer } from "@effect/vitest"
import { Duration, Effect, Exit, Layer } from "effect"
import * as Outcome from "../../src/queue/Outcome.js"
import * as PgQueue from "../../src/queue/PgQueue.js"
import * as Queue from "../../src/queue/Queue.js"
import { layerDb } from "../support/pg.js"

const worker = { workerId: "w-locks", leaseFor: Duration.seconds(30) }

const shuffled = <A>(xs: ReadonlyArray<A>, seed: number): Array<A> => {
  const out = [...xs]
  let s = seed
  for (let i = out.length - 1; i > 0; i--) {
    s = (s * 1_103_515_245 + 12_345) % 2_147_483_648
    const j = s % (i + 1)
    ;[out[i], out[j]] = [out[j]!, out[i]!]
  }
  return out
}

describe("lock order", () => {
  layer(PgQueue.layer().pipe(Layer.provideMerge(layerDb({ poolMax: 8 }))), { excludeTestServices: true })((it) => {
    it.effect("a heartbeat and a settle of the same leases, sent at once in different orders, never deadlock", () =>
      Effect.gen(function*() {
        const q = yield* Queue.Queue
        const failures: Array<string> = []
        let settled = 0
        for (let round = 0; round < 15; round++) {
          yield* q.enqueue(Array.from({ length: 200 }, (_, n) => ({ stage: "locks", payload: { round, n } })))
          const jobs = yield* q.claim("locks", 200, worker)
          const leases = jobs.map((j) => ({ id: j.id, lease: j.lease }))
          const descending = [...leases].sort((a, b) => Number(b.id) - Number(a.id))
          const results = yield* Effect.all(
            [
              Effect.exit(q.heartbeat(descending, worker.leaseFor)),
              Effect.exit(q.settle(shuffled(leases, round + 1).map((l) => Outcome.complete(l)))),
              Effect.exit(q.heartbeat(shuffled(leases, round + 101), worker.leaseFor))
            ],
            { concurrency: "unbounded" }
          )
          for (const exit of results) {
            if (Exit.isFailure(exit)) failures.push(String(exit.cause))
          }
          const settle = results[1]!
          if (Exit.isSuccess(settle)) settled += (settle.value as ReadonlyArray<string>).filter((s) => s === "completed").length
        }
        expect(failures).toEqual([])
        // every job was completed by its settle, whatever the heartbeats did meanwhile
        expect(settled).toBe(15 * 200)
      }), 120_000)
  })
})
