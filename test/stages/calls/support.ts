/**
 * The call pipeline's test world, all real and all on loopback: Postgres (a fresh migrated schema), s3rver
 * in-process, the SpeechKit simulator with the real client pointed at it, the real ffmpeg, and a worker
 * running the call stages on PgQueue. Plus what the tests look at: every pipeline row, every stored object.
 */
import { CreateBucketCommand, ListObjectsV2Command, S3Client } from "@aws-sdk/client-s3"
import { expect } from "@effect/vitest"
import { Context, Duration, Effect, Layer, Redacted } from "effect"
import * as NodeFs from "node:fs/promises"
import { createRequire } from "node:module"
import * as NodeOs from "node:os"
import * as NodePath from "node:path"
import * as Analyzer from "../../../packages/media/src/layers/Analyzer.js"
import * as Db from "../../../packages/pgfiber/src/layers/Db.js"
import * as Media from "../../../packages/media/src/layers/Media.js"
import * as SpeechKit from "../../../packages/media/src/layers/SpeechKit.js"
import * as SpeechKitSimulator from "../../../packages/media/src/testing/SpeechKitSimulator.js"
import * as Storage from "../../../packages/media/src/layers/Storage.js"
import * as PgQueue from "../../../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../../../packages/pgfiber/src/queue/Queue.js"
import type * as Stage from "../../../packages/pgfiber/src/runtime/Stage.js"
import * as Worker from "../../../packages/pgfiber/src/runtime/Worker.js"
import { Calls } from "../../../packages/media/src/stages/calls/index.js"
import { layerDb } from "../../support/pg.js"
import { waitFor } from "../../support/waitFor.js"

// ---------------------------------------------------------------------------------------------
// s3rver

interface S3rverInstance {
  run(): Promise<{ port: number }>
  close(): Promise<void>
  httpServer?: { closeAllConnections?: () => void }
}
// s3rver ships no types; it is a test-only dependency, so a local minimal shape is enough.
const S3rver = createRequire(import.meta.url)("s3rver") as new(options: Record<string, unknown>) => S3rverInstance

export const bucket = "pgfiber-calls"
const s3Credentials = { accessKeyId: "S3RVER", secretAccessKey: "S3RVER" }

export class S3Server extends Context.Tag("test/calls/S3Server")<S3Server, {
  readonly endpoint: string
  readonly client: S3Client
}>() {}

export const tempDirectory = (prefix: string) =>
  Effect.acquireRelease(
    Effect.promise(() => NodeFs.mkdtemp(NodePath.join(NodeOs.tmpdir(), prefix))),
    (dir) => Effect.promise(() => NodeFs.rm(dir, { recursive: true, force: true }))
  )

export const s3ServerLayer = Layer.scoped(
  S3Server,
  Effect.gen(function*() {
    const directory = yield* tempDirectory("calls-s3rver-")
    const server = new S3rver({ address: "127.0.0.1", port: 0, silent: true, directory })
    const { port } = yield* Effect.acquireRelease(
      Effect.promise(() => server.run()),
      () =>
        Effect.promise(() => {
          server.httpServer?.closeAllConnections?.()
          return server.close()
        })
    )
    const endpoint = `http://127.0.0.1:${port}`
    const client = yield* Effect.acquireRelease(
      Effect.sync(() => new S3Client({ endpoint, region: "ru-central1", forcePathStyle: true, credentials: s3Credentials })),
      (client) => Effect.sync(() => client.destroy())
    )
    yield* Effect.promise(() => client.send(new CreateBucketCommand({ Bucket: bucket })))
    return { endpoint, client }
  })
)

const s3StorageLayer = Layer.unwrapEffect(
  Effect.map(S3Server, ({ endpoint }) =>
    Storage.layerS3({
      endpoint,
      region: "ru-central1",
      bucket,
      accessKeyId: s3Credentials.accessKeyId,
      secretAccessKey: Redacted.make(s3Credentials.secretAccessKey)
    }))
)

// ---------------------------------------------------------------------------------------------
// SpeechKit: the simulator, and the real client pointed at it

export const apiKey = "calls-test-key"

export const speechKitLayer = Layer.unwrapEffect(
  Effect.map(SpeechKitSimulator.SpeechKitSimulator, ({ url }) =>
    SpeechKit.layerWith({
      credentials: { _tag: "ApiKey", apiKey: Redacted.make(apiKey) },
      sttUrl: url,
      operationUrl: url,
      timeout: "5 seconds"
    }))
)

// ---------------------------------------------------------------------------------------------
// The whole world

export type World =
  | Db.Db
  | Queue.Queue
  | Storage.Storage
  | Media.Media
  | SpeechKit.SpeechKit
  | Analyzer.Analyzer
  | SpeechKitSimulator.SpeechKitSimulator
  | S3Server

/** Postgres + PgQueue + s3rver storage + simulator + client + ffmpeg + analyzer. */
export const worldLayer = (simulator: SpeechKitSimulator.Options = {}): Layer.Layer<World> =>
  Layer.mergeAll(
    PgQueue.layer(),
    Layer.provideMerge(s3StorageLayer, s3ServerLayer),
    Layer.provideMerge(speechKitLayer, SpeechKitSimulator.layer({ apiKey, pollsUntilDone: 1, ...simulator })),
    Media.layer,
    Analyzer.layerDeterministic
  ).pipe(
    Layer.provideMerge(layerDb({ poolMax: 8 })),
    Layer.orDie
  )

// ---------------------------------------------------------------------------------------------
// Running and waiting

export const workerOptions = (workerId: string): Worker.WorkerOptions => ({
  workerId,
  shutdownGrace: Duration.seconds(2),
  sweepInterval: Duration.seconds(30),
  pollInterval: Duration.millis(500),
  concurrency: {}
})

/** Runs a worker for the stages until the test's scope closes. */
export const startWorker = (stages: ReadonlyArray<Stage.Any>, workerId = "calls-test") =>
  Effect.asVoid(Layer.build(Worker.layer(stages, workerOptions(workerId))))

/** The suite's one wait for a condition, for the call tests that import it from here. */
export { waitFor }

/** The call once its status is one of `statuses`. */
export const awaitCall = (id: string, statuses: ReadonlyArray<Calls.CallStatus>, timeout?: Duration.Duration) =>
  waitFor(
    `call ${id} to be ${statuses.join(" or ")}`,
    Effect.map(Calls.get(id), (call) => (statuses.includes(call.status) ? call : undefined)),
    timeout
  )

/** The dead letters of a call, by stage. */
export const deadLettersOf = (callId: string) =>
  Effect.flatMap(Queue.Queue, (queue) =>
    Effect.map(queue.deadLetters.list({ limit: 1000 }), (all) => all.filter((d) => d.subjectId === callId)))

/** Live jobs of a call. */
export const jobsOf = (callId: string) =>
  Effect.flatMap(Queue.Queue, (queue) => Effect.map(queue.list({ limit: 1000 }), (all) => all.filter((j) => j.subjectId === callId)))

// ---------------------------------------------------------------------------------------------
// Fixtures: made with the same ffmpeg at test time, nothing binary committed

/** Runs ffmpeg for fixtures the Media API deliberately cannot make (a video with no audio). */
export const ffmpeg = (...args: Array<string>) =>
  Effect.gen(function*() {
    const { ffmpegPath } = yield* Effect.orDie(Media.resolveBinaries)
    const { execFile } = yield* Effect.promise(() => import("node:child_process"))
    yield* Effect.async<void>((resume) => {
      execFile(ffmpegPath, ["-hide_banner", "-nostdin", "-loglevel", "error", "-y", ...args], (error) =>
        resume(error ? Effect.die(error) : Effect.void))
    })
  })

/** A generated two-channel call (agent tone, client noise), as the pipeline's input would be. */
export const generatedCall = (dir: string, name: string, seconds: number) =>
  Effect.gen(function*() {
    const media = yield* Media.Media
    const path = NodePath.join(dir, name)
    yield* Effect.orDie(media.generateTestCall(path, { seconds, channels: 2 }))
    return path
  })

export { noise } from "../../support/bytes.js"

// ---------------------------------------------------------------------------------------------
// What a rerun must not change

/** Every object in the bucket under `prefix`: key, size and ETag (the content's MD5 for a single PUT). */
export const listObjects = (prefix: string) =>
  Effect.flatMap(S3Server, ({ client }) =>
    Effect.promise(async () => {
      const listed = await client.send(new ListObjectsV2Command({ Bucket: bucket, Prefix: prefix }))
      return (listed.Contents ?? []).map((o) => ({ key: o.Key, size: o.Size, etag: o.ETag })).sort((a, b) =>
        a.key! < b.key! ? -1 : 1
      )
    }))

/** Every row of every pipeline table for the call, timestamps included. */
export const pipelineRows = (callId: string) =>
  Effect.flatMap(Db.Db, (db) =>
    Effect.orDie(Effect.all({
      calls: db.run((sql) => sql`select * from calls where id = ${callId}`),
      artifacts: db.run((sql) => sql`select * from call_artifacts where call_id = ${callId} order by kind`),
      transcripts: db.run((sql) => sql`select * from transcripts where call_id = ${callId}`),
      analyses: db.run((sql) => sql`select * from analyses where call_id = ${callId}`)
    })).pipe(Effect.map((rows) => JSON.parse(JSON.stringify(rows)) as unknown)))

/** The rows and the objects of a call, for before/after comparisons. */
export const snapshot = (call: { readonly id: string; readonly orgId: string }) =>
  Effect.all({ rows: pipelineRows(call.id), objects: listObjects(`orgs/${call.orgId}/calls/${call.id}/`) })

/** Files left in a directory (temporaries that were not cleaned up). */
export const filesIn = (dir: string) =>
  Effect.promise(() => NodeFs.readdir(dir, { recursive: true }))

export const expectNoneLeft = (dir: string) => Effect.map(filesIn(dir), (left) => expect(left).toEqual([]))
