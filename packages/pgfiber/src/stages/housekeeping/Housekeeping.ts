/**
 * Stage `pgfiber.housekeeping`: the queue's own upkeep as scheduled jobs, so operators see it with
 * `pgfiber schedules list` and can change or disable it like any schedule.
 * - `pgfiber.reap-expired` (every 5 minutes): requeue jobs whose worker died. Workers also reap the moment a
 *   lease expires (the Waker's timer); this is the backstop, and what keeps `pgfiber tick` deployments tidy.
 * - `pgfiber.dead-letter-retention` (daily at 03:17 UTC): delete dead letters that were handled (retried or
 *   resolved) more than 30 days ago; unresolved ones stay until someone looks at them.
 * - `pgfiber.history-retention` (every 10 minutes): drop the kept history's partitions (by finish time, a day
 *   each unless `partitionHours` says otherwise) that hold no row still kept, create the next ones ahead
 *   (`aheadHours`, 2 days), then delete the finished jobs whose retention has passed before their partition's
 *   (`PGFIBER_RETAIN_COMPLETED` or a stage's `retain`), 5,000 rows per statement so each transaction stays short
 *   and never holds up the workers' settles.
 * - `pgfiber.events-retention` (every 10 minutes): delete events older than `PGFIBER_EVENTS_RETAIN` (1 day) from
 *   the event log, 5,000 per statement.
 * - `pgfiber.payload-index` (every 10 minutes, at :07, :17, …): rebuild the live jobs' payload index, concurrently,
 *   once it has outgrown the table (PayloadIndex.ts: GIN keeps every payload value ever queued). With nothing to
 *   rebuild it is one job whose handler reads two catalogue rows; hourly, a queue doing 10M jobs an hour grew the
 *   index by ~350 MB between checks.
 * The first four do what deploy/pg_cron.sql does from inside the database, for deployments that prefer pg_cron.
 */
import { Duration, Effect, Schema } from "effect"
import * as ArchivePartitions from "../../queue/ArchivePartitions.js"
import * as EventLog from "../../queue/EventLog.js"
import * as PayloadIndex from "../../queue/PayloadIndex.js"
import * as Queue from "../../queue/Queue.js"
import type * as Schedules from "../../queue/Schedules.js"
import { Transient } from "../../JobError.js"
import * as Stage from "../../runtime/Stage.js"

export const stageName = "pgfiber.housekeeping"

export const Task = Schema.Union(
  Schema.Struct({ task: Schema.Literal("reap-expired") }),
  Schema.Struct({ task: Schema.Literal("purge-dead-letters"), olderThanDays: Schema.Int.pipe(Schema.between(0, 3650)) }),
  Schema.Struct({
    task: Schema.Literal("prune-history"),
    batch: Schema.optional(Schema.Int.pipe(Schema.between(1, 100_000))),
    partitionHours: Schema.optional(Schema.Int.pipe(Schema.between(1, 744))),
    aheadHours: Schema.optional(Schema.Int.pipe(Schema.between(1, 24 * 366)))
  }),
  Schema.Struct({ task: Schema.Literal("prune-events"), batch: Schema.optional(Schema.Int.pipe(Schema.between(1, 100_000))) }),
  Schema.Struct({ task: Schema.Literal("payload-index"), minMB: Schema.optional(Schema.Int.pipe(Schema.between(0, 1_000_000))) })
)

/** The database failed (the queue's statements, or the partitions' own): try again at the next attempt. */
const transient = (e: { readonly message: string }) => Effect.fail(new Transient({ message: e.message }))

export const housekeeping = Stage.make({
  name: stageName,
  payload: Task,
  concurrency: 1,
  maxAttempts: 3,
  handler: (task) =>
    Effect.gen(function*() {
      const queue = yield* Queue.Queue
      if (task.task === "reap-expired") {
        const r = yield* queue.reapExpired
        if (r.requeued + r.deadLettered > 0) yield* Effect.logInfo("housekeeping: expired leases", r)
        return
      }
      if (task.task === "prune-history") {
        const partitions = yield* ArchivePartitions.maintain({
          width: Duration.hours(task.partitionHours ?? 24),
          ahead: Duration.hours(task.aheadHours ?? 48)
        })
        if (partitions.dropped.length + partitions.created.length > 0) {
          yield* Effect.logInfo("housekeeping: history partitions", partitions)
        }
        const pruned = yield* queue.history.prune({ batch: task.batch ?? 5000 })
        if (pruned > 0) yield* Effect.logInfo("housekeeping: finished jobs past their retention pruned", { pruned })
        return
      }
      if (task.task === "prune-events") {
        const log = yield* EventLog.make
        const retention = yield* Effect.orDie(EventLog.retentionConfig)
        const pruned = yield* log.prune(retention, { batch: task.batch ?? 5000 }).pipe(
          Effect.mapError((e) => new Transient({ message: e.message }))
        )
        if (pruned > 0) yield* Effect.logInfo("housekeeping: events past their retention pruned", { pruned })
        return
      }
      if (task.task === "payload-index") {
        const r = yield* PayloadIndex.upkeep(task.minMB === undefined ? {} : { minBytes: task.minMB * 1024 * 1024 })
        if (r.rebuilt || r.droppedLeftovers.length > 0) yield* Effect.logInfo("housekeeping: the payload index rebuilt", r)
        return
      }
      const purged = yield* queue.deadLetters.purge({ olderThan: Duration.days(task.olderThanDays) })
      if (purged > 0) yield* Effect.logInfo("housekeeping: handled dead letters purged", { purged })
    }).pipe(Effect.catchTags({ QueueError: transient, DbError: transient }))
})

export const schedules: ReadonlyArray<Schedules.ScheduleSpec> = [
  { name: "pgfiber.reap-expired", stage: stageName, cron: "*/5 * * * *", payload: { task: "reap-expired" } },
  {
    name: "pgfiber.dead-letter-retention",
    stage: stageName,
    cron: "17 3 * * *",
    payload: { task: "purge-dead-letters", olderThanDays: 30 }
  },
  { name: "pgfiber.history-retention", stage: stageName, cron: "*/10 * * * *", payload: { task: "prune-history" } },
  { name: "pgfiber.events-retention", stage: stageName, cron: "5-59/10 * * * *", payload: { task: "prune-events" } },
  { name: "pgfiber.payload-index", stage: stageName, cron: "7-59/10 * * * *", payload: { task: "payload-index" } }
]
