/**
 * Stage `transcribe_document` (the documents' pull worker): the documents trigger enqueues one job per inserted
 * video/audio document; this handler guards on `processing_status`, calls the transcription service,
 * upserts `document_transcriptions` and marks the document completed, or records why not.
 *
 * | run ends with                               | document                     | job                 |
 * | ------------------------------------------- | ---------------------------- | ------------------- |
 * | document not pending (stale/duplicate job)  | untouched                    | completed (deleted) |
 * | no such document in the job's org           | untouched                    | dead-lettered       |
 * | transcription stored                        | `completed`, `processed_at`  | completed (deleted) |
 * | a failed run (any error, a defect)          | back to `pending` + reason   | retried (backoff)…  |
 * | …and the job dies instead (any cause)       | `error` + reason             | dead-lettered       |
 * | interrupted (shutdown, cancel)              | stays `processing`           | released            |
 *
 * The job's fate is the runtime's: the handler does not guess it. Every death (a Permanent answer or a
 * missing url, attempts exhausted, a defect or timeout on the last attempt, a worker killed during its last
 * attempt, a payload that fails the Schema) reaches `onDeadLetter`, which errors the document in the
 * dead-letter transaction. A run killed mid-way leaves the document in `processing` under its job id; that
 * job's next run takes it over (the guard accepts it).
 */
import { Cause, Duration, Effect, Exit, Option, Schema } from "effect"
import { Permanent, Transient } from "pgfiber/internal/JobError.js"
import * as Db from "pgfiber/internal/layers/Db.js"
import * as Transcription from "../../layers/Transcription.js"
import type * as Job from "pgfiber/internal/queue/Job.js"
import * as RetryPolicy from "pgfiber/internal/runtime/RetryPolicy.js"
import * as Stage from "pgfiber/internal/runtime/Stage.js"
import * as Documents from "./Documents.js"

export const stageName = "transcribe_document"

export const TranscribeDocumentPayload = Schema.Struct({ documentId: Schema.UUID })
export type TranscribeDocumentPayload = typeof TranscribeDocumentPayload.Type

/** The documents' retry budget. The documents trigger writes the same number into the jobs it enqueues. */
export const maxAttempts = 5

/** What `document_transcriptions.source` says of transcripts made here. */
export const source = "ai"

/**
 * Transcription is slow, paid, external work: the call pipeline's curve (30 s, 1 min, 2 min, 4 min … capped at 10
 * minutes), so five attempts span about 8 minutes of a service outage; 429s wait for the server's Retry-After.
 */
export const policy = RetryPolicy.make({ Transient: RetryPolicy.slowBackoff })

/** Longer than the client's own bound (TRANSCRIBE_TIMEOUT_MS, default 10 minutes), which should fire first. */
export const defaultTimeout = Duration.minutes(15)

/** The dedupe key every transcribe_document job carries: one live job per document, whoever enqueues it. */
export const dedupeKeyFor = (documentId: string) => `${stageName}:${documentId}`

/** The job the trigger writes for a document, for producers in TypeScript (the sweep). */
export const jobFor = (document: { readonly id: string; readonly orgId: string }): Job.NewJob => ({
  stage: stageName,
  payload: { documentId: document.id },
  orgId: document.orgId,
  subjectId: document.id,
  maxAttempts,
  dedupeKey: dedupeKeyFor(document.id)
})

/** The media URL: `canonical_url`, else `metadata.media_url`; blank counts as missing. */
export const mediaUrlOf = (document: Pick<Documents.ClaimedDocument, "canonical_url" | "metadata">): string | undefined => {
  const canonical = document.canonical_url?.trim()
  if (canonical) return canonical
  const fromMetadata = document.metadata?.media_url
  return typeof fromMetadata === "string" && fromMetadata.trim() !== "" ? fromMetadata.trim() : undefined
}

export interface TranscribeDocumentOptions {
  readonly policy?: RetryPolicy.RetryPolicy
  readonly concurrency?: number
  readonly timeout?: Duration.DurationInput
  readonly leaseFor?: Duration.DurationInput
}

const asTransient = (e: Db.DbError) => new Transient({ message: `database: ${e.message}` })

/** The failed run's message for the document: the typed error's, or the defect's first line. */
const messageOf = (cause: Cause.Cause<unknown>): string =>
  Option.match(Cause.failureOption(cause), {
    onNone: () => `defect: ${Cause.pretty(cause).split("\n")[0]}`,
    onSome: (e) => String((e as { readonly message?: unknown })?.message ?? e)
  })

/**
 * The job died for good (whatever the cause: a Permanent answer, attempts exhausted, a defect, a timeout, a
 * worker killed on the last attempt, a bad payload): the document goes to error with the reason, unless it
 * was completed or another job holds it. Runs in the dead-letter transaction.
 */
export const markErrored = (dead: Stage.DeadLettered) =>
  Effect.gen(function*() {
    const documentId = dead.job.subjectId
    if (documentId === null || !Documents.isDocumentId(documentId)) return
    const db = yield* Db.Db
    const [row] = yield* db.run((sql) => Documents.markErrored(sql, documentId, dead.job.id, `${stageName}: ${dead.reason}`))
    if (row) yield* Effect.logWarning(`document in error (${dead.kind}): ${dead.reason}`).pipe(Effect.annotateLogs({ documentId }))
  })

export const makeTranscribeDocument = (options: TranscribeDocumentOptions = {}) => {
  const stagePolicy = options.policy ?? policy

  /**
   * A failed run puts the document back to pending with the reason; whether the job runs again is the
   * runtime's business: when it dies instead, `onDeadLetter` moves the document to error. Never masks the
   * run's own error.
   */
  const recordFailure = (documentId: string, job: Stage.JobInfo, cause: Cause.Cause<unknown>) =>
    Effect.gen(function*() {
      // interrupted: the job is released or retried, and its next run takes the document over
      if (Cause.isInterruptedOnly(cause)) return
      const db = yield* Db.Db
      const message = messageOf(cause)
      yield* db.run((sql) => Documents.recordFailure(sql, documentId, job.id, "pending", message))
      yield* Effect.logInfo(`document back to pending: ${message}`)
    }).pipe(
      Effect.catchAllCause((c) => Effect.logWarning("could not record the failure on the document", c))
    )

  const transcribe = (document: Documents.ClaimedDocument, job: Stage.JobInfo) =>
    Effect.gen(function*() {
      const url = mediaUrlOf(document)
      if (url === undefined) {
        return yield* new Permanent({
          message: `document ${document.id} has no media url: canonical_url and metadata.media_url are both empty`
        })
      }
      const transcription = yield* Transcription.Transcription
      const result = yield* transcription.transcribe({ url })
      const db = yield* Db.Db
      // the transcription and the status change commit together: a reader never sees one without the other
      const stored = yield* db.transaction(
        Effect.gen(function*() {
          const held = yield* db.run((sql) => Documents.markCompleted(sql, document.id, job.id))
          if (held.length === 0) return false
          yield* db.run((sql) =>
            Documents.upsertTranscription(sql, {
              documentId: document.id,
              orgId: document.org_id,
              segments: result.segments,
              language: result.language ?? document.lang,
              source,
              confidenceScore: result.confidence ?? null,
              metadata: result.metadata ?? {}
            })
          )
          return true
        })
      ).pipe(Effect.mapError(asTransient))
      if (stored) yield* Effect.logInfo(`transcribed: ${result.segments.length} segment(s)`)
      else yield* Effect.logWarning("the document changed while it was transcribed (reset by hand?); result discarded")
    })

  const handler = (payload: TranscribeDocumentPayload, job: Stage.JobInfo) =>
    Effect.gen(function*() {
      const db = yield* Db.Db
      const [row] = yield* db.run((sql) => Documents.startProcessing(sql, payload.documentId, job.id, job.orgId)).pipe(
        Effect.mapError(asTransient)
      )
      if (row?.found_status === null || row?.found_status === undefined) {
        // missing, or another org's (same words either way: the dead letter is no oracle); nothing touched
        return yield* new Permanent({ message: `document ${payload.documentId} does not exist` })
      }
      if (!row.id) {
        // a stale or duplicate request is acknowledged: the job simply completes
        return yield* Effect.logInfo(`document is ${row.found_status}, not pending: nothing to do (stale or duplicate job)`)
      }
      const document = row as Documents.ClaimedDocument
      yield* transcribe(document, job).pipe(
        Effect.onExit((exit) => Exit.isFailure(exit) ? recordFailure(document.id, job, exit.cause) : Effect.void)
      )
    }).pipe(Effect.annotateLogs({ documentId: payload.documentId }))

  return Stage.make({
    name: stageName,
    // enqueued by the documents trigger and the sweep, never by a tenant
    visibility: "internal",
    payload: TranscribeDocumentPayload,
    handler,
    // the worker mostly waits on the service; PGFIBER_CONCURRENCY=transcribe_document=N overrides this
    concurrency: options.concurrency ?? 8,
    timeout: options.timeout ?? defaultTimeout,
    ...(options.leaseFor === undefined ? {} : { leaseFor: options.leaseFor }),
    policy: stagePolicy,
    maxAttempts,
    onDeadLetter: markErrored
  })
}

/** The production stage. */
export const transcribeDocument = makeTranscribeDocument()
