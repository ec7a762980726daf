/**
 * Duplicate delivery: every call stage, run twice for the same call (one after the other, and at once),
 * leaves the same rows (timestamps included) and the same stored objects as running it once, hands off
 * the same follow-up, and starts one recognition, not two. Then the same through the worker: a call whose
 * extract_audio job is enqueued twice ends exactly like a call processed once.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect, Schema } from "effect"
import * as SpeechKitSimulator from "../../../packages/media/src/testing/SpeechKitSimulator.js"
import * as Queue from "../../../packages/pgfiber/src/queue/Queue.js"
import * as Stage from "../../../packages/pgfiber/src/runtime/Stage.js"
import { Calls, makeCallStages } from "../../../packages/media/src/stages/calls/index.js"
import {
  awaitCall,
  expectNoneLeft,
  generatedCall,
  jobsOf,
  snapshot,
  startWorker,
  tempDirectory,
  waitFor,
  worldLayer
} from "./support.js"

const orgId = "org-idem"

const info = (stage: string, callId: string, polls = 0): Stage.JobInfo => ({
  id: "1",
  stage,
  attempt: 1,
  maxAttempts: 5,
  polls,
  orgId,
  subjectId: callId,
  createdAt: new Date(),
  claimedAt: new Date(),
  ...Stage.jobInfoDefaults
})

/** The follow-up a run handed off, with its payload decoded by the next stage's Schema. */
const followUpOf = (result: void | Stage.Completion) => {
  expect(result?._tag).toBe("Completion")
  const [next, ...rest] = result!.followUps
  expect(rest).toEqual([])
  return next!
}

/** Recognitions the simulator was asked to start for this call's audio (other tests' calls share the simulator). */
const recognitionsOf = (simulator: SpeechKitSimulator.Handle, callId: string) =>
  Effect.map(
    simulator.requests("recognizeFileAsync"),
    (requests) => requests.filter((r) => String((r.body as { uri?: string })?.uri).includes(callId)).length
  )

describe("call stages under duplicate delivery", () => {
  layer(worldLayer(), { excludeTestServices: true, timeout: 180_000 })((it) => {
    it.scoped("each stage run twice leaves the same rows and objects as once", () =>
      Effect.gen(function*() {
        const simulator = yield* SpeechKitSimulator.SpeechKitSimulator
        const fixtures = yield* tempDirectory("calls-idem-")
        const work = yield* tempDirectory("calls-work-")
        const [extract, start, poll, analyze] = makeCallStages({ pollFirstMin: "100 millis", tempDir: work })
        const file = yield* generatedCall(fixtures, "call.wav", 6)
        const callId = yield* Calls.create({ orgId, file })
        const call = { id: callId, orgId }

        // extract_audio
        const extracted = yield* extract.handler({ callId }, info(extract.name, callId))
        const afterExtract = yield* snapshot(call)
        expect(afterExtract.objects.map((o) => o.key)).toEqual([
          `orgs/${orgId}/calls/${callId}/audio.ogg`,
          `orgs/${orgId}/calls/${callId}/source.wav`
        ])
        expect(yield* extract.handler({ callId }, info(extract.name, callId))).toEqual(extracted)
        expect(yield* snapshot(call)).toEqual(afterExtract)
        yield* expectNoneLeft(work)
        const toStart = followUpOf(extracted)
        expect(toStart).toMatchObject({ stage: "transcribe_start", dedupeKey: `transcribe_start:${callId}`, subjectId: callId, orgId })

        // transcribe_start: the second run polls the recorded operation instead of starting another
        const startPayload = Schema.decodeUnknownSync(start.payload)(toStart.payload)
        const started = yield* start.handler(startPayload, info(start.name, callId))
        const afterStart = yield* snapshot(call)
        expect(yield* start.handler(startPayload, info(start.name, callId))).toEqual(started)
        expect(yield* snapshot(call)).toEqual(afterStart)
        expect(yield* recognitionsOf(simulator, callId)).toBe(1)
        const toPoll = followUpOf(started)
        expect(toPoll.delay).toBeDefined()

        // transcribe_poll: "still running" changes nothing; two finished polls at once store one transcript
        const pollPayload = Schema.decodeUnknownSync(poll.payload)(toPoll.payload)
        const running = yield* Effect.flip(poll.handler(pollPayload, info(poll.name, callId, 0)))
        expect(running._tag).toBe("NotReady")
        expect(yield* snapshot(call)).toEqual(afterStart)
        const [polledA, polledB] = yield* Effect.all([
          poll.handler(pollPayload, info(poll.name, callId, 1)),
          poll.handler(pollPayload, info(poll.name, callId, 1))
        ], { concurrency: 2 })
        expect(polledA).toEqual(polledB)
        const afterPoll = yield* snapshot(call)
        expect(yield* poll.handler(pollPayload, info(poll.name, callId, 2))).toEqual(polledA)
        expect(yield* snapshot(call)).toEqual(afterPoll)
        const toAnalyze = followUpOf(polledA)
        expect(toAnalyze).toMatchObject({ stage: "analyze", dedupeKey: `analyze:${callId}` })

        // analyze: the second upsert writes nothing (updated_at included)
        const analyzePayload = Schema.decodeUnknownSync(analyze.payload)(toAnalyze.payload)
        yield* analyze.handler(analyzePayload, info(analyze.name, callId))
        const afterAnalyze = yield* snapshot(call)
        yield* analyze.handler(analyzePayload, info(analyze.name, callId))
        expect(yield* snapshot(call)).toEqual(afterAnalyze)

        const done = yield* Calls.get(callId)
        expect(done.status).toBe("done")
        // 6 s of stereo: two utterances on each channel
        expect(done.transcript!.segments.map((s) => s.channel)).toEqual(["0", "1", "0", "1"])
        expect(done.analysis!.analysis.totalWords).toBe(24)
      }))

    it.scoped("two extract_audio runs at once write one artifact row and one audio object", () =>
      Effect.gen(function*() {
        const fixtures = yield* tempDirectory("calls-idem-")
        const work = yield* tempDirectory("calls-work-")
        const [extract] = makeCallStages({ tempDir: work })
        const file = yield* generatedCall(fixtures, "call.mp3", 3)
        const callId = yield* Calls.create({ orgId, file })
        const [a, b] = yield* Effect.all([
          extract.handler({ callId }, info(extract.name, callId)),
          extract.handler({ callId }, info(extract.name, callId))
        ], { concurrency: 2 })
        expect(a).toEqual(b)
        const after = yield* snapshot({ id: callId, orgId })
        const rows = after.rows as { artifacts: ReadonlyArray<{ kind: string }> }
        expect(rows.artifacts.map((r) => r.kind)).toEqual(["audio", "source"])
        expect(after.objects.map((o) => o.key)).toEqual([
          `orgs/${orgId}/calls/${callId}/audio.ogg`,
          `orgs/${orgId}/calls/${callId}/source.mp3`
        ])
        yield* expectNoneLeft(work)
      }))

    it.scoped("through the worker: a call whose first job is enqueued twice ends as if processed once", () =>
      Effect.gen(function*() {
        const simulator = yield* SpeechKitSimulator.SpeechKitSimulator
        const queue = yield* Queue.Queue
        const fixtures = yield* tempDirectory("calls-idem-")
        const work = yield* tempDirectory("calls-work-")
        const stages = makeCallStages({ pollFirstMin: "100 millis", pollCap: "300 millis", tempDir: work })
        const file = yield* generatedCall(fixtures, "call.wav", 4)
        const callId = yield* Calls.create({ orgId, file })
        // the duplicate a producer's retry might send: no dedupe key, so the queue keeps both
        yield* queue.enqueue([{ stage: "extract_audio", payload: { callId }, orgId, subjectId: callId }])
        expect((yield* jobsOf(callId)).length).toBe(2)
        yield* startWorker(stages)
        yield* awaitCall(callId, ["done", "failed"])
        yield* waitFor("the call's jobs to drain", Effect.map(jobsOf(callId), (jobs) => jobs.length === 0))

        const call = yield* Calls.get(callId)
        expect(call.status).toBe("done")
        expect(call.artifacts.map((a) => a.kind)).toEqual(["source", "audio"])
        expect(yield* recognitionsOf(simulator, callId)).toBe(1)
        const after = yield* snapshot({ id: callId, orgId })
        const rows = after.rows as Record<string, ReadonlyArray<unknown>>
        expect([rows.calls!.length, rows.artifacts!.length, rows.transcripts!.length, rows.analyses!.length]).toEqual([1, 2, 1, 1])
        // retention removed the OGG once, however many times the pipeline ran: only the source recording is left
        expect(after.objects.map((o) => o.key)).toEqual([`orgs/${orgId}/calls/${callId}/source.wav`])
        yield* expectNoneLeft(work)
      }))

    it.effect("a stage for a call that does not exist fails Permanent, not forever", () =>
      Effect.gen(function*() {
        const [extract] = makeCallStages()
        const callId = "00000000-0000-4000-8000-000000000000"
        const error = yield* Effect.flip(extract.handler({ callId }, info(extract.name, callId)))
        expect([error._tag, error.message]).toEqual(["Permanent", `call ${callId} does not exist`])
      }))
  })
})
