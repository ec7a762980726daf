/**
 * The HTTP API, declared once: endpoints, their Schemas and error statuses. Handlers live beside it
 * (Health.ts, Jobs.ts, Calls.ts); `Server.ts` serves it with the generated OpenAPI document at
 * `/openapi.json` and a browsable copy at `/docs`.
 *
 * Authentication is a bearer API key (ApiKeys.ts) bound to one org; every authenticated handler runs its
 * database work under that org's row-level security, so another org's rows are simply not there (404).
 */
import { HttpApi, HttpApiEndpoint, HttpApiGroup, HttpApiMiddleware, HttpApiSchema, HttpApiSecurity, OpenApi } from "@effect/platform"
import { Multipart } from "@effect/platform"
import { Context, Schema } from "effect"
import * as Analyzer from "@pgfiber/media/internal/layers/Analyzer.js"
import type * as ApiKeys from "../auth/ApiKeys.js"
import * as Bulk from "pgfiber/internal/queue/Bulk.js"
import * as Job from "pgfiber/internal/queue/Job.js"
import * as Subscriptions from "../stages/webhooks/Subscriptions.js"

// ---------------------------------------------------------------------------------------------
// errors: each carries its status; bodies are `{ "_tag": …, "message": … }`

export class BadRequest extends Schema.TaggedError<BadRequest>()("BadRequest", {
  message: Schema.String,
  field: Schema.optional(Schema.String)
}, HttpApiSchema.annotations({ status: 400 })) {}

export class Unauthorized extends Schema.TaggedError<Unauthorized>()("Unauthorized", {
  message: Schema.String
}, HttpApiSchema.annotations({ status: 401 })) {}

export class NotFound extends Schema.TaggedError<NotFound>()("NotFound", {
  message: Schema.String
}, HttpApiSchema.annotations({ status: 404 })) {}

export class Conflict extends Schema.TaggedError<Conflict>()("Conflict", {
  message: Schema.String
}, HttpApiSchema.annotations({ status: 409 })) {}

/** Sent by the server's body limit before any handler runs; declared so the OpenAPI document shows it. */
export class PayloadTooLarge extends Schema.TaggedError<PayloadTooLarge>()("PayloadTooLarge", {
  message: Schema.String
}, HttpApiSchema.annotations({ status: 413 })) {}

/** Sent by the server before any handler runs for a body labelled with a charset other than UTF-8. */
export class UnsupportedMediaType extends Schema.TaggedError<UnsupportedMediaType>()("UnsupportedMediaType", {
  message: Schema.String
}, HttpApiSchema.annotations({ status: 415 })) {}

export class Unavailable extends Schema.TaggedError<Unavailable>()("Unavailable", {
  message: Schema.String
}, HttpApiSchema.annotations({ status: 503 })) {}

// ---------------------------------------------------------------------------------------------
// authentication

/** The org the request's API key belongs to. */
export class CurrentOrg extends Context.Tag("pgfiber/http/CurrentOrg")<CurrentOrg, ApiKeys.Principal>() {}

export class Authorization extends HttpApiMiddleware.Tag<Authorization>()("pgfiber/http/Authorization", {
  failure: Schema.Union(Unauthorized, Unavailable),
  provides: CurrentOrg,
  security: { bearer: HttpApiSecurity.bearer }
}) {}

// ---------------------------------------------------------------------------------------------
// health, readiness, metrics (no key needed)

const Check = Schema.Struct({ ok: Schema.Boolean, detail: Schema.String })

export const StageReadiness = Schema.Struct({
  stage: Schema.String,
  /** This process's pool for the stage; null when it runs no pool for it (e.g. `start --stages`). */
  pool: Schema.NullOr(Schema.Struct({
    state: Schema.Literal("running", "stopping"),
    concurrency: Schema.Number,
    inFlight: Schema.Number,
    /** Jobs this pool claimed ahead of a free slot: leased (`running` in the counts) but not started. */
    claimedAhead: Schema.Number,
    /** The claim loop is retrying because the database does not answer (a readiness problem). */
    claimsFailing: Schema.Boolean,
    lastClaimAt: Schema.NullOr(Schema.Date),
    /** This process waits for the stage's next token. */
    rateLimited: Schema.Boolean,
    /** This process waits for a slot under the stage's global cap. */
    capped: Schema.Boolean
  })),
  ready: Schema.Number,
  scheduled: Schema.Number,
  running: Schema.Number,
  deadLetters: Schema.Number,
  /** How long the oldest ready job has waited: the stage's lag. */
  oldestReadyAgeSeconds: Schema.Number,
  /**
   * Paused by an operator (`pgfiber stages pause`): claimed by no process until resumed. Not a readiness problem.
   * The stage's one pause state, whether this process's pool has heard of it yet or not.
   */
  paused: Schema.Boolean,
  /** Jobs are ready and the stage's token bucket is empty: they wait for its next token. */
  rateLimited: Schema.Boolean
})

const readinessFields = {
  status: Schema.Literal("ready", "not ready"),
  /** Why not ready; empty when ready. */
  problems: Schema.Array(Schema.String),
  checks: Schema.Struct({ database: Check, listener: Check, pools: Check }),
  listener: Schema.NullOr(Schema.Struct({
    /** `down` from the moment the LISTEN connection drops until LISTEN is back; pools poll meanwhile. */
    state: Schema.Literal("connecting", "listening", "down"),
    downSince: Schema.NullOr(Schema.Date),
    reconnects: Schema.Number
  })),
  reaper: Schema.NullOr(Schema.Struct({ lastReapAt: Schema.NullOr(Schema.Date), lastSweepAt: Schema.NullOr(Schema.Date) })),
  stages: Schema.Array(StageReadiness)
}

export const Readiness = Schema.Struct(readinessFields)
export type Readiness = typeof Readiness.Type

export class NotReadyYet extends Schema.TaggedError<NotReadyYet>()("NotReadyYet", readinessFields, HttpApiSchema.annotations({
  status: 503
})) {}

export const PrometheusText = HttpApiSchema.Text({ contentType: "text/plain; version=0.0.4; charset=utf-8" })

export class HealthApi extends HttpApiGroup.make("health")
  .add(
    HttpApiEndpoint.get("healthz", "/healthz")
      .addSuccess(Schema.Struct({ status: Schema.Literal("ok"), uptimeSeconds: Schema.Number }))
  )
  .add(
    HttpApiEndpoint.get("readyz", "/readyz")
      .addSuccess(Readiness)
      .addError(NotReadyYet)
  )
  .add(
    HttpApiEndpoint.get("metrics", "/metrics")
      .addSuccess(PrometheusText)
  )
  .annotate(OpenApi.Description, "Liveness, readiness and Prometheus metrics; no API key needed")
{}

// ---------------------------------------------------------------------------------------------
// jobs and dead letters

const JobId = HttpApiSchema.param("id", Schema.String)

// the model's, but `worker` as the API documents it: absent or a string (the model also reads the reaper's null)
const ErrorEntry = Schema.Struct({
  ...Job.ErrorEntry.fields,
  /** The worker that ran the failed attempt. */
  worker: Schema.optional(Schema.String)
})

// the model's fields as the API shows them (its instants are ISO text on the wire, `Schema.Date`, not the model's Dates)
const job = Job.Job.fields
const deadLetter = Job.DeadLetter.fields

export const JobView = Schema.Struct({
  id: job.id,
  stage: job.stage,
  orgId: job.orgId,
  subjectId: job.subjectId,
  payload: job.payload,
  priority: job.priority,
  /**
   * Live: `waiting` (for its parents), `queued`, `running`, `cancelled` (asked to stop while running). Finished, kept for the stage's
   * retention (PGFIBER_RETAIN_COMPLETED): `completed`, `dead` (see `deadLetterId`), `cancelled` with
   * `finishedAt`. Past its retention a finished job is 404 (a dead one stays readable while its dead letter does).
   */
  status: job.status,
  /** A waiting job's parents not finished yet (see `GET /jobs/:id/dependencies`); null otherwise. */
  waitingOn: Schema.optional(Schema.NullOr(Schema.Number)),
  /** The batch a live job belongs to (`GET /batches/:id`). */
  batchId: Schema.optional(Schema.NullOr(Schema.String)),
  attempts: job.attempts,
  maxAttempts: job.maxAttempts,
  polls: job.polls,
  availableAt: Schema.NullOr(Schema.Date),
  lockedUntil: Schema.NullOr(Schema.Date),
  dedupeKey: job.dedupeKey,
  errors: Schema.Array(ErrorEntry),
  lastError: job.lastError,
  deadLetterId: Schema.NullOr(Schema.String),
  createdAt: Schema.Date,
  updatedAt: Schema.Date,
  /** When the first run started. */
  startedAt: Schema.NullOr(Schema.Date),
  /** When the job finished; null while it is live. */
  finishedAt: Schema.NullOr(Schema.Date),
  /** The last finished run's length in milliseconds. */
  lastRunMs: job.lastRunMs,
  /** The handler's result (completed jobs of stages with an `output` Schema). */
  output: Schema.optional(Schema.Unknown),
  /** The last progress the handler reported, and its message. */
  progress: job.progress,
  progressMessage: job.progressMessage,
  /** This job's own timeout in ms (null: the stage's). */
  timeoutMs: job.timeoutMs
})

export const DeadLetterView = Schema.Struct({
  id: deadLetter.id,
  jobId: deadLetter.jobId,
  stage: deadLetter.stage,
  orgId: deadLetter.orgId,
  subjectId: deadLetter.subjectId,
  payload: deadLetter.payload,
  priority: deadLetter.priority,
  attempts: deadLetter.attempts,
  maxAttempts: deadLetter.maxAttempts,
  reason: deadLetter.reason,
  errorHistory: Schema.Array(ErrorEntry),
  jobCreatedAt: Schema.Date,
  deadAt: Schema.Date,
  resolutionStatus: deadLetter.resolutionStatus,
  resolutionNotes: deadLetter.resolutionNotes,
  resolvedAt: Schema.NullOr(Schema.Date),
  retriedJobId: deadLetter.retriedJobId
})

export const EnqueueRequest = Schema.Struct({
  stage: Schema.String,
  /** Validated by the stage's Schema. */
  payload: Schema.optional(Schema.Unknown),
  priority: Schema.optional(Job.PrioritySchema),
  /** Run no sooner than this many milliseconds from now. */
  delayMs: Schema.optional(Schema.Int.pipe(Schema.between(0, 366 * 24 * 3600 * 1000))),
  /** Run no sooner than this instant (ISO 8601, years 1 to 9999); wins over delayMs. */
  runAt: Schema.optional(Job.InstantFromString.pipe(
    Schema.filter((d) => d.getTime() >= Job.runAtRange.min && d.getTime() <= Job.runAtRange.max, {
      message: () => "runAt must be between 0001-01-01 and 9999-12-31 (UTC)"
    })
  )),
  maxAttempts: Schema.optional(Schema.Int.pipe(Schema.between(1, 1000))),
  /** Unique among queued and running jobs: a duplicate returns the live job (`deduped: true`). */
  dedupeKey: Schema.optional(Schema.String.pipe(Schema.minLength(1), Schema.maxLength(1024))),
  /** What a duplicate does to the still-queued live job: `first` (default) nothing, `replace`, `debounce`. */
  dedupeMode: Schema.optional(Schema.Literal("first", "replace", "debounce")),
  /** This job's timeout in milliseconds, overriding its stage's. */
  timeoutMs: Schema.optional(Schema.Int.pipe(Schema.between(1, 2_147_483_647))),
  subjectId: Schema.optional(Schema.String.pipe(Schema.minLength(1), Schema.maxLength(200))),
  /** With dedupeKey: one job per key per aligned window of this many ms, counting finished jobs (`deduped: true`). */
  uniqueForMs: Schema.optional(Schema.Int.pipe(Schema.between(1000, 366 * 24 * 3600 * 1000))),
  /**
   * Jobs of your org this one waits for: it is `waiting` until each has finished. An id, or `{ id, onFailure }`
   * with onFailure `cancel` (default: cancelled when that parent dies or is cancelled), `deadLetter` or `continue`.
   */
  dependsOn: Schema.optional(Schema.Array(Schema.Union(
    Schema.String.pipe(Schema.filter(Job.isJobId, { message: () => "dependsOn must hold job ids (digits)" })),
    Schema.Struct({
      id: Schema.String.pipe(Schema.filter(Job.isJobId, { message: () => "dependsOn must hold job ids (digits)" })),
      onFailure: Schema.optional(Schema.Literal(...Job.onParentFailures))
    })
  )).pipe(Schema.maxItems(Job.maxDependencies)))
})

const DependencyLinkView = Schema.Struct({
  id: Schema.String,
  stage: Schema.NullOr(Schema.String),
  status: Schema.NullOr(Job.JobStatusSchema),
  onFailure: Schema.Literal(...Job.onParentFailures),
  output: Schema.optional(Schema.Unknown)
})

/** A batch's counts and callbacks (library-created: `Queue.batches`). */
export const BatchView = Schema.Struct({
  id: Schema.String,
  total: Schema.Number,
  completed: Schema.Number,
  failed: Schema.Number,
  sealed: Schema.Boolean,
  finishedAt: Schema.NullOr(Schema.Date),
  callbacks: Schema.Array(Schema.String)
})

/** What a job waits on (its parents, with their outputs once completed) and what waits on it (its children). */
export const DependenciesView = Schema.Struct({
  parents: Schema.Array(DependencyLinkView),
  children: Schema.Array(DependencyLinkView)
})

const ListLimit = Schema.optional(Schema.NumberFromString.pipe(Schema.int(), Schema.between(1, 1000)))

/** A page cursor: the last id of the previous page. Anything else is refused (400), never silently ignored. */
const Cursor = Schema.optional(Schema.String.pipe(
  Schema.filter(Job.isJobId, { message: () => "after must be an id from a previous page (digits, within bigint)" })
))

/** A bulk action's filter (Bulk.ts): the key's org always applies, and a tenant's key sees public stages only. */
export const BulkFilterRequest = Schema.Struct({
  stage: Schema.optional(Schema.String),
  /** `queued` (due now), `delayed` (queued for later: scheduled or backing off), `running`. */
  status: Schema.optional(Schema.Literal(...Bulk.filterStatuses)),
  subject: Schema.optional(Schema.String),
  /** A JSON object the payload contains (`@>`), or `key=value[,key=value]` text. */
  payload: Schema.optional(Schema.Union(Schema.Record({ key: Schema.String, value: Schema.Unknown }), Schema.String)),
  /** A substring of the last error, case-insensitive. */
  error: Schema.optional(Schema.String),
  /** Created longer ago than this: `30m`, `2h`, `7d`. */
  olderThan: Schema.optional(Schema.String),
  /** Created within this much of now. */
  newerThan: Schema.optional(Schema.String)
})

export const BulkRequest = Schema.Struct({
  filter: BulkFilterRequest,
  /** cancel (queued: removed; running: stopped at the next heartbeat), retry (failed jobs waiting: due now), run-now (delayed: due now), priority. */
  action: Schema.Literal(...Bulk.actionKinds),
  /** The new priority, for `priority`. */
  priority: Schema.optional(Job.PrioritySchema),
  /** Only count the jobs it would change (the default: true, so a missing flag changes nothing). */
  dryRun: Schema.optional(Schema.Boolean)
})

export const BulkResponse = Schema.Struct({
  action: Schema.Literal(...Bulk.actionKinds),
  dryRun: Schema.Boolean,
  /** Jobs the action applies to. */
  matched: Schema.Number,
  /** Jobs changed (absent on a dry run); a cancel's running ones are in `cancelling` too. */
  affected: Schema.optional(Schema.Number),
  cancelling: Schema.optional(Schema.Number),
  /** The action's record (`GET /jobs/actions`). */
  actionId: Schema.optional(Schema.String)
})

export const ActionView = Schema.Struct({
  id: Schema.String,
  action: Schema.Literal(...Bulk.actionKinds),
  filter: Schema.Unknown,
  priority: Schema.NullOr(Schema.Number),
  actor: Schema.String,
  matched: Schema.Number,
  affected: Schema.Number,
  /** It ended before its last batch; `affected` is what it changed. */
  interrupted: Schema.Boolean,
  startedAt: Schema.Date,
  /** Null while it runs. */
  finishedAt: Schema.NullOr(Schema.Date)
})

export class JobsApi extends HttpApiGroup.make("jobs")
  .add(
    HttpApiEndpoint.post("enqueue", "/jobs")
      .setPayload(EnqueueRequest)
      .addSuccess(Schema.Struct({ id: Schema.String, deduped: Schema.Boolean }), { status: 201 })
      .addError(BadRequest)
  )
  .add(
    HttpApiEndpoint.get("list", "/jobs")
      .setUrlParams(Schema.Struct({
        stage: Schema.optional(Schema.String),
        status: Schema.optional(Job.LiveStatusSchema),
        /** Payload search: a JSON object the payload contains, or `key=value[,key=value]`. */
        payload: Schema.optional(Schema.String),
        /** A substring of the last error, case-insensitive. */
        error: Schema.optional(Schema.String),
        limit: ListLimit,
        after: Cursor
      }))
      .addSuccess(Schema.Struct({ jobs: Schema.Array(JobView) }))
      .addError(BadRequest)
  )
  .add(
    HttpApiEndpoint.post("bulk", "/jobs/bulk")
      .setPayload(BulkRequest)
      .addSuccess(BulkResponse)
      .addError(BadRequest)
  )
  .add(
    HttpApiEndpoint.get("actions", "/jobs/actions")
      .setUrlParams(Schema.Struct({ limit: ListLimit }))
      .addSuccess(Schema.Struct({ actions: Schema.Array(ActionView) }))
  )
  .add(HttpApiEndpoint.get("get")`/jobs/${JobId}`.addSuccess(JobView).addError(NotFound))
  .add(HttpApiEndpoint.get("dependencies")`/jobs/${JobId}/dependencies`.addSuccess(DependenciesView).addError(NotFound))
  .add(HttpApiEndpoint.get("batch")`/batches/${JobId}`.addSuccess(BatchView).addError(NotFound))
  .add(
    HttpApiEndpoint.post("cancel")`/jobs/${JobId}/cancel`
      .addSuccess(Schema.Struct({ id: Schema.String, outcome: Schema.Literal("cancelled", "cancelling") }))
      .addError(NotFound)
  )
  .add(
    HttpApiEndpoint.get("listDeadLetters", "/dlq")
      .setUrlParams(Schema.Struct({
        stage: Schema.optional(Schema.String),
        /** `true`: resolved and retried ones too. */
        all: Schema.optional(Schema.BooleanFromString),
        limit: ListLimit,
        after: Cursor
      }))
      .addSuccess(Schema.Struct({ deadLetters: Schema.Array(DeadLetterView) }))
  )
  .add(HttpApiEndpoint.get("getDeadLetter")`/dlq/${JobId}`.addSuccess(DeadLetterView).addError(NotFound))
  .add(
    HttpApiEndpoint.post("retryDeadLetter")`/dlq/${JobId}/retry`
      .addSuccess(Schema.Struct({ id: Schema.String, jobId: Schema.String }))
      .addError(NotFound)
      .addError(Conflict)
  )
  .add(
    HttpApiEndpoint.post("resolveDeadLetter")`/dlq/${JobId}/resolve`
      .setPayload(Schema.Struct({ notes: Schema.optional(Schema.String.pipe(Schema.maxLength(4000))) }))
      .addSuccess(Schema.Struct({ id: Schema.String, resolutionStatus: Schema.Literal("resolved") }))
      .addError(NotFound)
  )
  .add(
    HttpApiEndpoint.post("tick", "/api/jobs/tick")
      .setPayload(Schema.Struct({ max: Schema.optional(Schema.Int.pipe(Schema.between(1, 1000))) }))
      .addSuccess(Schema.Struct({
        ok: Schema.Literal(true),
        claimed: Schema.Number,
        completed: Schema.Number,
        retried: Schema.Number,
        rescheduled: Schema.Number,
        deadLettered: Schema.Number,
        released: Schema.Number,
        fenced: Schema.Number
      }))
      .addError(NotFound)
  )
  .middleware(Authorization)
  .annotate(OpenApi.Description, "Jobs and dead letters of the API key's org")
  .addError(Unavailable)
{}

// ---------------------------------------------------------------------------------------------
// schedules (recurring jobs of the key's org)

const ScheduleName = HttpApiSchema.param("name", Schema.String)

export const ScheduleView = Schema.Struct({
  name: Schema.String,
  orgId: Schema.NullOr(Schema.String),
  stage: Schema.String,
  payload: Schema.Unknown,
  priority: Schema.Number,
  maxAttempts: Schema.Number,
  cron: Schema.NullOr(Schema.String),
  everyMs: Schema.NullOr(Schema.Number),
  timeZone: Schema.String,
  enabled: Schema.Boolean,
  catchUp: Schema.Literal("skip", "backfill"),
  backfillLimit: Schema.Number,
  nextTickAt: Schema.Date,
  lastTickAt: Schema.NullOr(Schema.Date),
  source: Schema.Literal("code", "runtime"),
  createdAt: Schema.Date,
  updatedAt: Schema.Date
})

export const ScheduleRequest = Schema.Struct({
  stage: Schema.String,
  /** Validated by the stage's Schema, like a submitted job's. */
  payload: Schema.optional(Schema.Unknown),
  /** A cron expression of 5 fields or 6 (seconds first); or `everyMs`. */
  cron: Schema.optional(Schema.String.pipe(Schema.maxLength(200))),
  everyMs: Schema.optional(Schema.Int.pipe(Schema.between(1000, 366 * 24 * 3600 * 1000))),
  /** The IANA zone the cron expression is read in (default UTC). */
  timeZone: Schema.optional(Schema.String.pipe(Schema.maxLength(100))),
  enabled: Schema.optional(Schema.Boolean),
  /** After downtime: `skip` (default) fires the latest missed tick only; `backfill` up to `backfillLimit`. */
  catchUp: Schema.optional(Schema.Literal("skip", "backfill")),
  backfillLimit: Schema.optional(Schema.Int.pipe(Schema.between(1, 1000))),
  priority: Schema.optional(Job.PrioritySchema),
  maxAttempts: Schema.optional(Schema.Int.pipe(Schema.between(1, 1000)))
})

export class SchedulesApi extends HttpApiGroup.make("schedules")
  .add(HttpApiEndpoint.get("listSchedules", "/schedules").addSuccess(Schema.Struct({ schedules: Schema.Array(ScheduleView) })))
  .add(HttpApiEndpoint.get("getSchedule")`/schedules/${ScheduleName}`.addSuccess(ScheduleView).addError(NotFound))
  .add(
    HttpApiEndpoint.put("putSchedule")`/schedules/${ScheduleName}`
      .setPayload(ScheduleRequest)
      .addSuccess(ScheduleView)
      .addError(BadRequest)
  )
  .add(
    HttpApiEndpoint.del("removeSchedule")`/schedules/${ScheduleName}`
      .addSuccess(Schema.Struct({ name: Schema.String, removed: Schema.Literal(true) }))
      .addError(NotFound)
  )
  .add(HttpApiEndpoint.post("enableSchedule")`/schedules/${ScheduleName}/enable`.addSuccess(ScheduleView).addError(NotFound))
  .add(HttpApiEndpoint.post("disableSchedule")`/schedules/${ScheduleName}/disable`.addSuccess(ScheduleView).addError(NotFound))
  .add(
    HttpApiEndpoint.post("runScheduleNow")`/schedules/${ScheduleName}/run-now`
      .addSuccess(Schema.Struct({ id: Schema.String, deduped: Schema.Boolean }), { status: 201 })
      .addError(NotFound)
      .addError(BadRequest)
  )
  .middleware(Authorization)
  .addError(Unavailable)
  .annotate(OpenApi.Description, "Recurring jobs of the API key's org; system schedules (no org) are managed with the CLI")
{}

// ---------------------------------------------------------------------------------------------
// calls (the call pipeline's front door)

const CallId = HttpApiSchema.param("id", Schema.String)

export const CallView = Schema.Struct({
  id: Schema.String,
  orgId: Schema.String,
  status: Schema.Literal("queued", "extracting", "transcribing", "analyzing", "done", "failed"),
  /** Why the pipeline gave up, with the stage's name; null unless `failed`. */
  error: Schema.NullOr(Schema.String),
  /** The recording's storage key, relative to the org's prefix `orgs/{org}/` (whole when under a prefix the operator allows). */
  sourceKey: Schema.String,
  operationId: Schema.NullOr(Schema.String),
  createdAt: Schema.Date,
  updatedAt: Schema.Date,
  completedAt: Schema.NullOr(Schema.Date),
  artifacts: Schema.Array(Schema.Struct({
    kind: Schema.String,
    storageKey: Schema.String,
    contentType: Schema.NullOr(Schema.String),
    bytes: Schema.NullOr(Schema.Number),
    durationMs: Schema.NullOr(Schema.Number),
    channels: Schema.NullOr(Schema.Number),
    createdAt: Schema.Date
  })),
  transcript: Schema.NullOr(Schema.Struct({
    provider: Schema.String,
    operationId: Schema.String,
    language: Schema.NullOr(Schema.String),
    segments: Schema.Array(Analyzer.Segment),
    durationMs: Schema.NullOr(Schema.Number),
    createdAt: Schema.Date
  })),
  analysis: Schema.NullOr(Schema.Struct({
    analyzer: Schema.String,
    analysis: Analyzer.CallAnalysis,
    createdAt: Schema.Date,
    updatedAt: Schema.Date
  }))
})

/**
 * A recording already in the configured storage (`s3://bucket/key`, its https URL, or `file://` for the fs
 * driver), under the org's prefix `orgs/{org}/` or a prefix STORAGE_ORG_PREFIXES allows the org.
 */
export const CreateCallFromUri = Schema.Struct({ uri: Schema.String.pipe(Schema.minLength(1), Schema.maxLength(2048)) })

/** A recording uploaded as `multipart/form-data`, in the part named `file`. */
export const CreateCallUpload = HttpApiSchema.Multipart(Schema.Struct({ file: Multipart.SingleFileSchema }))

export class CallsApi extends HttpApiGroup.make("calls")
  .add(
    HttpApiEndpoint.post("createCall", "/calls")
      .setPayload(Schema.Union(CreateCallFromUri, CreateCallUpload))
      .addSuccess(Schema.Struct({ id: Schema.String, status: Schema.Literal("queued") }), { status: 201 })
      .addError(BadRequest)
  )
  .add(HttpApiEndpoint.get("getCall")`/calls/${CallId}`.addSuccess(CallView).addError(NotFound))
  .middleware(Authorization)
  .addError(Unavailable)
  .annotate(OpenApi.Description, "Recorded calls: upload or point at a recording; read status, artifacts, transcript, analysis")
{}

// ---------------------------------------------------------------------------------------------
// stage control (admin listener only, no key: stages are shared by every org)

const StageName = HttpApiSchema.param("name", Schema.String)

export const StageControlView = Schema.Struct({
  stage: Schema.String,
  paused: Schema.Boolean,
  changedBy: Schema.NullOr(Schema.String),
  changedAt: Schema.NullOr(Schema.Date),
  /** From the stage's code (compiled into this service, or as the worker that runs it registered it). */
  visibility: Schema.NullOr(Schema.Literal("public", "internal")),
  /** A process that runs it was seen lately (the stage registry); null: no worker has registered it. */
  live: Schema.NullOr(Schema.Boolean),
  /** The processes that run it now (seen lately). */
  processes: Schema.Number
})

export class StagesApi extends HttpApiGroup.make("stages")
  .add(HttpApiEndpoint.get("listStages", "/stages").addSuccess(Schema.Struct({ stages: Schema.Array(StageControlView) })))
  .add(HttpApiEndpoint.post("pauseStage")`/stages/${StageName}/pause`.addSuccess(StageControlView).addError(NotFound))
  .add(HttpApiEndpoint.post("resumeStage")`/stages/${StageName}/resume`.addSuccess(StageControlView).addError(NotFound))
  .add(
    HttpApiEndpoint.post("purgeStage")`/stages/${StageName}/purge`
      .addSuccess(Schema.Struct({ stage: Schema.String, purged: Schema.Number }))
      .addError(NotFound)
  )
  .addError(Unavailable)
  .annotate(
    OpenApi.Description,
    "Pause and resume a stage in every process (state in the database, heard by NOTIFY). Served on the admin " +
      "listener only, without a key: a stage is shared by every org, so no tenant's key may pause it."
  )
{}

// ---------------------------------------------------------------------------------------------
// limits (operator only: served on the admin listener, never to a tenant's key)

const LimitStage = HttpApiSchema.param("stage", Schema.String)

export const SharesView = Schema.Struct({
  fair: Schema.Boolean,
  maxRunning: Schema.NullOr(Schema.Number),
  maxRunningPerOrg: Schema.NullOr(Schema.Number),
  rate: Schema.NullOr(Schema.Struct({ limit: Schema.Number, perMs: Schema.Number, burst: Schema.Number, perOrg: Schema.Boolean }))
})

export const LimitsView = Schema.Struct({
  stage: Schema.String,
  /** What every process's claims obey now. */
  effective: SharesView,
  source: Schema.Literal("code", "config", "override")
})

export const LimitsRequest = Schema.Struct({
  /** 0 lifts the cap. */
  maxRunning: Schema.optional(Schema.Int.pipe(Schema.between(0, 10_000_000))),
  maxRunningPerOrg: Schema.optional(Schema.Int.pipe(Schema.between(0, 10_000_000))),
  /** A token bucket for the stage: `20/s`, `500/1h`; `none` lifts it. */
  rate: Schema.optional(Schema.String.pipe(Schema.maxLength(40))),
  /** A token bucket per org: `5/s`. */
  ratePerOrg: Schema.optional(Schema.String.pipe(Schema.maxLength(40))),
  burst: Schema.optional(Schema.Int.pipe(Schema.between(1, 10_000_000))),
  fair: Schema.optional(Schema.Boolean)
})

export class LimitsApi extends HttpApiGroup.make("limits")
  .add(HttpApiEndpoint.get("listLimits", "/limits").addSuccess(Schema.Struct({ limits: Schema.Array(LimitsView) })))
  .add(HttpApiEndpoint.put("putLimits")`/limits/${LimitStage}`.setPayload(LimitsRequest).addSuccess(LimitsView).addError(BadRequest).addError(NotFound))
  .add(
    HttpApiEndpoint.del("resetLimits")`/limits/${LimitStage}`
      .addSuccess(Schema.Struct({ stage: Schema.String, reset: Schema.Boolean }))
  )
  .addError(Unavailable)
  .annotate(
    OpenApi.Description,
    "Stages' fair shares, global caps and rate limits, changed at run time in every process: admin listener only"
  )
{}

// ---------------------------------------------------------------------------------------------
// events: every job's lifecycle, as Server-Sent Events

export const EventsQuery = Schema.Struct({
  /** Only these stages (comma-separated). */
  stage: Schema.optional(Schema.String.pipe(Schema.maxLength(2000))),
  /** Only this job's events. */
  job: Schema.optional(Schema.String.pipe(Schema.maxLength(40))),
  /** Only the events of jobs on this subject. */
  subject: Schema.optional(Schema.String.pipe(Schema.maxLength(500))),
  /** Only these kinds (comma-separated): enqueued, started, progress, completed, retried, rescheduled, dead, cancelled. */
  kind: Schema.optional(Schema.String.pipe(Schema.maxLength(200))),
  /** Where to start without a Last-Event-ID: `now` (default) or `beginning` (everything kept). */
  from: Schema.optional(Schema.Literal("now", "beginning")),
  /** The same as the Last-Event-ID header, for clients that cannot set one. */
  lastEventId: Schema.optional(Schema.String.pipe(Schema.maxLength(40)))
})

export const EventStream = HttpApiSchema.Text({ contentType: "text/event-stream" })

export class EventsApi extends HttpApiGroup.make("events")
  .add(
    HttpApiEndpoint.get("events", "/events")
      .setUrlParams(EventsQuery)
      .addSuccess(EventStream)
      .addError(BadRequest)
  )
  .addError(Unavailable)
  .middleware(Authorization)
  .annotate(
    OpenApi.Description,
    "The key's org's job events as Server-Sent Events (`id:` the event id, `event:` its kind, `data:` the event as JSON), resumable with Last-Event-ID within the retention (PGFIBER_EVENTS_RETAIN)"
  )
{}

// ---------------------------------------------------------------------------------------------
// webhooks: an org's subscriptions to its job events

export const WebhookView = Subscriptions.WebhookView

export const WebhookRequest = Schema.Struct({
  url: Schema.String.pipe(Schema.maxLength(2000)),
  /** Event kinds to deliver; default completed, dead, cancelled. */
  kinds: Schema.optional(Schema.Array(Schema.String.pipe(Schema.maxLength(40))).pipe(Schema.maxItems(20))),
  /** Only these stages' events; default every stage. */
  stages: Schema.optional(Schema.Array(Schema.String.pipe(Schema.maxLength(200))).pipe(Schema.maxItems(100)))
})

const WebhookId = HttpApiSchema.param("id", Schema.String)

export class WebhooksApi extends HttpApiGroup.make("webhooks")
  .add(
    HttpApiEndpoint.post("createWebhook", "/webhooks")
      .setPayload(WebhookRequest)
      // the signing secret (Standard Webhooks `whsec_…`) is in this answer only
      .addSuccess(Schema.Struct({ ...WebhookView.fields, secret: Schema.String }), { status: 201 })
      .addError(BadRequest)
  )
  .add(HttpApiEndpoint.get("listWebhooks", "/webhooks").addSuccess(Schema.Struct({ webhooks: Schema.Array(WebhookView) })))
  .add(
    HttpApiEndpoint.del("removeWebhook")`/webhooks/${WebhookId}`
      .addSuccess(Schema.Struct({ id: Schema.String, removed: Schema.Literal(true) }))
      .addError(NotFound)
  )
  .addError(Unavailable)
  .middleware(Authorization)
  .annotate(OpenApi.Description, "The key's org's webhooks: each job event they want is delivered as a signed POST (Standard Webhooks), retried as a job")
{}

export class Api extends HttpApi.make("pgfiber")
  .add(HealthApi)
  .add(StagesApi)
  .add(LimitsApi)
  .add(JobsApi)
  .add(SchedulesApi)
  .add(CallsApi)
  .add(EventsApi)
  .add(WebhooksApi)
  .addError(BadRequest)
  .addError(PayloadTooLarge)
  .addError(UnsupportedMediaType)
  .annotate(OpenApi.Title, "pgfiber")
  .annotate(OpenApi.Description, "A Postgres job queue and event-driven worker runtime")
{}
