/**
 * The statements behind `Queue.bulk` and the job lists' search (Bulk.ts). A filter becomes a WHERE clause of
 * only the conditions it names, each a parameter, so the planner sees `payload @> $1` (the GIN index of
 * migration 0019) or `last_error ilike $1` (its trigram index, when pg_trgm was there) rather than an
 * `$1 is null or …` it cannot index. An action runs in batches: each statement takes the next `limit` matching
 * rows by id with FOR UPDATE SKIP LOCKED, changes them and commits, so a claim (which skips locked rows too) is
 * never held up, and a settle or heartbeat of a running job waits at most one batch.
 */
import { Duration } from "effect"
import type { Sql } from "../layers/Db.js"
import * as SqlClock from "./SqlClock.js"
import type { At } from "./SqlClock.js"
import { type BulkAction, containsPattern, type JobFilter } from "./Bulk.js"
import { archiveCancelled, channel, finishedSettled, logEvents } from "./JobsSql.js"

// JSON goes in as text cast to jsonb: a parameter the server types as jsonb is JSON.stringify'd again by porsager
// (a string would become a JSON string)

type Fragment = ReturnType<Sql>

const and = (sql: Sql, parts: ReadonlyArray<Fragment>): Fragment =>
  parts.reduce<Fragment>((acc, p) => sql`${acc} and ${p}`, sql`true`)

/** The filter's conditions on `jobs` (aliased `j`). */
const filterConditions = (sql: Sql, at: At, f: JobFilter): ReadonlyArray<Fragment> => {
  const c: Array<Fragment> = []
  if (f.stage !== undefined) c.push(sql`j.stage = ${f.stage}`)
  if (f.hiddenStages !== undefined && f.hiddenStages.length > 0) c.push(sql`j.stage <> all(${[...f.hiddenStages]}::text[])`)
  if (f.status === "queued") c.push(sql`j.status = 'queued' and j.available_at <= ${SqlClock.now(sql, at)}`)
  if (f.status === "delayed") c.push(sql`j.status = 'queued' and j.available_at > ${SqlClock.now(sql, at)}`)
  if (f.status === "running") c.push(sql`j.status = 'running'`)
  if (f.status === "waiting") c.push(sql`j.status = 'waiting'`)
  if (f.org !== undefined) c.push(sql`j.org_id = ${f.org}`)
  if (f.subject !== undefined) c.push(sql`j.subject_id = ${f.subject}`)
  if (f.payload !== undefined) c.push(sql`j.payload @> ${JSON.stringify(f.payload)}::text::jsonb`)
  if (f.error !== undefined) c.push(sql`j.last_error ilike ${containsPattern(f.error)}`)
  if (f.olderThan !== undefined) c.push(sql`j.created_at < ${SqlClock.now(sql, at)} - ${Duration.toMillis(f.olderThan)}::float8 * interval '1 millisecond'`)
  if (f.newerThan !== undefined) c.push(sql`j.created_at >= ${SqlClock.now(sql, at)} - ${Duration.toMillis(f.newerThan)}::float8 * interval '1 millisecond'`)
  return c
}

/** The jobs an action changes, beyond the filter (Bulk.applies). */
const applicable = (sql: Sql, at: At, a: BulkAction): Fragment => {
  switch (a.kind) {
    case "cancel":
      return sql`j.status in ('waiting', 'queued', 'running')`
    case "retry":
      return sql`j.status = 'queued' and j.available_at > ${SqlClock.now(sql, at)} and j.last_error is not null`
    case "run-now":
      return sql`j.status = 'queued' and j.available_at > ${SqlClock.now(sql, at)}`
    case "priority":
      return sql`j.status = 'queued' and j.priority <> ${a.priority}`
  }
}

/** How many live jobs the action would change. Locking: none; one read. */
export const countApplicable = (sql: Sql, at: At, f: JobFilter, a: BulkAction) =>
  sql<Array<{ n: number }>>`
    select count(*)::int as n from jobs j where ${and(sql, [...filterConditions(sql, at, f), applicable(sql, at, a)])}`

/** The newest job id: an action leaves jobs enqueued after it started alone. Locking: none (the primary key's end). */
export const maxJobId = (sql: Sql) => sql<Array<{ id: string }>>`select coalesce(max(id), 0)::text as id from jobs`

/**
 * Each batch's plan: a walk of the primary key from the last batch's end, filtering as it goes and stopping at the
 * batch's size, so the whole action reads the table once. Left to choose, the planner takes the payload index's
 * bitmap and sorts every remaining match by id for each batch: a 100,000-job cancel then reads its matches once
 * per batch (docs/benchmarks.md). Local to the batch's transaction (`Db.runWithSettings`).
 */
export const batchPlan: Readonly<Record<string, string>> = { enable_bitmapscan: "off", enable_sort: "off" }

/** The next batch of applicable rows after `afterId`, locked, skipping rows a claim or a settle holds. */
const nextBatch = (sql: Sql, at: At, f: JobFilter, a: BulkAction, afterId: string, maxId: string, limit: number) =>
  sql`
    select j.id from jobs j
    where ${and(sql, [...filterConditions(sql, at, f), applicable(sql, at, a)])} and j.id > ${afterId}::bigint and j.id <= ${maxId}::bigint
    order by j.id
    limit ${limit}
    for update skip locked`

export interface BatchRow {
  /** The last id this batch looked at (null: nothing left). */
  readonly last: string | null
  readonly changed: number
  /** Cancel: running jobs marked (in `changed`). */
  readonly marked: number
  /** Cancel: the removed queued jobs, as [id, stage, org] (for the events stream). */
  readonly removed: ReadonlyArray<readonly [string, string, string | null]>
}

/**
 * Cancels one batch: queued and waiting rows are deleted (their dependents settled as for any cancelled parent), into the history as `cancelled` when their stage keeps any (as
 * `JobsSql.cancelJob`), running rows are marked `cancelled` for their worker. Locking: the batch's rows, SKIP LOCKED.
 */
export const cancelBatch = (
  sql: Sql, at: At, f: JobFilter, afterId: string, maxId: string, limit: number,
  retention: { readonly defaultMs: number; readonly byStage: string }
) =>
  sql<Array<BatchRow>>`
    with picked as (${nextBatch(sql, at, f, { kind: "cancel" }, afterId, maxId, limit)}),
    removed as (
      delete from jobs j using picked p where j.id = p.id and j.status in ('queued', 'waiting') returning j.*
    ),
    -- what waits on them is settled as for any cancelled parent (migration 0021), down the chain
    released as (
      ${finishedSettled(sql, at, sql`removed`, sql`'cancelled'`, sql`null::text`, retention)}
    ),
    kept as (${archiveCancelled(sql, at, sql`removed`, retention)}),
    marked as (
      update jobs j set status = 'cancelled', updated_at = ${SqlClock.now(sql, at)}
      from picked p where j.id = p.id and j.status = 'running' returning j.id
    ),
    -- the event log (migration 0020), as JobsSql.cancelJob: a running job's 'cancelled' is logged by its settle
    logged as (${logEvents(sql, sql`select org_id, stage, id, subject_id, 'cancelled', attempts, null::jsonb from removed order by id`)})
    select (select max(id)::text from picked) as last,
           ((select count(*) from removed) + (select count(*) from marked))::int as changed,
           (select count(*) from marked)::int as marked,
           coalesce((select json_agg(json_build_array(id::text, stage, org_id)) from removed), '[]'::json) as removed,
           (select count(*) from kept) as kept,
           (select count(*) from released) as released`

/**
 * Retry now, run now or a new priority for one batch; jobs made due wake their stages' workers (NOTIFY per
 * stage; the insert trigger sees inserts only). Locking: the batch's rows, SKIP LOCKED.
 */
export const updateBatch = (sql: Sql, at: At, schema: string, f: JobFilter, a: BulkAction, afterId: string, maxId: string, limit: number) =>
  sql<Array<BatchRow>>`
    with picked as (${nextBatch(sql, at, f, a, afterId, maxId, limit)}),
    changed as (
      update jobs j set ${a.kind === "priority" ? sql`priority = ${a.priority}` : sql`available_at = ${SqlClock.now(sql, at)}`}, updated_at = ${SqlClock.now(sql, at)}
      from picked p where j.id = p.id
      returning j.stage
    ),
    woken as (
      select pg_notify(${channel(schema)}, stage) from (select distinct stage from changed) s where ${a.kind !== "priority"}::boolean
    )
    select (select max(id)::text from picked) as last, (select count(*) from changed)::int as changed, 0 as marked,
           '[]'::json as removed, (select count(*) from woken) as woken`

/** Records an action as it starts (nothing changed yet). Locking: a new row. */
export const insertAction = (
  sql: Sql, at: At,
  r: { action: string; filter: string; priority: number | null; orgId: string | null; actor: string; matched: number }
) =>
  sql<Array<{ id: string }>>`
    insert into job_actions (action, filter, priority, org_id, actor, matched, affected, started_at)
    values (${r.action}, ${r.filter}::text::jsonb, ${r.priority}, ${r.orgId}, ${r.actor}, ${r.matched}, 0, ${SqlClock.now(sql, at)})
    returning id::text as id`

/** Records how many jobs the action changed, and that it ended (cut short, or not). Locking: that row. */
export const finishAction = (sql: Sql, at: At, id: string, affected: number, interrupted: boolean) =>
  sql`update job_actions set affected = ${affected}, interrupted = ${interrupted}, finished_at = ${SqlClock.now(sql, at)} where id = ${id}::bigint`

/** Recorded actions, newest first (a tenant's own under RLS). Locking: none. */
export const listActions = (sql: Sql, limit: number) =>
  sql<Array<Record<string, unknown>>>`
    select id::text as id, action, filter, priority, org_id, actor, matched, affected, interrupted, started_at, finished_at
    from job_actions order by id desc limit ${limit}`

/**
 * Live jobs matching a search, by id ascending after a cursor (`Queue.list` with a payload or error search);
 * `status` is the stored state (`queued` whether due or not). Locking: none.
 */
export const searchJobs = (sql: Sql, at: At, f: JobFilter, status: string | null, afterId: string | null, limit: number) =>
  sql<Array<Record<string, unknown>>>`
    select * from jobs j
    where ${and(sql, [
      ...filterConditions(sql, at, f),
      ...(status === null ? [] : [sql`j.status = ${status}` as Fragment]),
      ...(afterId === null ? [] : [sql`j.id > ${afterId}::bigint` as Fragment])
    ])}
    order by j.id limit ${limit}`
