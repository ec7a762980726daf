/**
 * DATABASE_READ_URL: the reads of the API and the dashboard (job lists, the queue statistics behind /metrics) go to
 * the database it names, and writes still go to the primary. The "replica" here is another database on the same
 * server, migrated with the same schema and filled differently, so which one answered shows in what comes back.
 */
import { describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Effect, Exit, Layer, Redacted } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as Migrations from "../../packages/pgfiber/src/queue/Migrations.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Reads from "../../packages/pgfiber/src/queue/Reads.js"
import { databaseUrl, freshSchemaName, layerDb, rawSql } from "../support/pg.js"
import { adminUrl, baseUrl, call, layerService, newKey } from "./support.js"

/** A second database on the test server, with `schema` migrated in it; dropped with the scope. */
const replicaDatabase = (schema: string) =>
  Effect.gen(function*() {
    const name = freshSchemaName("replica")
    yield* Effect.acquireRelease(
      Effect.promise(async () => {
        const sql = rawSql()
        try {
          await sql.unsafe(`create database ${name}`)
        } finally {
          await sql.end({ timeout: 5 })
        }
      }),
      () =>
        Effect.promise(async () => {
          const sql = rawSql()
          try {
            await sql.unsafe(`drop database if exists ${name} with (force)`)
          } finally {
            await sql.end({ timeout: 5 })
          }
        }).pipe(Effect.ignore)
    )
    const url = new URL(databaseUrl())
    url.pathname = `/${name}`
    const db = yield* Db.make({ url: Redacted.make(url.toString()), schema, poolMax: 2 })
    yield* Migrations.migrate().pipe(Effect.provideService(Db.Db, db))
    return { url: url.toString(), db }
  })

const withReadUrl = (value: string) =>
  Layer.setConfigProvider(
    ConfigProvider.fromMap(new Map([["DATABASE_READ_URL", value]])).pipe(ConfigProvider.orElse(() => ConfigProvider.fromEnv()))
  )

describe("DATABASE_READ_URL", () => {
  it.live("the API's job list, /metrics and the dashboard's jobs list read the replica; an enqueue writes to the primary", () =>
    Effect.gen(function*() {
      const schema = freshSchemaName("primary")
      const replica = yield* replicaDatabase(schema)
      // the replica holds three queued `manual` jobs of the org (no worker runs that stage), the primary none
      const replicaQueue = yield* PgQueue.make().pipe(Effect.provideService(Db.Db, replica.db))
      const onReplica = yield* replicaQueue.enqueue([1, 2, 3].map((n) => ({ stage: "manual", orgId: "org-r", payload: { n: 700 + n } })))

      const context = yield* Layer.build(layerService(layerDb({ schema })).pipe(Layer.provide(withReadUrl(replica.url))))
      const api = yield* Effect.provide(baseUrl, context)
      const admin = yield* Effect.provide(adminUrl, context)
      const key = yield* Effect.provide(newKey({ orgId: "org-r", name: "replica" }), context)

      const created = yield* call(api, "POST", "/jobs", { key, body: { stage: "manual", payload: { n: 1 } } })
      expect(created.status).toBe(201)

      // the list comes from the replica: its three jobs, not the one just written
      const listed = yield* call(api, "GET", "/jobs?stage=manual&limit=50", { key })
      expect(listed.status).toBe(200)
      expect(listed.json.jobs.map((j: { id: string }) => j.id)).toEqual(onReplica.map((r) => r.id))
      expect(listed.json.jobs.map((j: { payload: { n: number } }) => j.payload.n)).toEqual([701, 702, 703])

      // the queue statistics too (pgfiber_queue_depth): three ready `manual` jobs, as on the replica
      const metrics = (yield* call(admin, "GET", "/metrics")).text
      expect(metrics).toMatch(/pgfiber_queue_depth\{stage="manual",state="ready"\} 3\b/)

      // the dashboard's jobs list too, signed in with the org's key: the replica's three jobs, newest first
      const signIn = yield* Effect.promise(() =>
        fetch(`${api}/dashboard/login`, {
          method: "POST",
          redirect: "manual",
          headers: { "content-type": "application/x-www-form-urlencoded" },
          body: new URLSearchParams({ key }).toString()
        })
      )
      expect(signIn.status).toBe(303)
      const cookie = (signIn.headers.get("set-cookie") ?? "").split(";")[0]!
      const jobsPage = yield* Effect.promise(() => fetch(`${api}/dashboard/jobs?stage=manual`, { headers: { cookie } }).then((r) => r.text()))
      expect([...jobsPage.matchAll(/data-job="(\d+)"/g)].map((m) => m[1])).toEqual(onReplica.map((r) => r.id).reverse())

      // the write went to the primary, and only there
      const primaryRows = yield* Effect.promise(async () => {
        const sql = rawSql(schema)
        try {
          return await sql<Array<{ n: number }>>`select (payload->>'n')::int as n from jobs where stage = 'manual' order by id`
        } finally {
          await sql.end({ timeout: 5 })
        }
      })
      expect(primaryRows.map((r) => r.n)).toEqual([1])
      const replicaRows = yield* replicaQueue.list({ stage: "manual" })
      expect(replicaRows.map((j) => (j.payload as { n: number }).n)).toEqual([701, 702, 703])
    }).pipe(Effect.scoped), 180_000)

  it.live("a bad DATABASE_READ_URL fails start-up naming the variable", () =>
    Effect.gen(function*() {
      const build = (value: string) =>
        Layer.build(Reads.layer.pipe(Layer.provide(layerDb()), Layer.provide(withReadUrl(value)))).pipe(Effect.scoped, Effect.exit)
      const notAUrl = yield* build("mysql://somewhere/db")
      expect(Exit.isFailure(notAUrl)).toBe(true)
      expect(String(Exit.isFailure(notAUrl) ? notAUrl.cause : "")).toContain("DATABASE_READ_URL")
      // a URL nothing answers on: the probe at start fails, naming the variable
      const nobody = yield* build("postgres://postgres@127.0.0.1:1/none")
      expect(Exit.isFailure(nobody)).toBe(true)
      expect(String(Exit.isFailure(nobody) ? nobody.cause : "")).toContain("DATABASE_READ_URL: cannot connect")
    }), 180_000)
})
