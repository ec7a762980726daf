/**
 * The claimer: when the Waker says there is work (or a slot frees under a backlog), one statement claims a batch
 * sized to free capacity, plus a buffer ahead while there is a backlog (ClaimSizing.ts). A lost database pauses
 * it until the database answers again; an operator's pause stops it claiming; the stage's limits (told by each
 * claim) hold it back until the next token or a freed slot.
 *
 * It tells the Waker's timer what is due later only when it must: after a claim the timer woke it for, when a
 * limit holds it back, or when a wake-up found nothing. A short claim at a steady rate asks nothing more, so a
 * job costs one claim and one settle.
 */
import { Effect, Fiber, Metric, Queue as Q, Schedule } from "effect"
import * as Limits from "../../queue/Limits.js"
import { outageRetry } from "../../queue/OutageRetry.js"
import * as Queue from "../../queue/Queue.js"
import * as Metrics from "../Metrics.js"
import type * as Stage from "../Stage.js"
import type * as StageControl from "../StageControl.js"
import * as Waker from "../Waker.js"
import * as ClaimSizing from "./ClaimSizing.js"
import { type Core, maxAheadFor, maxUnsettledFor } from "./Core.js"

/** A failed claim is retried at most a second apart, for as long as it takes. */
export const claimRetry = outageRetry("100 millis")

/** Handing back a claim that landed during shutdown keeps trying through a database blip, as a claim does; past this the leases have expired and the reaper requeues them. */
const releaseRetry = claimRetry.pipe(Schedule.upTo("2 minutes"))

export interface ClaimerOptions {
  readonly workerId: string
  readonly concurrency: number
  readonly shares: Limits.Shares
  readonly control: StageControl.StageControl
}

/** What the claimer knows, read by the pool's health report. */
export interface ClaimerState {
  /** The claim loop is retrying because the database does not answer. */
  readonly paused: boolean
  readonly lastClaimAt: Date | null
  /** Held back by the stage's limits (told by the last claim): until the next token, or until a slot frees. */
  readonly blocked: Waker.Blocked
}

/** The claimer's state, one value: what it knows of the stage's limits, its buffer, and why it claims next. */
interface Claiming {
  readonly concurrency: number
  readonly maxSettling: number
  /** Held back by the stage's limits (told by the last claim): until the next token, or until a slot frees. */
  blocked: Waker.Blocked
  /** Caps in code or configuration, or seen in a claim (a run-time override): settles wake other processes. */
  capsSeen: boolean
  /** Claiming ahead would spend tokens and cap slots on jobs that only wait here. */
  limited: boolean
  /** The claim-ahead buffer, sized in time from measured run times and claim round trips. */
  sizing: ClaimSizing.Sizing
  stopping: boolean
  /** The claim loop is retrying because the database does not answer. */
  paused: boolean
  lastClaimAt: Date | null
  /** A wake-up or a full batch says there may be more to claim once capacity frees. */
  moreWork: boolean
  /** The last claim came back full, so claim a buffer ahead to keep every slot busy. */
  backlog: boolean
  /** The next-due timer woke this pool: it sleeps until asked again, so re-arm it after the claim. */
  rearmAfterClaim: boolean
}

/** How many jobs to claim now; 0 while the jobs in hand suffice (under a backlog: until half the buffer is left). */
const wanted = (c: Claiming, held: Core["held"]) => {
  // computed once: this runs each time a slot frees
  const buffer = ClaimSizing.ahead(c.sizing)
  const ahead = c.backlog && !c.limited ? buffer : 0
  const want = c.concurrency + ahead - held.running - held.waiting
  return want <= 0 || (c.backlog && held.waiting > ClaimSizing.refillAt(buffer)) || held.settling >= c.maxSettling ? 0 : want
}

/** What one claim told the claimer: its round trip, the stage's limits, whether a backlog is left. */
const absorb = (c: Claiming, result: Limits.ClaimResult<unknown>, want: number, roundTripMs: number) => {
  // a claim's round trip, not an outage's length: a claim that had to be retried is no sample
  if (!c.paused) c.sizing = ClaimSizing.claimed(c.sizing, roundTripMs)
  c.paused = false
  c.lastClaimAt = new Date()
  c.blocked = result.rateLimitedForMs !== null ? Date.now() + result.rateLimitedForMs : result.capped ? "capacity" : null
  if (result.capped) c.capsSeen = true
  if (c.blocked !== null) c.limited = true
  // every row asked for came (some may have been dead-lettered, undecodable): more are likely waiting
  c.backlog = (result.taken ?? result.jobs.length) === want
  if (c.backlog) c.moreWork = true
}

/**
 * The timer must hear of what is due later only when it woke us (it then sleeps until asked), when a limit holds
 * the pool back (its next token is a due time), or when there was nothing at all (a wake-up we cannot place); a
 * short claim at a steady rate asks nothing more: one claim and one settle per job.
 */
const mustRearm = (c: Claiming, claimed: number) => {
  if (c.backlog || !(c.rearmAfterClaim || c.blocked !== null || claimed === 0)) return false
  c.rearmAfterClaim = false
  return true
}

export const start = (stage: Stage.Any, core: Core, options: ClaimerOptions) =>
  Effect.gen(function*() {
    const queue = yield* Queue.Queue
    const waker = yield* Waker.Waker
    const clock = yield* Effect.clock
    const { concurrency, shares, control } = options
    const claimOptions = { workerId: options.workerId, leaseFor: stage.leaseFor, shares }
    const claimedMetric = Metrics.forStage(Metrics.claimed, stage.name)
    const claimsMetric = Metrics.forStage(Metrics.claims, stage.name)
    const held = core.held
    const c: Claiming = {
      concurrency,
      maxSettling: maxUnsettledFor(concurrency),
      blocked: null,
      capsSeen: shares.maxRunning !== null || shares.maxRunningPerOrg !== null,
      limited: Limits.isLimited(shares),
      sizing: ClaimSizing.initial(concurrency, maxAheadFor(concurrency)),
      stopping: false,
      paused: false,
      lastClaimAt: null,
      moreWork: false,
      backlog: false,
      rearmAfterClaim: false
    }

    const signal = yield* Q.sliding<void>(1)
    const poke = () => Q.unsafeOffer(signal, undefined)
    // a slot freed or outcomes settled: wake the claim loop only when it would claim (a fiber's wake-up per job
    // costs more than this check)
    core.onCapacity = () => {
      if (!c.stopping && c.moreWork && wanted(c, held) > 0) poke()
    }

    const claimFailed = (e: Queue.QueueError) =>
      Effect.zipRight(
        Effect.sync(() => (c.paused = true)),
        Effect.logWarning("claim failed; pausing until the database answers", e.message)
      )

    const claimRound = Effect.gen(function*() {
      yield* Q.take(signal)
      while (!c.stopping && c.moreWork) {
        // under a backlog, refill only once the waiting jobs fall to half the buffer: fewer, larger claims
        const want = wanted(c, held)
        if (want === 0) break
        // paused by an operator: claim nothing (moreWork stays set; resuming pokes the loop)
        if (control.isPaused(stage.name)) break
        c.moreWork = false
        const sentAt = clock.unsafeCurrentTimeMillis()
        yield* Metric.increment(claimsMetric)
        const claim = queue.claimBatch(stage.name, want, claimOptions)
        // retried only once it has failed: a wake-up's claim builds no retry (0.25 ms of a cold process's time)
        const result = yield* Effect.catchAll(claim, (e) =>
          Effect.zipRight(claimFailed(e), Effect.retry(Effect.tapError(claim, claimFailed), { schedule: claimRetry, while: () => !c.stopping })))
          .pipe(Effect.orElseSucceed(() => null))
        // shutdown began while the database was away: no more retries, the shutdown must not wait for it
        if (result === null) break
        absorb(c, result, want, clock.unsafeCurrentTimeMillis() - sentAt)
        if (result.jobs.length > 0) yield* Metric.incrementBy(claimedMetric, result.jobs.length)
        if (c.stopping) {
          // shutdown began while the claim was in flight: hand them straight back
          yield* queue.settle(result.jobs.map((j) => Queue.Outcome.release(j))).pipe(Effect.retry({ schedule: releaseRetry, while: (e) => e.unavailable }), Effect.ignore)
          break
        }
        core.accept(result.jobs)
        // a full claim: there is more than this pool can hold, so the stage's wake leader asks the others
        if (c.backlog) waker.more(stage.name)
        if (mustRearm(c, result.jobs.length)) yield* waker.rearm
      }
    }).pipe(Effect.catchAllCause((cause) => Effect.logError("claim loop failed; continuing", cause)))
    // ends by itself once shutdown begins, so a claim in flight is never cut off between commit and release; a
    // plain loop, not `Effect.repeat`, whose schedule costs ~6 µs a round (one per job at a steady rate)
    const claimLoop = Effect.whileLoop({ while: () => !c.stopping, body: () => claimRound, step: () => undefined }).pipe(
      Effect.annotateLogs({ stage: stage.name })
    )
    const fiber = yield* Effect.forkScoped(claimLoop)

    const wake = (reason: Waker.WakeReason) => {
      // a wake-up (a NOTIFY, a slot freed, the next token) lifts the block until the next claim says otherwise; the
      // timer left a blocked stage's due jobs out, so after this claim it must look at them again
      if (reason === "timer" || c.blocked !== null) c.rearmAfterClaim = true
      c.blocked = null
      c.moreWork = true
      poke()
    }
    // resumed: the timer left this stage's delayed jobs out while it was paused
    control.onResume(stage.name, () => wake("timer"))
    // no free slot, or a backlog: a job that comes now is better claimed by another process
    const busy = () => c.backlog || held.running + held.waiting >= c.concurrency
    yield* waker.register(stage.name, wake, () => control.isPaused(stage.name), () => c.blocked, busy)

    const state: ClaimerState = c
    return {
      state,
      /** Caps are known to apply (so a settle should wake other processes waiting for a slot). */
      capsSeen: () => c.capsSeen,
      ran: (ms: number) => {
        c.sizing = ClaimSizing.ran(c.sizing, ms)
      },
      /**
       * Stops claiming: the loop ends by itself (a claim in flight finishes and hands its jobs back first; a claim
       * interrupted mid-statement might have committed unseen).
       */
      stop: Effect.sync(() => {
        c.stopping = true
        poke()
      }),
      fiber: fiber as Fiber.RuntimeFiber<void>
    }
  })

export type Claimer = Effect.Effect.Success<ReturnType<typeof start>>
