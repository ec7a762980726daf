/**
 * A worker built from the library runs the queue's upkeep as docs/library.md shows, from the public entry alone:
 * the `Housekeeping` stage beside the user's own, its schedules fired by `Scheduler.layer` on `PgSchedules`.
 * Its schedules are declared in the database (so `pgfiber schedules list` shows them) and its tasks run to
 * completion in the user's process: the dead-letter retention's job (enqueued here with the schedule's payload,
 * not waited for until 03:17; the Scheduler's firing is Schedules.test.ts') removes a dead letter handled 40 days
 * ago.
 */
import { describe, expect, it } from "@effect/vitest"
import { Context, Duration, Effect, Layer, Schema } from "effect"
import { Db, Housekeeping, PgQueue, PgSchedules, Queue, Scheduler, Schedules, Stage, Worker } from "../../packages/pgfiber/src/index.js"
import { layerDb } from "../support/pg.js"
import { waitFor } from "../support/waitFor.js"

const own = Stage.make({
  name: "users_own",
  payload: Schema.Struct({ n: Schema.Number }),
  concurrency: 2,
  handler: () => Effect.void
})

describe("housekeeping in a worker built from the library", () => {
  it.scopedLive("the public Housekeeping stage and schedules run beside the user's stage", () =>
    Effect.gen(function*() {
      const options: Worker.WorkerOptions = { ...Worker.defaults(), workerId: "library-hk", sweepInterval: Duration.hours(1) }
      // the composition of docs/library.md ("The queue's upkeep in your own worker"), on a test database
      const context = yield* Layer.build(
        Scheduler.layer(Housekeeping.schedules).pipe(
          Layer.provide(PgSchedules.layer),
          Layer.provideMerge(Worker.layer([own, Housekeeping.housekeeping], options)),
          Layer.provideMerge(PgQueue.layer()),
          Layer.provideMerge(layerDb())
        )
      )
      const queue = Context.get(context, Queue.Queue)
      const db = Context.get(context, Db.Db)

      // every upkeep schedule is declared, under its own name, for the housekeeping stage
      const declared = yield* waitFor("the housekeeping schedules declared", Effect.map(
        Effect.flatMap(Schedules.Schedules, (s) => s.list()).pipe(Effect.provide(PgSchedules.layer.pipe(Layer.provide(Layer.succeedContext(context))))),
        (list) => list.filter((s) => s.stage === Housekeeping.stageName).length === Housekeeping.schedules.length ? list : undefined
      ))
      expect(declared.filter((s) => s.stage === Housekeeping.stageName).map((s) => s.name).sort())
        .toEqual(Housekeeping.schedules.map((s) => s.name).sort())

      // a dead letter handled (retried) 40 days ago, and one nobody looked at: the retention task removes the first only
      yield* db.run((sql) => sql`
        insert into dead_letters (job_id, stage, payload, priority, attempts, max_attempts, reason, job_created_at, dead_at,
                                  resolution_status, resolved_at)
        values (900000001, 'users_own', '{"n":1}', 0, 3, 3, 'old', now() - interval '41 days', now() - interval '41 days',
                'retried', now() - interval '40 days'),
               (900000002, 'users_own', '{"n":2}', 0, 3, 3, 'open', now() - interval '41 days', now() - interval '41 days',
                null, null)`)
      // the user's job and the task's job both run in this process
      const [mine] = yield* queue.enqueue([{ stage: own.name, payload: { n: 1 } }])
      // the daily schedule's job, enqueued now rather than at 03:17
      const retention = Housekeeping.schedules.find((s) => s.name === "pgfiber.dead-letter-retention")!
      const [task] = yield* queue.enqueue([{ stage: Housekeeping.stageName, payload: retention.payload }])
      yield* waitFor("both jobs finished", Effect.map(
        Effect.all([queue.get(mine!.id), queue.get(task!.id)]),
        ([a, b]) => a?.status === "completed" && b?.status === "completed"
      ))
      const left = yield* db.run((sql) => sql<Array<{ job_id: string }>>`select job_id::text from dead_letters order by job_id`)
      expect(left.map((r) => r.job_id)).toEqual(["900000002"])
    }), { timeout: 300_000 })
})
