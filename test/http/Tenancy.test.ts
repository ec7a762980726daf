/**
 * Tenancy, walked end to end with two orgs (acme and beta, each with its own API key) against a real server, a
 * real worker running every stage of the build, and Postgres: for every HTTP endpoint and every stage, beta can
 * neither read, write, enqueue into, collide with, nor learn of the existence of anything of acme's. Each table
 * row is one endpoint or one stage; beta's answer about acme's thing is compared with its answer about a thing
 * that does not exist, byte for byte (ids aside), so a 404 is never an existence oracle.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Duration, Effect, Layer, Schema } from "effect"
import * as Crypto from "node:crypto"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import * as ApiKeys from "../../packages/service/src/auth/ApiKeys.js"
import { Permanent, Transient } from "../../packages/pgfiber/src/JobError.js"
import * as Analyzer from "../../packages/media/src/layers/Analyzer.js"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as Media from "../../packages/media/src/layers/Media.js"
import * as Storage from "../../packages/media/src/layers/Storage.js"
import * as Transcription from "../../packages/media/src/layers/Transcription.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as PgSchedules from "../../packages/pgfiber/src/queue/PgSchedules.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import * as Schedules from "../../packages/pgfiber/src/queue/Schedules.js"
import * as Stage from "../../packages/pgfiber/src/runtime/Stage.js"
import * as Submit from "../../packages/pgfiber/src/runtime/Submit.js"
import * as Worker from "../../packages/pgfiber/src/runtime/Worker.js"
import * as Server from "../../packages/service/src/http/Server.js"
import { CallsSql, makeCallStages } from "../../packages/media/src/stages/calls/index.js"
import { DocumentsSweep, TranscribeDocument } from "../../packages/media/src/stages/documents/index.js"
import * as EchoStage from "../../packages/service/src/stages/echo/EchoStage.js"
import * as Housekeeping from "../../packages/pgfiber/src/stages/housekeeping/Housekeeping.js"
import * as SpeechKitSimulator from "../../packages/media/src/testing/SpeechKitSimulator.js"
import { apiKey as speechKitKey, speechKitLayer } from "../stages/calls/support.js"
import { layerDb } from "../support/pg.js"
import { adminUrl, baseUrl, call, eventually, newKey, type Reply } from "./support.js"

// ---------------------------------------------------------------------------------------------
// the world: every stage of the build on a real worker, plus two test stages

/** What `peek`'s handler saw of the database, per run: which orgs' rows, as which role, in which transactions. */
const peeks: Array<{ readonly job: string; readonly jobOrgs: ReadonlyArray<string | null>; readonly callOrgs: ReadonlyArray<string>; readonly role: string; readonly txids: ReadonlyArray<string> }> = []

/** A handler that reads what it can see, with an outside wait between its statements. */
const peek = Stage.make({
  name: "peek",
  visibility: "public",
  payload: Schema.Struct({}),
  handler: (_, job) =>
    Effect.gen(function*() {
      const db = yield* Db.Db
      const jobs = yield* db.run((sql) => sql<Array<{ org_id: string | null }>>`select distinct org_id from jobs order by 1`)
      const calls = yield* db.run((sql) => sql<Array<{ org_id: string }>>`select distinct org_id from calls order by 1`)
      const [first] = yield* db.run((sql) => sql<Array<{ role: string; txid: string }>>`select current_user as role, txid_current()::text as txid`)
      yield* Effect.sleep("20 millis") // standing in for SpeechKit or ffmpeg: no transaction may stay open across it
      const [second] = yield* db.run((sql) => sql<Array<{ txid: string }>>`select txid_current()::text as txid`)
      peeks.push({ job: job.id, jobOrgs: jobs.map((r) => r.org_id), callOrgs: calls.map((r) => r.org_id), role: first!.role, txids: [first!.txid, second!.txid] })
    }).pipe(Effect.mapError((e) => new Transient({ message: e.message })))
})

/** Public, but run by no worker: only a tick runs it. */
const manual = Stage.make({ name: "manual", visibility: "public", payload: Schema.Struct({ n: Schema.Number }), handler: () => Effect.void })

const workDir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "pgfiber-tenancy-"))
const callStages = makeCallStages({ tempDir: workDir })
const workerStages = [
  ...callStages,
  TranscribeDocument.makeTranscribeDocument(),
  DocumentsSweep.documentsSweep,
  EchoStage.stage,
  peek
] as const
// the queue's own upkeep (a system stage, run by no worker here): tenants must not enqueue or schedule it either
const known: ReadonlyArray<Stage.Any> = [...workerStages, manual, Housekeeping.housekeeping]
const internalStages = known.filter((s) => s.visibility === "internal").map((s) => s.name)

const services = Layer.mergeAll(
  Layer.unwrapScoped(
    Effect.acquireRelease(
      Effect.sync(() => Fs.mkdtempSync(Path.join(Os.tmpdir(), "pgfiber-tenancy-storage-"))),
      (dir) => Effect.sync(() => Fs.rmSync(dir, { recursive: true, force: true }))
    ).pipe(Effect.map((dir) => Storage.layerFs(dir).pipe(Layer.orDie)))
  ),
  // beta's attacks dead-letter before any outside call; the calls the orgs create of their own fail here, at once
  Media.layerStub({ toOggOpus: () => Effect.fail(new Permanent({ message: "no media processing in this test" })) }),
  Layer.provideMerge(speechKitLayer, SpeechKitSimulator.layer({ apiKey: speechKitKey })),
  Analyzer.layerDeterministic,
  Transcription.layerMemory(() => Effect.dieMessage("the transcription service must not be called here")),
  DocumentsSweep.layerWith({ stuckAfter: Duration.hours(1) })
)

const world = Server.layer({
  host: "127.0.0.1",
  port: 0,
  admin: { host: "127.0.0.1", port: 0 },
  maxBodyBytes: 64 * 1024,
  maxUploadBytes: 256 * 1024,
  devTick: true,
  workerId: "tenancy-test",
  tickStages: [manual]
}).pipe(
  Layer.provideMerge(Worker.layer(workerStages, {
    workerId: "tenancy-test",
    shutdownGrace: Duration.seconds(2),
    sweepInterval: Duration.seconds(30),
    pollInterval: Duration.seconds(1),
    concurrency: {}
  })),
  Layer.provideMerge(services),
  Layer.provideMerge(Layer.succeed(Submit.KnownStages, known)),
  Layer.provideMerge(ApiKeys.layer),
  Layer.provideMerge(PgQueue.layer({ knownStages: known.map((s) => s.name) })),
  Layer.provideMerge(layerDb())
)

// ---------------------------------------------------------------------------------------------
// acme's things, made once

interface Fixture {
  readonly base: string
  readonly acme: string
  readonly beta: string
  readonly acmeJob: string
  readonly acmeDeadLetter: string
  readonly acmeCall: string
  readonly acmeDocument: string
  /** acme's recurring job: beta must not read, change, fire or remove it, nor learn that the name is taken. */
  readonly acmeSchedule: string
}

let fixture: Fixture | undefined

const owner = <A>(query: (sql: Db.Sql) => PromiseLike<A>) => Effect.flatMap(Db.Db, (db) => db.run(query))

const setUp = Effect.gen(function*() {
  if (fixture !== undefined) return fixture
  const storage = yield* Storage.Storage
  const base = yield* baseUrl
  const acme = yield* newKey({ orgId: "acme" })
  const beta = yield* newKey({ orgId: "beta" })

  const job = yield* call(base, "POST", "/jobs", {
    key: acme,
    body: { stage: EchoStage.name, payload: { message: "acme's" }, delayMs: 3_600_000, dedupeKey: "invoice-124" }
  })
  expect(job.status).toBe(201)
  const doomed = yield* call(base, "POST", "/jobs", { key: acme, body: { stage: EchoStage.name, payload: { fail: "permanent" } } })
  const dead = yield* eventually(call(base, "GET", `/jobs/${doomed.json.id}`, { key: acme }), (r) => r.json?.status === "dead")
  expect(dead.json.status).toBe("dead")

  // acme's call and document, written as the owner with no job of their own, so nothing but beta's attempts runs on them
  const acmeCall = Crypto.randomUUID()
  yield* owner((sql) =>
    CallsSql.insertCall(sql, { id: acmeCall, orgId: "acme", sourceUri: "file:///nowhere", sourceKey: `orgs/acme/calls/${acmeCall}/source.wav` })
  )
  const [document] = yield* owner((sql) =>
    sql<Array<{ id: string }>>`insert into documents (org_id, media_format, canonical_url) values ('acme', 'text', 'https://media.example/a') returning id`
  )
  yield* storage.put("orgs/acme/inbox/recording.wav", new Uint8Array(64).fill(3))

  const acmeSchedule = "acme-nightly-report"
  const schedule = yield* call(base, "PUT", `/schedules/${acmeSchedule}`, {
    key: acme,
    body: { stage: EchoStage.name, payload: { message: "acme-nightly" }, cron: "0 3 * * *" }
  })
  expect([schedule.status, schedule.json.orgId]).toEqual([200, "acme"])
  // and a system schedule (no org), as `pgfiber start` installs: no tenant's either
  const system = yield* Schedules.make(yield* PgSchedules.makeStore).pipe(Effect.provideService(Queue.Queue, yield* Queue.Queue))
  yield* system.put(Housekeeping.schedules[0]!)

  fixture = {
    base,
    acme,
    beta,
    acmeJob: job.json.id,
    acmeDeadLetter: dead.json.deadLetterId,
    acmeCall,
    acmeDocument: document!.id,
    acmeSchedule
  }
  return fixture
})

/** acme's call and document rows as they are now (all columns): beta's attempts must leave them byte-identical. */
const acmeRows = (f: Fixture) =>
  Effect.all({
    call: owner((sql) => sql`select * from calls where id = ${f.acmeCall}`),
    artifacts: owner((sql) => sql`select * from call_artifacts where call_id = ${f.acmeCall}`),
    document: owner((sql) => sql`select * from documents where id = ${f.acmeDocument}`),
    job: owner((sql) => sql`select id, status, attempts, lease, updated_at from jobs where id = ${f.acmeJob}`),
    deadLetter: owner((sql) => sql`select * from dead_letters where id = ${f.acmeDeadLetter}`),
    // every schedule of acme's, and every job its schedule ever fired (none: nobody but beta touches it)
    schedules: owner((sql) => sql`select * from schedules where org_key = 'acme' order by name`),
    scheduledJobs: owner((sql) =>
      sql`select id from jobs where org_id = 'acme' and payload->>'message' = 'acme-nightly'
          union all select id from jobs_archive where org_id = 'acme' and payload->>'message' = 'acme-nightly'`
    )
  })

/** Two answers that must be indistinguishable: same status, same body once each id is replaced by `<id>`. */
const sameAnswer = (foreign: Reply, missing: Reply, ids: ReadonlyArray<string>) => {
  const scrub = (text: string) => ids.reduce((t, id) => t.replaceAll(id, "<id>"), text)
  expect(foreign.status).toBe(missing.status)
  expect(scrub(foreign.text)).toBe(scrub(missing.text))
  expect(foreign.json).toMatchObject({ _tag: expect.any(String), message: expect.any(String) })
}

const missingId = "9000000000000000000"
const missingUuid = "00000000-0000-4000-8000-000000000000"
const missingSchedule = "nobody-has-this-schedule"

// ---------------------------------------------------------------------------------------------
// the tables

interface EndpointRow {
  readonly endpoint: string
  readonly check: (f: Fixture) => Effect.Effect<void, unknown, any>
}

const endpoints: ReadonlyArray<EndpointRow> = [
  {
    endpoint: "GET /healthz (open) and the operational endpoints (admin listener only)",
    check: (f) =>
      Effect.gen(function*() {
        expect((yield* call(f.base, "GET", "/healthz")).status).toBe(200)
        for (const path of ["/readyz", "/metrics", "/docs", "/openapi.json"]) {
          // not on the API listener, with beta's key or without: cross-org counts stay on the admin network
          expect((yield* call(f.base, "GET", path, { key: f.beta })).status).toBe(404)
          expect((yield* call(f.base, "GET", path)).status).toBe(404)
        }
        expect((yield* call(yield* adminUrl, "GET", "/metrics")).status).toBe(200)
      })
  },
  {
    endpoint: "POST /jobs: dedupe keys are per org, no collision and no oracle",
    check: (f) =>
      Effect.gen(function*() {
        const body = { stage: EchoStage.name, payload: {}, delayMs: 3_600_000, dedupeKey: "invoice-124" }
        const betas = yield* call(f.base, "POST", "/jobs", { key: f.beta, body })
        expect(betas.status).toBe(201)
        expect(betas.json.deduped).toBe(false)
        expect(betas.json.id).not.toBe(f.acmeJob)
        // beta's answer is the one it gets for a key nobody holds
        const fresh = yield* call(f.base, "POST", "/jobs", { key: f.beta, body: { ...body, dedupeKey: "never-used-anywhere" } })
        expect([fresh.status, fresh.json.deduped]).toEqual([201, false])
        // each org gets its own live job back
        expect((yield* call(f.base, "POST", "/jobs", { key: f.acme, body })).json).toEqual({ id: f.acmeJob, deduped: true })
        expect((yield* call(f.base, "POST", "/jobs", { key: f.beta, body })).json).toEqual({ id: betas.json.id, deduped: true })
        // the operator's path (owner, outside RLS) keeps them apart too
        const queue = yield* Queue.Queue
        const viaCli = yield* Submit.submit(known, { stage: EchoStage.name, payload: {}, orgId: "beta", dedupeKey: "invoice-124", delay: Duration.hours(1) }).pipe(
          Effect.provideService(Queue.Queue, queue)
        )
        expect(viaCli).toEqual({ id: betas.json.id, deduped: true })
        const got = yield* call(f.base, "GET", `/jobs/${betas.json.id}`, { key: f.beta })
        expect(got.json.orgId).toBe("beta")
      })
  },
  {
    endpoint: "GET /jobs and GET /jobs/:id",
    check: (f) =>
      Effect.gen(function*() {
        const listed = yield* call(f.base, "GET", "/jobs?limit=1000", { key: f.beta })
        expect(listed.status).toBe(200)
        expect(listed.json.jobs.every((j: any) => j.orgId === "beta")).toBe(true)
        expect(listed.json.jobs.map((j: any) => j.id)).not.toContain(f.acmeJob)
        sameAnswer(
          yield* call(f.base, "GET", `/jobs/${f.acmeJob}`, { key: f.beta }),
          yield* call(f.base, "GET", `/jobs/${missingId}`, { key: f.beta }),
          [f.acmeJob, missingId]
        )
        // a dead job of acme's is no different
        const deadJob = (yield* call(f.base, "GET", `/dlq/${f.acmeDeadLetter}`, { key: f.acme })).json.jobId
        sameAnswer(
          yield* call(f.base, "GET", `/jobs/${deadJob}`, { key: f.beta }),
          yield* call(f.base, "GET", `/jobs/${missingId}`, { key: f.beta }),
          [deadJob, missingId]
        )
      })
  },
  {
    endpoint: "POST /jobs/:id/cancel",
    check: (f) =>
      Effect.gen(function*() {
        const before = yield* acmeRows(f)
        sameAnswer(
          yield* call(f.base, "POST", `/jobs/${f.acmeJob}/cancel`, { key: f.beta }),
          yield* call(f.base, "POST", `/jobs/${missingId}/cancel`, { key: f.beta }),
          [f.acmeJob, missingId]
        )
        expect(yield* acmeRows(f)).toEqual(before)
      })
  },
  {
    endpoint: "POST /jobs/bulk, GET /jobs/actions and the list's search: another org's jobs are neither counted nor changed",
    check: (f) =>
      Effect.gen(function*() {
        const before = yield* acmeRows(f)
        const acmes = (yield* call(f.base, "GET", `/jobs/${f.acmeJob}`, { key: f.acme })).json
        const aimed = { stage: acmes.stage, payload: acmes.payload }
        const nowhere = { stage: "nobody.has.this.stage", payload: acmes.payload }
        for (const dryRun of [true, false]) {
          const foreign = yield* call(f.base, "POST", "/jobs/bulk", { key: f.beta, body: { filter: aimed, action: "cancel", dryRun } })
          const missing = yield* call(f.base, "POST", "/jobs/bulk", { key: f.beta, body: { filter: nowhere, action: "cancel", dryRun } })
          expect(foreign.status).toBe(200)
          expect(foreign.json.matched).toBe(0)
          const { actionId: _a, ...foreignAnswer } = foreign.json
          const { actionId: _b, ...missingAnswer } = missing.json
          expect(foreignAnswer).toEqual(missingAnswer)
        }
        expect(yield* acmeRows(f)).toEqual(before)
        const searched = yield* call(f.base, "GET", `/jobs?payload=${encodeURIComponent(JSON.stringify(acmes.payload))}&limit=1000`, { key: f.beta })
        expect(searched.json.jobs.map((j: any) => j.id)).not.toContain(f.acmeJob)
        // beta's record of its own actions names beta's filters only; acme sees none of them
        const betaActions = (yield* call(f.base, "GET", "/jobs/actions", { key: f.beta })).json.actions
        expect(betaActions.length).toBeGreaterThanOrEqual(2)
        expect(betaActions.every((a: any) => a.filter.org === "beta")).toBe(true)
        expect((yield* call(f.base, "GET", "/jobs/actions", { key: f.acme })).json.actions).toEqual([])
      })
  },
  {
    endpoint: "GET /dlq and GET /dlq/:id",
    check: (f) =>
      Effect.gen(function*() {
        const listed = yield* call(f.base, "GET", "/dlq?all=true&limit=1000", { key: f.beta })
        expect(listed.json.deadLetters.map((d: any) => d.id)).not.toContain(f.acmeDeadLetter)
        sameAnswer(
          yield* call(f.base, "GET", `/dlq/${f.acmeDeadLetter}`, { key: f.beta }),
          yield* call(f.base, "GET", `/dlq/${missingId}`, { key: f.beta }),
          [f.acmeDeadLetter, missingId]
        )
      })
  },
  {
    endpoint: "POST /dlq/:id/retry and POST /dlq/:id/resolve",
    check: (f) =>
      Effect.gen(function*() {
        const before = yield* acmeRows(f)
        sameAnswer(
          yield* call(f.base, "POST", `/dlq/${f.acmeDeadLetter}/retry`, { key: f.beta }),
          yield* call(f.base, "POST", `/dlq/${missingId}/retry`, { key: f.beta }),
          [f.acmeDeadLetter, missingId]
        )
        sameAnswer(
          yield* call(f.base, "POST", `/dlq/${f.acmeDeadLetter}/resolve`, { key: f.beta, body: { notes: "mine now" } }),
          yield* call(f.base, "POST", `/dlq/${missingId}/resolve`, { key: f.beta, body: { notes: "mine now" } }),
          [f.acmeDeadLetter, missingId]
        )
        expect(yield* acmeRows(f)).toEqual(before)
      })
  },
  {
    endpoint: "POST /api/jobs/tick",
    check: (f) =>
      Effect.gen(function*() {
        const acmes = yield* call(f.base, "POST", "/jobs", { key: f.acme, body: { stage: "manual", payload: { n: 1 } } })
        const tick = yield* call(f.base, "POST", "/api/jobs/tick", { key: f.beta, body: { max: 100 } })
        expect(tick.status).toBe(200)
        expect(tick.json.claimed).toBe(0)
        expect((yield* call(f.base, "GET", `/jobs/${acmes.json.id}`, { key: f.acme })).json.status).toBe("queued")
        expect((yield* call(f.base, "POST", "/api/jobs/tick", { key: f.acme, body: { max: 100 } })).json.completed).toBe(1)
      })
  },
  {
    endpoint: "GET /schedules and GET /schedules/:name",
    check: (f) =>
      Effect.gen(function*() {
        const listed = yield* call(f.base, "GET", "/schedules", { key: f.beta })
        expect(listed.status).toBe(200)
        expect(listed.json.schedules.map((s: any) => s.name)).not.toContain(f.acmeSchedule)
        expect(listed.json.schedules.every((s: any) => s.orgId === "beta")).toBe(true)
        sameAnswer(
          yield* call(f.base, "GET", `/schedules/${f.acmeSchedule}`, { key: f.beta }),
          yield* call(f.base, "GET", `/schedules/${missingSchedule}`, { key: f.beta }),
          [f.acmeSchedule, missingSchedule]
        )
        expect((yield* call(f.base, "GET", `/schedules/${missingSchedule}`, { key: f.beta })).status).toBe(404)
        // the system's schedules (no org) are no tenant's
        const systemName = Housekeeping.schedules[0]!.name
        sameAnswer(
          yield* call(f.base, "GET", `/schedules/${systemName}`, { key: f.beta }),
          yield* call(f.base, "GET", `/schedules/${missingSchedule}`, { key: f.beta }),
          [systemName, missingSchedule]
        )
        // acme reads its own
        expect((yield* call(f.base, "GET", `/schedules/${f.acmeSchedule}`, { key: f.acme })).json.payload).toEqual({ message: "acme-nightly" })
      })
  },
  {
    endpoint: "POST /schedules/:name/enable, /disable, /run-now and DELETE /schedules/:name",
    check: (f) =>
      Effect.gen(function*() {
        const before = yield* acmeRows(f)
        expect(before.schedules.map((s: any) => s.name)).toContain(f.acmeSchedule)
        const systemName = Housekeeping.schedules[0]!.name
        const [systemBefore] = yield* owner((sql) => sql`select * from schedules where org_key = '' and name = ${systemName}`)
        for (const [method, suffix] of [["POST", "/disable"], ["POST", "/enable"], ["POST", "/run-now"], ["DELETE", ""]] as const) {
          const missing = yield* call(f.base, method, `/schedules/${missingSchedule}${suffix}`, { key: f.beta })
          expect([method, suffix, missing.status]).toEqual([method, suffix, 404])
          sameAnswer(yield* call(f.base, method, `/schedules/${f.acmeSchedule}${suffix}`, { key: f.beta }), missing, [f.acmeSchedule, missingSchedule])
          sameAnswer(yield* call(f.base, method, `/schedules/${systemName}${suffix}`, { key: f.beta }), missing, [systemName, missingSchedule])
        }
        // acme's schedule is as it was (not disabled, not removed, nothing fired), and so is the system's
        expect(yield* acmeRows(f)).toEqual(before)
        expect(yield* owner((sql) => sql`select * from schedules where org_key = '' and name = ${systemName}`)).toEqual([systemBefore])
      })
  },
  {
    endpoint: "PUT /schedules/:name: a name acme uses is beta's to use, exactly as if nobody had it",
    check: (f) =>
      Effect.gen(function*() {
        const before = yield* acmeRows(f)
        const fresh = "beta-fresh-schedule"
        const body = { stage: EchoStage.name, payload: { message: "beta's" }, cron: "0 3 * * *" }
        const taken = yield* call(f.base, "PUT", `/schedules/${f.acmeSchedule}`, { key: f.beta, body })
        const free = yield* call(f.base, "PUT", `/schedules/${fresh}`, { key: f.beta, body })
        expect([taken.status, free.status]).toEqual([200, 200])
        const timeless = ({ name: _n, createdAt: _c, updatedAt: _u, ...rest }: any) => rest
        expect(timeless(taken.json)).toEqual(timeless(free.json))
        expect(taken.json).toMatchObject({ name: f.acmeSchedule, orgId: "beta", payload: { message: "beta's" } })
        // each org reads its own under the one name; acme's is untouched
        expect(yield* acmeRows(f)).toEqual(before)
        expect((yield* call(f.base, "GET", `/schedules/${f.acmeSchedule}`, { key: f.acme })).json.payload).toEqual({ message: "acme-nightly" })
        expect((yield* call(f.base, "GET", `/schedules/${f.acmeSchedule}`, { key: f.beta })).json.payload).toEqual({ message: "beta's" })
        // beta's changes and removal reach beta's schedule only
        expect((yield* call(f.base, "POST", `/schedules/${f.acmeSchedule}/disable`, { key: f.beta })).json).toMatchObject({ orgId: "beta", enabled: false })
        for (const name of [f.acmeSchedule, fresh]) {
          expect((yield* call(f.base, "DELETE", `/schedules/${name}`, { key: f.beta })).status).toBe(200)
        }
        expect(yield* acmeRows(f)).toEqual(before)
        expect((yield* call(f.base, "GET", "/schedules", { key: f.beta })).json.schedules).toEqual([])
      })
  },
  {
    endpoint: "PUT /schedules/:name with an internal stage: the unknown stage's 400, and nothing written",
    check: (f) =>
      Effect.gen(function*() {
        const [countBefore] = yield* owner((sql) => sql<Array<{ n: number }>>`select count(*)::int as n from schedules`)
        const put = (stage: string, payload: unknown) =>
          call(f.base, "PUT", "/schedules/beta-sneaky", { key: f.beta, body: { stage, payload, cron: "* * * * *" } })
        const unknown = yield* put("no_such_stage", {})
        expect(unknown.status).toBe(400)
        expect(internalStages).toContain(Housekeeping.stageName)
        for (const name of internalStages) {
          const refused = yield* put(name, attackPayload(name, f) ?? (name === Housekeeping.stageName ? { task: "reap-expired" } : {}))
          expect([name, refused.status]).toEqual([name, 400])
          expect(refused.text.replace(JSON.stringify(name).slice(1, -1), "no_such_stage")).toBe(unknown.text)
          expect(unknown.json.message).not.toContain(name)
        }
        expect(yield* owner((sql) => sql<Array<{ n: number }>>`select count(*)::int as n from schedules`)).toEqual([countBefore])
      })
  },
  {
    endpoint: "POST /calls (a URI) and GET /calls/:id",
    check: (f) =>
      Effect.gen(function*() {
        const storage = yield* Storage.Storage
        const before = yield* acmeRows(f)
        const [callsBefore] = yield* owner((sql) => sql<Array<{ n: number }>>`select count(*)::int as n from calls`)
        const acmesObject = yield* storage.uri("orgs/acme/inbox/recording.wav")
        const nothing = yield* storage.uri("orgs/beta/inbox/no-such-recording.wav")
        const acmesNothing = yield* storage.uri("orgs/acme/inbox/no-such-recording.wav")
        const refused = yield* call(f.base, "POST", "/calls", { key: f.beta, body: { uri: acmesObject } })
        expect(refused.status).toBe(400)
        // the same words for acme's object, acme's nothing and beta's own nothing; no path in any of them
        for (const other of [nothing, acmesNothing]) {
          expect((yield* call(f.base, "POST", "/calls", { key: f.beta, body: { uri: other } })).text).toBe(refused.text)
        }
        expect(refused.text).not.toContain(workDir)
        expect(refused.text).not.toContain("recording.wav")
        expect(yield* owner((sql) => sql<Array<{ n: number }>>`select count(*)::int as n from calls`)).toEqual([callsBefore])
        sameAnswer(
          yield* call(f.base, "GET", `/calls/${f.acmeCall}`, { key: f.beta }),
          yield* call(f.base, "GET", `/calls/${missingUuid}`, { key: f.beta }),
          [f.acmeCall, missingUuid]
        )
        // acme itself may use its own object, and sees keys relative to its prefix
        const own = yield* call(f.base, "POST", "/calls", { key: f.acme, body: { uri: acmesObject } })
        expect(own.status).toBe(201)
        const got = yield* call(f.base, "GET", `/calls/${own.json.id}`, { key: f.acme })
        expect(got.json.sourceKey).toBe("inbox/recording.wav")
        expect((yield* call(f.base, "GET", `/calls/${own.json.id}`, { key: f.beta })).status).toBe(404)
        expect(yield* acmeRows(f)).toEqual(before)
      })
  },
  {
    endpoint: "POST /calls (an upload) lands in the caller's org",
    check: (f) =>
      Effect.gen(function*() {
        const form = new FormData()
        form.append("file", new Blob([new Uint8Array(512).fill(1)]), "b.wav")
        const created = yield* call(f.base, "POST", "/calls", { key: f.beta, rawBody: form })
        expect(created.status).toBe(201)
        const [row] = yield* owner((sql) => sql<Array<{ org_id: string; source_key: string }>>`select org_id, source_key from calls where id = ${created.json.id}`)
        expect(row!.org_id).toBe("beta")
        expect(row!.source_key.startsWith("orgs/beta/")).toBe(true)
        expect((yield* call(f.base, "GET", `/calls/${created.json.id}`, { key: f.acme })).status).toBe(404)
      })
  }
]

/** What beta, through the operator's CLI path, asks each stage to do to acme's subject; null: no subject. */
const attackPayload = (stage: string, f: Fixture): unknown => {
  switch (stage) {
    case "extract_audio":
    case "transcribe_start":
    case "analyze":
      return { callId: f.acmeCall }
    case "transcribe_poll":
      return { callId: f.acmeCall, operationId: "op-1", startedAt: new Date().toISOString(), audioDurationMs: 1000 }
    case "transcribe_document":
      return { documentId: f.acmeDocument }
    default:
      return null
  }
}

const allStageNames = known.map((s) => s.name)

describe("tenancy: two orgs through every endpoint and every stage", () => {
  layer(world, { excludeTestServices: true, timeout: 120_000 })((it) => {
    for (const row of endpoints) {
      it.effect(`${row.endpoint}: nothing of acme's is read, written, collided with or revealed to beta`, () =>
        Effect.flatMap(setUp, row.check))
    }

    for (const name of allStageNames) {
      it.effect(`stage ${name}: tenants submit it only when public; acme's subject is out of beta's reach in the worker`, () =>
        Effect.gen(function*() {
          const f = yield* setUp
          const stage = known.find((s) => s.name === name)!
          const valid = attackPayload(name, f) ?? (name === manual.name ? { n: 1 } : {})
          const submitted = yield* call(f.base, "POST", "/jobs", { key: f.beta, body: { stage: name, payload: valid } })
          const unknown = yield* call(f.base, "POST", "/jobs", { key: f.beta, body: { stage: "no_such_stage", payload: {} } })
          if (stage.visibility === "internal") {
            // exactly the unknown stage's answer, its name aside, and no internal name in either
            expect(submitted.status).toBe(400)
            expect(submitted.text.replace(JSON.stringify(name).slice(1, -1), "no_such_stage")).toBe(unknown.text)
          } else {
            expect([name, submitted.status]).toEqual([name, 201])
          }
          for (const internal of internalStages) expect(unknown.json.message).not.toContain(internal)

          const payload = attackPayload(name, f)
          if (payload === null) return
          // an operator (the CLI) may enqueue anything: beta's job naming acme's subject dead-letters in the real
          // worker with the same words as a subject that does not exist, and acme's rows stay exactly as they were
          const before = yield* acmeRows(f)
          const queue = yield* Queue.Queue
          const job = yield* Submit.submit(known, { stage: name, payload, orgId: "beta", maxAttempts: 1 }).pipe(
            Effect.provideService(Queue.Queue, queue)
          )
          const dead = yield* eventually(
            call(f.base, "GET", `/jobs/${job.id}`, { key: f.beta }),
            (r) => r.json?.status === "dead"
          )
          expect(dead.json.status).toBe("dead")
          const subject = name === "transcribe_document" ? `document ${f.acmeDocument}` : `call ${f.acmeCall}`
          expect(dead.json.lastError).toBe(`${subject} does not exist`)
          expect(yield* acmeRows(f)).toEqual(before)
        }))
    }

    it.effect("stage documents_sweep: owner-level by name, across orgs; it never lands in a tenant's space", () =>
      Effect.gen(function*() {
        const f = yield* setUp
        const queue = yield* Queue.Queue
        // the sweep runs from its (system) schedule, or by name as the owner: its job has no org
        const job = yield* Submit.submit(known, { stage: DocumentsSweep.stageName, payload: {} }).pipe(Effect.provideService(Queue.Queue, queue))
        const [row] = yield* owner((sql) => sql<Array<{ org_id: string | null }>>`select org_id from jobs where id = ${job.id}`)
        expect(row?.org_id ?? null).toBeNull()
        expect((yield* call(f.base, "GET", "/jobs?stage=documents_sweep", { key: f.beta })).json.jobs).toEqual([])
        expect((yield* call(f.base, "GET", "/schedules", { key: f.beta })).json.schedules).toEqual([])
        // and it runs (as the owner) to completion
        yield* eventually(
          owner((sql) => sql<Array<{ id: string }>>`select id from jobs where id = ${job.id}`),
          (rows) => rows.length === 0
        )
      }))

    it.effect("a handler's queries see only its job's org's rows, as the tenant, one short transaction per statement", () =>
      Effect.gen(function*() {
        const f = yield* setUp
        const queue = yield* Queue.Queue
        const betas = yield* call(f.base, "POST", "/jobs", { key: f.beta, body: { stage: "peek", payload: {} } })
        const ownerJob = yield* Submit.submit(known, { stage: "peek", payload: {} }).pipe(Effect.provideService(Queue.Queue, queue))
        const seen = yield* eventually(
          Effect.sync(() => peeks.filter((p) => p.job === betas.json.id || p.job === ownerJob.id)),
          (found) => found.length === 2
        )
        const asBeta = seen.find((p) => p.job === betas.json.id)!
        expect(asBeta.jobOrgs).toEqual(["beta"])
        expect(asBeta.callOrgs).toEqual(["beta"])
        expect(asBeta.role).toBe(Db.tenantRole)
        // two statements, two transactions: nothing was held open across the wait between them
        expect(asBeta.txids[0]).not.toBe(asBeta.txids[1])
        // a job with no org runs as the owner, as it always has: every org's rows
        const asOwner = seen.find((p) => p.job === ownerJob.id)!
        expect(asOwner.role).not.toBe(Db.tenantRole)
        expect(asOwner.jobOrgs).toEqual(expect.arrayContaining(["acme", "beta"]))
        expect(asOwner.callOrgs).toEqual(expect.arrayContaining(["acme", "beta"]))
      }))

    // last: it locks this test client's address out for the rest of the window (for failing keys only)
    it.effect("failed authentications are limited per client and key prefix: 429 with Retry-After, a valid key still served", () =>
      Effect.gen(function*() {
        const f = yield* setUp
        const replies: Array<Reply> = []
        for (let i = 0; i < 25; i++) replies.push(yield* call(f.base, "GET", "/jobs", { key: `pgf_000000000000_${"A".repeat(42)}${i % 10}` }))
        const statuses = replies.map((r) => r.status)
        expect(statuses.slice(0, 20)).toEqual(Array(20).fill(401))
        expect(statuses.slice(20)).toEqual(Array(5).fill(429))
        const limited = replies[24]!
        expect(limited.json._tag).toBe("TooManyRequests")
        expect(Number(limited.headers.get("retry-after"))).toBeGreaterThan(0)
        // the key is checked first: a valid one from the same address is served
        expect((yield* call(f.base, "GET", "/jobs", { key: f.acme })).status).toBe(200)
        expect((yield* call(f.base, "GET", "/healthz")).status).toBe(200)
      }))
  })
})
