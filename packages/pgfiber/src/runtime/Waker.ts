/**
 * The Waker decides when stage pools look for work, so that nobody polls:
 * - one LISTEN connection per process; the insert trigger's NOTIFY wakes the stage that has work;
 * - on (re)connect of that listener, a catch-up: every pool claims, since notifications may have been missed;
 * - a timer armed for the next delayed job or lease expiry (`armNextDueTimer`), which also runs the reaper; jobs
 *   written for later NOTIFY `pgfiber:later`, which re-arms it, and a pool woken by the timer re-arms it after its
 *   claim (so a steady stream of due jobs costs no look-up of the next due time per job);
 * - a slow safety sweep (default 60 s) that re-arms the timer, costing one statement when idle; that statement
 *   also marks this process's stages seen in the stage registry (`presence`), so registration costs nothing more;
 * - other due times kept in memory by a `DueSource` (a schedule's next tick): one more wait for the same timer,
 *   and a NOTIFY whose payload is the source's topic (or a reconnect) tells the source to refresh;
 * - the listener's state is the truth: `down` (with `downSince`) from the moment its connection drops, or LISTEN
 *   fails, until LISTEN is back; while down, every pool claims each `pollInterval` (the sweep switches at once),
 *   and the return to `listening` is a catch-up. `health` and the metrics report it.
 * - a pool held back by its stage's limits says so (`Blocked`): a rate-limited stage is left out of the
 *   due-job question and woken by the same timer at its next token; a capped one waits for a NOTIFY (a slot
 *   freed in any process) or its own slot freeing, so neither polls. A change of the run-time limits in any
 *   process NOTIFYs `pgfiber:limits`: the queue reads them again and the held-back pools claim again.
 * - no thundering herd: of the processes running a stage, one is its wake leader and claims on the stage's NOTIFY
 *   (waker/Lead.ts).
 *
 * In parts (waker/): its state as one value with named modes, changed only through its transitions (State.ts);
 * what the LISTEN connection hears, handled in order by one fiber (Listener.ts); the wake lead (Lead.ts); the
 * timer (Timer.ts); the sweep (Sweep.ts). This module is their composition and the service's interface.
 */
import { Context, Duration, Effect, FiberSet, Layer, Queue as Q, RcRef, type Scope } from "effect"
import * as Queue from "../queue/Queue.js"
import * as Lead from "./waker/Lead.js"
import * as Listener from "./waker/Listener.js"
import * as State from "./waker/State.js"
import * as Sweep from "./waker/Sweep.js"
import * as Timer from "./waker/Timer.js"

export type { Blocked, DueSource, Health, ListenerState, WakeReason } from "./waker/State.js"

export interface WakerOptions {
  /** How often the safety sweep looks, whatever the notifications said. */
  readonly sweepInterval: Duration.Duration
  /** How often pools claim while LISTEN is down. */
  readonly pollInterval: Duration.Duration
  /** Never fire the timer more often than this (coalesces bursts of due jobs). */
  readonly minTimerSpacing: Duration.Duration
  /**
   * The process whose stage registry rows the sweep marks seen, inside the next-due question it already asks
   * (no statement of its own): at most once per sweep interval, also while polling.
   */
  readonly presence?: string | undefined
  /** A follower that ignored a NOTIFY tries to take the stage's wake lead at most this often. */
  readonly leadRetry: Duration.Duration
  /** A wake leader asks the other processes to claim at most this often. */
  readonly helpSpacing: Duration.Duration
}

export const defaultOptions: WakerOptions = {
  sweepInterval: Duration.seconds(60),
  pollInterval: Duration.seconds(2),
  minTimerSpacing: Duration.millis(25),
  leadRetry: Duration.seconds(1),
  helpSpacing: Duration.millis(50)
}

export class Waker extends Context.Tag("pgfiber/Waker")<Waker, {
  /**
   * A pool registers its wake-up for the life of its scope. While `paused()` says so (an operator paused the
   * stage), the timer leaves the stage's due jobs out: nothing would claim them. While `blocked()` says so (its
   * limits hold it back), its ready jobs are not due for it either; a token's time is.
   */
  readonly register: (
    stage: string,
    wake: (reason: State.WakeReason) => void,
    paused?: () => boolean,
    blocked?: () => State.Blocked,
    busy?: () => boolean
  ) => Effect.Effect<void, never, Scope.Scope>
  /** A pool's claim came back full: if this process leads the stage, the others are asked to claim too. */
  readonly more: (stage: string) => void
  /** Something may fall due sooner than the timer knows (a pool woken by it claimed, a limit blocks): re-arm the next-due timer. */
  readonly rearm: Effect.Effect<void>
  /** Adds a due time to the timer for the life of the scope. */
  readonly registerDue: (source: State.DueSource) => Effect.Effect<void, never, Scope.Scope>
  /**
   * Hears every notification's topic on the jobs channel (and "" on each reconnect) for the life of the scope, on
   * the process's one LISTEN connection: the dashboard's live view, which must not open a second one. With
   * `events`, the event log's notifications too (`Queue.eventsTopic`): the connection listens for them only while
   * such an observer is there, and `observe` returns once it does.
   */
  readonly observe: (
    listener: (topic: string) => void,
    options?: { readonly events?: boolean }
  ) => Effect.Effect<void, never, Scope.Scope>
  readonly health: Effect.Effect<State.Health>
}>() {}

export const make = (options: Partial<WakerOptions> = {}) =>
  Effect.gen(function*() {
    const opts = { ...defaultOptions, ...options }
    const queue = yield* Queue.Queue
    const state = State.make()
    const rearmRequests = yield* Q.sliding<void>(1)
    const rearm = Effect.asVoid(Q.offer(rearmRequests, undefined))
    const listenerChanged = yield* Q.sliding<void>(1)
    const runFork = yield* FiberSet.runtime(yield* FiberSet.make<void, never>())<never>()
    const fork = (effect: Effect.Effect<void>) => void runFork(effect)
    const catchUp = () => {
      for (const r of state.stages()) r.wake("catchUp")
      for (const o of state.observers()) o("")
      for (const s of state.sources()) s.refresh()
    }

    // LISTEN on a connection Db watches; what it hears is handled in order by one fiber
    const heard = yield* Q.unbounded<Listener.Heard>()
    const listening = yield* queue.listen(Listener.wakeups(heard))
    const lead = Lead.make(state, listening, fork, opts)
    const handle = Listener.handler({
      state, lead, limits: queue.limits, rearm, listenerChanged, catchUp, fork, pollInterval: opts.pollInterval
    })
    // the first LISTEN's outcome, before any pool registers
    yield* Listener.drain(heard, handle)
    yield* Effect.forkScoped(Listener.loop(heard, handle))
    yield* Effect.forkScoped(Timer.armNextDueTimer(queue, state, rearmRequests, opts))
    yield* Effect.forkScoped(Sweep.sweep(state, listenerChanged, catchUp, rearm, { ...opts, presence: opts.presence !== undefined }))

    const register = (
      stage: string,
      wake: (reason: State.WakeReason) => void,
      paused: () => boolean = () => false,
      blocked: () => State.Blocked = () => null,
      busy: () => boolean = () => false
    ) =>
      Effect.acquireRelease(
        Effect.sync(() => {
          state.register(stage, { wake, paused, blocked, busy })
          wake("catchUp")
          fork(lead.tryLead([stage]))
        }),
        () => Effect.suspend(() => {
          const gone = state.unregister(stage)
          return gone === undefined ? Effect.void : lead.handBack(gone)
        })
      ).pipe(Effect.zipRight(rearm))

    const registerDue = (source: State.DueSource) =>
      Effect.acquireRelease(
        Effect.sync(() => {
          state.addSource(source)
          source.refresh()
        }),
        () => Effect.sync(() => state.removeSource(source))
      ).pipe(Effect.zipRight(rearm))

    // the event log's channel, listened on while anyone observes it (one LISTEN however many observers)
    const followingEvents = yield* RcRef.make({ acquire: listening.followEvents })
    const observe = (listener: (topic: string) => void, options: { readonly events?: boolean } = {}) =>
      Effect.acquireRelease(
        Effect.sync(() => state.observe(listener, options.events === true)),
        () => Effect.sync(() => state.unobserve(listener))
      ).pipe(Effect.zipRight(options.events ? RcRef.get(followingEvents) : Effect.void), Effect.asVoid)

    return Waker.of({ register, more: lead.more, rearm, registerDue, observe, health: Effect.sync(state.health) })
  })

export const layer = (options: Partial<WakerOptions> = {}) => Layer.scoped(Waker, make(options))
