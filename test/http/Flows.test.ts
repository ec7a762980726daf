/**
 * Flows over HTTP against a real server, worker and Postgres: `dependsOn` on `POST /jobs` (a job waits, then runs
 * once its parent has), `GET /jobs/:id/dependencies`, a window's uniqueness, and tenancy: another org's job as a
 * parent is "not found" (400, the same words as a job that does not exist), its dependencies are 404.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import { layerDb } from "../support/pg.js"
import { baseUrl, call, eventually, layerService, newKey } from "./support.js"

const keysFor = Effect.all({ a: newKey({ orgId: "flows-a", name: "flows a" }), b: newKey({ orgId: "flows-b", name: "flows b" }) })

describe("HTTP flows", () => {
  layer(layerService(layerDb()), { excludeTestServices: true, timeout: 180_000 })((it) => {
    it.effect("a job waits on its parent, then runs; both ends show the edge", () =>
      Effect.gen(function*() {
        const base = yield* baseUrl
        const { a } = yield* keysFor
        // `manual` runs only on a tick, so the parent stays queued until we say
        const parent = yield* call(base, "POST", "/jobs", { key: a, body: { stage: "manual", payload: { n: 1 } } })
        expect(parent.status).toBe(201)
        const child = yield* call(base, "POST", "/jobs", { key: a, body: { stage: "echo", payload: { n: 2 }, dependsOn: [parent.json.id] } })
        expect(child.status).toBe(201)
        const waiting = yield* call(base, "GET", `/jobs/${child.json.id}`, { key: a })
        expect(waiting.json).toMatchObject({ status: "waiting", waitingOn: 1 })
        const listed = yield* call(base, "GET", "/jobs?status=waiting", { key: a })
        expect(listed.json.jobs.map((j: any) => j.id)).toContain(child.json.id)
        expect(listed.json.jobs.every((j: any) => j.status === "waiting")).toBe(true)
        const deps = yield* call(base, "GET", `/jobs/${child.json.id}/dependencies`, { key: a })
        expect(deps.status).toBe(200)
        expect(deps.json).toEqual({ parents: [{ id: parent.json.id, stage: "manual", status: "queued", onFailure: "cancel" }], children: [] })
        const tick = yield* call(base, "POST", "/api/jobs/tick", { key: a, body: { max: 1 } })
        expect(tick.status).toBe(200)
        const done = yield* eventually(call(base, "GET", `/jobs/${child.json.id}`, { key: a }), (r) => r.json?.status === "completed")
        expect(done.json.status).toBe("completed")
        const fromParent = yield* call(base, "GET", `/jobs/${parent.json.id}/dependencies`, { key: a })
        expect(fromParent.json.children).toEqual([{ id: child.json.id, stage: "echo", status: "completed", onFailure: "cancel" }])
      }))

    it.effect("another org's job is not found as a parent, and its dependencies are 404; bad dependsOn is 400", () =>
      Effect.gen(function*() {
        const base = yield* baseUrl
        const { a, b } = yield* keysFor
        const theirs = yield* call(base, "POST", "/jobs", { key: b, body: { stage: "manual", payload: { n: 1 } } })
        const crossOrg = yield* call(base, "POST", "/jobs", { key: a, body: { stage: "echo", payload: { n: 1 }, dependsOn: [theirs.json.id] } })
        const missing = yield* call(base, "POST", "/jobs", { key: a, body: { stage: "echo", payload: { n: 1 }, dependsOn: ["987654321"] } })
        expect(crossOrg.status).toBe(400)
        expect(crossOrg.json.message).toBe(`dependsOn: job ${theirs.json.id} not found`)
        expect(missing.json.message).toBe("dependsOn: job 987654321 not found")
        expect((yield* call(base, "GET", `/jobs/${theirs.json.id}/dependencies`, { key: a })).status).toBe(404)
        for (const dependsOn of [["abc"], [{ id: "1", onFailure: "explode" }], "1", [{}]]) {
          const bad = yield* call(base, "POST", "/jobs", { key: a, body: { stage: "echo", payload: { n: 1 }, dependsOn } })
          expect(bad.status).toBe(400)
          expect(typeof bad.json.message).toBe("string")
        }
        expect((yield* call(base, "GET", "/jobs/abc/dependencies", { key: a })).status).toBe(404)
      }))

    it.effect("uniqueForMs: a second submit in the window returns the first job, even after it finished", () =>
      Effect.gen(function*() {
        const base = yield* baseUrl
        const { a } = yield* keysFor
        const body = { stage: "echo", payload: { n: 7 }, dedupeKey: "hourly-report", uniqueForMs: 366 * 24 * 3600 * 1000 }
        const first = yield* call(base, "POST", "/jobs", { key: a, body })
        expect(first.json.deduped).toBe(false)
        yield* eventually(call(base, "GET", `/jobs/${first.json.id}`, { key: a }), (r) => r.json?.status === "completed")
        const again = yield* call(base, "POST", "/jobs", { key: a, body })
        expect(again.json).toEqual({ id: first.json.id, deduped: true })
        const noKey = yield* call(base, "POST", "/jobs", { key: a, body: { stage: "echo", payload: { n: 7 }, uniqueForMs: 60_000 } })
        expect(noKey.status).toBe(400)
      }))
  
    it.effect("a batch is readable by its org (counts, callbacks) and 404 to another; a job shows its batch", () =>
      Effect.gen(function*() {
        const base = yield* baseUrl
        const { a, b } = yield* keysFor
        const queue = yield* Queue.Queue
        const batch = yield* queue.batches.create({
          orgId: "flows-a",
          onComplete: { stage: "manual", payload: { n: 0 } },
          jobs: [{ stage: "echo", payload: { n: 1 } }, { stage: "echo", payload: { n: 2 } }]
        })
        const done = yield* eventually(call(base, "GET", `/batches/${batch.id}`, { key: a }), (r) => r.json?.finishedAt != null)
        expect(done.json).toMatchObject({ id: batch.id, total: 2, completed: 2, failed: 0, sealed: true })
        expect(done.json.callbacks).toHaveLength(1)
        const callback = yield* call(base, "GET", `/jobs/${done.json.callbacks[0]}`, { key: a })
        expect(callback.json).toMatchObject({ stage: "manual", status: "queued", payload: { n: 0, batch: { id: batch.id, total: 2, completed: 2, failed: 0 } } })
        expect((yield* call(base, "GET", `/batches/${batch.id}`, { key: b })).status).toBe(404)
        expect((yield* call(base, "GET", "/batches/nope", { key: a })).status).toBe(404)
        const open = yield* queue.batches.create({ orgId: "flows-a", open: true, jobs: [{ stage: "manual", payload: { n: 3 } }] })
        const member = yield* call(base, "GET", `/jobs/${open.jobs[0]!.id}`, { key: a })
        expect(member.json.batchId).toBe(open.id)
      }))
  })
})
