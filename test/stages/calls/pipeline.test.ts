/**
 * End to end on real Postgres, the real ffmpeg, s3rver and the SpeechKit simulator: a generated call goes
 * extract_audio → transcribe_start → transcribe_poll → analyze and ends with its transcript and analysis
 * stored; media with no audio stream, or no media at all, dead-letters at extract_audio with its reason.
 */
import { GetObjectCommand } from "@aws-sdk/client-s3"
import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import * as NodeFs from "node:fs/promises"
import * as NodePath from "node:path"
import * as SpeechKitSimulator from "../../../packages/media/src/testing/SpeechKitSimulator.js"
import * as Storage from "../../../packages/media/src/layers/Storage.js"
import { Calls, makeCallStages } from "../../../packages/media/src/stages/calls/index.js"
import {
  awaitCall,
  bucket,
  deadLettersOf,
  expectNoneLeft,
  ffmpeg,
  generatedCall,
  jobsOf,
  noise,
  S3Server,
  startWorker,
  tempDirectory,
  waitFor,
  worldLayer
} from "./support.js"

const orgId = "org-pipeline"

/** Short polls so the run takes real seconds, not minutes; the schedule's shape is production's. */
const fastStages = (tempDir: string) =>
  // the audio object is kept here so the test can read its bytes; retention.test.ts checks its removal
  makeCallStages({ pollFirstMin: "200 millis", pollCap: "500 millis", tempDir, allowFileUris: false, removeAudio: false })

describe("call pipeline end to end", () => {
  layer(worldLayer(), { excludeTestServices: true, timeout: 180_000 })((it) => {
    it.scoped("a generated call reaches analyze with a stored transcript and analysis", () =>
      Effect.gen(function*() {
        const simulator = yield* SpeechKitSimulator.SpeechKitSimulator
        const fixtures = yield* tempDirectory("calls-e2e-")
        const work = yield* tempDirectory("calls-work-")
        const file = yield* generatedCall(fixtures, "call.wav", 12)
        yield* startWorker(fastStages(work))

        const id = yield* Calls.create({ orgId, file })
        const call = yield* awaitCall(id, ["done", "failed"])

        expect(call.error).toBeNull()
        expect(call.status).toBe("done")
        expect(call.completedAt).toBeInstanceOf(Date)
        expect(call.artifacts.map((a) => [a.kind, a.storageKey])).toEqual([
          ["source", `orgs/${orgId}/calls/${id}/source.wav`],
          ["audio", `orgs/${orgId}/calls/${id}/audio.ogg`]
        ])
        const audio = call.artifacts.find((a) => a.kind === "audio")!
        expect(audio.contentType).toBe("audio/ogg; codecs=opus")
        expect(audio.durationMs).toBeGreaterThan(11_500)
        expect(audio.durationMs).toBeLessThan(12_500)
        expect(audio.bytes).toBeGreaterThan(1000)

        // the object the simulator downloaded is OGG Opus, in the bucket at the deterministic key
        const { client } = yield* S3Server
        const object = yield* Effect.promise(() =>
          client.send(new GetObjectCommand({ Bucket: bucket, Key: audio.storageKey })).then((r) => r.Body!.transformToByteArray())
        )
        expect(Buffer.from(object.subarray(0, 4)).toString("latin1")).toBe("OggS")
        expect(object.length).toBe(audio.bytes)

        const transcript = call.transcript!
        expect(transcript.operationId).toBe(call.operationId)
        expect(transcript.language).toBe("ru-RU")
        expect(transcript.durationMs).toBe(audio.durationMs)
        // the two-channel recording stays two channels, each recognised on its own: the simulator derives one
        // utterance per 5 s of audio per channel, so 12 s of stereo → 3 per channel, each segment tagged
        expect(audio.channels).toBe(2)
        expect(transcript.segments.map((s) => [s.startMs, s.channel, s.text])).toEqual([
          [0, "0", "Simulated utterance 1 on channel 0."],
          [0, "1", "Simulated utterance 1 on channel 1."],
          [5000, "0", "Simulated utterance 2 on channel 0."],
          [5000, "1", "Simulated utterance 2 on channel 1."],
          [10000, "0", "Simulated utterance 3 on channel 0."],
          [10000, "1", "Simulated utterance 3 on channel 1."]
        ])
        // the simulator times the audio by its last granule, ffprobe by the container: a few ms apart
        expect(Math.abs(transcript.segments.at(-1)!.endMs - audio.durationMs!)).toBeLessThan(50)

        const analysis = call.analysis!
        expect(analysis.analyzer).toBe("deterministic/1")
        expect(analysis.analysis.totalWords).toBe(36)
        expect(analysis.analysis.durationMs).toBe(audio.durationMs)
        // talk time per channel: each side spoke for the whole of its three utterances
        expect(analysis.analysis.channels.map((c) => [c.channel, c.words, c.share])).toEqual([["0", 18, 0.5], ["1", 18, 0.5]])
        for (const channel of analysis.analysis.channels) expect(Math.abs(channel.talkMs - audio.durationMs!)).toBeLessThan(50)
        expect(analysis.analysis.language).toBe("ru-RU")

        // one recognition, polled until done (the simulator answers "running" once), one result read
        expect(yield* simulator.count("recognizeFileAsync")).toBe(1)
        expect(yield* simulator.count("getOperation")).toBe(2)
        expect(yield* simulator.count("getRecognition")).toBe(1)
        const recognize = (yield* simulator.lastRequest("recognizeFileAsync")).pipe((o) => o._tag === "Some" ? o.value : undefined)
        expect((recognize!.body as { uri: string }).uri).toMatch(new RegExp(`^http://127\\.0\\.0\\.1:\\d+/${bucket}/orgs/${orgId}/calls/${id}/audio\\.ogg$`))

        expect(yield* jobsOf(id)).toEqual([])
        expect(yield* deadLettersOf(id)).toEqual([])
        yield* expectNoneLeft(work)
      }))

    it.scoped("a call created from a storage URI runs the same way, reading the object in place", () =>
      Effect.gen(function*() {
        const storage = yield* Storage.Storage
        const fixtures = yield* tempDirectory("calls-uri-")
        const work = yield* tempDirectory("calls-work-")
        const file = yield* generatedCall(fixtures, "upload.mp3", 4)
        yield* storage.put("incoming/upload 1.mp3", Storage.fromFile(file))
        yield* startWorker(fastStages(work))

        // outside the org's own prefix, under one the operator allows it (STORAGE_ORG_PREFIXES)
        const id = yield* Calls.create({ orgId, uri: `s3://${bucket}/incoming/upload%201.mp3`, sourcePrefixes: ["incoming/"] })
        const call = yield* awaitCall(id, ["done", "failed"])
        expect(call.error).toBeNull()
        expect(call.status).toBe("done")
        expect(call.sourceKey).toBe("incoming/upload 1.mp3")
        expect(call.artifacts.map((a) => [a.kind, a.storageKey])).toEqual([
          ["source", "incoming/upload 1.mp3"],
          ["audio", `orgs/${orgId}/calls/${id}/audio.ogg`]
        ])
        // 4 s of stereo: one utterance per channel
        expect(call.transcript!.segments.map((s) => s.channel)).toEqual(["0", "1"])
        expect(call.analysis!.analysis.totalWords).toBe(12)
        yield* expectNoneLeft(work)
      }))

    it.scoped("a video with no audio stream dead-letters at extract_audio, saying so", () =>
      Effect.gen(function*() {
        const fixtures = yield* tempDirectory("calls-video-")
        const work = yield* tempDirectory("calls-work-")
        const video = NodePath.join(fixtures, "screen.mp4")
        yield* ffmpeg("-f", "lavfi", "-i", "testsrc=duration=2:size=160x120:rate=10", "-an", video)
        yield* startWorker(fastStages(work))

        const id = yield* Calls.create({ orgId, file: video })
        const call = yield* awaitCall(id, ["failed", "done"])
        const key = `orgs/${orgId}/calls/${id}/source.mp4`
        expect(call.status).toBe("failed")
        expect(call.error).toBe(`extract_audio: cannot extract audio from ${key}: no audio stream in ${key} (format mov,mp4,m4a,3gp,3g2,mj2)`)
        const dead = yield* awaitDeadLetter(id)
        expect(dead.map((d) => [d.stage, d.attempts, d.reason])).toEqual([
          ["extract_audio", 1, `cannot extract audio from ${key}: no audio stream in ${key} (format mov,mp4,m4a,3gp,3g2,mj2)`]
        ])
        expect(call.artifacts.map((a) => a.kind)).toEqual(["source"])
        expect(yield* jobsOf(id)).toEqual([])
        yield* expectNoneLeft(work)
      }))

    it.scoped("a corrupt file dead-letters at extract_audio with ffprobe's reason", () =>
      Effect.gen(function*() {
        const fixtures = yield* tempDirectory("calls-corrupt-")
        const work = yield* tempDirectory("calls-work-")
        const junk = NodePath.join(fixtures, "call.wav")
        yield* Effect.promise(() => NodeFs.writeFile(junk, noise(64 * 1024)))
        yield* startWorker(fastStages(work))

        const id = yield* Calls.create({ orgId, file: junk })
        const call = yield* awaitCall(id, ["failed", "done"])
        const key = `orgs/${orgId}/calls/${id}/source.wav`
        expect(call.status).toBe("failed")
        expect(call.error).toMatch(new RegExp(`^extract_audio: cannot extract audio from ${key}: ffprobe cannot read ${key}: .+`))
        const [dead] = yield* awaitDeadLetter(id)
        expect(dead!.stage).toBe("extract_audio")
        expect(dead!.attempts).toBe(1)
        expect(dead!.reason).toContain(`ffprobe cannot read ${key}`)
        expect(dead!.errorHistory.map((e) => e.tag)).toEqual(["Permanent"])
        yield* expectNoneLeft(work)
      }))
  })
})

/** The dead letter lands just after the call is marked failed (the handler marks, then the runtime moves the job). */
const awaitDeadLetter = (callId: string) =>
  waitFor(`a dead letter for call ${callId}`, Effect.map(deadLettersOf(callId), (dead) => dead.length > 0 && dead))
