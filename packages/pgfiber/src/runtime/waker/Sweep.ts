/**
 * The safety sweep: covers a lost notification by re-arming the timer every `sweepInterval` (one statement when
 * idle, which also marks this process's stages seen in the registry); while LISTEN is down it is the polling loop,
 * waking every pool each `pollInterval`. A change of the listener's mode cuts the wait short, so polling starts
 * the moment LISTEN drops and stops the moment it is back.
 */
import { Clock, Duration, Effect, Queue as Q } from "effect"
import type { WakerState } from "./State.js"

export interface SweepOptions {
  readonly sweepInterval: Duration.Duration
  readonly pollInterval: Duration.Duration
  /** Whether the next-due question marks this process seen (once per sweep interval, also while polling). */
  readonly presence: boolean
}

export const sweep = (
  state: WakerState,
  /** The listener changed mode: switch between sweeping and polling now, not after a sweep. */
  listenerChanged: Q.Dequeue<void>,
  /** Every pool claims, every due source refreshes (a poll while LISTEN is down). */
  catchUp: () => void,
  rearm: Effect.Effect<void>,
  options: SweepOptions
) =>
  Effect.gen(function*() {
    const polling = !state.listening
    const changed = yield* Effect.raceFirst(
      Effect.as(Effect.sleep(polling ? options.pollInterval : options.sweepInterval), false),
      Effect.as(Q.take(listenerChanged), true)
    )
    if (changed && state.listening) return
    const now = yield* Clock.currentTimeMillis
    state.swept(now, options.presence ? Duration.toMillis(options.sweepInterval) : null)
    if (!state.listening) catchUp()
    yield* rearm
  }).pipe(Effect.forever)
