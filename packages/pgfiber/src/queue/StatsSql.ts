/**
 * The per-minute counts (migrations/0012_dashboard.sql) and the one statement a dashboard's live view needs.
 * Neither scans history: the upsert touches one row per minute, stage and org, and the live snapshot reads the
 * hot table's partial indexes, the open dead letters and the last hour of the small per-minute table.
 */
import type { Sql } from "../layers/Db.js"

export interface MinuteRow {
  readonly minute: Date
  readonly stage: string
  readonly orgKey: string
  readonly completed: number
  readonly retried: number
  readonly deadLettered: number
  readonly runMsSum: number
  readonly runMsMax: number
  readonly runs: number
}

/**
 * Adds one process's counts for the minutes it saw, and deletes the rows past the kept window, in one
 * statement. Locking: the touched rows of the current minute (concurrent writers add, never overwrite).
 */
export const upsertMinutes = (sql: Sql, rows: ReadonlyArray<MinuteRow>, keepMs: number) =>
  sql`
    with expired as (
      delete from job_stats_minute where minute < now() - ${keepMs}::float8 * interval '1 millisecond'
    )
    insert into job_stats_minute as t (minute, stage, org_key, completed, retried, dead_lettered, run_ms_sum, run_ms_max, runs)
    select * from unnest(
      ${rows.map((r) => r.minute.toISOString())}::timestamptz[], ${rows.map((r) => r.stage)}::text[],
      ${rows.map((r) => r.orgKey)}::text[], ${rows.map((r) => r.completed)}::int[], ${rows.map((r) => r.retried)}::int[],
      ${rows.map((r) => r.deadLettered)}::int[], ${rows.map((r) => r.runMsSum)}::float8[],
      ${rows.map((r) => r.runMsMax)}::float8[], ${rows.map((r) => r.runs)}::int[])
    on conflict (minute, stage, org_key) do update set
      completed = t.completed + excluded.completed,
      retried = t.retried + excluded.retried,
      dead_lettered = t.dead_lettered + excluded.dead_lettered,
      run_ms_sum = t.run_ms_sum + excluded.run_ms_sum,
      run_ms_max = greatest(t.run_ms_max, excluded.run_ms_max),
      runs = t.runs + excluded.runs`

/**
 * Everything a dashboard shows live, across every org, in one statement (viewers are filtered in memory); one row,
 * decoded by Reads (Job.LiveSnapshot).
 * Locking: none; counts over the live table (small by design), open dead letters by their partial index, the
 * per-minute table's last hour by its primary key, the watched jobs by id, the paused and rate-limited stages.
 */
export const liveSnapshot = (sql: Sql, watched: ReadonlyArray<string>, minutes: number) =>
  sql<Array<Record<string, unknown>>>`
    select now() as now,
      coalesce((select json_agg(d) from (
        select coalesce(l.stage, x.stage) as stage, coalesce(l.org_id, x.org_id) as org,
               coalesce(l.ready, 0) as ready, coalesce(l.delayed, 0) as delayed, coalesce(l.running, 0) as running,
               coalesce(l.cancelling, 0) as cancelling, coalesce(x.dead, 0) as dead, l.oldest_ready_ms
        from (
          select stage, org_id,
            count(*) filter (where status = 'queued' and available_at <= now()) as ready,
            count(*) filter (where status = 'queued' and available_at > now()) as delayed,
            count(*) filter (where status = 'running') as running,
            count(*) filter (where status = 'cancelled') as cancelling,
            (extract(epoch from now() - min(available_at) filter (where status = 'queued' and available_at <= now())) * 1000)::float8
              as oldest_ready_ms
          from jobs group by stage, org_id
        ) l
        full join (
          select stage, org_id, count(*) as dead from dead_letters where resolution_status is null group by stage, org_id
        ) x on l.stage = x.stage and l.org_id is not distinct from x.org_id
      ) d), '[]'::json) as depth,
      coalesce((select json_agg(w) from (
        select locked_by as worker, stage, org_id as org, count(*) as running
        from jobs where status <> 'queued' and locked_by is not null group by 1, 2, 3
      ) w), '[]'::json) as workers,
      coalesce((select json_agg(s) from (
        select minute, stage, org_id as org, completed, retried, dead_lettered, run_ms_sum, run_ms_max, runs
        from job_stats_minute where minute >= date_trunc('minute', now()) - ${minutes}::int * interval '1 minute'
        order by minute
      ) s), '[]'::json) as series,
      coalesce((select json_agg(j) from (
        select id::text as id, stage, org_id, status, attempts, max_attempts, polls, available_at, locked_by,
               locked_until, last_error, errors, updated_at, started_at, progress, progress_message
        from jobs where id = any(${watched}::bigint[])
      ) j), '[]'::json) as watched,
      coalesce((select json_agg(stage order by stage) from stage_controls where paused), '[]'::json) as paused,
      coalesce((select json_agg(distinct b.stage) from rate_buckets b where b.next_token_at > now()
                  and exists (select 1 from jobs j where j.stage = b.stage and j.status = 'queued' and j.available_at <= now())),
               '[]'::json) as rate_limited`
