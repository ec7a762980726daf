/**
 * The Waker's one timer (`armNextDueTimer`): asks the database what is due, acts on what is due now, and sleeps
 * until the next thing (a delayed job, a lease's expiry, a held-back pool's next token, a due source) or a re-arm
 * request. A lease expired now runs the reaper. Each firing asks again first, so heartbeated leases never trigger
 * a useless reap. Asked only on request: a pool woken by the timer asks after its claim, the sweep asks, and jobs
 * written for later NOTIFY `pgfiber:later`, which asks.
 */
import { Clock, Duration, Effect, Queue as Q } from "effect"
import type * as Queue from "../../queue/Queue.js"
import type { Blocked, WakerState } from "./State.js"

export interface TimerOptions {
  /** Never fire more often than this (coalesces bursts of due jobs). */
  readonly minTimerSpacing: Duration.Duration
  /** The process whose stage registry rows the next-due question marks seen, when `WakerState` says it is due. */
  readonly presence?: string | undefined
}

/** Requests to re-arm the timer: a sliding queue of one, so any number of requests is one re-arm. */
export type Rearm = Q.Queue<void>

/** What the timer asks of the queue. */
type TimerQueue = Pick<Queue.Queue["Type"], "reapExpired" | "nextWake">

const reapOnce = (queue: TimerQueue, state: WakerState) =>
  queue.reapExpired.pipe(
    Effect.tap((result) => Effect.flatMap(Clock.currentTimeMillis, (now) => Effect.sync(() => state.reaped(result, now)))),
    Effect.tap((r) =>
      r.requeued + r.deadLettered > 0
        ? Effect.logInfo("reaper: expired leases", { requeued: r.requeued, deadLettered: r.deadLettered })
        : Effect.void
    )
  )

/** One round of the timer: from a re-arm request to the next (which it asks for itself when something is due later). */
const round = (queue: TimerQueue, state: WakerState, rearmRequests: Rearm, options: TimerOptions) =>
  Effect.gen(function*() {
    const rearm = Q.offer(rearmRequests, undefined)
    yield* Q.take(rearmRequests)
    // a paused stage's due jobs are nobody's; a blocked pool's ready jobs are not due for it: asking would fire
    // the timer at once, again and again
    const blocked = new Map<string, Blocked>([...state.stages()].map((r) => [r.stage, r.blocked()] as const))
    const held = (stage: string) => (state.stage(stage)?.paused() ?? false) || (blocked.get(stage) ?? null) !== null
    const seenBy = state.takePresence() ? options.presence : undefined
    const next = yield* queue.nextWake(state.stageNames().filter((stage) => !held(stage)), seenBy === undefined ? undefined : { seenBy })
    if (next.leaseExpiresInMs === 0) {
      const reaped = yield* reapOnce(queue, state)
      // the reaped jobs are queued now (and NOTIFYed); look again for what remains. Nothing reaped means
      // another process holds the reaper lock or the row is locked: give it a second rather than spin
      const acted = reaped.ran && reaped.requeued + reaped.deadLettered + reaped.removedCancelled > 0
      yield* Effect.sleep(acted ? options.minTimerSpacing : Duration.seconds(1))
      return yield* rearm
    }
    // due now: wake the pools of the stages with due jobs (only those: an idle pool woken for another stage's
    // backlog would claim nothing and ask to re-arm, and the backlog would wake it again, a loop for as long as
    // the backlog lasts); a pool that comes up short asks for the next re-arm itself. A pool that became blocked
    // while the question was out is left alone too
    for (const stage of next.dueNow) {
      const r = state.stage(stage)
      if (r !== undefined && r.blocked() === null) r.wake("timer")
    }
    const now = yield* Clock.currentTimeMillis
    const tokenDue: Array<number> = []
    for (const [stage, b] of blocked) {
      if (typeof b !== "number" || state.stage(stage)?.paused()) continue
      if (b <= now) state.stage(stage)?.wake("timer")
      else tokenDue.push(b - now)
    }
    const sourceDue = [...state.sources()].map((s) => [s, s.dueInMs(now)] as const)
    const dueSources = sourceDue.filter(([, ms]) => ms !== null && ms <= 0)
    if (dueSources.length > 0) {
      yield* Effect.forEach(dueSources, ([s]) => s.fire, { discard: true })
      return yield* rearm
    }
    const waits = [next.jobDueInMs, next.leaseExpiresInMs, ...tokenDue, ...sourceDue.map(([, ms]) => ms)]
      .filter((ms): ms is number => ms !== null && ms > 0)
    if (waits.length === 0) return
    // whichever comes first, the timer or a re-arm request, the next round asks the database again
    yield* Effect.raceFirst(
      Effect.sleep(Duration.millis(Math.max(Math.min(...waits), Duration.toMillis(options.minTimerSpacing)))),
      Q.take(rearmRequests)
    )
    yield* rearm
  })

/** The timer's loop, for the life of the caller's scope: a failed round logs, waits a second, and re-arms. */
export const armNextDueTimer = (queue: TimerQueue, state: WakerState, rearmRequests: Rearm, options: TimerOptions) =>
  round(queue, state, rearmRequests, options).pipe(
    Effect.asVoid,
    Effect.catchAllCause((cause) =>
      Effect.logWarning("waker timer failed; retrying", cause).pipe(
        Effect.zipRight(Effect.sleep("1 second")),
        Effect.zipRight(Q.offer(rearmRequests, undefined))
      )
    ),
    Effect.forever,
    Effect.annotateLogs({ component: "waker" })
  )
