/**
 * Shutdown hands back every job it claimed and did not start, including a claim still in flight when the
 * signal arrived: the claim has taken its jobs (their leases are written) but its answer has not reached the
 * pool yet. Shutdown waits for that answer and releases the jobs, rather than cutting the claim off and leaving
 * them `running` until their leases expire.
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Duration, Effect, Exit, Fiber, Layer, Schema, Scope, TestClock } from "effect"
import * as MemoryQueue from "../../packages/pgfiber/src/queue/MemoryQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import * as Stage from "../../packages/pgfiber/src/runtime/Stage.js"
import * as Worker from "../../packages/pgfiber/src/runtime/Worker.js"

const options: Worker.WorkerOptions = {
  workerId: "shutdown-worker",
  shutdownGrace: Duration.seconds(10),
  sweepInterval: Duration.hours(1),
  pollInterval: Duration.seconds(1),
  concurrency: {}
}

describe("shutdown", () => {
  it.effect("a claim in flight when shutdown begins: its jobs are released, none runs, none is left running", () =>
    Effect.gen(function*() {
      let runs = 0
      const stage = Stage.make({
        name: "inflight",
        payload: Schema.Struct({ n: Schema.Number }),
        concurrency: 4,
        handler: () => Effect.sync(() => void runs++)
      })
      const base = yield* MemoryQueue.make()
      yield* base.enqueue(Array.from({ length: 6 }, (_, n) => ({ stage: "inflight", payload: { n } })))
      // the first claim that takes jobs is held on its way back: taken in the queue, not yet seen by the pool
      const claimTaken = yield* Deferred.make<void>()
      let held = false
      const holdFirst = (jobs: ReadonlyArray<unknown>) =>
        jobs.length === 0 || held ? Effect.void : Effect.zipRight(
          Effect.sync(() => (held = true)),
          Effect.zipRight(Deferred.succeed(claimTaken, undefined), Effect.sleep("1 second"))
        )
      // the pool claims through claimBatch (the stage's limits); claim is held the same way
      const slowAnswer: Queue.Queue["Type"] = {
        ...base,
        claim: (name, limit, claimOptions) => Effect.tap(base.claim(name, limit, claimOptions), holdFirst),
        claimBatch: (name, limit, claimOptions) =>
          Effect.tap(base.claimBatch(name, limit, claimOptions), (result) => holdFirst(result.jobs))
      }
      const scope = yield* Scope.make()
      yield* Layer.buildWithScope(Worker.layer([stage], options).pipe(Layer.provideMerge(Layer.succeed(Queue.Queue, slowAnswer))), scope)
      yield* Deferred.await(claimTaken)
      expect((yield* base.stats).find((s) => s.stage === "inflight")?.running).toBe(4)

      // the signal arrives while the claim's answer is on its way
      const closing = yield* Effect.fork(Scope.close(scope, Exit.void))
      yield* TestClock.adjust("1 second")
      yield* Fiber.join(closing)

      const stats = (yield* base.stats).find((s) => s.stage === "inflight")!
      expect(stats.running).toBe(0)
      expect(stats.ready).toBe(6)
      expect(runs).toBe(0)
    }))
})
