/**
 * Objects in an S3-compatible bucket, addressed path-style (Yandex Object Storage in production: SpeechKit
 * downloads its input from there). Streams go up in parts; the AWS SDK is loaded only when this layer is built,
 * since importing it costs every CLI command a quarter second.
 */
import type { CompletedPart } from "@aws-sdk/client-s3"
import * as FileSystem from "@effect/platform/FileSystem"
import * as NodeFileSystem from "@effect/platform-node/NodeFileSystem"
import { Config, ConfigError, Effect, Either, Exit, Layer, Redacted, Stream } from "effect"
import * as NodePath from "node:path"
import * as JobError from "pgfiber/internal/JobError.js"
import {
  type Body,
  bodyToStream,
  concatBytes,
  encodeKey,
  notThisStorage,
  ObjectNotFound,
  parseLocation,
  type ReadError,
  Storage,
  validateKey,
  type WriteError,
  writeFileAtomically
} from "./Service.js"

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

/** The SDK's module, loaded when the layer is built. */
type S3Sdk = typeof import("@aws-sdk/client-s3")

/** What every request needs: the SDK's commands, the client, the bucket. */
interface BucketClient {
  readonly sdk: S3Sdk
  readonly client: InstanceType<S3Sdk["S3Client"]>
  readonly bucket: string
}

/** Makes the SDK client for `endpoint`, destroyed with the scope. */
const acquireClient = (sdk: S3Sdk, config: S3Config, endpoint: string) =>
  Effect.acquireRelease(
    Effect.sync(() =>
      new sdk.S3Client({
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

/** One SDK request; the abort signal ties the HTTP request to the fiber: interrupting the fiber cancels the request. */
const call = <A, E>(run: (signal: AbortSignal) => Promise<A>, onError: (error: unknown) => E) =>
  Effect.tryPromise({ try: run, catch: onError })

/** Uploads bytes of known length in one PUT. */
const putBytes = (s3: BucketClient, key: string, bytes: Uint8Array) =>
  call(
    (abortSignal) =>
      s3.client.send(
        new s3.sdk.PutObjectCommand({ Bucket: s3.bucket, Key: key, Body: bytes, ContentLength: bytes.byteLength }),
        { abortSignal }
      ),
    s3WriteFailure("PutObject", key)
  )

/**
 * The state of one `putStream`: the bytes buffered for the next part, and the multipart upload once it is
 * started (`uploadId` undefined until the first part is full) with the parts sent so far.
 */
interface StreamUpload {
  readonly key: string
  pending: Array<Uint8Array>
  pendingBytes: number
  uploadId: string | undefined
  readonly parts: Array<CompletedPart>
}

/** Buffers a chunk; the one place `pending` grows. */
const bufferChunk = (upload: StreamUpload, chunk: Uint8Array) => {
  upload.pending.push(chunk)
  upload.pendingBytes += chunk.byteLength
}

/** Empties the buffer, returning its bytes as one array. */
const takePending = (upload: StreamUpload) => {
  const bytes = concatBytes(upload.pending)
  upload.pending = []
  upload.pendingBytes = 0
  return bytes
}

/** The upload's id, creating the multipart upload on first use. */
const startUpload = (s3: BucketClient, upload: StreamUpload) =>
  Effect.suspend(() =>
    upload.uploadId !== undefined ? Effect.succeed(upload.uploadId) : call(
      (abortSignal) =>
        s3.client.send(new s3.sdk.CreateMultipartUploadCommand({ Bucket: s3.bucket, Key: upload.key }), { abortSignal }),
      s3WriteFailure("CreateMultipartUpload", upload.key)
    ).pipe(
      Effect.flatMap((created) =>
        created.UploadId === undefined
          ? Effect.fail(new JobError.Permanent({ message: `S3 CreateMultipartUpload ${upload.key}: no UploadId` }))
          : Effect.succeed(upload.uploadId = created.UploadId)
      )
    )
  )

/** Sends the buffered bytes as the next part. */
const uploadPart = (s3: BucketClient, upload: StreamUpload) =>
  Effect.gen(function*() {
    const { key } = upload
    const UploadId = yield* startUpload(s3, upload)
    const PartNumber = upload.parts.length + 1
    const Body = takePending(upload)
    const uploaded = yield* call(
      (abortSignal) =>
        s3.client.send(
          new s3.sdk.UploadPartCommand({ Bucket: s3.bucket, Key: key, UploadId, PartNumber, Body, ContentLength: Body.byteLength }),
          { abortSignal }
        ),
      s3WriteFailure(`UploadPart ${PartNumber}`, key)
    )
    upload.parts.push({ PartNumber, ETag: uploaded.ETag })
  })

/** After the last chunk: one PUT when no part was sent, else the last part and CompleteMultipartUpload. */
const finishUpload = (s3: BucketClient, upload: StreamUpload) =>
  Effect.suspend(() =>
    upload.uploadId === undefined
      ? Effect.asVoid(putBytes(s3, upload.key, takePending(upload)))
      : Effect.zipRight(
        upload.pendingBytes > 0 ? uploadPart(s3, upload) : Effect.void,
        call(
          (abortSignal) =>
            s3.client.send(
              new s3.sdk.CompleteMultipartUploadCommand({
                Bucket: s3.bucket,
                Key: upload.key,
                UploadId: upload.uploadId,
                MultipartUpload: { Parts: upload.parts }
              }),
              { abortSignal }
            ),
          s3WriteFailure("CompleteMultipartUpload", upload.key)
        )
      )
  )

/** Aborts a started multipart upload, so its parts do not linger (and bill) in the bucket. */
const abortUpload = (s3: BucketClient, upload: StreamUpload) =>
  upload.uploadId === undefined ? Effect.void : Effect.ignore(call(
    (abortSignal) =>
      s3.client.send(
        new s3.sdk.AbortMultipartUploadCommand({ Bucket: s3.bucket, Key: upload.key, UploadId: upload.uploadId }),
        { abortSignal }
      ),
    s3WriteFailure("AbortMultipartUpload", upload.key)
  ))

/**
 * Buffers one part at a time, so memory stays at `partSize` whatever the stream's length; every
 * request carries bytes of known length, which keeps the SDK's retries able to resend them.
 * A failed or interrupted upload is aborted so its parts do not linger (and bill) in the bucket.
 */
const putStream = <E>(
  s3: BucketClient,
  partSize: number,
  key: string,
  body: Stream.Stream<Uint8Array, E>
): Effect.Effect<void, E | WriteError> =>
  Effect.suspend(() => {
    const upload: StreamUpload = { key, pending: [], pendingBytes: 0, uploadId: undefined, parts: [] }
    return Stream.runForEach(body, (chunk) => {
      bufferChunk(upload, chunk)
      return upload.pendingBytes >= partSize ? uploadPart(s3, upload) : Effect.void
    }).pipe(
      Effect.zipRight(finishUpload(s3, upload)),
      Effect.asVoid,
      Effect.onExit((exit) => Exit.isFailure(exit) ? abortUpload(s3, upload) : Effect.void)
    )
  })

/** GetObject's body, before it is read. */
const getObject = (s3: BucketClient, key: string) =>
  call(
    (abortSignal) => s3.client.send(new s3.sdk.GetObjectCommand({ Bucket: s3.bucket, Key: key }), { abortSignal }),
    s3ReadFailure("GetObject", key)
  ).pipe(
    Effect.flatMap((response) =>
      response.Body === undefined
        ? Effect.fail(new JobError.Transient({ message: `S3 GetObject ${key}: response without a body` }))
        : Effect.succeed(response.Body)
    )
  )

export const makeS3 = (config: S3Config) =>
  Effect.gen(function*() {
    const sdk = yield* Effect.promise(() => import("@aws-sdk/client-s3"))
    const fs = yield* FileSystem.FileSystem
    const { bucket } = config
    const endpoint = yield* Either.mapLeft(
      normalizeEndpoint(config.endpoint),
      (message) => new JobError.Permanent({ message: `S3 endpoint: ${message}` })
    )
    const endpointHost = new URL(endpoint).host
    const partSize = config.partSizeBytes ?? defaultPartSizeBytes
    const s3: BucketClient = { sdk, client: yield* acquireClient(sdk, config, endpoint), bucket }

    const put = Effect.fn("Storage.put")(function*<E>(key: string, body: Body<E>) {
      yield* Effect.annotateCurrentSpan({ key, driver: "s3", bucket })
      yield* validateKey(key)
      if (body instanceof Uint8Array) {
        yield* putBytes(s3, key, body)
      } else {
        yield* putStream(s3, partSize, key, bodyToStream(fs, body))
      }
    })

    const get = Effect.fn("Storage.get")(function*(key: string) {
      yield* Effect.annotateCurrentSpan({ key, driver: "s3", bucket })
      yield* validateKey(key)
      const body = yield* getObject(s3, key)
      return yield* call(() => body.transformToByteArray(), s3WriteFailure("GetObject (body)", key))
    })

    const download = Effect.fn("Storage.download")(function*(key: string, localPath: string) {
      yield* Effect.annotateCurrentSpan({ key, localPath, driver: "s3", bucket })
      yield* validateKey(key)
      const body = yield* getObject(s3, key)
      const bytes = Stream.fromReadableStream(() => body.transformToWebStream(), s3WriteFailure("GetObject (body)", key))
      yield* writeFileAtomically(fs, NodePath.resolve(localPath), bytes)
    })

    const exists = Effect.fn("Storage.exists")(function*(key: string) {
      yield* Effect.annotateCurrentSpan({ key, driver: "s3", bucket })
      yield* validateKey(key)
      return yield* call(
        (abortSignal) => s3.client.send(new sdk.HeadObjectCommand({ Bucket: bucket, Key: key }), { abortSignal }),
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
        (abortSignal) => s3.client.send(new sdk.DeleteObjectCommand({ Bucket: bucket, Key: key }), { abortSignal }),
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
