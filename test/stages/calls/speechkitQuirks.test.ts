/**
 * SpeechKit's quirks, driven through the worker by the simulator: an operation that ends with gRPC 14 or 13 is
 * started again (bounded), audio over the limits is refused before anything is started, and a getRecognition
 * 404 right after `done` is asked again instead of failing the call.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import * as RetryPolicy from "../../../packages/pgfiber/src/runtime/RetryPolicy.js"
import * as SpeechKitSimulator from "../../../packages/media/src/testing/SpeechKitSimulator.js"
import { Calls, makeCallStages } from "../../../packages/media/src/stages/calls/index.js"
import { awaitCall, deadLettersOf, generatedCall, startWorker, tempDirectory, worldLayer } from "./support.js"

const orgId = "org-quirks"

const stagesFor = (tempDir: string, overrides: Parameters<typeof makeCallStages>[0] = {}) =>
  makeCallStages({
    pollFirstMin: "100 millis",
    pollCap: "300 millis",
    backoff: RetryPolicy.exponential({ base: "30 millis", cap: "100 millis", jitter: false }),
    tempDir,
    ...overrides
  })

const runCall = (overrides: Parameters<typeof makeCallStages>[0] = {}) =>
  Effect.gen(function*() {
    const work = yield* tempDirectory("calls-work-")
    const fixtures = yield* tempDirectory("calls-quirks-")
    const file = yield* generatedCall(fixtures, "call.wav", 2)
    yield* startWorker(stagesFor(work, overrides))
    const id = yield* Calls.create({ orgId, file })
    return yield* awaitCall(id, ["done", "failed"])
  })

/** The recognitions SpeechKit was asked for, for this call. */
const recognitionsOf = (callId: string) =>
  Effect.flatMap(SpeechKitSimulator.SpeechKitSimulator, (simulator) =>
    Effect.map(simulator.requests("recognizeFileAsync"), (all) =>
      all.filter((r) => JSON.stringify(r.body).includes(`/calls/${callId}/`))))

describe("SpeechKit quirks through the call pipeline", () => {
  layer(
    worldLayer({
      operationErrors: [
        { code: 14, message: "recognizer unavailable" },
        null,
        { code: 13, message: "internal error" },
        { code: 13, message: "internal error" },
        { code: 13, message: "internal error" }
      ]
    }),
    { excludeTestServices: true, timeout: 90_000 }
  )((it) => {
    it.scoped("an operation that ends with gRPC 14 is started again, and the call completes", () =>
      Effect.gen(function*() {
        const call = yield* runCall()
        expect(call.status).toBe("done")
        expect(call.error).toBeNull()
        const asked = yield* recognitionsOf(call.id)
        expect(asked).toHaveLength(2)
        expect(call.transcript!.operationId).toBe(call.operationId)
        expect(yield* deadLettersOf(call.id)).toEqual([])
      }))

    it.scoped("re-submission is bounded: three code-13 endings with maxResubmits 2 fail the call", () =>
      Effect.gen(function*() {
        const call = yield* runCall({ maxResubmits: 2 })
        expect(call.status).toBe("failed")
        expect(call.error).toMatch(
          /^transcribe_poll: SpeechKit operation sim\d+ failed \(gRPC code 13\): internal error; given up after 2 re-submission\(s\)$/
        )
        expect(yield* recognitionsOf(call.id)).toHaveLength(3)
      }))

    it.scoped("audio over the limit (every channel counted) is refused before a recognition starts", () =>
      Effect.gen(function*() {
        // 2 s of stereo is 4 s of recognition: over a 3 s limit
        const call = yield* runCall({ maxAudioDuration: "3 seconds" })
        expect(call.status).toBe("failed")
        expect(call.error).toMatch(/^transcribe_start: the audio is too long for SpeechKit: 2s( \d+ms)? × 2 channel\(s\) = 4s/)
        expect(call.error).toContain("over the 3s limit")
        expect(yield* recognitionsOf(call.id)).toHaveLength(0)
      }))

    it.scoped("audio over the size limit is refused before a recognition starts", () =>
      Effect.gen(function*() {
        const call = yield* runCall({ maxAudioBytes: 1000 })
        expect(call.status).toBe("failed")
        expect(call.error).toMatch(/^transcribe_start: the audio is too large for SpeechKit: \d+ bytes, over the 1000-byte limit$/)
        expect(yield* recognitionsOf(call.id)).toHaveLength(0)
      }))
  })

  layer(worldLayer({ resultsNotFoundAfterDone: 1 }), { excludeTestServices: true, timeout: 180_000 })((it) => {
    it.scoped("getRecognition's 404 right after done is asked again: the call completes", () =>
      Effect.gen(function*() {
        const simulator = yield* SpeechKitSimulator.SpeechKitSimulator
        const call = yield* runCall()
        expect(call.status).toBe("done")
        expect(call.transcript!.segments.length).toBeGreaterThan(0)
        expect(yield* simulator.count("getRecognition")).toBe(2)
      }))
  })
})
