/**
 * Stage `documents_sweep`: the "re-enqueue pending" safety job, run by the `documents-sweep` schedule (every
 * DOCUMENTS_SWEEP_INTERVAL_MS, declared in code, visible and changeable with `pgfiber schedules`). Each run
 * - enqueues a `transcribe_document` job for every media document pending for longer than `stuckAfter` with
 *   no live job; the job's dedupe key makes this safe against the trigger, a running job or another sweep;
 * - errors media documents left in `processing` for longer than `stuckAfter` whose job is gone (cancelled, or
 *   dead-lettered where the stage's onDeadLetter could not reach the document): the same fate as any
 *   document whose job ran out of attempts. Re-enqueueing them instead could loop forever on media that
 *   kills its worker.
 * The schedule makes one job per tick however many workers run; a sweep still running at the next tick is
 * not doubled either (the tick's job waits its turn: concurrency 1 per worker, and sweeps are idempotent).
 */
import { Config, Context, Duration, Effect, Layer, Schema } from "effect"
import * as Db from "pgfiber/internal/layers/Db.js"
import * as Queue from "pgfiber/internal/queue/Queue.js"
import type * as Schedules from "pgfiber/internal/queue/Schedules.js"
import * as Millis from "pgfiber/internal/layers/Millis.js"
import * as Stage from "pgfiber/internal/runtime/Stage.js"
import * as Documents from "./Documents.js"
import * as TranscribeDocument from "./TranscribeDocument.js"

export const stageName = "documents_sweep"

/** The schedule's name, for `pgfiber schedules disable documents-sweep` and friends. */
export const scheduleName = "documents-sweep"

export interface SweepOptions {
  /** Time between sweeps (the schedule's interval; at least a second). */
  readonly interval: Duration.Duration
  /** A document unchanged for less than this is not orphaned yet. */
  readonly stuckAfter: Duration.Duration
  /** Documents handled per statement; a sweep goes on until a batch comes back short. */
  readonly batchSize: number
}

export const defaults: SweepOptions = {
  interval: Duration.hours(3),
  stuckAfter: Duration.minutes(10),
  batchSize: 500
}

export class Settings extends Context.Tag("pgfiber/DocumentsSweep/Settings")<Settings, SweepOptions>() {}

export const config: Config.Config<SweepOptions> = Config.all({
  interval: Millis.config("DOCUMENTS_SWEEP_INTERVAL_MS", { min: 1000, fallback: defaults.interval }),
  stuckAfter: Millis.config("DOCUMENTS_SWEEP_STUCK_AFTER_MS", { min: 0, fallback: defaults.stuckAfter }),
  batchSize: Config.succeed(defaults.batchSize)
})

/** Reads `config`. */
export const layer = Layer.effect(Settings, config)

/** Fixed settings (tests, embedding). */
export const layerWith = (options: Partial<SweepOptions> = {}) => Layer.succeed(Settings, { ...defaults, ...options })

export interface SweepResult {
  /** Pending documents that got a new job (a job that appeared meanwhile is not counted). */
  readonly enqueued: number
  /** Documents stuck in processing with their job gone, now in error. */
  readonly errored: number
}

/**
 * One sweep, without rescheduling: what the stage runs, and what an operator can run by hand. Owner-level
 * work, named as such (`Db.asOwner`): it reads every org's documents and enqueues each one's job in its org.
 */
export const sweepOnce = (options: Pick<SweepOptions, "stuckAfter" | "batchSize"> = defaults) =>
  Effect.gen(function*() {
    const db = yield* Db.Db
    const queue = yield* Queue.Queue
    const stuckMs = Duration.toMillis(options.stuckAfter)
    let enqueued = 0
    let errored = 0
    // each batch's documents get a live job, so the next query no longer finds them
    for (;;) {
      const orphans = yield* db.run((sql) => Documents.findOrphanedPending(sql, stuckMs, options.batchSize))
      if (orphans.length === 0) break
      const results = yield* queue.enqueue(orphans.map((d) => TranscribeDocument.jobFor({ id: d.id, orgId: d.org_id })))
      enqueued += results.filter((r) => !r.deduped).length
      if (orphans.length < options.batchSize) break
    }
    for (;;) {
      const failed = yield* db.run((sql) => Documents.failOrphanedProcessing(sql, stuckMs, options.batchSize))
      errored += failed.length
      if (failed.length < options.batchSize) break
    }
    return { enqueued, errored } satisfies SweepResult
  }).pipe(Db.asOwner, Effect.withSpan("DocumentsSweep.sweepOnce"))

/** The sweep's schedule, declared in code: upserted at start-up, then the operators' to see and change. */
export const schedule = (options: Pick<SweepOptions, "interval"> = defaults): Schedules.ScheduleSpec => ({
  name: scheduleName,
  stage: stageName,
  everyMs: Math.max(1000, Math.round(Duration.toMillis(options.interval))),
  catchUp: "skip"
})

/** The schedule from configuration (DOCUMENTS_SWEEP_INTERVAL_MS). */
export const scheduleFromConfig = Effect.map(config, (settings) => [schedule(settings)])

export const documentsSweep = Stage.make({
  name: stageName,
  visibility: "internal",
  payload: Schema.Struct({}),
  concurrency: 1,
  handler: () =>
    Effect.gen(function*() {
      const settings = yield* Settings
      // a failed sweep is logged; the next tick looks again
      const result = yield* sweepOnce(settings).pipe(
        Effect.tapError((e) => Effect.logWarning("documents sweep failed; the next tick looks again", e.message)),
        Effect.option
      )
      if (result._tag === "Some" && result.value.enqueued + result.value.errored > 0) {
        yield* Effect.logInfo("documents sweep", result.value)
      }
    })
})
