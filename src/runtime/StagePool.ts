/**
 * StagePool: one stage's supervised pool. It claims in batches sized to its free capacity when the Waker says
 * there is work, runs each job in its own fiber (through JobRun, which maps the job's Exit to the queue) with
 * the leases heartbeated, and group-commits plain completions. A failing handler never takes the pool down;
 * a lost database pauses claiming until it is back. Closing the pool's scope is shutdown: stop claiming,
 * drain within the grace period, interrupt and release the rest.
 */
import { Clock, Deferred, Duration, Effect, Fiber, FiberSet, Metric, Option, Queue as Q, Schedule, Scope } from "effect"
import * as JobRun from "./JobRun.js"
import * as Metrics from "./Metrics.js"
import type * as Stage from "./Stage.js"
import * as Waker from "./Waker.js"
import type { Job, Lease } from "../queue/Job.js"
import * as Queue from "../queue/Queue.js"

export interface PoolOptions {
  readonly workerId: string
  /** How long shutdown waits for in-flight jobs before interrupting and releasing them. */
  readonly shutdownGrace: Duration.Duration
  /** Overrides the stage's own concurrency (e.g. from configuration). */
  readonly concurrency?: number | undefined
  /** Where the pool reports its state for health checks. */
  readonly health?: Map<string, PoolHealth> | undefined
}

export interface PoolHealth {
  readonly stage: string
  readonly state: "running" | "stopping"
  readonly concurrency: number
  readonly inFlight: number
  /** The claim loop is retrying because the database does not answer. */
  readonly paused: boolean
  readonly lastClaimAt: Date | null
}

/** A failed group commit keeps trying through a database blip; past this the leases have expired. */
const completeRetry = Schedule.exponential("100 millis").pipe(
  Schedule.union(Schedule.spaced("5 seconds")),
  Schedule.upTo("2 minutes")
)

export const run = <A, I, R>(stage: Stage.Stage<A, I, R>, options: PoolOptions) =>
  Effect.gen(function*() {
    const queue = yield* Queue.Queue
    const waker = yield* Waker.Waker
    const concurrency = Math.max(1, options.concurrency ?? stage.concurrency)
    const claimOptions = { workerId: options.workerId, leaseFor: stage.leaseFor }
    const claimedMetric = Metrics.forStage(Metrics.claimed, stage.name)
    const releasedMetric = Metrics.forStage(Metrics.released, stage.name)

    // every job this pool holds a lease on: running (fiber set) or buffered (claimed ahead, not started yet)
    const inFlight = new Map<string, {
      lease: Lease
      fiber: Fiber.RuntimeFiber<void> | undefined
      startedAt?: number
      settling?: boolean
      timedOut?: boolean
    }>()
    const buffered: Array<Job> = []
    let running = 0
    // handlers finished, outcomes not yet recorded, whose slots were handed on (at most stage.settleAhead)
    let settlingFreed = 0
    // the last claim came back full: there is a backlog, so claim a batch ahead to keep every slot busy
    let backlog = false
    let stopping = false
    let paused = false
    let lastClaimAt: Date | null = null
    options.health?.set(stage.name, {
      get stage() { return stage.name },
      get state() { return stopping ? "stopping" as const : "running" as const },
      get concurrency() { return concurrency },
      get inFlight() { return running },
      get paused() { return paused },
      get lastClaimAt() { return lastClaimAt }
    })
    yield* Effect.addFinalizer(() => Effect.sync(() => options.health?.delete(stage.name)))
    // set by a wake-up or a full batch: there may be more to claim once capacity frees
    let moreWork = false
    const signal = yield* Q.sliding<void>(1)
    const poke = () => Q.unsafeOffer(signal, undefined)
    const fibers = yield* FiberSet.make<void>()

    // group commit: completions queue up while one batch is in flight, then go out together
    const completions = yield* Q.unbounded<{ readonly lease: Lease; readonly done: Deferred.Deferred<boolean> }>()
    const completer = Effect.gen(function*() {
      const first = yield* Q.takeBetween(completions, 1, 1000)
      // let the jobs finishing right now join this batch rather than the next one
      yield* Effect.yieldNow()
      const batch = [...first, ...(yield* Q.takeUpTo(completions, 1000))]
      const leases = batch.map((c) => c.lease)
      const ok = yield* queue.completeMany(leases).pipe(
        Effect.tapError((e) => Effect.logWarning("completing a batch failed; retrying", e.message)),
        Effect.retry(completeRetry),
        Effect.orElseSucceed(() => null)
      )
      const held = new Set(ok ?? [])
      for (const c of batch) yield* Deferred.succeed(c.done, ok !== null && held.has(c.lease.id))
    }).pipe(Effect.forever)
    yield* Effect.forkScoped(completer)

    const completeOne = (lease: Lease) =>
      Effect.flatMap(Deferred.make<boolean>(), (done) =>
        Q.offer(completions, { lease, done }).pipe(Effect.zipRight(Deferred.await(done))))

    const runJob = (job: Job) => {
      // a job keeps its slot until its outcome is recorded, so a crash repeats at most `concurrency` finished
      // handlers (plus the stage's settleAhead, when it allows handing the slot on early); the heartbeat
      // leaves a finished job alone (its lease may just have been released)
      let slotHeld = true
      const handlerDone = Effect.sync(() => {
        const entry = inFlight.get(job.id)
        if (entry) entry.settling = true
        if (settlingFreed < stage.settleAhead) {
          slotHeld = false
          running--
          settlingFreed++
          if (!stopping && (moreWork || buffered.length > 0)) poke()
        }
      })
      const timedOut = () => inFlight.get(job.id)?.timedOut === true
      return JobRun.execute(stage, job, { completeOne, onHandlerDone: handlerDone, onRequeued: waker.rearm, timedOut }).pipe(
        Effect.ensuring(
          Effect.sync(() => {
            inFlight.delete(job.id)
            if (slotHeld) running--
            else settlingFreed--
            if (!stopping && (moreWork || buffered.length > 0)) poke()
          })
        ),
        Effect.asVoid
      )
    }

    const startBuffered = Effect.gen(function*() {
      while (!stopping && running < concurrency && buffered.length > 0) {
        const job = buffered.shift()!
        const entry = inFlight.get(job.id)
        if (!entry) continue // its lease was lost while it waited
        running++
        entry.startedAt = yield* Clock.currentTimeMillis
        entry.fiber = yield* FiberSet.run(fibers, runJob(job))
      }
    })

    // claimReady: one statement fills free capacity; with a backlog it also claims one batch ahead, so the
    // next jobs are in hand when slots free. A lost database pauses here until it is back.
    const claimLoop = Effect.gen(function*() {
      yield* Q.take(signal)
      yield* startBuffered
      while (!stopping && moreWork) {
        const ahead = concurrency + stage.settleAhead
        const limit = backlog ? concurrency + ahead : concurrency
        const want = limit - running - buffered.length
        // under a backlog, refill the jobs in hand only once they run low: fewer, larger claims
        if (want <= 0 || (backlog && buffered.length > Math.floor(ahead / 2))) break
        moreWork = false
        const jobs = yield* queue.claim(stage.name, want, claimOptions).pipe(
          Effect.tapError((e) =>
            Effect.zipRight(
              Effect.sync(() => (paused = true)),
              Effect.logWarning("claim failed; pausing until the database answers", e.message)
            )
          ),
          Effect.retry(Schedule.exponential("200 millis").pipe(Schedule.union(Schedule.spaced("5 seconds")))),
          Effect.orDie
        )
        paused = false
        lastClaimAt = new Date()
        if (jobs.length > 0) yield* Metric.incrementBy(claimedMetric, jobs.length)
        if (stopping) {
          // shutdown began while the claim was in flight: hand them straight back
          yield* queue.release(jobs).pipe(Effect.ignore)
          break
        }
        for (const job of jobs) {
          inFlight.set(job.id, { lease: { id: job.id, lease: job.lease }, fiber: undefined })
          buffered.push(job)
        }
        backlog = jobs.length === want
        if (backlog) moreWork = true
        else yield* waker.rearm
        yield* startBuffered
      }
    }).pipe(
      Effect.catchAllCause((cause) => Effect.logError("claim loop failed; continuing", cause)),
      Effect.forever,
      Effect.annotateLogs({ stage: stage.name })
    )
    yield* Effect.forkScoped(claimLoop)

    // heartbeats: one statement for all of the pool's leases; a lease not extended was lost or cancelled
    const heartbeatEvery = Duration.millis(Math.max(50, Duration.toMillis(stage.leaseFor) / 3))
    const heartbeat = Effect.gen(function*() {
      yield* Effect.sleep(heartbeatEvery)
      const held = [...inFlight.values()].map((e) => e.lease)
      if (held.length === 0) return
      const extended = new Set(yield* queue.heartbeat(held, stage.leaseFor))
      for (const lease of held) {
        const entry = inFlight.get(lease.id)
        // a finished job's outcome may have been committed after this heartbeat read its lease
        if (extended.has(lease.id) || !entry || entry.settling) continue
        if (entry.fiber) {
          yield* Effect.logWarning("lease lost (cancelled or expired); stopping the job").pipe(
            Effect.annotateLogs({ stage: stage.name, jobId: lease.id })
          )
          yield* Fiber.interruptFork(entry.fiber)
        } else {
          // never started: forget it, and hand back a cancelled one so it is removed
          inFlight.delete(lease.id)
          yield* queue.release([lease]).pipe(Effect.ignore)
        }
      }
    }).pipe(
      Effect.catchAllCause((cause) => Effect.logWarning("heartbeat failed", cause)),
      Effect.forever
    )
    yield* Effect.forkScoped(heartbeat)

    // the stage's timeout, for every running handler from one loop rather than a timer per job
    const timeoutMs = Duration.toMillis(stage.timeout)
    const watchdog = Effect.gen(function*() {
      yield* Effect.sleep(Duration.millis(Math.min(1000, Math.max(10, timeoutMs / 4))))
      const now = yield* Clock.currentTimeMillis
      for (const entry of inFlight.values()) {
        if (entry.fiber && !entry.settling && !entry.timedOut && entry.startedAt !== undefined && now - entry.startedAt >= timeoutMs) {
          entry.timedOut = true
          yield* Fiber.interruptFork(entry.fiber)
        }
      }
    }).pipe(Effect.forever)
    yield* Effect.forkScoped(watchdog)

    // shutdown: registered last, so it runs first when the scope closes
    yield* Effect.addFinalizer(() =>
      Effect.gen(function*() {
        stopping = true
        // jobs claimed ahead never started: hand them back at once
        const notStarted = buffered.splice(0).map((job) => inFlight.get(job.id)?.lease).filter((l): l is Lease => l !== undefined)
        if (notStarted.length > 0) {
          notStarted.forEach((l) => inFlight.delete(l.id))
          const released = yield* queue.release(notStarted).pipe(
            Effect.retry({ schedule: completeRetry, while: (e) => e.unavailable }),
            Effect.orElseSucceed(() => [])
          )
          yield* Metric.incrementBy(releasedMetric, released.length)
        }
        const busy = inFlight.size
        if (busy > 0) {
          yield* Effect.logInfo(`shutting down: waiting up to ${Duration.format(options.shutdownGrace)} for ${busy} job(s)`)
        }
        // finalizers run uninterruptibly; the wait must be interruptible or the timeout could not cut it short
        const drained = yield* FiberSet.awaitEmpty(fibers).pipe(
          Effect.interruptible,
          Effect.timeout(options.shutdownGrace),
          Effect.interruptible,
          Effect.option
        )
        if (Option.isNone(drained)) {
          yield* Effect.logWarning(`grace period over: interrupting ${inFlight.size} job(s) and releasing them`)
          yield* FiberSet.clear(fibers)
        }
      }).pipe(Effect.annotateLogs({ stage: stage.name }))
    )

    yield* waker.register(stage.name, () => {
      moreWork = true
      poke()
    })
  })

/** The stage as a Layer: its pool runs for the life of the layer. */
export const scoped = <A, I, R>(stage: Stage.Stage<A, I, R>, options: PoolOptions): Effect.Effect<void, never, Queue.Queue | Waker.Waker | R | Scope.Scope> =>
  run(stage, options) as Effect.Effect<void, never, Queue.Queue | Waker.Waker | R | Scope.Scope>
