/**
 * The job model: what a producer hands the queue (`NewJob`), what a worker claims (`Job`), what lands in the
 * dead-letter table (`DeadLetter`), and the validation every implementation applies before writing anything.
 * What the queue answers (status, `Job`, `FinishedJob`, `ErrorEntry`, `Batch`, `DeadLetter`) is defined once, as
 * Schemas with their types derived: the tables' rows decode to them (Rows.ts) and the faces' views take their
 * fields from them (the HTTP API's JobView, the CLI's statuses).
 */
import { Data, Duration, Effect, Either, Metric, ParseResult, Schema } from "effect"

/** Named priorities; lower runs first (pg-boss's convention). Any integer 0..100 is allowed too. */
export const namedPriorities = { fast: 10, normal: 50, bulk: 90 } as const
export type PriorityName = keyof typeof namedPriorities
export type Priority = PriorityName | number

/** A priority as a job stores it: an integer 0..100. */
export const StoredPriority = Schema.Int.pipe(Schema.between(0, 100))

/** A priority as a producer gives it: a name or the number. */
export const PrioritySchema = Schema.Union(Schema.Literal("fast", "normal", "bulk"), StoredPriority)

/** Jobs larger than this are refused: the hot table stays small; put big data in storage and pass its key. */
export const defaultMaxPayloadBytes = 256 * 1024

export type JobId = string
/**
 * Live: `waiting` (for its parents, `dependsOn`), `queued`, `running`, `cancelled` (a running job asked to stop:
 * its worker removes it). Finished, from the kept history: `completed`, `dead` (dead-lettered), and `cancelled`
 * with a `finishedAt`. The one list: every other spelling derives from these.
 */
export const liveStatuses = ["waiting", "queued", "running", "cancelled"] as const
export const finishedStatuses = ["completed", "dead", "cancelled"] as const
export const jobStatuses = ["waiting", "queued", "running", "cancelled", "completed", "dead"] as const
export const JobStatusSchema = Schema.Literal(...jobStatuses)
export type JobStatus = typeof JobStatusSchema.Type
export const LiveStatusSchema = Schema.Literal(...liveStatuses)
export type LiveStatus = typeof LiveStatusSchema.Type
export const FinishedStatusSchema = Schema.Literal(...finishedStatuses)
export type FinishedStatus = typeof FinishedStatusSchema.Type

/**
 * What a dependent does when a parent is dead-lettered or cancelled: `cancel` it with the reason (the default),
 * `deadLetter` it with the reason, or `continue` (the failed parent counts as done). Cascades down chains.
 */
export type OnParentFailure = "cancel" | "deadLetter" | "continue"
export const onParentFailures: ReadonlyArray<OnParentFailure> = ["cancel", "deadLetter", "continue"]

/** A parent of a job: its id, and what the job does if that parent fails. */
export interface Dependency {
  readonly id: JobId
  readonly onFailure?: OnParentFailure | undefined
}

/** Most parents one job may wait on. */
export const maxDependencies = 10_000

export interface NewJob {
  readonly stage: string
  readonly payload?: unknown
  readonly orgId?: string | null | undefined
  readonly subjectId?: string | null | undefined
  readonly priority?: Priority | undefined
  /** Run no sooner than this long from now (computed by the database clock). */
  readonly delay?: Duration.DurationInput | undefined
  /** Run no sooner than this instant; wins over `delay`. */
  readonly runAt?: Date | undefined
  readonly maxAttempts?: number | undefined
  /** Unique among queued and running jobs: enqueueing a duplicate returns the live job instead. */
  readonly dedupeKey?: string | undefined
  /** Overrides the stage's timeout for this job's runs. */
  readonly timeout?: Duration.DurationInput | undefined
  /**
   * What a duplicate does to the live job while it is still queued (a running one is never touched):
   * `first` (default) leaves it; `replace` gives it this enqueue's payload, priority and run time;
   * `debounce` does the same but only ever pushes the run time later.
   */
  readonly dedupeMode?: DedupeMode | undefined
  /**
   * Parents (existing jobs, of the same org) this job waits for: it is `waiting` until each has finished, then
   * queued by the statement that settles the last one. A parent finished already counts as done when it
   * completed (or its failure policy is `continue`); one dead-lettered or cancelled refuses the enqueue.
   * An id alone waits with `onFailure: "cancel"`.
   */
  readonly dependsOn?: ReadonlyArray<JobId | Dependency> | undefined
  /**
   * One job per `dedupeKey` (per org) per window of this length, counting finished jobs too: windows are aligned
   * periods by the database clock (`"1 hour"`: each clock hour); an enqueue in a window that already had its job
   * returns that job (`deduped`). Needs a `dedupeKey`, and `dedupeMode` first.
   */
  readonly uniqueFor?: Duration.DurationInput | undefined
  /** Joins this open batch (`Queue.batches`); its callbacks wait for this job too. */
  readonly batchId?: string | undefined
}

export type DedupeMode = "first" | "replace" | "debounce"
export const dedupeModes: ReadonlyArray<DedupeMode> = ["first", "replace", "debounce"]

/** A NewJob after validation, in the shape both implementations store. */
export interface ValidJob {
  readonly stage: string
  readonly payloadJson: string
  readonly payload: unknown
  readonly orgId: string | null
  readonly subjectId: string | null
  readonly priority: number
  readonly delayMs: number
  readonly runAt: Date | null
  readonly maxAttempts: number
  readonly dedupeKey: string | null
  readonly dedupeMode: DedupeMode
  readonly timeoutMs: number | null
  /** Distinct parents, in the order given; empty for a job that waits for nothing. */
  readonly dependsOn: ReadonlyArray<{ readonly id: JobId; readonly onFailure: OnParentFailure }>
  /** The uniqueness window's length in ms; null: unique among live jobs only (or not at all). */
  readonly uniqueForMs: number | null
  readonly batchId: string | null
}

/**
 * One failed run in a job's history (`errors`, a dead letter's `errorHistory`). `worker`: the worker that ran it,
 * absent in entries written before history was kept, and JSON null in those the reaper wrote for a lease no worker
 * held (read as absent).
 */
export const ErrorEntry = Schema.Struct({
  attempt: Schema.Number,
  at: Schema.String,
  tag: Schema.String,
  message: Schema.String,
  worker: Schema.optionalWith(Schema.String, { nullable: true })
})
export type ErrorEntry = typeof ErrorEntry.Type

const nullableString = Schema.NullOr(Schema.String)
const nullableNumber = Schema.NullOr(Schema.Number)
const nullableDate = Schema.NullOr(Schema.DateFromSelf)

/** A job, live or from the kept history: what `Queue.get`, `list`, `history.list` and a claim answer. */
export const Job = Schema.Struct({
  id: Schema.String,
  stage: Schema.String,
  orgId: nullableString,
  subjectId: nullableString,
  payload: Schema.Unknown,
  priority: Schema.Number,
  status: JobStatusSchema,
  /** Failed or expired runs so far; the run in hand is attempt `attempts + 1`. */
  attempts: Schema.Number,
  maxAttempts: Schema.Number,
  polls: Schema.Number,
  availableAt: Schema.DateFromSelf,
  lockedBy: nullableString,
  lockedUntil: nullableDate,
  /** The fencing token of the current claim. */
  lease: Schema.Number,
  dedupeKey: nullableString,
  errors: Schema.Array(ErrorEntry),
  lastError: nullableString,
  createdAt: Schema.DateFromSelf,
  updatedAt: Schema.DateFromSelf,
  /** When the first run started; null until then. */
  startedAt: nullableDate,
  /** When the job finished (completed, dead-lettered, cancelled); null while it is live. */
  finishedAt: nullableDate,
  /** The last finished run's length, in ms. */
  lastRunMs: nullableNumber,
  /** The handler's result, as its stage's `output` Schema encoded it (completed jobs only). */
  output: Schema.Unknown,
  /** The last progress the handler reported (written at most once a second). */
  progress: nullableNumber,
  progressMessage: nullableString,
  /** This job's own timeout, overriding its stage's; null: the stage's. */
  timeoutMs: nullableNumber,
  /** A waiting job's parents not finished yet; null for a job that is not waiting. */
  waitingOn: nullableNumber,
  /** The batch it belongs to (live jobs; the history does not keep it). */
  batchId: nullableString
})
export type Job = typeof Job.Type

/** A job from the kept history: finished, with the instant it finished. */
export const FinishedJob = Schema.Struct({
  ...Job.fields,
  status: FinishedStatusSchema,
  finishedAt: Schema.DateFromSelf
})
export type FinishedJob = typeof FinishedJob.Type

/**
 * A batch: jobs whose callbacks (`onComplete` always, `onFailure` too when a job failed) are enqueued exactly once,
 * when it is sealed and its last job has finished, with its counts in their payload (`batch`).
 */
export const Batch = Schema.Struct({
  id: Schema.String,
  orgId: nullableString,
  total: Schema.Number,
  completed: Schema.Number,
  /** Dead-lettered or cancelled. */
  failed: Schema.Number,
  /** No more jobs may join; its callbacks run once all have finished. */
  sealed: Schema.Boolean,
  finishedAt: nullableDate,
  /** The callback jobs enqueued when it finished. */
  callbacks: Schema.Array(Schema.String)
})
export type Batch = typeof Batch.Type

export interface BatchOptions {
  readonly orgId?: string | null | undefined
  /** Enqueued when the batch finishes, whatever its counts. Its payload (an object) gets `batch`. */
  readonly onComplete?: NewJob | undefined
  /** Enqueued too when the batch finishes with a job dead-lettered or cancelled. */
  readonly onFailure?: NewJob | undefined
  /** Its first jobs (they join with `batchId` set). */
  readonly jobs?: ReadonlyArray<NewJob> | undefined
  /** Leave it open for `batches.add`, until `batches.seal`; default: sealed with `jobs`. */
  readonly open?: boolean | undefined
}

/** A callback as the batch stores it: what `enqueue_batch_callbacks` (migration 0021) writes as a job. */
export interface CallbackSpec {
  readonly stage: string
  readonly payload: unknown
  readonly priority: number
  readonly maxAttempts: number
}

/** Both of a batch's callbacks, validated (`validateCallback`). */
export const validateCallbacks = (
  o: BatchOptions,
  options: ValidateOptions
): Either.Either<{ readonly onComplete: CallbackSpec | null; readonly onFailure: CallbackSpec | null }, InvalidJob> =>
  Either.flatMap(validateCallback(o.onComplete, "onComplete", options), (onComplete) =>
    Either.map(validateCallback(o.onFailure, "onFailure", options), (onFailure) => ({ onComplete, onFailure })))

/** A batch's callback, validated as a job whose payload is an object (the batch's counts are added to it). */
export const validateCallback = (job: NewJob | undefined, field: string, options: ValidateOptions): Either.Either<CallbackSpec | null, InvalidJob> => {
  if (job === undefined) return Either.right(null)
  const valid = validate(job, options)
  if (Either.isLeft(valid)) return Either.left(new InvalidJob({ field, message: `${field}: ${valid.left.message}` }))
  const p = valid.right.payload
  if (typeof p !== "object" || p === null || Array.isArray(p)) {
    return Either.left(new InvalidJob({ field, message: `${field}: payload must be an object (the batch's counts are added to it)` }))
  }
  return Either.right({ stage: valid.right.stage, payload: p, priority: valid.right.priority, maxAttempts: valid.right.maxAttempts })
}


/** One edge of the dependency graph, seen from either end: the other job, its status now, and the policy. */
export interface DependencyLink {
  readonly id: JobId
  readonly stage: string | null
  /** The other job's status now; null when it has left the history too. */
  readonly status: JobStatus | null
  readonly onFailure: OnParentFailure
  /** The other job's output, when it completed and its history is kept. */
  readonly output: unknown
}

/** A job's parents (what it waits on) and children (what waits on it). */
export interface Dependencies {
  readonly parents: ReadonlyArray<DependencyLink>
  readonly children: ReadonlyArray<DependencyLink>
}

/** What a worker holds after a claim and must present to finish the job. */
export interface Lease {
  readonly id: JobId
  readonly lease: number
}

/** A handler's report of how far it got: a number (e.g. percent) and a short message. */
export interface Progress {
  readonly value: number
  readonly message: string | null
}

/** A held lease, with the progress reported since the last heartbeat (written by that heartbeat). */
export interface Beat extends Lease {
  readonly reported?: Progress | undefined
}

/** Longest progress message kept; longer ones are cut. */
export const maxProgressMessage = 200

/** A stage's control row: paused stages claim nothing, everywhere. */
export interface StageControl {
  readonly stage: string
  readonly paused: boolean
  readonly changedBy: string | null
  readonly changedAt: Date
}

/** How long finished jobs stay readable: a default, and stages that keep theirs longer or shorter. */
export interface Retention {
  /** For stages not named in `stages`; omitted: PGFIBER_RETAIN_COMPLETED (7 days). */
  readonly default?: Duration.Duration | undefined
  readonly stages?: Readonly<Record<string, Duration.Duration>> | undefined
}

export interface HistoryListOptions {
  readonly stage?: string | undefined
  readonly status?: "completed" | "dead" | "cancelled" | undefined
  readonly limit?: number | undefined
  /** Keyset pagination, newest first: jobs with a smaller id than this. */
  readonly beforeId?: JobId | undefined
}

/** Outputs larger than this are refused (the job fails with `OutputTooLarge`): the same bound as payloads. */
export const defaultMaxOutputBytes = 256 * 1024

export interface EnqueueResult {
  readonly id: JobId
  /** True when a live job with the same dedupe key already existed and no new job was written. */
  readonly deduped: boolean
}

export type CancelOutcome = "cancelled" | "cancelling" | "not-found"

/** A job moved to the dead-letter table, and what an operator did about it. */
export const DeadLetter = Schema.Struct({
  id: Schema.String,
  jobId: Schema.String,
  stage: Schema.String,
  orgId: nullableString,
  subjectId: nullableString,
  payload: Schema.Unknown,
  priority: Schema.Number,
  attempts: Schema.Number,
  maxAttempts: Schema.Number,
  dedupeKey: nullableString,
  reason: Schema.String,
  errorHistory: Schema.Array(ErrorEntry),
  jobCreatedAt: Schema.DateFromSelf,
  deadAt: Schema.DateFromSelf,
  resolutionStatus: Schema.NullOr(Schema.Literal("retried", "resolved")),
  resolutionNotes: nullableString,
  resolvedAt: nullableDate,
  retriedJobId: nullableString
})
export type DeadLetter = typeof DeadLetter.Type

export interface StageStats {
  readonly stage: string
  /** Queued and due now. */
  readonly ready: number
  /** Queued for later (delayed, backing off, or polling). */
  readonly scheduled: number
  readonly running: number
  readonly cancelling: number
  readonly deadLetters: number
  /** How long the oldest ready job has waited, in ms; 0 when none is ready. */
  readonly oldestReadyAgeMs: number
  /** Paused by an operator: nothing of it is claimed until it is resumed. */
  readonly paused: boolean
  /** Jobs are ready but the stage's token bucket is empty: they wait for its next token. */
  readonly rateLimited: boolean
}

export interface ListOptions {
  readonly stage?: string | undefined
  readonly status?: JobStatus | undefined
  readonly limit?: number | undefined
  /** Keyset pagination: jobs with a larger id than this. */
  readonly afterId?: JobId | undefined
  /** Only jobs whose payload contains this JSON object (`@>`; Bulk.parsePayloadSearch reads `key=value`). */
  readonly payload?: Readonly<Record<string, unknown>> | undefined
  /** Only jobs whose last error contains this text, case-insensitive. */
  readonly error?: string | undefined
}

export interface DeadLetterListOptions {
  readonly stage?: string | undefined
  /** Only dead letters with no resolution yet (the default). */
  readonly unresolvedOnly?: boolean | undefined
  readonly limit?: number | undefined
  readonly afterId?: string | undefined
}

/** Stats for every stage named, with zero rows for stages that have no jobs, sorted by stage. */
export const statsForStages = (rows: ReadonlyArray<StageStats>, stages: ReadonlyArray<string>): ReadonlyArray<StageStats> => {
  const seen = new Set(rows.map((r) => r.stage))
  const empty = stages.filter((stage) => !seen.has(stage)).map((stage): StageStats => ({
    stage,
    ready: 0,
    scheduled: 0,
    running: 0,
    cancelling: 0,
    deadLetters: 0,
    oldestReadyAgeMs: 0,
    paused: false,
    rateLimited: false
  }))
  return [...rows, ...empty].sort((a, b) => (a.stage < b.stage ? -1 : a.stage > b.stage ? 1 : 0))
}

/** Bad input from a producer: nothing was written. */
export class InvalidJob extends Data.TaggedError("InvalidJob")<{
  readonly message: string
  readonly field: string
}> {}

export class JobNotFound extends Data.TaggedError("JobNotFound")<{
  readonly message: string
}> {}

export const stagePattern = /^[a-z][a-z0-9_.:-]{0,62}$/

const describe = (value: unknown): string =>
  value === null ? "null" : Array.isArray(value) ? "array" : typeof value === "object" ? (value.constructor?.name ?? "object") : typeof value

/** The largest job id Postgres's bigint holds: a longer or larger id names no job. */
const maxBigint = 9223372036854775807n

/** A job or dead-letter id as the queue stores it: digits, within bigint. */
export const isJobId = (id: string): boolean => /^\d{1,19}$/.test(id) && BigInt(id) <= maxBigint

const loneSurrogate = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/

/**
 * What PostgreSQL cannot store in text or jsonb: a NUL character, or a lone UTF-16 surrogate (not Unicode).
 * Refused, never silently altered, wherever a producer's text goes (payload strings and keys, ids, keys).
 */
export const textProblem = (text: string): string | undefined =>
  text.includes("\u0000")
    ? "contains a NUL character (\\u0000), which PostgreSQL cannot store"
    : loneSurrogate.test(text)
    ? "contains a lone UTF-16 surrogate, which is not Unicode text"
    : undefined

/** Deeper JSON is refused: no real payload needs it, and every reader of it would pay for its depth. */
export const maxJsonDepth = 64

/**
 * Plain JSON only: JSON.stringify would silently drop undefined and functions, and turn NaN into null; no
 * text PostgreSQL cannot store (`textProblem`), in values or keys; at most `maxJsonDepth` levels deep.
 */
export const jsonProblem = (value: unknown, path: string, seen: Set<unknown> = new Set()): string | undefined => {
  switch (typeof value) {
    case "string": {
      const problem = textProblem(value)
      return problem === undefined ? undefined : `${path} ${problem}`
    }
    case "boolean":
      return undefined
    case "number":
      return Number.isFinite(value) ? undefined : `${path} is ${value}, which JSON cannot hold`
    case "object": {
      if (value === null) return undefined
      if (seen.has(value)) return `${path} is a circular reference`
      if (seen.size >= maxJsonDepth) return `${path} is nested more than ${maxJsonDepth} levels deep`
      seen.add(value)
      try {
        if (Array.isArray(value)) {
          for (let i = 0; i < value.length; i++) {
            const p = jsonProblem(value[i], `${path}[${i}]`, seen)
            if (p) return p
          }
          return undefined
        }
        const proto = Object.getPrototypeOf(value)
        if (proto !== Object.prototype && proto !== null) {
          return `${path} is a ${describe(value)}, not a plain JSON object (convert it, e.g. a Date to an ISO string)`
        }
        for (const [k, v] of Object.entries(value)) {
          const keyProblem = textProblem(k)
          if (keyProblem !== undefined) return `a key of ${path} ${keyProblem}`
          const p = jsonProblem(v, `${path}.${k}`, seen)
          if (p) return p
        }
        return undefined
      } finally {
        seen.delete(value)
      }
    }
    default:
      return `${path} is ${describe(value)}, which JSON cannot hold`
  }
}

const isoInstant = /^([+-]\d{6}|\d{4})-(\d{2})-(\d{2})(?:[Tt ](\d{2}):(\d{2})(?::(\d{2})(?:\.\d{1,9})?)?)?(?:([Zz])|([+-])(\d{2}):?(\d{2}))?$/

/**
 * An instant written in ISO 8601 (`2026-03-01T09:00:00Z`, `2026-03-01T10:00+01:00`, a date alone for its UTC
 * midnight; a space may stand for the T; without an offset, a date-time is the server's local time, as in
 * JavaScript). Every field must exist: the parsed instant, read back in the offset it was written in, must show
 * the same year, month, day, hour, minute and second, so `2026-02-30`, `24:00`, `10:60` or a local time skipped
 * by a DST change is undefined, never rolled over the way `new Date` does; so is an offset past 23:59, and any
 * other format.
 */
export const parseInstant = (text: string): Date | undefined => {
  const match = isoInstant.exec(text)
  if (match === null) return undefined
  const [year, month, day, hour, minute, second] = match.slice(1, 7).map((field) => (field === undefined ? 0 : Number(field)))
  const [utc, sign, offsetHours, offsetMinutes] = match.slice(7)
  if (Number(offsetHours ?? 0) > 23 || Number(offsetMinutes ?? 0) > 59) return undefined
  const instant = new Date(text)
  if (Number.isNaN(instant.getTime())) return undefined
  const offsetMs = sign === undefined ? 0 : (sign === "-" ? -1 : 1) * (Number(offsetHours) * 60 + Number(offsetMinutes)) * 60_000
  // a date alone is UTC; a date-time with Z or an offset is read back in that offset; one without, in local time
  const local = match[4] !== undefined && utc === undefined && sign === undefined
  const shown = new Date(instant.getTime() + offsetMs)
  const fields = local
    ? [shown.getFullYear(), shown.getMonth() + 1, shown.getDate(), shown.getHours(), shown.getMinutes(), shown.getSeconds()]
    : [shown.getUTCFullYear(), shown.getUTCMonth() + 1, shown.getUTCDate(), shown.getUTCHours(), shown.getUTCMinutes(), shown.getUTCSeconds()]
  return fields.every((field, i) => field === [year, month, day, hour, minute, second][i]) ? instant : undefined
}

/** An ISO 8601 instant whose every field exists (`parseInstant`), as a Date. */
export const InstantFromString = Schema.transformOrFail(Schema.String, Schema.DateFromSelf, {
  strict: true,
  decode: (text, _, ast) =>
    Either.fromNullable(
      parseInstant(text),
      () => new ParseResult.Type(ast, text, "must be an ISO 8601 date-time that exists, e.g. 2026-03-01T09:00:00Z")
    ),
  encode: (date) => ParseResult.succeed(date.toISOString())
})

/** The instants a job may be scheduled at: inside what PostgreSQL and an ISO 8601 timestamp both hold. */
export const runAtRange = { min: new Date("0001-01-01T00:00:00Z").getTime(), max: Date.UTC(9999, 11, 31, 23, 59, 59, 999) } as const

export interface ValidateOptions {
  readonly maxPayloadBytes: number
  /** When set, stages outside it are refused. */
  readonly knownStages: ReadonlySet<string> | undefined
}

const optionalText = (value: unknown, field: string, max: number): Either.Either<string | null, InvalidJob> => {
  if (value === undefined || value === null) return Either.right(null)
  if (typeof value !== "string" || value.length === 0 || value.length > max) {
    return Either.left(new InvalidJob({ field, message: `${field} must be a non-empty string of at most ${max} characters` }))
  }
  const problem = textProblem(value)
  if (problem !== undefined) return Either.left(new InvalidJob({ field, message: `${field} ${problem}` }))
  return Either.right(value)
}

export const validate = (job: NewJob, options: ValidateOptions): Either.Either<ValidJob, InvalidJob> => {
  const fail = (field: string, message: string) => Either.left(new InvalidJob({ field, message }))
  if (typeof job?.stage !== "string" || job.stage.length === 0) return fail("stage", "stage is required")
  if (!stagePattern.test(job.stage)) {
    return fail("stage", `stage "${job.stage}" must match ${stagePattern.source}`)
  }
  if (options.knownStages !== undefined && !options.knownStages.has(job.stage)) {
    return fail("stage", `unknown stage "${job.stage}"; known: ${[...options.knownStages].sort().join(", ")}`)
  }
  const payload = job.payload === undefined ? {} : job.payload
  const problem = jsonProblem(payload, "payload", new Set())
  if (problem) return fail("payload", problem)
  const payloadJson = JSON.stringify(payload)
  const bytes = Buffer.byteLength(payloadJson, "utf8")
  if (bytes > options.maxPayloadBytes) {
    return fail("payload", `payload is ${bytes} bytes, over the limit of ${options.maxPayloadBytes}`)
  }
  let priority = namedPriorities.normal as number
  if (job.priority !== undefined) {
    if (typeof job.priority === "string") {
      if (!(job.priority in namedPriorities)) return fail("priority", `priority must be fast, normal, bulk or 0..100`)
      priority = namedPriorities[job.priority as PriorityName]
    } else if (Number.isInteger(job.priority) && job.priority >= 0 && job.priority <= 100) {
      priority = job.priority
    } else {
      return fail("priority", `priority must be fast, normal, bulk or an integer 0..100, got ${String(job.priority)}`)
    }
  }
  let delayMs = 0
  if (job.delay !== undefined) {
    const decoded = Duration.decodeUnknown(job.delay)
    if (decoded._tag === "None" || !Duration.isFinite(decoded.value)) return fail("delay", "delay must be a finite duration")
    delayMs = Duration.toMillis(decoded.value)
    if (delayMs < 0 || Number.isNaN(delayMs)) return fail("delay", `delay must not be negative`)
    if (Date.now() + delayMs > runAtRange.max) return fail("delay", "delay must end before 9999-12-31 (UTC)")
  }
  if (typeof job.delay === "number" && job.delay < 0) return fail("delay", "delay must not be negative")
  let runAt: Date | null = null
  if (job.runAt !== undefined) {
    if (!(job.runAt instanceof Date) || Number.isNaN(job.runAt.getTime())) return fail("runAt", "runAt must be a valid Date")
    if (job.runAt.getTime() < runAtRange.min || job.runAt.getTime() > runAtRange.max) {
      return fail("runAt", "runAt must be between 0001-01-01 and 9999-12-31 (UTC)")
    }
    runAt = job.runAt
  }
  const maxAttempts = job.maxAttempts ?? 5
  if (!Number.isInteger(maxAttempts) || maxAttempts < 1 || maxAttempts > 1000) {
    return fail("maxAttempts", "maxAttempts must be an integer 1..1000")
  }
  const orgId = optionalText(job.orgId, "orgId", 200)
  if (Either.isLeft(orgId)) return Either.left(orgId.left)
  const subjectId = optionalText(job.subjectId, "subjectId", 200)
  if (Either.isLeft(subjectId)) return Either.left(subjectId.left)
  const dedupeKey = optionalText(job.dedupeKey, "dedupeKey", 1024)
  if (Either.isLeft(dedupeKey)) return Either.left(dedupeKey.left)
  let timeoutMs: number | null = null
  if (job.timeout !== undefined) {
    const decoded = Duration.decodeUnknown(job.timeout)
    const millis = decoded._tag === "Some" && Duration.isFinite(decoded.value) ? Math.round(Duration.toMillis(decoded.value)) : NaN
    if (!(millis >= 1 && millis <= 2_147_483_647)) return fail("timeout", "timeout must be a finite duration from 1 ms to about 24 days")
    timeoutMs = millis
  }
  const dedupeMode = job.dedupeMode ?? "first"
  if (!dedupeModes.includes(dedupeMode)) return fail("dedupeMode", `dedupeMode must be one of ${dedupeModes.join(", ")}`)
  if (dedupeMode !== "first" && dedupeKey.right === null) return fail("dedupeMode", `dedupeMode ${dedupeMode} needs a dedupeKey`)
  const dependsOn = validDependencies(job.dependsOn)
  if (Either.isLeft(dependsOn)) return Either.left(dependsOn.left)
  if (dependsOn.right.length > 0 && dedupeMode !== "first") {
    return fail("dependsOn", `dependsOn cannot be combined with dedupeMode ${dedupeMode}`)
  }
  if (job.batchId !== undefined && (typeof job.batchId !== "string" || !isJobId(job.batchId))) {
    return fail("batchId", "batchId must be a batch id (digits)")
  }
  let uniqueForMs: number | null = null
  if (job.uniqueFor !== undefined) {
    const decoded = Duration.decodeUnknown(job.uniqueFor)
    const millis = decoded._tag === "Some" && Duration.isFinite(decoded.value) ? Math.round(Duration.toMillis(decoded.value)) : NaN
    if (!(millis >= 1000 && millis <= 366 * 24 * 3600 * 1000)) return fail("uniqueFor", "uniqueFor must be a duration from 1 second to 366 days")
    if (dedupeKey.right === null) return fail("uniqueFor", "uniqueFor needs a dedupeKey")
    if (dedupeMode !== "first") return fail("uniqueFor", `uniqueFor cannot be combined with dedupeMode ${dedupeMode}`)
    uniqueForMs = millis
  }
  return Either.right({
    stage: job.stage,
    payloadJson,
    payload: JSON.parse(payloadJson),
    orgId: orgId.right,
    subjectId: subjectId.right,
    priority,
    delayMs,
    runAt,
    maxAttempts,
    dedupeKey: dedupeKey.right,
    dedupeMode,
    timeoutMs,
    dependsOn: dependsOn.right,
    uniqueForMs,
    batchId: job.batchId ?? null
  })
}

const strictness: Record<OnParentFailure, number> = { continue: 0, cancel: 1, deadLetter: 2 }

const validDependencies = (
  value: unknown
): Either.Either<ReadonlyArray<{ readonly id: JobId; readonly onFailure: OnParentFailure }>, InvalidJob> => {
  const fail = (message: string) => Either.left(new InvalidJob({ field: "dependsOn", message }))
  if (value === undefined || value === null) return Either.right([])
  if (!Array.isArray(value)) return fail("dependsOn must be an array of job ids")
  if (value.length > maxDependencies) return fail(`dependsOn holds at most ${maxDependencies} jobs`)
  const out = new Map<string, OnParentFailure>()
  for (const item of value as ReadonlyArray<unknown>) {
    const dep = typeof item === "string" ? { id: item } : item
    if (typeof dep !== "object" || dep === null || typeof (dep as Dependency).id !== "string" || !isJobId((dep as Dependency).id)) {
      return fail("dependsOn must hold job ids (digits) or { id, onFailure }")
    }
    const onFailure = (dep as Dependency).onFailure ?? "cancel"
    if (!onParentFailures.includes(onFailure)) return fail(`onFailure must be one of ${onParentFailures.join(", ")}`)
    const id = String(BigInt((dep as Dependency).id))
    // the same parent twice: the stricter policy stands (continue < cancel < deadLetter)
    const was = out.get(id)
    out.set(id, was === undefined || strictness[onFailure] > strictness[was] ? onFailure : was)
  }
  return Either.right([...out].map(([id, onFailure]) => ({ id, onFailure })))
}

/** Validates a batch; the first bad job fails the whole batch so a producer never half-enqueues. */
export const validateAll = (
  jobs: ReadonlyArray<NewJob>,
  options: ValidateOptions
): Either.Either<ReadonlyArray<ValidJob>, InvalidJob> => {
  const out: Array<ValidJob> = []
  for (let i = 0; i < jobs.length; i++) {
    const result = validate(jobs[i]!, options)
    if (Either.isLeft(result)) {
      return Either.left(
        jobs.length > 1
          ? new InvalidJob({ field: result.left.field, message: `job ${i}: ${result.left.message}` })
          : result.left
      )
    }
    out.push(result.right)
  }
  return Either.right(out)
}

/** JSON with object keys sorted at every depth, so equal payloads give equal strings. */
export const stableJson = (value: unknown): string =>
  JSON.stringify(value, (_key, v) =>
    v !== null && typeof v === "object" && !Array.isArray(v)
      ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, (v as Record<string, unknown>)[k]]))
      : v)

/** Seed 004's deterministic dedupe key: `<stage>::<org|global>::<sorted-json payload>`. */
export const makeDedupeKey = (stage: string, orgId: string | null | undefined, payload: unknown): string =>
  `${stage}::${orgId ?? "global"}::${stableJson(payload ?? {})}`

/** The error history entry a failure appends, with the attempt it ended. */
export const errorEntry = (attempt: number, at: Date, tag: string, message: string, worker?: string | null): ErrorEntry => ({
  attempt,
  at: at.toISOString(),
  tag,
  message: message.length > 4000 ? `${message.slice(0, 4000)}…` : message,
  ...(worker ? { worker } : {})
})

/** A dead letter brought back: the same work as a fresh job (attempts 0), or why it cannot be. */
export const jobFromDeadLetter = (dl: DeadLetter): Either.Either<NewJob, InvalidJob> =>
  dl.resolutionStatus !== null
    ? Either.left(new InvalidJob({ field: "id", message: `dead letter ${dl.id} is already ${dl.resolutionStatus}` }))
    : Either.right({
      stage: dl.stage,
      payload: dl.payload,
      orgId: dl.orgId,
      subjectId: dl.subjectId,
      priority: dl.priority,
      maxAttempts: dl.maxAttempts,
      dedupeKey: dl.dedupeKey ?? undefined
    })

/** Jobs written by this process (deduplicated ones not counted), tagged by stage: both queues count here. */
export const enqueuedTotal = Metric.counter("pgfiber_jobs_enqueued_total", {
  description: "Jobs written by this process",
  incremental: true
})

export const countEnqueued = (jobs: ReadonlyArray<ValidJob>, results: ReadonlyArray<EnqueueResult>) => {
  const byStage = new Map<string, number>()
  results.forEach((r, i) => {
    if (!r.deduped) byStage.set(jobs[i]!.stage, (byStage.get(jobs[i]!.stage) ?? 0) + 1)
  })
  return Effect.forEach(byStage, ([stage, n]) => Metric.incrementBy(Metric.tagged(enqueuedTotal, "stage", stage), n), { discard: true })
}

export const JobIdSchema = Schema.String.pipe(Schema.pattern(/^\d{1,19}$/))

/** How `job_dependencies.on_failure` spells each policy, and back. */
export const policyColumn: Record<OnParentFailure, string> = { cancel: "cancel", deadLetter: "dead", continue: "continue" }
export const policyFromColumn = (column: string): OnParentFailure =>
  column === "dead" ? "deadLetter" : column === "continue" ? "continue" : "cancel"

/**
 * Why a job cannot wait on a parent, or undefined when it can: the parent must exist (live, or finished in the
 * kept history) in the job's own org, or it is "not found", the same words whether it is absent or another
 * org's; a finished parent counts as done when it completed, or failed and the policy is `continue`.
 */
export const parentProblem = (
  job: ValidJob,
  dep: { readonly id: JobId; readonly onFailure: OnParentFailure },
  live: { readonly orgId: string | null } | undefined,
  finished: { readonly org_id: string | null; readonly status: string } | undefined,
  index?: number
): InvalidJob | undefined => {
  const fail = (message: string) =>
    new InvalidJob({ field: "dependsOn", message: index === undefined ? `dependsOn: ${message}` : `job ${index}: dependsOn: ${message}` })
  if (live !== undefined) return live.orgId === job.orgId ? undefined : fail(`job ${dep.id} not found`)
  if (finished === undefined || finished.org_id !== job.orgId) return fail(`job ${dep.id} not found`)
  if (finished.status === "completed" || dep.onFailure === "continue") return undefined
  return fail(`job ${dep.id} was ${finished.status === "dead" ? "dead-lettered" : "cancelled"}, and onFailure is ${dep.onFailure}`)
}

// ---- what the faces read (Reads.ts): a job as a list shows it, the browse filter, the live snapshot ----

/** A job's status as lists show it: a queued job not due yet is `delayed`. */
export const browseStatuses = ["waiting", "queued", "delayed", "running", "cancelled", "completed", "dead"] as const
export type BrowseStatus = typeof browseStatuses[number]

const fromColumn = <S extends Schema.Schema.Any>(schema: S, column: string) =>
  Schema.propertySignature(schema).pipe(Schema.fromKey(column))

/** A job as a list shows it: a live job, a finished one from the kept history, or a dead letter whose job is gone. */
export const JobSummary = Schema.Struct({
  id: JobIdSchema,
  stage: Schema.String,
  orgId: nullableString,
  subjectId: nullableString,
  status: Schema.Literal(...browseStatuses),
  attempts: Schema.Number,
  maxAttempts: Schema.Number,
  createdAt: Schema.DateFromSelf,
  /** When it last changed (a finished job: when it finished; a dead letter: when it died). */
  updatedAt: Schema.DateFromSelf,
  /** When a live job runs next; null once finished. */
  availableAt: Schema.NullOr(Schema.DateFromSelf),
  lastError: nullableString,
  /** The dead letter this row is, when its job is no longer in the history. */
  deadLetterId: nullableString
})
export type JobSummary = typeof JobSummary.Type

/** `JobSummary` from a row of BrowseSql's statement (its columns in snake case). */
export const JobSummaryFromRow = Schema.Struct({
  id: JobIdSchema,
  stage: Schema.String,
  orgId: fromColumn(nullableString, "org_id"),
  subjectId: fromColumn(nullableString, "subject_id"),
  status: Schema.Literal(...browseStatuses),
  attempts: Schema.Number,
  maxAttempts: fromColumn(Schema.Number, "max_attempts"),
  createdAt: fromColumn(Schema.DateFromSelf, "created_at"),
  updatedAt: fromColumn(Schema.DateFromSelf, "updated_at"),
  availableAt: fromColumn(Schema.NullOr(Schema.DateFromSelf), "available_at"),
  lastError: fromColumn(nullableString, "last_error"),
  deadLetterId: fromColumn(nullableString, "dead_letter_id")
})

/** What a jobs list is narrowed to; every field null means any. */
export interface BrowseFilter {
  readonly stage: string | null
  readonly status: BrowseStatus | null
  /** An org's jobs only (an operator's filter; an org's viewer sees its own whatever this says). */
  readonly org: string | null
  readonly subject: string | null
  readonly since: Date | null
  readonly until: Date | null
  readonly id: JobId | null
  /** Jobs with a smaller id than this (the next page). */
  readonly before: JobId | null
  /** JSON text of an object the payload contains (`@>`); null: any. */
  readonly payload?: string | null | undefined
  /** A substring of the last error (the dead letter's reason), case-insensitive; null: any. */
  readonly error?: string | null | undefined
}

/** A filter that matches every job: narrow it with a spread. */
export const browseAll: BrowseFilter = { stage: null, status: null, org: null, subject: null, since: null, until: null, id: null, before: null }

const count = Schema.Number
/**
 * Everything the dashboard shows live, across every org (StatsSql.liveSnapshot's one row; its JSON parts keep the
 * columns' snake case). Instants inside the JSON parts are ISO text.
 */
export const LiveSnapshot = Schema.Struct({
  now: Schema.DateFromSelf,
  /** Depth per stage and org: ready, delayed, running, cancelling, open dead letters. */
  depth: Schema.Array(Schema.Struct({
    stage: Schema.String,
    org: nullableString,
    ready: count,
    delayed: count,
    running: count,
    cancelling: count,
    dead: count,
    oldest_ready_ms: Schema.NullOr(Schema.Number)
  })),
  /** Running jobs per claiming worker, stage and org. */
  workers: Schema.Array(Schema.Struct({ worker: Schema.String, stage: Schema.String, org: nullableString, running: count })),
  /** The last minutes of the per-minute counts. */
  series: Schema.Array(Schema.Struct({
    minute: Schema.String,
    stage: Schema.String,
    org: nullableString,
    completed: count,
    retried: count,
    dead_lettered: count,
    run_ms_sum: Schema.Number,
    run_ms_max: Schema.Number,
    runs: count
  })),
  /** The jobs some open job page watches, as they are now (absent: left the jobs table). */
  watched: Schema.Array(Schema.Struct({
    id: JobIdSchema,
    stage: Schema.String,
    org_id: nullableString,
    status: Schema.Literal(...liveStatuses),
    attempts: count,
    max_attempts: count,
    polls: count,
    available_at: nullableString,
    locked_by: nullableString,
    locked_until: nullableString,
    last_error: nullableString,
    updated_at: Schema.String,
    started_at: nullableString,
    progress: Schema.NullOr(Schema.Number),
    progress_message: nullableString
  })),
  /** Stages paused by an operator. */
  paused: Schema.Array(Schema.String),
  /** Stages whose rate limit holds back ready jobs right now (a bucket waiting for its next token). */
  rate_limited: Schema.Array(Schema.String)
})
export type LiveSnapshot = typeof LiveSnapshot.Type
