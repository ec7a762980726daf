/**
 * `tick`: claim at most N runnable jobs, run them in this process, record their outcomes, return (seed 004's
 * dev tick; cron and serverless). Each job runs through JobRun, exactly as in a StagePool, with its lease
 * heartbeated while the handler runs.
 */
import { Duration, Effect, Metric } from "effect"
import type { Job, Lease } from "../queue/Job.js"
import * as Queue from "../queue/Queue.js"
import * as JobRun from "./JobRun.js"
import * as Metrics from "./Metrics.js"
import type * as Stage from "./Stage.js"

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

type Counted = Exclude<JobRun.Outcome, "unrecorded">

/** A job's lease, heartbeated every third of its length while its handler runs; losing it stops the handler. */
const leaseWatch = (stage: Stage.Any, lease: Lease) =>
  Effect.flatMap(Queue.Queue, (queue) =>
    Effect.sleep(Duration.millis(Math.max(50, Duration.toMillis(stage.leaseFor) / 3))).pipe(
      Effect.zipRight(queue.heartbeat([lease], stage.leaseFor).pipe(Effect.orElseSucceed(() => [lease.id]))),
      Effect.flatMap((held) => (held.includes(lease.id) ? Effect.void : Effect.fail(new JobRun.LeaseLost()))),
      Effect.forever
    ))

const runJob = <A, I, R>(stage: Stage.Stage<A, I, R>, job: Job) =>
  Effect.flatMap(Queue.Queue, (queue) =>
    JobRun.execute(stage, job, {
      leaseWatch: leaseWatch(stage, { id: job.id, lease: job.lease }).pipe(Effect.provideService(Queue.Queue, queue))
    })).pipe(Effect.withSpan("Tick.job", { attributes: { jobId: job.id } }))

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
    const counts: Record<Counted, number> = { completed: 0, retried: 0, rescheduled: 0, deadLettered: 0, released: 0, fenced: 0 }
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
        // an outcome that could not be recorded is left to the reaper, like one fenced out
        for (const outcome of outcomes) counts[outcome === "unrecorded" ? "fenced" : outcome]++
      }
    }
    return { claimed, ...counts, stages: perStage } satisfies TickResult
  }).pipe(Effect.withSpan("Tick.run", { attributes: { max: options.max } })) as Effect.Effect<
    TickResult,
    Queue.QueueError,
    Queue.Queue | Stage.Requirements<S>
  >
