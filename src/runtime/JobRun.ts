/**
 * One claimed job, run and recorded: decode the payload, run the handler under its timeout, and map the
 * Exit to the queue — success → complete (+ follow-ups, atomically), typed failure → the stage's RetryPolicy,
 * defect or timeout → transient, interruption or a lost lease → release. StagePool and `tick` both run jobs
 * through here, so a job's fate does not depend on how it was claimed.
 */
import { Cause, Data, Duration, Effect, Exit, Metric, Option, Schedule } from "effect"
import type { Job, Lease } from "../queue/Job.js"
import * as Db from "../layers/Db.js"
import * as Queue from "../queue/Queue.js"
import * as Metrics from "./Metrics.js"
import * as RetryPolicy from "./RetryPolicy.js"
import * as Stage from "./Stage.js"

export type Outcome = "completed" | "retried" | "rescheduled" | "deadLettered" | "released" | "fenced" | "unrecorded"

/** Raised by a lease watch when a heartbeat finds the lease gone (cancelled, or expired and taken over). */
export class LeaseLost extends Data.TaggedError("LeaseLost")<{}> {}

class HandlerTimeout extends Data.TaggedError("HandlerTimeout")<{ readonly message: string }> {}

export interface Hooks {
  /** Records a plain success; a pool group-commits here. Default: `queue.complete` on its own. */
  readonly completeOne?: (lease: Lease) => Effect.Effect<boolean, Queue.QueueError>
  /** The handler has returned; its outcome is about to be recorded. */
  readonly onHandlerDone?: Effect.Effect<void>
  /** Raced with the handler; fails with LeaseLost when the lease is gone (tick's own heartbeat). */
  readonly leaseWatch?: Effect.Effect<never, LeaseLost>
  /** The job went back to the queue for later (retry or poll): a pool re-arms its timer. */
  readonly onRequeued?: Effect.Effect<void>
  /**
   * The caller enforces the stage's timeout itself (a pool's watchdog interrupts overdue handlers) and says
   * here whether an interruption was that timeout. Without it, each run gets its own timer.
   */
  readonly timedOut?: () => boolean
}

/** Outcomes keep trying through a database blip; past this the lease will have expired and the reaper owns the job. */
const settleRetry = Schedule.exponential("100 millis").pipe(
  Schedule.union(Schedule.spaced("5 seconds")),
  Schedule.upTo("2 minutes")
)

const settle = <X, E extends { readonly _tag: string; readonly message: string }>(what: string, effect: Effect.Effect<X, E>) =>
  effect.pipe(
    Effect.tapError((e) => Effect.logWarning(`${what} failed; retrying`, e.message)),
    Effect.retry({ schedule: settleRetry, while: (e) => e._tag === "DbError" })
  )

/** The error's tag decides; anything untagged, or a thrown bug, is a defect (retried as transient). */
export const failureOf = (cause: Cause.Cause<unknown>): RetryPolicy.Failure => {
  const failure = Cause.failureOption(cause)
  if (Option.isNone(failure)) {
    return { _tag: "Defect", message: `defect: ${Cause.pretty(cause).split("\n").slice(0, 6).join("\n")}` }
  }
  const e = failure.value as { _tag?: string; message?: string }
  switch (e?._tag) {
    case "Transient":
      return { _tag: "Transient", message: e.message ?? "transient failure" }
    case "Permanent":
      return { _tag: "Permanent", message: e.message ?? "permanent failure" }
    case "RateLimited":
      return { _tag: "RateLimited", error: e as never }
    case "NotReady":
      return { _tag: "NotReady", error: e as never }
    case "HandlerTimeout":
      return { _tag: "Defect", message: e.message ?? "handler timed out" }
  }
  return { _tag: "Defect", message: `unexpected failure: ${String(e?.message ?? e)}` }
}

export const jobInfo = (job: Job): Stage.JobInfo => ({
  id: job.id,
  stage: job.stage,
  attempt: job.attempts + 1,
  maxAttempts: job.maxAttempts,
  polls: job.polls,
  orgId: job.orgId,
  subjectId: job.subjectId,
  createdAt: job.createdAt
})

const outcomeMetric: Record<Exclude<Outcome, "unrecorded">, Metric.Metric.Counter<number>> = {
  completed: Metrics.completed,
  retried: Metrics.retried,
  rescheduled: Metrics.rescheduled,
  deadLettered: Metrics.deadLettered,
  released: Metrics.released,
  fenced: Metrics.fenced
}

/** Runs a claimed job to a recorded outcome. Never fails: what cannot be recorded is left to the reaper. */
export const execute = <A, I, R>(stage: Stage.Stage<A, I, R>, job: Job, hooks: Hooks = {}) =>
  Effect.gen(function*() {
    const queue = yield* Queue.Queue
    const lease: Lease = { id: job.id, lease: job.lease }
    const handlerDone = hooks.onHandlerDone ?? Effect.void
    const timeoutMessage = `handler timed out after ${Duration.format(stage.timeout)}`
    const requeued = hooks.onRequeued ?? Effect.void

    const recordFailure = (failure: RetryPolicy.Failure) =>
      Effect.gen(function*() {
        const decision = yield* RetryPolicy.decide(stage.policy, failure, job.attempts + 1, job.polls)
        const message = failure._tag === "RateLimited" || failure._tag === "NotReady" ? failure.error.message : failure.message
        switch (decision._tag) {
          case "Retry": {
            const outcome = yield* settle("retry", queue.retry(lease, decision.delay, { tag: failure._tag, message }))
            if (outcome === "fenced") return "fenced" as const
            if (outcome === "dead-lettered") {
              yield* Effect.logWarning(`dead-lettered, attempts exhausted: ${message}`)
              return "deadLettered" as const
            }
            yield* Effect.logInfo(`retrying in ${Duration.format(decision.delay)}: ${message}`)
            yield* requeued
            return "retried" as const
          }
          case "Reschedule": {
            if (!(yield* settle("reschedule", queue.reschedule(lease, decision.delay)))) return "fenced" as const
            yield* requeued
            return "rescheduled" as const
          }
          case "DeadLetter": {
            const ok = yield* settle("dead-letter", queue.deadLetter(lease, { tag: failure._tag, message: decision.reason }))
            if (ok) yield* Effect.logWarning(`dead-lettered: ${decision.reason}`)
            return ok ? "deadLettered" as const : "fenced" as const
          }
        }
      })

    const recordSuccess = (completion: Stage.Completion | void) => {
      // an org's job hands off within its org: a follow-up without an org takes the job's, another org is refused
      const followUps = (completion ? completion.followUps : []).map((f) =>
        f.orgId === undefined && job.orgId !== null ? { ...f, orgId: job.orgId } : f
      )
      const foreign = job.orgId === null ? undefined : followUps.find((f) => f.orgId !== job.orgId)
      if (foreign !== undefined) {
        const message = `follow-up to ${foreign.stage} names another org than the job's`
        return settle("dead-letter", queue.deadLetter(lease, { tag: "InvalidFollowUp", message })).pipe(
          Effect.tap(() => Effect.logError(`dead-lettered: ${message}`)),
          Effect.map((dead) => dead ? "deadLettered" as const : "fenced" as const)
        )
      }
      if (followUps.length === 0 && hooks.completeOne) {
        return settle("complete", hooks.completeOne(lease)).pipe(Effect.map((ok) => ok ? "completed" as const : "fenced" as const))
      }
      return settle("complete", queue.complete(lease, followUps)).pipe(
        Effect.map((ok) => ok ? "completed" as const : "fenced" as const),
        Effect.catchTag("InvalidJob", (e) =>
          settle("dead-letter", queue.deadLetter(lease, { tag: "InvalidFollowUp", message: `follow-up rejected: ${e.message}` })).pipe(
            Effect.tap(() => Effect.logError(`dead-lettered: the handler produced an invalid follow-up: ${e.message}`)),
            Effect.map((dead) => dead ? "deadLettered" as const : "fenced" as const)
          ))
      )
    }

    const release = (why: string) =>
      Effect.zipRight(
        Effect.logInfo(why),
        settle("release", queue.release([lease])).pipe(Effect.map((r) => r.length > 0 ? "released" as const : "fenced" as const))
      )

    const outcome: Outcome = yield* Effect.uninterruptibleMask((restore) =>
      Effect.gen(function*() {
        const payload = yield* Effect.either(Stage.decodePayload(stage, job.payload))
        if (payload._tag === "Left") {
          yield* handlerDone
          return yield* recordFailure({ _tag: "Permanent", message: payload.left })
        }
        const started = Date.now()
        // Tenancy: the handler's database work runs under the job's org (Db.forOrg: row-level security in the
        // worker too, each statement or transaction as the tenant, none held open across outside calls). Jobs
        // with no org run as the owner, as they always have. Recording the outcome below stays owner-level.
        const run = job.orgId === null
          ? Db.asOwner(stage.handler(payload.right, jobInfo(job)))
          : Db.forOrg(job.orgId)(stage.handler(payload.right, jobInfo(job)))
        const handler = hooks.timedOut
          ? run
          : run.pipe(Effect.timeoutFail({ duration: stage.timeout, onTimeout: () => new HandlerTimeout({ message: timeoutMessage }) }))
        const exit = yield* Effect.exit(restore(hooks.leaseWatch ? Effect.raceFirst(handler, hooks.leaseWatch) : handler))
        yield* Metric.update(Metrics.forStage(Metrics.duration, stage.name), (Date.now() - started) / 1000)
        yield* handlerDone
        if (Exit.isSuccess(exit)) return yield* recordSuccess(exit.value as Stage.Completion | void)
        if (Cause.isInterruptedOnly(exit.cause)) {
          if (hooks.timedOut?.()) {
            yield* Effect.logError(`handler failed: ${timeoutMessage}`)
            return yield* recordFailure({ _tag: "Defect", message: timeoutMessage })
          }
          return yield* release("interrupted; job released")
        }
        const failure = Cause.failureOption(exit.cause)
        if (Option.isSome(failure) && (failure.value as { _tag?: string })?._tag === "LeaseLost") {
          return yield* release("lease lost (cancelled or expired); job stopped")
        }
        const classified = failureOf(exit.cause)
        if (classified._tag === "Defect") yield* Effect.logError(`handler failed: ${classified.message}`, exit.cause)
        return yield* recordFailure(classified)
      })
    ).pipe(
      Effect.catchAllCause((cause) =>
        Effect.logError("could not record the job's outcome; the reaper will requeue it", cause).pipe(
          Effect.as("unrecorded" as const)
        )
      )
    )
    if (outcome === "fenced") {
      yield* Effect.logWarning("lease lost before the outcome was recorded (expired or cancelled); another worker owns the job")
    }
    if (outcome !== "unrecorded") yield* Metric.increment(Metrics.forStage(outcomeMetric[outcome], stage.name))
    return outcome
  }).pipe(
    Effect.annotateLogs({ stage: stage.name, jobId: job.id, attempt: job.attempts + 1 }),
    // no stack capture: it costs more than a no-op job itself
    Effect.withSpan(`stage.${stage.name}`, { attributes: { jobId: job.id, attempt: job.attempts + 1 }, captureStackTrace: false })
  )
