/**
 * The stage registry, end to end: a user's own worker process (test/fixtures/probeWorker.ts, which imports the
 * built package by its name, as a user's app does) runs `probe.work`, a stage the service under test never
 * compiled. The service's HTTP API and the compiled CLI pause and resume it, enqueue to it (a payload that does
 * not match its registered JSON Schema is a 400 naming the field), retry its dead letters and edit its limits;
 * an operator's key pauses it on the API listener too; after the worker's clean shutdown the stage is still known,
 * shown with no live process, and purged. The fixture loads dist/ (as `import "pgfiber"` does): after changing
 * src/, `npm run build` before this file.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect, Redacted } from "effect"
import * as ApiKeys from "../../packages/service/src/auth/ApiKeys.js"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import { layerDb } from "../support/pg.js"
import { waitFor } from "../support/waitFor.js"
import { fixture, spawnWorkerProcess } from "../support/workerProcess.js"
import { adminUrl, baseUrl, call, layerService, pgfiber, query } from "../http/support.js"

const stageRow = (admin: string) =>
  Effect.map(call(admin, "GET", "/stages"), (r) => (r.json?.stages ?? []).find((s: any) => s.stage === "probe.work"))

const jobRow = (schema: string, id: string) =>
  Effect.map(query<{ status: string; stage: string; payload: any }>(schema, `select status, stage, payload from jobs where id = ${Number(id)}
    union all select status, stage, payload from jobs_archive where id = ${Number(id)}`), (rows) => rows[0])

describe("stage registry: a user's worker process runs its own stage beside the service", () => {
  layer(layerService(layerDb()), { excludeTestServices: true, timeout: 240_000 })((it) => {
    it.scoped("the HTTP API and the CLI pause, resume, enqueue to, retry and limit a stage only the user's worker knows", () =>
      Effect.gen(function*() {
        const { schema } = yield* Db.Db
        const base = yield* baseUrl
        const admin = yield* adminUrl
        const keys = yield* ApiKeys.ApiKeys
        const tenant = Redacted.value((yield* keys.create({ orgId: "acme", name: "registry test" })).token)

        const worker = yield* spawnWorkerProcess(fixture("probeWorker.ts"), {
          PGFIBER_SCHEMA: schema,
          WORKER_ID: "probe-1",
          SWEEP_INTERVAL_MS: "2000",
          LOG_LEVEL: "warn"
        })
        const registered = yield* waitFor("probe.work to be registered by the user's worker", Effect.map(stageRow(admin), (s) => s?.live === true && s)).pipe(
          Effect.tapDefect(() => Effect.sync(() => console.log(`the probe worker's output (it runs the built package: is dist/ current? npm run build):\n${worker.output()}`)))
        )
        expect(registered).toMatchObject({ stage: "probe.work", paused: false, visibility: "public", live: true, processes: 1 })

        // the registry holds what the worker declared: its JSON Schema, defaults, limits, its process
        const [row] = yield* query<{ payload_schema: any; max_attempts: number; limits: any }>(schema, `select payload_schema, max_attempts, limits from stage_registry where stage = 'probe.work'`)
        expect(row!.payload_schema).toMatchObject({ type: "object", required: ["customer"] })
        expect(row!.max_attempts).toBe(3)
        expect(row!.limits).toMatchObject({ maxRunning: 8 })

        // ---- HTTP: pause; a job enqueued meanwhile waits; resume runs it
        const paused = yield* call(admin, "POST", "/stages/probe.work/pause")
        expect(paused.status).toBe(200)
        expect(paused.json).toMatchObject({ stage: "probe.work", paused: true, changedBy: "http" })
        const queued = yield* call(base, "POST", "/jobs", { key: tenant, body: { stage: "probe.work", payload: { customer: 42, note: "hi" } } })
        expect(queued.status).toBe(201)
        expect((yield* jobRow(schema, queued.json.id))).toMatchObject({ stage: "probe.work", payload: { customer: 42, note: "hi" } })
        const resumed = yield* call(admin, "POST", "/stages/probe.work/resume")
        expect(resumed.json).toMatchObject({ paused: false })
        yield* waitFor("the job enqueued while paused to complete after resume", Effect.map(jobRow(schema, queued.json.id), (j) => j?.status === "completed"))

        // ---- HTTP: a payload the registered JSON Schema refuses is a 400 naming the field; nothing is written
        const before = (yield* query(schema, "select 1 from jobs")).length
        const wrongType = yield* call(base, "POST", "/jobs", { key: tenant, body: { stage: "probe.work", payload: { customer: "forty-two" } } })
        expect(wrongType.status).toBe(400)
        expect(wrongType.json).toMatchObject({ field: "payload.customer" })
        expect(wrongType.json.message).toContain("payload.customer")
        const missing = yield* call(base, "POST", "/jobs", { key: tenant, body: { stage: "probe.work", payload: { note: "no customer" } } })
        expect(missing.status).toBe(400)
        expect(missing.json).toMatchObject({ field: "payload.customer" })
        expect(missing.json.message).toMatch(/payload\.customer is required/)
        const extra = yield* call(base, "POST", "/jobs", { key: tenant, body: { stage: "probe.work", payload: { customer: 1, colour: "red" } } })
        expect(extra.status).toBe(400)
        expect(extra.json).toMatchObject({ field: "payload.colour" })
        expect((yield* query(schema, "select 1 from jobs")).length).toBe(before)

        // ---- HTTP: its dead letter retried
        const failing = yield* call(base, "POST", "/jobs", { key: tenant, body: { stage: "probe.work", payload: { customer: 7, fail: true } } })
        expect(failing.status).toBe(201)
        const dead = yield* waitFor("the failing probe job to be dead-lettered", Effect.map(
          query<{ id: string }>(schema, `select id::text from dead_letters where job_id = ${Number(failing.json.id)}`), (rows) => rows[0]))
        const retried = yield* call(base, "POST", `/dlq/${dead.id}/retry`, { key: tenant })
        expect(retried.status).toBe(200)
        expect(retried.json.jobId).toMatch(/^\d+$/)
        expect((yield* jobRow(schema, retried.json.jobId))).toMatchObject({ stage: "probe.work", payload: { customer: 7, fail: true } })

        // ---- HTTP: its limits, as code declared them, then an override; a stage nobody runs is a 404
        const limits = yield* call(admin, "GET", "/limits")
        expect(limits.json.limits.find((l: any) => l.stage === "probe.work")).toMatchObject({ source: "code", effective: { maxRunning: 8 } })
        const set = yield* call(admin, "PUT", "/limits/probe.work", { body: { rate: "50/s" } })
        expect(set.status).toBe(200)
        expect(set.json).toMatchObject({ stage: "probe.work", source: "override", effective: { maxRunning: 8, rate: { limit: 50, perMs: 1000 } } })
        const nobody = yield* call(admin, "PUT", "/limits/nobody.runs", { body: { rate: "1/s" } })
        expect(nobody.status).toBe(404)
        expect(nobody.json).toMatchObject({ _tag: "NotFound" })
        expect((yield* call(admin, "POST", "/stages/nobody.runs/pause")).status).toBe(404)

        // ---- an operator's (admin) key may pause and resume on the API listener; an org's key learns nothing there
        const operatorKey = Redacted.value((yield* keys.create({ admin: true, name: "registry operator" })).token)
        const byKey = yield* call(base, "POST", "/stages/probe.work/pause", { key: operatorKey })
        expect(byKey.status).toBe(200)
        expect(byKey.json).toMatchObject({ stage: "probe.work", paused: true })
        expect((yield* call(base, "POST", "/stages/probe.work/resume", { key: operatorKey })).json).toMatchObject({ paused: false })
        const byTenant = yield* call(base, "POST", "/stages/probe.work/pause", { key: tenant })
        expect(byTenant.status).toBe(404)
        expect(byTenant.json).toEqual({ _tag: "NotFound", message: "no such route" })
        expect((yield* call(base, "POST", "/stages/probe.work/pause")).status).toBe(401)
        expect((yield* call(base, "POST", "/stages/nobody.runs/pause", { key: operatorKey })).status).toBe(404)
        expect((yield* stageRow(admin))).toMatchObject({ paused: false })

        // ---- /readyz reports one pause state per stage (the pool's own field says whether its claims fail)
        yield* call(admin, "POST", "/stages/echo/pause")
        const readyz = yield* call(admin, "GET", "/readyz")
        const echoReady = readyz.json.stages.find((s: any) => s.stage === "echo")
        expect(echoReady).toMatchObject({ paused: true, pool: { claimsFailing: false, claimedAhead: 0 } })
        expect(echoReady.pool).not.toHaveProperty("paused")
        yield* call(admin, "POST", "/stages/echo/resume")

        // ---- the CLI, on the same database
        const [pause, list] = yield* Effect.all([
          pgfiber(schema, ["stages", "pause", "probe.work"]),
          pgfiber(schema, ["stages", "list", "--json"])
        ], { concurrency: 2 })
        expect(pause.code, pause.stderr).toBe(0)
        expect(pause.stdout).toBe("paused\n")
        expect(JSON.parse(list.stdout).find((s: any) => s.stage === "probe.work")).toMatchObject({ visibility: "public", live: true, processes: [{ workerId: "probe-1", concurrency: 2, live: true }] })
        expect(yield* stageRow(admin)).toMatchObject({ paused: true, changedBy: "cli" })
        const resume = yield* pgfiber(schema, ["stages", "resume", "probe.work"])
        expect(resume.stdout).toBe("resumed\n")

        const [enqueued, refused, unknown] = yield* Effect.all([
          pgfiber(schema, ["enqueue", "probe.work", `{"customer":5}`, "--org", "acme"]),
          pgfiber(schema, ["enqueue", "probe.work", `{"customer":-1}`]),
          pgfiber(schema, ["stages", "pause", "nobody.runs"])
        ], { concurrency: 2 })
        expect(enqueued.code, enqueued.stderr).toBe(0)
        const cliJob = enqueued.stdout.trim()
        yield* waitFor("the CLI's probe job to complete", Effect.map(jobRow(schema, cliJob), (j) => j?.status === "completed"))
        expect(refused.code).not.toBe(0)
        expect(refused.stderr).toContain("payload.customer")
        expect(unknown.code).not.toBe(0)
        expect(unknown.stderr).toContain("unknown stage \"nobody.runs\"")
        expect(unknown.stderr).toContain("probe.work")

        const failingCli = yield* pgfiber(schema, ["enqueue", "probe.work", `{"customer":9,"fail":true}`])
        const deadCli = yield* waitFor("the CLI's failing probe job to be dead-lettered", Effect.map(
          query<{ id: string }>(schema, `select id::text from dead_letters where job_id = ${Number(failingCli.stdout.trim())}`), (rows) => rows[0]))
        const retry = yield* pgfiber(schema, ["dlq", "retry", deadCli.id])
        expect(retry.code, retry.stderr).toBe(0)
        expect((yield* jobRow(schema, retry.stdout.trim()))).toMatchObject({ stage: "probe.work" })

        const [limitSet, limitNobody] = yield* Effect.all([
          pgfiber(schema, ["limits", "set", "probe.work", "--max-running", "3"]),
          pgfiber(schema, ["limits", "set", "nobody.runs", "--max-running", "3"])
        ], { concurrency: 2 })
        expect(limitSet.code, limitSet.stderr).toBe(0)
        expect(limitNobody.code).not.toBe(0)
        const limitList = yield* pgfiber(schema, ["limits", "list", "--json"])
        expect(JSON.parse(limitList.stdout).find((v: any) => v.stage === "probe.work")).toMatchObject({
          source: "override",
          effective: { maxRunning: 3, rate: { limit: 50 } }
        })

        // ---- a clean shutdown removes the process; the stage stays known, with no live process
        worker.child.kill("SIGTERM")
        expect(yield* Effect.promise(() => worker.exited)).toBe(0)
        const gone = yield* stageRow(admin)
        expect(gone).toMatchObject({ stage: "probe.work", live: false, processes: 0 })
        // and still operable: a job enqueued now waits for a process to run it
        const waiting = yield* call(base, "POST", "/jobs", { key: tenant, body: { stage: "probe.work", payload: { customer: 11 } } })
        expect(waiting.status).toBe(201)
        const stats = yield* pgfiber(schema, ["stages", "list"])
        expect(stats.stdout).toMatch(/probe\.work\s+running\s+none live/)
        const depth = yield* pgfiber(schema, ["stats"])
        expect(depth.stdout).toMatch(/^probe\.work\s.*no live process$/m)
        // purged over HTTP, and kept in the history saying so
        const purged = yield* call(admin, "POST", "/stages/probe.work/purge")
        expect(purged.json).toEqual({ stage: "probe.work", purged: 1 })
        expect(yield* jobRow(schema, waiting.json.id)).toMatchObject({ status: "cancelled", stage: "probe.work" })
        const [history] = yield* query<{ last_error: string }>(schema, `select last_error from jobs_archive where id = ${Number(waiting.json.id)}`)
        expect(history!.last_error).toBe("purged by http")
        expect((yield* call(admin, "POST", "/stages/nobody.runs/purge")).status).toBe(404)
      }))
  })
})
