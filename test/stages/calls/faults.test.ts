/**
 * SpeechKit faults through the worker on real Postgres, with the simulator answering what the real service
 * would: a 429's Retry-After is the retry delay; a 503 retries on the stage's backoff; a 400 dead-letters at
 * once; a recognition that never finishes dead-letters at the poll deadline, having backed off on the way.
 * And storage SpeechKit cannot download from (the fs driver) is refused with a reason, unless allowed.
 */
import * as FetchHttpClient from "@effect/platform/FetchHttpClient"
import { describe, expect, layer } from "@effect/vitest"
import { Duration, Effect, Layer, Redacted, Schema } from "effect"
import * as SpeechKit from "../../../packages/media/src/layers/SpeechKit.js"
import * as SpeechKitSimulator from "../../../packages/media/src/testing/SpeechKitSimulator.js"
import * as Storage from "../../../packages/media/src/layers/Storage.js"
import type * as Queue from "../../../packages/pgfiber/src/queue/Queue.js"
import * as RetryPolicy from "../../../packages/pgfiber/src/runtime/RetryPolicy.js"
import * as Stage from "../../../packages/pgfiber/src/runtime/Stage.js"
import { Calls, makeCallStages } from "../../../packages/media/src/stages/calls/index.js"
import {
  apiKey,
  awaitCall,
  deadLettersOf,
  generatedCall,
  jobsOf,
  startWorker,
  tempDirectory,
  waitFor,
  worldLayer
} from "./support.js"

const orgId = "org-faults"

const stagesFor = (tempDir: string, overrides: Parameters<typeof makeCallStages>[0] = {}) =>
  makeCallStages({
    pollFirstMin: "100 millis",
    pollCap: "300 millis",
    backoff: RetryPolicy.exponential({ base: "300 millis", cap: "5 seconds", jitter: false }),
    tempDir,
    ...overrides
  })

/** The retry delay the queue stored: available_at and updated_at are set by the same statement's now(). */
const storedDelayMs = (job: Queue.Job) => job.availableAt.getTime() - job.updatedAt.getTime()

/** The call's live job of a stage, once its error history is `n` long. */
const jobWithErrors = (callId: string, stage: string, n: number) =>
  waitFor(
    `${stage} of ${callId} to have ${n} error(s)`,
    Effect.map(jobsOf(callId), (jobs) => jobs.find((j) => j.stage === stage && j.status === "queued" && j.errors.length === n))
  )

const awaitDeadLetter = (callId: string) =>
  waitFor(`a dead letter for ${callId}`, Effect.map(deadLettersOf(callId), (dead) => (dead.length > 0 ? dead : undefined)))

/** Starts a call and its worker; faults must be scripted before. */
const startCall = (stages: ReadonlyArray<Stage.Any>, seconds = 3) =>
  Effect.gen(function*() {
    const fixtures = yield* tempDirectory("calls-faults-")
    const file = yield* generatedCall(fixtures, "call.wav", seconds)
    yield* startWorker(stages)
    return yield* Calls.create({ orgId, file })
  })

describe("call pipeline under SpeechKit faults", () => {
  layer(worldLayer(), { excludeTestServices: true, timeout: 180_000 })((it) => {
    it.scoped("429 with Retry-After: the retry waits exactly the server's delay, then the call completes", () =>
      Effect.gen(function*() {
        const simulator = yield* SpeechKitSimulator.SpeechKitSimulator
        const work = yield* tempDirectory("calls-work-")
        const before = yield* simulator.count("recognizeFileAsync")
        yield* simulator.scriptFaults("recognizeFileAsync", [{ status: 429, headers: { "retry-after": "2" } }])
        const id = yield* startCall(stagesFor(work))

        const limited = yield* jobWithErrors(id, "transcribe_start", 1)
        expect(limited.attempts).toBe(1)
        expect(limited.errors[0]).toMatchObject({ tag: "RateLimited", attempt: 1 })
        expect(limited.lastError).toContain("HTTP 429")
        expect(storedDelayMs(limited)).toBe(2000)
        const retriedAt = Date.now()
        yield* simulator.awaitRequests("recognizeFileAsync", before + 2)
        expect(Date.now() - retriedAt).toBeGreaterThan(1500)

        const call = yield* awaitCall(id, ["done", "failed"])
        expect([call.status, call.error]).toEqual(["done", null])
        expect((yield* simulator.count("recognizeFileAsync")) - before).toBe(2)
      }))

    it.scoped("503: retried on the stage's backoff (300 ms, then 600 ms), then the call completes", () =>
      Effect.gen(function*() {
        const simulator = yield* SpeechKitSimulator.SpeechKitSimulator
        const work = yield* tempDirectory("calls-work-")
        const before = yield* simulator.count("recognizeFileAsync")
        yield* simulator.scriptFaults("recognizeFileAsync", [{ status: 503 }, { status: 503 }])
        const id = yield* startCall(stagesFor(work))

        const once = yield* jobWithErrors(id, "transcribe_start", 1)
        expect([once.attempts, storedDelayMs(once)]).toEqual([1, 300])
        const twice = yield* jobWithErrors(id, "transcribe_start", 2)
        expect([twice.attempts, storedDelayMs(twice)]).toEqual([2, 600])
        expect(twice.errors.map((e) => [e.attempt, e.tag])).toEqual([[1, "Transient"], [2, "Transient"]])
        expect(twice.lastError).toContain("HTTP 503")

        const call = yield* awaitCall(id, ["done", "failed"])
        expect([call.status, call.error]).toEqual(["done", null])
        expect((yield* simulator.count("recognizeFileAsync")) - before).toBe(3)
      }))

    it.scoped("400: dead-letters at transcribe_start at once, and the call says why", () =>
      Effect.gen(function*() {
        const simulator = yield* SpeechKitSimulator.SpeechKitSimulator
        const work = yield* tempDirectory("calls-work-")
        const before = yield* simulator.count("recognizeFileAsync")
        yield* simulator.scriptFaults("recognizeFileAsync", [{ status: 400 }])
        const id = yield* startCall(stagesFor(work))

        const call = yield* awaitCall(id, ["failed", "done"])
        expect(call.error).toBe("transcribe_start: SpeechKit recognizeFileAsync: HTTP 400: (gRPC code 3) simulated fault: HTTP 400")
        const [dead] = yield* awaitDeadLetter(id)
        expect([dead!.stage, dead!.attempts]).toEqual(["transcribe_start", 1])
        expect(dead!.reason).toContain("HTTP 400")
        expect((yield* simulator.count("recognizeFileAsync")) - before).toBe(1)
        expect(call.transcript).toBeNull()
      }))

    it.scoped("a recognition still running at the deadline dead-letters transcribe_poll, after polls that backed off", () =>
      Effect.gen(function*() {
        const simulator = yield* SpeechKitSimulator.SpeechKitSimulator
        const work = yield* tempDirectory("calls-work-")
        // every poll answers "running"
        yield* simulator.scriptFaults("getOperation", Array.from({ length: 200 }, () => ({ status: 200, body: { id: "op", done: false } })))
        yield* Effect.addFinalizer(() => simulator.scriptFaults("getOperation", []))
        // a sixth of 3 s would be 500 ms; a hundredth keeps the first wait at its 100 ms floor
        const id = yield* startCall(stagesFor(work, { pollDeadline: "1500 millis", pollFirstFraction: 0.01 }))

        // watch the poll job's waits: min(cap 300 ms, 100 ms × 1.5^polls) while far from the deadline
        const waits = new Map<number, number>()
        const dead = yield* waitFor(
          "the poll to give up",
          Effect.gen(function*() {
            for (const job of yield* jobsOf(id)) {
              if (job.stage === "transcribe_poll" && job.status === "queued" && job.polls > 0) waits.set(job.polls, storedDelayMs(job))
            }
            const dead = yield* deadLettersOf(id)
            return dead.length > 0 ? dead : undefined
          })
        )
        expect(dead.map((d) => d.stage)).toEqual(["transcribe_poll"])
        expect(dead[0]!.reason).toMatch(/^recognition sim\d+ not done .+ after it started \(deadline 1s 500ms, \d+ polls\)$/)
        // polls spent no attempts: the only one is the deadline's Permanent
        expect(dead[0]!.errorHistory.map((e) => [e.attempt, e.tag])).toEqual([[1, "Permanent"]])
        const expected: Record<number, number> = { 1: 150, 2: 225, 3: 300, 4: 300 }
        const seen = [...waits].filter(([polls]) => polls in expected).sort(([a], [b]) => a - b)
        expect(seen.length).toBeGreaterThan(0)
        // the schedule's waits, except that the deadline may cut the last one short on a slow machine
        const last = Math.max(...[...waits.keys()])
        for (const [polls, wait] of seen) {
          if (polls === last) expect(wait).toBeLessThanOrEqual(expected[polls]!)
          else expect([polls, wait]).toEqual([polls, expected[polls]])
        }
        const call = yield* Calls.get(id)
        expect(call.status).toBe("failed")
        expect(call.error).toContain("transcribe_poll: recognition")
        expect(call.error).toContain("deadline 1s 500ms")
      }))

    it.scoped("fs storage: transcribe_start refuses (SpeechKit cannot download from it) unless file:// is allowed", () =>
      Effect.gen(function*() {
        const root = yield* tempDirectory("calls-fs-storage-")
        const work = yield* tempDirectory("calls-work-")
        const fixtures = yield* tempDirectory("calls-fs-")
        const file = yield* generatedCall(fixtures, "call.wav", 2)
        const fsStorage = Storage.layerFs(root).pipe(Layer.orDie)
        const info = (stage: string, callId: string): Stage.JobInfo => ({
          id: "1", stage, attempt: 1, maxAttempts: 8, polls: 0, orgId, subjectId: callId, createdAt: new Date(), claimedAt: new Date(), ...Stage.jobInfoDefaults
        })

        const run = (allowFileUris: boolean) =>
          Effect.gen(function*() {
            const [extract, start] = makeCallStages({ tempDir: work, allowFileUris })
            const callId = yield* Calls.create({ orgId, file })
            yield* extract.handler({ callId }, info(extract.name, callId))
            return yield* Effect.either(start.handler({ callId }, info(start.name, callId)))
          }).pipe(Effect.provide(fsStorage))

        const refused = yield* run(false)
        expect(refused._tag).toBe("Left")
        const error = refused._tag === "Left" ? refused.left : undefined
        expect(error?._tag).toBe("Permanent")
        expect(error?.message).toBe(
          "the storage is not S3-compatible (its URIs are file://…), and SpeechKit can only download audio from object " +
            "storage: set STORAGE_DRIVER=s3, or SPEECHKIT_ALLOW_FILE_URIS=true when the recognizer is a local simulator"
        )

        // a simulator that reads file:// (local development without s3rver) takes the same audio
        const local = yield* SpeechKitSimulator.make({ apiKey, allowFileUris: true, pollsUntilDone: 0 }).pipe(
          Effect.provide(FetchHttpClient.layer)
        )
        const client = SpeechKit.layerWith({
          credentials: { _tag: "ApiKey", apiKey: Redacted.make(apiKey) },
          sttUrl: local.url,
          operationUrl: local.url
        })
        const allowed = yield* run(true).pipe(Effect.provide(client))
        expect(allowed._tag).toBe("Right")
        const next = allowed._tag === "Right" ? allowed.right : undefined
        const payload = Schema.decodeUnknownSync(makeCallStages()[2].payload)(next!.followUps[0]!.payload)
        expect(payload.operationId).toMatch(/^sim\d+$/)
        expect(Duration.toMillis(Duration.decode(next!.followUps[0]!.delay!))).toBe(5000)
        const recognized = yield* local.lastRequest("recognizeFileAsync")
        expect(recognized._tag === "Some" && (recognized.value.body as { uri: string }).uri).toMatch(/^file:\/\//)
      }))
  })
})
