import { CreateBucketCommand, S3Client } from "@aws-sdk/client-s3"
import { describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Context, Data, Effect, Exit, Layer, Redacted, Stream } from "effect"
import * as NodeFs from "node:fs/promises"
import { createRequire } from "node:module"
import * as NodeOs from "node:os"
import * as NodePath from "node:path"
import * as NodeUrl from "node:url"
import * as Storage from "../../packages/media/src/layers/Storage.js"
import * as MemoryStorage from "../../packages/media/src/testing/MemoryStorage.js"
import { pseudoRandomBytes } from "../support/bytes.js"

// ---------------------------------------------------------------------------------------------
// Helpers

/** Reproducible "random" bytes, so a failure can be replayed byte for byte. */
const bytesOf = (length: number, seed: number): Uint8Array => pseudoRandomBytes(length, seed | 1)

/** Splits bytes into uneven chunks so part boundaries never line up with chunk boundaries. */
const chunked = (bytes: Uint8Array, size: number) =>
  Stream.fromIterable(
    Array.from({ length: Math.ceil(bytes.length / size) }, (_, i) => bytes.subarray(i * size, (i + 1) * size))
  )

const tempDirectory = (prefix: string) =>
  Effect.acquireRelease(
    Effect.promise(() => NodeFs.mkdtemp(NodePath.join(NodeOs.tmpdir(), prefix))),
    (dir) => Effect.promise(() => NodeFs.rm(dir, { recursive: true, force: true }))
  )

const listFiles = async (dir: string): Promise<Array<string>> => {
  const entries = await NodeFs.readdir(dir, { recursive: true, withFileTypes: true })
  return entries.filter((e) => e.isFile()).map((e) => NodePath.relative(dir, NodePath.join(e.parentPath, e.name)))
}

const uniquePrefix = () => `t-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`

class StreamBroke extends Data.TaggedError("StreamBroke")<{}> {}

// ---------------------------------------------------------------------------------------------
// One contract, every implementation

const contract = (name: string, layer: Layer.Layer<Storage.Storage, unknown>) =>
  it.layer(layer, { timeout: 180_000 })(`Storage contract: ${name}`, (it) => {
    it.effect("bytes round-trip byte-identical, and a second put replaces the first", () =>
      Effect.gen(function*() {
        const storage = yield* Storage.Storage
        const key = `${uniquePrefix()}/calls/a.bin`
        const first = bytesOf(300 * 1024, 1)
        yield* storage.put(key, first)
        expect(Buffer.compare(yield* storage.get(key), first)).toBe(0)
        const second = bytesOf(1000, 2)
        yield* storage.put(key, second)
        expect(Buffer.compare(yield* storage.get(key), second)).toBe(0)
      }))

    it.effect("a stream of uneven chunks round-trips byte-identical", () =>
      Effect.gen(function*() {
        const storage = yield* Storage.Storage
        const key = `${uniquePrefix()}/stream.bin`
        const bytes = bytesOf(350 * 1024 + 17, 3)
        yield* storage.put(key, chunked(bytes, 7_919))
        expect(Buffer.compare(yield* storage.get(key), bytes)).toBe(0)
      }))

    it.effect("an empty body is an empty object, not a missing one", () =>
      Effect.gen(function*() {
        const storage = yield* Storage.Storage
        const key = `${uniquePrefix()}/empty`
        yield* storage.put(key, Stream.empty)
        expect(yield* storage.exists(key)).toBe(true)
        expect((yield* storage.get(key)).length).toBe(0)
      }))

    it.scoped("a local file uploads; a missing local file is Permanent", () =>
      Effect.gen(function*() {
        const storage = yield* Storage.Storage
        const dir = yield* tempDirectory("storage-src-")
        const source = NodePath.join(dir, "call.wav")
        const bytes = bytesOf(200 * 1024, 4)
        yield* Effect.promise(() => NodeFs.writeFile(source, bytes))
        const key = `${uniquePrefix()}/from-file.wav`
        yield* storage.put(key, Storage.fromFile(source))
        expect(Buffer.compare(yield* storage.get(key), bytes)).toBe(0)

        const error = yield* Effect.flip(storage.put(`${uniquePrefix()}/x`, Storage.fromFile(NodePath.join(dir, "nope"))))
        expect(error._tag).toBe("Permanent")
        expect(error.message).toContain("source file not found")
      }))

    it.effect("a missing object is ObjectNotFound for get and download, false for exists", () =>
      Effect.gen(function*() {
        const storage = yield* Storage.Storage
        const key = `${uniquePrefix()}/missing.ogg`
        const got = yield* Effect.flip(storage.get(key))
        expect(got._tag).toBe("ObjectNotFound")
        const downloaded = yield* Effect.flip(storage.download(key, NodePath.join(NodeOs.tmpdir(), `${uniquePrefix()}.x`)))
        expect(downloaded._tag).toBe("ObjectNotFound")
        expect(yield* storage.exists(key)).toBe(false)
      }))

    it.effect("a key prefix is not an object", () =>
      Effect.gen(function*() {
        const storage = yield* Storage.Storage
        const prefix = uniquePrefix()
        yield* storage.put(`${prefix}/dir/file`, new Uint8Array([1]))
        expect(yield* storage.exists(`${prefix}/dir`)).toBe(false)
        expect((yield* Effect.flip(storage.get(`${prefix}/dir`)))._tag).toBe("ObjectNotFound")
      }))

    it.effect("exists / remove, and remove is idempotent", () =>
      Effect.gen(function*() {
        const storage = yield* Storage.Storage
        const key = `${uniquePrefix()}/gone.txt`
        yield* storage.put(key, new TextEncoder().encode("hello"))
        expect(yield* storage.exists(key)).toBe(true)
        yield* storage.remove(key)
        expect(yield* storage.exists(key)).toBe(false)
        yield* storage.remove(key)
        expect((yield* Effect.flip(storage.get(key)))._tag).toBe("ObjectNotFound")
      }))

    it.scoped("download writes the whole object into new directories and leaves no temp file", () =>
      Effect.gen(function*() {
        const storage = yield* Storage.Storage
        const dir = yield* tempDirectory("storage-dl-")
        const key = `${uniquePrefix()}/audio.ogg`
        const bytes = bytesOf(250 * 1024, 5)
        yield* storage.put(key, bytes)
        const target = NodePath.join(dir, "nested", "deeper", "audio.ogg")
        yield* storage.download(key, target)
        expect(Buffer.compare(yield* Effect.promise(() => NodeFs.readFile(target)), bytes)).toBe(0)
        expect(yield* Effect.promise(() => listFiles(dir))).toEqual([NodePath.join("nested", "deeper", "audio.ogg")])
      }))

    it.effect("a stream that fails midway fails put with its own error and leaves the old object intact", () =>
      Effect.gen(function*() {
        const storage = yield* Storage.Storage
        const key = `${uniquePrefix()}/atomic.bin`
        const original = bytesOf(10_000, 6)
        yield* storage.put(key, original)
        const broken = Stream.concat(chunked(bytesOf(200 * 1024, 7), 10_000), Stream.fail(new StreamBroke()))
        const error = yield* Effect.flip(storage.put(key, broken))
        expect(error._tag).toBe("StreamBroke")
        expect(Buffer.compare(yield* storage.get(key), original)).toBe(0)

        const fresh = `${uniquePrefix()}/never.bin`
        yield* Effect.flip(storage.put(fresh, broken))
        expect(yield* storage.exists(fresh)).toBe(false)
      }))

    it.effect("keys that could escape the root or alias another key are Permanent", () =>
      Effect.gen(function*() {
        const storage = yield* Storage.Storage
        for (const key of ["", "../etc/passwd", "/abs", "a//b", "a/./b", "a/../b", "a\\b", "a/\u0000"]) {
          const error = yield* Effect.flip(storage.put(key, new Uint8Array([1])))
          expect(error._tag, key).toBe("Permanent")
          expect(error.message).toContain("invalid storage key")
          expect((yield* Effect.flip(storage.get(key)))._tag, key).toBe("Permanent")
        }
      }))

    it.effect("uri and parseUri round-trip, including characters that need escaping", () =>
      Effect.gen(function*() {
        const storage = yield* Storage.Storage
        const key = `${uniquePrefix()}/звонок #1 100%.ogg`
        const uri = yield* storage.uri(key)
        expect(uri).not.toContain(" ")
        expect(yield* storage.parseUri(uri)).toBe(key)
        expect((yield* Effect.flip(storage.parseUri("ftp://elsewhere/x")))._tag).toBe("Permanent")
        expect((yield* Effect.flip(storage.parseUri("not a uri")))._tag).toBe("Permanent")
      }))
  })

// ---------------------------------------------------------------------------------------------
// Memory and filesystem

contract("memory", MemoryStorage.layerMemory)

class FsRoot extends Context.Tag("test/FsRoot")<FsRoot, string>() {}
const fsRootLayer = Layer.scoped(FsRoot, tempDirectory("storage-fs-"))
const fsStorageLayer = Layer.unwrapEffect(Effect.map(FsRoot, (root) => Storage.layerFs(root)))

contract("fs", fsStorageLayer.pipe(Layer.provide(fsRootLayer)))

it.layer(Layer.provideMerge(fsStorageLayer, fsRootLayer))("Storage.layerFs", (it) => {
  it.effect("stores the object at root/key, uri is file:// to it, no temp files remain", () =>
    Effect.gen(function*() {
      const storage = yield* Storage.Storage
      const root = yield* FsRoot
      const key = "calls/42/raw.wav"
      yield* storage.put(key, bytesOf(1234, 8))
      yield* storage.put(key, chunked(bytesOf(5678, 9), 100))
      const uri = yield* storage.uri(key)
      expect(uri).toBe(NodeUrl.pathToFileURL(NodePath.join(root, "calls", "42", "raw.wav")).href)
      expect(Buffer.compare(yield* Effect.promise(() => NodeFs.readFile(NodeUrl.fileURLToPath(uri))), bytesOf(5678, 9)))
        .toBe(0)
      expect(yield* Effect.promise(() => listFiles(NodePath.join(root, "calls")))).toEqual([
        NodePath.join("42", "raw.wav")
      ])
    }))

  it.effect("parseUri refuses file:// outside the root and other schemes", () =>
    Effect.gen(function*() {
      const storage = yield* Storage.Storage
      const root = yield* FsRoot
      expect(yield* storage.parseUri(NodeUrl.pathToFileURL(NodePath.join(root, "a", "b.ogg")).href)).toBe("a/b.ogg")
      const outside = yield* Effect.flip(storage.parseUri(NodeUrl.pathToFileURL(NodePath.join(root, "..", "x")).href))
      expect(outside.message).toContain("does not point into this storage")
      expect((yield* Effect.flip(storage.parseUri(NodeUrl.pathToFileURL(root).href)))._tag).toBe("Permanent")
      expect((yield* Effect.flip(storage.parseUri("s3://bucket/a")))._tag).toBe("Permanent")
    }))
})

// ---------------------------------------------------------------------------------------------
// S3 against s3rver, in-process on a free loopback port

interface S3rverInstance {
  run(): Promise<{ port: number }>
  close(): Promise<void>
  on(event: "error", listener: (error: Error, ctx: { method: string; url: string }) => void): void
  httpServer?: {
    closeAllConnections?: () => void
    on(event: "request", listener: (request: { method?: string; headers: Record<string, unknown> }) => void): void
  }
}
type S3rverConstructor = new(options: Record<string, unknown>) => S3rverInstance
// s3rver ships no types; it is a test-only dependency, so a local minimal shape is enough.
const S3rver = createRequire(import.meta.url)("s3rver") as S3rverConstructor

const bucket = "pgfiber-test"
const credentials = { accessKeyId: "S3RVER", secretAccessKey: "S3RVER" }

class S3Server extends Context.Tag("test/S3Server")<S3Server, {
  readonly endpoint: string
  readonly directory: string
  /** "METHOD url" of requests s3rver rejected, e.g. AbortMultipartUpload, which it does not implement. */
  readonly rejected: Array<string>
  /** Header names of every request, to check what the SDK sent on the wire. */
  readonly requestHeaders: Array<ReadonlyArray<string>>
}>() {}

const s3ServerLayer = Layer.scoped(
  S3Server,
  Effect.gen(function*() {
    const directory = yield* tempDirectory("s3rver-")
    const server = new S3rver({ address: "127.0.0.1", port: 0, silent: true, directory })
    const rejected: Array<string> = []
    server.on("error", (_error, ctx) => rejected.push(`${ctx.method} ${ctx.url}`))
    const { port } = yield* Effect.acquireRelease(
      Effect.promise(() => server.run()),
      () =>
        Effect.promise(() => {
          server.httpServer?.closeAllConnections?.()
          return server.close()
        })
    )
    const requestHeaders: Array<ReadonlyArray<string>> = []
    server.httpServer?.on("request", (request) => requestHeaders.push(Object.keys(request.headers)))
    const endpoint = `http://127.0.0.1:${port}`
    // The bucket is created through the S3 API, the way an operator would, not by s3rver options.
    yield* Effect.acquireUseRelease(
      Effect.sync(() => new S3Client({ endpoint, region: "ru-central1", forcePathStyle: true, credentials })),
      (client) => Effect.promise(() => client.send(new CreateBucketCommand({ Bucket: bucket }))),
      (client) => Effect.sync(() => client.destroy())
    )
    return { endpoint, directory, rejected, requestHeaders }
  })
)

const s3StorageLayer = (partSizeBytes?: number) =>
  Layer.unwrapEffect(
    Effect.map(S3Server, ({ endpoint }) =>
      Storage.layerS3({
        endpoint,
        region: "ru-central1",
        bucket,
        accessKeyId: credentials.accessKeyId,
        secretAccessKey: Redacted.make(credentials.secretAccessKey),
        ...(partSizeBytes === undefined ? {} : { partSizeBytes })
      }))
  )

contract("s3 (single PUT)", s3StorageLayer().pipe(Layer.provide(s3ServerLayer)))
contract("s3 (multipart, 64 KiB parts)", s3StorageLayer(64 * 1024).pipe(Layer.provide(s3ServerLayer)))

it.layer(Layer.provideMerge(s3StorageLayer(64 * 1024), s3ServerLayer), { timeout: 180_000 })("Storage.layerS3", (it) => {
  it.effect("uri is the path-style endpoint URL, and plain HTTP GET of it returns the object", () =>
    Effect.gen(function*() {
      const storage = yield* Storage.Storage
      const { endpoint } = yield* S3Server
      const key = `${uniquePrefix()}/calls/1/audio.ogg`
      const bytes = bytesOf(300 * 1024, 10)
      yield* storage.put(key, chunked(bytes, 4096))
      const uri = yield* storage.uri(key)
      expect(uri).toBe(`${endpoint}/${bucket}/${key}`)
      const fetched = yield* Effect.promise(() => fetch(uri).then((r) => r.arrayBuffer()))
      expect(Buffer.compare(new Uint8Array(fetched), bytes)).toBe(0)
    }))

  it.effect("requests carry no flexible checksums, which S3-compatible servers mishandle", () =>
    Effect.gen(function*() {
      const storage = yield* Storage.Storage
      const { requestHeaders } = yield* S3Server
      const before = requestHeaders.length
      yield* storage.put(`${uniquePrefix()}/a`, bytesOf(1000, 13))
      yield* storage.put(`${uniquePrefix()}/b`, chunked(bytesOf(200 * 1024, 14), 5000))
      const sent = requestHeaders.slice(before).flat()
      expect(sent.length).toBeGreaterThan(0)
      expect(sent.filter((h) => h.startsWith("x-amz-checksum-") || h === "x-amz-trailer")).toEqual([])
    }))

  it.effect("parseUri accepts s3:// and endpoint URLs of this bucket only", () =>
    Effect.gen(function*() {
      const storage = yield* Storage.Storage
      const { endpoint } = yield* S3Server
      expect(yield* storage.parseUri(`s3://${bucket}/calls/1/a.ogg`)).toBe("calls/1/a.ogg")
      expect(yield* storage.parseUri(`${endpoint}/${bucket}/calls/1/a%20b.ogg`)).toBe("calls/1/a b.ogg")
      const otherBucket = yield* Effect.flip(storage.parseUri(`s3://other/calls/1/a.ogg`))
      expect(otherBucket.message).toContain(`bucket is not ${bucket}`)
      const otherHost = yield* Effect.flip(storage.parseUri(`https://storage.example.com/${bucket}/a.ogg`))
      expect(otherHost.message).toContain("host is not")
      expect((yield* Effect.flip(storage.parseUri("file:///tmp/a.ogg")))._tag).toBe("Permanent")
    }))

  it.effect("a failed multipart upload is aborted, so its parts do not linger", () =>
    Effect.gen(function*() {
      const storage = yield* Storage.Storage
      const { rejected } = yield* S3Server
      const key = `${uniquePrefix()}/aborted.bin`
      const broken = Stream.concat(chunked(bytesOf(300 * 1024, 11), 10_000), Stream.fail(new StreamBroke()))
      expect((yield* Effect.flip(storage.put(key, broken)))._tag).toBe("StreamBroke")
      // s3rver answers AbortMultipartUpload with MethodNotAllowed, so we can only see that it was sent.
      expect(rejected.filter((r) => r.startsWith(`DELETE /${bucket}/${key}?uploadId=`))).toHaveLength(1)
    }))

  it.effect("an unknown bucket is Permanent, a dead endpoint is Transient", () =>
    Effect.gen(function*() {
      const { endpoint } = yield* S3Server
      const base = {
        region: "ru-central1",
        accessKeyId: credentials.accessKeyId,
        secretAccessKey: Redacted.make(credentials.secretAccessKey)
      }
      const putWith = (config: Storage.S3Config) =>
        Effect.flatMap(Storage.Storage, (s) => s.put("a/b", new Uint8Array([1]))).pipe(
          Effect.provide(Storage.layerS3(config)),
          Effect.flip
        )
      expect((yield* putWith({ ...base, endpoint, bucket: "no-such-bucket" }))._tag).toBe("Permanent")
      // Port 1 on loopback: nothing listens there, the connection is refused at once.
      expect((yield* putWith({ ...base, endpoint: "http://127.0.0.1:1", bucket }))._tag).toBe("Transient")
    }))
})

// ---------------------------------------------------------------------------------------------
// Configuration

const withEnv = (env: Record<string, string>) => Layer.setConfigProvider(ConfigProvider.fromMap(new Map(Object.entries(env))))

const buildFromConfig = (env: Record<string, string>) =>
  Layer.build(Storage.layerFromConfig).pipe(Effect.provide(withEnv(env)), Effect.scoped)

describe("Storage.layerFromConfig", () => {
  it.scoped("STORAGE_DRIVER defaults to fs under STORAGE_DIR", () =>
    Effect.gen(function*() {
      const dir = yield* tempDirectory("storage-cfg-")
      const root = NodePath.join(dir, "objects")
      const uri = yield* Effect.flatMap(Storage.Storage, (s) => Effect.zipRight(s.put("k/v", new Uint8Array([7])), s.uri("k/v"))).pipe(
        Effect.provide(Storage.layerFromConfig.pipe(Layer.provide(withEnv({ STORAGE_DIR: root }))))
      )
      expect(uri).toBe(NodeUrl.pathToFileURL(NodePath.join(root, "k", "v")).href)
      expect([...(yield* Effect.promise(() => NodeFs.readFile(NodePath.join(root, "k", "v"))))]).toEqual([7])
    }))

  it.effect("bad configuration fails naming the variable", () =>
    Effect.gen(function*() {
      const s3 = {
        STORAGE_DRIVER: "s3",
        S3_ENDPOINT: "https://storage.yandexcloud.net",
        S3_BUCKET: "calls",
        S3_ACCESS_KEY_ID: "id",
        S3_SECRET_ACCESS_KEY: "secret"
      }
      const cases: ReadonlyArray<[Record<string, string>, string]> = [
        [{ STORAGE_DRIVER: "gcs" }, "STORAGE_DRIVER"],
        [{ ...s3, S3_BUCKET: "" }, "S3_BUCKET"],
        [{ ...s3, S3_BUCKET: "Bad_Bucket" }, "S3_BUCKET"],
        [{ ...s3, S3_ENDPOINT: "ftp://storage" }, "S3_ENDPOINT"],
        [{ ...s3, S3_ENDPOINT: "https://storage/with/path" }, "S3_ENDPOINT"],
        [Object.fromEntries(Object.entries(s3).filter(([k]) => k !== "S3_SECRET_ACCESS_KEY")), "S3_SECRET_ACCESS_KEY"],
        [Object.fromEntries(Object.entries(s3).filter(([k]) => k !== "S3_ACCESS_KEY_ID")), "S3_ACCESS_KEY_ID"]
      ]
      for (const [env, variable] of cases) {
        const exit = yield* Effect.exit(buildFromConfig(env))
        expect(Exit.isFailure(exit), variable).toBe(true)
        expect(String(Exit.isFailure(exit) ? exit.cause : ""), variable).toContain(variable)
      }
    }))

  it.effect("the secret is read as Redacted and never printed", () =>
    Effect.gen(function*() {
      const config = yield* Effect.provide(
        Storage.s3Config,
        withEnv({ S3_ENDPOINT: "storage.yandexcloud.net", S3_BUCKET: "calls", S3_ACCESS_KEY_ID: "id", S3_SECRET_ACCESS_KEY: "hunter2" })
      )
      expect(config.endpoint).toBe("https://storage.yandexcloud.net")
      expect(config.region).toBe("ru-central1")
      expect(Redacted.value(config.secretAccessKey)).toBe("hunter2")
      expect(String(config.secretAccessKey)).not.toContain("hunter2")
    }))

  it.layer(s3ServerLayer)("with STORAGE_DRIVER=s3", (it) => {
    it.effect("talks to the configured endpoint and bucket", () =>
      Effect.gen(function*() {
        const { endpoint } = yield* S3Server
        const env = {
          STORAGE_DRIVER: "s3",
          S3_ENDPOINT: endpoint,
          S3_BUCKET: bucket,
          S3_ACCESS_KEY_ID: credentials.accessKeyId,
          S3_SECRET_ACCESS_KEY: credentials.secretAccessKey
        }
        const [uri, bytes] = yield* Effect.flatMap(Storage.Storage, (s) =>
          Effect.zipRight(s.put("cfg/x.bin", bytesOf(1000, 12)), Effect.all([s.uri("cfg/x.bin"), s.get("cfg/x.bin")]))).pipe(
            Effect.provide(Storage.layerFromConfig.pipe(Layer.provide(withEnv(env))))
          )
        expect(uri).toBe(`${endpoint}/${bucket}/cfg/x.bin`)
        expect(Buffer.compare(bytes, bytesOf(1000, 12))).toBe(0)
      }))
  })
})
