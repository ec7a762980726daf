/**
 * The call pipeline's front door, for the CLI and the HTTP API: `create` takes a recording (a local file, which
 * is uploaded, or an object already in storage) and in one transaction inserts the call, its `source` artifact
 * and the extract_audio job; `get` reads a call back with its artifacts, transcript and analysis.
 *
 * Both run under row-level security for the call's org when one is given (`Db.withOrg`), so an HTTP handler
 * that passes the caller's org cannot read or create another org's calls.
 */
import { Config, ConfigError, Data, Effect, Either, Option, Schema } from "effect"
import * as NodeCrypto from "node:crypto"
import * as NodeFs from "node:fs/promises"
import * as NodePath from "node:path"
import type * as JobError from "pgfiber/internal/JobError.js"
import type { CallAnalysis, Segment } from "../../layers/Analyzer.js"
import * as Db from "pgfiber/internal/layers/Db.js"
import * as Storage from "../../layers/Storage.js"
import * as Queue from "pgfiber/internal/queue/Queue.js"
import * as CallsSql from "./CallsSql.js"
import * as CallStore from "./CallStore.js"
import * as ExtractAudio from "./ExtractAudio.js"

export type CallStatus = "queued" | "extracting" | "transcribing" | "analyzing" | "done" | "failed"

/** The request cannot be served as given (bad org id, missing file, URI outside the storage): nothing was written. */
export class InvalidCall extends Data.TaggedError("InvalidCall")<{ readonly message: string }> {}

export class CallNotFound extends Data.TaggedError("CallNotFound")<{ readonly message: string; readonly callId: string }> {}

export interface CreateCall {
  readonly orgId: string
  /** A local recording: uploaded to `orgs/{org}/calls/{call}/source.<ext>`. */
  readonly file?: string | undefined
  /**
   * A recording already in this storage (`s3://bucket/key`, its https URL, or `file://` for the fs driver),
   * under the org's prefix `orgs/{org}/` or one of `sourcePrefixes`.
   */
  readonly uri?: string | undefined
  /** Further key prefixes the org may name recordings under (`STORAGE_ORG_PREFIXES`, for this org). */
  readonly sourcePrefixes?: ReadonlyArray<string> | undefined
}

/**
 * `STORAGE_ORG_PREFIXES`: storage prefixes the operator lets an org name recordings under besides its own
 * `orgs/{org}/`, as `org=prefix/` pairs separated by commas (an org may appear several times), e.g.
 * `acme=imports/acme/,acme=shared/recordings/`. Each prefix ends with `/` and has no empty, `.` or `..` segment.
 */
export const parseOrgPrefixes = (text: string): Either.Either<ReadonlyMap<string, ReadonlyArray<string>>, string> => {
  const byOrg = new Map<string, Array<string>>()
  for (const pair of text.split(",").map((p) => p.trim()).filter(Boolean)) {
    const eq = pair.indexOf("=")
    const org = pair.slice(0, eq).trim()
    const prefix = pair.slice(eq + 1).trim()
    if (eq < 0 || !CallStore.orgIdPattern.test(org)) return Either.left(`"${pair}" is not org=prefix/ with a valid org id`)
    if (!prefix.endsWith("/") || prefix.slice(0, -1).split("/").some((s) => s === "" || s === "." || s === "..")) {
      return Either.left(`prefix "${prefix}" must end with / and have no empty, . or .. segment`)
    }
    byOrg.set(org, [...(byOrg.get(org) ?? []), prefix])
  }
  return Either.right(byOrg)
}

export const orgPrefixesConfig: Config.Config<ReadonlyMap<string, ReadonlyArray<string>>> = Config.string("STORAGE_ORG_PREFIXES").pipe(
  Config.mapOrFail((text) =>
    Either.mapLeft(parseOrgPrefixes(text), (message) => ConfigError.InvalidData([], message))
  ),
  Config.withDefault(new Map<string, ReadonlyArray<string>>())
)

/** Where an org's own objects live; keys shown to the org are relative to it. */
export const orgPrefix = (orgId: string) => `orgs/${orgId}/`

/** A storage key as the org sees it: relative to its own prefix (keys under an allowed prefix stay whole). */
export const keyForOrg = (orgId: string, key: string) =>
  key.startsWith(orgPrefix(orgId)) ? key.slice(orgPrefix(orgId).length) : key

/**
 * The one answer for a URI the org may not use: not this storage's, outside its prefixes, or no such object.
 * It names no path and does not say which, so it reveals nothing of other orgs' objects or the server's layout.
 */
export const sourceRefused =
  "uri must name an existing object in this service's storage under the org's prefix (orgs/<org>/) or a prefix the operator allows for the org"


export interface Artifact {
  readonly kind: string
  readonly storageKey: string
  readonly contentType: string | null
  readonly bytes: number | null
  readonly durationMs: number | null
  readonly channels: number | null
  readonly createdAt: Date
  /** When storage retention removed the object (the row stays); null while it is kept. */
  readonly removedAt: Date | null
}

export interface StoredTranscript {
  readonly provider: string
  readonly operationId: string
  readonly language: string | null
  readonly segments: ReadonlyArray<Segment>
  readonly durationMs: number | null
  readonly createdAt: Date
}

export interface StoredAnalysis {
  readonly analyzer: string
  readonly analysis: CallAnalysis
  readonly createdAt: Date
  readonly updatedAt: Date
}

export interface Call {
  readonly id: string
  readonly orgId: string
  readonly status: CallStatus
  /** Why the pipeline gave up, with the stage's name; null unless `failed`. */
  readonly error: string | null
  readonly sourceUri: string
  readonly sourceKey: string
  readonly operationId: string | null
  readonly createdAt: Date
  readonly updatedAt: Date
  readonly completedAt: Date | null
  readonly artifacts: ReadonlyArray<Artifact>
  readonly transcript: StoredTranscript | null
  readonly analysis: StoredAnalysis | null
}

export type CreateError = InvalidCall | JobError.Transient | JobError.Permanent | Db.DbError | Queue.QueueError | Queue.InvalidJob

// ---------------------------------------------------------------------------------------------
// create

const invalid = (message: string) => new InvalidCall({ message })

/** The upload's extension, lower-cased, when it is a plain one; else none (ffprobe sniffs the content anyway). */
const uploadExtension = (file: string) => {
  const ext = NodePath.extname(file).toLowerCase()
  return /^\.[a-z0-9]{1,10}$/.test(ext) ? ext : ""
}

const checkLocalFile = (file: string) =>
  Effect.tryPromise({ try: () => NodeFs.stat(file), catch: () => invalid(`no such file: ${file}`) }).pipe(
    Effect.filterOrFail((stat) => stat.isFile(), () => invalid(`not a regular file: ${file}`))
  )

/** Writes the call, its source artifact and its first job, all or nothing, under the org's row-level security. */
const insertCall = (call: { readonly id: string; readonly orgId: string; readonly sourceUri: string; readonly sourceKey: string; readonly bytes: number | null }) =>
  Effect.gen(function*() {
    const db = yield* Db.Db
    const queue = yield* Queue.Queue
    const first = yield* ExtractAudio.job({ callId: call.id }, { callId: call.id, orgId: call.orgId }).pipe(
      Effect.mapError((e) => new Queue.InvalidJob({ field: "payload", message: e.message }))
    )
    yield* db.withOrg(
      call.orgId,
      Effect.gen(function*() {
        yield* db.run((sql) => CallsSql.insertCall(sql, call))
        yield* db.run((sql) =>
          CallsSql.insertArtifact(sql, {
            callId: call.id,
            orgId: call.orgId,
            kind: "source",
            storageKey: call.sourceKey,
            contentType: null,
            bytes: call.bytes,
            durationMs: null,
            channels: null
          })
        )
        yield* queue.enqueue([first])
      })
    )
  })

/**
 * Creates a call from exactly one of `file` or `uri` and returns its id. The upload happens before the
 * transaction (an object store cannot join it); if the transaction fails, the uploaded object is removed.
 */
export const create = (input: CreateCall): Effect.Effect<string, CreateError, Db.Db | Queue.Queue | Storage.Storage> =>
  Effect.gen(function*() {
    const storage = yield* Storage.Storage
    const { file, orgId, uri } = input
    if (typeof orgId !== "string" || !CallStore.orgIdPattern.test(orgId)) {
      return yield* invalid(`orgId must match ${CallStore.orgIdPattern.source}`)
    }
    if ((file === undefined) === (uri === undefined)) return yield* invalid("give exactly one of file or uri")
    const id = NodeCrypto.randomUUID()

    if (file !== undefined) {
      const stat = yield* checkLocalFile(file)
      const key = CallStore.sourceKey(orgId, id, uploadExtension(file))
      yield* storage.put(key, Storage.fromFile(NodePath.resolve(file)))
      const sourceUri = yield* storage.uri(key)
      yield* insertCall({ id, orgId, sourceUri, sourceKey: key, bytes: stat.size }).pipe(
        Effect.tapError(() => Effect.ignore(storage.remove(key)))
      )
      return id
    }

    const refused = invalid(sourceRefused)
    const key = yield* storage.parseUri(uri!).pipe(Effect.mapError(() => refused))
    const prefixes = [orgPrefix(orgId), ...(input.sourcePrefixes ?? [])]
    if (!prefixes.some((prefix) => key.startsWith(prefix))) return yield* refused
    if (!(yield* storage.exists(key))) return yield* refused
    yield* insertCall({ id, orgId, sourceUri: uri!, sourceKey: key, bytes: null })
    return id
  }).pipe(Effect.withSpan("Calls.create"))

// ---------------------------------------------------------------------------------------------
// get

const bytesOf = (value: string | null) => (value === null ? null : Number(value))

const toArtifact = (row: CallsSql.ArtifactRow): Artifact => ({
  kind: row.kind,
  storageKey: row.storage_key,
  contentType: row.content_type,
  bytes: bytesOf(row.bytes),
  durationMs: row.duration_ms,
  channels: row.channels,
  createdAt: row.created_at,
  removedAt: row.removed_at ?? null
})

const isUuid = Schema.is(CallStore.CallId)

export interface GetOptions {
  /** Read under this org's row-level security: another org's call is not found. */
  readonly orgId?: string | undefined
}

/** The call with everything the pipeline has made of it so far. */
export const get = (id: string, options: GetOptions = {}): Effect.Effect<Call, CallNotFound | Db.DbError, Db.Db> =>
  Effect.gen(function*() {
    const db = yield* Db.Db
    const notFound = new CallNotFound({ callId: id, message: `call ${id} not found` })
    if (!isUuid(id)) return yield* notFound
    const read = Effect.all({
      call: db.run((sql) => CallsSql.selectCall(sql, id)),
      artifacts: db.run((sql) => CallsSql.selectArtifacts(sql, id)),
      transcript: db.run((sql) => CallsSql.selectTranscript(sql, id)),
      analysis: db.run((sql) => CallsSql.selectAnalysis(sql, id))
    })
    // one transaction: a call read while a stage commits is seen before or after that stage, never half
    const rows = yield* (options.orgId === undefined ? db.transaction(read) : db.withOrg(options.orgId, read))
    const call = Option.fromNullable(rows.call[0])
    if (Option.isNone(call)) return yield* notFound
    const c = call.value
    const t = rows.transcript[0]
    const a = rows.analysis[0]
    return {
      id: c.id,
      orgId: c.org_id,
      status: c.status as CallStatus,
      error: c.error,
      sourceUri: c.source_uri,
      sourceKey: c.source_key,
      operationId: c.operation_id,
      createdAt: c.created_at,
      updatedAt: c.updated_at,
      completedAt: c.completed_at,
      artifacts: rows.artifacts.map(toArtifact),
      transcript: t === undefined ? null : {
        provider: t.provider,
        operationId: t.operation_id,
        language: t.language,
        segments: t.segments as ReadonlyArray<Segment>,
        durationMs: t.duration_ms,
        createdAt: t.created_at
      },
      analysis: a === undefined ? null : {
        analyzer: a.analyzer,
        analysis: a.analysis as CallAnalysis,
        createdAt: a.created_at,
        updatedAt: a.updated_at
      }
    }
  }).pipe(Effect.withSpan("Calls.get"))
