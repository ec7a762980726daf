/**
 * `tick`: claim at most N runnable jobs, run them in this process, record their outcomes, return (the dev
 * tick; cron and serverless). It is a mode of the stage pool (`StagePool.once`: claim once, run, settle,
 * stop), so a job runs through the same executor, settler and heartbeat as in a worker.
 */
import { Effect } from "effect"
import type * as Outcome from "../queue/Outcome.js"
import * as Queue from "../queue/Queue.js"
import type * as Stage from "./Stage.js"
import * as StagePool from "./StagePool.js"
import type * as Worker from "./Worker.js"

type Counted = Outcome.Settled

export interface TickOptions<S extends Stage.Any, EC = never> {
  /** At most this many jobs are claimed, over all stages. */
  readonly max: number
  readonly stages: ReadonlyArray<S>
  readonly workerId: string
  /**
   * Wraps each claim, e.g. `db.withOrg(org, …)` so row-level security limits the tick to one org's jobs; its own
   * failures (EC: a transaction's, say) end the tick as the claim's would. Handlers and outcomes run outside it, as
   * in a worker.
   */
  readonly claimScope?: <A, E, R>(claim: Effect.Effect<A, E, R>) => Effect.Effect<A, E | EC, R>
  /**
   * Requeue expired leases first (default true): where ticks are the only workers, nothing else runs the
   * reaper, and a tick that died mid-job would otherwise hold its job forever.
   */
  readonly reap?: boolean | undefined
  /**
   * This process's configuration over the stages' own concurrency and limits, by stage name (`Worker.config`'s
   * `concurrency` and `limits`, read from `PGFIBER_CONCURRENCY`, `PGFIBER_MAX_RUNNING`, …): a tick claims as a
   * worker configured the same way would. Run-time overrides (`pgfiber limits set`) apply over both either way.
   */
  readonly concurrency?: Worker.WorkerOptions["concurrency"] | undefined
  readonly limits?: Worker.WorkerOptions["limits"]
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

/**
 * Runs at most `max` runnable jobs, stage by stage, each stage's batch at its own concurrency, until `max` is
 * reached or nothing is runnable; a job that becomes due again during the tick may be claimed again.
 */
export const run = <S extends Stage.Any, EC = never>(
  options: TickOptions<S, EC>
): Effect.Effect<TickResult, Queue.QueueError | EC, Queue.Queue | Stage.Requirements<S>> =>
  Effect.gen(function*() {
    const queue = yield* Queue.Queue
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
        const once: StagePool.OnceOptions<EC> = {
          workerId: options.workerId,
          max: remaining,
          claimScope: options.claimScope,
          concurrency: options.concurrency?.[stage.name],
          limits: options.limits?.[stage.name]
        }
        const ran = yield* StagePool.once(stage, once)
        if (ran.claimed === 0 || ran.counts === undefined) continue
        progress = true
        remaining -= ran.claimed
        claimed += ran.claimed
        perStage[stage.name] = (perStage[stage.name] ?? 0) + ran.claimed
        for (const [outcome, n] of Object.entries(ran.counts)) {
          // an outcome that could not be recorded is left to the reaper, like one fenced out
          counts[outcome === "unrecorded" ? "fenced" : outcome as Counted] += n
        }
      }
    }
    return { claimed, ...counts, stages: perStage } satisfies TickResult
  }).pipe(Effect.withSpan("Tick.run", { attributes: { max: options.max } })) as Effect.Effect<
    TickResult,
    Queue.QueueError | EC,
    Queue.Queue | Stage.Requirements<S>
  >
