/**
 * Every way a call's job can die ends with the call `failed` and the stage's reason (the stages'
 * onDeadLetter, run in the dead-letter transaction): a Permanent answer from SpeechKit, attempts exhausted by
 * 503s, a defect on every attempt, a handler timeout on every attempt, a payload that fails the Schema, and a
 * worker process SIGKILLed during the job's last attempt (the reaper requeues it, the stage's claim dead-letters it).
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import * as Analyzer from "../../../packages/media/src/layers/Analyzer.js"
import * as Db from "../../../packages/pgfiber/src/layers/Db.js"
import * as Queue from "../../../packages/pgfiber/src/queue/Queue.js"
import * as RetryPolicy from "../../../packages/pgfiber/src/runtime/RetryPolicy.js"
import type * as Stage from "../../../packages/pgfiber/src/runtime/Stage.js"
import * as Worker from "../../../packages/pgfiber/src/runtime/Worker.js"
import * as SpeechKitSimulator from "../../../packages/media/src/testing/SpeechKitSimulator.js"
import { Calls, makeCallStages } from "../../../packages/media/src/stages/calls/index.js"
import { spawnPipelineWorker } from "../../support/pipelineWorker.js"
import {
  apiKey,
  awaitCall,
  bucket,
  deadLettersOf,
  generatedCall,
  jobsOf,
  S3Server,
  startWorker,
  tempDirectory,
  waitFor,
  workerOptions,
  worldLayer
} from "./support.js"

const orgId = "org-deaths"

/** Fast retries, so a job spends its attempts in a second or two. */
const stagesFor = (tempDir: string, overrides: Parameters<typeof makeCallStages>[0] = {}) =>
  makeCallStages({
    pollFirstMin: "100 millis",
    pollCap: "300 millis",
    backoff: RetryPolicy.exponential({ base: "30 millis", cap: "100 millis", jitter: false }),
    tempDir,
    ...overrides
  })

const newCall = Effect.gen(function*() {
  const fixtures = yield* tempDirectory("calls-deaths-")
  const file = yield* generatedCall(fixtures, "call.wav", 2)
  return yield* Calls.create({ orgId, file })
})

/** The call once failed, with the dead letter that failed it. */
const failedWith = (id: string) =>
  Effect.gen(function*() {
    const call = yield* awaitCall(id, ["failed", "done"])
    expect(call.status).toBe("failed")
    const [dead, ...more] = yield* waitFor("the dead letter", Effect.map(deadLettersOf(id), (d) => d.length > 0 && d))
    expect(more).toEqual([])
    expect(call.error).toBe(`${dead!.stage}: ${dead!.reason}`)
    return { call, dead: dead! }
  })

describe("every death of a call's job fails the call with the reason", () => {
  layer(worldLayer(), { excludeTestServices: true, timeout: 180_000 })((it) => {
    it.scoped("Permanent from SpeechKit: the operation ends with gRPC code 3", () =>
      Effect.gen(function*() {
        const simulator = yield* SpeechKitSimulator.SpeechKitSimulator
        const work = yield* tempDirectory("calls-work-")
        yield* simulator.scriptFaults("getOperation", [
          { status: 200, body: { id: "op", done: true, error: { code: 3, message: "audio is unreadable" } } }
        ])
        yield* startWorker(stagesFor(work))
        const { dead, call } = yield* failedWith(yield* newCall)
        expect(dead.stage).toBe("transcribe_poll")
        expect(dead.attempts).toBe(1)
        expect(call.error).toContain("transcribe_poll: SpeechKit operation")
        expect(call.error).toContain("(gRPC code 3): audio is unreadable")
      }))

    it.scoped("attempts exhausted: recognizeFileAsync answers 503 every time", () =>
      Effect.gen(function*() {
        const simulator = yield* SpeechKitSimulator.SpeechKitSimulator
        const work = yield* tempDirectory("calls-work-")
        yield* simulator.scriptFaults("recognizeFileAsync", Array.from({ length: 8 }, () => ({ status: 503 })))
        yield* startWorker(stagesFor(work))
        const { dead, call } = yield* failedWith(yield* newCall)
        expect(dead).toMatchObject({ stage: "transcribe_start", attempts: 8, maxAttempts: 8 })
        expect(dead.errorHistory.every((e) => e.tag === "Transient")).toBe(true)
        expect(call.error).toMatch(/^transcribe_start: SpeechKit recognizeFileAsync: HTTP 503/)
      }))

    it.scoped("a defect on every attempt: the analyzer's summary model has a bug", () =>
      Effect.gen(function*() {
        const work = yield* tempDirectory("calls-work-")
        const buggy = Analyzer.layerWithSummary("buggy", () => Effect.die(new Error("summary model bug")))
        yield* Effect.asVoid(Layer.build(Worker.layer(stagesFor(work), workerOptions("defects")).pipe(Layer.provide(buggy))))
        const { dead, call } = yield* failedWith(yield* newCall)
        expect(dead).toMatchObject({ stage: "analyze", attempts: 5 })
        expect(dead.errorHistory.every((e) => e.tag === "Defect")).toBe(true)
        expect(call.error).toContain("analyze: defect")
        expect(call.error).toContain("summary model bug")
        // what the pipeline made before the defect is kept
        expect(call.transcript).not.toBeNull()
      }))

    it.scoped("a handler timeout on every attempt: SpeechKit never answers recognizeFileAsync", () =>
      Effect.gen(function*() {
        const simulator = yield* SpeechKitSimulator.SpeechKitSimulator
        const work = yield* tempDirectory("calls-work-")
        yield* simulator.scriptFaults("recognizeFileAsync", Array.from({ length: 8 }, () => "hang" as const))
        yield* Effect.addFinalizer(() => simulator.scriptFaults("recognizeFileAsync", []))
        yield* startWorker(stagesFor(work, { timeout: { transcribe_start: "300 millis" } }))
        const { dead, call } = yield* failedWith(yield* newCall)
        expect(dead).toMatchObject({ stage: "transcribe_start", attempts: 8 })
        expect(call.error).toBe("transcribe_start: handler timed out after 300ms")
      }))

    it.scoped("a payload that fails the stage's Schema", () =>
      Effect.gen(function*() {
        const work = yield* tempDirectory("calls-work-")
        const id = yield* newCall
        const queue = yield* Queue.Queue
        // a producer wrote a transcribe_poll job by hand, without the operation it must poll
        yield* queue.enqueue([{ stage: "transcribe_poll", orgId, subjectId: id, payload: { callId: id } }])
        const pollOnly = stagesFor(work).filter((s) => s.name === "transcribe_poll")
        yield* startWorker(pollOnly as ReadonlyArray<Stage.Any>)
        const { dead, call } = yield* failedWith(id)
        expect(dead.stage).toBe("transcribe_poll")
        expect(call.error).toContain("transcribe_poll: payload does not match the transcribe_poll schema")
        expect(call.error).toContain("operationId")
        // the call's own first job (extract_audio) is still queued, since only transcribe_poll ran here: cancel it,
        // or the next test's worker takes it up and this call's recognition can take that test's scripted hang
        for (const job of yield* jobsOf(id)) yield* queue.cancel(job.id)
        expect(yield* jobsOf(id)).toEqual([])
      }))

    it.scoped("a worker process SIGKILLed during the last attempt: reaped, then dead-lettered by the stage's claim", () =>
      Effect.gen(function*() {
        const simulator = yield* SpeechKitSimulator.SpeechKitSimulator
        const { endpoint } = yield* S3Server
        const db = yield* Db.Db
        const work = yield* tempDirectory("calls-work-")
        const before = yield* simulator.count("recognizeFileAsync")
        yield* simulator.scriptFaults("recognizeFileAsync", ["hang"])
        const id = yield* newCall
        const victim = yield* spawnPipelineWorker({
          PIPELINE: "calls",
          PGFIBER_SCHEMA: db.schema,
          WORKER_ID: "victim",
          LEASE_MS: "10000", // generous: a loaded machine (load 15 on two cores) must not expire it before the kill
          STORAGE_DRIVER: "s3",
          S3_ENDPOINT: endpoint,
          S3_BUCKET: bucket,
          S3_ACCESS_KEY_ID: "S3RVER",
          S3_SECRET_ACCESS_KEY: "S3RVER",
          SPEECHKIT_API_KEY: apiKey,
          SPEECHKIT_STT_URL: simulator.url,
          SPEECHKIT_OPERATION_URL: simulator.url,
          MEDIA_TEMP_DIR: work
        })
        // the victim ran extract_audio and now waits on SpeechKit inside transcribe_start
        yield* simulator.awaitRequests("recognizeFileAsync", before + 1).pipe(
          Effect.timeoutFail({ duration: "60 seconds", onTimeout: () => new Error(`the victim never started: ${victim.output()}`) }),
          Effect.orDie
        )
        // the request arrives as the claim's job runs; read until the row says so (a loaded machine can lag), and
        // if it never does, say what the call's jobs were
        let seen = ""
        const running = yield* waitFor(
          "the victim's transcribe_start job to be running",
          Effect.map(jobsOf(id), (jobs) => {
            seen = JSON.stringify(jobs.map((j) => ({ stage: j.stage, status: j.status, lockedBy: j.lockedBy, attempts: j.attempts })))
            return jobs.find((j) => j.stage === "transcribe_start" && j.status === "running")
          })
        ).pipe(Effect.catchAllDefect(() => Effect.dieMessage(`never running; the call's jobs: ${seen}; victim: ${victim.output()}`)))
        expect(running.lockedBy).toBe("victim")
        // make this run the job's last
        yield* db.run((sql) => sql`update jobs set max_attempts = attempts + 1 where id = ${running.id}`)
        victim.child.kill("SIGKILL")
        yield* Effect.promise(() => victim.exited)

        // a healthy worker: its reaper requeues the job spent, its claim dead-letters it
        yield* startWorker(stagesFor(work), "rescuer")
        const { dead, call } = yield* failedWith(id)
        // the rescuer never ran the handler: a run would have completed (SpeechKit answers now) or added an
        // attempt; the dead letter holds the victim's attempt only, ended by its expired lease
        expect(dead).toMatchObject({ stage: "transcribe_start", attempts: running.attempts + 1 })
        expect(dead.errorHistory.at(-1)!.tag).toBe("LeaseExpired")
        expect(call.error).toBe("transcribe_start: lease expired: the worker victim stopped heartbeating (attempts exhausted)")
      }))
  })
})
