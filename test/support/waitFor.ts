/**
 * Waits for a condition in a test that runs real processes or a real server: polls `probe` until it holds, with
 * a generous deadline (a loaded machine), never as a measure of speed. Dies naming what it waited for.
 */
import { Duration, Effect } from "effect"

export const waitFor = <A, E, R>(
  what: string,
  probe: Effect.Effect<A | undefined | null | false, E, R>,
  timeout: Duration.DurationInput = Duration.minutes(2),
  every: Duration.DurationInput = Duration.millis(100)
): Effect.Effect<A, E, R> =>
  Effect.gen(function*() {
    const deadline = Date.now() + Duration.toMillis(timeout)
    while (Date.now() < deadline) {
      const value = yield* probe
      if (value !== undefined && value !== null && value !== false) return value as A
      yield* Effect.sleep(every)
    }
    return yield* Effect.dieMessage(`timed out waiting for ${what}`)
  })
