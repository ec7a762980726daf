/**
 * What open dashboards cost an idle database: one pgfiber server (API + dashboard, no worker: nothing else
 * talks to the database) on its own database, then 0, 1 and `viewers` signed-in live overviews (server-sent
 * event streams, as a browser holds them) for a window each, counting the database's statements with
 * pg_stat_statements. The live view is one shared source per server, so the count must not grow with viewers.
 */
import { Duration, Effect, Exit, Layer, Redacted, Scope } from "effect"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import * as ApiKeys from "../packages/service/src/auth/ApiKeys.js"
import * as Server from "../packages/service/src/http/Server.js"
import * as Db from "../packages/pgfiber/src/layers/Db.js"
import * as Storage from "../packages/media/src/layers/Storage.js"
import * as Migrations from "../packages/pgfiber/src/queue/Migrations.js"
import * as PgQueue from "../packages/pgfiber/src/queue/PgQueue.js"
import * as Events from "../packages/pgfiber/src/runtime/Events.js"
import * as Submit from "../packages/pgfiber/src/runtime/Submit.js"
import { HttpServer } from "@effect/platform"
import * as EchoStage from "../packages/service/src/stages/echo/EchoStage.js"
import { type Cluster, resetStatements, sleep, statementCount } from "./lib.js"

export interface DashboardsResult {
  readonly windowMs: number
  /** Statements per second during each window, by the number of open dashboards. */
  readonly statementsPerSecond: Record<string, number>
  /** What `viewers` dashboards add over none. */
  readonly addedPerSecond: number
  readonly viewers: number
}

const stages = [EchoStage.stage]

export const dashboards = async (cluster: Cluster, run: number, options: { windowMs: number; viewers: number }): Promise<DashboardsResult> => {
  const name = `dash_${run}_${process.pid}`
  const url = await cluster.createDatabase(name)
  const storageDir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "pgfiber-bench-dash-"))
  const scope = Effect.runSync(Scope.make())
  const streams: Array<AbortController> = []
  try {
    const layer = Server.layer({
      host: "127.0.0.1", port: 0, admin: { host: "127.0.0.1", port: 0 }, maxBodyBytes: 65_536, maxUploadBytes: 65_536,
      devTick: false, workerId: "bench-dashboards",
      // the shipped pace (Live.defaults): a snapshot at most once a second, every 10 s when nothing happens
      dashboard: { basePath: "/dashboard", sessionTtl: Duration.hours(1) }
    }).pipe(
      Layer.provideMerge(Storage.layerFs(storageDir).pipe(Layer.orDie)),
      Layer.provideMerge(Layer.succeed(Submit.KnownStages, stages)),
      Layer.provideMerge(ApiKeys.layer),
      Layer.provideMerge(PgQueue.layer({ knownStages: stages.map((s) => s.name) })),
      Layer.provideMerge(Layer.merge(
        Layer.scoped(Db.Db, Effect.tap(Db.make({ url: Redacted.make(url), schema: "pgfiber", poolMax: 4 }), (db) =>
          Effect.orDie(Migrations.migrate().pipe(Effect.provideService(Db.Db, db))))),
        Events.layer()
      ))
    )
    const context = await Effect.runPromise(Layer.buildWithScope(layer, scope))
    const address = Effect.runSync(Effect.provide(HttpServer.HttpServer, context)).address
    if (address._tag !== "TcpAddress") throw new Error("expected a TCP address")
    const base = `http://127.0.0.1:${address.port}/dashboard`
    const { token } = await Effect.runPromise(Effect.provide(Effect.flatMap(ApiKeys.ApiKeys, (k) => k.create({ admin: true })), context))

    const signIn = await fetch(`${base}/login`, {
      method: "POST", redirect: "manual",
      headers: { "content-type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams({ key: Redacted.value(token) })
    })
    const cookie = (signIn.headers.get("set-cookie") ?? "").split(";")[0]!
    if (!cookie.startsWith("pgfiber_dashboard=")) throw new Error(`sign-in failed: ${signIn.status}`)

    /** Opens one live overview and reads it until aborted; resolves once its first snapshot arrived. */
    const open = async () => {
      const abort = new AbortController()
      streams.push(abort)
      const response = await fetch(`${base}/live`, { headers: { cookie }, signal: abort.signal })
      const reader = response.body!.getReader()
      const decoder = new TextDecoder()
      let text = ""
      while (!text.includes("event: overview")) {
        const { done, value } = await reader.read()
        if (done) throw new Error("the live stream ended")
        text += decoder.decode(value)
      }
      void (async () => {
        try {
          for (;;) if ((await reader.read()).done) return
        } catch {
          // aborted
        }
      })()
    }

    const measure = async () => {
      await sleep(1500) // what opening caused (sign-in check, first snapshot) is over
      await resetStatements(cluster.admin)
      await sleep(options.windowMs)
      return (await statementCount(cluster.admin, name)) / (options.windowMs / 1000)
    }

    const perSecond: Record<string, number> = {}
    perSecond["0"] = await measure()
    await open()
    perSecond["1"] = await measure()
    for (let i = 1; i < options.viewers; i++) await open()
    perSecond[String(options.viewers)] = await measure()
    return {
      windowMs: options.windowMs,
      statementsPerSecond: perSecond,
      addedPerSecond: perSecond[String(options.viewers)]! - perSecond["0"]!,
      viewers: options.viewers
    }
  } finally {
    streams.forEach((s) => s.abort())
    await Effect.runPromise(Scope.close(scope, Exit.void))
    Fs.rmSync(storageDir, { recursive: true, force: true })
    await cluster.dropDatabase(name)
  }
}
