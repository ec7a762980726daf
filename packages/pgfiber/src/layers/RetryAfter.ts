/**
 * HTTP `Retry-After` (RFC 9110 §10.2.3), read one way by every client here (SpeechKit, the transcription
 * service): delay-seconds or an HTTP-date, relative to `now` (epoch millis).
 *
 * - delay-seconds: digits, as seconds; a fraction (`1.5`) is not in the RFC but costs nothing to honour.
 * - an HTTP-date (IMF-fixdate, RFC 850 or asctime: a day or month name and a clock time): the time until it,
 *   and zero for a date in the past ("now").
 * - anything else (empty, negative, `soon`, a bare year that `Date.parse` would take) is None: the caller's
 *   default applies.
 *
 * No cap here: a caller that bounds the wait (SpeechKit's `SPEECHKIT_MAX_RETRY_AFTER_MS`) applies its own.
 */
import { Duration, Option } from "effect"

export const parse = (value: string | undefined, now: number): Option.Option<Duration.Duration> => {
  const trimmed = value?.trim() ?? ""
  if (/^\d+(\.\d+)?$/.test(trimmed)) return Option.some(Duration.millis(Math.round(Number(trimmed) * 1000)))
  // Date.parse alone is too lenient ("-1" is a year), so require a date's shape: a name and a clock time.
  const at = /[A-Za-z]{3}/.test(trimmed) && /\d{2}:\d{2}:\d{2}/.test(trimmed) ? Date.parse(trimmed) : Number.NaN
  return Number.isNaN(at) ? Option.none() : Option.some(Duration.millis(Math.max(0, at - now)))
}
