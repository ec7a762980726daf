/**
 * The executor: runs the held jobs' handlers on at most `concurrency` slots and turns each Exit into an outcome
 * value (JobRun), handed to the settler. A slot is a fiber that runs waiting jobs one after another, so a job
 * costs no fiber of its own; interrupting a slot stops its current handler only (a timeout, a lost lease,
 * shutdown): the slot settles that job and ends, and a fresh slot takes over. A slot frees the moment its
 * handler returns, not when the outcome commits.
 *
 * Log lines get the job's id and attempt from the slot at logging time (lazily), not from annotations set per
 * job. Jobs that die without running (attempts spent, a payload that fails its Schema) are settled here too.
 */
import { Cause, type Clock, type Context, Duration, Effect, type Either, Exit, Fiber, FiberRef, HashMap, HashSet, Logger, Runtime, Schema } from "effect"
import * as Spans from "../../layers/Spans.js"
import type { Job } from "../../queue/Job.js"
import * as Outcome from "../../queue/Outcome.js"
import * as Queue from "../../queue/Queue.js"
import * as Tenancy from "../../queue/Tenancy.js"
import * as Events from "../Events.js"
import * as JobRun from "../JobRun.js"
import type * as Settler from "../Settler.js"
import type * as Stage from "../Stage.js"
import type * as Held from "./Held.js"

export interface ExecutorOptions {
  readonly concurrency: number
  /** Most finished jobs whose outcomes are not yet written; past it the slots wait for the settler. */
  readonly maxUnsettled: number
  /** A slot freed or outcomes settled: the claimer's cue. */
  readonly onCapacity: () => void
  /** Each handler's run time (ms) as it returns. */
  readonly onRan: (ms: number) => void
  /** Deciding a job's outcome failed and the job was dropped (its lease and the reaper own it). */
  readonly onDropped: () => void
}

export const make = <A, I, R>(
  stage: Stage.Stage<A, I, R>,
  held: Held.Held,
  settler: { readonly post: (finished: Settler.Finished) => void },
  options: ExecutorOptions
) =>
  Effect.gen(function*() {
    const { concurrency, maxUnsettled } = options
    const events = yield* Events.current
    const decode = Schema.decodeUnknownEither(stage.payload)
    // the Clock service (TestClock in tests), read without an effect per job
    const clock = yield* Effect.clock
    const traced = yield* Spans.isTraced
    const slots = new Set<Held.Slot>()
    const slotByFiber = new Map<number, Held.Slot>()
    const fork = Runtime.runFork(yield* slotRuntime<R>(stage.name, slotByFiber))
    let stopped = false
    const { finish, ran, done } = handOverOf(held, settler, clock, options)

    // finished jobs whose outcomes are not yet written are what a crash would repeat: past the cap (a slow or
    // absent database), the slots wait for the settler instead of running more
    const mayStart = () => !stopped && held.waiting > 0 && held.settling < maxUnsettled

    /** The next waiting job that should run, started on `slot`; those that die without running settle here. */
    const startNext = (slot: Held.Slot): { entry: Held.Entry; payload: A } | undefined => {
      while (mayStart()) {
        const next = readyToRun(held.nextWaiting()!, decode, stage.name)
        if ("died" in next) {
          finish(next.entry, next.died, undefined)
          continue
        }
        held.start(next.entry, slot, clock.unsafeCurrentTimeMillis())
        return next
      }
      return undefined
    }

    const runSlot = (slot: Held.Slot) =>
      Effect.uninterruptibleMask((restore) => {
        /** Takes the next waiting job and runs it; its outcome's continuation takes the one after (no effect per job in between). */
        const next = (): Effect.Effect<void, never, R> => {
          const taken = startNext(slot)
          if (taken === undefined) return Effect.void
          const { entry, payload } = taken
          if (events.active()) publishStarted(events, entry)
          return Effect.matchCauseEffect(restore(handlerOf(stage, entry, payload, traced, progressOf(entry, events, clock))), {
            // the common case: the outcome is decided and handed over here, and the slot goes straight on
            onSuccess: (value) => {
              const runMs = ran(entry)
              done(entry, JobRun.decideSuccess(stage, entry.job, value, runMs, entry.lease), runMs)
              return next()
            },
            onFailure: (cause) => {
              const runMs = ran(entry)
              const decided = JobRun.decideExit(stage, entry.job, Exit.failCause(cause), entry, runMs)
              return afterFailure(decided, Cause.isInterrupted(cause), (d) => done(entry, d, runMs), next, startWaiting)
            }
          })
        }
        return Effect.fiberIdWith((id) => {
          slotByFiber.set(id.id, slot)
          return Effect.suspend(next).pipe(Effect.ensuring(Effect.sync(() => {
            slotByFiber.delete(id.id)
            slots.delete(slot)
          })))
        })
      }).pipe(
        Effect.catchAllCause((cause) =>
          // deciding an outcome itself failed (a policy that throws): the job is left to its lease and the reaper
          Effect.logError("could not decide the job's outcome; the reaper will requeue it", cause).pipe(
            Effect.zipRight(Effect.sync(() => {
              dropCurrent(held, slot, options.onDropped)
              startWaiting()
            }))
          )
        )
      )

    /** Starts slots for waiting jobs, up to the concurrency; a slot takes jobs until none wait. */
    function startWaiting() {
      // a slot forked here may take its first job at once or on its first turn: count the idle ones each time
      while (mayStart() && slots.size < concurrency && held.waiting > idleSlots(slots)) {
        const slot: Held.Slot = { current: undefined, fiber: undefined }
        slots.add(slot)
        slot.fiber = fork(runSlot(slot))
      }
      options.onCapacity()
    }

    const releaseWaiting = () => {
      for (const entry of held.finishWaiting()) settler.post({ job: entry.job, decided: released(entry), seconds: undefined })
    }

    return {
      /** Takes claimed jobs into the held value and starts as many as there are free slots. */
      accept: (jobs: ReadonlyArray<Job>) => {
        for (const job of jobs) {
          const { superseded } = held.accept(job, job.timeoutMs ?? Duration.toMillis(stage.timeout))
          // claimed again while an older run of it still holds a slot here: that run's lease is dead, stop it
          const fiber = superseded?.mode === "running" ? superseded.slot?.fiber : undefined
          if (fiber) fork(stopOlderRun(job, fiber))
        }
        // accepted after shutdown stopped the starts: they go back at once, like every job that never started
        if (stopped) releaseWaiting()
        startWaiting()
      },
      /** Outcomes were written: slots held back by the unsettled cap may go on. */
      startWaiting,
      /** Jobs claimed but never started go back at once, with no attempt spent (shutdown, a lost lease). */
      release: (entries: ReadonlyArray<Held.Entry>) => {
        for (const entry of entries) finish(entry, released(entry), undefined)
      },
      /** Stops starting jobs; those claimed and not started go back. */
      stopStarting: () => {
        stopped = true
        releaseWaiting()
      },
      /** Interrupts every running handler; each settles as released. */
      interruptRunning: Effect.suspend(() => Effect.forEach(fibersOf(slots), Fiber.interrupt, { discard: true })),
      /** Waits until no handler runs. */
      awaitNoneRunning: Effect.suspend(() => Effect.forEach(fibersOf(slots), Fiber.await, { discard: true }))
    }
  })

const payloadError = (e: unknown) => {
  const message = (e as { message?: unknown })?.message
  return typeof message === "string" ? message : String(e)
}

/** Log lines from a slot carry its current job's id and attempt, looked up when a line is logged. */
const withJobOf = (slotByFiber: ReadonlyMap<number, Held.Slot>) => (logger: Logger.Logger<unknown, unknown>) =>
  Logger.make<unknown, unknown>((o) => {
    const entry = o.fiberId._tag === "Runtime" ? slotByFiber.get(o.fiberId.id)?.current : undefined
    logger.log(entry === undefined ? o : {
      ...o,
      annotations: HashMap.set(HashMap.set(o.annotations, "jobId", entry.job.id), "attempt", entry.job.attempts + 1)
    })
  })

/** The handler's progress reports: kept for the next heartbeat, published at once to in-process subscribers. */
const progressOf = (entry: Held.Entry, events: Context.Tag.Service<Events.JobEvents>, clock: Clock.Clock) => (value: number, message?: string) =>
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

const publishStarted = (events: Context.Tag.Service<Events.JobEvents>, entry: Held.Entry) => {
  const job = entry.job
  events.publish([{
    _tag: "Started", jobId: job.id, stage: job.stage, orgId: job.orgId, attempt: job.attempts + 1,
    at: new Date(entry.startedAt), workerId: job.lockedBy ?? ""
  }])
}

/** The stage's handler for one job, under the job's org, in a span when tracing is on. */
const handlerOf = <A, I, R>(
  stage: Stage.Stage<A, I, R>,
  entry: Held.Entry,
  payload: A,
  traced: boolean,
  progress: Stage.JobInfo["progress"]
): Effect.Effect<unknown, unknown, R> => {
  const job = entry.job
  const info = JobRun.jobInfo(job, { timeout: Duration.millis(entry.timeoutMs), progress })
  const run = JobRun.underJobOrg(job, stage.handler(payload, info))
  return traced
    ? Effect.withSpan(run, `stage.${stage.name}`, { attributes: { jobId: job.id, attempt: job.attempts + 1 }, captureStackTrace: false })
    : run
}

/** Claimed again while an older run of it still holds a slot here: that run's lease is dead, so it is stopped. */
const stopOlderRun = (job: Job, fiber: Fiber.RuntimeFiber<void, never>) =>
  Effect.zipRight(
    Effect.logWarning("lease lost (the job was claimed again after its lease expired); stopping the older run").pipe(
      Effect.annotateLogs({ jobId: job.id })
    ),
    Fiber.interruptFork(fiber)
  )

/**
 * Hands a job's outcome to the settler; its slot (if it had one) is free from here on. A progress report the
 * heartbeat has not written yet (it writes at most one a second) goes with the outcome: the finished job shows
 * its handler's last report.
 */
const handOverOf = (
  held: Held.Held,
  settler: { readonly post: (finished: Settler.Finished) => void },
  clock: Clock.Clock,
  options: ExecutorOptions
) => {
  const finish = (entry: Held.Entry, decided: JobRun.Decided, seconds: number | undefined) => {
    held.finish(entry)
    const reported = entry.reported
    if (reported !== undefined) {
      entry.reported = undefined
      decided = { ...decided, outcome: { ...decided.outcome, progress: reported } }
    }
    settler.post({ job: entry.job, decided, seconds })
  }
  return {
    finish,
    /** The handler returned: its run time, told to the claimer's sizing. */
    ran: (entry: Held.Entry) => {
      const runMs = clock.unsafeCurrentTimeMillis() - entry.startedAt
      options.onRan(runMs)
      return runMs
    },
    /** A run's outcome goes to the settler; its slot is free. */
    done: (entry: Held.Entry, decided: JobRun.Decided, runMs: number) => {
      finish(entry, decided, runMs / 1000)
      options.onCapacity()
    }
  }
}

/**
 * After a handler failed or was interrupted: its outcome (decided at once, or through the stage's policy) is
 * handed over; an interrupted slot ends here (its interruption would hit the next handler) and a fresh one takes
 * over, any other goes on to the next job.
 */
const afterFailure = <R>(
  decided: JobRun.Decided | Effect.Effect<JobRun.Decided>,
  interrupted: boolean,
  done: (decided: JobRun.Decided) => void,
  next: () => Effect.Effect<void, never, R>,
  startWaiting: () => void
): Effect.Effect<void, never, R> => {
  if (Effect.isEffect(decided)) {
    const settled = Effect.map(decided, done)
    return interrupted ? Effect.zipRight(settled, Effect.sync(startWaiting)) : Effect.zipRight(settled, Effect.suspend(next))
  }
  done(decided)
  if (!interrupted) return next()
  startWaiting()
  return Effect.void
}

/** A waiting job with its decoded payload, or the outcome of a job that dies without running. */
const readyToRun = <A>(
  entry: Held.Entry,
  decode: (u: unknown) => Either.Either<A, unknown>,
  stageName: string
): { readonly entry: Held.Entry; readonly payload: A } | { readonly entry: Held.Entry; readonly died: JobRun.Decided } => {
  const early = JobRun.exhaustedOnClaim(entry.job)
  if (early) return { entry, died: early }
  const payload = decode(entry.job.payload)
  if (payload._tag === "Left") {
    return { entry, died: JobRun.invalidPayload(entry.job, `payload does not match the ${stageName} schema: ${payloadError(payload.left)}`) }
  }
  return { entry, payload: payload.right }
}

/** The slots inherit the pool's context and the stage's annotation, set once; their log lines name their job. */
const slotRuntime = <R>(stageName: string, slotByFiber: ReadonlyMap<number, Held.Slot>) =>
  Effect.gen(function*() {
    const loggers = yield* FiberRef.get(FiberRef.currentLoggers)
    return yield* Effect.runtime<R | Queue.Queue>().pipe(
      Tenancy.asOwner,
      Effect.annotateLogs({ stage: stageName }),
      Effect.locally(FiberRef.currentLoggers, HashSet.map(loggers, withJobOf(slotByFiber)))
    )
  })

/** A job that never started goes back with no attempt spent. */
const released = (entry: Held.Entry): JobRun.Decided => ({ outcome: Outcome.release(entry.lease), kind: "defect" })

const fibersOf = (slots: ReadonlySet<Held.Slot>) => [...slots].flatMap((slot) => (slot.fiber ? [slot.fiber] : []))

const idleSlots = (slots: ReadonlySet<Held.Slot>) => {
  let n = 0
  for (const slot of slots) if (slot.current === undefined) n++
  return n
}

/** Deciding the outcome of a slot's job failed: the job is dropped, left to its lease and the reaper. */
const dropCurrent = (held: Held.Held, slot: Held.Slot, onDropped: () => void) => {
  const entry = slot.current
  if (entry === undefined) return
  held.drop(entry)
  onDropped()
}
