/**
 * Object storage for pipeline artifacts (raw recordings, extracted audio, transcripts).
 *
 * Three implementations behind one tag: `layerFs` (a directory, the default for local runs),
 * `layerS3` (any S3-compatible service; Yandex Object Storage in production, because SpeechKit
 * downloads its input from there) and `layerMemory` (unit tests). `layerFromConfig` picks one from env.
 *
 * Keys are relative, `/`-separated paths (`calls/<id>/audio.ogg`); the same validation runs in
 * every implementation so the twins cannot drift. Failures speak the JobError vocabulary, plus
 * `ObjectNotFound` for a missing object, which a stage decides about (often: "not yet" or Permanent).
 */
// the AWS SDK is loaded only when S3 is configured: importing it costs every CLI command a quarter second
import type { CompletedPart } from "@aws-sdk/client-s3"
import type { PlatformError } from "@effect/platform/Error"
import * as FileSystem from "@effect/platform/FileSystem"
import * as NodeFileSystem from "@effect/platform-node/NodeFileSystem"
import { Config, ConfigError, Context, Effect, Either, Exit, Layer, Redacted, Schema, Stream } from "effect"
import * as NodeCrypto from "node:crypto"
import * as NodePath from "node:path"
import * as NodeUrl from "node:url"
import * as JobError from "../JobError.js"

/** The object is not in storage. Schema-tagged so a stage may store it as the reason it gave up. */
export class ObjectNotFound extends Schema.TaggedError<ObjectNotFound>()("ObjectNotFound", {
  key: Schema.String,
  message: Schema.String
}) {}

/** What reads fail with. */
export type ReadError = ObjectNotFound | JobError.Transient | JobError.Permanent

/** What writes fail with (plus the error of a caller's stream). */
export type WriteError = JobError.Transient | JobError.Permanent

/** A local file to upload; a bare string would be ambiguous between a path and contents. */
export interface FromFile {
  readonly _tag: "FromFile"
  readonly path: string
}

export const fromFile = (path: string): FromFile => ({ _tag: "FromFile", path })

/** What `put` accepts: bytes in memory, a local file, or a stream (whose error `E` passes through). */
export type Body<E = never> = Uint8Array | FromFile | Stream.Stream<Uint8Array, E>

export class Storage extends Context.Tag("pgfiber/Storage")<Storage, {
  readonly put: <E = never>(key: string, body: Body<E>) => Effect.Effect<void, WriteError | E>
  readonly get: (key: string) => Effect.Effect<Uint8Array, ReadError>
  /** Writes the object to `localPath` atomically (temp file + rename), creating parent directories. */
  readonly download: (key: string, localPath: string) => Effect.Effect<void, ReadError>
  readonly exists: (key: string) => Effect.Effect<boolean, WriteError>
  /** Idempotent: removing a missing object succeeds. */
  readonly remove: (key: string) => Effect.Effect<void, WriteError>
  /** Where the object can be fetched from: path-style https for S3 (what SpeechKit downloads), `file://` for fs. */
  readonly uri: (key: string) => Effect.Effect<string, JobError.Permanent>
  /** The key of a URI that points into this storage (`s3://bucket/key`, path-style endpoint URL, `file://`). */
  readonly parseUri: (uri: string) => Effect.Effect<string, JobError.Permanent>
}>() {}

// ---------------------------------------------------------------------------------------------
// Keys and URIs, shared by every implementation

const invalidKeyReason = (key: string): string | undefined => {
  if (key.length === 0) return "it is empty"
  if (Buffer.byteLength(key, "utf8") > 1024) return "it is longer than 1024 bytes"
  if (key.startsWith("/")) return "it starts with /"
  if (key.includes("\\")) return "it contains a backslash"
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u001f\u007f]/.test(key)) return "it contains a control character"
  if (key.split("/").some((segment) => segment === "" || segment === "." || segment === "..")) {
    return "it has an empty, . or .. segment"
  }
  return undefined
}

/** Rejects keys that could escape the fs root or mean different objects on different drivers. */
export const validateKey = (key: string): Effect.Effect<string, JobError.Permanent> => {
  const reason = invalidKeyReason(key)
  return reason === undefined
    ? Effect.succeed(key)
    : Effect.fail(new JobError.Permanent({ message: `invalid storage key ${JSON.stringify(key)}: ${reason}` }))
}

const encodeKey = (key: string): string => key.split("/").map(encodeURIComponent).join("/")

const decodeKey = (encoded: string, uri: string): Either.Either<string, JobError.Permanent> =>
  Either.try({
    try: () => encoded.split("/").map(decodeURIComponent).join("/"),
    catch: () => new JobError.Permanent({ message: `malformed percent-encoding in ${uri}` })
  })

/** A storage URI taken apart, before checking it belongs to a particular storage. */
export type Location =
  | { readonly _tag: "S3"; readonly bucket: string; readonly key: string; readonly host: string | undefined }
  | { readonly _tag: "File"; readonly path: string }
  | { readonly _tag: "Memory"; readonly key: string }

/**
 * Parses `s3://bucket/key`, path-style `http(s)://host/bucket/key`, `file:///abs/path` and `memory:///key`.
 * The `host` of an http(s) location is kept so a storage can refuse URLs of another endpoint.
 */
export const parseLocation = (uri: string): Either.Either<Location, JobError.Permanent> => {
  const invalid = (why: string) => Either.left(new JobError.Permanent({ message: `unsupported storage URI ${uri}: ${why}` }))
  let url: URL
  try {
    url = new URL(uri)
  } catch {
    return invalid("not a URL")
  }
  switch (url.protocol) {
    case "s3:": {
      if (url.hostname === "") return invalid("no bucket")
      return Either.map(decodeKey(url.pathname.slice(1), uri), (key) => ({
        _tag: "S3" as const,
        bucket: url.hostname,
        key,
        host: undefined
      }))
    }
    case "http:":
    case "https:": {
      const path = url.pathname.slice(1)
      const slash = path.indexOf("/")
      if (slash <= 0) return invalid("expected a path-style URL https://endpoint/bucket/key")
      return Either.map(decodeKey(path.slice(slash + 1), uri), (key) => ({
        _tag: "S3" as const,
        bucket: path.slice(0, slash),
        key,
        host: url.host
      }))
    }
    case "file:":
      return Either.right({ _tag: "File", path: NodeUrl.fileURLToPath(url) })
    case "memory:":
      return Either.map(decodeKey(url.pathname.slice(1), uri), (key) => ({ _tag: "Memory" as const, key }))
    default:
      return invalid(`unknown scheme ${url.protocol}`)
  }
}

const notThisStorage = (uri: string, why: string) =>
  new JobError.Permanent({ message: `${uri} does not point into this storage: ${why}` })

// ---------------------------------------------------------------------------------------------
// Bodies and local files

const isStream = (u: unknown): u is Stream.Stream<Uint8Array, unknown> =>
  typeof u === "object" && u !== null && Stream.StreamTypeId in u

const concatBytes = (chunks: ReadonlyArray<Uint8Array>): Uint8Array => {
  if (chunks.length === 1) return chunks[0]!
  return Buffer.concat(chunks)
}

const fsErrorToJobError = (what: string) => (error: PlatformError): JobError.Transient | JobError.Permanent =>
  error._tag === "SystemError" && error.reason !== "PermissionDenied" && error.reason !== "InvalidData"
    ? new JobError.Transient({ message: `${what}: ${error.message}` })
    : new JobError.Permanent({ message: `${what}: ${error.message}` })

/** Reads a caller's local file; a missing source is the caller's mistake, so Permanent. */
const streamLocalFile = (fs: FileSystem.FileSystem, path: string): Stream.Stream<Uint8Array, WriteError> =>
  fs.stream(path).pipe(
    Stream.mapError((error) =>
      error._tag === "SystemError" && error.reason === "NotFound"
        ? new JobError.Permanent({ message: `source file not found: ${path}` })
        : fsErrorToJobError(`reading ${path}`)(error)
    )
  )

const bodyToStream = <E>(fs: FileSystem.FileSystem, body: Body<E>): Stream.Stream<Uint8Array, E | WriteError> =>
  body instanceof Uint8Array
    ? Stream.make(body)
    : isStream(body)
    ? (body as Stream.Stream<Uint8Array, E>)
    : streamLocalFile(fs, body.path)

/**
 * Writes `bytes` to `target` through a temp file in the same directory and a rename, so readers
 * see the old file or the whole new one, never a prefix. The source stream's errors pass untouched.
 */
const writeFileAtomically = <E>(
  fs: FileSystem.FileSystem,
  target: string,
  bytes: Stream.Stream<Uint8Array, E>
): Effect.Effect<void, E | WriteError> => {
  const directory = NodePath.dirname(target)
  const temp = NodePath.join(directory, `.${NodePath.basename(target)}.${NodeCrypto.randomUUID()}.tmp`)
  const onFsError = fsErrorToJobError(`writing ${target}`)
  const writeTemp = Effect.scoped(
    Effect.gen(function*() {
      const file = yield* fs.open(temp, { flag: "wx" }).pipe(Effect.mapError(onFsError))
      yield* Stream.runForEach(bytes, (chunk) => file.writeAll(chunk).pipe(Effect.mapError(onFsError)))
      // Durable before it becomes visible: a crash after the rename must not leave an empty object.
      yield* file.sync.pipe(Effect.mapError(onFsError))
    })
  )
  return fs.makeDirectory(directory, { recursive: true }).pipe(
    Effect.mapError(onFsError),
    Effect.zipRight(writeTemp),
    Effect.zipRight(fs.rename(temp, target).pipe(Effect.mapError(onFsError))),
    Effect.onExit((exit) => Exit.isFailure(exit) ? Effect.ignore(fs.remove(temp, { force: true })) : Effect.void)
  )
}

// ---------------------------------------------------------------------------------------------
// Filesystem

export const defaultRootDir = ".data/storage"

export const makeFs = (rootDir: string = defaultRootDir) =>
  Effect.gen(function*() {
    const fs = yield* FileSystem.FileSystem
    const root = NodePath.resolve(rootDir)
    yield* fs.makeDirectory(root, { recursive: true }).pipe(Effect.mapError(fsErrorToJobError(`creating ${root}`)))
    const pathOf = (key: string) => NodePath.join(root, ...key.split("/"))

    // A directory at the key's path (a prefix of other keys) is not an object.
    const isObject = (key: string) =>
      fs.stat(pathOf(key)).pipe(
        Effect.map((info) => info.type === "File"),
        Effect.catchIf(
          (error) => error._tag === "SystemError" && error.reason === "NotFound",
          () => Effect.succeed(false)
        ),
        Effect.mapError(fsErrorToJobError(`stat ${key}`))
      )

    const requireObject = (key: string) =>
      Effect.filterOrFail(
        isObject(key),
        (found) => found,
        () => new ObjectNotFound({ key, message: `no object ${key} in ${root}` })
      )

    const put = Effect.fn("Storage.put")(function*<E>(key: string, body: Body<E>) {
      yield* Effect.annotateCurrentSpan({ key, driver: "fs" })
      yield* validateKey(key)
      yield* writeFileAtomically(fs, pathOf(key), bodyToStream(fs, body))
    })

    const get = Effect.fn("Storage.get")(function*(key: string) {
      yield* Effect.annotateCurrentSpan({ key, driver: "fs" })
      yield* validateKey(key)
      yield* requireObject(key)
      return yield* fs.readFile(pathOf(key)).pipe(Effect.mapError(fsErrorToJobError(`reading ${key}`)))
    })

    const download = Effect.fn("Storage.download")(function*(key: string, localPath: string) {
      yield* Effect.annotateCurrentSpan({ key, localPath, driver: "fs" })
      yield* validateKey(key)
      yield* requireObject(key)
      const source = fs.stream(pathOf(key)).pipe(Stream.mapError(fsErrorToJobError(`reading ${key}`)))
      yield* writeFileAtomically(fs, NodePath.resolve(localPath), source)
    })

    const exists = Effect.fn("Storage.exists")(function*(key: string) {
      yield* Effect.annotateCurrentSpan({ key, driver: "fs" })
      yield* validateKey(key)
      return yield* isObject(key)
    })

    // Empty parent directories are left behind on purpose: pruning them races a concurrent put.
    const remove = Effect.fn("Storage.remove")(function*(key: string) {
      yield* Effect.annotateCurrentSpan({ key, driver: "fs" })
      yield* validateKey(key)
      if (yield* isObject(key)) {
        yield* fs.remove(pathOf(key), { force: true }).pipe(Effect.mapError(fsErrorToJobError(`removing ${key}`)))
      }
    })

    const uri = (key: string) => Effect.map(validateKey(key), (key) => NodeUrl.pathToFileURL(pathOf(key)).href)

    const parseUri = (uri: string) =>
      Effect.flatMap(parseLocation(uri), (location) => {
        if (location._tag !== "File") return Effect.fail(notThisStorage(uri, "expected a file:// URI"))
        const relative = NodePath.relative(root, location.path)
        if (relative === "" || relative.startsWith("..") || NodePath.isAbsolute(relative)) {
          return Effect.fail(notThisStorage(uri, `outside ${root}`))
        }
        return validateKey(relative.split(NodePath.sep).join("/"))
      })

    return Storage.of({ put, get, download, exists, remove, uri, parseUri })
  })

/** Objects as files under `rootDir` (default `.data/storage`), written atomically. */
export const layerFs = (rootDir: string = defaultRootDir): Layer.Layer<Storage, WriteError> =>
  Layer.effect(Storage, makeFs(rootDir)).pipe(Layer.provide(NodeFileSystem.layer))

// ---------------------------------------------------------------------------------------------
// Memory

export const makeMemory = Effect.gen(function*() {
  const fs = yield* FileSystem.FileSystem
  const objects = new Map<string, Uint8Array>()

  const requireObject = (key: string) =>
    Effect.flatMap(validateKey(key), (key) => {
      const bytes = objects.get(key)
      return bytes === undefined
        ? Effect.fail(new ObjectNotFound({ key, message: `no object ${key} in memory storage` }))
        : Effect.succeed(bytes)
    })

  const put = Effect.fn("Storage.put")(function*<E>(key: string, body: Body<E>) {
    yield* validateKey(key)
    const chunks = yield* Stream.runCollect(bodyToStream(fs, body))
    // Copied so a caller mutating its buffer afterwards cannot change the stored object.
    objects.set(key, Uint8Array.from(concatBytes(Array.from(chunks))))
  })

  const get = Effect.fn("Storage.get")(function*(key: string) {
    return Uint8Array.from(yield* requireObject(key))
  })

  const download = Effect.fn("Storage.download")(function*(key: string, localPath: string) {
    const bytes = yield* requireObject(key)
    yield* writeFileAtomically(fs, NodePath.resolve(localPath), Stream.make(bytes))
  })

  const exists = (key: string) => Effect.map(validateKey(key), (key) => objects.has(key))

  const remove = (key: string) =>
    Effect.map(validateKey(key), (key) => {
      objects.delete(key)
    })

  const uri = (key: string) => Effect.map(validateKey(key), (key) => `memory:///${encodeKey(key)}`)

  const parseUri = (uri: string) =>
    Effect.flatMap(parseLocation(uri), (location) =>
      location._tag === "Memory" ? validateKey(location.key) : Effect.fail(notThisStorage(uri, "expected memory:///key")))

  return Storage.of({ put, get, download, exists, remove, uri, parseUri })
})

/** In-process objects for unit tests; `download` and `fromFile` still touch the real filesystem. */
export const layerMemory: Layer.Layer<Storage> = Layer.effect(Storage, makeMemory).pipe(
  Layer.provide(NodeFileSystem.layer)
)

// ---------------------------------------------------------------------------------------------
// S3

export interface S3Config {
  /** `scheme://host[:port]`, e.g. `https://storage.yandexcloud.net`. */
  readonly endpoint: string
  readonly region: string
  readonly bucket: string
  readonly accessKeyId: string
  readonly secretAccessKey: Redacted.Redacted<string>
  /** Streams are uploaded in parts of this size (S3 wants >= 5 MiB for all but the last); smaller bodies go in one PUT. */
  readonly partSizeBytes?: number
}

export const defaultPartSizeBytes = 8 * 1024 * 1024

const networkErrorCodes = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "ECONNABORTED",
  "EPIPE",
  "ETIMEDOUT",
  "ENOTFOUND",
  "EAI_AGAIN",
  "ENETUNREACH",
  "EHOSTUNREACH",
  "UND_ERR_SOCKET"
])

interface SdkErrorLike {
  readonly name?: string
  readonly message?: string
  readonly code?: string
  readonly $metadata?: { readonly httpStatusCode?: number }
}

const describeS3Error = (operation: string, key: string, error: unknown) => {
  const e = (typeof error === "object" && error !== null ? error : {}) as SdkErrorLike
  const status = e.$metadata?.httpStatusCode
  const text = `S3 ${operation} ${key}: ${e.name ?? "Error"}: ${e.message ?? String(error)}`
  return { e, status, text: status === undefined ? text : `${text} (HTTP ${status})` }
}

/** 5xx, throttling and a dropped connection may pass; any other answer from S3 will not. */
const s3WriteFailure = (operation: string, key: string) => (error: unknown): JobError.Transient | JobError.Permanent => {
  const { e, status, text } = describeS3Error(operation, key, error)
  const transient = status === undefined
    ? (e.code !== undefined && networkErrorCodes.has(e.code)) || e.name === "TimeoutError" ||
      e.name === "RequestTimeout" || e.name === "NetworkingError"
    : status >= 500 || status === 429 || status === 408 || e.name === "SlowDown"
  return transient ? new JobError.Transient({ message: text }) : new JobError.Permanent({ message: text })
}

const s3ReadFailure = (operation: string, key: string) => (error: unknown): ReadError => {
  const { e, status, text } = describeS3Error(operation, key, error)
  // HeadObject has no body, so a missing key is a bare 404 named "NotFound"; GetObject says NoSuchKey.
  return e.name === "NoSuchKey" || (e.name === "NotFound" && status === 404)
    ? new ObjectNotFound({ key, message: text })
    : s3WriteFailure(operation, key)(error)
}

export const makeS3 = (config: S3Config) =>
  Effect.gen(function*() {
    const {
      AbortMultipartUploadCommand,
      CompleteMultipartUploadCommand,
      CreateMultipartUploadCommand,
      DeleteObjectCommand,
      GetObjectCommand,
      HeadObjectCommand,
      PutObjectCommand,
      S3Client,
      UploadPartCommand
    } = yield* Effect.promise(() => import("@aws-sdk/client-s3"))
    const fs = yield* FileSystem.FileSystem
    const { bucket } = config
    const endpoint = yield* Either.mapLeft(
      normalizeEndpoint(config.endpoint),
      (message) => new JobError.Permanent({ message: `S3 endpoint: ${message}` })
    )
    const endpointHost = new URL(endpoint).host
    const partSize = config.partSizeBytes ?? defaultPartSizeBytes
    const client = yield* Effect.acquireRelease(
      Effect.sync(() =>
        new S3Client({
          endpoint,
          region: config.region,
          forcePathStyle: true,
          // Without these the SDK sends streamed bodies aws-chunked with a CRC trailer, which
          // S3-compatible servers were seen to store verbatim: corrupted objects.
          requestChecksumCalculation: "WHEN_REQUIRED",
          responseChecksumValidation: "WHEN_REQUIRED",
          credentials: { accessKeyId: config.accessKeyId, secretAccessKey: Redacted.value(config.secretAccessKey) }
        })
      ),
      (client) => Effect.sync(() => client.destroy())
    )

    // The abort signal ties the HTTP request to the fiber: interrupting the fiber cancels the request.
    const call = <A, E>(run: (signal: AbortSignal) => Promise<A>, onError: (error: unknown) => E) =>
      Effect.tryPromise({ try: run, catch: onError })

    const putBytes = (key: string, bytes: Uint8Array) =>
      call(
        (abortSignal) =>
          client.send(
            new PutObjectCommand({ Bucket: bucket, Key: key, Body: bytes, ContentLength: bytes.byteLength }),
            { abortSignal }
          ),
        s3WriteFailure("PutObject", key)
      )

    /**
     * Buffers one part at a time, so memory stays at `partSize` whatever the stream's length; every
     * request carries bytes of known length, which keeps the SDK's retries able to resend them.
     * A failed or interrupted upload is aborted so its parts do not linger (and bill) in the bucket.
     */
    const putStream = <E>(key: string, body: Stream.Stream<Uint8Array, E>): Effect.Effect<void, E | WriteError> =>
      Effect.suspend(() => {
        let pending: Array<Uint8Array> = []
        let pendingBytes = 0
        let uploadId: string | undefined
        const parts: Array<CompletedPart> = []
        const takePending = () => {
          const bytes = concatBytes(pending)
          pending = []
          pendingBytes = 0
          return bytes
        }
        const startUpload = Effect.suspend(() =>
          uploadId !== undefined ? Effect.succeed(uploadId) : call(
            (abortSignal) => client.send(new CreateMultipartUploadCommand({ Bucket: bucket, Key: key }), { abortSignal }),
            s3WriteFailure("CreateMultipartUpload", key)
          ).pipe(
            Effect.flatMap((created) =>
              created.UploadId === undefined
                ? Effect.fail(new JobError.Permanent({ message: `S3 CreateMultipartUpload ${key}: no UploadId` }))
                : Effect.succeed(uploadId = created.UploadId)
            )
          )
        )
        const uploadPart = Effect.gen(function*() {
          const UploadId = yield* startUpload
          const PartNumber = parts.length + 1
          const Body = takePending()
          const uploaded = yield* call(
            (abortSignal) =>
              client.send(
                new UploadPartCommand({ Bucket: bucket, Key: key, UploadId, PartNumber, Body, ContentLength: Body.byteLength }),
                { abortSignal }
              ),
            s3WriteFailure(`UploadPart ${PartNumber}`, key)
          )
          parts.push({ PartNumber, ETag: uploaded.ETag })
        })
        const finish = Effect.suspend(() =>
          uploadId === undefined
            ? Effect.asVoid(putBytes(key, takePending()))
            : Effect.zipRight(
              pendingBytes > 0 ? uploadPart : Effect.void,
              call(
                (abortSignal) =>
                  client.send(
                    new CompleteMultipartUploadCommand({
                      Bucket: bucket,
                      Key: key,
                      UploadId: uploadId,
                      MultipartUpload: { Parts: parts }
                    }),
                    { abortSignal }
                  ),
                s3WriteFailure("CompleteMultipartUpload", key)
              )
            )
        )
        return Stream.runForEach(body, (chunk) => {
          pending.push(chunk)
          pendingBytes += chunk.byteLength
          return pendingBytes >= partSize ? uploadPart : Effect.void
        }).pipe(
          Effect.zipRight(finish),
          Effect.asVoid,
          Effect.onExit((exit) =>
            Exit.isFailure(exit) && uploadId !== undefined
              ? Effect.ignore(call(
                (abortSignal) =>
                  client.send(
                    new AbortMultipartUploadCommand({ Bucket: bucket, Key: key, UploadId: uploadId }),
                    { abortSignal }
                  ),
                s3WriteFailure("AbortMultipartUpload", key)
              ))
              : Effect.void
          )
        )
      })

    const getObject = (key: string) =>
      call(
        (abortSignal) => client.send(new GetObjectCommand({ Bucket: bucket, Key: key }), { abortSignal }),
        s3ReadFailure("GetObject", key)
      ).pipe(
        Effect.flatMap((response) =>
          response.Body === undefined
            ? Effect.fail(new JobError.Transient({ message: `S3 GetObject ${key}: response without a body` }))
            : Effect.succeed(response.Body)
        )
      )

    const put = Effect.fn("Storage.put")(function*<E>(key: string, body: Body<E>) {
      yield* Effect.annotateCurrentSpan({ key, driver: "s3", bucket })
      yield* validateKey(key)
      if (body instanceof Uint8Array) {
        yield* putBytes(key, body)
      } else {
        yield* putStream(key, bodyToStream(fs, body))
      }
    })

    const get = Effect.fn("Storage.get")(function*(key: string) {
      yield* Effect.annotateCurrentSpan({ key, driver: "s3", bucket })
      yield* validateKey(key)
      const body = yield* getObject(key)
      return yield* call(() => body.transformToByteArray(), s3WriteFailure("GetObject (body)", key))
    })

    const download = Effect.fn("Storage.download")(function*(key: string, localPath: string) {
      yield* Effect.annotateCurrentSpan({ key, localPath, driver: "s3", bucket })
      yield* validateKey(key)
      const body = yield* getObject(key)
      const bytes = Stream.fromReadableStream(() => body.transformToWebStream(), s3WriteFailure("GetObject (body)", key))
      yield* writeFileAtomically(fs, NodePath.resolve(localPath), bytes)
    })

    const exists = Effect.fn("Storage.exists")(function*(key: string) {
      yield* Effect.annotateCurrentSpan({ key, driver: "s3", bucket })
      yield* validateKey(key)
      return yield* call(
        (abortSignal) => client.send(new HeadObjectCommand({ Bucket: bucket, Key: key }), { abortSignal }),
        s3ReadFailure("HeadObject", key)
      ).pipe(
        Effect.as(true),
        Effect.catchTag("ObjectNotFound", () => Effect.succeed(false))
      )
    })

    const remove = Effect.fn("Storage.remove")(function*(key: string) {
      yield* Effect.annotateCurrentSpan({ key, driver: "s3", bucket })
      yield* validateKey(key)
      yield* call(
        (abortSignal) => client.send(new DeleteObjectCommand({ Bucket: bucket, Key: key }), { abortSignal }),
        s3WriteFailure("DeleteObject", key)
      )
    })

    const uri = (key: string) => Effect.map(validateKey(key), (key) => `${endpoint}/${bucket}/${encodeKey(key)}`)

    const parseUri = (uri: string) =>
      Effect.flatMap(parseLocation(uri), (location) => {
        if (location._tag !== "S3") return Effect.fail(notThisStorage(uri, "expected s3:// or an https URL"))
        if (location.host !== undefined && location.host !== endpointHost) {
          return Effect.fail(notThisStorage(uri, `host is not ${endpointHost}`))
        }
        if (location.bucket !== bucket) return Effect.fail(notThisStorage(uri, `bucket is not ${bucket}`))
        return validateKey(location.key)
      })

    return Storage.of({ put, get, download, exists, remove, uri, parseUri })
  })

/** Objects in an S3-compatible bucket, addressed path-style. */
export const layerS3 = (config: S3Config): Layer.Layer<Storage, JobError.Permanent> =>
  Layer.scoped(Storage, makeS3(config)).pipe(Layer.provide(NodeFileSystem.layer))

// ---------------------------------------------------------------------------------------------
// Configuration

/** Accepts `host`, `https://host` or `http://host:port`; returns the origin without a trailing slash. */
const normalizeEndpoint = (raw: string): Either.Either<string, string> => {
  const trimmed = raw.trim()
  const withScheme = /^[a-z][a-z0-9+.-]*:\/\//i.test(trimmed) ? trimmed : `https://${trimmed}`
  let url: URL
  try {
    url = new URL(withScheme)
  } catch {
    return Either.left(`${JSON.stringify(raw)} is not a URL`)
  }
  if (url.protocol !== "https:" && url.protocol !== "http:") return Either.left(`${raw}: scheme must be http or https`)
  if (url.pathname !== "/" || url.search !== "" || url.hash !== "") {
    return Either.left(`${raw}: expected scheme://host[:port] without a path`)
  }
  return Either.right(url.origin)
}

const bucketName = /^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$/

/** `S3_*` variables; only read when `STORAGE_DRIVER=s3`. */
export const s3Config: Config.Config<S3Config> = Config.all({
  endpoint: Config.string("S3_ENDPOINT").pipe(
    Config.mapOrFail((raw) =>
      Either.mapLeft(normalizeEndpoint(raw), (message) => ConfigError.InvalidData(["S3_ENDPOINT"], message))
    )
  ),
  region: Config.nonEmptyString("S3_REGION").pipe(Config.withDefault("ru-central1")),
  bucket: Config.string("S3_BUCKET").pipe(
    Config.validate({ message: "expected an S3 bucket name (3-63 of a-z 0-9 . -)", validation: (s) => bucketName.test(s) })
  ),
  accessKeyId: Config.nonEmptyString("S3_ACCESS_KEY_ID"),
  secretAccessKey: Config.redacted("S3_SECRET_ACCESS_KEY")
})

export const storageConfig = Config.all({
  driver: Config.literal("fs", "s3")("STORAGE_DRIVER").pipe(Config.withDefault("fs" as const)),
  dir: Config.nonEmptyString("STORAGE_DIR").pipe(Config.withDefault(defaultRootDir))
})

/** `STORAGE_DRIVER=fs` (default) uses `STORAGE_DIR`; `s3` uses the `S3_*` variables. */
export const layerFromConfig: Layer.Layer<Storage, ConfigError.ConfigError | WriteError> = Layer.unwrapEffect(
  Effect.gen(function*() {
    const { dir, driver } = yield* storageConfig
    return driver === "s3" ? layerS3(yield* s3Config) : layerFs(dir)
  })
)
