/**
 * The in-process bus keeps each job's events in order on real Postgres: a producer and a worker in one process
 * share the bus, and the worker's pool hears the insert's NOTIFY as soon as the enqueue commits, before the
 * enqueue has published `Enqueued`; its `Started` must still come after that `Enqueued` (an issue saw one
 * arrive before). Enqueues run one job at a time, many at once, some in flows (a dependency adds a statement
 * after the insert), so claims land inside the window.
 */
import { describe, expect, it } from "@effect/vitest"
import { Chunk, Context, Duration, Effect, Layer, Queue as Q, Redacted, Schema } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import * as Events from "../../packages/pgfiber/src/runtime/Events.js"
import * as Stage from "../../packages/pgfiber/src/runtime/Stage.js"
import * as Worker from "../../packages/pgfiber/src/runtime/Worker.js"
import { databaseUrl } from "../support/pg.js"
import { waitFor } from "../support/waitFor.js"
import { freshSchema } from "../support/workerProcess.js"

const jobs = 400

describe("the in-process bus, on Postgres", () => {
  it.live("every job's Enqueued comes before its Started, with the worker in the producer's process", () =>
    Effect.scoped(Effect.gen(function*() {
      const { schema } = yield* freshSchema("evorder", "select 1")
      const ran = new Set<string>()
      const stage = Stage.make({
        name: "ordered",
        payload: Schema.Struct({ n: Schema.Number }),
        concurrency: 20,
        handler: (_, job) => Effect.sync(() => void ran.add(job.id))
      })
      const dbLayer = Layer.scoped(Db.Db, Db.make({ url: Redacted.make(databaseUrl()), schema, poolMax: 6 }))
      const context = yield* Layer.build(
        Worker.layer([stage], {
          workerId: "w-ordered",
          shutdownGrace: Duration.seconds(5),
          sweepInterval: Duration.hours(1),
          pollInterval: Duration.seconds(1),
          concurrency: {}
        }).pipe(Layer.provideMerge(PgQueue.layer()), Layer.provideMerge(Events.layer()), Layer.provide(dbLayer))
      )
      const queue = Context.get(context, Queue.Queue)
      const bus = Context.get(context, Events.JobEvents)
      const inbox = yield* bus.subscribeScoped({ capacity: 100_000 })
      // a finished parent: a job that depends on it is queued at once, its edge written after its insert
      const [parent] = yield* queue.enqueue([{ stage: "ordered", payload: { n: -1 } }])
      yield* waitFor("the parent ran", Effect.sync(() => ran.has(parent!.id)))
      const ids = yield* Effect.forEach(
        Array.from({ length: jobs }, (_, n) => n),
        (n) =>
          Effect.map(
            queue.enqueue([{ stage: "ordered", payload: { n }, ...(n % 2 === 0 ? { dependsOn: [parent!.id] } : {}) }]),
            ([r]) => r!.id
          ),
        { concurrency: 16 }
      )
      yield* waitFor(`${jobs} jobs run`, Effect.sync(() => ids.every((id) => ran.has(id))), Duration.minutes(3))
      // three events for each job and for the parent (counting only the jobs' let the last few Completed still be
      // on their way, and those jobs looked out of order)
      yield* waitFor("every job's Completed published", Effect.map(Q.size(inbox), (n) => n >= 3 * (jobs + 1)))
      const seen = Chunk.toReadonlyArray(yield* Q.takeAll(inbox))
      const wrong = ids.filter((id) => {
        const tags = seen.filter((e) => e.jobId === id).map((e) => e._tag)
        return tags.join(",") !== "Enqueued,Started,Completed"
      })
      expect(wrong.slice(0, 5).map((id) => [id, seen.filter((e) => e.jobId === id).map((e) => e._tag)])).toEqual([])
      expect(bus.droppedCount()).toBe(0)
    })), { timeout: 240_000 })
})
