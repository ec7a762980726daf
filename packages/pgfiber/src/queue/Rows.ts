/**
 * The tables' rows as the model's values: a Schema per row shape (its columns, in snake case, as porsager hands
 * them over) decoding to `Job`, `DeadLetter`, `Batch` and a limits override. porsager already gives Dates for
 * timestamps and numbers for integer and float columns; bigint columns come as text (an id can pass 2^53), so an
 * id stays text (digits, checked) and a bigint count is read as a number. A row that does not decode is a
 * defect of the statement or the migration, reported where it enters (PgQueue's `RowMismatch`).
 */
import { Either, ParseResult, Schema } from "effect"
import { Batch, DeadLetter, ErrorEntry, FinishedStatusSchema, Job, LiveStatusSchema } from "./Job.js"
import type * as Limits from "./Limits.js"

const nullableString = Schema.NullOr(Schema.String)
const nullableNumber = Schema.NullOr(Schema.Number)
const nullableDate = Schema.NullOr(Schema.DateFromSelf)
/** A bigint key column as porsager gives it: its text (ids are positive in use; the column allows any bigint). */
const BigintText = Schema.String.pipe(Schema.pattern(/^-?\d{1,19}$/))
const nullableId = Schema.NullOr(BigintText)
/** A jsonb error history; SQL NULL (never written, but the column allows it in old rows) reads as none. */
const errorHistory = Schema.NullOr(Schema.Array(ErrorEntry))

/**
 * Rows are only read: a one-way transformation refuses to encode (no statement writes a row from a Job).
 * `decode` builds the value from columns already decoded, so it needs no checks of its own.
 */
const fromRow = <From extends Schema.Schema.Any, To extends Schema.Schema.Any>(
  from: From,
  to: To,
  decode: (row: Schema.Schema.Type<From>) => Schema.Schema.Encoded<To>
) =>
  Schema.transformOrFail(from, to, {
    strict: true,
    decode: (row) => ParseResult.succeed(decode(row)),
    encode: (value, _, ast) => ParseResult.fail(new ParseResult.Forbidden(ast, value, "a row is read, never written from the model"))
  })

/** A row of `jobs` (`select *`; has_dependents is the settle's and not read). */
const LiveJobRow = Schema.Struct({
  id: BigintText,
  stage: Schema.String,
  org_id: nullableString,
  subject_id: nullableString,
  payload: Schema.Unknown,
  priority: Schema.Number,
  status: LiveStatusSchema,
  attempts: Schema.Number,
  max_attempts: Schema.Number,
  polls: Schema.Number,
  available_at: Schema.DateFromSelf,
  locked_by: nullableString,
  locked_until: nullableDate,
  lease: Schema.Number,
  dedupe_key: nullableString,
  errors: errorHistory,
  last_error: nullableString,
  created_at: Schema.DateFromSelf,
  updated_at: Schema.DateFromSelf,
  started_at: nullableDate,
  last_run_ms: nullableNumber,
  progress: nullableNumber,
  progress_message: nullableString,
  timeout_ms: nullableNumber,
  waiting_on: nullableNumber,
  batch_id: nullableId
})

/** A live job from its `jobs` row: not finished, no output yet. */
export const JobFromLiveRow = fromRow(LiveJobRow, Schema.typeSchema(Job), (r) => ({
  id: r.id,
  stage: r.stage,
  orgId: r.org_id,
  subjectId: r.subject_id,
  payload: r.payload,
  priority: r.priority,
  status: r.status,
  attempts: r.attempts,
  maxAttempts: r.max_attempts,
  polls: r.polls,
  availableAt: r.available_at,
  lockedBy: r.locked_by,
  lockedUntil: r.locked_until,
  lease: r.lease,
  dedupeKey: r.dedupe_key,
  errors: r.errors ?? [],
  lastError: r.last_error,
  createdAt: r.created_at,
  updatedAt: r.updated_at,
  startedAt: r.started_at,
  finishedAt: null,
  lastRunMs: r.last_run_ms,
  output: null,
  progress: r.progress,
  progressMessage: r.progress_message,
  timeoutMs: r.timeout_ms,
  // the count is kept past the wait (the statement that queues the job leaves it at 0): a waiting job's only
  waitingOn: r.status === "waiting" ? r.waiting_on : null,
  batchId: r.batch_id
}))

/** A row of `jobs_archive` (`select *`; keep_until is the pruning's and not read). */
const ArchivedJobRow = Schema.Struct({
  id: BigintText,
  stage: Schema.String,
  org_id: nullableString,
  subject_id: nullableString,
  payload: Schema.Unknown,
  priority: Schema.Number,
  status: FinishedStatusSchema,
  attempts: Schema.Number,
  max_attempts: Schema.Number,
  polls: Schema.Number,
  dedupe_key: nullableString,
  errors: errorHistory,
  last_error: nullableString,
  output: Schema.Unknown,
  progress: nullableNumber,
  progress_message: nullableString,
  timeout_ms: nullableNumber,
  created_at: Schema.DateFromSelf,
  started_at: nullableDate,
  finished_at: Schema.DateFromSelf,
  last_run_ms: nullableNumber
})

/** A finished job from its history row: no lease, no run time ahead (its finishing instant stands in), no batch. */
export const JobFromArchivedRow = fromRow(ArchivedJobRow, Schema.typeSchema(Job), (r) => ({
  id: r.id,
  stage: r.stage,
  orgId: r.org_id,
  subjectId: r.subject_id,
  payload: r.payload,
  priority: r.priority,
  status: r.status,
  attempts: r.attempts,
  maxAttempts: r.max_attempts,
  polls: r.polls,
  availableAt: r.finished_at,
  lockedBy: null,
  lockedUntil: null,
  lease: 0,
  dedupeKey: r.dedupe_key,
  errors: r.errors ?? [],
  lastError: r.last_error,
  createdAt: r.created_at,
  updatedAt: r.finished_at,
  startedAt: r.started_at,
  finishedAt: r.finished_at,
  lastRunMs: r.last_run_ms,
  output: r.output ?? null,
  progress: r.progress,
  progressMessage: r.progress_message,
  timeoutMs: r.timeout_ms,
  waitingOn: null,
  batchId: null
}))

/** A row of `dead_letters` (`select *`). */
const DeadLetterRow = Schema.Struct({
  id: BigintText,
  job_id: BigintText,
  stage: Schema.String,
  org_id: nullableString,
  subject_id: nullableString,
  payload: Schema.Unknown,
  priority: Schema.Number,
  attempts: Schema.Number,
  max_attempts: Schema.Number,
  dedupe_key: nullableString,
  reason: Schema.String,
  error_history: errorHistory,
  job_created_at: Schema.DateFromSelf,
  dead_at: Schema.DateFromSelf,
  resolution_status: DeadLetter.fields.resolutionStatus,
  resolution_notes: nullableString,
  resolved_at: nullableDate,
  retried_job_id: nullableId
})

export const DeadLetterFromRow = fromRow(DeadLetterRow, Schema.typeSchema(DeadLetter), (r) => ({
  id: r.id,
  jobId: r.job_id,
  stage: r.stage,
  orgId: r.org_id,
  subjectId: r.subject_id,
  payload: r.payload,
  priority: r.priority,
  attempts: r.attempts,
  maxAttempts: r.max_attempts,
  dedupeKey: r.dedupe_key,
  reason: r.reason,
  errorHistory: r.error_history ?? [],
  jobCreatedAt: r.job_created_at,
  deadAt: r.dead_at,
  resolutionStatus: r.resolution_status,
  resolutionNotes: r.resolution_notes,
  resolvedAt: r.resolved_at,
  retriedJobId: r.retried_job_id
}))

/** A row of `job_batches` (`select *`; its callbacks' specs and created_at are not read). */
const BatchRow = Schema.Struct({
  id: BigintText,
  org_id: nullableString,
  total: Schema.Number,
  completed: Schema.Number,
  failed: Schema.Number,
  sealed: Schema.Boolean,
  finished_at: nullableDate,
  // bigint[]: an array of digit strings
  callbacks: Schema.NullOr(Schema.Array(BigintText))
})

export const BatchFromRow = fromRow(BatchRow, Schema.typeSchema(Batch), (r) => ({
  id: r.id,
  orgId: r.org_id,
  total: r.total,
  completed: r.completed,
  failed: r.failed,
  sealed: r.sealed,
  finishedAt: r.finished_at,
  callbacks: r.callbacks ?? []
}))

const nullableBoolean = Schema.NullOr(Schema.Boolean)

/** A row of `stage_limits`: a null column is "not overridden". `rate_per_ms` is a bigint: text, read as a number. */
const OverrideRow = Schema.Struct({
  fair: nullableBoolean,
  max_running: nullableNumber,
  max_running_per_org: nullableNumber,
  rate_limit: nullableNumber,
  rate_per_ms: Schema.NullOr(Schema.NumberFromString.pipe(Schema.int())),
  rate_burst: nullableNumber,
  rate_per_org: nullableBoolean
})

export const OverrideFromRow = Schema.transform(
  OverrideRow,
  Schema.Struct({
    fair: nullableBoolean,
    maxRunning: nullableNumber,
    maxRunningPerOrg: nullableNumber,
    rateLimit: nullableNumber,
    ratePerMs: nullableNumber,
    rateBurst: nullableNumber,
    ratePerOrg: nullableBoolean
  }),
  {
    strict: true,
    decode: (r): Limits.Override => ({
      fair: r.fair,
      maxRunning: r.max_running,
      maxRunningPerOrg: r.max_running_per_org,
      rateLimit: r.rate_limit,
      ratePerMs: r.rate_per_ms,
      rateBurst: r.rate_burst,
      ratePerOrg: r.rate_per_org
    }),
    encode: (o) => ({
      fair: o.fair,
      max_running: o.maxRunning,
      max_running_per_org: o.maxRunningPerOrg,
      rate_limit: o.rateLimit,
      rate_per_ms: o.ratePerMs,
      rate_burst: o.rateBurst,
      rate_per_org: o.ratePerOrg
    })
  }
)

/**
 * A claimed job as the claims return it (`JobsSql.claimedJobs`): an array of its fields in `JobsSql.claimedFields`
 * order, timestamps as epoch milliseconds, the id as text.
 */
export const ClaimedRow = Schema.Tuple(
  BigintText, Schema.String, nullableString, nullableString, Schema.Unknown, Schema.Number, LiveStatusSchema,
  Schema.Number, Schema.Number, Schema.Number, Schema.Number, nullableString, nullableNumber, Schema.Number,
  nullableString, errorHistory, nullableString, Schema.Number, Schema.Number, nullableNumber, nullableNumber,
  nullableNumber, nullableString, nullableNumber
)

const epoch = (ms: number | null) => (ms === null ? null : new Date(ms))

/** A claimed job from its decoded array. */
export const jobFromClaimed = (a: typeof ClaimedRow.Type): Job => ({
  id: a[0],
  stage: a[1],
  orgId: a[2],
  subjectId: a[3],
  payload: a[4],
  priority: a[5],
  status: a[6],
  attempts: a[7],
  maxAttempts: a[8],
  polls: a[9],
  availableAt: new Date(a[10]),
  lockedBy: a[11],
  lockedUntil: epoch(a[12]),
  lease: a[13],
  dedupeKey: a[14],
  errors: a[15] ?? [],
  lastError: a[16],
  createdAt: new Date(a[17]),
  updatedAt: new Date(a[18]),
  startedAt: epoch(a[19]),
  finishedAt: null,
  lastRunMs: a[20],
  output: null,
  progress: a[21],
  progressMessage: a[22],
  timeoutMs: a[23],
  waitingOn: null,
  // a claim does not carry it (`Queue.get` does)
  batchId: null
})

export const JobFromClaimed = fromRow(ClaimedRow, Schema.typeSchema(Job), jobFromClaimed)

const isText = (v: unknown): v is string => typeof v === "string"
const isTextOrNull = (v: unknown): v is string | null => v === null || typeof v === "string"
const isNumber = (v: unknown): v is number => typeof v === "number"
const isNumberOrNull = (v: unknown): v is number | null => v === null || typeof v === "number"
const isId = (v: unknown): v is string => typeof v === "string" && /^-?\d{1,19}$/.test(v)
const isLive = (v: unknown): v is typeof LiveStatusSchema.Type =>
  v === "running" || v === "queued" || v === "waiting" || v === "cancelled"

/** An error history entry's kinds checked, `worker: null` read as absent (as `ErrorEntry` decodes it). */
const entryOf = (v: unknown): ErrorEntry | undefined => {
  if (typeof v !== "object" || v === null) return undefined
  const { attempt, at, tag, message, worker } = v as Record<string, unknown>
  if (!isNumber(attempt) || !isText(at) || !isText(tag) || !isText(message)) return undefined
  if (worker === undefined || worker === null) return { attempt, at, tag, message }
  return isText(worker) ? { attempt, at, tag, message, worker } : undefined
}

/**
 * `ClaimedRow` decoded by hand: each field's kind checked as the Tuple's Schema checks it, without its
 * machinery. The claim's hot path decodes with this, not the Schema: the Tuple's decode (or its `Schema.is`
 * guard) cost 17-20 times the unchecked mapper it replaces, 14-22 µs a job more on a loaded machine, where this
 * check cost 0.3-0.7 µs more (`bench/decodeClaim.ts`, docs/benchmarks.md "Decoding the claim's rows"): far past
 * the 5 % of the worker's CPU per job (55-60 µs) the decode may take. The Schema stays the
 * definition: test/queue/Rows.test.ts holds the two to the same answers.
 */
export const decodeClaimed = (a: unknown): Either.Either<typeof ClaimedRow.Type, string> => {
  if (!Array.isArray(a) || a.length !== 24) return Either.left("a claimed job is not an array of 24 fields")
  const fields: ReadonlyArray<unknown> = a
  // by index, not destructured: an array pattern walks the array's iterator, a result object per field
  const id = fields[0], stage = fields[1], orgId = fields[2], subjectId = fields[3], payload = fields[4],
    priority = fields[5], status = fields[6], attempts = fields[7], maxAttempts = fields[8], polls = fields[9],
    availableAt = fields[10], lockedBy = fields[11], lockedUntil = fields[12], lease = fields[13],
    dedupeKey = fields[14], errors = fields[15], lastError = fields[16], createdAt = fields[17],
    updatedAt = fields[18], startedAt = fields[19], lastRunMs = fields[20], progress = fields[21],
    progressMessage = fields[22], timeoutMs = fields[23]
  if (
    !isId(id) || !isText(stage) || !isTextOrNull(orgId) || !isTextOrNull(subjectId) || !isNumber(priority) ||
    !isLive(status) || !isNumber(attempts) || !isNumber(maxAttempts) || !isNumber(polls) || !isNumber(availableAt) ||
    !isTextOrNull(lockedBy) || !isNumberOrNull(lockedUntil) || !isNumber(lease) || !isTextOrNull(dedupeKey) ||
    !isTextOrNull(lastError) || !isNumber(createdAt) || !isNumber(updatedAt) || !isNumberOrNull(startedAt) ||
    !isNumberOrNull(lastRunMs) || !isNumberOrNull(progress) || !isTextOrNull(progressMessage) || !isNumberOrNull(timeoutMs)
  ) {
    return Either.left(`claimed job ${String(id)}: a field is not of its column's kind`)
  }
  // no error history (a job's first run, the common case): the array is already what the Tuple decodes to
  if (errors === null) return Either.right(fields as typeof ClaimedRow.Type)
  if (!Array.isArray(errors)) return Either.left(`claimed job ${id}: its error history is not an array`)
  const history: Array<ErrorEntry> = []
  for (const e of errors as ReadonlyArray<unknown>) {
    const entry = entryOf(e)
    if (entry === undefined) return Either.left(`claimed job ${id}: an error history entry is not one`)
    history.push(entry)
  }
  return Either.right([
    id, stage, orgId, subjectId, payload, priority, status, attempts, maxAttempts, polls, availableAt, lockedBy,
    lockedUntil, lease, dedupeKey, history, lastError, createdAt, updatedAt, startedAt, lastRunMs, progress,
    progressMessage, timeoutMs
  ])
}
