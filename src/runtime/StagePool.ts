/**
 * StagePool: one stage's supervised pool, in named parts that share one table of held leases.
 *
 * - claimer (`run` only): when the Waker says there is work, one statement claims a batch sized to free
 *   capacity, plus a batch ahead while there is a backlog; a lost database pauses it until it is back.
 * - executor: runs each claimed job's handler in a fiber of its own (so each is interruptible alone:
 *   timeout, lease loss, shutdown) and turns its Exit into an outcome value (JobRun). Its slot frees the
 *   moment the handler returns, and the next waiting job starts at once.
 * - settler (Settler.ts): writes the outcome values in batches, one statement each, while the next batch
 *   accumulates.
 * - heartbeat and watchdog: one loop extends every held lease in one statement and stops a job whose lease
 *   was lost; one loop interrupts handlers past the stage's timeout.
 * - shutdown (`run` only): stop claiming, release what never started, drain within the grace period,
 *   interrupt and release the rest, settle everything, then close.
 * `once` (what `tick` runs) is the same executor, settler and heartbeat with one claim instead of a claimer.
 *
 * Invariants every part keeps:
 * 1. A job is in `held` from its claim until its outcome is settled (or given up on): exactly one of
 *    waiting (claimed, not started), running (its fiber has the slot) or settling (outcome handed over).
 * 2. At most `concurrency` jobs are running; a slot frees when the handler returns, not when its outcome
 *    commits. So a crash repeats at most the running jobs plus those finished within one settle window.
 * 3. Nothing touches the queue for a job except through its lease; the database fences stale leases.
 * 4. A job that never started is released, never retried: it spent no attempt.
 */
import { Cause, Clock, Duration, Effect, Exit, Fiber, FiberRef, HashMap, HashSet, Logger, Metric, Option, Queue as Q, Runtime, Schedule, Schema, Scope } from "effect"
import * as Db from "../layers/Db.js"
import * as Spans from "../layers/Spans.js"
import * as ClaimSizing from "./ClaimSizing.js"
import * as Events from "./Events.js"
import * as JobRun from "./JobRun.js"
import * as Metrics from "./Metrics.js"
import * as Settler from "./Settler.js"
import * as Stage from "./Stage.js"
import * as StageControl from "./StageControl.js"
import * as Waker from "./Waker.js"
import type { Job, Lease } from "../queue/Job.js"
import * as Outcome from "../queue/Outcome.js"
import * as Limits from "../queue/Limits.js"
import * as Queue from "../queue/Queue.js"

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
  readonly inFlight: number
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

type Phase = "waiting" | "running" | "settling"

interface Slot {
  current: Held | undefined
  fiber: Fiber.RuntimeFiber<void, never> | undefined
}

interface Held {
  readonly job: Job
  readonly lease: Lease
  phase: Phase
  /** The slot running it (while running): interrupting the slot's fiber stops this job's handler. */
  slot: Slot | undefined
  startedAt: number
  timedOut: boolean
  leaseLost: boolean
  /** This run's timeout in ms (the job's own, else the stage's). */
  readonly timeoutMs: number
  /** The latest progress the handler reported and not yet written by a heartbeat. */
  reported: Queue.Progress | undefined
  /** When a heartbeat last wrote this job's progress (ms): at most once a second. */
  reportedAt: number
}

export type Counts = Record<Outcome.Settled | "unrecorded", number>

// ---- the core: executor, settler, heartbeat and watchdog over one table of held leases --------------------

/** Most jobs claimed ahead of the slots under a backlog: 500 (graphile-worker's documented local queue) for fast jobs. */
export const maxAheadFor = (concurrency: number) => Math.max(concurrency, Math.min(50 * concurrency, 500))

/**
 * Most finished jobs a pool holds with their outcomes not yet written: two full claims' worth. In normal running
 * the settle window keeps it far lower for any job that takes a few ms (what finishes during one or two settle
 * statements); it binds only when the database is slow or away, and it is the hard cap on what a crash repeats
 * beyond the running jobs. It must exceed one claim: a pool of very short jobs finishes a whole claim before its
 * settle commits, and a lower cap made the next claim wait for that commit (100 for concurrency 10 cost a fifth
 * of the no-op drain; docs/benchmarks.md).
 */
export const maxUnsettledFor = (concurrency: number) => Math.max(10 * concurrency, 2 * (concurrency + maxAheadFor(concurrency)))

const makeCore = <A, I, R>(
  stage: Stage.Stage<A, I, R>,
  concurrency: number,
  onRequeued: Effect.Effect<void>,
  wakeFreed: () => boolean = () => false,
  /** Each handler's run time (ms) as it returns: the claimer sizes its claims by it. */
  onRan: (ms: number) => void = () => undefined
) =>
  Effect.gen(function*() {
    const maxUnsettled = maxUnsettledFor(concurrency)
    const queue = yield* Queue.Queue
    const held = new Map<string, Held>()
    const events = yield* Events.current
    const timeoutMs = Duration.toMillis(stage.timeout)
    const waiting: Array<Held> = []
    let running = 0
    const counts: Counts = { completed: 0, retried: 0, rescheduled: 0, deadLettered: 0, released: 0, fenced: 0, unrecorded: 0 }
    const idleWaiters: Array<() => void> = []
    // called whenever a slot frees or outcomes settle: the claimer's cue (set by `run`)
    let onCapacity: () => void = () => undefined

    const checkIdle = () => {
      if (held.size === 0 && idleWaiters.length > 0) idleWaiters.splice(0).forEach((resume) => resume())
    }

    const settler = yield* Settler.make(stage, {
      requeued: onRequeued,
      wakeFreed,
      settled: (batch, results) => {
        for (let i = 0; i < batch.length; i++) {
          const job = batch[i]!.job
          // a released job may already be claimed again by this pool, under a new lease: keep that entry
          if (held.get(job.id)?.job === job) held.delete(job.id)
          counts[results[i]!]++
        }
        startWaiting()
        checkIdle()
      }
    })

    // ---- executor ----
    // A slot is a fiber that runs jobs one after another while jobs wait, so a job costs no fiber of its own.
    // Interrupting a slot stops its current handler only: the slot settles that job and ends, and a fresh
    // slot takes over. Log lines get the job's id and attempt from the slot at logging time (lazily), not
    // from annotations set per job.
    const decode = Schema.decodeUnknownEither(stage.payload)
    // the Clock service (TestClock in tests), read without an effect per job
    const clock = yield* Effect.clock
    const traced = yield* Spans.isTraced
    const slots = new Set<Slot>()
    const slotByFiber = new Map<number, Slot>()
    const withJob = (logger: Logger.Logger<unknown, unknown>) =>
      Logger.make<unknown, unknown>((o) => {
        const entry = o.fiberId._tag === "Runtime" ? slotByFiber.get(o.fiberId.id)?.current : undefined
        logger.log(entry === undefined ? o : {
          ...o,
          annotations: HashMap.set(HashMap.set(o.annotations, "jobId", entry.job.id), "attempt", entry.job.attempts + 1)
        })
      })
    const loggers = yield* FiberRef.get(FiberRef.currentLoggers)
    // the slots inherit this fiber's context and the stage's annotation, set once for the pool
    const runtime = yield* Effect.runtime<R | Queue.Queue>().pipe(
      Db.asOwner,
      Effect.annotateLogs({ stage: stage.name }),
      Effect.locally(FiberRef.currentLoggers, HashSet.map(loggers, withJob))
    )
    const fork = Runtime.runFork(runtime)

    /** Hands a job's outcome to the settler; its slot (if it had one) is free from here on. */
    const finish = (entry: Held, decided: JobRun.Decided, seconds: number | undefined) => {
      if (entry.phase === "running") running--
      entry.phase = "settling"
      settler.post({ job: entry.job, decided, seconds })
    }

    /** The handler's progress reports: kept for the next heartbeat, published at once to in-process subscribers. */
    const progressOf = (entry: Held) => (value: number, message?: string) =>
      Effect.sync(() => {
        if (!Number.isFinite(value)) return
        const text = message === undefined ? null : message.slice(0, Queue.maxProgressMessage)
        entry.reported = { value, message: text }
        if (events.active()) {
          const job = entry.job
          events.publish([{
            _tag: "Progress", jobId: job.id, stage: job.stage, orgId: job.orgId, attempt: job.attempts + 1,
            at: new Date(clock.unsafeCurrentTimeMillis()), progress: value, message: text
          }])
        }
      })

    const handlerOf = (entry: Held, payload: A): Effect.Effect<unknown, unknown, R> => {
      const job = entry.job
      const info = JobRun.jobInfo(job, { timeout: Duration.millis(entry.timeoutMs), progress: progressOf(entry) })
      const run = JobRun.underJobOrg(job, stage.handler(payload, info))
      return traced
        ? Effect.withSpan(run, `stage.${stage.name}`, { attributes: { jobId: job.id, attempt: job.attempts + 1 }, captureStackTrace: false })
        : run
    }

    /** The next waiting job that should run; those that die without running (spent, bad payload) settle here. */
    const takeNext = (): { entry: Held; payload: A } | undefined => {
      // finished jobs whose outcomes are not yet written are what a crash would repeat: past the cap (a slow or
      // absent database), the slots wait for the settler instead of running more
      while (!stopped && waiting.length > 0 && held.size - running - waiting.length < maxUnsettled) {
        const entry = waiting.shift()!
        const early = JobRun.exhaustedOnClaim(entry.job)
        if (early) {
          finish(entry, early, undefined)
          continue
        }
        const payload = decode(entry.job.payload)
        if (payload._tag === "Left") {
          finish(entry, JobRun.invalidPayload(entry.job, `payload does not match the ${stage.name} schema: ${payloadError(payload.left)}`), undefined)
          continue
        }
        return { entry, payload: payload.right }
      }
      return undefined
    }

    const runSlot = (slot: Slot) =>
      Effect.uninterruptibleMask((restore) => {
        const next: Effect.Effect<void, never, R> = Effect.suspend(() => {
          const taken = takeNext()
          if (taken === undefined) return Effect.void
          const { entry, payload } = taken
          slot.current = entry
          entry.phase = "running"
          entry.slot = slot
          running++
          entry.startedAt = clock.unsafeCurrentTimeMillis()
          if (events.active()) {
            const job = entry.job
            events.publish([{
              _tag: "Started", jobId: job.id, stage: job.stage, orgId: job.orgId, attempt: job.attempts + 1,
              at: new Date(entry.startedAt), workerId: job.lockedBy ?? ""
            }])
          }
          return Effect.flatMap(Effect.exit(restore(handlerOf(entry, payload))), (exit) => {
            const runMs = clock.unsafeCurrentTimeMillis() - entry.startedAt
            const seconds = runMs / 1000
            onRan(runMs)
            const decided = JobRun.decideExit(stage, entry.job, exit, entry, runMs)
            const done = (d: JobRun.Decided) => {
              slot.current = undefined
              entry.slot = undefined
              finish(entry, d, seconds)
              onCapacity()
            }
            const settled = Effect.isEffect(decided) ? Effect.map(decided, done) : Effect.sync(() => done(decided))
            // an interrupted slot ends here (its interruption would hit the next handler); a fresh one takes over
            return Exit.isFailure(exit) && Cause.isInterrupted(exit.cause) ? Effect.zipRight(settled, Effect.sync(startWaiting)) : Effect.zipRight(settled, next)
          })
        })
        return Effect.fiberIdWith((id) => {
          slotByFiber.set(id.id, slot)
          return next.pipe(Effect.ensuring(Effect.sync(() => {
            slotByFiber.delete(id.id)
            slots.delete(slot)
          })))
        })
      }).pipe(
        Effect.catchAllCause((cause) =>
          // deciding an outcome itself failed (a policy that throws): the job is left to its lease and the reaper
          Effect.logError("could not decide the job's outcome; the reaper will requeue it", cause).pipe(
            Effect.zipRight(Effect.sync(() => {
              const entry = slot.current
              if (entry) {
                if (entry.phase === "running") running--
                held.delete(entry.job.id)
                counts.unrecorded++
              }
              startWaiting()
              checkIdle()
            }))
          )
        )
      )

    let stopped = false
    /** Starts slots for waiting jobs, up to the concurrency; a slot takes jobs until none wait. */
    function startWaiting() {
      // a slot forked here may take its first job at once or on its first turn: count the idle ones each time
      const idle = () => {
        let n = 0
        for (const slot of slots) if (slot.current === undefined) n++
        return n
      }
      while (!stopped && slots.size < concurrency && waiting.length > idle() && held.size - running - waiting.length < maxUnsettled) {
        const slot: Slot = { current: undefined, fiber: undefined }
        slots.add(slot)
        slot.fiber = fork(runSlot(slot))
      }
      onCapacity()
    }

    /** Takes claimed jobs into the table and starts as many as there are free slots. */
    const accept = (jobs: ReadonlyArray<Job>) => {
      for (const job of jobs) {
        const entry: Held = {
          job, lease: { id: job.id, lease: job.lease }, phase: "waiting", slot: undefined, startedAt: 0, timedOut: false,
          leaseLost: false, timeoutMs: job.timeoutMs ?? timeoutMs, reported: undefined, reportedAt: 0
        }
        held.set(job.id, entry)
        waiting.push(entry)
      }
      startWaiting()
    }

    /** Jobs claimed but never started go back at once, with no attempt spent (shutdown, a lost lease). */
    const releaseWaiting = (entries: ReadonlyArray<Held>) => {
      for (const entry of entries) finish(entry, { outcome: Outcome.release(entry.lease), kind: "defect" }, undefined)
    }

    // ---- heartbeat: one statement for every held lease; a lease not extended was lost or cancelled ----
    const heartbeatEvery = Stage.heartbeatEvery(stage.leaseFor)
    yield* Effect.forkScoped(
      Effect.gen(function*() {
        yield* Effect.sleep(heartbeatEvery)
        if (held.size === 0) return
        // progress rides on the beat: each job's latest report, written at most once a second
        const now = clock.unsafeCurrentTimeMillis()
        const leases = [...held.values()].map((e): Queue.Beat => {
          if (e.reported === undefined || e.phase !== "running" || now - e.reportedAt < 1000) return e.lease
          const reported = e.reported
          e.reported = undefined
          e.reportedAt = now
          return { ...e.lease, reported }
        })
        const extended = new Set(yield* queue.heartbeat(leases, stage.leaseFor))
        for (const lease of leases) {
          const entry = held.get(lease.id)
          // a settling job's outcome may have been committed after this heartbeat read its lease
          if (extended.has(lease.id) || !entry || entry.phase === "settling") continue
          entry.leaseLost = true
          const fiber = entry.slot?.fiber
          if (entry.phase === "running" && fiber) {
            yield* Effect.logWarning("lease lost (cancelled or expired); stopping the job").pipe(
              Effect.annotateLogs({ stage: stage.name, jobId: lease.id })
            )
            yield* Fiber.interruptFork(fiber)
          } else if (entry.phase === "waiting") {
            waiting.splice(waiting.indexOf(entry), 1)
            releaseWaiting([entry])
          }
        }
      }).pipe(
        Effect.catchAllCause((cause) => Effect.logWarning("heartbeat failed", cause)),
        Effect.forever
      )
    )

    // ---- watchdog: the stage's timeout for every running handler from one loop, not a timer per job ----
    // a job's own timeout (NewJob.timeout) overrides the stage's; the loop looks at least once a second
    yield* Effect.forkScoped(
      Effect.gen(function*() {
        yield* Effect.sleep(Duration.millis(Math.min(1000, Math.max(10, timeoutMs / 4))))
        const now = yield* Clock.currentTimeMillis
        for (const entry of held.values()) {
          const fiber = entry.slot?.fiber
          if (entry.phase === "running" && fiber && !entry.timedOut && now - entry.startedAt >= entry.timeoutMs) {
            entry.timedOut = true
            yield* Fiber.interruptFork(fiber)
          }
        }
      }).pipe(Effect.forever)
    )

    return {
      accept,
      counts,
      held,
      waiting,
      get running() {
        return running
      },
      get settling() {
        return held.size - running - waiting.length
      },
      set onCapacity(f: () => void) {
        onCapacity = f
      },
      /** Stops starting jobs; those claimed and not started go back. */
      stopStarting: () => {
        stopped = true
        releaseWaiting(waiting.splice(0))
      },
      releaseWaiting,
      /** Interrupts every running handler; each settles as released. */
      interruptRunning: Effect.suspend(() =>
        Effect.forEach([...slots].flatMap((slot) => (slot.fiber ? [slot.fiber] : [])), Fiber.interrupt, { discard: true })
      ),
      /** Waits until every held job is settled. */
      awaitIdle: Effect.async<void>((resume) => {
        if (held.size === 0) return resume(Effect.void)
        idleWaiters.push(() => resume(Effect.void))
      }),
      /** Waits until no handler runs. */
      awaitNoneRunning: Effect.suspend(() => {
        const fibers = [...slots].flatMap((slot) => (slot.fiber ? [slot.fiber] : []))
        return Effect.forEach(fibers, Fiber.await, { discard: true })
      })
    }
  })

const payloadError = (e: unknown) => {
  const message = (e as { message?: unknown })?.message
  return typeof message === "string" ? message : String(e)
}

/** A failed claim is retried at most a second apart, for as long as it takes. */
const claimRetry = Db.outageRetry("100 millis")

/** Handing back a claim that landed during shutdown keeps trying through a database blip, as a claim does; past this the leases have expired and the reaper requeues them. */
const releaseRetry = claimRetry.pipe(Schedule.upTo("2 minutes"))

// ---- run: the core plus the claimer and shutdown, woken by the Waker --------------------------------------

export const run = <A, I, R>(stage: Stage.Stage<A, I, R>, options: PoolOptions) =>
  Effect.gen(function*() {
    const queue = yield* Queue.Queue
    const waker = yield* Waker.Waker
    const { concurrency, shares } = configured(stage, options)
    const claimOptions = { workerId: options.workerId, leaseFor: stage.leaseFor, shares }
    const claimedMetric = Metrics.forStage(Metrics.claimed, stage.name)
    // held back by the stage's limits (told by the last claim): until the next token, or until a slot frees
    let blocked: Waker.Blocked = null
    // caps in code or configuration, or seen in a claim (a run-time override): settles wake other processes
    let capsSeen = shares.maxRunning !== null || shares.maxRunningPerOrg !== null
    // claiming ahead would spend tokens and cap slots on jobs that only wait here
    let limited = Limits.isLimited(shares)
    // the claim-ahead buffer, sized in time from measured run times and claim round trips (ClaimSizing.ts)
    let sizing = ClaimSizing.initial(concurrency, maxAheadFor(concurrency))
    const core = yield* makeCore(stage, concurrency, waker.rearm, () => capsSeen, (ms) => {
      sizing = ClaimSizing.ran(sizing, ms)
    })
    const control = options.control ?? StageControl.none

    let stopping = false
    let paused = false
    let lastClaimAt: Date | null = null
    options.health?.set(stage.name, {
      get stage() { return stage.name },
      get state() { return stopping ? "stopping" as const : "running" as const },
      get concurrency() { return concurrency },
      get inFlight() { return core.running },
      get paused() { return paused },
      get stagePaused() { return control.isPaused(stage.name) },
      get lastClaimAt() { return lastClaimAt },
      get rateLimited() { return typeof blocked === "number" && blocked > Date.now() },
      get capped() { return blocked === "capacity" }
    })
    yield* Effect.addFinalizer(() => Effect.sync(() => options.health?.delete(stage.name)))

    // ---- claimer ----
    // moreWork: a wake-up or a full batch says there may be more to claim once capacity frees
    let moreWork = false
    // backlog: the last claim came back full, so claim a buffer ahead to keep every slot busy (ClaimSizing.ts)
    let backlog = false
    // the next-due timer woke this pool: it sleeps until asked again, so re-arm it after the claim
    let rearmAfterClaim = false
    const maxSettling = maxUnsettledFor(concurrency)
    const clock = yield* Effect.clock
    const signal = yield* Q.sliding<void>(1)
    const poke = () => Q.unsafeOffer(signal, undefined)
    core.onCapacity = () => {
      if (!stopping && moreWork) poke()
    }

    const claimFailed = (e: Queue.QueueError) =>
      Effect.zipRight(
        Effect.sync(() => (paused = true)),
        Effect.logWarning("claim failed; pausing until the database answers", e.message)
      )
    const claimLoop = Effect.gen(function*() {
      yield* Q.take(signal)
      while (!stopping && moreWork) {
        const inHand = core.running + core.waiting.length
        const ahead = backlog && !limited ? ClaimSizing.ahead(sizing) : 0
        const want = concurrency + ahead - inHand
        // under a backlog, refill only once the waiting jobs fall to half the buffer: fewer, larger claims
        if (want <= 0 || (backlog && core.waiting.length > ClaimSizing.refillAt(sizing)) || core.settling >= maxSettling) break
        // paused by an operator: claim nothing (moreWork stays set; resuming pokes the loop)
        if (control.isPaused(stage.name)) break
        moreWork = false
        const sentAt = clock.unsafeCurrentTimeMillis()
        const claim = queue.claimBatch(stage.name, want, claimOptions)
        // retried only once it has failed: a wake-up's claim builds no retry (0.25 ms of a cold process's time)
        const result = yield* Effect.catchAll(claim, (e) =>
          Effect.zipRight(claimFailed(e), Effect.retry(Effect.tapError(claim, claimFailed), claimRetry).pipe(Effect.orDie)))
        const jobs = result.jobs
        sizing = ClaimSizing.claimed(sizing, clock.unsafeCurrentTimeMillis() - sentAt)
        paused = false
        lastClaimAt = new Date()
        blocked = result.rateLimitedForMs !== null ? Date.now() + result.rateLimitedForMs : result.capped ? "capacity" : null
        if (result.capped) capsSeen = true
        if (blocked !== null) limited = true
        if (jobs.length > 0) yield* Metric.incrementBy(claimedMetric, jobs.length)
        if (stopping) {
          // shutdown began while the claim was in flight: hand them straight back
          yield* queue.release(jobs).pipe(Effect.retry({ schedule: releaseRetry, while: (e) => e.unavailable }), Effect.ignore)
          break
        }
        backlog = jobs.length === want
        if (backlog) moreWork = true
        core.accept(jobs)
        // the timer must hear of what is due later only when it woke us (it then sleeps until asked), when a limit
        // holds the pool back (its next token is a due time), or when there was nothing at all (a wake-up we cannot
        // place); a short claim at a steady rate asks nothing more: one claim and one settle per job
        if (!backlog && (rearmAfterClaim || blocked !== null || jobs.length === 0)) {
          rearmAfterClaim = false
          yield* waker.rearm
        }
      }
    }).pipe(
      Effect.catchAllCause((cause) => Effect.logError("claim loop failed; continuing", cause)),
      // ends by itself once shutdown begins, so a claim in flight is never cut off between commit and release
      Effect.repeat({ until: () => stopping }),
      Effect.annotateLogs({ stage: stage.name })
    )
    const claimer = yield* Effect.forkScoped(claimLoop)

    // ---- shutdown: registered last, so it runs first when the scope closes ----
    yield* Effect.addFinalizer(() =>
      Effect.gen(function*() {
        stopping = true
        // the claimer sees `stopping` and ends; a claim in flight finishes and hands its jobs back first (a claim
        // interrupted mid-statement might have committed unseen). Only a database that never answers cuts it short.
        poke()
        yield* Fiber.await(claimer).pipe(Effect.interruptible, Effect.timeout(Duration.seconds(30)), Effect.interruptible, Effect.ignore)
        yield* Fiber.interrupt(claimer).pipe(Effect.asVoid)
        core.stopStarting()
        const busy = core.running
        if (busy > 0) {
          yield* Effect.logInfo(`shutting down: waiting up to ${Duration.format(options.shutdownGrace)} for ${busy} job(s)`)
        }
        // finalizers run uninterruptibly; the wait must be interruptible or the timeout could not cut it short
        const drained = yield* core.awaitNoneRunning.pipe(
          Effect.interruptible,
          Effect.timeout(options.shutdownGrace),
          Effect.interruptible,
          Effect.option
        )
        if (Option.isNone(drained)) {
          yield* Effect.logWarning(`grace period over: interrupting ${core.running} job(s) and releasing them`)
          yield* core.interruptRunning
        }
        // every outcome, the releases included, is written before the pool's scope closes
        yield* core.awaitIdle.pipe(Effect.interruptible, Effect.timeout(Duration.minutes(2)), Effect.interruptible, Effect.ignore)
      }).pipe(Effect.annotateLogs({ stage: stage.name }))
    )

    const wake = (reason: Waker.WakeReason) => {
      // a wake-up (a NOTIFY, a slot freed, the next token) lifts the block until the next claim says otherwise
      blocked = null
      if (reason === "timer") rearmAfterClaim = true
      moreWork = true
      poke()
    }
    // resumed: the timer left this stage's delayed jobs out while it was paused
    control.onResume(stage.name, () => wake("timer"))
    yield* waker.register(stage.name, wake, () => control.isPaused(stage.name), () => blocked)
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

export interface OnceOptions {
  readonly workerId: string
  readonly max: number
  /** Wraps the claim, e.g. in `db.withOrg` so row-level security limits it to one org's jobs. */
  readonly claimScope?: <X, E, RC>(claim: Effect.Effect<X, E, RC>) => Effect.Effect<X, E | Queue.QueueError, RC>
  /** This process's configuration over the stage's concurrency and limits, as a worker's pool takes them. */
  readonly concurrency?: number | undefined
  readonly limits?: Partial<Limits.Override> | undefined
}

/**
 * Claims up to `max` (at most the stage's concurrency) jobs once, runs them, settles them, and returns the counts.
 * The claim keeps the stage's limits as a worker's would: caps, token buckets and fair shares.
 */
export const once = <A, I, R>(stage: Stage.Stage<A, I, R>, options: OnceOptions) =>
  Effect.scoped(
    Effect.gen(function*() {
      const queue = yield* Queue.Queue
      const claimScope = options.claimScope ?? (<X, E, RC>(e: Effect.Effect<X, E, RC>) => e)
      const { concurrency, shares } = configured(stage, options)
      const limit = Math.min(Math.max(0, Math.floor(options.max)), concurrency)
      const jobs = limit === 0 ? [] : yield* claimScope(queue.claim(stage.name, limit, { workerId: options.workerId, leaseFor: stage.leaseFor, shares }))
      if (jobs.length === 0) return { claimed: 0, counts: undefined }
      yield* Metric.incrementBy(Metrics.forStage(Metrics.claimed, stage.name), jobs.length)
      const core = yield* makeCore(stage, concurrency, Effect.void)
      core.accept(jobs)
      // interrupted (the caller gave up): release what runs, then wait for the writes
      yield* core.awaitIdle.pipe(
        Effect.onInterrupt(() => Effect.zipRight(core.interruptRunning, core.awaitIdle))
      )
      return { claimed: jobs.length, counts: { ...core.counts } }
    })
  )
