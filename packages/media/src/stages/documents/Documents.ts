/**
 * Every statement the documents pipeline runs on `documents` and `document_transcriptions`, one named
 * function each, with its locking strategy. Table names are unqualified (the pool's search_path is the
 * pgfiber schema); times come from the database clock. DDL is in migrations/0004_documents.sql.
 */
import type { Sql } from "pgfiber/internal/layers/Db.js"
import type { Json } from "../../layers/Transcription.js"

export type ProcessingStatus = "pending" | "processing" | "completed" | "error"

/** The media formats the trigger and the sweep send to transcription. */
export const mediaFormats: ReadonlyArray<string> = ["video", "audio"]

/** What the stage needs of a document it has taken into processing. */
export interface ClaimedDocument {
  readonly id: string
  readonly org_id: string
  readonly canonical_url: string | null
  readonly metadata: Record<string, unknown> | null
  readonly lang: string | null
}

/**
 * the documents' idempotency guard: `pending → processing`, recording the job. A document already in
 * 'processing' under this same job (its previous run's worker died) is taken over; anything else is left
 * alone. Returns the status found (null: no such document, or not the job's org's) and the document when taken.
 * Locking: the document's row, for the length of this one statement.
 */
export const startProcessing = (sql: Sql, documentId: string, jobId: string, orgId: string | null) =>
  sql<Array<{ found_status: ProcessingStatus | null } & Partial<ClaimedDocument>>>`
    with target as (
      select id, processing_status, processing_job_id from documents
      where id = ${documentId} and (${orgId}::text is null or org_id = ${orgId}::text)
      for update
    ), taken as (
      update documents d
      set processing_status = 'processing', processing_job_id = ${jobId}::bigint, updated_at = now()
      from target t
      where d.id = t.id
        and (t.processing_status = 'pending'
             or (t.processing_status = 'processing' and t.processing_job_id = ${jobId}::bigint))
      returning d.id, d.org_id, d.canonical_url, d.metadata, d.lang
    )
    select (select processing_status from target) as found_status, taken.*
    from (select 1) one left join taken on true`

/**
 * Marks the document done, if this job still holds it (an operator may have reset it meanwhile).
 * Locking: the document's row; run in the transaction that upserts the transcription.
 */
export const markCompleted = (sql: Sql, documentId: string, jobId: string) =>
  sql<Array<{ id: string }>>`
    update documents
    set processing_status = 'completed', processed_at = now(), processing_error = null, updated_at = now()
    where id = ${documentId} and processing_status = 'processing' and processing_job_id = ${jobId}::bigint
    returning id`

/**
 * A failed run: back to 'pending' with the reason (the job's onDeadLetter errors it if the job dies).
 * Only if this job still holds the document. Locking: the document's row.
 */
export const recordFailure = (
  sql: Sql, documentId: string, jobId: string, status: "pending" | "error", message: string
) =>
  sql<Array<{ id: string }>>`
    update documents
    set processing_status = ${status}, processing_error = ${message}, updated_at = now()
    where id = ${documentId} and processing_status = 'processing' and processing_job_id = ${jobId}::bigint
    returning id`

/** Document ids are uuids; a dead job's subject that is not one names no document. */
export const isDocumentId = (id: string) => /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(id)

/**
 * The document's job died for good: 'error' with the reason, unless it was completed or another job took it
 * (a document this job never reached, e.g. its payload was bad, has no job recorded). Locking: the document's row.
 */
export const markErrored = (sql: Sql, documentId: string, jobId: string, reason: string) =>
  sql<Array<{ id: string }>>`
    update documents
    set processing_status = 'error', processing_error = ${reason}, updated_at = now()
    where id = ${documentId} and processing_status <> 'completed'
      and (processing_job_id is null or processing_job_id = ${jobId}::bigint)
    returning id`

export interface Transcription {
  readonly documentId: string
  readonly orgId: string
  readonly segments: ReadonlyArray<Json>
  readonly language: string | null
  readonly source: string
  readonly confidenceScore: number | null
  readonly metadata: Readonly<Record<string, Json>>
}

/**
 * One transcription per document: a re-run replaces it. JSON goes in as text cast to jsonb, so it is stored
 * as the array it is (a jsonb-typed parameter would be JSON-encoded again, into a string).
 * Locking: the transcription's row (insert or update on the document_id conflict).
 */
export const upsertTranscription = (sql: Sql, t: Transcription) =>
  sql<Array<{ id: string }>>`
    insert into document_transcriptions (document_id, org_id, segments, language, source, confidence_score, metadata)
    values (${t.documentId}, ${t.orgId}, ${JSON.stringify(t.segments)}::text::jsonb, ${t.language}, ${t.source},
            ${t.confidenceScore}, ${JSON.stringify(t.metadata)}::text::jsonb)
    on conflict (document_id) do update
    set segments = excluded.segments, language = excluded.language, source = excluded.source,
        confidence_score = excluded.confidence_score, metadata = excluded.metadata, updated_at = now()
    returning id`

/**
 * Media documents pending for longer than `stuckAfterMs` with no live `transcribe_document` job (found by its
 * dedupe key), oldest first. Locking: none; the enqueue's dedupe key settles any race.
 */
export const findOrphanedPending = (sql: Sql, stuckAfterMs: number, limit: number) =>
  sql<Array<{ id: string; org_id: string }>>`
    select d.id, d.org_id from documents d
    where d.processing_status = 'pending' and d.media_format in ('video', 'audio')
      and d.updated_at < now() - ${stuckAfterMs}::float8 * interval '1 millisecond'
      and not exists (select 1 from jobs j where j.org_id = d.org_id and j.dedupe_key = 'transcribe_document:' || d.id::text)
    order by d.updated_at, d.id
    limit ${limit}`

/**
 * Media documents left in 'processing' for longer than `stuckAfterMs` whose job is gone without its
 * onDeadLetter reaching them (the job was cancelled, or dead-lettered by a process without the stage). They go to 'error', like any job that
 * ran out of attempts; an operator sets them back to 'pending' to try again.
 * Locking: the rows it changes; the re-check in the outer WHERE skips a row that moved on meanwhile.
 */
export const failOrphanedProcessing = (sql: Sql, stuckAfterMs: number, limit: number) =>
  sql<Array<{ id: string; processing_job_id: string | null }>>`
    with orphans as (
      select d.id, d.processing_job_id from documents d
      where d.processing_status = 'processing' and d.media_format in ('video', 'audio')
        and d.updated_at < now() - ${stuckAfterMs}::float8 * interval '1 millisecond'
        and not exists (select 1 from jobs j where j.id = d.processing_job_id)
      order by d.updated_at, d.id
      limit ${limit}
    )
    update documents d
    set processing_status = 'error', updated_at = now(),
        processing_error = 'transcription stopped without a result: its job '
          || coalesce(o.processing_job_id::text, '(none)')
          || ' is gone (the worker stopped during its last attempt, or the job was cancelled);'
          || ' set processing_status to ''pending'' to try again'
    from orphans o
    where d.id = o.id and d.processing_status = 'processing'
      and d.processing_job_id is not distinct from o.processing_job_id
    returning d.id, d.processing_job_id`
