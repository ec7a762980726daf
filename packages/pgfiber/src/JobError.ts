/**
 * The error vocabulary handlers and the layers they call speak. The error's tag decides a job's fate
 * (see DESIGN.md "Outcomes and typed errors"): the runtime maps each tag through the stage's RetryPolicy.
 * These are Schema.TaggedErrors because they are stored: they land in `last_error` and the dead-letter history.
 */
import { Schema } from "effect"

/** Network trouble, 5xx, timeouts: retry on the stage's backoff Schedule. */
export class Transient extends Schema.TaggedError<Transient>()("Transient", {
  message: Schema.String
}) {}

/** The server asked us to slow down: retry after its delay (Retry-After), without guessing. */
export class RateLimited extends Schema.TaggedError<RateLimited>()("RateLimited", {
  message: Schema.String,
  retryAfter: Schema.DurationFromMillis
}) {}

/** A poll found the operation still running: reschedule after the poll interval, no retry spent. */
export class NotReady extends Schema.TaggedError<NotReady>()("NotReady", {
  message: Schema.String,
  /** Optional hint for when to look again; the stage's poll interval applies when absent. */
  pollAfter: Schema.optional(Schema.DurationFromMillis)
}) {}

/** Retrying cannot help (bad input, 4xx, no audio stream): dead-letter at once. */
export class Permanent extends Schema.TaggedError<Permanent>()("Permanent", {
  message: Schema.String
}) {}

export type JobError = Transient | RateLimited | NotReady | Permanent

export const JobError = Schema.Union(Transient, RateLimited, NotReady, Permanent)
