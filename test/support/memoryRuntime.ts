/**
 * For runtime tests on the in-memory layers: the worker options they share, and a way to let forked fibers run
 * without moving the TestClock.
 */
import { Duration, Effect } from "effect"
import type * as Worker from "../../packages/pgfiber/src/runtime/Worker.js"

/** A 10 s grace, a sweep an hour apart (it never runs in a test), a poll a second apart. */
export const workerOptions = (workerId: string, overrides: Partial<Worker.WorkerOptions> = {}): Worker.WorkerOptions => ({
  workerId,
  shutdownGrace: Duration.seconds(10),
  sweepInterval: Duration.hours(1),
  pollInterval: Duration.seconds(1),
  concurrency: {},
  ...overrides
})

/** Lets forked fibers run without moving the clock. */
export const settle = Effect.gen(function*() {
  for (let i = 0; i < 50; i++) yield* Effect.yieldNow()
})
