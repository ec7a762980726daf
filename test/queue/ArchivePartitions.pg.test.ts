/**
 * The kept history partitioned by finish time (migration 0022): partitions exist ahead of the jobs that will
 * land in them, one whose every row is past its retention is dropped whole while newer ones stay, a stage kept
 * for less than a partition is still pruned by the batched delete, an archive that existed before the migration
 * stays readable row for row, and a tenant reads only its org's history whichever partition holds it. Time is a
 * parameter (`now`) of the maintenance, so nothing waits for days to pass.
 */
import { describe, expect, it, layer } from "@effect/vitest"
import { Duration, Effect, Either, Layer, Redacted } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as ArchivePartitions from "../../packages/pgfiber/src/queue/ArchivePartitions.js"
import * as Migrations from "../../packages/pgfiber/src/queue/Migrations.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import * as Stage from "../../packages/pgfiber/src/runtime/Stage.js"
import * as Housekeeping from "../../packages/pgfiber/src/stages/housekeeping/Housekeeping.js"
import { databaseUrl, dropSchema, freshSchemaName, layerDb } from "../support/pg.js"

const day = 86_400_000
const worker = { workerId: "w", leaseFor: Duration.seconds(30) }

/** Today's UTC midnight, from the database's clock (partitions align on UTC days). */
const todayUtc = Effect.gen(function*() {
  const db = yield* Db.Db
  const [row] = yield* db.run((sql) => sql<Array<{ t: Date }>>`select date_trunc('day', now() at time zone 'UTC') at time zone 'UTC' as t`)
  return row!.t.getTime()
})

/** Which partition holds each of these archived jobs. */
const partitionOf = (ids: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const db = yield* Db.Db
    const rows = yield* db.run((sql) => sql<Array<{ id: string; part: string }>>`
      select id::text, tableoid::regclass::text as part from jobs_archive where id = any(${ids}::bigint[])`)
    return Object.fromEntries(rows.map((r) => [r.id, r.part.replace(/^.*\./, "")]))
  })

/** An archived job finished at `finishedAt` and kept until `keepUntil`, written as a settle would. */
const archive = (id: number, stage: string, finishedAt: Date, keepUntil: Date, orgId: string | null = null) =>
  Effect.gen(function*() {
    const db = yield* Db.Db
    yield* db.run((sql) => sql`
      insert into jobs_archive (id, stage, org_id, payload, priority, status, attempts, max_attempts, created_at,
                                finished_at, keep_until)
      values (${id}, ${stage}, ${orgId}, '{}', 50, 'completed', 1, 5, ${finishedAt}, ${finishedAt}, ${keepUntil})`)
  })

const exists = (name: string) =>
  Effect.gen(function*() {
    const db = yield* Db.Db
    const [row] = yield* db.run((sql) => sql<Array<{ found: boolean }>>`select to_regclass(${name}) is not null as found`)
    return row!.found
  })

describe("jobs_archive partitioned by finish time", () => {
  layer(PgQueue.layer().pipe(Layer.provideMerge(layerDb())), { excludeTestServices: true })((it) => {
    it.effect("rows kept at least a partition's width are not deleted one by one as they expire: their partition is dropped whole", () =>
      Effect.gen(function*() {
        const q = yield* Queue.Queue
        const db = yield* Db.Db
        // a week's retention, finished four to eight days ago: some expired within the last day, one two days ago
        yield* db.run((sql) => sql`
          insert into jobs_archive (id, stage, payload, priority, status, attempts, max_attempts, created_at, finished_at, keep_until)
          select 900000300 + g, 'weekly', '{}'::jsonb, 50, 'completed', 1, 5, now() - interval '9 days',
                 now() - interval '7 days' - g * interval '1 hour', now() - g * interval '1 hour'
          from generate_series(1, 12) g
          union all
          select 900000399, 'weekly', '{}', 50, 'completed', 1, 5, now() - interval '9 days', now() - interval '9 days',
                 now() - interval '2 days'`)
        // only the row that has waited more than a day past its retention is deleted here
        expect(yield* q.history.prune()).toBe(1)
        expect(yield* q.get("900000399")).toBeNull()
        expect((yield* q.get("900000301"))?.status).toBe("completed")
        // the rest go with their partition, once it has ended and nothing in it is kept
        const part = (yield* partitionOf(["900000301"]))["900000301"]!
        const today = yield* todayUtc
        const { dropped } = yield* ArchivePartitions.maintain({ now: new Date(today + day + 60_000) })
        expect(dropped).toContain(part)
        for (const id of ["900000301", "900000312"]) expect(yield* q.get(id)).toBeNull()
      }))
  })

  layer(PgQueue.layer().pipe(Layer.provideMerge(layerDb())), { excludeTestServices: true })((it) => {
    it.effect("a stage kept for less than a partition's day is still pruned on time by the batched delete, beside a stage kept longer", () =>
      Effect.gen(function*() {
        const q = yield* Queue.Queue
        const [short, long] = yield* q.enqueue([{ stage: "short_kept" }, { stage: "long_kept" }])
        // finished now, in today's partition: one kept until a minute ago, one for a week
        yield* q.settle([
          Queue.Outcome.complete((yield* q.claim("short_kept", 1, worker))[0]!, [], null),
          Queue.Outcome.complete((yield* q.claim("long_kept", 1, worker))[0]!, [], null)
        ])
        const db = yield* Db.Db
        yield* db.run((sql) => sql`update jobs_archive set keep_until = now() - interval '1 minute' where id = ${short!.id}`)
        // the partition still holds a kept row: not dropped; the batched delete takes the expired one
        const { dropped } = yield* ArchivePartitions.maintain()
        const part = (yield* partitionOf([long!.id]))[long!.id]!
        expect(dropped).not.toContain(part)
        expect(yield* q.history.prune()).toBe(1)
        expect(yield* q.get(short!.id)).toBeNull()
        expect((yield* q.get(long!.id))?.status).toBe("completed")
      }))

    it.effect("the migration leaves partitions for today and the next two days, and maintenance creates them ahead of any later time", () =>
      Effect.gen(function*() {
        const today = yield* todayUtc
        const ends = (yield* ArchivePartitions.list).map((p) => p.endsAt.getTime())
        expect(ends).toEqual([today + day, today + 2 * day, today + 3 * day])
        // ten days on: the partitions for that day and the two after it are made (the days in between never
        // had a job finish in them, so none is made for them)
        const later = new Date(today + 10 * day + 3_600_000)
        const { created } = yield* ArchivePartitions.maintain({ now: later, ahead: Duration.days(2) })
        expect(created).toHaveLength(3)
        const parts = yield* ArchivePartitions.list
        expect(parts.slice(-3).map((p) => p.startsAt?.getTime())).toEqual([today + 10 * day, today + 11 * day, today + 12 * day])
        // a job finished then lands in its day's partition, not the default one
        yield* archive(900_000_001, "ahead", new Date(today + 11 * day + 60_000), new Date(today + 20 * day))
        expect((yield* partitionOf(["900000001"]))["900000001"]).toBe(parts.at(-2)!.name)
        // maintaining again for the same time creates nothing new
        expect((yield* ArchivePartitions.maintain({ now: later, ahead: Duration.days(2) })).created).toEqual([])
      }))
  })

  layer(PgQueue.layer().pipe(Layer.provideMerge(layerDb())), { excludeTestServices: true })((it) => {
    it.effect("a partition whose every row is past its retention is dropped whole; the newer one, still kept, stays readable", () =>
      Effect.gen(function*() {
        const q = yield* Queue.Queue
        const today = yield* todayUtc
        const t = (days: number, hours = 0) => new Date(today + days * day + hours * 3_600_000)
        yield* ArchivePartitions.maintain({ now: t(20), ahead: Duration.days(3) })
        // day 20: kept one hour; day 21: kept a week
        for (let i = 1; i <= 50; i++) yield* archive(900_000_000 + i, "expiring", t(20, 1), t(20, 2))
        yield* archive(900_000_100, "lasting", t(21, 1), t(28))
        const parts = yield* partitionOf(["900000001", "900000100"])
        expect(parts["900000001"]).not.toBe(parts["900000100"])
        // day 21 noon: day 20's partition has nothing kept left
        const { dropped } = yield* ArchivePartitions.maintain({ now: t(21, 12), ahead: Duration.days(3) })
        expect(dropped).toContain(parts["900000001"])
        expect(dropped).not.toContain(parts["900000100"])
        expect(yield* exists(parts["900000001"]!)).toBe(false)
        expect(yield* q.get("900000001")).toBeNull()
        expect((yield* q.get("900000100"))?.status).toBe("completed")
        // a day later the lasting row still holds its partition
        expect((yield* ArchivePartitions.maintain({ now: t(22, 12) })).dropped).not.toContain(parts["900000100"])
        expect(yield* exists(parts["900000100"]!)).toBe(true)
      }))

    it.effect("a tenant reads only its org's history in every partition, and no partition directly", () =>
      Effect.gen(function*() {
        const q = yield* Queue.Queue
        const db = yield* Db.Db
        const today = yield* todayUtc
        yield* ArchivePartitions.maintain({ now: new Date(today + 40 * day), ahead: Duration.days(2) })
        yield* archive(900_000_201, "tenant_hist", new Date(today + 40 * day + 60_000), new Date(today + 50 * day), "org-a")
        yield* archive(900_000_202, "tenant_hist", new Date(today + 40 * day + 60_000), new Date(today + 50 * day), "org-b")
        yield* archive(900_000_203, "tenant_hist", new Date(today + 41 * day + 60_000), new Date(today + 50 * day), "org-b")
        const [done] = yield* q.enqueue([{ stage: "tenant_hist", orgId: "org-b" }])
        yield* q.settle([Queue.Outcome.complete((yield* q.claim("tenant_hist", 1, worker))[0]!, [], null)])
        const parts = yield* partitionOf(["900000201", "900000203", done!.id])
        expect(new Set(Object.values(parts)).size).toBe(3)
        expect((yield* db.withOrg("org-a", q.history.list({ stage: "tenant_hist" }))).map((j) => j.id)).toEqual(["900000201"])
        expect((yield* db.withOrg("org-b", q.history.list({ stage: "tenant_hist" }))).map((j) => j.id)).toEqual(["900000203", "900000202", done!.id])
        for (const id of ["900000202", "900000203", done!.id]) {
          expect(yield* db.withOrg("org-a", q.get(id))).toBeNull()
          expect((yield* db.withOrg("org-b", q.get(id)))?.orgId).toBe("org-b")
        }
        const direct = yield* Effect.either(db.withOrg("org-a", db.run((sql) => sql`select * from ${sql(parts["900000203"]!)}`)))
        expect(Either.isLeft(direct) && direct.left.message).toContain("permission denied")
      }))
  })

  layer(PgQueue.layer().pipe(Layer.provideMerge(layerDb())), { excludeTestServices: true })((it) => {
    it.effect("the housekeeping's history-retention task makes the partitions ahead at the width its payload names", () =>
      Effect.gen(function*() {
        const today = yield* todayUtc
        const job: Stage.JobInfo = {
          id: "1", stage: Housekeeping.stageName, attempt: 1, maxAttempts: 3, polls: 0, orgId: null, subjectId: null,
          createdAt: new Date(), claimedAt: new Date(), ...Stage.jobInfoDefaults
        }
        yield* Housekeeping.housekeeping.handler({ task: "prune-history", partitionHours: 6, aheadHours: 96 }, job)
        const parts = yield* ArchivePartitions.list
        // the migration's three daily ones, then six-hour ones from the third day's end to four days from now
        expect(parts.slice(0, 3).map((p) => p.endsAt.getTime())).toEqual([today + day, today + 2 * day, today + 3 * day])
        const added = parts.slice(3)
        expect(added.length).toBeGreaterThan(0)
        expect(added[0]!.startsAt?.getTime()).toBe(today + 3 * day)
        for (const p of added) expect(p.endsAt.getTime() - p.startsAt!.getTime()).toBe(6 * 3_600_000)
        expect(added.at(-1)!.endsAt.getTime()).toBeGreaterThan(Date.now() + 96 * 3_600_000)
      }))
  })

  it.scoped("an archive that existed before the migration keeps every row readable, and its indexes (one built beforehand) are reused", () =>
    Effect.gen(function*() {
      const schema = freshSchemaName("arch")
      yield* Effect.addFinalizer(() => dropSchema(schema))
      const db = yield* Db.make({ url: Redacted.make(databaseUrl()), schema, poolMax: 4 })
      const before = Migrations.load().filter((m) => m.id < 22)
      yield* Migrations.migrate({ migrations: before }).pipe(Effect.provideService(Db.Db, db))
      // 2,000 finished jobs of two orgs and none, as the unpartitioned archive held them
      yield* db.run((sql) => sql`
        insert into jobs_archive (id, stage, org_id, payload, priority, status, attempts, max_attempts, output,
                                  created_at, finished_at, keep_until)
        select g, 'old_' || (g % 3), (array['org-a', 'org-b', null])[1 + g % 3], jsonb_build_object('n', g), 50,
               'completed', 1, 5, jsonb_build_object('out', g), now() - interval '2 days',
               now() - (g || ' seconds')::interval, now() + interval '5 days'
        from generate_series(1, 2000) g`)
      // the index the migration needs, built beforehand without blocking the settles (docs/operations.md)
      yield* db.run((sql) => sql`create unique index concurrently jobs_archive_legacy_id on jobs_archive (id, finished_at)`)
      const applied = yield* Migrations.migrate().pipe(Effect.provideService(Db.Db, db))
      expect(applied.applied[0]).toBe("0022_archive_partitions")
      const [counts] = yield* db.run((sql) => sql<Array<{ n: number; legacy: number; indexes: number }>>`
        select (select count(*)::int from jobs_archive) as n,
               (select count(*)::int from only jobs_archive_legacy) as legacy,
               (select count(*)::int from pg_indexes where schemaname = ${schema} and tablename = 'jobs_archive_legacy') as indexes`)
      expect(counts).toEqual({ n: 2000, legacy: 2000, indexes: 3 })
      yield* Effect.gen(function*() {
        const q = yield* Queue.Queue
        for (const id of ["1", "777", "2000"]) {
          const job = yield* q.get(id)
          expect(job?.status).toBe("completed")
          expect(job?.output).toEqual({ out: Number(id) })
        }
        expect((yield* q.history.list({ stage: "old_1", limit: 1000 })).length).toBe(667)
        const seenByB = yield* db.withOrg("org-b", q.history.list({ limit: 1000 }))
        expect(seenByB.length).toBe(667)
        expect(seenByB.every((j) => j.orgId === "org-b")).toBe(true)
        expect(yield* db.withOrg("org-a", q.get("2"))).toBeNull()
        // nothing is pruned or dropped while the old rows are kept
        expect(yield* q.history.prune()).toBe(0)
        expect((yield* ArchivePartitions.maintain()).dropped).toEqual([])
        // once they have all expired, the old table goes whole
        const { dropped } = yield* ArchivePartitions.maintain({ now: new Date(Date.now() + 6 * day) })
        expect(dropped).toContain("jobs_archive_legacy")
        expect(yield* q.get("1")).toBeNull()
      }).pipe(Effect.provide(PgQueue.layer()), Effect.provideService(Db.Db, db))
    }), { timeout: 60_000 })
})
