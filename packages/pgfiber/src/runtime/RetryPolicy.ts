/**
 * A stage's retry policy, as data: each error tag maps to a Schedule, a reschedule or dead-letter. Delays are
 * computed from the job's stored attempt count, so the delay a job gets does not depend on which process ran it.
 */
import { Chunk, Duration, Effect, Option, Schedule } from "effect"
import type { NotReady, RateLimited } from "../JobError.js"

export type Decision =
  | { readonly _tag: "Retry"; readonly delay: Duration.Duration }
  | { readonly _tag: "Reschedule"; readonly delay: Duration.Duration }
  | { readonly _tag: "DeadLetter"; readonly reason: string }

const deadLetterMarker = Symbol.for("pgfiber/RetryPolicy/deadLetter")
/** Use as a policy entry: the error dead-letters the job at once. */
export const deadLetter = { [deadLetterMarker]: true } as const
export type DeadLetterEntry = typeof deadLetter

/** A Schedule is stepped once per attempt: attempt n gets the delay of the schedule's n-th recurrence. */
export type Backoff = Schedule.Schedule<unknown, unknown, never>

export interface RetryPolicy {
  readonly Transient: Backoff | DeadLetterEntry
  readonly RateLimited: ((e: RateLimited) => Duration.Duration) | Backoff | DeadLetterEntry
  /** Polls: wait `interval` (or the error's hint) and look again, at most `budget` times. */
  readonly NotReady: {
    readonly interval: Duration.DurationInput | ((polls: number) => Duration.Duration)
    readonly budget: number
  } | DeadLetterEntry
  readonly Permanent: DeadLetterEntry
  /** Defects (a thrown bug) and handler timeouts; by default the Transient schedule. */
  readonly Defect?: Backoff | DeadLetterEntry
}

/** Capped exponential backoff with jitter: base, base×2, base×4 … never above cap. */
export const exponential = (options: { readonly base: Duration.DurationInput; readonly cap: Duration.DurationInput; readonly jitter?: boolean }): Backoff => {
  const cap = Duration.decode(options.cap)
  const schedule = Schedule.exponential(options.base).pipe(
    Schedule.modifyDelay((_, d) => Duration.min(d, cap))
  )
  return (options.jitter ?? true)
    ? Schedule.jittered(schedule).pipe(Schedule.modifyDelay((_, d) => Duration.min(d, cap)))
    : schedule
}

/** Seed 004's curve, the default: 1 s, 2 s, 4 s … capped at 60 s, jittered. */
export const defaultBackoff = exponential({ base: "1 second", cap: "60 seconds" })

/** The 30 s…10 min curve, for slow outside services (SpeechKit, transcription): 30 s × 2^n, capped at 10 minutes. */
export const slowBackoff = exponential({ base: "30 seconds", cap: "10 minutes" })

export const defaultPolicy: RetryPolicy = {
  Transient: defaultBackoff,
  RateLimited: (e) => e.retryAfter,
  NotReady: { interval: "5 seconds", budget: 10_000 },
  Permanent: deadLetter
}

export const make = (overrides: Partial<RetryPolicy> = {}): RetryPolicy => ({ ...defaultPolicy, ...overrides })

const isDeadLetter = (entry: unknown): entry is DeadLetterEntry =>
  typeof entry === "object" && entry !== null && deadLetterMarker in entry

/**
 * The delay of the schedule's `attempt`-th recurrence (1-based), or None when the schedule has ended
 * (e.g. `Schedule.recurs(3)` after 3 retries): then the job is dead-lettered.
 */
export const delayForAttempt = (schedule: Backoff, attempt: number): Effect.Effect<Option.Option<Duration.Duration>> =>
  Schedule.run(Schedule.delays(schedule), 0, Chunk.makeBy(Math.max(1, attempt), () => undefined)).pipe(
    Effect.map((delays) => Chunk.size(delays) >= Math.max(1, attempt) ? Chunk.last(delays) : Option.none())
  )

const retryOn = (entry: Backoff | DeadLetterEntry, attempt: number, what: string): Effect.Effect<Decision> =>
  isDeadLetter(entry)
    ? Effect.succeed({ _tag: "DeadLetter", reason: what })
    : Effect.map(delayForAttempt(entry, attempt), (delay) =>
      Option.match(delay, {
        onNone: (): Decision => ({ _tag: "DeadLetter", reason: `${what} (retry schedule exhausted)` }),
        onSome: (d): Decision => ({ _tag: "Retry", delay: d })
      }))

export type Failure =
  | { readonly _tag: "Transient"; readonly message: string }
  | { readonly _tag: "RateLimited"; readonly error: RateLimited }
  | { readonly _tag: "NotReady"; readonly error: NotReady }
  | { readonly _tag: "Permanent"; readonly message: string }
  | { readonly _tag: "Defect"; readonly message: string }

/**
 * What happens to a job whose run `attempt` (1-based: attempts so far + 1) failed this way, after `polls`
 * reschedules. Exhausting max_attempts is the queue's business (it dead-letters instead of retrying).
 */
export const decide = (policy: RetryPolicy, failure: Failure, attempt: number, polls: number): Effect.Effect<Decision> => {
  switch (failure._tag) {
    case "Transient":
      return retryOn(policy.Transient, attempt, failure.message)
    case "Defect":
      return retryOn(policy.Defect ?? policy.Transient, attempt, failure.message)
    case "Permanent":
      return Effect.succeed({ _tag: "DeadLetter", reason: failure.message })
    case "RateLimited": {
      const entry = policy.RateLimited
      if (typeof entry === "function") return Effect.succeed({ _tag: "Retry", delay: entry(failure.error) })
      return retryOn(entry, attempt, failure.error.message)
    }
    case "NotReady": {
      const entry = policy.NotReady
      if (isDeadLetter(entry)) return Effect.succeed({ _tag: "DeadLetter", reason: failure.error.message })
      if (polls + 1 > entry.budget) {
        return Effect.succeed({ _tag: "DeadLetter", reason: `poll budget of ${entry.budget} exhausted: ${failure.error.message}` })
      }
      const delay = failure.error.pollAfter ??
        (typeof entry.interval === "function" ? entry.interval(polls) : Duration.decode(entry.interval))
      return Effect.succeed({ _tag: "Reschedule", delay })
    }
  }
}
