import * as Command from "@effect/platform/Command"
import * as NodeContext from "@effect/platform-node/NodeContext"
import { describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Duration, Effect, Fiber, Layer } from "effect"
import * as NodeFs from "node:fs/promises"
import * as NodeOs from "node:os"
import * as NodePath from "node:path"
import * as JobError from "../../packages/pgfiber/src/JobError.js"
import * as Media from "../../packages/media/src/layers/Media.js"
import { noise } from "../support/bytes.js"
import { deadline, waitFor } from "../support/waitFor.js"

// Fixtures are made at test time with the same ffmpeg, so nothing binary is committed.
// Tests that interrupt real processes run on the live clock (scopedLive): the kill grace period and
// the guards against hanging are real time, which a TestClock would freeze.

const tempDirectory = Effect.acquireRelease(
  Effect.promise(() => NodeFs.mkdtemp(NodePath.join(NodeOs.tmpdir(), "media-"))),
  (dir) => Effect.promise(() => NodeFs.rm(dir, { recursive: true, force: true }))
)

/** Runs the real ffmpeg directly, for fixtures the Media API deliberately cannot make. */
const ffmpegFixture = (...args: Array<string>) =>
  Effect.gen(function*() {
    const { ffmpegPath } = yield* Media.resolveBinaries
    const exitCode = yield* Command.exitCode(Command.make(ffmpegPath, "-hide_banner", "-nostdin", "-loglevel", "error", ...args))
    expect(exitCode).toBe(0)
  }).pipe(Effect.provide(NodeContext.layer))

/** Processes whose command line mentions `needle`, read from /proc. */
const processesMentioning = (needle: string) =>
  Effect.promise(async () => {
    const pids = (await NodeFs.readdir("/proc")).filter((name) => /^\d+$/.test(name))
    const found: Array<string> = []
    for (const pid of pids) {
      const cmdline = await NodeFs.readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "")
      if (cmdline.includes(needle)) found.push(`${pid}: ${cmdline.replaceAll("\u0000", " ")}`)
    }
    return found
  })

const isAlive = (pid: number) => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

const fileExists = (path: string) => Effect.promise(() => NodeFs.access(path).then(() => true, () => false))

const mkfifo = (path: string) =>
  Command.exitCode(Command.make("mkfifo", path)).pipe(
    Effect.tap((code) => expect(code).toBe(0)),
    Effect.provide(NodeContext.layer)
  )

it.layer(Media.layer, { timeout: 180_000 })("Media (real ffmpeg)", (it) => {
  it.scoped("generates a stereo call and probes its duration, streams and format", () =>
    Effect.gen(function*() {
      const media = yield* Media.Media
      const dir = yield* tempDirectory
      const call = NodePath.join(dir, "in", "call.wav")
      yield* media.generateTestCall(call, { seconds: 6, channels: 2 })
      const probed = yield* media.probe(call)
      expect(probed.formatName).toBe("wav")
      expect(probed.audioStreams).toBe(1)
      expect(probed.durationSeconds).toBeCloseTo(6, 1)
      expect(probed.audio).toEqual({ codecName: "pcm_s16le", sampleRate: 16000, channels: 2 })
    }))

  it.scoped("the same options give the same bytes", () =>
    Effect.gen(function*() {
      const media = yield* Media.Media
      const dir = yield* tempDirectory
      const [a, b] = [NodePath.join(dir, "a.wav"), NodePath.join(dir, "b.wav")]
      yield* media.generateTestCall(a, { seconds: 3, channels: 1 })
      yield* media.generateTestCall(b, { seconds: 3, channels: 1 })
      const [bytesA, bytesB] = yield* Effect.promise(() => Promise.all([NodeFs.readFile(a), NodeFs.readFile(b)]))
      expect(Buffer.compare(bytesA, bytesB)).toBe(0)
      expect((yield* media.probe(a)).audio?.channels).toBe(1)
    }))

  it.scoped("the test call has turns: agent left, client right, with a silent gap", () =>
    Effect.gen(function*() {
      const media = yield* Media.Media
      const dir = yield* tempDirectory
      const wav = NodePath.join(dir, "turns.wav")
      yield* media.generateTestCall(wav, { seconds: 4, channels: 2 })
      const bytes = yield* Effect.promise(() => NodeFs.readFile(wav))
      // ffmpeg may write a LIST chunk before the samples; find the data chunk instead of assuming 44 bytes.
      const dataStart = bytes.indexOf("data") + 8
      const samples = new Int16Array(bytes.buffer.slice(bytes.byteOffset + dataStart, bytes.byteOffset + bytes.length))
      // Peak of one channel over [from, to) seconds, 16 kHz interleaved stereo.
      const peak = (channel: 0 | 1, from: number, to: number) => {
        let max = 0
        for (let i = Math.floor(from * 16000); i < Math.floor(to * 16000); i++) {
          max = Math.max(max, Math.abs(samples[i * 2 + channel]!))
        }
        return max
      }
      expect(peak(0, 0.1, 1.9)).toBeGreaterThan(1000)
      expect(peak(1, 0.1, 1.9)).toBe(0)
      expect(peak(0, 2.1, 3.4)).toBe(0)
      expect(peak(1, 2.1, 3.4)).toBeGreaterThan(1000)
      expect(peak(0, 3.6, 3.9) + peak(1, 3.6, 3.9)).toBe(0)
    }))

  it.scoped("converts to OGG Opus, 48 kHz, keeping a two-channel call's two channels (mono stays mono)", () =>
    Effect.gen(function*() {
      const media = yield* Media.Media
      const dir = yield* tempDirectory
      const call = NodePath.join(dir, "call.wav")
      const ogg = NodePath.join(dir, "out", "call.ogg")
      yield* media.generateTestCall(call, { seconds: 5, channels: 2 })
      yield* media.toOggOpus(call, ogg)
      const bytes = yield* Effect.promise(() => NodeFs.readFile(ogg))
      expect(bytes.subarray(0, 4).toString("latin1")).toBe("OggS")
      expect(bytes.indexOf("OpusHead")).toBeGreaterThan(0)
      const probed = yield* media.probe(ogg)
      expect(probed.formatName).toBe("ogg")
      expect(probed.audio).toEqual({ codecName: "opus", sampleRate: 48000, channels: 2 })
      expect(probed.durationSeconds).toBeCloseTo(5, 1)
      const mono = NodePath.join(dir, "mono.wav")
      yield* media.generateTestCall(mono, { seconds: 1, channels: 1 })
      yield* media.toOggOpus(mono, NodePath.join(dir, "mono.ogg"))
      expect((yield* media.probe(NodePath.join(dir, "mono.ogg"))).audio?.channels).toBe(1)
    }))

  it.scoped("takes the audio out of a video with sound", () =>
    Effect.gen(function*() {
      const media = yield* Media.Media
      const dir = yield* tempDirectory
      const video = NodePath.join(dir, "meeting.mp4")
      yield* ffmpegFixture(
        "-f", "lavfi", "-i", "testsrc=duration=2:size=160x120:rate=10",
        "-f", "lavfi", "-i", "sine=frequency=440:duration=2",
        "-shortest", video
      )
      const probedVideo = yield* media.probe(video)
      expect(probedVideo.audioStreams).toBe(1)
      const ogg = NodePath.join(dir, "meeting.ogg")
      yield* media.toOggOpus(video, ogg)
      expect((yield* media.probe(ogg)).audio?.codecName).toBe("opus")
    }))

  it.scoped("a video without audio: probe counts 0 streams, toOggOpus is Permanent before ffmpeg runs", () =>
    Effect.gen(function*() {
      const media = yield* Media.Media
      const dir = yield* tempDirectory
      const video = NodePath.join(dir, "silent-video.mp4")
      yield* ffmpegFixture("-f", "lavfi", "-i", "testsrc=duration=2:size=160x120:rate=10", "-an", video)
      const probed = yield* media.probe(video)
      expect(probed.audioStreams).toBe(0)
      expect(probed.audio).toBeNull()
      const ogg = NodePath.join(dir, "never.ogg")
      const error = yield* Effect.flip(media.toOggOpus(video, ogg))
      expect(error).toBeInstanceOf(JobError.Permanent)
      expect(error.message).toContain("no audio stream in")
      expect(error.message).toContain(video)
      expect(yield* fileExists(ogg)).toBe(false)
    }))

  it.scoped("random bytes are Permanent with ffprobe's reason, for probe and toOggOpus", () =>
    Effect.gen(function*() {
      const media = yield* Media.Media
      const dir = yield* tempDirectory
      const junk = NodePath.join(dir, "upload.bin")
      yield* Effect.promise(() => NodeFs.writeFile(junk, noise(64 * 1024)))
      const probeError = yield* Effect.flip(media.probe(junk))
      expect(probeError._tag).toBe("Permanent")
      expect(probeError.message).toContain(junk)
      expect(probeError.message).toContain("Invalid data found when processing input")
      const convertError = yield* Effect.flip(media.toOggOpus(junk, NodePath.join(dir, "x.ogg")))
      expect(convertError._tag).toBe("Permanent")

      // With an .mp3 name ffprobe tries the mp3 demuxer and fails differently; still Permanent.
      const namedMp3 = NodePath.join(dir, "upload.mp3")
      yield* Effect.promise(() => NodeFs.writeFile(namedMp3, noise(64 * 1024)))
      expect((yield* Effect.flip(media.toOggOpus(namedMp3, NodePath.join(dir, "y.ogg"))))._tag).toBe("Permanent")
    }))

  it.scoped("a missing input is Permanent and names the file", () =>
    Effect.gen(function*() {
      const media = yield* Media.Media
      const dir = yield* tempDirectory
      const error = yield* Effect.flip(media.probe(NodePath.join(dir, "nope.wav")))
      expect(error._tag).toBe("Permanent")
      expect(error.message).toContain("nope.wav")
      expect(error.message).toContain("No such file or directory")
    }))

  it.scoped("an output ffmpeg cannot write is Permanent with ffmpeg's reason", () =>
    Effect.gen(function*() {
      const media = yield* Media.Media
      const dir = yield* tempDirectory
      const call = NodePath.join(dir, "call.wav")
      yield* media.generateTestCall(call, { seconds: 1, channels: 1 })
      const output = NodePath.join(dir, "out.ogg")
      yield* Effect.promise(() => NodeFs.mkdir(output))
      const error = yield* Effect.flip(media.toOggOpus(call, output))
      expect(error._tag).toBe("Permanent")
      expect(error.message).toContain("ffmpeg failed converting")
      expect(error.message).toContain("Is a directory")
    }))

  it.scoped("generateTestCall refuses nonsense options", () =>
    Effect.gen(function*() {
      const media = yield* Media.Media
      const dir = yield* tempDirectory
      for (const options of [{ seconds: 0, channels: 1 }, { seconds: Number.NaN, channels: 2 }, { seconds: 5, channels: 3 }]) {
        const error = yield* Effect.flip(
          media.generateTestCall(NodePath.join(dir, "x.wav"), options as Media.TestCallOptions)
        )
        expect(error._tag).toBe("Permanent")
      }
    }))

})

describe("Media interruption (live clock)", () => {
  it.scopedLive("interrupting a conversion kills ffmpeg and removes the half-written output", () =>
    Effect.gen(function*() {
      const media = yield* Media.Media
      const dir = yield* tempDirectory
      const call = NodePath.join(dir, "long.wav")
      const ogg = NodePath.join(dir, "long.ogg")
      yield* media.generateTestCall(call, { seconds: 900, channels: 1 })
      const fiber = yield* Effect.fork(media.toOggOpus(call, ogg))
      // looked at every 25 ms: the conversion is to be caught half-way
      yield* waitFor("ffmpeg to start writing the output", fileExists(ogg), deadline, Duration.millis(25))
      expect(yield* fileExists(ogg)).toBe(true)
      expect(yield* processesMentioning(ogg)).toHaveLength(1)
      yield* Effect.timeoutFail(Fiber.interrupt(fiber), {
        duration: "5 seconds",
        onTimeout: () => new Error("interrupting the conversion did not finish")
      })
      expect(yield* processesMentioning(ogg)).toEqual([])
      expect(yield* fileExists(ogg)).toBe(false)
    }).pipe(Effect.provide(Media.layer)))

  it.scopedLive("interrupting a probe kills ffprobe (blocked opening a FIFO no one writes)", () =>
    Effect.gen(function*() {
      const media = yield* Media.Media
      const dir = yield* tempDirectory
      const fifo = NodePath.join(dir, "stuck.fifo")
      yield* mkfifo(fifo)
      const fiber = yield* Effect.fork(media.probe(fifo))
      yield* Effect.sleep("300 millis")
      expect(yield* processesMentioning(fifo)).toHaveLength(1)
      yield* Effect.timeoutFail(Fiber.interrupt(fiber), {
        duration: "5 seconds",
        onTimeout: () => new Error("interrupting the probe did not finish")
      })
      expect(yield* processesMentioning(fifo)).toEqual([])
    }).pipe(Effect.provide(Media.layer)))
})

describe("Media binaries", () => {
  const withEnv = (env: Record<string, string>) => Layer.setConfigProvider(ConfigProvider.fromMap(new Map(Object.entries(env))))

  it.effect("a missing ffmpeg fails the layer at start, naming the path and FFMPEG_PATH", () =>
    Effect.gen(function*() {
      const error = yield* Layer.build(Media.layer).pipe(
        Effect.scoped,
        Effect.provide(withEnv({ FFMPEG_PATH: "/nonexistent/ffmpeg" })),
        Effect.flip
      )
      expect(error._tag).toBe("MediaUnavailable")
      expect(error.message).toContain("/nonexistent/ffmpeg")
      expect(error.message).toContain("FFMPEG_PATH")
    }))

  it.effect("a missing ffprobe names FFPROBE_PATH", () =>
    Effect.gen(function*() {
      const error = yield* Layer.build(Media.layer).pipe(
        Effect.scoped,
        Effect.provide(withEnv({ FFPROBE_PATH: "/nonexistent/ffprobe" })),
        Effect.flip
      )
      expect(error.message).toContain("FFPROBE_PATH")
    }))

  it.effect("without FFMPEG_PATH / FFPROBE_PATH the installer binaries are used", () =>
    Effect.gen(function*() {
      const binaries = yield* Effect.provide(Media.resolveBinaries, withEnv({}))
      expect(binaries.ffmpegPath).toMatch(/@ffmpeg-installer/)
      expect(binaries.ffprobePath).toMatch(/@ffprobe-installer/)
      const overridden = yield* Effect.provide(Media.resolveBinaries, withEnv({ FFMPEG_PATH: "/opt/ffmpeg" }))
      expect(overridden.ffmpegPath).toBe("/opt/ffmpeg")
    }))

  it.scopedLive("a process that ignores SIGTERM is killed with SIGKILL when its fiber is interrupted", () =>
    Effect.gen(function*() {
      const dir = yield* tempDirectory
      const real = yield* Media.resolveBinaries
      const pidFile = NodePath.join(dir, "pid")
      // An ffmpeg stand-in: answers -version like ffmpeg, otherwise ignores SIGTERM and hangs.
      const stubborn = NodePath.join(dir, "stubborn-ffmpeg")
      yield* Effect.promise(() =>
        NodeFs.writeFile(
          stubborn,
          `#!/bin/sh\nif [ "$1" = "-version" ]; then exec "${real.ffmpegPath}" -version; fi\n` +
            `trap '' TERM\necho $$ > "${pidFile}"\nexec sleep 25\n`,
          { mode: 0o755 }
        )
      )
      const media = yield* Effect.provide(Media.Media, Media.layerWith({ ...real, ffmpegPath: stubborn }))
      const fiber = yield* Effect.fork(media.generateTestCall(NodePath.join(dir, "call.wav"), { seconds: 1, channels: 1 }))
      const pid = yield* waitFor("the stand-in to start", Effect.promise(async () => {
        const text = await NodeFs.readFile(pidFile, "utf8").catch(() => "")
        return text.trim() !== "" && Number(text.trim())
      }))
      expect(isAlive(pid)).toBe(true)
      const started = Date.now()
      yield* Effect.timeoutFail(Fiber.interrupt(fiber), {
        duration: "10 seconds",
        onTimeout: () => new Error("interrupting did not finish")
      })
      // SIGTERM was ignored, so it took the grace period and then SIGKILL.
      expect(Date.now() - started).toBeGreaterThanOrEqual(1_500)
      expect(isAlive(pid)).toBe(false)
    }), { timeout: 120_000 })
})

describe("Media.layerStub", () => {
  it.effect("answers with what it was given and dies on what it was not", () =>
    Effect.gen(function*() {
      const media = yield* Media.Media
      const probed = yield* media.probe("/any")
      expect(probed.audioStreams).toBe(0)
      const exit = yield* Effect.exit(media.toOggOpus("/a", "/b"))
      expect(exit._tag === "Failure" && String(exit.cause)).toContain("Media.toOggOpus is not stubbed")
    }).pipe(
      Effect.provide(Media.layerStub({
        probe: () => Effect.succeed({ durationSeconds: 3, audioStreams: 0, formatName: "mp4", audio: null })
      }))
    ))
})

describe("Media.stderrSummary", () => {
  it("keeps the last meaningful lines and drops progress", () => {
    const stderr = "ffmpeg version x\nInput #0\r\nsize=  10kB time=00:00:01\rsize=  20kB time=00:00:02\n" +
      "[opus @ 0x1] bad thing\nConversion failed!\n"
    expect(Media.stderrSummary(stderr, 2)).toBe("[opus @ 0x1] bad thing | Conversion failed!")
    expect(Media.stderrSummary("")).toBe("(no output on stderr)")
  })
})
