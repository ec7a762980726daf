/**
 * The job-events bus: a worker on the in-memory queue publishes each job's life in order; a subscriber that
 * lags loses events (counted) and never slows the publisher; with nobody subscribed nothing is built.
 */
import { describe, expect, it } from "@effect/vitest"
import { Chunk, Context, Deferred, Effect, Exit, Fiber, Layer, Queue as Q, Schema, Scope, Stream, TestClock } from "effect"
import { Permanent, Transient } from "../../packages/pgfiber/src/JobError.js"
import * as MemoryQueue from "../../packages/pgfiber/src/queue/MemoryQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import * as Events from "../../packages/pgfiber/src/runtime/Events.js"
import * as RetryPolicy from "../../packages/pgfiber/src/runtime/RetryPolicy.js"
import * as Stage from "../../packages/pgfiber/src/runtime/Stage.js"
import * as Worker from "../../packages/pgfiber/src/runtime/Worker.js"
import { settle, workerOptions } from "../support/memoryRuntime.js"

const options = workerOptions("events-worker")

describe("JobEvents", () => {
  it.effect("a worker publishes enqueued, started, retried, completed, dead-lettered and cancelled", () =>
    Effect.gen(function*() {
      const stage = Stage.make({
        name: "evented",
        payload: Schema.Struct({ mode: Schema.String }),
        policy: RetryPolicy.make({ Transient: RetryPolicy.exponential({ base: "1 second", cap: "1 second", jitter: false }) }),
        handler: ({ mode }, job) =>
          mode === "flaky" && job.attempt === 1 ? new Transient({ message: "blip" })
            : mode === "bad" ? new Permanent({ message: "no" })
            : Effect.void
      })
      const scope = yield* Scope.make()
      const context = yield* Layer.buildWithScope(
        Worker.layer([stage], options).pipe(Layer.provideMerge(MemoryQueue.layer()), Layer.provideMerge(Events.layer())),
        scope
      )
      const queue = Context.get(context, Queue.Queue)
      const bus = Context.get(context, Events.JobEvents)
      const inbox = yield* bus.subscribeScoped().pipe(Scope.extend(scope))
      const [ok] = yield* queue.enqueue([{ stage: "evented", payload: { mode: "ok" }, orgId: "acme" }])
      const [flaky] = yield* queue.enqueue([{ stage: "evented", payload: { mode: "flaky" } }])
      const [bad] = yield* queue.enqueue([{ stage: "evented", payload: { mode: "bad" } }])
      const [later] = yield* queue.enqueue([{ stage: "evented", payload: { mode: "ok" }, delay: "1 hour" }])
      expect(yield* queue.cancel(later!.id)).toBe("cancelled")
      yield* settle
      yield* TestClock.adjust("1 second")
      yield* settle
      const seen = Chunk.toReadonlyArray(yield* Q.takeAll(inbox))
      const of = (id: string) => seen.filter((e) => e.jobId === id).map((e) => `${e._tag}#${e.attempt}`)
      expect(of(ok!.id)).toEqual(["Enqueued#0", "Started#1", "Completed#1"])
      expect(of(flaky!.id)).toEqual(["Enqueued#0", "Started#1", "Retried#1", "Started#2", "Completed#2"])
      expect(of(bad!.id)).toEqual(["Enqueued#0", "Started#1", "DeadLettered#1"])
      expect(of(later!.id)).toEqual(["Enqueued#0", "Cancelled#0"])
      const started = seen.find((e) => e._tag === "Started" && e.jobId === ok!.id)
      expect(started).toMatchObject({ stage: "evented", orgId: "acme", workerId: "events-worker" })
      const retried = seen.find((e) => e._tag === "Retried")
      expect(retried).toMatchObject({ error: { tag: "Transient", message: "blip" }, delayMs: 1000 })
      yield* Scope.close(scope, Exit.void)
    }))

  it.effect("a lagging subscriber drops events (counted); the publisher never waits", () =>
    Effect.gen(function*() {
      const bus = yield* Events.make()
      expect(bus.active()).toBe(false)
      bus.publish(Events.enqueued([{ stage: "s", orgId: null, subjectId: null }], [{ id: "1", deduped: false }]))
      expect(bus.droppedCount()).toBe(0)
      yield* Effect.scoped(Effect.gen(function*() {
        const inbox = yield* bus.subscribeScoped({ capacity: 2 })
        expect(bus.active()).toBe(true)
        const jobs = [1, 2, 3, 4, 5].map(() => ({ stage: "s", orgId: null, subjectId: null }))
        bus.publish(Events.enqueued(jobs, jobs.map((_, i) => ({ id: String(i), deduped: false }))))
        expect(bus.droppedCount()).toBe(3)
        const got = Chunk.toReadonlyArray(yield* Q.takeAll(inbox))
        expect(got.map((e) => e.jobId)).toEqual(["0", "1"])
      }))
      expect(bus.active()).toBe(false)
    }))

  it.effect("while an enqueue is in flight, a job's Started waits for its Enqueued (not for later enqueues); Enqueued never waits", () =>
    Effect.gen(function*() {
      const bus = yield* Events.make()
      const job = { stage: "s", orgId: null, subjectId: null }
      const started = (jobId: string): Events.JobEvent => ({
        _tag: "Started", jobId, stage: "s", orgId: null, attempt: 1, at: new Date(0), workerId: "w"
      })
      yield* Effect.scoped(Effect.gen(function*() {
        const inbox = yield* bus.subscribeScoped({ capacity: 5_000 })
        const tags = Effect.map(Q.takeAll(inbox), (c) => Chunk.toReadonlyArray(c).map((e) => `${e._tag}:${e.jobId}`))
        // the pool claims job 1 after its insert committed and before the enqueue published
        yield* bus.holding(Effect.gen(function*() {
          bus.publish([started("1")])
          expect(yield* tags).toEqual([])
          bus.publish(Events.enqueued([job], [{ id: "1", deduped: false }]))
          expect(yield* tags).toEqual(["Enqueued:1"])
        }))
        expect(yield* tags).toEqual(["Started:1"])
        // two enqueues in flight: what waits goes on when the last ends, in publish order
        const second = yield* Effect.fork(bus.holding(Effect.never))
        yield* Effect.yieldNow()
        yield* bus.holding(Effect.sync(() => bus.publish([started("2"), started("3")])))
        expect(yield* tags).toEqual([])
        yield* Fiber.interrupt(second)
        expect(yield* tags).toEqual(["Started:2", "Started:3"])
        // an enqueue that starts later does not hold back an event published before it started
        const first = yield* Deferred.make<void>()
        const earlier = yield* Effect.fork(bus.holding(Deferred.await(first)))
        yield* Effect.yieldNow()
        bus.publish([started("5")])
        const later = yield* Effect.fork(bus.holding(Effect.never))
        yield* Effect.yieldNow()
        expect(yield* tags).toEqual([])
        yield* Deferred.succeed(first, undefined)
        yield* Fiber.join(earlier)
        expect(yield* tags).toEqual(["Started:5"])
        bus.publish([started("6")])
        expect(yield* tags).toEqual([])
        yield* Fiber.interrupt(later)
        expect(yield* tags).toEqual(["Started:6"])
        // a failed enqueue lets go too
        yield* Effect.exit(bus.holding(Effect.zipRight(Effect.sync(() => bus.publish([started("4")])), Effect.fail("boom"))))
        expect(yield* tags).toEqual(["Started:4"])
        // past maxHeld the waiting events go on at once, still in order
        yield* bus.holding(Effect.gen(function*() {
          const many = Array.from({ length: Events.maxHeld + 1 }, (_, i) => started(String(100 + i)))
          bus.publish(many.slice(0, Events.maxHeld))
          bus.publish(many.slice(Events.maxHeld))
          const got = yield* tags
          expect(got.length).toBe(Events.maxHeld + 1)
          expect(got[0]).toBe("Started:100")
          expect(got[Events.maxHeld]).toBe(`Started:${100 + Events.maxHeld}`)
        }))
      }))
    }))

  it.effect("subscribe is a Stream of what is published while it runs", () =>
    Effect.gen(function*() {
      const bus = yield* Events.make()
      const fiber = yield* bus.subscribe().pipe(Stream.take(2), Stream.runCollect, Effect.fork)
      while (!bus.active()) yield* Effect.yieldNow()
      const jobs = [{ stage: "s", orgId: null, subjectId: null }, { stage: "s", orgId: null, subjectId: null }]
      bus.publish(Events.enqueued(jobs, [{ id: "7", deduped: false }, { id: "8", deduped: true }]))
      bus.publish(Events.enqueued(jobs, [{ id: "9", deduped: false }]))
      const got = Chunk.toReadonlyArray(yield* Fiber.join(fiber))
      expect(got.map((e) => e.jobId)).toEqual(["7", "9"])
    }))
})
