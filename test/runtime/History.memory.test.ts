/**
 * A job's whole life through the runtime, on the in-memory queue with TestClock: a stage's output stored
 * with the finished job (and refused when too large), progress written by the heartbeat while the handler
 * runs, a job's own timeout overriding its stage's, and a pool that claims nothing while its stage is paused.
 */
import { describe, expect, it } from "@effect/vitest"
import { Chunk, Context, Deferred, Duration, Effect, Exit, Layer, Queue as Q, Schema, Scope, TestClock } from "effect"
import * as MemoryQueue from "../../packages/pgfiber/src/queue/MemoryQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import * as Events from "../../packages/pgfiber/src/runtime/Events.js"
import * as Stage from "../../packages/pgfiber/src/runtime/Stage.js"
import * as Worker from "../../packages/pgfiber/src/runtime/Worker.js"
import { settle, workerOptions } from "../support/memoryRuntime.js"

const options = workerOptions("history-worker")

const start = (stages: ReadonlyArray<Stage.Any>) =>
  Effect.gen(function*() {
    const scope = yield* Scope.make()
    const context = yield* Layer.buildWithScope(
      Worker.layer(stages, options).pipe(Layer.provideMerge(MemoryQueue.layer()), Layer.provideMerge(Events.layer())),
      scope
    )
    return { scope, queue: Context.get(context, Queue.Queue), events: Context.get(context, Events.JobEvents) }
  })

describe("a job's life through the runtime", () => {
  it.effect("output: encoded by the stage's Schema and kept with the finished job; too large dead-letters it", () =>
    Effect.gen(function*() {
      const stage = Stage.make({
        name: "summarise",
        payload: Schema.Struct({ words: Schema.Number }),
        output: Schema.Struct({ summary: Schema.String, at: Schema.Date }),
        handler: ({ words }) =>
          Effect.succeed({ summary: "x".repeat(words), at: new Date("2026-01-02T03:04:05.000Z") })
      })
      const { queue, scope } = yield* start([stage])
      const [small] = yield* queue.enqueue([{ stage: "summarise", payload: { words: 3 } }])
      const [huge] = yield* queue.enqueue([{ stage: "summarise", payload: { words: 300_000 } }])
      yield* settle
      const done = (yield* queue.get(small!.id))!
      expect([done.status, done.output]).toEqual(["completed", { summary: "xxx", at: "2026-01-02T03:04:05.000Z" }])
      expect(done.startedAt).not.toBeNull()
      expect(done.finishedAt).not.toBeNull()
      expect(done.lastRunMs).toBe(0)
      const dead = (yield* queue.get(huge!.id))!
      expect(dead.status).toBe("dead")
      expect(dead.errors.at(-1)).toMatchObject({ tag: "OutputTooLarge", worker: "history-worker" })
      expect(dead.lastError).toMatch(/output is \d+ bytes, over the limit of 262144/)
      yield* Scope.close(scope, Exit.void)
    }))

  it.effect("a Completion carries follow-ups and the output together", () =>
    Effect.gen(function*() {
      const stage = Stage.make({
        name: "split",
        payload: Schema.Struct({}),
        output: Schema.Struct({ parts: Schema.Number }),
        handler: () => Effect.succeed(Stage.complete([{ stage: "split_next" }], { parts: 2 }))
      })
      const { queue, scope } = yield* start([stage])
      const [job] = yield* queue.enqueue([{ stage: "split" }])
      yield* settle
      expect((yield* queue.get(job!.id))!.output).toEqual({ parts: 2 })
      expect((yield* queue.list({ stage: "split_next" })).length).toBe(1)
      yield* Scope.close(scope, Exit.void)
    }))

  it.effect("progress is written by the heartbeat while the handler runs, and kept when it finishes", () =>
    Effect.gen(function*() {
      const gate = yield* Deferred.make<void>()
      const stage = Stage.make({
        name: "long_progress",
        payload: Schema.Struct({}),
        leaseFor: "3 seconds",
        handler: (_p, job) =>
          Effect.gen(function*() {
            yield* job.progress(10, "starting")
            yield* job.progress(55, "halfway there")
            yield* Deferred.await(gate)
          })
      })
      const { events, queue, scope } = yield* start([stage])
      const inbox = yield* events.subscribeScoped().pipe(Scope.extend(scope))
      const [job] = yield* queue.enqueue([{ stage: "long_progress" }])
      yield* settle
      // not yet: progress rides on a heartbeat (every quarter of the lease), at most once a second per job
      expect((yield* queue.get(job!.id))!.progress).toBeNull()
      yield* TestClock.adjust("2 seconds")
      yield* settle
      const running = (yield* queue.get(job!.id))!
      expect([running.status, running.progress, running.progressMessage]).toEqual(["running", 55, "halfway there"])
      // in-process subscribers hear every report at once, not only what the heartbeat wrote
      const heard = Chunk.toReadonlyArray(yield* Q.takeAll(inbox)).flatMap((e) => (e._tag === "Progress" ? [[e.progress, e.message]] : []))
      expect(heard).toEqual([[10, "starting"], [55, "halfway there"]])
      yield* Deferred.succeed(gate, undefined)
      yield* settle
      const done = (yield* queue.get(job!.id))!
      expect([done.status, done.progress]).toEqual(["completed", 55])
      yield* Scope.close(scope, Exit.void)
    }))

  it.effect("a job's own timeout overrides its stage's", () =>
    Effect.gen(function*() {
      const stage = Stage.make({
        name: "own_timeout",
        payload: Schema.Struct({}),
        timeout: "10 minutes",
        maxAttempts: 1,
        handler: (_p, job) => Effect.zipRight(Effect.sync(() => expect(Duration.toMillis(job.timeout)).toBe(2000)), Effect.never)
      })
      const { queue, scope } = yield* start([stage])
      const [job] = yield* queue.enqueue([{ stage: "own_timeout", timeout: "2 seconds", maxAttempts: 1 }])
      yield* settle
      yield* TestClock.adjust("3 seconds")
      yield* settle
      const dead = (yield* queue.get(job!.id))!
      expect(dead.status).toBe("dead")
      expect(dead.lastError).toContain("timed out after 2s")
      yield* Scope.close(scope, Exit.void)
    }))

  it.effect("a paused stage's pool claims nothing; resuming wakes it", () =>
    Effect.gen(function*() {
      const ran: Array<string> = []
      const stage = Stage.make({
        name: "pausable",
        payload: Schema.Struct({}),
        handler: (_p, job) => Effect.sync(() => void ran.push(job.id))
      })
      const { queue, scope } = yield* start([stage])
      yield* queue.stageControls.setPaused("pausable", true, "ops")
      yield* settle
      const [job] = yield* queue.enqueue([{ stage: "pausable" }])
      yield* settle
      yield* TestClock.adjust("5 seconds")
      yield* settle
      expect(ran).toEqual([])
      expect((yield* queue.get(job!.id))!.status).toBe("queued")
      yield* queue.stageControls.setPaused("pausable", false, "ops")
      yield* settle
      expect(ran).toEqual([job!.id])
      yield* Scope.close(scope, Exit.void)
    }))
})
