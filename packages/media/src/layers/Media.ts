/**
 * ffprobe / ffmpeg as a service: inspect a recording, turn it into what SpeechKit wants (OGG Opus,
 * 48 kHz; a two-channel recording stays two channels, anything else becomes mono), and synthesize a fake
 * call for demos and tests, so nothing is ever downloaded.
 *
 * The binaries come from `@ffmpeg-installer/ffmpeg` / `@ffprobe-installer/ffprobe` unless
 * `FFMPEG_PATH` / `FFPROBE_PATH` say otherwise; both are run once when the layer starts, so a
 * missing or broken binary stops the process at boot instead of failing every job.
 *
 * Every run is a child process owned by a Scope: interrupting the fiber sends SIGTERM to the process
 * group, then SIGKILL after a grace period, and waits for it to exit.
 */
import * as Command from "@effect/platform/Command"
import * as CommandExecutor from "@effect/platform/CommandExecutor"
import type { PlatformError } from "@effect/platform/Error"
import * as FileSystem from "@effect/platform/FileSystem"
import * as NodeContext from "@effect/platform-node/NodeContext"
import { Config, ConfigError, Context, Data, Duration, Effect, Exit, Layer, Option, Schema, Stream } from "effect"
import { createRequire } from "node:module"
import * as NodePath from "node:path"
import * as JobError from "pgfiber/internal/JobError.js"

/** What ffprobe says about a file. `durationSeconds` is 0 when the container does not say. */
export const ProbeResult = Schema.Struct({
  durationSeconds: Schema.Number,
  audioStreams: Schema.Int,
  formatName: Schema.String,
  /** The first audio stream, the one `toOggOpus` converts; null when there is none. */
  audio: Schema.NullOr(Schema.Struct({
    codecName: Schema.String,
    sampleRate: Schema.Int,
    channels: Schema.Int
  }))
})
export type ProbeResult = typeof ProbeResult.Type

export interface TestCallOptions {
  readonly seconds: number
  /** 2 = agent on the left, client on the right, like a dual-channel call recording. */
  readonly channels: 1 | 2
}

export type MediaError = JobError.Transient | JobError.Permanent

export class Media extends Context.Tag("pgfiber/Media")<Media, {
  readonly probe: (path: string) => Effect.Effect<ProbeResult, MediaError>
  /** Probes first: no audio stream is Permanent before ffmpeg runs. A failed run leaves no output file. */
  readonly toOggOpus: (input: string, output: string) => Effect.Effect<void, MediaError>
  /** Output format follows the extension (`.wav`, `.ogg`, `.mp3`, …). */
  readonly generateTestCall: (output: string, options: TestCallOptions) => Effect.Effect<void, MediaError>
}>() {}

/** The layer could not start: a binary is missing or does not run. */
export class MediaUnavailable extends Data.TaggedError("MediaUnavailable")<{ readonly message: string }> {}

// ---------------------------------------------------------------------------------------------
// Binaries and configuration

interface Tool {
  readonly name: "ffmpeg" | "ffprobe"
  readonly path: string
  readonly envVar: "FFMPEG_PATH" | "FFPROBE_PATH"
}

export interface Binaries {
  readonly ffmpegPath: string
  readonly ffprobePath: string
}

export const binariesConfig: Config.Config<{
  readonly ffmpegPath: Option.Option<string>
  readonly ffprobePath: Option.Option<string>
}> = Config.all({
  ffmpegPath: Config.option(Config.nonEmptyString("FFMPEG_PATH")),
  ffprobePath: Config.option(Config.nonEmptyString("FFPROBE_PATH"))
})

// Required lazily: the installer packages throw at import on platforms they have no binary for,
// which must not matter when FFMPEG_PATH / FFPROBE_PATH point elsewhere.
const installedBinary = (packageName: string, envVar: string) =>
  Effect.try({
    try: () => (createRequire(import.meta.url)(packageName) as { readonly path: string }).path,
    catch: (error) =>
      new MediaUnavailable({ message: `${packageName} has no binary here (${String(error)}); set ${envVar}` })
  })

export const resolveBinaries: Effect.Effect<Binaries, ConfigError.ConfigError | MediaUnavailable> = Effect.gen(
  function*() {
    const configured = yield* binariesConfig
    const ffmpegPath = yield* Option.match(configured.ffmpegPath, {
      onSome: Effect.succeed,
      onNone: () => installedBinary("@ffmpeg-installer/ffmpeg", "FFMPEG_PATH")
    })
    const ffprobePath = yield* Option.match(configured.ffprobePath, {
      onSome: Effect.succeed,
      onNone: () => installedBinary("@ffprobe-installer/ffprobe", "FFPROBE_PATH")
    })
    return { ffmpegPath, ffprobePath }
  }
)

// ---------------------------------------------------------------------------------------------
// Running a tool

interface ToolRun {
  readonly exitCode: number
  readonly stdout: string
  readonly stderr: string
}

/** ffmpeg writes progress to stderr all the time; only the end of it explains a failure. */
const stderrTailBytes = 16 * 1024
/** How long a process gets to exit on SIGTERM before SIGKILL. */
const killGracePeriod = Duration.seconds(2)

const spawnFailure = (tool: Tool) => (error: PlatformError): MediaError => {
  const reason = error._tag === "SystemError" ? error.reason : undefined
  return reason === "NotFound" || reason === "PermissionDenied" || error._tag === "BadArgument"
    ? new JobError.Permanent({ message: `cannot run ${tool.name} at ${tool.path} (set ${tool.envVar}): ${error.message}` })
    : new JobError.Transient({ message: `cannot start ${tool.name}: ${error.message}` })
}

/** Collects a pipe as text, keeping only its last `limit` bytes. */
const collectText = (bytes: Stream.Stream<Uint8Array, PlatformError>, limit = Number.POSITIVE_INFINITY) =>
  Stream.runFold(bytes, new Uint8Array(0), (tail, chunk) => {
    const joined = Buffer.concat([tail, chunk])
    return joined.length > limit ? joined.subarray(joined.length - limit) : joined
  }).pipe(Effect.map((tail) => Buffer.from(tail).toString("utf8")))

/** The last few meaningful stderr lines, without ffmpeg's progress lines. */
export const stderrSummary = (stderr: string, lines = 4): string => {
  const meaningful = stderr
    .split(/[\r\n]+/)
    .map((line) => line.trim())
    .filter((line) => line.length > 0 && !/^(size|frame)=/.test(line))
  return meaningful.slice(-lines).join(" | ") || "(no output on stderr)"
}

const runTool = (executor: CommandExecutor.CommandExecutor, tool: Tool, args: ReadonlyArray<string>) =>
  Effect.scoped(
    Effect.gen(function*() {
      const process = yield* executor.start(Command.make(tool.path, ...args)).pipe(Effect.mapError(spawnFailure(tool)))
      // Runs before the executor's own finalizer, which sends SIGTERM and waits for as long as it takes:
      // a process that ignores SIGTERM gets SIGKILL after a grace period instead of hanging shutdown.
      yield* Effect.addFinalizer(() =>
        Effect.flatMap(process.isRunning, (running) =>
          running
            ? process.kill("SIGTERM").pipe(
              // Finalizers run uninterruptibly; without this the timeout could not cut the wait short.
              Effect.interruptible,
              Effect.timeoutOption(killGracePeriod),
              Effect.flatMap(Option.match({
                onSome: () => Effect.void,
                onNone: () => process.kill("SIGKILL")
              }))
            )
            : Effect.void).pipe(Effect.ignore)
      )
      const [stdout, stderr, exitCode] = yield* Effect.all(
        [collectText(process.stdout), collectText(process.stderr, stderrTailBytes), process.exitCode],
        { concurrency: "unbounded" }
      ).pipe(
        Effect.mapError((error) => new JobError.Transient({ message: `${tool.name} did not finish: ${error.message}` }))
      )
      return { exitCode, stdout, stderr } satisfies ToolRun
    })
  )

// ---------------------------------------------------------------------------------------------
// ffprobe output

const FfprobeOutput = Schema.parseJson(Schema.Struct({
  streams: Schema.optionalWith(
    Schema.Array(Schema.Struct({
      codec_type: Schema.optional(Schema.String),
      codec_name: Schema.optional(Schema.String),
      sample_rate: Schema.optional(Schema.String),
      channels: Schema.optional(Schema.Number),
      duration: Schema.optional(Schema.String)
    })),
    { default: () => [] }
  ),
  format: Schema.Struct({
    format_name: Schema.String,
    duration: Schema.optional(Schema.String)
  })
}))

const finiteOr = (text: string | undefined, fallback: number): number => {
  const value = text === undefined ? Number.NaN : Number(text)
  return Number.isFinite(value) ? value : fallback
}

const toProbeResult = (output: typeof FfprobeOutput.Type): ProbeResult => {
  const audio = output.streams.filter((stream) => stream.codec_type === "audio")
  const first = audio[0]
  // Some containers (streamed webm, raw formats) carry no duration; the longest stream is the next best.
  const streamDuration = Math.max(0, ...output.streams.map((stream) => finiteOr(stream.duration, 0)))
  return {
    durationSeconds: finiteOr(output.format.duration, streamDuration),
    audioStreams: audio.length,
    formatName: output.format.format_name,
    audio: first === undefined ? null : {
      codecName: first.codec_name ?? "unknown",
      sampleRate: Math.round(finiteOr(first.sample_rate, 0)),
      channels: first.channels ?? 0
    }
  }
}

/** Failures ffmpeg reports that a retry on a healthier machine can fix. */
const resourceTrouble = /No space left on device|Cannot allocate memory|Resource temporarily unavailable|Too many open files/i

// ---------------------------------------------------------------------------------------------
// The service

/** What every part of the service runs with: the process runner, the file system, the two binaries. */
interface MediaTools {
  readonly executor: CommandExecutor.CommandExecutor
  readonly fs: FileSystem.FileSystem
  readonly ffmpeg: Tool
  readonly ffprobe: Tool
}

/** Runs `tool -version` on start, like a database's `select 1`: a binary that does not run stops the layer. */
const checkToolRuns = (executor: CommandExecutor.CommandExecutor, tool: Tool) =>
  Effect.gen(function*() {
    const run = yield* runTool(executor, tool, ["-version"]).pipe(
      Effect.mapError((error) => new MediaUnavailable({ message: error.message }))
    )
    if (run.exitCode !== 0) {
      return yield* new MediaUnavailable({
        message: `${tool.name} at ${tool.path} (set ${tool.envVar}) exited ${run.exitCode} on -version: ${
          stderrSummary(run.stderr)
        }`
      })
    }
  })

/** Creates the directory an output file goes into. */
const ensureParentDirectory = (fs: FileSystem.FileSystem, path: string) =>
  fs.makeDirectory(NodePath.dirname(path), { recursive: true }).pipe(
    Effect.mapError((error) => new JobError.Transient({ message: `cannot create the directory of ${path}: ${error.message}` }))
  )

/** Runs ffmpeg writing `output`; a failed or interrupted run removes its half-written output. */
const runFfmpeg = (tools: MediaTools, args: ReadonlyArray<string>, output: string, what: string) =>
  Effect.zipRight(
    ensureParentDirectory(tools.fs, output),
    runTool(tools.executor, tools.ffmpeg, args).pipe(
      Effect.flatMap((run) => {
        if (run.exitCode === 0) return Effect.void
        const message = `ffmpeg failed ${what} (exit ${run.exitCode}): ${stderrSummary(run.stderr)}`
        return Effect.fail(
          resourceTrouble.test(run.stderr) ? new JobError.Transient({ message }) : new JobError.Permanent({ message })
        )
      }),
      Effect.onExit((exit) => Exit.isSuccess(exit) ? Effect.void : Effect.ignore(tools.fs.remove(output, { force: true })))
    )
  )

/** `Media.probe`: ffprobe's description of a file, decoded. */
const makeProbe = (tools: MediaTools) =>
  Effect.fn("Media.probe")(function*(path: string) {
    // Absolute paths keep names like "-x" or "a:b" from reading as options or protocols.
    const absolute = NodePath.resolve(path)
    yield* Effect.annotateCurrentSpan({ path: absolute })
    const run = yield* runTool(tools.executor, tools.ffprobe, [
      "-v",
      "error",
      "-print_format",
      "json",
      "-show_format",
      "-show_streams",
      absolute
    ])
    if (run.exitCode !== 0) {
      return yield* new JobError.Permanent({ message: `ffprobe cannot read ${absolute}: ${stderrSummary(run.stderr)}` })
    }
    const output = yield* Schema.decodeUnknown(FfprobeOutput)(run.stdout).pipe(
      Effect.mapError(() =>
        new JobError.Permanent({ message: `ffprobe gave no usable description of ${absolute}: ${stderrSummary(run.stderr)}` })
      )
    )
    return toProbeResult(output)
  })

/**
 * ffmpeg's arguments for SpeechKit's input. SpeechKit's async recognition takes OGG Opus; voip tuning and 32k a
 * channel keep speech clear and files small.
 */
const oggOpusArgs = (from: string, to: string, channels: 1 | 2): ReadonlyArray<string> => [
  "-y",
  "-i",
  from,
  "-map",
  "0:a:0",
  "-vn",
  "-ac",
  String(channels),
  "-ar",
  "48000",
  "-c:a",
  "libopus",
  "-b:a",
  `${32 * channels}k`,
  "-application",
  "voip",
  "-f",
  "ogg",
  to
]

/** `Media.toOggOpus`: probes, then converts the first audio stream to OGG Opus. */
const makeToOggOpus = (tools: MediaTools, probe: Media["Type"]["probe"]) =>
  Effect.fn("Media.toOggOpus")(function*(input: string, output: string) {
    const [from, to] = [NodePath.resolve(input), NodePath.resolve(output)]
    yield* Effect.annotateCurrentSpan({ input: from, output: to })
    const probed = yield* probe(from)
    if (probed.audioStreams === 0) {
      return yield* new JobError.Permanent({ message: `no audio stream in ${from} (format ${probed.formatName})` })
    }
    // A call recorded in stereo (agent on one side, client on the other) keeps its two channels:
    // SpeechKit recognises each channel of an OGG separately and tags its results, so who said what survives.
    // Other layouts (5.1 video, odd multi-track) are mixed down to one channel.
    const channels = probed.audio?.channels === 2 ? 2 : 1
    yield* Effect.annotateCurrentSpan({ channels })
    yield* runFfmpeg(tools, oggOpusArgs(from, to, channels), to, `converting ${from} to OGG Opus`)
  })

/** `Media.generateTestCall`: a synthetic call recording (see `testCallGraph`). */
const makeGenerateTestCall = (tools: MediaTools) =>
  Effect.fn("Media.generateTestCall")(function*(output: string, options: TestCallOptions) {
    const to = NodePath.resolve(output)
    const { channels, seconds } = options
    yield* Effect.annotateCurrentSpan({ output: to, seconds, channels })
    if (!(Number.isFinite(seconds) && seconds > 0 && seconds <= 3600) || (channels !== 1 && channels !== 2)) {
      return yield* new JobError.Permanent({
        message: `generateTestCall wants 0 < seconds <= 3600 and 1 or 2 channels, got ${seconds} s, ${channels} channels`
      })
    }
    yield* runFfmpeg(
      tools,
      ["-hide_banner", "-nostdin", "-y", "-filter_complex", testCallGraph(seconds, channels), "-map", "[call]", to],
      to,
      `generating a test call into ${to}`
    )
  })

export const make = (binaries: Binaries) =>
  Effect.gen(function*() {
    const executor = yield* CommandExecutor.CommandExecutor
    const fs = yield* FileSystem.FileSystem
    const ffmpeg: Tool = { name: "ffmpeg", path: binaries.ffmpegPath, envVar: "FFMPEG_PATH" }
    const ffprobe: Tool = { name: "ffprobe", path: binaries.ffprobePath, envVar: "FFPROBE_PATH" }
    for (const tool of [ffmpeg, ffprobe]) yield* checkToolRuns(executor, tool)
    const tools: MediaTools = { executor, fs, ffmpeg, ffprobe }
    const probe = makeProbe(tools)
    return Media.of({ probe, toOggOpus: makeToOggOpus(tools, probe), generateTestCall: makeGenerateTestCall(tools) })
  })

/**
 * Turns of a 4-second cycle: agent (a 220 Hz tone) for 2 s, client (pink noise) for 1.5 s, then
 * 0.5 s of silence. The noise has a fixed seed, so the same options give the same bytes.
 */
const testCallGraph = (seconds: number, channels: 1 | 2): string => {
  const rate = 16000
  const agent = `sine=frequency=220:sample_rate=${rate}:duration=${seconds},volume=0.5,` +
    `volume=volume=0:enable='gte(mod(t\\,4)\\,2)',aformat=channel_layouts=mono[agent]`
  const client = `anoisesrc=color=pink:amplitude=0.3:seed=42:sample_rate=${rate}:duration=${seconds},` +
    `volume=volume=0:enable='not(between(mod(t\\,4)\\,2\\,3.5))',aformat=channel_layouts=mono[client]`
  const mix = channels === 2 ? "[agent][client]amerge=inputs=2[call]" : "[agent][client]amix=inputs=2:duration=first[call]"
  return `${agent};${client};${mix}`
}

/** Binaries from `FFMPEG_PATH` / `FFPROBE_PATH`, else the installer packages; both checked on start. */
export const layer: Layer.Layer<Media, ConfigError.ConfigError | MediaUnavailable> = Layer.effect(
  Media,
  Effect.flatMap(resolveBinaries, make)
).pipe(Layer.provide(NodeContext.layer))

export const layerWith = (binaries: Binaries): Layer.Layer<Media, MediaUnavailable> =>
  Layer.effect(Media, make(binaries)).pipe(Layer.provide(NodeContext.layer))

/**
 * A test double for logic that only needs Media's answers (a stage deciding what to do with "no
 * audio"). Methods not given die naming themselves, so a test cannot pass by silently skipping work.
 */
export const layerStub = (stub: Partial<Media["Type"]>): Layer.Layer<Media> => {
  const missing = (method: string) => () => Effect.dieMessage(`Media.${method} is not stubbed in this test`)
  return Layer.succeed(
    Media,
    Media.of({
      probe: stub.probe ?? missing("probe"),
      toOggOpus: stub.toOggOpus ?? missing("toOggOpus"),
      generateTestCall: stub.generateTestCall ?? missing("generateTestCall")
    })
  )
}
