/**
 * A pool's heartbeat and its own settle — or two heartbeats — touching the same leases at the same moment never
 * deadlock: a heartbeat never waits for a row lock (SKIP LOCKED), and a settle of mixed outcomes locks in id
 * order. Each round sends the leases to the heartbeats in descending and in shuffled order while a settle
 * completes them (even rounds: completions only, the settle's own statement) or settles a mix of completions,
 * retries and releases (odd rounds) in another shuffled order, all at once on separate connections. A heartbeat
 * that waited for the settle's locks, taken in the settle's order, would deadlock (40P01).
 */
import { describe, expect, layer } from "@effect/vitest"
import { Duration, Effect, Exit, Layer } from "effect"
import * as Outcome from "../../packages/pgfiber/src/queue/Outcome.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
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
        const outcome = (round: number, l: { id: string; lease: number }, i: number) =>
          round % 2 === 0 || i % 3 === 0
            ? Outcome.complete(l)
            : i % 3 === 1
            ? Outcome.retry(l, Duration.zero, { tag: "Transient", message: "again" })
            : Outcome.release(l)
        for (let round = 0; round < 15; round++) {
          yield* q.enqueue(Array.from({ length: 200 }, (_, n) => ({ stage: "locks", payload: { round, n } })))
          const jobs = yield* q.claim("locks", 200, worker)
          const leases = jobs.map((j) => ({ id: j.id, lease: j.lease }))
          const descending = [...leases].sort((a, b) => Number(b.id) - Number(a.id))
          const results = yield* Effect.all(
            [
              Effect.exit(q.heartbeat(descending, worker.leaseFor)),
              Effect.exit(q.settle(shuffled(leases, round + 1).map((l, i) => outcome(round, l, i)))),
              Effect.exit(q.heartbeat(shuffled(leases, round + 101), worker.leaseFor))
            ],
            { concurrency: "unbounded" }
          )
          for (const exit of results) {
            if (Exit.isFailure(exit)) failures.push(String(exit.cause))
          }
          const settle = results[1]!
          if (Exit.isSuccess(settle)) settled += (settle.value as ReadonlyArray<string>).filter((s) => s !== "fenced").length
        }
        expect(failures).toEqual([])
        // every outcome was written by its settle, whatever the heartbeats did meanwhile
        expect(settled).toBe(15 * 200)
      }), 120_000)
  })
})
