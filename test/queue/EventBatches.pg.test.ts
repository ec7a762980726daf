/**
 * The event log in batches (migration 0023): a statement logs one row per org, stage and kind, at most 1,000 jobs
 * a row, and readers still get one event per job, in order, resumable at any event, also inside a row. And the
 * upgrade from 0020's one-row-per-job log keeps every kept event readable.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Layer, Redacted } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as WebhooksSql from "../../packages/service/src/stages/webhooks/WebhooksSql.js"
import * as EventsSql from "../../packages/pgfiber/src/queue/EventsSql.js"
import * as EventLog from "../../packages/pgfiber/src/queue/EventLog.js"
import * as Migrations from "../../packages/pgfiber/src/queue/Migrations.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import { databaseUrl, dropSchema, freshSchemaName, layerDb, rawSql } from "../support/pg.js"
import { readAll } from "../support/eventLog.js"
import { completeAll } from "../support/settle.js"

const rowsOf = (schema: string, kind: string) =>
  Effect.acquireUseRelease(
    Effect.sync(() => rawSql(schema)),
    (sql) => Effect.promise(() => sql<Array<{ n: number }>>`select cardinality(job_ids) as n from job_events where kind = ${kind} order by id`),
    (sql) => Effect.promise(() => sql.end({ timeout: 5 }))
  ).pipe(Effect.map((rows) => rows.map((r) => r.n)))

const withSql = <A>(schema: string, f: (sql: ReturnType<typeof rawSql>) => PromiseLike<A>) =>
  Effect.acquireUseRelease(
    Effect.sync(() => rawSql(schema)),
    (sql) => Effect.promise(() => Promise.resolve(f(sql))),
    (sql) => Effect.promise(() => sql.end({ timeout: 5 }))
  )

const dataSizesOf = (schema: string, kind: string) =>
  withSql(schema, (sql) => sql<Array<{ n: number | null }>>`select cardinality(data) as n from job_events where kind = ${kind} order by id`)
    .pipe(Effect.map((rows) => rows.map((r) => r.n)))

describe("the event log in batches", () => {
  const schema = freshSchemaName("evbatch")
  it.layer(EventLog.layer.pipe(Layer.provideMerge(PgQueue.layer()), Layer.provideMerge(layerDb({ schema, poolMax: 4 }))), {
    timeout: 120_000
  })((it) => {
    it.effect("a statement's jobs share a row (1,000 at most); readers get each job's events in order and resume anywhere, inside a row too", () =>
      Effect.gen(function*() {
        const log = yield* EventLog.EventLog
        const queue = yield* Queue.Queue
        const start = yield* log.now
        const jobs = yield* queue.enqueue(Array.from({ length: 2500 }, (_, i) => ({ stage: "batched", subjectId: `s${i}` })))
        const claimed = yield* queue.claim("batched", 300, { workerId: "w", leaseFor: Duration.seconds(60) })
        yield* completeAll(queue, claimed.map((j) => ({ id: j.id, lease: j.lease })))

        // the rows: one enqueue statement of 2,500 jobs in three, one claim and one settle of 300 in one each
        expect(yield* rowsOf(schema, "enqueued")).toEqual([1000, 1000, 500])
        expect(yield* rowsOf(schema, "started")).toEqual([300])
        expect(yield* rowsOf(schema, "completed")).toEqual([300])

        // the reader: one event per job and kind, ids unique and rising, in pages that end inside rows
        const events = yield* readAll(log, start, {}, 7).pipe(Effect.map((r) => r.events))
        expect(events.length).toBe(2500 + 300 + 300)
        const ids = events.map((e) => BigInt(e.id))
        expect(ids.every((id, i) => i === 0 || id > ids[i - 1]!)).toBe(true)
        expect(events.slice(0, 2500).map((e) => [e.jobId, e.kind, e.subjectId])).toEqual(
          jobs.map((j, i) => [j.id, "enqueued", `s${i}`])
        )
        const started = events.filter((e) => e.kind === "started")
        expect(started.map((e) => e.jobId).sort()).toEqual(claimed.map((j) => j.id).sort())
        expect(started.every((e) => e.attempt === 1 && e.data?.["worker"] === "w")).toBe(true)
        // the claim's worker is stored once for its row, and every reader of the log gives it to each event
        expect(yield* dataSizesOf(schema, "started")).toEqual([1])
        const recent = yield* withSql(schema, (sql) => EventsSql.recentEvents(sql, { org: null, stages: null, kinds: ["started"] }, 1000))
        expect(recent.length).toBe(300)
        expect(recent.every((e) => (e.data as Record<string, unknown> | null)?.["worker"] === "w")).toBe(true)
        const [delivery] = yield* withSql(schema, (sql) => WebhooksSql.deliveryParts(sql, "1", started[299]!.id))
        expect(delivery!.event).toMatchObject({ id: started[299]!.id, kind: "started", jobId: started[299]!.jobId, data: { worker: "w" } })
        const byJob = new Map<string, Array<string>>()
        for (const e of events) byJob.set(e.jobId, [...(byJob.get(e.jobId) ?? []), e.kind])
        expect(claimed.every((j) => byJob.get(j.id)?.join() === "enqueued,started,completed")).toBe(true)

        // resuming after an event inside a row (Last-Event-ID) gives exactly the events after it
        for (const at of [0, 999, 1000, 1234, 2600]) {
          const cursor = yield* log.after(events[at]!.id, {})
          const rest = yield* readAll(log, cursor, {}, 500).pipe(Effect.map((r) => r.events))
          expect(rest.map((e) => e.id)).toEqual(events.slice(at + 1).map((e) => e.id))
        }
      }))
  })

  it.scoped("job ids past 2^53 are read back exactly (strings, not numbers)", () =>
    Effect.gen(function*() {
      const schema = freshSchemaName("evbig")
      yield* Effect.addFinalizer(() => dropSchema(schema))
      const db = yield* Db.make({ url: Redacted.make(databaseUrl()), schema, poolMax: 2 })
      yield* Migrations.migrate().pipe(Effect.provideService(Db.Db, db))
      yield* withSql(schema, (sql) => sql`select setval(pg_get_serial_sequence('jobs', 'id'), 9007199254740993)`)
      const queue = yield* PgQueue.make().pipe(Effect.provideService(Db.Db, db))
      const log = yield* EventLog.make.pipe(Effect.provideService(Db.Db, db))
      const jobs = yield* queue.enqueue([{ stage: "big" }, { stage: "big" }, { stage: "big" }])
      expect(jobs.map((j) => j.id)).toEqual(["9007199254740994", "9007199254740995", "9007199254740996"])
      const events = yield* readAll(log, EventLog.beginning, {}, 10).pipe(Effect.map((r) => r.events))
      expect(events.map((e) => e.jobId)).toEqual(jobs.map((j) => j.id))
    }))

  it.scoped("the upgrade from one row per job keeps every kept event, each readable and resumable", () =>
    Effect.gen(function*() {
      const schema = freshSchemaName("evupgrade")
      yield* Effect.addFinalizer(() => dropSchema(schema))
      const db = yield* Db.make({ url: Redacted.make(databaseUrl()), schema, poolMax: 2 })
      const all = Migrations.load()
      yield* Migrations.migrate({ migrations: all.filter((m) => m.id < 23) }).pipe(Effect.provideService(Db.Db, db))
      const sql = rawSql(schema)
      yield* Effect.addFinalizer(() => Effect.promise(() => sql.end({ timeout: 5 })))
      // 0020's log: the insert trigger writes one row per job
      const old = yield* Effect.promise(() =>
        sql<Array<{ id: string }>>`insert into jobs (stage, subject_id) values ('up', 'a'), ('up', null), ('up', 'c') returning id::text`
      )
      const oldRows = yield* Effect.promise(() => sql<Array<{ id: string }>>`select id::text from job_events order by id`)
      expect(oldRows.length).toBe(3)

      yield* Migrations.migrate().pipe(Effect.provideService(Db.Db, db))
      const log = yield* EventLog.make.pipe(Effect.provideService(Db.Db, db))
      const kept = yield* readAll(log, EventLog.beginning, {}, 2).pipe(Effect.map((r) => r.events))
      expect(kept.map((e) => [e.id, e.jobId, e.kind, e.subjectId, e.attempt])).toEqual(
        oldRows.map((r, i) => [String(BigInt(r.id) * 1024n), old[i]!.id, "enqueued", ["a", null, "c"][i], 0])
      )
      // a job enqueued after the upgrade is logged after them; resuming after an upgraded event finds it
      const [fresh] = yield* Effect.promise(() => sql<Array<{ id: string }>>`insert into jobs (stage) values ('up') returning id::text`)
      const after = yield* readAll(log, yield* log.after(kept[2]!.id, {}), {}, 10).pipe(Effect.map((r) => r.events))
      expect(after.map((e) => [e.jobId, e.kind])).toEqual([[fresh!.id, "enqueued"]])
      expect(BigInt(after[0]!.id)).toBeGreaterThan(BigInt(kept[2]!.id))
    }))
})
