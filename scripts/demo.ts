/**
 * `npm run demo`: the call pipeline end to end on this machine, nothing downloaded and no account needed.
 *
 * - Postgres: an embedded server in a temporary folder (removed at the end);
 * - object storage: s3rver in-process on loopback, so the audio goes the way it does in production
 *   (SpeechKit downloads it from a bucket's URL), not through a file:// shortcut;
 * - SpeechKit: the local simulator (not Yandex), spoken to by the real client over HTTP;
 * - media: the real ffmpeg, which also generates the call (a tone and pink noise from lavfi sources).
 *
 * The four stages run with their production settings (the first poll waits 5 s, the next 7.5 s), under a
 * worker on the real queue; each run is recorded and printed as a timeline. `--seconds N` sets the call's length.
 */
import { CreateBucketCommand, S3Client } from "@aws-sdk/client-s3"
import * as FetchHttpClient from "@effect/platform/FetchHttpClient"
import * as NodeRuntime from "@effect/platform-node/NodeRuntime"
import { Cause, Duration, Effect, Exit, Layer, Logger, LogLevel, Option, Redacted } from "effect"
import * as NodeFs from "node:fs/promises"
import { createRequire } from "node:module"
import * as NodeOs from "node:os"
import * as NodePath from "node:path"
import * as Analyzer from "../packages/media/src/layers/Analyzer.js"
import * as Db from "../packages/pgfiber/src/layers/Db.js"
import * as EmbeddedPg from "../packages/pgfiber/src/layers/EmbeddedPg.js"
import * as Media from "../packages/media/src/layers/Media.js"
import * as SpeechKit from "../packages/media/src/layers/SpeechKit.js"
import * as SpeechKitSimulator from "../packages/media/src/testing/SpeechKitSimulator.js"
import * as Storage from "../packages/media/src/layers/Storage.js"
import * as Migrations from "../packages/pgfiber/src/queue/Migrations.js"
import * as PgQueue from "../packages/pgfiber/src/queue/PgQueue.js"
import * as Stage from "../packages/pgfiber/src/runtime/Stage.js"
import * as Worker from "../packages/pgfiber/src/runtime/Worker.js"
import { Calls, callStages } from "../packages/media/src/stages/calls/index.js"

const orgId = "demo"
const bucket = "pgfiber-demo"
const apiKey = "demo-api-key"

const seconds = (() => {
  const at = process.argv.indexOf("--seconds")
  const value = at >= 0 ? Number(process.argv[at + 1]) : 12
  return Number.isFinite(value) && value > 0 && value <= 600 ? value : 12
})()

// ---------------------------------------------------------------------------------------------
// The timeline: every handler run, recorded by wrapping the stages (the stages themselves are untouched)

interface Run {
  readonly stage: string
  readonly attempt: number
  readonly polls: number
  readonly startedAt: number
  readonly endedAt: number
  readonly outcome: string
}

const runs: Array<Run> = []

const describeOutcome = (exit: Exit.Exit<unknown, { _tag: string; message: string }>): string => {
  if (Exit.isSuccess(exit)) {
    const next = Stage.isCompletion(exit.value) ? exit.value.followUps : []
    if (next.length === 0) return "completed"
    return `completed → ${next.map((job) => {
      const delay = job.delay === undefined ? undefined : Duration.decode(job.delay)
      const operation = (job.payload as { operationId?: string }).operationId
      return `${job.stage}${delay ? ` in ${Duration.format(delay)}` : ""}${operation ? ` (operation ${operation})` : ""}`
    }).join(", ")}`
  }
  const failure = Cause.failureOption(exit.cause)
  if (Option.isNone(failure)) return `died: ${Cause.pretty(exit.cause).split("\n")[0]}`
  const error = failure.value as { _tag: string; message: string; pollAfter?: Duration.Duration; retryAfter?: Duration.Duration }
  if (error._tag === "NotReady") return `not ready → look again in ${Duration.format(error.pollAfter ?? Duration.zero)}`
  if (error._tag === "RateLimited") return `rate limited → retry in ${Duration.format(error.retryAfter ?? Duration.zero)}`
  return `${error._tag}: ${error.message}`
}

const recordRuns = <A, I, R>(stage: Stage.Stage<A, I, R>): Stage.Stage<A, I, R> => ({
  ...stage,
  handler: (payload, job) =>
    Effect.gen(function*() {
      const startedAt = Date.now()
      const exit = yield* Effect.exit(stage.handler(payload, job))
      runs.push({ stage: stage.name, attempt: job.attempt, polls: job.polls, startedAt, endedAt: Date.now(), outcome: describeOutcome(exit) })
      return yield* exit
    })
})

// ---------------------------------------------------------------------------------------------
// The pieces

interface S3rverInstance {
  run(): Promise<{ port: number }>
  close(): Promise<void>
  httpServer?: { closeAllConnections?: () => void }
}
const S3rver = createRequire(import.meta.url)("s3rver") as new(options: Record<string, unknown>) => S3rverInstance

const temporaryDirectory = (prefix: string) =>
  Effect.acquireRelease(
    Effect.promise(() => NodeFs.mkdtemp(NodePath.join(NodeOs.tmpdir(), prefix))),
    (dir) => Effect.promise(() => NodeFs.rm(dir, { recursive: true, force: true }))
  )

const startS3rver = Effect.gen(function*() {
  const directory = yield* temporaryDirectory("pgfiber-demo-s3-")
  const server = new S3rver({ address: "127.0.0.1", port: 0, silent: true, directory })
  const { port } = yield* Effect.acquireRelease(Effect.promise(() => server.run()), () =>
    Effect.promise(() => {
      server.httpServer?.closeAllConnections?.()
      return server.close()
    }))
  const endpoint = `http://127.0.0.1:${port}`
  const client = new S3Client({ endpoint, region: "ru-central1", forcePathStyle: true, credentials: { accessKeyId: "S3RVER", secretAccessKey: "S3RVER" } })
  yield* Effect.promise(() => client.send(new CreateBucketCommand({ Bucket: bucket }))).pipe(Effect.ensuring(Effect.sync(() => client.destroy())))
  return endpoint
})

const kb = (bytes: number | null) => (bytes === null ? "?" : `${(bytes / 1024).toFixed(1)} KB`)
const secondsOf = (ms: number | null) => (ms === null ? "?" : `${(ms / 1000).toFixed(1)} s`)
const pad = (text: string, width: number) => text.padEnd(width)

// ---------------------------------------------------------------------------------------------
// The demo

const demo = Effect.gen(function*() {
  console.log("pgfiber call pipeline demo\n")
  const pg = yield* EmbeddedPg.start({ dataDir: undefined, port: 0 })
  console.log(`  postgres   embedded, 127.0.0.1:${pg.port} (temporary data folder)`)
  const endpoint = yield* startS3rver
  console.log(`  storage    s3rver at ${endpoint}, bucket ${bucket}`)
  const simulator = yield* SpeechKitSimulator.make({ apiKey, pollsUntilDone: 1 }).pipe(Effect.provide(FetchHttpClient.layer))
  console.log(`  speechkit  local SIMULATOR at ${simulator.url} (not Yandex SpeechKit), real client`)
  const binaries = yield* Media.resolveBinaries
  console.log(`  media      ${binaries.ffmpegPath}`)

  const db = yield* Db.make({ url: pg.url, schema: "pgfiber", poolMax: 8 })
  const migrated = yield* Migrations.migrate().pipe(Effect.provideService(Db.Db, db))
  console.log(`  migrations ${migrated.applied.join(", ")}\n`)

  const world = Layer.mergeAll(
    PgQueue.layer(),
    Storage.layerS3({ endpoint, region: "ru-central1", bucket, accessKeyId: "S3RVER", secretAccessKey: Redacted.make("S3RVER") }),
    Media.layerWith(binaries),
    SpeechKit.layerWith({ credentials: { _tag: "ApiKey", apiKey: Redacted.make(apiKey) }, sttUrl: simulator.url, operationUrl: simulator.url }),
    Analyzer.layerDeterministic
  ).pipe(Layer.provideMerge(Layer.succeed(Db.Db, db)))
  const context = yield* Layer.build(world)

  return yield* Effect.gen(function*() {
    const media = yield* Media.Media
    const dir = yield* temporaryDirectory("pgfiber-demo-call-")
    const file = NodePath.join(dir, "call.wav")
    yield* media.generateTestCall(file, { seconds, channels: 2 })
    const { size } = yield* Effect.promise(() => NodeFs.stat(file))
    console.log(`generated a ${seconds} s two-channel call with ffmpeg (lavfi: a 220 Hz tone, pink noise): ${kb(size)}`)

    const [extract, start, poll, analyze] = callStages
    const stages = [recordRuns(extract), recordRuns(start), recordRuns(poll), recordRuns(analyze)] as const
    yield* Layer.build(Worker.layer(stages, { ...Worker.defaults(), shutdownGrace: Duration.seconds(5) }))

    const createdAt = Date.now()
    const id = yield* Calls.create({ orgId, file })
    console.log(`call ${id} created (org ${orgId}): source uploaded, extract_audio enqueued\n`)

    let call = yield* Calls.get(id)
    while (call.status !== "done" && call.status !== "failed") {
      if (Date.now() - createdAt > 180_000) return yield* Effect.fail(`call ${id} still ${call.status} after 3 minutes`)
      yield* Effect.sleep("100 millis")
      call = yield* Calls.get(id)
    }

    console.log("timeline (seconds since the call was created)")
    for (const run of runs) {
      const at = (t: number) => `+${((t - createdAt) / 1000).toFixed(2)}`.padStart(7)
      const which = `attempt ${run.attempt}${run.stage === "transcribe_poll" ? `, poll ${run.polls + 1}` : ""}`
      console.log(`  ${at(run.startedAt)} → ${at(run.endedAt)}  ${pad(run.stage, 17)} ${pad(which, 18)} ${run.outcome}`)
    }

    console.log(`\nresult: ${call.status}${call.completedAt ? ` in ${((call.completedAt.getTime() - call.createdAt.getTime()) / 1000).toFixed(1)} s` : ""}`)
    if (call.error) console.log(`  error      ${call.error}`)
    for (const [i, a] of call.artifacts.entries()) {
      const details = a.kind === "audio" ? `${kb(a.bytes)}, ${secondsOf(a.durationMs)}, ${a.channels} channel(s), ${a.contentType}` : kb(a.bytes)
      const removed = a.removedAt ? ", removed from storage after the transcript (retention)" : ""
      console.log(`  ${i === 0 ? "artifacts " : "          "} ${pad(a.kind, 7)} ${a.storageKey} (${details}${removed})`)
    }
    if (call.transcript) {
      const t = call.transcript
      console.log(`  transcript ${t.segments.length} segment(s), ${t.language ?? "language unknown"}, operation ${t.operationId}`)
      for (const s of t.segments) {
        console.log(`             [${(s.startMs / 1000).toFixed(1)}–${(s.endMs / 1000).toFixed(1)} s] channel ${s.channel}: ${s.text}`)
      }
    }
    if (call.analysis) {
      const a = call.analysis.analysis
      console.log(
        `  analysis   ${a.analyzer}: ${a.totalWords} words, ${secondsOf(a.durationMs)}, silence ${(a.silenceRatio * 100).toFixed(1)}%, ` +
          `keywords ${a.keywords.slice(0, 5).map((k) => `${k.word}×${k.count}`).join(", ")}`
      )
      // the generated call puts the agent on the left channel (0) and the client on the right (1)
      const side = (channel: string) => (channel === "0" ? " (agent, left)" : channel === "1" ? " (client, right)" : "")
      for (const c of a.channels) {
        console.log(
          `  talk time  channel ${c.channel}${pad(side(c.channel), 16)} ${secondsOf(c.talkMs)} (${(c.share * 100).toFixed(0)}%), ` +
            `${c.words} words, ${c.wordsPerMinute} words/min`
        )
      }
    }
    const traffic = yield* Effect.all([
      simulator.count("recognizeFileAsync"),
      simulator.count("getOperation"),
      simulator.count("getRecognition")
    ])
    console.log(`  simulator  recognizeFileAsync ×${traffic[0]}, getOperation ×${traffic[1]}, getRecognition ×${traffic[2]}`)
    if (call.status !== "done") return yield* Effect.fail(`the call ended ${call.status}`)
  }).pipe(Effect.provide(context))
}).pipe(
  Effect.scoped,
  // the worker and the simulator log every step at INFO; the timeline says it better
  Logger.withMinimumLogLevel(LogLevel.Warning)
)

NodeRuntime.runMain(demo)
