/**
 * `tick`: claim at most N runnable jobs, run them in this process, record their outcomes, return (seed 004's
 * dev tick; cron and serverless). A job's Exit maps to the queue exactly as in StagePool: success → complete
 * (+ follow-ups, atomically), typed failure → the stage's RetryPolicy, defect or timeout → transient, lost
 * lease or interruption → release. Leases are heartbeated while handlers run.
 */
import { Cause, Data, Duration, Effect, Exit, Metric, Option, Schedule } from "effect"
import type { Job, Lease } from "../queue/Job.js"
import * as Queue from "../queue/Queue.js"
import * as Metrics from "../runtime/Metrics.js"
import * as RetryPolicy from "../runtime/RetryPolicy.js"
import * as Stage from "../runtime/Stage.js"

export interface TickOptions<S extends Stage.Any> {
  /** At most this many jobs are claimed, over all stages. */
  readonly max: number
  readonly stages: ReadonlyArray<S>
  readonly workerId: string
  /**
   * Wraps each claim, e.g. `db.withOrg(org, …)` so row-level security limits the tick to one org's jobs.
   * Handlers and outcomes run outside it, as in a worker.
   */
  readonly claimScope?: <A, E, R>(claim: Effect.Effect<A, E, R>) => Effect.Effect<A, E | Queue.QueueError, R>
  /**
   * Requeue expired leases first (default true): where ticks are the only workers, nothing else runs the
   * reaper, and a tick that died mid-job would otherwise hold its job forever.
   */
  readonly reap?: boolean | undefined
}

export interface TickResult {
  readonly claimed: number
  readonly completed: number
  readonly retried: number
  readonly rescheduled: number
  readonly deadLettered: number
  readonly released: number
  readonly fenced: number
  /** Jobs claimed per stage. */
  readonly stages: Readonly<Record<string, number>>
}

type Outcome = "completed" | "retried" | "rescheduled" | "deadLettered" | "released" | "fenced"

class LeaseLost extends Data.TaggedError("LeaseLost")<{}> {}
class HandlerTimeout extends Data.TaggedError("HandlerTimeout")<{ readonly message: string }> {}

/** Outcomes keep trying through a database blip, briefly: past that the lease expires and the reaper owns the job. */
const settleRetry = Schedule.exponential("100 millis").pipe(Schedule.union(Schedule.spaced("2 seconds")), Schedule.upTo("30 seconds"))

const settle = <X>(effect: Effect.Effect<X, Queue.QueueError>) =>
  effect.pipe(Effect.retry({ schedule: settleRetry, while: (e) => e.unavailable }))

/** The same classification as StagePool's: the error's tag decides, anything else is a defect. */
const failureOf = (cause: Cause.Cause<unknown>): RetryPolicy.Failure => {
  const failure = Cause.failureOption(cause)
  if (Option.isSome(failure)) {
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
  return { _tag: "Defect", message: `defect: ${Cause.pretty(cause).split("\n").slice(0, 6).join("\n")}` }
}

const runJob = <A, I, R>(stage: Stage.Stage<A, I, R>, job: Job) =>
  Effect.gen(function*() {
    const queue = yield* Queue.Queue
    const lease: Lease = { id: job.id, lease: job.lease }
    const count = (m: Metric.Metric.Counter<number>) => Metric.increment(Metrics.forStage(m, stage.name))
    const info: Stage.JobInfo = {
      id: job.id,
      stage: job.stage,
      attempt: job.attempts + 1,
      maxAttempts: job.maxAttempts,
      polls: job.polls,
      orgId: job.orgId,
      subjectId: job.subjectId,
      createdAt: job.createdAt
    }

    const settleFailure = (failure: RetryPolicy.Failure) =>
      Effect.gen(function*() {
        const decision = yield* RetryPolicy.decide(stage.policy, failure, job.attempts + 1, job.polls)
        const message = failure._tag === "RateLimited" || failure._tag === "NotReady" ? failure.error.message : failure.message
        switch (decision._tag) {
          case "Retry": {
            const outcome = yield* settle(queue.retry(lease, decision.delay, { tag: failure._tag, message }))
            if (outcome === "fenced") return "fenced" as const
            if (outcome === "dead-lettered") {
              yield* Effect.logWarning(`dead-lettered, attempts exhausted: ${message}`)
              return "deadLettered" as const
            }
            yield* Effect.logInfo(`retrying in ${Duration.format(decision.delay)}: ${message}`)
            return "retried" as const
          }
          case "Reschedule":
            return (yield* settle(queue.reschedule(lease, decision.delay))) ? "rescheduled" as const : "fenced" as const
          case "DeadLetter": {
            const ok = yield* settle(queue.deadLetter(lease, { tag: failure._tag, message: decision.reason }))
            if (ok) yield* Effect.logWarning(`dead-lettered: ${decision.reason}`)
            return ok ? "deadLettered" as const : "fenced" as const
          }
        }
      })

    const complete = (completion: Stage.Completion | void) =>
      Effect.gen(function*() {
        const followUps = completion ? completion.followUps : []
        const ok = yield* settle(queue.complete(lease, followUps).pipe(
          Effect.catchTag("InvalidJob", (e) =>
            queue.deadLetter(lease, { tag: "InvalidFollowUp", message: `follow-up rejected: ${e.message}` }).pipe(
              Effect.zipLeft(Effect.logError(`dead-lettered: the handler produced an invalid follow-up: ${e.message}`)),
              Effect.map((dead) => (dead ? "deadLettered" as const : "fenced" as const))
            ))
        ))
        return ok === true ? "completed" as const : ok === false ? "fenced" as const : ok
      })

    const release = settle(queue.release([lease])).pipe(
      Effect.map((released): Outcome => (released.length > 0 ? "released" : "fenced"))
    )

    // the lease is extended every third of its length; losing it (cancelled, or expired) stops the handler
    const beatEvery = Duration.millis(Math.max(50, Duration.toMillis(stage.leaseFor) / 3))
    const heartbeat = Effect.sleep(beatEvery).pipe(
      Effect.zipRight(queue.heartbeat([lease], stage.leaseFor).pipe(Effect.orElseSucceed(() => [job.id]))),
      Effect.flatMap((held) => (held.includes(job.id) ? Effect.void : Effect.fail(new LeaseLost()))),
      Effect.forever
    )

    const outcome: Outcome = yield* Effect.uninterruptibleMask((restore) =>
      Effect.gen(function*() {
        const payload = yield* Effect.either(Stage.decodePayload(stage, job.payload))
        if (payload._tag === "Left") return yield* settleFailure({ _tag: "Permanent", message: payload.left })
        const started = Date.now()
        const exit = yield* Effect.exit(restore(
          stage.handler(payload.right, info).pipe(
            Effect.timeoutFail({
              duration: stage.timeout,
              onTimeout: () => new HandlerTimeout({ message: `handler timed out after ${Duration.format(stage.timeout)}` })
            }),
            Effect.raceFirst(heartbeat)
          )
        ))
        yield* Metric.update(Metrics.forStage(Metrics.duration, stage.name), (Date.now() - started) / 1000)
        if (Exit.isSuccess(exit)) return yield* complete(exit.value as Stage.Completion | void)
        const lost = Cause.failureOption(exit.cause).pipe(Option.filter((e) => (e as { _tag?: string })?._tag === "LeaseLost"))
        if (Cause.isInterruptedOnly(exit.cause) || Option.isSome(lost)) {
          yield* Effect.logInfo(Option.isSome(lost) ? "lease lost (cancelled or expired); job stopped" : "interrupted; job released")
          return yield* release
        }
        const failure = failureOf(exit.cause)
        if (failure._tag === "Defect") yield* Effect.logError(`handler failed: ${failure.message}`, exit.cause)
        return yield* settleFailure(failure)
      })
    ).pipe(
      Effect.catchAllCause((cause) =>
        Effect.logError("could not record the job's outcome; the reaper will requeue it", cause).pipe(Effect.as("fenced" as const))
      )
    )
    const metric = {
      completed: Metrics.completed,
      retried: Metrics.retried,
      rescheduled: Metrics.rescheduled,
      deadLettered: Metrics.deadLettered,
      released: Metrics.released,
      fenced: Metrics.fenced
    }[outcome]
    yield* count(metric)
    return outcome
  }).pipe(
    Effect.annotateLogs({ stage: stage.name, jobId: job.id, attempt: job.attempts + 1 }),
    Effect.withSpan(`stage.${stage.name}`, { attributes: { jobId: job.id, attempt: job.attempts + 1, tick: true } })
  )

/**
 * Runs at most `max` runnable jobs, stage by stage, each stage's batch at its own concurrency, until `max` is
 * reached or nothing is runnable; a job that becomes due again during the tick may be claimed again.
 */
export const run = <S extends Stage.Any>(
  options: TickOptions<S>
): Effect.Effect<TickResult, Queue.QueueError, Queue.Queue | Stage.Requirements<S>> =>
  Effect.gen(function*() {
    const queue = yield* Queue.Queue
    const claimScope = options.claimScope ?? (<A, E, R>(e: Effect.Effect<A, E, R>) => e)
    const counts: Record<Outcome, number> = { completed: 0, retried: 0, rescheduled: 0, deadLettered: 0, released: 0, fenced: 0 }
    const perStage: Record<string, number> = {}
    if (options.reap ?? true) {
      const reaped = yield* queue.reapExpired
      if (reaped.requeued + reaped.deadLettered > 0) {
        yield* Effect.logInfo("reaper: expired leases").pipe(Effect.annotateLogs({ requeued: reaped.requeued, deadLettered: reaped.deadLettered }))
      }
    }
    let remaining = Math.max(0, Math.floor(options.max))
    let claimed = 0
    let progress = true
    while (remaining > 0 && progress) {
      progress = false
      for (const stage of options.stages) {
        if (remaining <= 0) break
        const jobs = yield* claimScope(
          queue.claim(stage.name, Math.min(remaining, stage.concurrency), { workerId: options.workerId, leaseFor: stage.leaseFor })
        )
        if (jobs.length === 0) continue
        progress = true
        remaining -= jobs.length
        claimed += jobs.length
        perStage[stage.name] = (perStage[stage.name] ?? 0) + jobs.length
        yield* Metric.incrementBy(Metrics.forStage(Metrics.claimed, stage.name), jobs.length)
        const outcomes = yield* Effect.forEach(jobs, (job) => runJob(stage, job), { concurrency: "unbounded" })
        for (const outcome of outcomes) counts[outcome]++
      }
    }
    return { claimed, ...counts, stages: perStage } satisfies TickResult
  }).pipe(Effect.withSpan("Tick.run", { attributes: { max: options.max } })) as Effect.Effect<
    TickResult,
    Queue.QueueError,
    Queue.Queue | Stage.Requirements<S>
  >
