/**
 * A duration in milliseconds from the environment: the one reader behind every `*_MS` variable. An integer held
 * to its bounds, validated before the default is attached, so an invalid value fails (naming the variable) rather
 * than falling back; only a missing one takes `fallback`, and with no `fallback` a missing one is an error for
 * the caller to make optional (`Config.option`).
 *
 * The message says the bounds: "must be a number of milliseconds from 100 to 60000", "… 1000 or more", or
 * "must be a positive number of milliseconds" (`min: 1`, no `max`).
 */
import { Config, Duration } from "effect"

export interface Bounds {
  readonly min: number
  readonly max?: number | undefined
  /** Taken when the variable is not set. */
  readonly fallback?: Duration.DurationInput | undefined
}

export const message = ({ min, max }: Bounds): string =>
  max !== undefined
    ? `must be a number of milliseconds from ${min} to ${max}`
    : min === 1
    ? "must be a positive number of milliseconds"
    : `must be a number of milliseconds, ${min} or more`

export const config = (name: string, bounds: Bounds): Config.Config<Duration.Duration> => {
  const read = Config.integer(name).pipe(
    Config.validate({
      message: message(bounds),
      validation: (n) => n >= bounds.min && (bounds.max === undefined || n <= bounds.max)
    }),
    Config.map(Duration.millis)
  )
  return bounds.fallback === undefined ? read : Config.withDefault(read, Duration.decode(bounds.fallback))
}
