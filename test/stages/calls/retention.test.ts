/**
 * Storage retention: once a call's transcript is stored, the configured inputs leave storage (the OGG audio by
 * default, the source recording only when asked), their artifact rows stamped `removedAt`; redelivered stages
 * afterwards neither fail nor bring anything back.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import * as Stage from "../../../packages/pgfiber/src/runtime/Stage.js"
import { Calls, makeCallStages } from "../../../packages/media/src/stages/calls/index.js"
import { awaitCall, deadLettersOf, generatedCall, jobsOf, listObjects, startWorker, tempDirectory, waitFor, worldLayer } from "./support.js"

const orgId = "org-retention"

const runCall = (options: Parameters<typeof makeCallStages>[0]) =>
  Effect.gen(function*() {
    const work = yield* tempDirectory("calls-work-")
    const fixtures = yield* tempDirectory("calls-retention-")
    const file = yield* generatedCall(fixtures, "call.wav", 2)
    const stages = makeCallStages({ pollFirstMin: "100 millis", pollCap: "300 millis", tempDir: work, ...options })
    yield* startWorker(stages)
    const id = yield* Calls.create({ orgId, file })
    const call = yield* awaitCall(id, ["done", "failed"])
    expect(call.status).toBe("done")
    return { id, call, stages }
  })

/** Every stage's job enqueued again for a finished call (duplicate delivery), and run to the end. */
const redeliverAll = (id: string, stages: ReturnType<typeof makeCallStages>) =>
  Effect.gen(function*() {
    const call = yield* Calls.get(id)
    const [extract, start, poll, analyze] = stages
    yield* Stage.enqueue(extract, { callId: id }, { orgId, subjectId: id })
    yield* Stage.enqueue(start, { callId: id }, { orgId, subjectId: id })
    yield* Stage.enqueue(poll, {
      callId: id,
      operationId: call.operationId!,
      startedAt: call.createdAt,
      audioDurationMs: 2000
    }, { orgId, subjectId: id })
    yield* Stage.enqueue(analyze, { callId: id }, { orgId, subjectId: id })
    yield* waitFor("the redelivered jobs to finish", Effect.map(jobsOf(id), (jobs) => jobs.length === 0))
  })

describe("storage retention after the transcript is stored", () => {
  layer(worldLayer(), { excludeTestServices: true, timeout: 180_000 })((it) => {
    it.scoped("by default: the OGG audio is removed, the source recording stays", () =>
      Effect.gen(function*() {
        const { id, call, stages } = yield* runCall({})
        const prefix = `orgs/${orgId}/calls/${id}/`
        expect((yield* listObjects(prefix)).map((o) => o.key)).toEqual([`${prefix}source.wav`])
        const removed = Object.fromEntries(call.artifacts.map((a) => [a.kind, a.removedAt !== null]))
        expect(removed).toEqual({ source: false, audio: true })

        yield* redeliverAll(id, stages)
        const again = yield* Calls.get(id)
        expect(again.status).toBe("done")
        expect(again.artifacts.find((a) => a.kind === "audio")!.removedAt).toEqual(call.artifacts.find((a) => a.kind === "audio")!.removedAt)
        expect((yield* listObjects(prefix)).map((o) => o.key)).toEqual([`${prefix}source.wav`])
        expect(yield* deadLettersOf(id)).toEqual([])
      }))

    it.scoped("with removeSource on: nothing of the call is left in storage, and redelivery changes nothing", () =>
      Effect.gen(function*() {
        const { id, call, stages } = yield* runCall({ removeSource: true })
        const prefix = `orgs/${orgId}/calls/${id}/`
        expect(yield* listObjects(prefix)).toEqual([])
        expect(call.artifacts.every((a) => a.removedAt !== null)).toBe(true)
        expect(call.transcript!.segments.length).toBeGreaterThan(0)
        expect(call.analysis).not.toBeNull()

        yield* redeliverAll(id, stages)
        const again = yield* Calls.get(id)
        expect(again.status).toBe("done")
        expect(again.error).toBeNull()
        expect(yield* listObjects(prefix)).toEqual([])
        expect(yield* deadLettersOf(id)).toEqual([])
      }))

    it.scoped("with removeAudio off: both objects stay", () =>
      Effect.gen(function*() {
        const { id } = yield* runCall({ removeAudio: false })
        const prefix = `orgs/${orgId}/calls/${id}/`
        expect((yield* listObjects(prefix)).map((o) => o.key)).toEqual([`${prefix}audio.ogg`, `${prefix}source.wav`])
      }))
  })
})
