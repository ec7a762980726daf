/**
 * Cluster-wide events, across processes, on real Postgres: a spawned worker process runs the jobs; this test
 * process enqueues them and follows the event log (Events.follow), and must see every event of every job,
 * each job's in the order they happened: enqueued, then each run's started (progress) and its end (retried,
 * rescheduled, completed with the output's size, dead), and cancelled for a queued job cancelled. It also
 * resumes after an event id and gets the rest exactly once.
 */
import { describe, expect, it } from "@effect/vitest"
import { Chunk, Context, Effect, Fiber, Layer, Redacted, Stream } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as EventLog from "../../packages/pgfiber/src/queue/EventLog.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import * as EventFeed from "../../packages/pgfiber/src/runtime/EventFeed.js"
import * as Events from "../../packages/pgfiber/src/runtime/Events.js"
import { databaseUrl } from "../support/pg.js"
import { waitFor } from "../support/waitFor.js"
import { fixture, freshSchema, spawnWorkerProcess } from "../support/workerProcess.js"

/**
 * A job's event kinds in order, a run's progress events as one: reports between two heartbeats are written (and
 * logged) as the last of them, so a quick run logs one, a slow one several.
 */
const kindsOf = (events: ReadonlyArray<EventLog.LoggedEvent>, jobId: string) =>
  events.filter((e) => e.jobId === jobId).map((e) => e.kind).filter((k, i, all) => !(k === "progress" && all[i - 1] === "progress"))

describe("events of every process (the event log)", () => {
  it.scopedLive("a subscriber in this process sees every event of the jobs another process runs, in order per job", () =>
    Effect.gen(function*() {
      const { schema } = yield* freshSchema("events", "select 1")
      const dbLayer = Layer.scoped(Db.Db, Db.make({ url: Redacted.make(databaseUrl()), schema, poolMax: 4 }))
      const services = yield* Layer.build(
        EventFeed.layer.pipe(Layer.provideMerge(Layer.mergeAll(PgQueue.layer(), EventLog.layer)), Layer.provideMerge(dbLayer))
      )
      const q = Context.get(services, Queue.Queue)
      const seen: Array<EventLog.LoggedEvent> = []
      // subscribed before anything happens: "from now"
      const follower = yield* Events.follow({ stages: ["evented"] }).pipe(
        Stream.runForEach((e) => Effect.sync(() => seen.push(e))),
        Effect.provide(services),
        Effect.forkScoped
      )
      yield* waitFor("the follower to subscribe", Effect.sync(() => Context.get(services, EventFeed.EventFeed).followers() === 1))

      const worker = yield* spawnWorkerProcess(fixture("eventsWorker.ts"), { PGFIBER_SCHEMA: schema, WORKER_ID: "events-a" })
      const dump = () => Effect.sync(() => console.log(worker.output()))
      const plain = yield* q.enqueue(Array.from({ length: 20 }, () => ({ stage: "evented", payload: { outputChars: 1234 } })))
      const [flaky, polled, doomed] = yield* q.enqueue([
        { stage: "evented", payload: { failFirst: 2 } },
        { stage: "evented", payload: { polls: 2 } },
        { stage: "evented", payload: { permanent: true } }
      ])
      const [later] = yield* q.enqueue([{ stage: "evented", payload: {}, delay: "1 hour" }])
      yield* q.cancel(later!.id)

      const finished = (id: string) => (k: string) =>
        seen.some((e) => e.jobId === id && (k === e.kind))
      yield* waitFor("every job's last event", Effect.sync(() =>
        plain.every((r) => finished(r.id)("completed")) && finished(flaky!.id)("completed") &&
        finished(polled!.id)("completed") && finished(doomed!.id)("dead") && finished(later!.id)("cancelled")
      )).pipe(Effect.tapDefect(dump))

      for (const r of plain) {
        expect(kindsOf(seen, r.id)).toEqual(["enqueued", "started", "progress", "completed"])
        const completed = seen.find((e) => e.jobId === r.id && e.kind === "completed")!
        expect(completed.data).toMatchObject({ outputBytes: JSON.stringify({ text: "x".repeat(1234) }).length })
        expect(completed.attempt).toBe(1)
        // the last report is the one the finished job keeps
        expect(seen.filter((e) => e.jobId === r.id && e.kind === "progress").at(-1)!.data).toMatchObject({ progress: 100, message: "done" })
      }
      expect(kindsOf(seen, flaky!.id)).toEqual([
        "enqueued", "started", "progress", "retried", "started", "progress", "retried", "started", "progress", "completed"
      ])
      expect(seen.filter((e) => e.jobId === flaky!.id && e.kind === "retried").map((e) => [e.attempt, e.data?.tag])).toEqual([
        [1, "Transient"], [2, "Transient"]
      ])
      expect(kindsOf(seen, polled!.id)).toEqual([
        "enqueued", "started", "progress", "rescheduled", "started", "progress", "rescheduled", "started", "progress", "completed"
      ])
      expect(kindsOf(seen, doomed!.id)).toEqual(["enqueued", "started", "progress", "dead"])
      expect(seen.find((e) => e.jobId === doomed!.id && e.kind === "dead")!.data).toMatchObject({ tag: "Permanent", message: "refused for good" })
      expect(kindsOf(seen, later!.id)).toEqual(["enqueued", "cancelled"])
      // each event once
      expect(new Set(seen.map((e) => e.id)).size).toBe(seen.length)

      // resume after any event: the rest, exactly once, in the same order
      const cut = seen[Math.floor(seen.length / 2)]!
      const rest = yield* Events.follow({ stages: ["evented"] }, { from: { after: cut.id } }).pipe(
        Stream.take(seen.length - Math.floor(seen.length / 2) - 1),
        Stream.runCollect,
        Effect.provide(services)
      )
      expect(Chunk.toReadonlyArray(rest).map((e) => e.id)).toEqual(seen.slice(Math.floor(seen.length / 2) + 1).map((e) => e.id))
      // from the beginning: the same events as followed live, in the same order
      const all = yield* Events.follow({ stages: ["evented"] }, { from: "beginning" }).pipe(
        Stream.take(seen.length), Stream.runCollect, Effect.provide(services))
      expect(Chunk.toReadonlyArray(all).map((e) => e.id)).toEqual(seen.map((e) => e.id))

      yield* Fiber.interrupt(follower)
      worker.child.kill("SIGTERM")
      expect(yield* Effect.promise(() => worker.exited)).toBe(0)
    }), { timeout: 180_000 })
})
