/**
 * A pool's shutdown, run when its scope closes: stop claiming (a claim in flight finishes and hands its jobs
 * back), release what never started, wait up to the grace period for the running handlers, interrupt and
 * release the rest, and write every outcome (the releases included) before the scope closes.
 *
 * One deadline, the grace, for the claim in flight and the running handlers; the outcomes then get what is left of
 * it, at least `settleAfterGrace`. Whatever is still open at each limit is named in the log and left to its lease
 * (the reaper requeues it), so no fault of the database holds the process past its grace.
 */
import { Clock, Duration, Effect, Fiber, Option } from "effect"
import type { Claimer } from "./Claimer.js"
import type { Core } from "./Core.js"
import type * as Held from "./Held.js"

/**
 * After the grace, how long shutdown still waits for outcomes to be written (the releases of interrupted jobs):
 * milliseconds when the database answers; when it does not, more seconds rarely help, and an outcome not written
 * is not lost (its lease expires and the job runs again).
 */
const settleAfterGrace = Duration.seconds(2)

export const finalizer = (core: Core, claimer: Claimer, grace: Duration.Duration) =>
  Effect.gen(function*() {
    const graceEnds = (yield* Clock.currentTimeMillis) + Duration.toMillis(grace)
    const graceLeft = Effect.map(Clock.currentTimeMillis, (now) => Duration.millis(Math.max(0, graceEnds - now)))
    // the claimer ends by itself once told; only the grace cuts its last claim short (a database that never answers)
    yield* claimer.stop
    // nothing claimed and not started runs from here on (a claim that lands now goes straight back: Claimer.ts)
    core.stopStarting()
    const claimEnded = yield* Fiber.await(claimer.fiber).pipe(Effect.interruptible, Effect.timeout(grace), Effect.interruptible, Effect.option)
    if (Option.isNone(claimEnded)) {
      yield* Effect.logWarning("grace period over with a claim still in flight; the jobs it took, if any, go back when their leases expire")
    }
    yield* Fiber.interrupt(claimer.fiber).pipe(Effect.asVoid)
    const busy = core.held.running
    if (busy > 0) {
      yield* Effect.logInfo(`shutting down: waiting up to ${Duration.format(yield* graceLeft)} for ${busy} job(s)`)
    }
    // finalizers run uninterruptibly; the wait must be interruptible or the timeout could not cut it short
    const drained = yield* core.awaitNoneRunning.pipe(
      Effect.interruptible,
      Effect.timeout(yield* graceLeft),
      Effect.interruptible,
      Effect.option
    )
    if (Option.isNone(drained)) {
      const running = describeRunning(core.held.entries(), yield* Clock.currentTimeMillis)
      yield* Effect.logWarning(`grace period over: interrupting ${core.held.running} job(s) and releasing them: ${running}`)
      yield* core.interruptRunning
    }
    // every outcome, the releases included, is written before the pool's scope closes, unless the database is away
    const settled = yield* core.awaitIdle.pipe(
      Effect.interruptible,
      Effect.timeout(Duration.max(yield* graceLeft, settleAfterGrace)),
      Effect.interruptible,
      Effect.option
    )
    if (Option.isNone(settled)) {
      yield* Effect.logWarning(
        `shutting down with ${core.held.size} outcome(s) not written (the database does not answer); their leases expire and the reaper requeues those jobs`
      )
    }
  })

/** The running jobs, for the log line that says what the grace period cut short. */
const describeRunning = (entries: Iterable<Held.Entry>, now: number) =>
  [...entries].filter((e) => e.mode === "running").map((e) => `${e.job.id} (running ${((now - e.startedAt) / 1000).toFixed(1)} s)`).join(", ")
