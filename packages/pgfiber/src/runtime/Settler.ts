/**
 * The settler: a pool's group commit. Executors hand it outcome values as their handlers return (and their
 * slots go straight to the next job); it writes everything that has accumulated in one `Queue.settle` — one
 * statement, every kind of outcome, each fenced by its lease — while the next batch accumulates behind it.
 * It runs the stage's `onDeadLetter` in the transaction that dead-letters, counts the outcomes per batch, and
 * logs only the unusual ones, with the job's annotations.
 *
 * The settle window — from a handler's return to its outcome's commit — is at most two settle statements
 * (the one in flight when it finished, then its own). A crash inside the window repeats that job: at most the
 * jobs finished within one settle window per process are run again, and never a completed one twice from a
 * fenced-out worker (the lease fence refuses it).
 */
import { Cause, Duration, Effect, Metric, Queue as Q, Schedule } from "effect"
import type { Job } from "../queue/Job.js"
import type * as Outcome from "../queue/Outcome.js"
import { outageRetry } from "../queue/OutageRetry.js"
import * as Queue from "../queue/Queue.js"
import * as Events from "./Events.js"
import type * as JobRun from "./JobRun.js"
import * as Metrics from "./Metrics.js"
import * as Stage from "./Stage.js"
import { jobInfo } from "./JobRun.js"

export interface Finished {
  readonly job: Job
  readonly decided: JobRun.Decided
  /** Handler run time; undefined when no handler ran (bad payload, attempts spent, released unstarted). */
  readonly seconds: number | undefined
}

export interface SettlerOptions {
  /** After each batch is written (or given up on), with what became of each job. */
  readonly settled: (batch: ReadonlyArray<Finished>, results: ReadonlyArray<Outcome.Settled | "unrecorded">) => void
  /** Some job went back to the queue for later: the Waker re-arms its timer. */
  readonly requeued: Effect.Effect<void>
  /** Wake the stage in every process as its jobs settle (a capped stage: another may wait for the slot). */
  readonly wakeFreed?: () => boolean
  /** Most outcomes written in one statement. */
  readonly maxBatch?: number
}

/** A failed settle keeps trying through a database blip; past this the leases have expired and the reaper owns the jobs. */
const settleRetry = outageRetry("50 millis").pipe(Schedule.upTo("2 minutes"))

const counters: Record<Outcome.Settled, Metric.Metric.Counter<number>> = {
  completed: Metrics.completed,
  retried: Metrics.retried,
  rescheduled: Metrics.rescheduled,
  deadLettered: Metrics.deadLettered,
  released: Metrics.released,
  fenced: Metrics.fenced
}

export const make = <A, I, R>(stage: Stage.Stage<A, I, R>, options: SettlerOptions) =>
  Effect.gen(function*() {
    const queue = yield* Queue.Queue
    const context = yield* Effect.context<R>()
    const maxBatch = options.maxBatch ?? 1000
    const pending: Array<Finished> = []
    const wake = yield* Q.sliding<void>(1)
    const byOutcome = Object.fromEntries(
      Object.entries(counters).map(([k, m]) => [k, Metrics.forStage(m, stage.name)])
    ) as Record<Outcome.Settled, Metric.Metric.Counter<number>>
    const duration = Metrics.forStage(Metrics.duration, stage.name)
    const events = yield* Events.current

    const annotate = (job: Job) => Effect.annotateLogs({ stage: stage.name, jobId: job.id, attempt: job.attempts + 1 })

    /** The stage's hook for each job the settle dead-lettered, each in its own savepoint. */
    const onDeadLettered = stage.onDeadLetter === undefined ? undefined : (batch: ReadonlyArray<Finished>) =>
      (dead: ReadonlyArray<Outcome.DeadLettered>) =>
        Effect.forEach(dead, (d) => {
          const { job, decided } = batch[d.index]!
          // the cause of death is the run's (a defect on the last attempt is a defect); "exhausted" is a job
          // claimed with no attempt left after its last run's lease expired
          const info: Stage.DeadLettered = { job: jobInfo(job), reason: d.reason, kind: decided.kind }
          return queue.savepoint(stage.onDeadLetter!(info)).pipe(
            Effect.catchAllCause((cause) =>
              Effect.logError("onDeadLetter failed; its writes were rolled back, the job is dead-lettered", Cause.squash(cause)).pipe(annotate(job))
            )
          )
        }, { discard: true }).pipe(Effect.provide(context))

    const report = (batch: ReadonlyArray<Finished>, results: ReadonlyArray<Outcome.Settled>) =>
      Effect.gen(function*() {
        const counts: Partial<Record<Outcome.Settled, number>> = {}
        let requeued = false
        for (let i = 0; i < batch.length; i++) {
          const { decided, job, seconds } = batch[i]!
          const result = results[i]!
          counts[result] = (counts[result] ?? 0) + 1
          if (seconds !== undefined) duration.unsafeUpdate(seconds, [])
          if (result === "retried" || result === "rescheduled") requeued = true
          // the common case, a plain completion, logs nothing and costs nothing more
          if (result === "completed" && decided.note === undefined) continue
          const log = describe(decided, result)
          if (log) yield* log.pipe(annotate(job))
        }
        for (const [result, n] of Object.entries(counts)) yield* Metric.incrementBy(byOutcome[result as Outcome.Settled], n)
        if (events.active()) events.publish(eventsOf(batch, results, new Date()))
        if (requeued) yield* options.requeued
      })

    const settleBatch = Effect.gen(function*() {
      // let jobs finishing right now join this batch rather than the next one
      yield* Effect.yieldNow()
      const batch = pending.splice(0, maxBatch)
      if (batch.length === 0) return
      const hook = onDeadLettered?.(batch)
      // a completion carries its run time already (the common case: no copy per job); other kinds get it here
      const outcomes = batch.map((f) =>
        f.seconds === undefined || f.decided.outcome.runMs !== undefined ? f.decided.outcome : { ...f.decided.outcome, runMs: f.seconds * 1000 })
      const settle = queue.settle(outcomes, {
        onDeadLettered: hook,
        retain: stage.retain,
        wakeFreed: options.wakeFreed?.() ?? false
      }).pipe(Effect.tapError((e) => Effect.logWarning("settling a batch failed; retrying", e.message)))
      const results = yield* settle.pipe(
        // the retry is built only once a settle has failed (its first retry at once): a retry's schedule costs
        // ~7 µs to set up, a steady worker's every settle otherwise
        Effect.catchIf((e) => e._tag === "QueueError", () => Effect.retry(settle, { schedule: settleRetry, while: (e) => e._tag === "QueueError" })),
        Effect.catchAllCause((cause) =>
          Effect.logError(`could not settle ${batch.length} outcome(s); the reaper will requeue them`, cause).pipe(Effect.as(null))
        )
      )
      if (results === null) {
        options.settled(batch, batch.map(() => "unrecorded" as const))
        return
      }
      // the slots are already free; what remains is the bookkeeping that lets the leases go
      options.settled(batch, results)
      yield* report(batch, results)
    })

    yield* Effect.forkScoped(
      Q.take(wake).pipe(
        // a plain loop, not `Effect.repeat`, whose schedule costs ~6 µs a wake-up (one per job at a steady rate)
        Effect.zipRight(Effect.whileLoop({ while: () => pending.length > 0, body: () => settleBatch, step: () => undefined })),
        Effect.catchAllCause((cause) => Effect.logError("settler failed; continuing", cause)),
        Effect.forever,
        Effect.annotateLogs({ stage: stage.name })
      )
    )

    return {
      /** Hands over a finished job's outcome; it is written by the next settle. */
      post: (finished: Finished) => {
        pending.push(finished)
        if (pending.length === 1) Q.unsafeOffer(wake, undefined)
      },
      /** Outcomes handed over and not yet written. */
      get backlog() {
        return pending.length
      }
    }
  })

/** The batch's lifecycle events: the settled outcomes that end a run (completed, retried, dead-lettered). */
const eventsOf = (batch: ReadonlyArray<Finished>, results: ReadonlyArray<Outcome.Settled>, at: Date) => {
  const out: Array<Events.JobEvent> = []
  for (let i = 0; i < batch.length; i++) {
    const { decided, job, seconds } = batch[i]!
    const base = { jobId: job.id, stage: job.stage, orgId: job.orgId, attempt: job.attempts + 1, at, seconds: seconds ?? null }
    const o = decided.outcome
    switch (results[i]) {
      case "completed":
        out.push({ _tag: "Completed", ...base })
        break
      case "retried":
        if (o._tag === "Retry") out.push({ _tag: "Retried", ...base, error: o.error, delayMs: Duration.toMillis(o.delay) })
        break
      case "deadLettered":
        out.push({
          _tag: "DeadLettered",
          ...base,
          error: o._tag === "Retry" || o._tag === "DeadLetter" ? o.error : { tag: "InvalidFollowUp", message: "the handler produced an invalid follow-up" }
        })
        break
    }
  }
  return out
}

const describe = (decided: JobRun.Decided, result: Outcome.Settled): Effect.Effect<void> | undefined => {
  const o = decided.outcome
  const note = decided.note ? `${decided.note}; ` : ""
  switch (result) {
    case "completed":
      return decided.note ? Effect.logInfo(decided.note) : undefined
    case "fenced":
      return Effect.logWarning(`${note}lease lost before the outcome was recorded (expired or cancelled); another worker owns the job`)
    case "released":
      return Effect.logInfo(decided.note ?? "job released")
    case "retried":
      return o._tag === "Retry" ? logNote(decided, Effect.logInfo(`retrying in ${Duration.format(o.delay)}: ${o.error.message}`)) : undefined
    case "rescheduled":
      return undefined
    case "deadLettered":
      return logNote(decided, Effect.logWarning(
        o._tag === "Retry" ? `dead-lettered, attempts exhausted: ${o.error.message}`
          : o._tag === "DeadLetter" ? `dead-lettered: ${o.error.message}`
          : "dead-lettered: the handler produced an invalid follow-up"
      ))
  }
}

const logNote = (decided: JobRun.Decided, then: Effect.Effect<void>) =>
  decided.note ? Effect.zipRight(Effect.logError(decided.note), then) : then
