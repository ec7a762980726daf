/**
 * The pipeline tables as the call stages use them: storage keys, loading a call, moving its status, and
 * building the hand-off jobs. Everything here fails in the JobError vocabulary, so a stage's retry policy
 * decides: a database blip is Transient, a call that does not exist is Permanent.
 */
import type { Duration } from "effect"
import { Effect, ParseResult, Schema } from "effect"
import * as JobError from "pgfiber/internal/JobError.js"
import * as Db from "pgfiber/internal/layers/Db.js"
import type * as Job from "pgfiber/internal/queue/Job.js"
import * as RetryPolicy from "pgfiber/internal/runtime/RetryPolicy.js"
import type * as Stage from "pgfiber/internal/runtime/Stage.js"
import * as CallsSql from "./CallsSql.js"
import type * as Settings from "./Settings.js"

/** Org ids become a storage path segment, so they are held to a plain name. */
export const orgIdPattern = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$/

export const CallId = Schema.UUID

export const callPrefix = (orgId: string, callId: string) => `orgs/${orgId}/calls/${callId}`
/** Where extract_audio puts the OGG Opus audio: deterministic, so a rerun overwrites rather than adds. */
export const audioKey = (orgId: string, callId: string) => `${callPrefix(orgId, callId)}/audio.ogg`
export const sourceKey = (orgId: string, callId: string, extension: string) => `${callPrefix(orgId, callId)}/source${extension}`

export const audioContentType = "audio/ogg; codecs=opus"

/** A database failure inside a stage: worth another try (a real bug exhausts the attempts and dead-letters). */
export const dbTransient = (error: Db.DbError) => new JobError.Transient({ message: `database: ${error.message}` })

/** Runs a statement, failing Transient. */
export const run = <A>(query: (sql: Db.Sql) => PromiseLike<A>) =>
  Effect.flatMap(Db.Db, (db) => Effect.mapError(db.run(query), dbTransient))

/** Runs `effect` in one transaction, a failure to commit being Transient. */
export const transaction = <A, E extends JobError.JobError, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.flatMap(Db.Db, (db) => db.transaction(effect).pipe(Effect.catchTag("DbError", (e) => Effect.fail(dbTransient(e)))))

/**
 * The call's row, checked to belong to the job's org; a call that is not there (deleted, never committed, or
 * another org's) cannot be worked on. Another org's call is refused with the same words as a missing one, so
 * the dead letter tells its org nothing about other orgs (under the job's org, RLS hides it anyway).
 */
export const load = (callId: string, job: Pick<Stage.JobInfo, "orgId">) =>
  Effect.flatMap(run((sql) => CallsSql.selectCall(sql, callId)), ([row]) =>
    row === undefined || (job.orgId !== null && row.org_id !== job.orgId)
      ? Effect.fail(new JobError.Permanent({ message: `call ${callId} does not exist` }))
      : Effect.succeed(row))

export const artifact = (callId: string, kind: string) =>
  Effect.map(run((sql) => CallsSql.selectArtifact(sql, callId, kind)), (rows) => rows[0])

/** Inserts the artifact unless the call already has one of its kind. */
export const insertArtifact = (artifact: Parameters<typeof CallsSql.insertArtifact>[1]) =>
  Effect.asVoid(run((sql) => CallsSql.insertArtifact(sql, artifact)))

export const transcript = (callId: string) => Effect.map(run((sql) => CallsSql.selectTranscript(sql, callId)), (rows) => rows[0])

export const advance = (callId: string, status: (typeof CallsSql.statusOrder)[number]) =>
  Effect.asVoid(run((sql) => CallsSql.advanceStatus(sql, callId, status)))

const uuidPattern = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i

/**
 * A call stage's `onDeadLetter`: whatever killed the job (a Permanent error, attempts exhausted, a defect or
 * timeout on the last attempt, a worker killed during its last attempt, a bad payload), the call is marked
 * failed with the stage and the reason, in the transaction that dead-letters the job. The call is the job's
 * subject, so this works even when the payload could not be read; a finished call stays done.
 */
export const markFailedOnDeath = (stage: string) => (dead: Stage.DeadLettered) =>
  Effect.gen(function*() {
    const callId = dead.job.subjectId
    if (callId === null || !uuidPattern.test(callId)) return
    const db = yield* Db.Db
    const [marked] = yield* db.run((sql) => CallsSql.markFailed(sql, callId, dead.job.orgId, `${stage}: ${dead.reason}`))
    if (marked) yield* Effect.logWarning(`call failed (${dead.kind}): ${dead.reason}`).pipe(Effect.annotateLogs({ callId }))
  })

/**
 * The Stage.make fields the call stages set alike: internal (only the pipeline and operators enqueue them), the
 * concurrency, timeout and lease from `options` over the stage's own defaults (no lease default: the runtime's),
 * and the call marked failed on a dead letter.
 */
export const stageFields = (
  name: Settings.CallStageName,
  options: Settings.CallStageOptions,
  defaults: {
    readonly concurrency: number
    readonly timeout: Duration.DurationInput
    readonly leaseFor?: Duration.DurationInput
  }
) => {
  const leaseFor = options.leaseFor?.[name] ?? defaults.leaseFor
  return {
    name,
    // a pipeline step: only the pipeline (and operators) enqueue it
    visibility: "internal" as const,
    concurrency: options.concurrency?.[name] ?? defaults.concurrency,
    timeout: options.timeout?.[name] ?? defaults.timeout,
    ...(leaseFor === undefined ? {} : { leaseFor }),
    onDeadLetter: markFailedOnDeath(name)
  }
}

/**
 * The retry policy of a call stage that never polls: Transient backs off (`options.backoff`, else the stage's
 * curve), RateLimited waits what the service said, and NotReady (a bug in such a stage, not a reason to wait) or
 * Permanent dead-letters.
 */
export const retryPolicy = (options: Settings.CallStageOptions, defaultBackoff: RetryPolicy.Backoff) =>
  RetryPolicy.make({
    Transient: options.backoff ?? defaultBackoff,
    RateLimited: (e) => e.retryAfter,
    NotReady: RetryPolicy.deadLetter,
    Permanent: RetryPolicy.deadLetter
  })

export interface HandOff {
  readonly callId: string
  readonly orgId: string
  readonly delay?: Job.NewJob["delay"]
}

/**
 * A builder of jobs for one call stage, usable before any Stage value exists (Calls.create enqueues the
 * first). The dedupe key `<stage>:<call>` collapses a redelivered hand-off into the job still live.
 */
export const jobBuilder = <A, I>(stage: string, payload: Schema.Schema<A, I>, maxAttempts: number) =>
(value: A, handOff: HandOff): Effect.Effect<Job.NewJob, JobError.Permanent> =>
  Schema.encode(payload)(value).pipe(
    Effect.mapError((e) =>
      new JobError.Permanent({ message: `cannot build the ${stage} job: ${ParseResult.TreeFormatter.formatErrorSync(e)}` })
    ),
    Effect.map((encoded) => ({
      stage,
      payload: encoded,
      orgId: handOff.orgId,
      subjectId: handOff.callId,
      maxAttempts,
      dedupeKey: `${stage}:${handOff.callId}`,
      ...(handOff.delay === undefined ? {} : { delay: handOff.delay })
    }))
  )
