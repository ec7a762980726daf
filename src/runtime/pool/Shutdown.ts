/**
 * A pool's shutdown, run when its scope closes: stop claiming (a claim in flight finishes and hands its jobs
 * back), release what never started, wait up to the grace period for the running handlers, interrupt and
 * release the rest, and write every outcome (the releases included) before the scope closes.
 */
import { Duration, Effect, Fiber, Option } from "effect"
import type { Claimer } from "./Claimer.js"
import type { Core } from "./Core.js"

export const finalizer = (core: Core, claimer: Claimer, grace: Duration.Duration) =>
  Effect.gen(function*() {
    // the claimer ends by itself once told; only a database that never answers cuts its last claim short
    yield* claimer.stop
    yield* Fiber.await(claimer.fiber).pipe(Effect.interruptible, Effect.timeout(Duration.seconds(30)), Effect.interruptible, Effect.ignore)
    yield* Fiber.interrupt(claimer.fiber).pipe(Effect.asVoid)
    core.stopStarting()
    const busy = core.held.running
    if (busy > 0) {
      yield* Effect.logInfo(`shutting down: waiting up to ${Duration.format(grace)} for ${busy} job(s)`)
    }
    // finalizers run uninterruptibly; the wait must be interruptible or the timeout could not cut it short
    const drained = yield* core.awaitNoneRunning.pipe(
      Effect.interruptible,
      Effect.timeout(grace),
      Effect.interruptible,
      Effect.option
    )
    if (Option.isNone(drained)) {
      yield* Effect.logWarning(`grace period over: interrupting ${core.held.running} job(s) and releasing them`)
      yield* core.interruptRunning
    }
    // every outcome, the releases included, is written before the pool's scope closes
    yield* core.awaitIdle.pipe(Effect.interruptible, Effect.timeout(Duration.minutes(2)), Effect.interruptible, Effect.ignore)
  })
