/**
 * Waits for a condition in a test that runs real processes or a real server: polls `probe` until it holds, with
 * a generous deadline (a loaded machine), never as a measure of speed. Dies naming what it waited for. Waits on
 * the real clock, also inside `it.effect` (whose TestClock stands still). `waitForPromise` is the same wait for
 * the tests written with promises (spawned processes, the npm packages); both default to `deadline`.
 */
import { Duration, Effect, TestServices } from "effect"

/** The one default deadline: generous, since two cores are shared with other runs. */
export const deadline: Duration.DurationInput = Duration.minutes(2)

export const waitFor = <A, E, R>(
  what: string,
  probe: Effect.Effect<A | undefined | null | false, E, R>,
  timeout: Duration.DurationInput = deadline,
  every: Duration.DurationInput = Duration.millis(100)
): Effect.Effect<A, E, R> =>
  Effect.gen(function*() {
    const until = Date.now() + Duration.toMillis(timeout)
    while (Date.now() < until) {
      const value = yield* probe
      if (value !== undefined && value !== null && value !== false) return value as A
      // on the real clock: inside `it.effect` the TestClock would never let the sleep end
      yield* TestServices.provideLive(Effect.sleep(every))
    }
    return yield* Effect.dieMessage(`timed out waiting for ${what}`)
  })

/**
 * Waits until `count` (statements sent so far, say) has not changed for `quietFor`: a start-up's burst is over.
 * A condition with a deadline like `waitFor`'s, not a fixed sleep.
 */
export const waitForQuiet = (what: string, count: () => number, quietFor: Duration.DurationInput = Duration.seconds(2)) => {
  let last = -1
  let quietSince = Date.now()
  return waitFor(what, Effect.sync(() => {
    if (count() !== last) {
      last = count()
      quietSince = Date.now()
    }
    return Date.now() - quietSince >= Duration.toMillis(quietFor)
  }))
}

/**
 * `waitFor` for promise-based tests: polls `check` until it holds (a rejection, say a process that exited, ends
 * the wait with it); rejects naming what it waited for once `timeout` has passed.
 */
export const waitForPromise = async <A>(
  what: string,
  check: () => A | undefined | null | false | Promise<A | undefined | null | false>,
  timeout: Duration.DurationInput = deadline,
  every: Duration.DurationInput = Duration.millis(100)
): Promise<A> => {
  const until = Date.now() + Duration.toMillis(timeout)
  while (Date.now() < until) {
    const value = await check()
    if (value !== undefined && value !== null && value !== false) return value
    await new Promise((resolve) => setTimeout(resolve, Duration.toMillis(every)))
  }
  throw new Error(`timed out waiting for ${what}`)
}
