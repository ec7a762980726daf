/**
 * `/schedules` over a real server and Postgres: a tenant creates, reads, lists, disables, enables, runs now and
 * removes its org's schedules; another org, and the system schedules (no org), are not there (404); bad input is
 * a 400 with the field named. A schedule every second fires its job through the server's own worker.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import * as PgSchedules from "../../packages/pgfiber/src/queue/PgSchedules.js"
import * as Schedules from "../../packages/pgfiber/src/queue/Schedules.js"
import { layerDb, rawSql } from "../support/pg.js"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import { baseUrl, call, eventually, layerService, newKey } from "./support.js"

describe("HTTP schedules", () => {
  layer(layerService(layerDb()), { excludeTestServices: true, timeout: 180_000 })((it) => {
    it.effect("a tenant manages its own org's schedules; other orgs' and system schedules are not there", () =>
      Effect.gen(function*() {
        const base = yield* baseUrl
        const a = yield* newKey({ orgId: "org-a" })
        const b = yield* newKey({ orgId: "org-b" })
        // a system schedule, as the CLI or a code declaration makes it
        const system = yield* Schedules.make(yield* PgSchedules.makeStore)
        yield* system.put({ name: "system-job", stage: "manual", cron: "0 * * * *", payload: { n: 0 } })

        const put = yield* call(base, "PUT", "/schedules/nightly", {
          key: a,
          body: { stage: "manual", payload: { n: 1 }, cron: "30 2 * * *", timeZone: "Europe/Berlin" }
        })
        expect(put.status).toBe(200)
        expect(put.json).toMatchObject({ name: "nightly", orgId: "org-a", stage: "manual", enabled: true, source: "runtime", catchUp: "skip" })
        expect(new Date(put.json.nextTickAt).getTime()).toBeGreaterThan(Date.now())
        expect((yield* call(base, "GET", "/schedules", { key: a })).json.schedules.map((s: any) => s.name)).toEqual(["nightly"])
        expect((yield* call(base, "GET", "/schedules", { key: b })).json.schedules).toEqual([])
        expect((yield* call(base, "GET", "/schedules/nightly", { key: b })).status).toBe(404)
        expect((yield* call(base, "GET", "/schedules/system-job", { key: a })).status).toBe(404)
        expect((yield* call(base, "POST", "/schedules/nightly/disable", { key: b })).status).toBe(404)
        expect((yield* call(base, "DELETE", "/schedules/system-job", { key: a })).status).toBe(404)

        const disabled = yield* call(base, "POST", "/schedules/nightly/disable", { key: a })
        expect([disabled.status, disabled.json.enabled]).toEqual([200, false])
        const enabled = yield* call(base, "POST", "/schedules/nightly/enable", { key: a })
        expect([enabled.status, enabled.json.enabled]).toEqual([200, true])
        const ran = yield* call(base, "POST", "/schedules/nightly/run-now", { key: a })
        expect(ran.status).toBe(201)
        const job = yield* call(base, "GET", `/jobs/${ran.json.id}`, { key: a })
        expect(job.json).toMatchObject({ stage: "manual", orgId: "org-a", payload: { n: 1 } })

        // bad input: 400 with the field
        const badCron = yield* call(base, "PUT", "/schedules/x", { key: a, body: { stage: "manual", payload: { n: 1 }, cron: "* *" } })
        expect([badCron.status, badCron.json._tag, badCron.json.field]).toEqual([400, "BadRequest", "cron"])
        const badZone = yield* call(base, "PUT", "/schedules/x", { key: a, body: { stage: "manual", payload: { n: 1 }, cron: "* * * * *", timeZone: "Nowhere/Zone" } })
        expect([badZone.status, badZone.json.field]).toEqual([400, "timeZone"])
        const badPayload = yield* call(base, "PUT", "/schedules/x", { key: a, body: { stage: "manual", payload: { n: "x" }, cron: "* * * * *" } })
        expect([badPayload.status, badPayload.json.field]).toEqual([400, "payload"])
        const badStage = yield* call(base, "PUT", "/schedules/x", { key: a, body: { stage: "nope", everyMs: 5000 } })
        expect([badStage.status, badStage.json.field]).toEqual([400, "stage"])
        const badName = yield* call(base, "PUT", "/schedules/bad%20name", { key: a, body: { stage: "manual", payload: { n: 1 }, everyMs: 5000 } })
        expect([badName.status, badName.json.field]).toEqual([400, "name"])

        const removed = yield* call(base, "DELETE", "/schedules/nightly", { key: a })
        expect([removed.status, removed.json]).toEqual([200, { name: "nightly", removed: true }])
        expect((yield* call(base, "DELETE", "/schedules/nightly", { key: a })).status).toBe(404)
        expect((yield* call(base, "GET", "/schedules/nightly")).status).toBe(401)
      }))

    it.effect("a schedule every second, made over HTTP, is picked up by the running worker (NOTIFY) and fires", () =>
      Effect.gen(function*() {
        const base = yield* baseUrl
        const db = yield* Db.Db
        const a = yield* newKey({ orgId: "org-tick" })
        const put = yield* call(base, "PUT", "/schedules/heartbeat", { key: a, body: { stage: "echo", payload: { n: 7 }, everyMs: 1000 } })
        expect(put.status).toBe(200)
        const sql = rawSql(db.schema)
        const logged = yield* eventually(
          Effect.promise(() => sql<Array<{ last_tick_at: Date | null }>>`select last_tick_at from schedules where name = 'heartbeat'`),
          (rows) => rows[0]?.last_tick_at != null
        )
        expect(logged[0]!.last_tick_at).not.toBeNull()
        // and its jobs ran (echo completes them): none is left behind
        yield* eventually(Effect.promise(() => sql`select 1 from jobs where stage = 'echo' and org_id = 'org-tick'`), (rows) => rows.length === 0)
        yield* Effect.promise(() => sql.end({ timeout: 5 }))
      }))
  })
})
