/**
 * Every statement on the call pipeline's tables (calls, call_artifacts, transcripts, analyses), one named
 * function each, with its locking strategy. Table names are unqualified: the pool's search_path is the schema.
 * Writes are shaped so a redelivered stage leaves the same rows: inserts `on conflict do nothing`, status
 * moves forward only, and an analysis upsert that changes nothing writes nothing.
 */
import type { Sql } from "pgfiber/internal/layers/Db.js"

export interface CallRow {
  readonly id: string
  readonly org_id: string
  readonly source_uri: string
  readonly source_key: string
  readonly status: string
  readonly error: string | null
  readonly operation_id: string | null
  readonly operation_started_at: Date | null
  readonly created_at: Date
  readonly updated_at: Date
  readonly completed_at: Date | null
}

export interface ArtifactRow {
  readonly call_id: string
  readonly org_id: string
  readonly kind: string
  readonly storage_key: string
  readonly content_type: string | null
  /** int8 arrives as a string. */
  readonly bytes: string | null
  readonly duration_ms: number | null
  readonly channels: number | null
  readonly created_at: Date
  /** When retention removed its object from storage; null while the object is kept. */
  readonly removed_at: Date | null
}

export interface TranscriptRow {
  readonly call_id: string
  readonly org_id: string
  readonly provider: string
  readonly operation_id: string
  readonly language: string | null
  readonly segments: unknown
  readonly duration_ms: number | null
  readonly created_at: Date
}

export interface AnalysisRow {
  readonly call_id: string
  readonly org_id: string
  readonly analyzer: string
  readonly analysis: unknown
  readonly created_at: Date
  readonly updated_at: Date
}

/** The order statuses move in; `failed` sits outside it (a retried stage may move a failed call forward again). */
export const statusOrder = ["queued", "extracting", "transcribing", "analyzing", "done"] as const
/** `statusOrder` as a statement's parameter (the driver's types take a mutable array). */
const statusOrderParam: Array<string> = [...statusOrder]

/** Inserts a new call. Locking: a new row only. */
export const insertCall = (
  sql: Sql,
  call: { readonly id: string; readonly orgId: string; readonly sourceUri: string; readonly sourceKey: string }
) =>
  sql<Array<CallRow>>`
    insert into calls (id, org_id, source_uri, source_key)
    values (${call.id}, ${call.orgId}, ${call.sourceUri}, ${call.sourceKey})
    returning *`

/** Locking: none (a plain read). */
export const selectCall = (sql: Sql, id: string) => sql<Array<CallRow>>`select * from calls where id = ${id}`

/**
 * Moves a call forward to `status` (never back; from `failed` to anywhere) and clears its error; `done` stamps
 * completed_at once. Locking: that call's row. A redelivered stage updates nothing, so updated_at stays put.
 */
export const advanceStatus = (sql: Sql, id: string, status: (typeof statusOrder)[number]) =>
  sql<Array<{ id: string }>>`
    update calls
    set status = ${status}, error = null, updated_at = now(),
        completed_at = case when ${status} = 'done' then coalesce(completed_at, now()) else completed_at end
    where id = ${id}
      and (status = 'failed'
           or array_position(${statusOrderParam}::text[], status)
              < array_position(${statusOrderParam}::text[], ${status}::text))
    returning id`

/**
 * Records why a stage gave up; a finished call stays done, and a job of one org never marks another's call.
 * Locking: that call's row.
 */
export const markFailed = (sql: Sql, id: string, orgId: string | null, error: string) =>
  sql<Array<{ id: string }>>`
    update calls set status = 'failed', error = ${error}, updated_at = now()
    where id = ${id} and status <> 'done' and (${orgId}::text is null or org_id = ${orgId}::text)
    returning id`

/**
 * Records the recognition a start began, unless one is recorded already (the first writer wins; a loser's
 * operation is left to expire unpolled). Locking: that call's row; a concurrent start waits, then sees it set.
 */
export const recordOperation = (sql: Sql, id: string, operationId: string, startedAt: Date) =>
  sql<Array<{ operation_id: string; operation_started_at: Date }>>`
    update calls set operation_id = ${operationId}, operation_started_at = ${startedAt}, updated_at = now()
    where id = ${id} and operation_id is null
    returning operation_id, operation_started_at`

/**
 * Forgets a recognition that failed in a way a new one may cure, so transcribe_start starts another; only if
 * it is still the one recorded (a redelivered poll clears nothing twice). Locking: that call's row.
 */
export const clearOperation = (sql: Sql, id: string, operationId: string) =>
  sql<Array<{ id: string }>>`
    update calls set operation_id = null, operation_started_at = null, updated_at = now()
    where id = ${id} and operation_id = ${operationId}
    returning id`

/** Inserts an artifact once per call and kind. Locking: the (call_id, kind) key; a duplicate is a no-op. */
export const insertArtifact = (
  sql: Sql,
  artifact: {
    readonly callId: string
    readonly orgId: string
    readonly kind: string
    readonly storageKey: string
    readonly contentType: string | null
    readonly bytes: number | null
    readonly durationMs: number | null
    readonly channels: number | null
  }
) =>
  sql<Array<{ kind: string }>>`
    insert into call_artifacts (call_id, org_id, kind, storage_key, content_type, bytes, duration_ms, channels)
    values (${artifact.callId}, ${artifact.orgId}, ${artifact.kind}, ${artifact.storageKey}, ${artifact.contentType},
            ${artifact.bytes}, ${artifact.durationMs}, ${artifact.channels})
    on conflict (call_id, kind) do nothing
    returning kind`

/** Locking: none. */
export const selectArtifact = (sql: Sql, callId: string, kind: string) =>
  sql<Array<ArtifactRow>>`select * from call_artifacts where call_id = ${callId} and kind = ${kind}`

/**
 * Stamps an artifact whose object retention removed (the first removal's time stays). Locking: that artifact's row.
 */
export const markArtifactRemoved = (sql: Sql, callId: string, kind: string) =>
  sql<Array<{ kind: string }>>`
    update call_artifacts set removed_at = coalesce(removed_at, now())
    where call_id = ${callId} and kind = ${kind}
    returning kind`

/** Locking: none. */
export const selectArtifacts = (sql: Sql, callId: string) =>
  sql<Array<ArtifactRow>>`select * from call_artifacts where call_id = ${callId} order by created_at, kind`

/** A transcript is written once: the first finished poll wins. Locking: the call_id key; a duplicate is a no-op. */
export const insertTranscript = (
  sql: Sql,
  transcript: {
    readonly callId: string
    readonly orgId: string
    readonly operationId: string
    readonly language: string | null
    readonly segments: ReadonlyArray<unknown>
    readonly durationMs: number | null
  }
) =>
  sql<Array<{ call_id: string }>>`
    insert into transcripts (call_id, org_id, operation_id, language, segments, duration_ms)
    values (${transcript.callId}, ${transcript.orgId}, ${transcript.operationId}, ${transcript.language},
            ${JSON.stringify(transcript.segments)}::text::jsonb, ${transcript.durationMs})
    on conflict (call_id) do nothing
    returning call_id`

/** Locking: none. */
export const selectTranscript = (sql: Sql, callId: string) =>
  sql<Array<TranscriptRow>>`select * from transcripts where call_id = ${callId}`

/**
 * Inserts or replaces the call's analysis; a recomputation with the same result writes nothing (updated_at
 * stays), a different analyzer's result replaces it. Locking: the call_id key's row.
 */
export const upsertAnalysis = (
  sql: Sql,
  analysis: { readonly callId: string; readonly orgId: string; readonly analyzer: string; readonly analysis: unknown }
) =>
  sql<Array<{ call_id: string }>>`
    insert into analyses (call_id, org_id, analyzer, analysis)
    values (${analysis.callId}, ${analysis.orgId}, ${analysis.analyzer}, ${JSON.stringify(analysis.analysis)}::text::jsonb)
    on conflict (call_id) do update
      set analyzer = excluded.analyzer, analysis = excluded.analysis, updated_at = now()
      where analyses.analyzer is distinct from excluded.analyzer or analyses.analysis is distinct from excluded.analysis
    returning call_id`

/** Locking: none. */
export const selectAnalysis = (sql: Sql, callId: string) =>
  sql<Array<AnalysisRow>>`select * from analyses where call_id = ${callId}`
