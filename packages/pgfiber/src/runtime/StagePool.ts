/**
 * StagePool: one stage's supervised pool, in named parts, each a module under `pool/`, over one value that holds
 * the pool's jobs in named modes (pool/Held.ts: waiting, running, settling; its invariants are written there):
 *
 * - claimer (pool/Claimer.ts, `run` only): when the Waker says there is work, one statement claims a batch sized
 *   to free capacity, plus a buffer ahead while there is a backlog, sized in time (pool/ClaimSizing.ts); a lost
 *   database pauses it until it is back.
 * - executor (pool/Executor.ts): runs the handlers on at most `concurrency` slots (each interruptible alone:
 *   timeout, lease loss, shutdown) and turns each Exit into an outcome value (JobRun). A slot frees the moment
 *   its handler returns, and the next waiting job starts at once.
 * - settler (Settler.ts): writes the outcome values in batches, one statement each, while the next batch
 *   accumulates.
 * - lease keeper (pool/LeaseKeeper.ts): one loop extends every held lease in one statement and stops a job whose
 *   lease was lost; one loop interrupts handlers past their timeout.
 * - shutdown (pool/Shutdown.ts, `run` only): stop claiming, release what never started, drain within the grace
 *   period, interrupt and release the rest, settle everything, then close.
 * `once` (what `tick` runs) is the same core (pool/Core.ts: executor, settler, lease keeper) with one claim
 * instead of a claimer.
 *
 * What the parts keep between them:
 * 1. At most `concurrency` jobs run; a slot frees when the handler returns, not when its outcome commits. So a
 *    crash repeats at most the running jobs plus those finished within one settle window (at most
 *    `maxUnsettledFor(concurrency)`).
 * 2. Nothing touches the queue for a job except through its lease; the database fences stale leases.
 * 3. A job that never started is released, never retried: it spent no attempt.
 */
import { Duration, Effect, Metric, Scope } from "effect"
import * as Limits from "../queue/Limits.js"
import * as Queue from "../queue/Queue.js"
import * as Metrics from "./Metrics.js"
import * as Claimer from "./pool/Claimer.js"
import * as Core from "./pool/Core.js"
import * as Shutdown from "./pool/Shutdown.js"
import type * as Stage from "./Stage.js"
import * as StageControl from "./StageControl.js"
import * as Waker from "./Waker.js"

export interface PoolOptions {
  readonly workerId: string
  /** How long shutdown waits for in-flight jobs before interrupting and releasing them. */
  readonly shutdownGrace: Duration.Duration
  /** Overrides the stage's own concurrency (e.g. from configuration). */
  readonly concurrency?: number | undefined
  /** Configuration over the stage's own limits (run-time overrides in the database apply over both). */
  readonly limits?: Partial<Limits.Override> | undefined
  /** Where the pool reports its state for health checks. */
  readonly health?: Map<string, PoolHealth> | undefined
  /** Operators' per-stage pause, shared by every process (StageControl.ts); none: never paused. */
  readonly control?: StageControl.StageControl | undefined
}

export interface PoolHealth {
  readonly stage: string
  readonly state: "running" | "stopping"
  readonly concurrency: number
  /** Jobs whose handler runs now (at most `concurrency`). */
  readonly inFlight: number
  /** Jobs claimed ahead of a free slot (leased, not started): `running` in the database, waiting here. */
  readonly claimedAhead: number
  /** The claim loop is retrying because the database does not answer. */
  readonly paused: boolean
  /** An operator paused the stage (`pgfiber stages pause`): nothing is claimed until it is resumed. */
  readonly stagePaused: boolean
  readonly lastClaimAt: Date | null
  /** The stage's token bucket is empty with jobs ready: the pool waits for the next token. */
  readonly rateLimited: boolean
  /** The stage's global cap (or an org's) is full with jobs ready: the pool waits for a slot to free. */
  readonly capped: boolean
}

export type Counts = Core.Counts
export const maxAheadFor = Core.maxAheadFor
export const maxUnsettledFor = Core.maxUnsettledFor

// ---- run: the core plus the claimer and shutdown, woken by the Waker --------------------------------------

export const run = <A, I, R>(stage: Stage.Stage<A, I, R>, options: PoolOptions) =>
  Effect.gen(function*() {
    const waker = yield* Waker.Waker
    const { concurrency, shares } = configured(stage, options)
    const control = options.control ?? StageControl.none
    // the claimer is made after the core it claims for; the core's callbacks reach it once both exist
    let claimer: Claimer.Claimer | undefined
    const core = yield* Core.make(stage, concurrency, {
      requeued: waker.rearm,
      wakeFreed: () => claimer?.capsSeen() ?? false,
      onRan: (ms) => claimer?.ran(ms)
    })
    claimer = yield* Claimer.start(stage, core, { workerId: options.workerId, concurrency, shares, control })
    const claimed = claimer

    let stopping = false
    options.health?.set(stage.name, {
      get stage() { return stage.name },
      get state() { return stopping ? "stopping" as const : "running" as const },
      get concurrency() { return concurrency },
      get inFlight() { return core.held.running },
      get claimedAhead() { return core.held.waiting },
      get paused() { return claimed.state.paused },
      get stagePaused() { return control.isPaused(stage.name) },
      get lastClaimAt() { return claimed.state.lastClaimAt },
      get rateLimited() {
        const blocked = claimed.state.blocked
        return typeof blocked === "number" && blocked > Date.now()
      },
      get capped() { return claimed.state.blocked === "capacity" }
    })
    yield* Effect.addFinalizer(() => Effect.sync(() => options.health?.delete(stage.name)))

    // ---- shutdown: registered last, so it runs first when the scope closes ----
    yield* Effect.addFinalizer(() =>
      Effect.suspend(() => {
        stopping = true
        return Shutdown.finalizer(core, claimed, options.shutdownGrace)
      }).pipe(Effect.annotateLogs({ stage: stage.name }))
    )
  })

/** The stage's concurrency and limits with this process's configuration over its own (what a pool and a tick claim with). */
const configured = (stage: Stage.Any, options: Pick<PoolOptions, "concurrency" | "limits">) => ({
  concurrency: Math.max(1, options.concurrency ?? stage.concurrency),
  shares: Limits.applyOverride(stage.shares, options.limits ? { ...Limits.emptyOverride, ...options.limits } : null)
})

/** The stage as a Layer: its pool runs for the life of the layer. */
export const scoped = <A, I, R>(stage: Stage.Stage<A, I, R>, options: PoolOptions): Effect.Effect<void, never, Queue.Queue | Waker.Waker | R | Scope.Scope> =>
  run(stage, options) as Effect.Effect<void, never, Queue.Queue | Waker.Waker | R | Scope.Scope>

// ---- once: the same core, one claim, run to settled, stop (what `tick` does) ------------------------------

export interface OnceOptions<EC = never> {
  readonly workerId: string
  readonly max: number
  /** Wraps the claim, e.g. in `db.withOrg` so row-level security limits it to one org's jobs (EC: its own failures). */
  readonly claimScope?: <X, E, RC>(claim: Effect.Effect<X, E, RC>) => Effect.Effect<X, E | EC, RC>
  /** This process's configuration over the stage's concurrency and limits, as a worker's pool takes them. */
  readonly concurrency?: number | undefined
  readonly limits?: Partial<Limits.Override> | undefined
}

/**
 * Claims up to `max` (at most the stage's concurrency) jobs once, runs them, settles them, and returns the counts.
 * The claim keeps the stage's limits as a worker's would: caps, token buckets and fair shares.
 */
export const once = <A, I, R, EC = never>(stage: Stage.Stage<A, I, R>, options: OnceOptions<EC>) =>
  Effect.scoped(
    Effect.gen(function*() {
      const queue = yield* Queue.Queue
      const claimScope = options.claimScope ?? (<X, E, RC>(e: Effect.Effect<X, E, RC>) => e)
      const { concurrency, shares } = configured(stage, options)
      const limit = Math.min(Math.max(0, Math.floor(options.max)), concurrency)
      const jobs = limit === 0 ? [] : yield* claimScope(queue.claim(stage.name, limit, { workerId: options.workerId, leaseFor: stage.leaseFor, shares }))
      if (jobs.length === 0) return { claimed: 0, counts: undefined }
      yield* Metric.incrementBy(Metrics.forStage(Metrics.claimed, stage.name), jobs.length)
      const core = yield* Core.make(stage, concurrency, { requeued: Effect.void })
      core.accept(jobs)
      // interrupted (the caller gave up): release what runs, then wait for the writes
      yield* core.awaitIdle.pipe(
        Effect.onInterrupt(() => Effect.zipRight(core.interruptRunning, core.awaitIdle))
      )
      return { claimed: jobs.length, counts: { ...core.counts } }
    })
  )
