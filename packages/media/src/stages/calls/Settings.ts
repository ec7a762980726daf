/**
 * What the call stages can be tuned by: the transcribe_poll schedule and deadline, whether the recognizer may
 * read `file://` URIs, where temporaries go, and the Transient backoff. Options given to `makeCallStages`
 * win; the rest come from the environment (read when a handler runs), then from the defaults here.
 */
import { Config, Duration, Effect, Option } from "effect"
import * as Os from "node:os"
import * as JobError from "pgfiber/internal/JobError.js"
import * as Millis from "pgfiber/internal/layers/Millis.js"
import * as SpeechKit from "../../layers/SpeechKit.js"
import type * as Limits from "pgfiber/internal/queue/Limits.js"
import type * as RetryPolicy from "pgfiber/internal/runtime/RetryPolicy.js"

/** What Retention.ts removes once a call's transcript is stored (the environment's part is `Retention.config`). */
export interface RetentionOptions {
  /** Remove the uploaded recording (the `source` artifact) after the transcript is stored. Default false. */
  readonly removeSource?: boolean | undefined
  /** Remove the OGG Opus audio (the `audio` artifact) after the transcript is stored. Default true. */
  readonly removeAudio?: boolean | undefined
}

export interface CallStageOptions extends RetentionOptions {
  /** The first poll waits max(pollFirstMin, audio duration × pollFirstFraction). Default 5 s and 1/6. */
  readonly pollFirstMin?: Duration.DurationInput | undefined
  readonly pollFirstFraction?: number | undefined
  /** Each later wait is the previous one × pollFactor (default 1.5), at most pollCap (default 60 s). */
  readonly pollFactor?: number | undefined
  readonly pollCap?: Duration.DurationInput | undefined
  /** Give up (dead-letter) when the recognition is not done this long after it started. Default 24 h. */
  readonly pollDeadline?: Duration.DurationInput | undefined
  /** Re-submissions of a recognition that ended with gRPC code 4, 13 or 14. Default 2. */
  readonly maxResubmits?: number | undefined
  /** Audio longer (all channels together) or larger than this is refused before starting. Default SpeechKit's 4 h, 1 GB. */
  readonly maxAudioDuration?: Duration.DurationInput | undefined
  readonly maxAudioBytes?: number | undefined
  /** Let transcribe_start hand the recognizer `file://` URIs (the local simulator). Default false. */
  readonly allowFileUris?: boolean | undefined
  /** Where extract_audio makes its temporary directories. Default the OS temp directory. */
  readonly tempDir?: string | undefined
  /** The Transient backoff of every call stage (tests shorten it). Default per stage. */
  readonly backoff?: RetryPolicy.Backoff | undefined
  readonly concurrency?: Partial<Record<CallStageName, number>> | undefined
  /** A run longer than this is interrupted and counts as a failure (defaults per stage, see docs/calls.md). */
  readonly timeout?: Partial<Record<CallStageName, Duration.DurationInput>> | undefined
  /** How long a claim holds without a heartbeat (default 30 s; analyze 10 s). */
  readonly leaseFor?: Partial<Record<CallStageName, Duration.DurationInput>> | undefined
  /** Fair shares, global caps and rate limits per stage (default: SpeechKit's quotas, `speechKitQuotas`). */
  readonly limits?: Partial<Record<CallStageName, Limits.StageLimits>> | undefined
}

/**
 * SpeechKit's documented quotas per folder: 500 recognition requests and 2,500 operation status checks an
 * hour. Shared by every worker process through the stages' token buckets; a burst lets a quiet hour's first
 * calls start at once, so any one hour may see the burst over the hourly rate (a 429's Retry-After still
 * backs off as before).
 */
export const speechKitQuotas = {
  transcribe_start: { rate: { limit: 500, per: "1 hour", burst: 20 } },
  transcribe_poll: { rate: { limit: 2_500, per: "1 hour", burst: 50 } }
} satisfies Partial<Record<CallStageName, Limits.StageLimits>>

export type CallStageName = "extract_audio" | "transcribe_start" | "transcribe_poll" | "analyze"

/** The handler-time settings, every one resolved. */
export interface Settings {
  readonly pollFirstMin: Duration.Duration
  readonly pollFirstFraction: number
  readonly pollFactor: number
  readonly pollCap: Duration.Duration
  readonly pollDeadline: Duration.Duration
  readonly allowFileUris: boolean
  readonly tempDir: string
  readonly maxResubmits: number
  readonly maxAudioDuration: Duration.Duration
  readonly maxAudioBytes: number
}

export const defaults = {
  pollFirstMin: Duration.seconds(5),
  pollFirstFraction: 1 / 6,
  pollFactor: 1.5,
  pollCap: Duration.seconds(60),
  pollDeadline: Duration.hours(24),
  maxResubmits: 2
} as const

/**
 * The environment's part: `TRANSCRIBE_POLL_CAP_MS`, `TRANSCRIBE_POLL_DEADLINE_MS`, `SPEECHKIT_ALLOW_FILE_URIS`,
 * `SPEECHKIT_MAX_RESUBMITS`, `MEDIA_TEMP_DIR` (and the retention switches, see Retention.ts).
 */
export const config = Config.all({
  pollCap: Config.option(Millis.config("TRANSCRIBE_POLL_CAP_MS", { min: 1 })),
  pollDeadline: Config.option(Millis.config("TRANSCRIBE_POLL_DEADLINE_MS", { min: 1 })),
  allowFileUris: Config.boolean("SPEECHKIT_ALLOW_FILE_URIS").pipe(Config.withDefault(false)),
  maxResubmits: Config.option(
    Config.integer("SPEECHKIT_MAX_RESUBMITS").pipe(Config.validate({ message: "must be 0 or more", validation: (n) => n >= 0 }))
  ),
  tempDir: Config.option(Config.nonEmptyString("MEDIA_TEMP_DIR"))
})

/** Options over environment over defaults. A bad variable is Permanent: no retry fixes configuration. */
export const resolve = (options: CallStageOptions): Effect.Effect<Settings, JobError.Permanent> =>
  Effect.map(config, (env) => ({
    pollFirstMin: options.pollFirstMin !== undefined ? Duration.decode(options.pollFirstMin) : defaults.pollFirstMin,
    pollFirstFraction: options.pollFirstFraction ?? defaults.pollFirstFraction,
    pollFactor: options.pollFactor ?? defaults.pollFactor,
    pollCap: options.pollCap !== undefined
      ? Duration.decode(options.pollCap)
      : Option.getOrElse(env.pollCap, () => defaults.pollCap),
    pollDeadline: options.pollDeadline !== undefined
      ? Duration.decode(options.pollDeadline)
      : Option.getOrElse(env.pollDeadline, () => defaults.pollDeadline),
    allowFileUris: options.allowFileUris ?? env.allowFileUris,
    maxResubmits: options.maxResubmits ?? Option.getOrElse(env.maxResubmits, () => defaults.maxResubmits),
    maxAudioDuration: options.maxAudioDuration !== undefined ? Duration.decode(options.maxAudioDuration) : SpeechKit.limits.maxDuration,
    maxAudioBytes: options.maxAudioBytes ?? SpeechKit.limits.maxBytes,
    tempDir: options.tempDir ?? Option.getOrElse(env.tempDir, () => Os.tmpdir())
  })).pipe(
    Effect.mapError((error) => new JobError.Permanent({ message: `call pipeline configuration: ${String(error)}` }))
  )

/** The wait before the first poll: the recognizer needs roughly a sixth of the audio's length. */
export const firstPollAfter = (settings: Settings, audioDurationMs: number): Duration.Duration =>
  Duration.max(settings.pollFirstMin, Duration.millis(Math.round(audioDurationMs * settings.pollFirstFraction)))

/** The wait after poll number `polls` (0 for the first run) found the operation still running. */
export const nextPollAfter = (settings: Settings, audioDurationMs: number, polls: number): Duration.Duration => {
  const grown = Duration.toMillis(firstPollAfter(settings, audioDurationMs)) * settings.pollFactor ** (polls + 1)
  return Duration.min(settings.pollCap, Duration.millis(Math.round(Math.min(grown, Number.MAX_SAFE_INTEGER))))
}
