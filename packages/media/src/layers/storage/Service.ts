/**
 * The storage service every implementation provides (see ../Storage.ts for the public face): the tag, its
 * errors, key validation, storage URIs taken apart, and what the implementations share to turn a body into
 * bytes and write a local file atomically. The implementations: `Fs.ts`, `S3.ts`, and the memory store of unit
 * tests in `src/testing/MemoryStorage.ts`.
 */
import type { PlatformError } from "@effect/platform/Error"
import * as FileSystem from "@effect/platform/FileSystem"
import { Context, Effect, Either, Exit, Schema, Stream } from "effect"
import * as NodeCrypto from "node:crypto"
import * as NodePath from "node:path"
import * as NodeUrl from "node:url"
import * as JobError from "pgfiber/internal/JobError.js"

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

export const encodeKey = (key: string): string => key.split("/").map(encodeURIComponent).join("/")

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

export const notThisStorage = (uri: string, why: string) =>
  new JobError.Permanent({ message: `${uri} does not point into this storage: ${why}` })

// ---------------------------------------------------------------------------------------------
// Bodies and local files

export const isStream = (u: unknown): u is Stream.Stream<Uint8Array, unknown> =>
  typeof u === "object" && u !== null && Stream.StreamTypeId in u

export const concatBytes = (chunks: ReadonlyArray<Uint8Array>): Uint8Array => {
  if (chunks.length === 1) return chunks[0]!
  return Buffer.concat(chunks)
}

export const fsErrorToJobError = (what: string) => (error: PlatformError): JobError.Transient | JobError.Permanent =>
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

export const bodyToStream = <E>(fs: FileSystem.FileSystem, body: Body<E>): Stream.Stream<Uint8Array, E | WriteError> =>
  body instanceof Uint8Array
    ? Stream.make(body)
    : isStream(body)
    ? (body as Stream.Stream<Uint8Array, E>)
    : streamLocalFile(fs, body.path)

/**
 * Writes `bytes` to `target` through a temp file in the same directory and a rename, so readers
 * see the old file or the whole new one, never a prefix. The source stream's errors pass untouched.
 */
export const writeFileAtomically = <E>(
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
