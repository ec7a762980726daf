/**
 * The runtime on in-memory layers with TestClock: each error tag's documented delay or fate, and shutdown
 * draining within its grace period and releasing the rest.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Exit, Fiber, Layer, Schema, Scope, TestClock } from "effect"
import { NotReady, Permanent, RateLimited, Transient } from "../../packages/pgfiber/src/JobError.js"
import * as MemoryQueue from "../../packages/pgfiber/src/queue/MemoryQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import * as RetryPolicy from "../../packages/pgfiber/src/runtime/RetryPolicy.js"
import * as Stage from "../../packages/pgfiber/src/runtime/Stage.js"
import * as Worker from "../../packages/pgfiber/src/runtime/Worker.js"
import { settle, workerOptions } from "../support/memoryRuntime.js"

const options = workerOptions("test-worker")

const Payload = Schema.Struct({ mode: Schema.String })

const startWorker = (stages: ReadonlyArray<Stage.Any>, opts: Worker.WorkerOptions = options) =>
  Effect.gen(function*() {
    const scope = yield* Scope.make()
    const queueLayer = MemoryQueue.layer()
    const context = yield* Layer.buildWithScope(
      Worker.layer(stages, opts).pipe(Layer.provideMerge(queueLayer)),
      scope
    )
    const queue = Effect.runSync(Effect.provide(Queue.Queue, context))
    return { scope, queue }
  })

describe("runtime on the in-memory queue", () => {
  it.effect("each error tag gets its documented delay or fate", () =>
    Effect.gen(function*() {
      const runs: Array<string> = []
      const stage = Stage.make({
        name: "fates",
        payload: Payload,
        concurrency: 8,
        policy: RetryPolicy.make({
          Transient: RetryPolicy.exponential({ base: "1 second", cap: "60 seconds", jitter: false }),
          NotReady: { interval: "5 seconds", budget: 2 }
        }),
        handler: ({ mode }, job) =>
          Effect.gen(function*() {
            runs.push(`${mode}#${job.attempt}`)
            switch (mode) {
              case "transient":
                return yield* new Transient({ message: "503 from upstream" })
              case "rate":
                return yield* new RateLimited({ message: "429", retryAfter: Duration.seconds(7) })
              case "poll":
                return yield* new NotReady({ message: "operation running" })
              case "permanent":
                return yield* new Permanent({ message: "no audio stream" })
              case "defect":
                return yield* Effect.die(new Error("bug: undefined is not a function"))
              case "slow":
                return yield* Effect.never
            }
          })
      })
      const { queue, scope } = yield* startWorker([stage])
      const ids: Record<string, string> = {}
      for (const mode of ["transient", "rate", "poll", "permanent", "defect"]) {
        ids[mode] = (yield* queue.enqueue([{ stage: "fates", payload: { mode } }]))[0]!.id
      }
      ids.bad = (yield* queue.enqueue([{ stage: "fates", payload: { wrong: 1 } }]))[0]!.id
      yield* settle
      const now = 0
      const transient = (yield* queue.get(ids.transient!))!
      expect([transient.status, transient.attempts, transient.availableAt.getTime() - now]).toEqual(["queued", 1, 1000])
      expect(transient.errors[0]).toMatchObject({ tag: "Transient", message: "503 from upstream", attempt: 1 })
      const rate = (yield* queue.get(ids.rate!))!
      expect([rate.status, rate.attempts, rate.availableAt.getTime() - now]).toEqual(["queued", 1, 7000])
      const poll = (yield* queue.get(ids.poll!))!
      expect([poll.status, poll.attempts, poll.polls, poll.availableAt.getTime() - now]).toEqual(["queued", 0, 1, 5000])
      expect((yield* queue.get(ids.permanent!))?.status).toBe("dead")
      const defect = (yield* queue.get(ids.defect!))!
      expect([defect.status, defect.attempts]).toEqual(["queued", 1])
      expect(defect.errors[0]!.message).toContain("undefined is not a function")
      const dead = yield* queue.deadLetters.list({ stage: "fates" })
      expect(dead.map((d) => d.reason)).toEqual(expect.arrayContaining([
        "no audio stream",
        expect.stringContaining("payload does not match the fates schema")
      ]))
      expect(dead.length).toBe(2)
      // the timer wakes the pool at each job's due time: 1 s later the transient job runs its second attempt
      yield* TestClock.adjust("1 second")
      yield* settle
      expect(runs.filter((r) => r.startsWith("transient"))).toEqual(["transient#1", "transient#2"])
      expect((yield* queue.get(ids.transient!))!.availableAt.getTime()).toBe(1000 + 2000)
      // poll budget of 2: the third NotReady dead-letters
      yield* TestClock.adjust("5 seconds")
      yield* settle
      yield* TestClock.adjust("5 seconds")
      yield* settle
      expect(runs.filter((r) => r.startsWith("poll")).length).toBe(3)
      expect((yield* queue.get(ids.poll!))?.status).toBe("dead")
      const pollDead = (yield* queue.deadLetters.list({ stage: "fates" })).find((d) => d.jobId === ids.poll)
      expect(pollDead!.reason).toContain("poll budget of 2 exhausted")
      yield* Scope.close(scope, Exit.void)
    }))

  it.effect("max attempts exhausted: the last transient failure dead-letters with the whole history", () =>
    Effect.gen(function*() {
      const stage = Stage.make({
        name: "flaky",
        payload: Schema.Struct({}),
        maxAttempts: 3,
        handler: () => new Transient({ message: "still down" })
      })
      const { queue, scope } = yield* startWorker([stage])
      const [{ id }] = (yield* Stage.enqueue(stage, {}).pipe(Effect.provideService(Queue.Queue, queue), Effect.map((r) => [r])))
      // the backoff is 1 s then 2 s, jittered: steps of 10 s reach the third attempt; each simulated second
      // also runs the heartbeats and timers, so minutes of them cost real seconds on a loaded machine
      for (let i = 0; i < 5; i++) {
        yield* settle
        yield* TestClock.adjust("10 seconds")
      }
      yield* settle
      expect((yield* queue.get(id))?.status).toBe("dead")
      const [dead] = yield* queue.deadLetters.list({ stage: "flaky" })
      expect(dead!.errorHistory.map((e) => e.attempt)).toEqual([1, 2, 3])
      yield* Scope.close(scope, Exit.void)
    }))

  it.effect("a handler that dies on its first attempt succeeds on retry while the pool keeps serving others", () =>
    Effect.gen(function*() {
      const done: Array<string> = []
      const stage = Stage.make({
        name: "mixed",
        payload: Schema.Struct({ n: Schema.Number }),
        concurrency: 2,
        handler: ({ n }, job) =>
          Effect.suspend(() => {
            if (n === 0 && job.attempt === 1) throw new Error("first-run bug")
            done.push(`${n}`)
            return Effect.void
          })
      })
      const { queue, scope } = yield* startWorker([stage])
      yield* queue.enqueue(Array.from({ length: 6 }, (_, n) => ({ stage: "mixed", payload: { n } })))
      yield* settle
      expect(done.sort()).toEqual(["1", "2", "3", "4", "5"])
      yield* TestClock.adjust("2 seconds")
      yield* settle
      expect(done).toContain("0")
      expect(yield* queue.list({ stage: "mixed" })).toEqual([])
      yield* Scope.close(scope, Exit.void)
    }))

  it.effect("a handler past the stage's timeout is interrupted and retried as a transient failure", () =>
    Effect.gen(function*() {
      let interrupted = 0
      const stage = Stage.make({
        name: "slowpoke",
        payload: Schema.Struct({}),
        timeout: "2 seconds",
        policy: RetryPolicy.make({ Transient: RetryPolicy.exponential({ base: "1 minute", cap: "1 hour", jitter: false }) }),
        handler: () => Effect.never.pipe(Effect.onInterrupt(() => Effect.sync(() => interrupted++)))
      })
      const { queue, scope } = yield* startWorker([stage])
      const [{ id }] = (yield* queue.enqueue([{ stage: "slowpoke" }])) as [Queue.EnqueueResult]
      yield* settle
      yield* TestClock.adjust("1 second")
      yield* settle
      expect((yield* queue.get(id))!.status).toBe("running")
      yield* TestClock.adjust("2 seconds")
      yield* settle
      const job = (yield* queue.get(id))!
      expect(interrupted).toBe(1)
      expect([job.status, job.attempts]).toEqual(["queued", 1])
      expect(job.errors[0]!.message).toBe("handler timed out after 2s")
      yield* Scope.close(scope, Exit.void)
    }))

  it.effect("never runs more handlers at once than the stage's concurrency, even while claiming ahead", () =>
    Effect.gen(function*() {
      let running = 0
      let peak = 0
      let done = 0
      const stage = Stage.make({
        name: "bounded",
        payload: Schema.Struct({ n: Schema.Number }),
        concurrency: 3,
        handler: () =>
          Effect.gen(function*() {
            running++
            peak = Math.max(peak, running)
            yield* Effect.sleep("10 millis")
            running--
            done++
          })
      })
      const { queue, scope } = yield* startWorker([stage])
      yield* queue.enqueue(Array.from({ length: 40 }, (_, n) => ({ stage: "bounded", payload: { n } })))
      for (let i = 0; i < 30 && done < 40; i++) {
        yield* settle
        yield* TestClock.adjust("10 millis")
      }
      yield* settle
      expect(done).toBe(40)
      expect(peak).toBe(3)
      expect(yield* queue.list({ stage: "bounded" })).toEqual([])
      yield* Scope.close(scope, Exit.void)
    }))

  it.effect("shutdown drains in-flight jobs within the grace period and releases the rest", () =>
    Effect.gen(function*() {
      const finished: Array<string> = []
      const stage = Stage.make({
        name: "drain",
        payload: Schema.Struct({ seconds: Schema.Number }),
        concurrency: 4,
        timeout: "1 hour",
        handler: ({ seconds }) => Effect.sleep(Duration.seconds(seconds)).pipe(Effect.tap(() => finished.push(`${seconds}s`)))
      })
      const { queue, scope } = yield* startWorker([stage])
      const [short, long] = yield* queue.enqueue([
        { stage: "drain", payload: { seconds: 3 } },
        { stage: "drain", payload: { seconds: 600 } }
      ])
      yield* settle
      expect((yield* queue.list({ stage: "drain", status: "running" })).length).toBe(2)
      const closing = yield* Effect.fork(Scope.close(scope, Exit.void))
      yield* settle
      // no new claims once shutdown began
      yield* queue.enqueue([{ stage: "drain", payload: { seconds: 1 } }])
      yield* TestClock.adjust("3 seconds")
      yield* settle
      expect(finished).toEqual(["3s"])
      expect((yield* queue.get(short!.id))?.status).toBe("completed")
      expect(closing.unsafePoll()).toBeNull()
      yield* TestClock.adjust("7 seconds")
      yield* Fiber.join(closing)
      const released = (yield* queue.get(long!.id))!
      expect([released.status, released.attempts, released.lockedBy]).toEqual(["queued", 0, null])
      expect((yield* queue.list({ stage: "drain", status: "running" })).length).toBe(0)
      expect((yield* queue.list({ stage: "drain" })).length).toBe(2)
    }))

  it.effect("the heartbeat keeps a long job's lease; cancelling it interrupts the handler and removes the job", () =>
    Effect.gen(function*() {
      let interrupted = false
      const stage = Stage.make({
        name: "long",
        payload: Schema.Struct({}),
        leaseFor: "3 seconds",
        timeout: "1 hour",
        handler: () => Effect.never.pipe(Effect.onInterrupt(() => Effect.sync(() => (interrupted = true))))
      })
      const { queue, scope } = yield* startWorker([stage])
      const [{ id }] = (yield* queue.enqueue([{ stage: "long" }])) as [Queue.EnqueueResult]
      yield* settle
      for (let i = 0; i < 10; i++) {
        yield* TestClock.adjust("1 second")
        yield* settle
      }
      expect((yield* queue.reapExpired).requeued).toBe(0)
      expect((yield* queue.get(id))!.status).toBe("running")
      expect(yield* queue.cancel(id)).toBe("cancelling")
      yield* TestClock.adjust("1 second")
      yield* settle
      expect(interrupted).toBe(true)
      const cancelled = (yield* queue.get(id))!
      expect([cancelled.status, cancelled.finishedAt !== null]).toEqual(["cancelled", true])
      yield* Scope.close(scope, Exit.void)
    }))
})
