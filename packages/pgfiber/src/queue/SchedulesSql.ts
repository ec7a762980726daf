/**
 * Every statement on the schedules table, one named function each, with its locking strategy. Each statement
 * that needs the clock takes `at` and falls back to the database's `now()`, so tests pass time as a parameter
 * and workers on different hosts agree on it otherwise.
 */
import type { Sql } from "../layers/Db.js"
import type { ScheduleKey, ValidSchedule } from "./Schedules.js"

const orgKey = (key: ScheduleKey) => key.orgId ?? ""

/** The clock, and the enabled schedules due by it. Locking: none (a read on the partial `schedules_due` index). */
export const selectDue = (sql: Sql, at: Date | null) =>
  sql<Array<Record<string, unknown> & { clock: Date }>>`
    with clock as (select coalesce(${at ? at.toISOString() : null}::timestamptz, now()) as clock)
    select clock.clock, s.*
    from clock left join schedules s on s.enabled and s.next_tick_at <= clock.clock
    order by s.next_tick_at, s.org_key, s.name`

export const selectNow = (sql: Sql) => sql<Array<{ now: Date }>>`select now() as now`

/**
 * Moves a schedule's cursor from the tick this process saw to the next one. Locking: that row; a concurrent
 * firing of the same tick waits for this one to commit, then finds the cursor moved and updates nothing.
 * The cursor is compared at the millisecond a JavaScript Date holds: one set by SQL (an operator's update,
 * `now()`) has microseconds, and an exact comparison would never match it, so the schedule would never fire.
 */
export const advanceCursor = (
  sql: Sql, key: ScheduleKey, expected: Date, next: Date, lastTick: Date | null
) =>
  sql<Array<{ name: string }>>`
    update schedules set next_tick_at = ${next.toISOString()}::timestamptz,
      last_tick_at = ${lastTick ? lastTick.toISOString() : null}::timestamptz
    where org_key = ${orgKey(key)} and name = ${key.name} and enabled
      and next_tick_at >= ${expected.toISOString()}::timestamptz
      and next_tick_at < ${expected.toISOString()}::timestamptz + interval '1 millisecond'
    returning name`

/**
 * Adds or replaces a schedule. A runtime one replaces the row (the cursor is recomputed only when the timing
 * changed); a code-declared one replaces it only when the code's definition changed since the last start-up,
 * so an operator's edits survive restarts. Locking: that row.
 */
export const upsertSchedule = (sql: Sql, s: ValidSchedule, source: "code" | "runtime") =>
  sql<Array<Record<string, unknown>>>`
    insert into schedules as s (org_key, name, stage, payload, priority, max_attempts, cron, interval_ms, time_zone,
                                enabled, catch_up, backfill_limit, next_tick_at, source, declared)
    values (${s.orgId ?? ""}, ${s.name}, ${s.stage}, ${s.payloadJson}::text::jsonb, ${s.priority}, ${s.maxAttempts},
            ${s.cron}, ${s.everyMs}, ${s.timeZone}, ${s.enabled}, ${s.catchUp}, ${s.backfillLimit},
            ${s.nextTickAt.toISOString()}::timestamptz, ${source},
            ${source === "code" ? s.declared : null}::jsonb)
    on conflict (org_key, name) do update set
      stage = excluded.stage, payload = excluded.payload, priority = excluded.priority,
      max_attempts = excluded.max_attempts, cron = excluded.cron, interval_ms = excluded.interval_ms,
      time_zone = excluded.time_zone, catch_up = excluded.catch_up, backfill_limit = excluded.backfill_limit,
      enabled = case when excluded.source = 'runtime' then excluded.enabled else s.enabled end,
      next_tick_at = case
        when (s.cron, s.interval_ms, s.time_zone) is distinct from (excluded.cron, excluded.interval_ms, excluded.time_zone)
        then excluded.next_tick_at else s.next_tick_at end,
      source = excluded.source, declared = excluded.declared, updated_at = now()
    where excluded.source = 'runtime' or s.declared is distinct from excluded.declared
    returning *`

export const deleteSchedule = (sql: Sql, key: ScheduleKey) =>
  sql<Array<{ name: string }>>`delete from schedules where org_key = ${orgKey(key)} and name = ${key.name} returning name`

/** Enables or disables; enabling moves the cursor to the next tick after now (`next`). Locking: that row. */
export const updateEnabled = (sql: Sql, key: ScheduleKey, enabled: boolean, next: Date | null) =>
  sql<Array<Record<string, unknown>>>`
    update schedules set enabled = ${enabled},
      next_tick_at = coalesce(${next ? next.toISOString() : null}::timestamptz, next_tick_at), updated_at = now()
    where org_key = ${orgKey(key)} and name = ${key.name}
    returning *`

export const selectSchedule = (sql: Sql, key: ScheduleKey) =>
  sql<Array<Record<string, unknown>>>`select * from schedules where org_key = ${orgKey(key)} and name = ${key.name}`

/** Every schedule, or one org's (`''` for those of no org) when `orgKey` is given. Locking: none. */
export const listSchedules = (sql: Sql, orgKeyFilter: string | null) =>
  sql<Array<Record<string, unknown>>>`
    select * from schedules where (${orgKeyFilter}::text is null or org_key = ${orgKeyFilter}::text)
    order by org_key, name`
