/**
 * The HTTP API against a real server on a free loopback port, a real worker and Postgres: every route's
 * happy path, authentication (401) and org isolation (404, never 403), bad input (400, 413), the OpenAPI
 * document, and Prometheus metrics that parse and move when jobs run.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { Redacted } from "effect"
import * as NodeHttp from "node:http"
import * as Analyzer from "../../packages/media/src/layers/Analyzer.js"
import * as Storage from "../../packages/media/src/layers/Storage.js"
import * as ApiKeys from "../../packages/service/src/auth/ApiKeys.js"
import { CallsSql } from "../../packages/media/src/stages/calls/index.js"
import { layerDb, rawSql } from "../support/pg.js"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import { adminUrl, baseUrl, call, eventually, layerService, newKey, parsePrometheus } from "./support.js"

/**
 * Posts a 20 MB chunked body without a key, in 64 KiB chunks that respect backpressure, but holds all past
 * the first MiB back until an answer arrives: a server that read (or drained) the body before checking the key
 * would wait for the rest forever, and the deadline (generous: it only decides that no answer came) fails it.
 */
const unauthenticatedUpload = (base: string, authorization?: string) =>
  new Promise<{ readonly status: number; readonly text: string; readonly sentWhenAnswered: number; readonly total: number }>((resolve, reject) => {
    const total = 20 * 1024 * 1024
    const heldBackAfter = 1024 * 1024
    const chunk = Buffer.alloc(64 * 1024, 0x78)
    const url = new URL(base)
    const request = NodeHttp.request({
      host: url.hostname,
      port: url.port,
      method: "POST",
      path: "/jobs",
      headers: { "content-type": "application/json", "transfer-encoding": "chunked", ...(authorization ? { authorization } : {}) }
    })
    let sent = 0
    let answered = false
    const deadline = setTimeout(() => {
      request.destroy()
      reject(new Error(`no answer after ${sent} of ${total} bytes were sent: the server is waiting for the body`))
    }, 40_000) // within the test's own timeout, so a failure says why
    request.on("response", (response) => {
      answered = true
      const sentWhenAnswered = sent
      let text = ""
      response.setEncoding("utf8")
      response.on("data", (d: string) => (text += d))
      response.on("end", () => {
        clearTimeout(deadline)
        request.destroy()
        resolve({ status: response.statusCode ?? 0, text, sentWhenAnswered, total })
      })
    })
    request.on("error", (e) => {
      if (!answered) {
        clearTimeout(deadline)
        reject(e)
      }
    })
    const pump = () => {
      while (!answered && sent < heldBackAfter) {
        sent += chunk.length
        if (!request.write(chunk)) return void request.once("drain", pump)
      }
      // the remaining 19 MiB wait for the answer, which a key check before the body lets come now
    }
    sent += Buffer.byteLength("{\"stage\":\"echo\",\"payload\":{\"pad\":\"")
    request.write("{\"stage\":\"echo\",\"payload\":{\"pad\":\"")
    pump()
  })

const keysFor = Effect.all({ a: newKey({ orgId: "org-a", name: "test a" }), b: newKey({ orgId: "org-b", name: "test b" }) })

describe("HTTP API", () => {
  layer(layerService(layerDb()), { excludeTestServices: true, timeout: 180_000 })((it) => {
    it.effect("health on both listeners; readiness, metrics, OpenAPI and docs on the admin listener only, without a key", () =>
      Effect.gen(function*() {
        const base = yield* baseUrl
        const admin = yield* adminUrl
        expect(admin).not.toBe(base)
        for (const url of [base, admin]) {
          const health = yield* call(url, "GET", "/healthz")
          expect(health.status).toBe(200)
          expect(health.json.status).toBe("ok")
        }
        // the API listener does not serve them, key or not; the admin listener serves nothing else
        for (const path of ["/readyz", "/metrics", "/docs", "/openapi.json", "//metrics", "/metrics/", "/%6Detrics", "/ReadyZ", "/DOCS"]) {
          const refused = yield* call(base, "GET", path)
          expect([refused.status, refused.json?._tag]).toEqual([404, "NotFound"])
        }
        expect((yield* call(admin, "GET", "/jobs")).status).toBe(404)
        const ready = yield* eventually(call(admin, "GET", "/readyz"), (r) => r.status === 200)
        expect(ready.status).toBe(200)
        expect(ready.json).toMatchObject({ status: "ready", problems: [], checks: { database: { ok: true } } })
        expect(ready.json.listener.state).toBe("listening")
        expect(ready.json.stages.map((s: any) => s.stage)).toEqual(expect.arrayContaining(["echo", "manual"]))
        expect(ready.json.stages.find((s: any) => s.stage === "echo").pool.state).toBe("running")
        const openapi = yield* call(admin, "GET", "/openapi.json")
        expect(openapi.status).toBe(200)
        expect(Object.keys(openapi.json.paths)).toEqual(
          expect.arrayContaining(["/jobs", "/jobs/{id}", "/jobs/{id}/cancel", "/dlq", "/dlq/{id}/retry", "/calls", "/calls/{id}", "/readyz", "/metrics"])
        )
        expect(Object.keys(openapi.json.paths["/calls"].post.requestBody.content).sort()).toEqual(["application/json", "multipart/form-data"])
        expect(openapi.json.components.securitySchemes).toMatchObject({ bearer: { type: "http", scheme: "bearer" } })
        const docs = yield* call(admin, "GET", "/docs")
        expect(docs.status).toBe(200)
        expect(docs.text).toContain("swagger")
      }))

    it.effect("limits: read and changed at run time on the admin listener only; a tenant's key cannot reach them", () =>
      Effect.gen(function*() {
        const base = yield* baseUrl
        const admin = yield* adminUrl
        const { a } = yield* keysFor
        // the API listener does not serve them, with a tenant's key or without
        expect((yield* call(base, "GET", "/limits", { key: a })).status).toBe(404)
        expect((yield* call(base, "PUT", "/limits/echo", { key: a, body: { maxRunning: 1 } })).status).toBe(404)
        const listed = yield* call(admin, "GET", "/limits")
        expect(listed.status).toBe(200)
        expect(listed.json.limits.find((l: any) => l.stage === "echo")).toMatchObject({
          source: "code", effective: { fair: true, maxRunning: null, rate: null }
        })
        const set = yield* call(admin, "PUT", "/limits/echo", { body: { maxRunning: 3, rate: "20/s" } })
        expect(set.status).toBe(200)
        expect(set.json).toMatchObject({
          stage: "echo", source: "override", effective: { maxRunning: 3, rate: { limit: 20, perMs: 1000, burst: 20, perOrg: false } }
        })
        expect((yield* call(admin, "PUT", "/limits/echo", { body: { rate: "fast" } })).status).toBe(400)
        const reset = yield* call(admin, "DELETE", "/limits/echo")
        expect(reset.json).toEqual({ stage: "echo", reset: true })
        expect((yield* call(admin, "GET", "/limits")).json.limits.find((l: any) => l.stage === "echo").source).toBe("code")
      }))

    it.effect("jobs: submit, read, list, cancel", () =>
      Effect.gen(function*() {
        const base = yield* baseUrl
        const { a } = yield* keysFor
        const created = yield* call(base, "POST", "/jobs", { key: a, body: { stage: "echo", payload: { n: 1 }, delayMs: 60_000 } })
        expect(created.status).toBe(201)
        expect(created.json.deduped).toBe(false)
        const id = created.json.id
        const got = yield* call(base, "GET", `/jobs/${id}`, { key: a })
        expect(got.status).toBe(200)
        expect(got.json).toMatchObject({ id, stage: "echo", orgId: "org-a", status: "queued", payload: { n: 1 }, attempts: 0 })
        const listed = yield* call(base, "GET", "/jobs?stage=echo&limit=10", { key: a })
        expect(listed.status).toBe(200)
        expect(listed.json.jobs.map((j: any) => j.id)).toContain(id)
        const cancelled = yield* call(base, "POST", `/jobs/${id}/cancel`, { key: a })
        expect(cancelled.status).toBe(200)
        expect(cancelled.json).toEqual({ id, outcome: "cancelled" })
        // kept in the history for the stage's retention, as cancelled
        const after = yield* call(base, "GET", `/jobs/${id}`, { key: a })
        expect(after.status).toBe(200)
        expect(after.json.status).toBe("cancelled")
        expect(after.json.finishedAt).not.toBeNull()
      }))

    it.effect("a completed job stays readable with its timestamps; pausing a stage (admin listener only) holds its jobs", () =>
      Effect.gen(function*() {
        const base = yield* baseUrl
        const admin = yield* adminUrl
        const { a } = yield* keysFor
        const created = yield* call(base, "POST", "/jobs", { key: a, body: { stage: "echo", payload: { n: 21 }, timeoutMs: 30_000 } })
        const done = yield* eventually(call(base, "GET", `/jobs/${created.json.id}`, { key: a }), (r) => r.json?.status === "completed")
        expect(done.json).toMatchObject({ status: "completed", attempts: 0, timeoutMs: 30_000 })
        expect(Date.parse(done.json.startedAt)).toBeLessThanOrEqual(Date.parse(done.json.finishedAt))
        expect(typeof done.json.lastRunMs).toBe("number")

        // a tenant's key cannot pause a shared stage: the API listener does not serve the route at all
        expect((yield* call(base, "POST", "/stages/echo/pause", { key: a })).status).toBe(404)
        expect((yield* call(admin, "POST", "/stages/nope/pause")).status).toBe(404)
        const paused = yield* call(admin, "POST", "/stages/echo/pause")
        expect(paused.status).toBe(200)
        expect(paused.json).toMatchObject({ stage: "echo", paused: true, changedBy: "http" })
        const held = yield* call(base, "POST", "/jobs", { key: a, body: { stage: "echo", payload: { n: 22 } } })
        expect(held.status).toBe(201)
        const ready = yield* eventually(call(admin, "GET", "/readyz"), (r) => r.json?.stages?.find((s: any) => s.stage === "echo")?.paused === true)
        expect(ready.status).toBe(200)
        const metrics = yield* call(admin, "GET", "/metrics")
        expect(parsePrometheus(metrics.text).samples.get('pgfiber_stage_paused{stage="echo"}')).toBe(1)
        expect((yield* call(base, "GET", `/jobs/${held.json.id}`, { key: a })).json.status).toBe("queued")
        expect((yield* call(admin, "GET", "/stages")).json.stages).toEqual(
          expect.arrayContaining([expect.objectContaining({ stage: "echo", paused: true })])
        )
        expect((yield* call(admin, "POST", "/stages/echo/resume")).json.paused).toBe(false)
        yield* eventually(call(base, "GET", `/jobs/${held.json.id}`, { key: a }), (r) => r.json?.status === "completed")
      }))

    it.effect("dead letters: a failing job lands in the DLQ, is retried, another is resolved", () =>
      Effect.gen(function*() {
        const base = yield* baseUrl
        const { a } = yield* keysFor
        const first = yield* call(base, "POST", "/jobs", { key: a, body: { stage: "echo", payload: { n: 7, fail: true } } })
        const second = yield* call(base, "POST", "/jobs", { key: a, body: { stage: "echo", payload: { n: 8, fail: true } } })
        const dlq = yield* eventually(call(base, "GET", "/dlq?stage=echo", { key: a }), (r) => r.json?.deadLetters?.length === 2)
        expect(dlq.status).toBe(200)
        const byJob = new Map(dlq.json.deadLetters.map((d: any) => [d.jobId, d]))
        const dead1 = byJob.get(first.json.id) as any
        expect(dead1).toMatchObject({ stage: "echo", reason: "echo 7 asked to fail", resolutionStatus: null })
        // the job itself now reads as dead, pointing at its dead letter
        const asJob = yield* call(base, "GET", `/jobs/${first.json.id}`, { key: a })
        expect(asJob.json).toMatchObject({ status: "dead", deadLetterId: dead1.id })
        expect((yield* call(base, "GET", `/dlq/${dead1.id}`, { key: a })).json.id).toBe(dead1.id)

        const retried = yield* call(base, "POST", `/dlq/${dead1.id}/retry`, { key: a })
        expect(retried.status).toBe(200)
        expect(retried.json.jobId).not.toBe(first.json.id)
        const again = yield* call(base, "POST", `/dlq/${dead1.id}/retry`, { key: a })
        expect(again.status).toBe(409)

        const dead2 = byJob.get(second.json.id) as any
        const resolved = yield* call(base, "POST", `/dlq/${dead2.id}/resolve`, { key: a, body: { notes: "bad input, dropped" } })
        expect(resolved.status).toBe(200)
        expect(resolved.json).toEqual({ id: dead2.id, resolutionStatus: "resolved" })
        const all = yield* call(base, "GET", "/dlq?stage=echo&all=true", { key: a })
        const resolvedRow = all.json.deadLetters.find((d: any) => d.id === dead2.id)
        expect(resolvedRow).toMatchObject({ resolutionStatus: "resolved", resolutionNotes: "bad input, dropped" })
      }))

    it.effect("the dev tick runs at most N of the key's org's jobs", () =>
      Effect.gen(function*() {
        const base = yield* baseUrl
        const { a, b } = yield* keysFor
        for (const n of [1, 2, 3]) yield* call(base, "POST", "/jobs", { key: a, body: { stage: "manual", payload: { n } } })
        const other = yield* call(base, "POST", "/jobs", { key: b, body: { stage: "manual", payload: { n: 9 } } })
        const tick = yield* call(base, "POST", "/api/jobs/tick", { key: a, body: { max: 2 } })
        expect(tick.status).toBe(200)
        expect(tick.json).toMatchObject({ ok: true, claimed: 2, completed: 2 })
        const rest = yield* call(base, "POST", "/api/jobs/tick", { key: a, body: { max: 10 } })
        expect(rest.json).toMatchObject({ claimed: 1, completed: 1 })
        // org B's job was never visible to org A's ticks
        expect((yield* call(base, "GET", `/jobs/${other.json.id}`, { key: b })).json.status).toBe("queued")
      }))

    it.effect("401 without a valid key; another org's rows are 404", () =>
      Effect.gen(function*() {
        const base = yield* baseUrl
        const { a, b } = yield* keysFor
        const keys = yield* ApiKeys.ApiKeys
        expect((yield* call(base, "GET", "/jobs")).status).toBe(401)
        expect((yield* call(base, "GET", "/jobs", { key: "pgf_000000000000_" + "A".repeat(43) })).status).toBe(401)
        expect((yield* call(base, "GET", "/jobs", { key: "not-a-key" })).status).toBe(401)
        const unauth = yield* call(base, "POST", "/jobs", { body: { stage: "echo", payload: { n: 1 } } })
        expect(unauth.status).toBe(401)
        expect(unauth.json._tag).toBe("Unauthorized")

        const job = yield* call(base, "POST", "/jobs", { key: a, body: { stage: "echo", payload: { n: 5 }, delayMs: 60_000 } })
        expect((yield* call(base, "GET", `/jobs/${job.json.id}`, { key: b })).status).toBe(404)
        expect((yield* call(base, "POST", `/jobs/${job.json.id}/cancel`, { key: b })).status).toBe(404)
        expect((yield* call(base, "GET", "/jobs?stage=echo", { key: b })).json.jobs.map((j: any) => j.id)).not.toContain(job.json.id)
        expect((yield* call(base, "GET", `/jobs/${job.json.id}`, { key: a })).status).toBe(200)

        const dead = yield* call(base, "POST", "/jobs", { key: a, body: { stage: "echo", payload: { n: 6, fail: true } } })
        const dl = yield* eventually(call(base, "GET", `/jobs/${dead.json.id}`, { key: a }), (r) => r.json?.status === "dead")
        const dlId = dl.json.deadLetterId
        expect((yield* call(base, "GET", `/dlq/${dlId}`, { key: b })).status).toBe(404)
        expect((yield* call(base, "POST", `/dlq/${dlId}/retry`, { key: b })).status).toBe(404)
        expect((yield* call(base, "POST", `/dlq/${dlId}/resolve`, { key: b, body: {} })).status).toBe(404)
        expect((yield* call(base, "GET", "/dlq?all=true", { key: b })).json.deadLetters.map((d: any) => d.id)).not.toContain(dlId)

        // a revoked key stops working at once
        const c = yield* keys.create({ orgId: "org-c" })
        expect((yield* call(base, "GET", "/jobs", { key: Redacted.value(c.token) })).status).toBe(200)
        expect(yield* keys.revoke(c.key.prefix)).toBe(true)
        expect((yield* call(base, "GET", "/jobs", { key: Redacted.value(c.token) })).status).toBe(401)
      }))

    it.effect("a request without a valid key is refused (401) before its body is read: a 20 MB chunked body, most of it never sent", () =>
      Effect.gen(function*() {
        const base = yield* baseUrl
        for (const authorization of [undefined, "Bearer pgf_000000000000_" + "A".repeat(43)]) {
          const reply = yield* Effect.promise(() => unauthenticatedUpload(base, authorization))
          expect([reply.status, JSON.parse(reply.text)._tag]).toEqual([401, "Unauthorized"])
          // answered while the client still held back 19 of its 20 MiB
          expect(reply.sentWhenAnswered).toBeLessThan(reply.total)
        }
        expect((yield* call(base, "GET", "/healthz")).status).toBe(200)
      }))

    it.effect("bad input is 400 or 413 with a reason, and the server keeps serving", () =>
      Effect.gen(function*() {
        const base = yield* baseUrl
        const { a } = yield* keysFor
        const malformed = yield* call(base, "POST", "/jobs", {
          key: a,
          rawBody: "{\"stage\": \"echo\", \"payload\": ",
          headers: { "content-type": "application/json" }
        })
        expect(malformed.status).toBe(400)
        expect(malformed.json.message).toMatch(/JSON|malformed/i)

        const wrongPayload = yield* call(base, "POST", "/jobs", { key: a, body: { stage: "echo", payload: { n: "one" } } })
        expect(wrongPayload.status).toBe(400)
        expect(wrongPayload.json).toMatchObject({ _tag: "BadRequest", field: "payload" })
        expect(wrongPayload.json.message).toContain("payload does not match the echo schema")
        expect(wrongPayload.json.message).toContain("Expected number")

        const unknownStage = yield* call(base, "POST", "/jobs", { key: a, body: { stage: "nope", payload: {} } })
        expect(unknownStage.status).toBe(400)
        expect(unknownStage.json.message).toContain(`unknown stage "nope"`)

        const badEnvelope = yield* call(base, "POST", "/jobs", { key: a, body: { stage: "echo", priority: 500 } })
        expect(badEnvelope.status).toBe(400)
        expect(badEnvelope.json._tag).toBe("HttpApiDecodeError")

        const big = { stage: "echo", payload: { n: 1, pad: "x".repeat(100 * 1024) } }
        const tooLarge = yield* call(base, "POST", "/jobs", { key: a, body: big })
        expect(tooLarge.status).toBe(413)
        expect(tooLarge.json._tag).toBe("PayloadTooLarge")

        // no Content-Length (chunked): cut off at the limit while reading
        const encoder = new TextEncoder()
        const chunk = encoder.encode("x".repeat(16 * 1024))
        let sent = 0
        const stream = new ReadableStream<Uint8Array>({
          pull(controller) {
            if (sent === 0) controller.enqueue(encoder.encode("{\"stage\":\"echo\",\"payload\":{\"pad\":\""))
            if (sent++ < 8) controller.enqueue(chunk)
            else {
              controller.enqueue(encoder.encode("\"}}"))
              controller.close()
            }
          }
        })
        const chunked = yield* call(base, "POST", "/jobs", { key: a, rawBody: stream, headers: { "content-type": "application/json" } })
        expect(chunked.status).toBe(413)
        // far past the limit (40×), still a 413 rather than a reset connection; memory stays at the limit
        let hugeSent = 0
        const huge = new ReadableStream<Uint8Array>({
          pull(controller) {
            if (hugeSent++ < 160) controller.enqueue(chunk)
            else controller.close()
          }
        })
        const hugeReply = yield* call(base, "POST", "/jobs", { key: a, rawBody: huge, headers: { "content-type": "application/json" } })
        expect([hugeReply.status, hugeReply.json?._tag]).toEqual([413, "PayloadTooLarge"])

        expect((yield* call(base, "GET", "/healthz")).status).toBe(200)
      }))

    it.effect("strict input: a NUL in any path or query is 400 on both listeners; bytes that are not UTF-8 are 400 naming the offset; another charset is 415; a date that does not exist is 400", () =>
      Effect.gen(function*() {
        const base = yield* baseUrl
        const admin = yield* adminUrl
        const { a } = yield* keysFor
        const refused = (reply: { status: number; json: any }, status: number, tag: string, text: RegExp) => {
          expect([reply.status, reply.json?._tag], JSON.stringify(reply.json)).toEqual([status, tag])
          expect(reply.json.message).toMatch(text)
        }

        // NUL: PostgreSQL cannot store it, and no name or id holds one
        refused(yield* call(admin, "DELETE", "/limits/%00"), 400, "BadRequest", /NUL/)
        refused(yield* call(admin, "PUT", "/limits/%00", { body: { cap: 1 } }), 400, "BadRequest", /NUL/)
        refused(yield* call(admin, "POST", "/stages/ec%00ho/pause"), 400, "BadRequest", /NUL/)
        for (const path of ["/jobs/%00", "/jobs/1%00", "/dlq/%00/retry", "/calls/%00", "/schedules/a%00b", "/jobs?stage=%00", "/jobs?x%00=1", "/dashboard/jobs/%00"]) {
          refused(yield* call(base, "GET", path, { key: a }), 400, "BadRequest", /NUL/)
        }
        // before the key is asked for: nothing about keys is learnt from it
        refused(yield* call(base, "DELETE", "/schedules/%00"), 400, "BadRequest", /NUL/)
        // an escaped percent sign is text, not a NUL
        expect((yield* call(base, "GET", "/jobs/%2500", { key: a })).status).toBe(404)

        // bytes that are not UTF-8 inside a JSON string are refused, not stored as U+FFFD
        const head = "{\"stage\":\"echo\",\"payload\":{\"n\":1},\"runAt\":\"2099-01-01T00:00:00Z\",\"subjectId\":\""
        const withBytes = (...bytes: Array<number>) =>
          Buffer.concat([Buffer.from(head), Buffer.from(bytes), Buffer.from("\"}")])
        const json = { "content-type": "application/json" }
        refused(yield* call(base, "POST", "/jobs", { key: a, rawBody: withBytes(0xff, 0xfe), headers: json }), 400, "BadRequest", new RegExp(`not valid UTF-8.*byte offset ${head.length} \\(FF FE`))
        refused(yield* call(base, "POST", "/jobs", { key: a, rawBody: withBytes(0x61, 0xed, 0xa0, 0x80), headers: json }), 400, "BadRequest", new RegExp(`byte offset ${head.length + 1} \\(ED A0 80`))
        refused(yield* call(base, "POST", "/jobs", { key: a, rawBody: withBytes(0xc0, 0xaf), headers: json }), 400, "BadRequest", /not valid UTF-8/)
        refused(yield* call(base, "POST", "/jobs", { key: a, rawBody: withBytes(0xf0, 0x9f, 0x8e), headers: json }), 400, "BadRequest", /not valid UTF-8/)
        // real UTF-8 is kept exactly
        const kept = yield* call(base, "POST", "/jobs", { key: a, rawBody: withBytes(...Buffer.from("é🎉")), headers: json })
        expect(kept.status, kept.text).toBe(201)
        expect((yield* call(base, "GET", `/jobs/${kept.json.id}`, { key: a })).json.subjectId).toBe("é🎉")

        // a body in another charset is not read as UTF-8
        const body = JSON.stringify({ stage: "echo", payload: { n: 1 }, runAt: "2099-01-01T00:00:00Z" })
        for (const contentType of ["application/json; charset=utf-16", "application/json;charset=latin1", "application/json; charset=\"ISO-8859-1\""]) {
          refused(yield* call(base, "POST", "/jobs", { key: a, rawBody: body, headers: { "content-type": contentType } }), 415, "UnsupportedMediaType", /UTF-8/)
        }
        for (const contentType of ["application/json; charset=UTF-8", "application/json; charset=\"utf-8\"", "application/json"]) {
          expect((yield* call(base, "POST", "/jobs", { key: a, rawBody: body, headers: { "content-type": contentType } })).status).toBe(201)
        }

        // a day or time that does not exist is refused, not rolled into the next month
        for (const runAt of ["2026-02-30T10:00:00Z", "2027-02-29T10:00:00Z", "2026-04-31", "2026-03-01T24:00:00Z", "2026-03-01T10:60:00Z", "2026-03-01T10:00:00+25:00", "March 7, 2099"]) {
          const reply = yield* call(base, "POST", "/jobs", { key: a, body: { stage: "echo", payload: { n: 1 }, runAt } })
          expect([reply.status, reply.json._tag], runAt).toEqual([400, "HttpApiDecodeError"])
          expect(reply.json.message, runAt).toContain("ISO 8601")
        }
        const leap = yield* call(base, "POST", "/jobs", { key: a, body: { stage: "echo", payload: { n: 1 }, runAt: "2096-02-29T10:00:00+01:00" } })
        expect(leap.status).toBe(201)
        expect((yield* call(base, "GET", `/jobs/${leap.json.id}`, { key: a })).json.availableAt).toBe("2096-02-29T09:00:00.000Z")
      }))

    it.effect("/metrics is Prometheus text and its counters move when jobs run", () =>
      Effect.gen(function*() {
        const base = yield* baseUrl
        const admin = yield* adminUrl
        const { a } = yield* keysFor
        const before = yield* call(admin, "GET", "/metrics")
        expect(before.status).toBe(200)
        expect(before.headers.get("content-type")).toContain("text/plain")
        const parsedBefore = parsePrometheus(before.text)
        expect(parsedBefore.types.get("pgfiber_jobs_completed_total")).toBe("counter")
        expect(parsedBefore.types.get("pgfiber_job_duration_seconds")).toBe("histogram")
        expect(parsedBefore.types.get("pgfiber_queue_depth")).toBe("gauge")
        const completed = (p: ReturnType<typeof parsePrometheus>) => p.samples.get(`pgfiber_jobs_completed_total{stage="echo"}`) ?? 0
        const enqueued = (p: ReturnType<typeof parsePrometheus>) => p.samples.get(`pgfiber_jobs_enqueued_total{stage="echo"}`) ?? 0
        expect(parsedBefore.samples.has(`pgfiber_jobs_claimed_total{stage="manual"}`)).toBe(true)

        for (const n of [1, 2, 3]) yield* call(base, "POST", "/jobs", { key: a, body: { stage: "echo", payload: { n } } })
        const after = yield* eventually(
          Effect.map(call(admin, "GET", "/metrics"), (r) => parsePrometheus(r.text)),
          (p) => completed(p) >= completed(parsedBefore) + 3
        )
        expect(completed(after)).toBe(completed(parsedBefore) + 3)
        expect(enqueued(after)).toBe(enqueued(parsedBefore) + 3)
        expect(after.samples.get(`pgfiber_job_duration_seconds_count{stage="echo"}`)).toBeGreaterThanOrEqual(3)
        expect(after.samples.get(`pgfiber_job_duration_seconds_bucket{stage="echo",le="+Inf"}`)).toBe(
          after.samples.get(`pgfiber_job_duration_seconds_count{stage="echo"}`)
        )
        expect(after.samples.get(`pgfiber_queue_depth{stage="manual",state="ready"}`)).toBeTypeOf("number")
        expect(after.samples.get("pgfiber_database_up")).toBe(1)
        expect(after.samples.has("pgfiber_listener_reconnects_total")).toBe(true)
      }))

    it.effect("calls: upload or storage URI, then status, artifacts, transcript and analysis; other orgs get 404", () =>
      Effect.gen(function*() {
        const base = yield* baseUrl
        const db = yield* Db.Db
        const storage = yield* Storage.Storage
        const key = yield* newKey({ orgId: "org-calls" })
        const { b } = yield* keysFor

        const form = new FormData()
        form.append("file", new Blob([new Uint8Array(2048).fill(7)], { type: "audio/wav" }), "call-1.wav")
        const uploaded = yield* call(base, "POST", "/calls", { key, rawBody: form })
        expect(uploaded.status).toBe(201)
        expect(uploaded.json.status).toBe("queued")

        yield* storage.put("orgs/org-calls/inbox/call-2.mp3", new Uint8Array([1, 2, 3]))
        const uri = yield* storage.uri("orgs/org-calls/inbox/call-2.mp3")
        const byUri = yield* call(base, "POST", "/calls", { key, body: { uri } })
        expect(byUri.status).toBe(201)

        const got = yield* call(base, "GET", `/calls/${uploaded.json.id}`, { key })
        expect(got.status).toBe(200)
        expect(got.json).toMatchObject({ id: uploaded.json.id, orgId: "org-calls", status: "queued", transcript: null, analysis: null })
        expect(got.json.artifacts).toEqual([expect.objectContaining({ kind: "source", bytes: 2048 })])
        // keys relative to the org's prefix: no server path, no `orgs/<org>/`
        expect(got.json.artifacts[0].storageKey).toMatch(new RegExp(`^calls/${uploaded.json.id}/source\\.wav$`))
        expect(got.json.sourceKey).toBe(got.json.artifacts[0].storageKey)
        expect(got.text).not.toContain("file://")
        expect(got.json.sourceUri).toBeUndefined()

        // what the later stages would write, read back through the API
        const segments = [
          { startMs: 0, endMs: 1500, channel: "0", text: "hello there" },
          { startMs: 1600, endMs: 3000, channel: "1", text: "hello, how can I help" }
        ]
        const analysis = Analyzer.analyzeDeterministic({ segments, durationMs: 3000 })
        yield* db.run((sql) =>
          CallsSql.insertTranscript(sql, { callId: byUri.json.id, orgId: "org-calls", operationId: "op-1", language: "en-US", segments, durationMs: 3000 })
        )
        yield* db.run((sql) => CallsSql.upsertAnalysis(sql, { callId: byUri.json.id, orgId: "org-calls", analyzer: analysis.analyzer, analysis }))
        const full = yield* call(base, "GET", `/calls/${byUri.json.id}`, { key })
        expect(full.status).toBe(200)
        expect(full.json.sourceKey).toBe("inbox/call-2.mp3")
        expect(full.text).not.toContain(uri)
        expect(full.json.transcript).toMatchObject({ operationId: "op-1", language: "en-US", segments })
        expect(full.json.analysis.analysis).toMatchObject({ totalWords: analysis.totalWords, durationMs: 3000 })

        expect((yield* call(base, "GET", `/calls/${byUri.json.id}`, { key: b })).status).toBe(404)
        expect((yield* call(base, "GET", "/calls/not-a-uuid", { key })).status).toBe(404)
        expect((yield* call(base, "POST", "/calls", { key: b, body: { uri: "file:///etc/passwd" } })).status).toBe(400)
        const missing = yield* call(base, "POST", "/calls", { key, body: { uri: "s3://elsewhere/x.wav" } })
        expect(missing.status).toBe(400)
        const big = new FormData()
        big.append("file", new Blob([new Uint8Array(300 * 1024)]), "big.wav")
        expect((yield* call(base, "POST", "/calls", { key, rawBody: big })).status).toBe(413)
      }))

    it.effect("the tenant role cannot read the API key table", () =>
      Effect.gen(function*() {
        const db = yield* Db.Db
        const sql = rawSql(db.schema)
        const denied = yield* Effect.promise(() =>
          sql.begin(async (tx) => {
            await tx`set local role pgfiber_tenant`
            return tx`select count(*) from api_keys`.then(() => "read", (e: Error) => e.message)
          }).catch((e: Error) => e.message)
        )
        yield* Effect.promise(() => sql.end())
        expect(denied).toContain("permission denied")
      }))
  })
})
