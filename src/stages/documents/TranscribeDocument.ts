/**
 * Stage `transcribe_document` (seed 003's pull worker): the documents trigger enqueues one job per inserted
 * video/audio document; this handler guards on `processing_status`, calls the transcription service,
 * upserts `document_transcriptions` and marks the document completed, or records why not.
 *
 * | run ends with                               | document                     | job                 |
 * | ------------------------------------------- | ---------------------------- | ------------------- |
 * | document not pending (stale/duplicate job)  | untouched                    | completed (deleted) |
 * | no such document in the job's org           | untouched                    | dead-lettered       |
 * | transcription stored                        | `completed`, `processed_at`  | completed (deleted) |
 * | no media url, or the service says Permanent | `error` + reason             | dead-lettered       |
 * | retryable failure, attempts remain          | back to `pending` + reason   | retried (backoff)   |
 * | retryable failure on the last attempt       | `error` + reason             | dead-lettered       |
 * | interrupted (shutdown, cancel, timeout)     | stays `processing`           | released / retried  |
 *
 * A run interrupted or killed mid-way leaves the document in `processing` under its job id; that job's
 * next run takes it over (the guard accepts it), and the sweep errors it if the job is gone for good.
 */
import { Cause, Duration, Effect, Exit, Option, Schema } from "effect"
import { Permanent, Transient } from "../../JobError.js"
import * as Db from "../../layers/Db.js"
import * as Transcription from "../../layers/Transcription.js"
import type * as Job from "../../queue/Job.js"
import * as RetryPolicy from "../../runtime/RetryPolicy.js"
import * as Stage from "../../runtime/Stage.js"
import * as Documents from "./Documents.js"

export const stageName = "transcribe_document"

export const TranscribeDocumentPayload = Schema.Struct({ documentId: Schema.UUID })
export type TranscribeDocumentPayload = typeof TranscribeDocumentPayload.Type

/** seed 003's MAX_RETRIES. The documents trigger writes the same number into the jobs it enqueues. */
export const maxAttempts = 5

/** What `document_transcriptions.source` says of transcripts made here. */
export const source = "ai"

/**
 * Transcription is slow, paid, external work: seed 000's curve (30 s, 1 min, 2 min, 4 min … capped at 10
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

/** seed 003: `canonical_url`, else `metadata.media_url`; blank counts as missing. */
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

/** The same reading of a failed run the runtime makes, so the document's status matches the job's fate. */
const failureOf = (cause: Cause.Cause<unknown>): RetryPolicy.Failure => {
  const failure = Cause.failureOption(cause)
  if (Option.isNone(failure)) return { _tag: "Defect", message: `defect: ${Cause.pretty(cause).split("\n")[0]}` }
  const e = failure.value as { readonly _tag?: string; readonly message?: string }
  switch (e._tag) {
    case "Transient":
    case "Permanent":
      return { _tag: e._tag, message: e.message ?? e._tag }
    case "RateLimited":
      return { _tag: "RateLimited", error: e as never }
    case "NotReady":
      return { _tag: "NotReady", error: e as never }
  }
  return { _tag: "Defect", message: String(e.message ?? e) }
}

const messageOf = (failure: RetryPolicy.Failure) =>
  failure._tag === "RateLimited" || failure._tag === "NotReady" ? failure.error.message : failure.message

export const makeTranscribeDocument = (options: TranscribeDocumentOptions = {}) => {
  const stagePolicy = options.policy ?? policy

  /** Back to pending when the job will run again, error when it will not; never masks the run's own error. */
  const recordFailure = (documentId: string, job: Stage.JobInfo, cause: Cause.Cause<unknown>) =>
    Effect.gen(function*() {
      // interrupted: the job is released or retried, and its next run takes the document over
      if (Cause.isInterruptedOnly(cause)) return
      const db = yield* Db.Db
      const failure = failureOf(cause)
      const decision = yield* RetryPolicy.decide(stagePolicy, failure, job.attempt, job.polls)
      const willRetry = decision._tag !== "DeadLetter" && job.attempt < job.maxAttempts
      const status = willRetry ? "pending" : "error"
      yield* db.run((sql) => Documents.recordFailure(sql, documentId, job.id, status, messageOf(failure)))
      yield* Effect.logInfo(`${willRetry ? "document back to pending" : "document in error"}: ${messageOf(failure)}`)
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
        // seed 003 acks a stale or duplicate message; here the job simply completes
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
    maxAttempts
  })
}

/** The production stage. */
export const transcribeDocument = makeTranscribeDocument()
