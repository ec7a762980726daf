/**
 * Stage `documents_sweep`: seed 003's optional "re-enqueue pending" safety job, as a stage that reschedules
 * itself. Each run
 * - enqueues a `transcribe_document` job for every media document pending for longer than `stuckAfter` with
 *   no live job; the job's dedupe key makes this safe against the trigger, a running job or another sweep;
 * - errors media documents left in `processing` for longer than `stuckAfter` whose job is gone (cancelled, or
 *   dead-lettered where the stage's onDeadLetter could not reach the document): the same fate as any
 *   document whose job ran out of attempts. Re-enqueueing them instead could loop forever on media that
 *   kills its worker;
 * - completes with a follow-up of itself `interval` later, under one fixed dedupe key, so one chain exists
 *   however many workers run. `ensureSweepScheduled` (called at start-up) starts it when none is live.
 */
import { Config, Context, Duration, Effect, Layer, Schema } from "effect"
import * as Db from "../../layers/Db.js"
import type * as Job from "../../queue/Job.js"
import * as Queue from "../../queue/Queue.js"
import * as Stage from "../../runtime/Stage.js"
import * as Documents from "./Documents.js"
import * as TranscribeDocument from "./TranscribeDocument.js"

export const stageName = "documents_sweep"

/** The one live sweep job: enqueueing another while it is queued or running is a no-op. */
export const dedupeKey = stageName

export interface SweepOptions {
  /** Time between sweeps. */
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

const millis = (name: string, fallback: Duration.Duration, validation: (ms: number) => boolean, message: string) =>
  // validated before the default is attached, so an invalid value's error names the variable
  Config.integer(name).pipe(
    Config.validate({ message, validation }),
    Config.map(Duration.millis),
    Config.withDefault(fallback)
  )

export const config: Config.Config<SweepOptions> = Config.all({
  interval: millis("DOCUMENTS_SWEEP_INTERVAL_MS", defaults.interval, (ms) => ms > 0, "must be a positive number of milliseconds"),
  stuckAfter: millis("DOCUMENTS_SWEEP_STUCK_AFTER_MS", defaults.stuckAfter, (ms) => ms >= 0, "must be a number of milliseconds, 0 or more"),
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

/** The next link of the chain. */
export const nextSweep = (delay: Duration.Duration): Job.NewJob => ({
  stage: stageName,
  payload: {},
  dedupeKey,
  delay
})

export const documentsSweep = Stage.make({
  name: stageName,
  visibility: "internal",
  payload: Schema.Struct({}),
  concurrency: 1,
  handler: () =>
    Effect.gen(function*() {
      const settings = yield* Settings
      // a failed sweep is logged and the chain goes on: the next one looks again
      const result = yield* sweepOnce(settings).pipe(
        Effect.tapError((e) => Effect.logWarning(`documents sweep failed; next in ${Duration.format(settings.interval)}`, e.message)),
        Effect.option
      )
      if (result._tag === "Some" && result.value.enqueued + result.value.errored > 0) {
        yield* Effect.logInfo("documents sweep", result.value)
      }
      return Stage.complete([nextSweep(settings.interval)])
    })
})

/** Starts the sweep chain now unless one is live (queued or running): safe to call at every start-up. */
export const ensureSweepScheduled = Queue.enqueueOne(nextSweep(Duration.zero))
