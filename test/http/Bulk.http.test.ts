/**
 * `POST /jobs/bulk`, `GET /jobs/actions` and the job list's search over a real server and Postgres: an org's key
 * counts and changes only its org's jobs of public stages (another org's, or an internal stage's, that match the
 * same filter are neither counted nor touched), a dry run changes nothing, and bad filters are 400 with the field.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import { layerDb } from "../support/pg.js"
import { baseUrl, call, layerService, newKey, query } from "./support.js"

/** Jobs written as an operator would, straight into the table: n per org, half with customer 42. */
const seed = (schema: string, stage: string, org: string, n: number, extra = "") =>
  query(schema, `
    insert into jobs (stage, org_id, payload${extra === "" ? "" : ", last_error, available_at"})
    select '${stage}', '${org}', jsonb_build_object('customer', case when i % 2 = 0 then 42 else 7 end, 'i', i)${extra === "" ? "" : `, ${extra}`}
    from generate_series(1, ${n}) as s(i)`)

const count = (schema: string, where: string) =>
  Effect.map(query<{ n: number }>(schema, `select count(*)::int as n from jobs where ${where}`), (r) => r[0]!.n)

describe("HTTP bulk actions and search", () => {
  layer(layerService(layerDb()), { excludeTestServices: true, timeout: 180_000 })((it) => {
    it.effect("an org's bulk cancel counts and cancels only its own jobs of public stages", () =>
      Effect.gen(function*() {
        const base = yield* baseUrl
        const { schema } = yield* Db.Db
        const a = yield* newKey({ orgId: "org-a" })
        const b = yield* newKey({ orgId: "org-b" })
        yield* seed(schema, "manual", "org-a", 20)
        yield* seed(schema, "manual", "org-b", 30)
        // an internal stage's jobs of org-a: a tenant neither counts nor cancels them
        yield* seed(schema, "extract_audio", "org-a", 8)
        // a stage this process does not know (a user's own): any stage with jobs in the database is acted on
        yield* seed(schema, "probe.work", "org-a", 6)

        const filter = { payload: { customer: 42 } }
        const previewA = yield* call(base, "POST", "/jobs/bulk", { key: a, body: { filter, action: "cancel", dryRun: true } })
        expect(previewA.status).toBe(200)
        expect(previewA.json).toEqual({ action: "cancel", dryRun: true, matched: 13 })
        // no dryRun flag: still only a count
        const implicit = yield* call(base, "POST", "/jobs/bulk", { key: b, body: { filter: { stage: "manual", payload: "customer=42" }, action: "cancel" } })
        expect(implicit.json).toEqual({ action: "cancel", dryRun: true, matched: 15 })
        // naming the internal stage is the same as naming one with no jobs
        const internal = yield* call(base, "POST", "/jobs/bulk", { key: a, body: { filter: { stage: "extract_audio" }, action: "cancel", dryRun: true } })
        const nowhere = yield* call(base, "POST", "/jobs/bulk", { key: a, body: { filter: { stage: "no.such.stage" }, action: "cancel", dryRun: true } })
        expect(internal.json).toEqual(nowhere.json)
        expect(internal.json.matched).toBe(0)

        const done = yield* call(base, "POST", "/jobs/bulk", { key: a, body: { filter, action: "cancel", dryRun: false } })
        expect(done.status).toBe(200)
        expect(done.json).toMatchObject({ action: "cancel", dryRun: false, matched: 13, affected: 13, cancelling: 0 })
        expect(yield* count(schema, "org_id = 'org-a' and stage = 'manual' and payload @> '{\"customer\":42}'")).toBe(0)
        expect(yield* count(schema, "org_id = 'org-a' and stage = 'probe.work' and payload @> '{\"customer\":42}'")).toBe(0)
        expect(yield* count(schema, "org_id = 'org-a' and stage = 'extract_audio'")).toBe(8)
        expect(yield* count(schema, "org_id = 'org-b'")).toBe(30)
        expect(yield* count(schema, "org_id = 'org-a' and stage = 'manual'")).toBe(10)

        // the record: who and what, seen by its org only
        const actionsA = yield* call(base, "GET", "/jobs/actions", { key: a })
        expect(actionsA.json.actions).toHaveLength(1)
        expect(actionsA.json.actions[0]).toMatchObject({ action: "cancel", matched: 13, affected: 13, filter: { payload: { customer: 42 }, org: "org-a" } })
        expect(actionsA.json.actions[0].actor).toMatch(/^key:\d+$/)
        expect((yield* call(base, "GET", "/jobs/actions", { key: b })).json.actions).toEqual([])
      }))

    it.effect("retry, run-now and priority through the API; the list searches payload and error text", () =>
      Effect.gen(function*() {
        const base = yield* baseUrl
        const { schema } = yield* Db.Db
        const c = yield* newKey({ orgId: "org-c" })
        const d = yield* newKey({ orgId: "org-d" })
        yield* seed(schema, "manual", "org-c", 6, "'gateway TIMEOUT', now() + interval '1 hour'")
        yield* seed(schema, "manual", "org-d", 6, "'gateway TIMEOUT', now() + interval '1 hour'")

        const listed = yield* call(base, "GET", "/jobs?stage=manual&payload=customer%3D42&error=timeout", { key: c })
        expect(listed.status).toBe(200)
        expect(listed.json.jobs.map((j: any) => [j.orgId, j.payload.customer])).toEqual([["org-c", 42], ["org-c", 42], ["org-c", 42]])
        const json = yield* call(base, "GET", `/jobs?payload=${encodeURIComponent(JSON.stringify({ i: 1 }))}`, { key: c })
        expect(json.json.jobs.map((j: any) => j.payload)).toEqual([{ customer: 7, i: 1 }])
        expect((yield* call(base, "GET", "/jobs?error=no%20such%20error", { key: c })).json.jobs).toEqual([])

        const retried = yield* call(base, "POST", "/jobs/bulk", { key: c, body: { filter: { error: "timeout", payload: { customer: 42 } }, action: "retry", dryRun: false } })
        expect(retried.json).toMatchObject({ matched: 3, affected: 3 })
        expect(yield* count(schema, "org_id = 'org-c' and available_at <= now()")).toBe(3)
        const ran = yield* call(base, "POST", "/jobs/bulk", { key: c, body: { filter: { status: "delayed" }, action: "run-now", dryRun: false } })
        expect(ran.json).toMatchObject({ matched: 3, affected: 3 })
        const prio = yield* call(base, "POST", "/jobs/bulk", { key: c, body: { filter: { stage: "manual" }, action: "priority", priority: "fast", dryRun: false } })
        expect(prio.json).toMatchObject({ matched: 6, affected: 6 })
        expect(yield* count(schema, "org_id = 'org-c' and priority = 10")).toBe(6)
        // org-d's identical jobs: untouched
        expect(yield* count(schema, "org_id = 'org-d' and available_at > now() and priority = 50")).toBe(6)
        expect((yield* call(base, "GET", "/jobs?payload=customer%3D42", { key: d })).json.jobs.every((j: any) => j.orgId === "org-d")).toBe(true)
      }))

    it.effect("bad filters and actions are 400 with a JSON body naming the field; nothing changes", () =>
      Effect.gen(function*() {
        const base = yield* baseUrl
        const { schema } = yield* Db.Db
        const e = yield* newKey({ orgId: "org-e" })
        yield* seed(schema, "manual", "org-e", 4)
        const bulk = (body: unknown) => call(base, "POST", "/jobs/bulk", { key: e, body })
        const cases: ReadonlyArray<readonly [unknown, string | undefined]> = [
          [{ filter: { payload: "{oops" }, action: "cancel", dryRun: false }, "payload"],
          [{ filter: { payload: "customer" }, action: "cancel", dryRun: false }, "payload"],
          [{ filter: { olderThan: "yesterday" }, action: "cancel", dryRun: false }, "olderThan"],
          [{ filter: { stage: "Not A Stage" }, action: "cancel", dryRun: false }, "stage"],
          [{ filter: { error: "x".repeat(500) }, action: "cancel", dryRun: false }, "error"],
          [{ filter: {}, action: "cancel", dryRun: false }, "filter"],
          [{ filter: { stage: "manual" }, action: "priority", dryRun: false }, "priority"],
          [{ filter: { stage: "manual" }, action: "explode" }, undefined],
          [{ filter: { status: "finished" }, action: "cancel" }, undefined],
          [{ filter: { stage: "manual" }, action: "priority", priority: 101 }, undefined],
          [{ filter: "everything", action: "cancel" }, undefined]
        ]
        for (const [body, field] of cases) {
          const r = yield* bulk(body)
          expect(r.status, JSON.stringify(body)).toBe(400)
          expect(typeof r.json.message).toBe("string")
          if (field !== undefined) expect([r.json._tag, r.json.field]).toEqual(["BadRequest", field])
        }
        const badList = yield* call(base, "GET", "/jobs?payload=%7Boops", { key: e })
        expect([badList.status, badList.json.field]).toEqual([400, "payload"])
        expect(yield* count(schema, "org_id = 'org-e'")).toBe(4)
        // without a key: 401, as every jobs endpoint
        expect((yield* call(base, "POST", "/jobs/bulk", { body: { filter: { stage: "manual" }, action: "cancel" } })).status).toBe(401)
      }))
  })
})
