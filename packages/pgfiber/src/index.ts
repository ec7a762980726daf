/**
 * `pgfiber`: the public entry point of the package. Declare stages (`Stage.make`), run them (`Worker.layer`),
 * enqueue (`Stage.enqueue`, or `Queue.Queue` directly) on PostgreSQL (`PgQueue` over `Db`) or in memory
 * (`MemoryQueue`, for unit tests). The media pipelines and the HTTP API are subpaths (`pgfiber/calls`,
 * `pgfiber/documents`, `pgfiber/http`), so importing the queue does not load ffmpeg, S3 or the HTTP server;
 * test doubles are `pgfiber/testing`.
 */
import { Layer } from "effect"
import * as Db from "./layers/Db.js"
import * as Migrations from "./queue/Migrations.js"
import * as PgQueue from "./queue/PgQueue.js"
import * as Events from "./runtime/Events.js"
import type * as Queue from "./queue/Queue.js"

export { NotReady, Permanent, RateLimited, Transient } from "./JobError.js"
export type { JobError } from "./JobError.js"
export * as JobErrors from "./JobError.js"
export * as Stage from "./runtime/Stage.js"
export * as Worker from "./runtime/Worker.js"
export * as RetryPolicy from "./runtime/RetryPolicy.js"
export * as Waker from "./runtime/Waker.js"
export * as Events from "./runtime/Events.js"
export * as Queue from "./queue/Queue.js"
export * as PgQueue from "./queue/PgQueue.js"
export * as MemoryQueue from "./queue/MemoryQueue.js"
export * as Reads from "./queue/Reads.js"
export * as Migrations from "./queue/Migrations.js"
export * as Schedules from "./queue/Schedules.js"
export * as PgSchedules from "./queue/PgSchedules.js"
export * as MemorySchedules from "./queue/MemorySchedules.js"
export * as Scheduler from "./runtime/Scheduler.js"
/** The queue's own upkeep (history and event retention, the reaper's backstop, the payload index): run it beside your stages. */
export * as Housekeeping from "./stages/housekeeping/Housekeeping.js"
export * as Db from "./layers/Db.js"
export * as EmbeddedPg from "./layers/EmbeddedPg.js"
export * as Logging from "./layers/Logging.js"

/**
 * PostgreSQL from the environment (DATABASE_URL, or an embedded server under PGFIBER_DATA_DIR), with pending
 * migrations applied before anything uses it: the usual first layer of a program built on pgfiber.
 */
export const layerDbMigrated = Layer.effectDiscard(Migrations.migrate()).pipe(Layer.provideMerge(Db.layer))

/**
 * `PgQueue` over `layerDbMigrated`, with the process's job-events bus (`Events.JobEvents`) that the queue and
 * the worker publish to: a queue ready to enqueue to and to run workers on.
 */
export const layerPgQueue = (options: Queue.QueueOptions = {}) =>
  PgQueue.layer(options).pipe(Layer.provideMerge(Layer.merge(layerDbMigrated, Events.layer())))
