/**
 * Schedules in Postgres (`<schema>.schedules`, migrations/0009): the store behind `Schedules.make`. The
 * database's clock is the one that decides whether a tick is due; statements are in SchedulesSql.ts.
 */
import { Effect } from "effect"
import * as Db from "../layers/Db.js"
import type { CatchUp, Schedule, Store } from "./Schedules.js"
import * as Schedules from "./Schedules.js"
import * as SchedulesSql from "./SchedulesSql.js"

const date = (v: unknown): Date => (v instanceof Date ? v : new Date(String(v)))

const rowToSchedule = (r: Record<string, unknown>): Schedule => ({
  name: String(r.name),
  orgId: r.org_id == null ? null : String(r.org_id),
  stage: String(r.stage),
  payload: r.payload,
  priority: Number(r.priority),
  maxAttempts: Number(r.max_attempts),
  cron: r.cron == null ? null : String(r.cron),
  everyMs: r.interval_ms == null ? null : Number(r.interval_ms),
  timeZone: String(r.time_zone),
  enabled: Boolean(r.enabled),
  catchUp: String(r.catch_up) as CatchUp,
  backfillLimit: Number(r.backfill_limit),
  nextTickAt: date(r.next_tick_at),
  lastTickAt: r.last_tick_at == null ? null : date(r.last_tick_at),
  source: String(r.source) as "code" | "runtime",
  createdAt: date(r.created_at),
  updatedAt: date(r.updated_at)
})

export const makeStore = Effect.gen(function*() {
  const db = yield* Db.Db
  const store: Store = {
    due: (at) =>
      db.run((sql) => SchedulesSql.selectDue(sql, at ?? null)).pipe(
        Effect.map((rows) => ({
          now: date(rows[0]!.clock),
          due: rows.filter((r) => r.name != null).map(rowToSchedule)
        }))
      ),
    now: db.run((sql) => SchedulesSql.selectNow(sql)).pipe(Effect.map((rows) => date(rows[0]!.now))),
    upsert: (s, source) =>
      Effect.gen(function*() {
        const [row] = yield* db.run((sql) => SchedulesSql.upsertSchedule(sql, s, source))
        if (row) return rowToSchedule(row)
        // a code declaration that has not changed since the last start-up leaves the row as it is
        const [existing] = yield* db.run((sql) => SchedulesSql.selectSchedule(sql, s))
        return rowToSchedule(existing!)
      }),
    remove: (key) => Effect.map(db.run((sql) => SchedulesSql.deleteSchedule(sql, key)), (rows) => rows.length > 0),
    setEnabled: (key, enabled, next) =>
      Effect.map(db.run((sql) => SchedulesSql.updateEnabled(sql, key, enabled, next)), (rows) => (rows[0] ? rowToSchedule(rows[0]) : null)),
    get: (key) => Effect.map(db.run((sql) => SchedulesSql.selectSchedule(sql, key)), (rows) => (rows[0] ? rowToSchedule(rows[0]) : null)),
    list: (orgId) =>
      Effect.map(
        db.run((sql) => SchedulesSql.listSchedules(sql, orgId === undefined ? null : orgId ?? "")),
        (rows) => rows.map(rowToSchedule)
      ),
    advance: (s, next, lastTick) =>
      Effect.map(db.run((sql) => SchedulesSql.advanceCursor(sql, s, s.nextTickAt, next, lastTick)), (rows) => rows.length === 1)
  }
  return store
})

/** Needs Db and Queue (the tick's job is enqueued through the queue, in the cursor's transaction). */
export const layer = Schedules.layerFrom(makeStore)
