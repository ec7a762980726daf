/**
 * Exit codes that scripts can rely on, and the one place a command's failure becomes a message and a code.
 *
 * | code | meaning |
 * | --- | --- |
 * | 0 | done (for `start`/`worker`: stopped by SIGINT/SIGTERM after a graceful shutdown) |
 * | 1 | failed: database unreachable, migration refused, server could not listen, embedded PostgreSQL lost, unexpected error |
 * | 2 | usage: bad arguments, invalid JSON, a payload failing its stage's Schema, an unknown stage, a database not migrated yet (`pgfiber migrate`) |
 * | 3 | not found: no such job, dead letter, call or key (in the org asked about) |
 * | 4 | conflict: the thing exists but is not in a state that allows it (a dead letter already retried) |
 * | 78 | configuration: an environment variable has a bad value (the message names it) |
 */
import { ValidationError } from "@effect/cli"
import { Cause, Data, Option } from "effect"
import * as ConfigError from "effect/ConfigError"

export const ExitCode = { ok: 0, failure: 1, usage: 2, notFound: 3, conflict: 4, config: 78 } as const

export class UsageError extends Data.TaggedError("UsageError")<{ readonly message: string }> {}
export class NotFound extends Data.TaggedError("NotFound")<{ readonly message: string }> {}
export class Conflict extends Data.TaggedError("Conflict")<{ readonly message: string }> {}

export interface Classified {
  readonly code: number
  /** Empty when the message was already printed (the CLI parser prints its own). */
  readonly message: string
}

/** `Invalid data at PGFIBER_SCHEMA: "…"`, for each leaf of a (possibly compound) ConfigError. */
export const describeConfigError = (error: ConfigError.ConfigError): string =>
  ConfigError.reduceWithContext(error, undefined, {
    andCase: (_, left: string, right: string) => `${left}; ${right}`,
    orCase: (_, left: string, right: string) => `${left}; ${right}`,
    invalidDataCase: (_, path, message) => `${path.join(".") || "(value)"}: ${message}`,
    missingDataCase: (_, path, message) => `${path.join(".")}: ${message}`,
    sourceUnavailableCase: (_, path, message) => `${path.join(".")}: ${message}`,
    unsupportedCase: (_, path, message) => `${path.join(".")}: ${message}`
  })

export const classify = (error: unknown): Classified => {
  if (ValidationError.isValidationError(error)) return { code: ExitCode.usage, message: "" }
  if (ConfigError.isConfigError(error)) return { code: ExitCode.config, message: `configuration error: ${describeConfigError(error)}` }
  if (typeof error === "string") return { code: ExitCode.usage, message: error }
  const e = error as { _tag?: string; message?: string; field?: string }
  const message = typeof e?.message === "string" ? e.message : String(error)
  switch (e?._tag) {
    case "UsageError":
    case "InvalidJob":
    case "InvalidKeyRequest":
    case "InvalidCall":
    case "InvalidSchedule":
    case "NotMigrated":
      return { code: ExitCode.usage, message }
    case "NotFound":
    case "JobNotFound":
    case "CallNotFound":
    case "ScheduleNotFound":
      return { code: ExitCode.notFound, message }
    case "Conflict":
      return { code: ExitCode.conflict, message }
    case "QueueError":
    case "DbError":
      return { code: ExitCode.failure, message: `database: ${message}` }
    case "ServeError":
      return { code: ExitCode.failure, message: `HTTP server could not start (check HTTP_HOST / HTTP_PORT): ${describeCause(error)}` }
    default:
      return { code: ExitCode.failure, message }
  }
}

const describeCause = (error: unknown) => {
  const cause = (error as { cause?: unknown })?.cause
  return cause instanceof Error ? cause.message : String(cause ?? error)
}

/** A defect (a bug) or a failure, from the main fiber's cause; None for interruption (a signal): exit 0. */
export const fromCause = (cause: Cause.Cause<unknown>): Option.Option<Classified> => {
  if (Cause.isInterruptedOnly(cause)) return Option.none()
  const failure = Cause.failureOption(cause)
  if (Option.isSome(failure)) return Option.some(classify(failure.value))
  return Option.some({ code: ExitCode.failure, message: `unexpected error: ${Cause.pretty(cause)}` })
}
