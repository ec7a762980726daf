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
 * - no thundering herd: of the processes running a stage, one is its wake leader (a session-level advisory lock
 *   on its LISTEN connection, `Queue.Listening.tryLead`) and claims on the stage's NOTIFY; the others ignore it
 *   unless their pool waits for a slot (a capped stage). The leader asks them to claim too (`pgfiber:more:<stage>`,
 *   at most every `helpSpacing`) when its claim comes back full or a job comes while it has no free slot. A
 *   follower that ignored a NOTIFY tries to take the lead within `leadRetry` (the leader may have died: its lock
 *   went with its connection), and a leader that stops hands the lead back and asks for help. Until a process
 *   knows whether it leads (at start, after a reconnect), it claims on every NOTIFY, as one process does.
 */
import { Clock, Context, Duration, Effect, FiberSet, Layer, Queue as Q, RcRef } from "effect"
import * as Metrics from "./Metrics.js"
import * as Queue from "../queue/Queue.js"

export type ListenerState = "connecting" | "listening" | "down"

export interface Health {
  readonly listener: ListenerState
  /** When the listener last went down, while it is down (or has never come up); null while listening. */
  readonly listenerDownSince: Date | null
  /** Why it is down, while it is. */
  readonly listenerDownReason: string | null
  readonly listenerReconnects: number
  readonly lastReapAt: Date | null
  readonly lastSweepAt: Date | null
  readonly lastReap: Queue.ReapResult | null
}

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

/** Whether this process leads a stage's wake-ups: unknown until it has tried (and then it claims on every NOTIFY). */
type Lead = "unknown" | "leader" | "follower"

/** Something besides jobs that falls due (the Scheduler's next tick), known without asking the database. */
export interface DueSource {
  /** A NOTIFY with this payload asks the source to refresh (as does every listener reconnect). */
  readonly topic: string
  readonly refresh: () => void
  /** Ms until `fire` is due, from the source's memory (no statement); null: nothing due. */
  readonly dueInMs: (nowMs: number) => number | null
  /** Runs when due; logs and survives its own failures. */
  readonly fire: Effect.Effect<void>
}

/** Why a pool will not claim now although jobs are ready: until a time (ms since epoch, its next token), or until a slot frees. */
export type Blocked = number | "capacity" | null

/**
 * Why a pool is woken. `timer`: the next-due timer fired for its jobs; the timer then sleeps until asked again, so
 * the pool re-arms it after its claim (what else is due later is the timer's to find). Otherwise (a NOTIFY, a
 * catch-up, a poll while LISTEN is down) the timer already knows what is due later: jobs written for later (an
 * insert, a replacing enqueue, a retry or poll for later, in any process) NOTIFY `laterTopic`, and a catch-up or a
 * poll re-arms it itself. A pool whose block (a limit) lifts re-arms it after its claim too, since the timer left
 * a blocked stage out.
 */
export type WakeReason = "notify" | "timer" | "catchUp"

export class Waker extends Context.Tag("pgfiber/Waker")<Waker, {
  /**
   * A pool registers its wake-up for the life of its scope. While `paused()` says so (an operator paused the
   * stage), the timer leaves the stage's due jobs out: nothing would claim them. While `blocked()` says so (its
   * limits hold it back), its ready jobs are not due for it either; a token's time is.
   */
  readonly register: (
    stage: string,
    wake: (reason: WakeReason) => void,
    paused?: () => boolean,
    blocked?: () => Blocked,
    busy?: () => boolean
  ) => Effect.Effect<void, never, import("effect").Scope.Scope>
  /** A pool's claim came back full: if this process leads the stage, the others are asked to claim too. */
  readonly more: (stage: string) => void
  /** Something may fall due sooner than the timer knows (a pool woken by it claimed, a limit blocks): re-arm the next-due timer. */
  readonly rearm: Effect.Effect<void>
  /** Adds a due time to the timer for the life of the scope. */
  readonly registerDue: (source: DueSource) => Effect.Effect<void, never, import("effect").Scope.Scope>
  /**
   * Hears every notification's topic on the jobs channel (and "" on each reconnect) for the life of the scope, on
   * the process's one LISTEN connection: the dashboard's live view, which must not open a second one. With
   * `events`, the event log's notifications too (`Queue.eventsTopic`): the connection listens for them only while
   * such an observer is there, and `observe` returns once it does.
   */
  readonly observe: (
    listener: (topic: string) => void,
    options?: { readonly events?: boolean }
  ) => Effect.Effect<void, never, import("effect").Scope.Scope>
  readonly health: Effect.Effect<Health>
}>() {}

export const make = (options: Partial<WakerOptions> = {}) =>
  Effect.gen(function*() {
    const opts = { ...defaultOptions, ...options }
    const queue = yield* Queue.Queue
    const pools = new Map<string, (reason: WakeReason) => void>()
    const pausedChecks = new Map<string, () => boolean>()
    const blockedBy = new Map<string, () => Blocked>()
    const sources = new Map<string, DueSource>()
    const rearmRequests = yield* Q.sliding<void>(1)
    let listener: ListenerState = "connecting"
    let downSince: Date | null = new Date()
    let downReason: string | null = "LISTEN not established yet"
    let reconnects = 0
    let lastReapAt: Date | null = null
    let lastReap: Queue.ReapResult | null = null
    let lastSweepAt: Date | null = null
    // the sweep's cue that the listener changed state: switch between sweeping and polling now, not after a sweep
    const listenerChanged = yield* Q.sliding<void>(1)
    // the sweep asks the next next-due question to mark this process seen in the registry
    let seenDue = false
    let lastSeenAt = 0

    const observers = new Set<(topic: string) => void>()
    // the observers that also hear the event log's notifications
    const eventObservers = new Set<(topic: string) => void>()
    const wakeAll = () => {
      pools.forEach((wake) => wake("catchUp"))
      observers.forEach((o) => o(""))
    }
    const rearm = Effect.asVoid(Q.offer(rearmRequests, undefined))

    // ---- the wake lead of each stage (no thundering herd) ----
    const runFork = yield* FiberSet.runtime(yield* FiberSet.make<void, never>())<never>()
    let listening: Queue.Listening | undefined
    const lead = new Map<string, Lead>()
    const lastTry = new Map<string, number>()
    const retrying = new Set<string>()
    const busyChecks = new Map<string, () => boolean>()
    const lastHelp = new Map<string, number>()
    const tryLead = (stages: ReadonlyArray<string>): Effect.Effect<void> =>
      Effect.suspend(() => {
        const l = listening
        if (l === undefined || listener !== "listening" || stages.length === 0) return Effect.void
        const now = Date.now()
        stages.forEach((s) => lastTry.set(s, now))
        return l.tryLead(stages).pipe(
          Effect.map((led) => {
            // the connection dropped meanwhile: its locks went with it, the next LISTEN tries again
            if (listener !== "listening") return
            for (const s of stages) {
              if (!pools.has(s)) {
                if (led.includes(s)) runFork(Effect.ignore(l.unlead(s)))
              } else if (led.includes(s)) {
                const was = lead.get(s)
                lead.set(s, "leader")
                // NOTIFYs were ignored while another process led: look now
                if (was === "follower") pools.get(s)!("catchUp")
              } else lead.set(s, "follower")
            }
          }),
          Effect.catchAll(() => Effect.void)
        )
      })
    const retryLead = (stage: string) => {
      if (retrying.has(stage)) return
      retrying.add(stage)
      const wait = Math.max(0, (lastTry.get(stage) ?? 0) + Duration.toMillis(opts.leadRetry) - Date.now())
      runFork(Effect.sleep(Duration.millis(wait)).pipe(
        Effect.zipRight(Effect.suspend(() => (lead.get(stage) === "follower" ? tryLead([stage]) : Effect.void))),
        Effect.ensuring(Effect.sync(() => retrying.delete(stage)))
      ))
    }
    const help = (stage: string) => {
      const l = listening
      const now = Date.now()
      if (l === undefined || now - (lastHelp.get(stage) ?? 0) < Duration.toMillis(opts.helpSpacing)) return
      lastHelp.set(stage, now)
      runFork(Effect.ignore(l.notify(Queue.moreTopicPrefix + stage)))
    }
    const notified = (stage: string) => {
      const state = lead.get(stage) ?? "unknown"
      // a follower leaves the job to the leader, unless its pool waits for a freed slot (a capped stage)
      if (state === "follower" && (blockedBy.get(stage)?.() ?? null) === null) return retryLead(stage)
      pools.get(stage)!("notify")
      if (state === "leader" && busyChecks.get(stage)?.() === true) help(stage)
    }
    // a stage's limits changed somewhere: the queue reads them again, and the pools they held back claim under the
    // new ones (a lifted rate limit must not wait for the old bucket's next token)
    const limitsChanged = () => {
      queue.limits.changed()
      pools.forEach((wake, stage) => {
        if ((blockedBy.get(stage)?.() ?? null) !== null) wake("notify")
      })
    }
    const helpAsked = (stage: string) => {
      const wake = pools.get(stage)
      if (wake === undefined || lead.get(stage) === "leader") return
      wake("notify")
      if (lead.get(stage) === "follower") retryLead(stage)
    }

    // LISTEN on a connection Db watches: `onDown` the moment it drops, `onListening` each time it is back
    listening = yield* queue.listen({
      onWake: (stage) => {
        if (stage === Queue.laterTopic) Effect.runSync(rearm)
        else if (stage === Queue.limitsTopic) limitsChanged()
        else if (stage.startsWith(Queue.moreTopicPrefix)) helpAsked(stage.slice(Queue.moreTopicPrefix.length))
        else if (stage === Queue.eventsTopic) return eventObservers.forEach((o) => o(stage))
        else if (pools.has(stage)) notified(stage)
        else sources.get(stage)?.refresh()
        observers.forEach((o) => o(stage))
      },
      onDown: (reason) => {
        lead.clear()
        if (listener !== "down") {
          if (listener === "listening") downSince = new Date()
          listener = "down"
          Effect.runSync(Effect.logWarning(`LISTEN down (${reason}); polling every ${Duration.format(opts.pollInterval)} until it is back`).pipe(
            Effect.annotateLogs({ component: "waker" })
          ))
          Q.unsafeOffer(listenerChanged, undefined)
        }
        downReason = reason
      },
      onListening: () => {
        const wasDown = downSince
        listener = "listening"
        downSince = null
        downReason = null
        reconnects++
        Effect.runSync(Metrics.listenerReconnects(Effect.succeed(1)))
        if (wasDown !== null && reconnects > 1) {
          Effect.runSync(Effect.logInfo(`LISTEN is back after ${((Date.now() - wasDown.getTime()) / 1000).toFixed(1)} s; catching up`).pipe(
            Effect.annotateLogs({ component: "waker" })
          ))
        }
        Q.unsafeOffer(listenerChanged, undefined)
        // a new connection holds no lead: every pool claims on NOTIFY until it knows whether it leads
        lead.clear()
        runFork(tryLead([...pools.keys()]))
        // catch-up: notifications may have been missed while down (a change of limits among them)
        queue.limits.changed()
        wakeAll()
        sources.forEach((s) => s.refresh())
        Effect.runSync(rearm)
      }
    })

    const reap = queue.reapExpired.pipe(
      Effect.tap((result) =>
        Effect.flatMap(Clock.currentTimeMillis, (now) =>
          Effect.sync(() => {
            lastReapAt = new Date(now)
            lastReap = result
          })
        )
      ),
      Effect.tap((r) =>
        r.requeued + r.deadLettered > 0
          ? Effect.logInfo("reaper: expired leases", { requeued: r.requeued, deadLettered: r.deadLettered })
          : Effect.void
      )
    )

    // armNextDueTimer: ask the database what is due; act on what is due now, sleep until the next thing
    // (or a re-arm request). Each firing re-asks first, so heartbeated leases never trigger a useless reap.
    const armNextDueTimer = Effect.gen(function*() {
      yield* Q.take(rearmRequests)
      // a paused stage's due jobs are nobody's; a blocked pool's ready jobs are not due for it: asking would
      // fire the timer at once, again and again
      const blocked = new Map([...blockedBy].map(([stage, f]) => [stage, f()] as const))
      const held = (stage: string) => (pausedChecks.get(stage)?.() ?? false) || (blocked.get(stage) ?? null) !== null
      const seenBy = seenDue ? opts.presence : undefined
      seenDue = false
      const next = yield* queue.nextWake([...pools.keys()].filter((stage) => !held(stage)), seenBy === undefined ? undefined : { seenBy })
      if (next.leaseExpiresInMs === 0) {
        const reaped = yield* reap
        // the reaped jobs are queued now (and NOTIFYed); look again for what remains. Nothing reaped means
        // another process holds the reaper lock or the row is locked: give it a second rather than spin
        const acted = reaped.ran && reaped.requeued + reaped.deadLettered + reaped.removedCancelled > 0
        yield* Effect.sleep(acted ? opts.minTimerSpacing : Duration.seconds(1))
        yield* rearm
        return
      }
      // due now: wake the pools of the stages with due jobs (only those: an idle pool woken for another stage's
      // backlog would claim nothing and ask to re-arm, and the backlog would wake it again, a loop for as long as
      // the backlog lasts); a pool that comes up short asks for the next re-arm itself. A pool that became blocked
      // while the question was out is left alone too
      for (const stage of next.dueNow) {
        const wake = pools.get(stage)
        if (wake !== undefined && (blockedBy.get(stage)?.() ?? null) === null) wake("timer")
      }
      const now = yield* Clock.currentTimeMillis
      const tokenDue: Array<number> = []
      for (const [stage, b] of blocked) {
        if (typeof b !== "number" || pausedChecks.get(stage)?.()) continue
        if (b <= now) pools.get(stage)?.("timer")
        else tokenDue.push(b - now)
      }
      const sourceDue = [...sources.values()].map((s) => [s, s.dueInMs(now)] as const)
      const dueSources = sourceDue.filter(([, ms]) => ms !== null && ms <= 0)
      if (dueSources.length > 0) {
        yield* Effect.forEach(dueSources, ([s]) => s.fire, { discard: true })
        yield* rearm
        return
      }
      const waits = [next.jobDueInMs, next.leaseExpiresInMs, ...tokenDue, ...sourceDue.map(([, ms]) => ms)]
        .filter((ms): ms is number => ms !== null && ms > 0)
      if (waits.length === 0) return
      // whichever comes first, the timer or a re-arm request, the next round asks the database again
      yield* Effect.raceFirst(
        Effect.sleep(Duration.millis(Math.max(Math.min(...waits), Duration.toMillis(opts.minTimerSpacing)))),
        Q.take(rearmRequests)
      )
      yield* rearm
    }).pipe(
      Effect.catchAllCause((cause) =>
        Effect.logWarning("waker timer failed; retrying", cause).pipe(
          Effect.zipRight(Effect.sleep("1 second")),
          Effect.zipRight(rearm)
        )
      ),
      Effect.forever,
      Effect.annotateLogs({ component: "waker" })
    )
    yield* Effect.forkScoped(armNextDueTimer)

    // the safety sweep: covers a lost notification; while LISTEN is down it is the polling loop. A change of the
    // listener's state cuts the wait short, so polling starts the moment LISTEN drops.
    const sweep = Effect.gen(function*() {
      const polling = listener !== "listening"
      const changed = yield* Effect.raceFirst(
        Effect.as(Effect.sleep(polling ? opts.pollInterval : opts.sweepInterval), false),
        Effect.as(Q.take(listenerChanged), true)
      )
      if (changed && listener === "listening") return
      const now = yield* Clock.currentTimeMillis
      lastSweepAt = new Date(now)
      // once per sweep interval (a tenth of slack for the timer's jitter), also while polling every pollInterval
      if (opts.presence !== undefined && now - lastSeenAt >= 0.9 * Duration.toMillis(opts.sweepInterval)) {
        seenDue = true
        lastSeenAt = now
      }
      if (listener !== "listening") {
        wakeAll()
        sources.forEach((s) => s.refresh())
      }
      yield* rearm
    }).pipe(Effect.forever)
    yield* Effect.forkScoped(sweep)

    const register = (stage: string, wake: (reason: WakeReason) => void, paused?: () => boolean, blocked?: () => Blocked, busy?: () => boolean) =>
      Effect.acquireRelease(
        Effect.sync(() => {
          pools.set(stage, wake)
          if (paused) pausedChecks.set(stage, paused)
          if (blocked) blockedBy.set(stage, blocked)
          if (busy) busyChecks.set(stage, busy)
          wake("catchUp")
          runFork(tryLead([stage]))
        }),
        () =>
          Effect.suspend(() => {
            const led = lead.get(stage) === "leader"
            pools.delete(stage)
            pausedChecks.delete(stage)
            blockedBy.delete(stage)
            busyChecks.delete(stage)
            lead.delete(stage)
            const l = listening
            // hand the lead back and ask the others to look (one of them takes the lead on that NOTIFY)
            return led && l !== undefined
              ? l.unlead(stage).pipe(Effect.zipRight(l.notify(Queue.moreTopicPrefix + stage)), Effect.timeout("2 seconds"), Effect.ignore)
              : Effect.void
          })
      ).pipe(Effect.zipRight(rearm))

    const more = (stage: string) => {
      if (lead.get(stage) === "leader") help(stage)
    }

    const registerDue = (source: DueSource) =>
      Effect.acquireRelease(
        Effect.sync(() => {
          sources.set(source.topic, source)
          source.refresh()
        }),
        () => Effect.sync(() => sources.delete(source.topic))
      ).pipe(Effect.zipRight(rearm))

    const health = Effect.sync((): Health => ({
      listener,
      listenerDownSince: downSince,
      listenerDownReason: downReason,
      listenerReconnects: reconnects,
      lastReapAt,
      lastSweepAt,
      lastReap
    }))

    // the event log's channel, listened on while anyone observes it (one LISTEN however many observers)
    const followingEvents = yield* RcRef.make({ acquire: listening.followEvents })
    const observe = (listener: (topic: string) => void, options: { readonly events?: boolean } = {}) =>
      Effect.acquireRelease(
        Effect.sync(() => {
          observers.add(listener)
          if (options.events) eventObservers.add(listener)
        }),
        () =>
          Effect.sync(() => {
            observers.delete(listener)
            eventObservers.delete(listener)
          })
      ).pipe(Effect.zipRight(options.events ? RcRef.get(followingEvents) : Effect.void), Effect.asVoid)

    return Waker.of({ register, more, rearm, registerDue, observe, health })
  })

export const layer = (options: Partial<WakerOptions> = {}) => Layer.scoped(Waker, make(options))
