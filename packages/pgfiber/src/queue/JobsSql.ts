/**
 * Every statement on the jobs and dead_letters tables, one named function each, with its locking strategy.
 * Table names are unqualified: the pool's search_path is the pgfiber schema. Times come from the database
 * clock (`now()`), so workers on different hosts agree: each statement that reads the clock takes `at` and uses
 * `SqlClock.now(sql, at)`, which is `now()` when `at` is null (production) and `at` in a test on the TestClock.
 * One statement never mixes the two (SqlClock.ts). Each statement that moves a job also logs what it did
 * to the event log (a `logged` CTE: started, progress, completed, retried, rescheduled, dead, cancelled; the
 * insert trigger logs enqueued), new rows only, so it takes no lock of its own (docs/events.md).
 */
import type { Sql } from "../layers/Db.js"
import { jobsPerRow } from "./EventsSql.js"
import type { ValidJob } from "./Job.js"
import * as SqlClock from "./SqlClock.js"
import type { At } from "./SqlClock.js"
import { laterTopic } from "./Queue.js"

export const channel = (schema: string) => `${schema}_jobs`

/** The event log's NOTIFY (migration 0027): heard only by the processes that follow the log, while they do. */
export const eventsChannel = (schema: string) => `${schema}_events`

/**
 * The insert into the event log (migrations 0020, 0023) that a statement adds as a CTE of its own, so an event
 * costs no round trip. `events` selects one row per job: (org_id, stage, job_id, subject_id, kind, attempt,
 * data), in the order the job's events happen. They are written one row per org, stage and kind (at most
 * `EventsSql.jobsPerRow` jobs each), not one per job: a claim of 500 jobs writes one row. A job's progress
 * comes before its outcome of the same statement (its row is written first). `shared`: the data every event of
 * the statement has (a claim's worker), stored once per row (`data` of one element: see EventsSql) instead of
 * built and stored per job; the events' own data column is then ignored. `atMost`: no group can hold more jobs
 * than this (a claim's limit, a settle's jobs); at most `jobsPerRow`, the rows need no chunks, and the events must
 * then come in job id order (a job's own events in the order they happen), as every such caller's do: the id is
 * their order, and the insert has none of the numbering and chunking window functions and their sorts (a fifth of
 * a one-job claim's executor start; ~0.17 ms of its execution on PostgreSQL 15, docs/benchmarks.md).
 */
export const logEvents = (sql: Sql, events: ReturnType<Sql>, shared?: ReturnType<Sql>, atMost?: number) => {
  const chunked = atMost === undefined || atMost > jobsPerRow
  // the events' order: their number in the input, or (unchunked, in id order) the job's id
  const by = () => (chunked ? sql`n` : sql`job_id`)
  const named = sql`(${events}) e(org_id, stage, job_id, subject_id, kind, attempt, data)`
  return sql`
      insert into job_events (org_id, stage, kind, job_ids, subject_ids, attempts, data)
      select org_id, stage, kind, array_agg(job_id order by ${by()}),
             case when bool_or(subject_id is not null) then array_agg(subject_id order by ${by()}) end,
             array_agg(attempt order by ${by()}),
             ${shared === undefined ? sql`case when bool_or(data is not null) then array_agg(data order by ${by()}) end` : sql`array[${shared}]::jsonb[]`}
      from ${chunked
    ? sql`(
        select e.*, (row_number() over (partition by org_id, stage, kind order by n) - 1) / ${jobsPerRow} as chunk
        from (select e.*, row_number() over () as n from ${named}) e
      ) e
      group by org_id, stage, kind, chunk`
    : sql`${named}
      group by org_id, stage, kind`}
      order by kind <> 'progress', min(${by()})`
}

const columns = (jobs: ReadonlyArray<ValidJob>) => ({
  stages: jobs.map((j) => j.stage),
  orgs: jobs.map((j) => j.orgId),
  subjects: jobs.map((j) => j.subjectId),
  payloads: jobs.map((j) => j.payloadJson),
  priorities: jobs.map((j) => j.priority),
  delays: jobs.map((j) => j.delayMs),
  runAts: jobs.map((j) => (j.runAt ? j.runAt.toISOString() : null)),
  maxAttempts: jobs.map((j) => j.maxAttempts),
  dedupeKeys: jobs.map((j) => j.dedupeKey),
  timeouts: jobs.map((j) => j.timeoutMs)
})

/**
 * The insert both statements below share, so they cannot drift: the batch unnested in its order, each row's
 * `available_at` its run time or now + its delay. The target is named `j` for the conflict clause that each
 * statement adds after it (what a duplicate does), and its returning list.
 */
const insertBatch = (sql: Sql, at: At, jobs: ReadonlyArray<ValidJob>, waitingOn?: ReadonlyArray<number>) => {
  const c = columns(jobs)
  // jobs with parents still to finish start `waiting` (the insert trigger wakes no one for them); jobs of a batch
  if (waitingOn !== undefined) {
    return sql`
    insert into jobs as j (stage, org_id, subject_id, payload, priority, available_at, max_attempts, dedupe_key, timeout_ms,
                           status, waiting_on, batch_id, created_at, updated_at)
    select stage, org_id, subject_id, payload::jsonb, priority,
           coalesce(run_at, ${SqlClock.now(sql, at)} + delay_ms * interval '1 millisecond'), max_attempts, dedupe_key, timeout_ms,
           case when waiting_on > 0 then 'waiting' else 'queued' end, nullif(waiting_on, 0), batch_id,
           ${SqlClock.now(sql, at)}, ${SqlClock.now(sql, at)}
    from unnest(${c.stages}::text[], ${c.orgs}::text[], ${c.subjects}::text[], ${c.payloads}::text[],
                ${c.priorities}::int[], ${c.delays}::float8[], ${c.runAts}::timestamptz[], ${c.maxAttempts}::int[],
                ${c.dedupeKeys}::text[], ${c.timeouts}::int[], ${waitingOn}::int[], ${jobs.map((j) => j.batchId)}::bigint[])
         with ordinality
         as t(stage, org_id, subject_id, payload, priority, delay_ms, run_at, max_attempts, dedupe_key, timeout_ms, waiting_on,
              batch_id, ord)
    order by ord`
  }
  return sql`
    insert into jobs as j (stage, org_id, subject_id, payload, priority, available_at, max_attempts, dedupe_key, timeout_ms,
                           created_at, updated_at)
    select stage, org_id, subject_id, payload::jsonb, priority,
           coalesce(run_at, ${SqlClock.now(sql, at)} + delay_ms * interval '1 millisecond'), max_attempts, dedupe_key, timeout_ms,
           ${SqlClock.now(sql, at)}, ${SqlClock.now(sql, at)}
    from unnest(${c.stages}::text[], ${c.orgs}::text[], ${c.subjects}::text[], ${c.payloads}::text[],
                ${c.priorities}::int[], ${c.delays}::float8[], ${c.runAts}::timestamptz[], ${c.maxAttempts}::int[],
                ${c.dedupeKeys}::text[], ${c.timeouts}::int[]) with ordinality
         as t(stage, org_id, subject_id, payload, priority, delay_ms, run_at, max_attempts, dedupe_key, timeout_ms, ord)
    order by ord`
}

/**
 * Inserts a batch in one statement. Locking: new rows only; a dedupe-key conflict (per org: `jobs_dedupe` is
 * unique on (org_id, dedupe_key), no-org jobs in a space of their own) takes the live row's lock for a no-op
 * update so its id comes back (`deduped`), which waits for a concurrent completion to settle.
 */
export const insertJobs = (sql: Sql, at: At, jobs: ReadonlyArray<ValidJob>) =>
  sql<Array<{ id: string; deduped: boolean }>>`
    ${insertBatch(sql, at, jobs)}
    on conflict (org_id, dedupe_key) where dedupe_key is not null do update set dedupe_key = excluded.dedupe_key
    returning id, (xmax <> 0) as deduped`

/**
 * Inserts a batch of jobs that have parents, each `waiting` on `waitingOn[i]` of them (0: all done, queued at
 * once); a dedupe-key conflict returns the live job as `insertJobs` does. The edges follow (`insertEdges`), in
 * the same transaction, after `lockParents`. Locking: new rows only, and a conflicting live row.
 */
export const insertWaitingJobs = (sql: Sql, at: At, jobs: ReadonlyArray<ValidJob>, waitingOn: ReadonlyArray<number>) =>
  sql<Array<{ id: string; deduped: boolean }>>`
    ${insertBatch(sql, at, jobs, waitingOn)}
    on conflict (org_id, dedupe_key) where dedupe_key is not null do update set dedupe_key = excluded.dedupe_key
    returning id, (xmax <> 0) as deduped`

/**
 * Claims each job's uniqueness window (`uniqueFor`): the window is the aligned period of `period_ms` that holds
 * the database's now. Returns the windows this statement inserted (`fresh`), by ordinal; the others were taken
 * already (`selectWindowJobs` finds their jobs, in a new statement: a concurrent first enqueue this one waited
 * for committed after this statement's snapshot). Locking: the new window rows; ON CONFLICT waits for a
 * concurrent insert of the same window to commit or roll back.
 */
export const claimWindows = (sql: Sql, at: At, w: {
  readonly orgs: ReadonlyArray<string | null>
  readonly keys: ReadonlyArray<string>
  readonly periods: ReadonlyArray<number>
}) =>
  sql<Array<{ ord: number; window_start: Date; fresh: boolean }>>`
    with w as (
      select ord::int, org_id, dedupe_key, period_ms,
             to_timestamp(floor(extract(epoch from ${SqlClock.now(sql, at)}) * 1000 / period_ms) * period_ms / 1000) as window_start
      from unnest(${w.orgs}::text[], ${w.keys}::text[], ${w.periods}::float8[]) with ordinality as t(org_id, dedupe_key, period_ms, ord)
    ), ins as (
      insert into job_unique_windows (org_key, org_id, dedupe_key, window_start, expires_at)
      select coalesce(org_id, ''), org_id, dedupe_key, window_start, window_start + period_ms * interval '1 millisecond'
      from w order by ord
      on conflict do nothing
      returning org_key, dedupe_key, window_start
    )
    select w.ord, w.window_start, exists (
      select 1 from ins where ins.org_key = coalesce(w.org_id, '') and ins.dedupe_key = w.dedupe_key and ins.window_start = w.window_start
    ) as fresh
    from w order by w.ord`

/** The jobs of windows taken already. Locking: none. */
export const selectWindowJobs = (sql: Sql, w: {
  readonly orgs: ReadonlyArray<string | null>
  readonly keys: ReadonlyArray<string>
  readonly starts: ReadonlyArray<Date>
}) =>
  sql<Array<{ ord: number; job_id: string | null }>>`
    select t.ord::int, u.job_id::text
    from unnest(${w.orgs}::text[], ${w.keys}::text[], ${w.starts.map((d) => d.toISOString())}::timestamptz[]) with ordinality as t(org_id, dedupe_key, window_start, ord)
    left join job_unique_windows u
      on u.org_key = coalesce(t.org_id, '') and u.dedupe_key = t.dedupe_key and u.window_start = t.window_start`

/** Records the job a fresh window went to. Locking: those window rows (this transaction's own). */
export const setWindowJobs = (sql: Sql, w: {
  readonly orgs: ReadonlyArray<string | null>
  readonly keys: ReadonlyArray<string>
  readonly starts: ReadonlyArray<Date>
  readonly jobIds: ReadonlyArray<string>
}) =>
  sql`
    update job_unique_windows u set job_id = t.job_id
    from unnest(${w.orgs}::text[], ${w.keys}::text[], ${w.starts.map((d) => d.toISOString())}::timestamptz[], ${w.jobIds}::bigint[])
      as t(org_id, dedupe_key, window_start, job_id)
    where u.org_key = coalesce(t.org_id, '') and u.dedupe_key = t.dedupe_key and u.window_start = t.window_start`

/** Windows that have passed. Locking: SKIP LOCKED on the rows it takes. */
export const pruneWindows = (sql: Sql, at: At, limit: number) =>
  sql<Array<{ n: number }>>`
    with gone as (
      delete from job_unique_windows where ctid = any(array(
        select ctid from job_unique_windows where expires_at < ${SqlClock.now(sql, at)} order by expires_at limit ${limit} for update skip locked))
      returning 1
    )
    select count(*)::int as n from gone`

/** A new batch, open. Locking: a new row. */
export const insertBatchRow = (sql: Sql, orgId: string | null, onComplete: string | null, onFailure: string | null) =>
  sql<Array<{ id: string }>>`
    insert into job_batches (org_id, on_complete, on_failure) values (${orgId}, ${onComplete}::text::jsonb, ${onFailure}::text::jsonb)
    returning id::text`

/**
 * The batches jobs are joining, locked until the enqueue commits, so none is sealed (or finishes) meanwhile.
 * Locking: FOR UPDATE on each batch row, in id order.
 */
export const lockBatches = (sql: Sql, ids: ReadonlyArray<string>) =>
  sql<Array<{ id: string; org_id: string | null; sealed: boolean }>>`
    select id::text, org_id, sealed from job_batches where id = any(${ids}::bigint[]) order by id for update`

/** Counts the jobs that joined. Locking: the batch rows (locked by `lockBatches` already). */
export const addToBatchTotals = (sql: Sql, ids: ReadonlyArray<string>, counts: ReadonlyArray<number>) =>
  sql`
    update job_batches b set total = b.total + t.n
    from unnest(${ids}::bigint[], ${counts}::int[]) as t(id, n) where b.id = t.id`

/**
 * Seals a batch: no more jobs join; when all have finished already it finishes now (`enqueueFinishedCallbacks`
 * follows in the same transaction). Locking: the batch row.
 */
export const sealBatch = (sql: Sql, at: At, id: string) =>
  sql<Array<{ id: string; finished: boolean }>>`
    update job_batches set sealed = true,
      finished_at = case when completed + failed >= total then ${SqlClock.now(sql, at)} end
    where id = ${id} and not sealed
    returning id::text, finished_at is not null as finished`

/** The callbacks of a batch that finished as it was sealed. Locking: the batch row, new job rows. */
export const enqueueFinishedCallbacks = (sql: Sql, at: At, id: string) =>
  sql`select enqueue_batch_callbacks(array[${id}::bigint], ${SqlClock.now(sql, at)}) as n`

export const selectBatch = (sql: Sql, id: string) =>
  sql<Array<Record<string, unknown>>>`select * from job_batches where id = ${id}`

/**
 * The live parents among `ids`, locked, each marked `has_dependents` so its settle releases its dependents.
 * Locking: FOR UPDATE on each live parent, held to the enqueue's commit: a settle that comes later waits for
 * it and then sees the new dependents (`settle_finished` reads with a fresh snapshot); a parent a settle
 * locked first is gone when this returns, and `selectFinishedParents` (a new statement) finds it in the history.
 */
export const lockParents = (sql: Sql, ids: ReadonlyArray<string>) =>
  sql<Array<{ id: string; org_id: string | null }>>`
    with locked as (
      select id, org_id, has_dependents from jobs where id = any(${ids}::bigint[]) order by id for update
    ), marked as (
      update jobs j set has_dependents = true from locked l where j.id = l.id and l.has_dependents is not true
      returning j.id
    )
    select locked.id::text, locked.org_id from locked cross join (select count(*) from marked) m`

/** Parents that have finished, from the kept history. Locking: none (a finished job's row never changes). */
export const selectFinishedParents = (sql: Sql, ids: ReadonlyArray<string>) =>
  sql<Array<{ id: string; org_id: string | null; status: string }>>`
    select id::text, org_id, status from jobs_archive where id = any(${ids}::bigint[])`

/** The edges of newly inserted dependents. Locking: new rows only. */
export const insertEdges = (sql: Sql, edges: {
  readonly jobIds: ReadonlyArray<string>
  readonly parentIds: ReadonlyArray<string>
  readonly orgs: ReadonlyArray<string | null>
  readonly onFailure: ReadonlyArray<string>
}) =>
  sql`
    insert into job_dependencies (job_id, depends_on, org_id, on_failure)
    select * from unnest(${edges.jobIds}::bigint[], ${edges.parentIds}::bigint[], ${edges.orgs}::text[], ${edges.onFailure}::text[])
    on conflict do nothing`

/**
 * A job's parents and children with each one's status (live, else from the history) and, for a completed one
 * that is kept, its output. Locking: none.
 */
export const selectDependencies = (sql: Sql, id: string) =>
  sql<Array<{ side: "parent" | "child"; id: string; on_failure: string; stage: string | null; status: string | null; output: unknown }>>`
    with edges as (
      select 'parent' as side, depends_on as other, on_failure from job_dependencies where job_id = ${id}
      union all
      select 'child', job_id, on_failure from job_dependencies where depends_on = ${id}
    )
    select e.side, e.other::text as id, e.on_failure, coalesce(j.stage, a.stage) as stage,
           coalesce(j.status, a.status) as status, a.output
    from edges e
    left join jobs j on j.id = e.other
    left join jobs_archive a on a.id = e.other and j.id is null
    order by e.side desc, e.other`

/**
 * Edges whose dependent has left both the live table and the history (pruned, or never kept). Locking: SKIP
 * LOCKED on the edges it takes.
 */
export const pruneDependencies = (sql: Sql, limit: number) =>
  sql<Array<{ n: number }>>`
    with gone as (
      delete from job_dependencies where ctid = any(array(
        select d.ctid from job_dependencies d
        where not exists (select 1 from jobs j where j.id = d.job_id)
          and not exists (select 1 from jobs_archive a where a.id = d.job_id)
        limit ${limit} for update skip locked))
      returning 1
    )
    select count(*)::int as n from gone`

/**
 * Settles what depends on jobs that just finished (their dependents, their batches), in the statement that finished
 * them: a CTE that calls `settle_finished` (migration 0021) only when some finished row has `has_dependents` or a
 * `batch_id`, so a job with neither costs nothing more (both are read from the row the statement deletes anyway).
 * `rows` is the CTE of finished rows (with `id`, `has_dependents`, `batch_id`); `fate` and `reason` are SQL over
 * its columns.
 */
export const finishedSettled = (
  sql: Sql, at: At,
  rows: ReturnType<Sql>,
  fate: ReturnType<Sql>,
  reason: ReturnType<Sql>,
  retention: { readonly defaultMs: number; readonly byStage: string }
) =>
  sql`
      select settle_finished(array_agg(id), array_agg((${fate})::text), array_agg((${reason})::text), array_agg(batch_id),
                             ${retention.defaultMs}::float8, ${retention.byStage}::text::jsonb, ${SqlClock.now(sql, at)}) as n
      from ${rows} where has_dependents or batch_id is not null having count(*) > 0`

/**
 * Inserts a batch whose duplicates update the live job while it is still queued: `replace` takes the new
 * payload, priority and run time; `debounce` the same, but the run time only ever moves later. A running job
 * is left as it is. Updated rows' stages are NOTIFYed (the insert trigger sees only inserted rows), since a
 * run time may have moved earlier (and 'pgfiber:later' when one is not due yet). Locking: new rows, and the live row of each conflicting key.
 */
export const insertJobsReplacing = (sql: Sql, at: At, schema: string, jobs: ReadonlyArray<ValidJob>, mode: "replace" | "debounce") =>
  sql<Array<{ id: string; deduped: boolean; org_id: string | null; dedupe_key: string }>>`
    with written as (
      ${insertBatch(sql, at, jobs)}
      on conflict (org_id, dedupe_key) where dedupe_key is not null do update set
        payload = case when j.status = 'queued' then excluded.payload else j.payload end,
        priority = case when j.status = 'queued' then excluded.priority else j.priority end,
        available_at = case
          when j.status <> 'queued' then j.available_at
          when ${mode}::text = 'debounce' then greatest(j.available_at, excluded.available_at)
          else excluded.available_at end,
        updated_at = case when j.status = 'queued' then ${SqlClock.now(sql, at)} else j.updated_at end
      returning j.id, j.stage, j.org_id, j.dedupe_key, (j.xmax <> 0) as deduped, j.available_at
    ), woken as (
      select pg_notify(${channel(schema)}, stage) from (select distinct stage from written where deduped) s
      -- an updated job now due later: the workers' next-due timers re-arm (0017 does this for inserted rows)
      union all
      select pg_notify(${channel(schema)}, ${laterTopic}) where exists (select 1 from written where deduped and available_at > ${SqlClock.now(sql, at)})
    )
    select written.id, written.deduped, written.org_id, written.dedupe_key from written cross join (select count(*) from woken) w`

/**
 * The claim's plan, whatever the statistics say: an ordered scan of `jobs_ready` (stage, then the claim's exact
 * order, over queued rows only) that stops at the limit. With statistics taken while the table was small (as they
 * are after a restart or a quiet spell) the planner otherwise picks a bitmap scan and sorts the whole backlog,
 * so each claim costs more the longer the queue grows: 86 ms instead of 4 ms for 100 of 46,000 (docs/benchmarks.md).
 * Local to the claim's own transaction (`Db.runWithSettings`).
 */
const claimPlan: Readonly<Record<string, string>> = {
  enable_seqscan: "off",
  enable_bitmapscan: "off",
  enable_sort: "off"
}

/**
 * The fair, capped or rate-limited claim's settings (`claimShares`): the same pins (its `prio` lookup and its
 * unfair walk are the plain claim's ordered scan), and no JIT. The fair claim cannot avoid its small sorts (the
 * window over each org's rank, the final order), and `enable_sort = off` prices each at the planner's disable
 * cost, so the statement's estimate (~3e11) passes every JIT threshold: each claim then compiled ~190
 * functions, 1.3-9 s instead of 5-15 ms for 100 of 200,000 jobs over 1,000 orgs (docs/benchmarks.md).
 * And one generic plan, cached with the prepared statement: the statement is large, and planning it afresh
 * cost 7-15 ms a claim on a loaded machine; left to choose (`auto`), PostgreSQL 15 switched to the generic plan
 * after five claims anyway, one that then walked the stage's whole index from its start (1-2 s a claim of
 * 100-500 over 1,000 orgs) until `claimShares` stopped writing "no cursor" as a parameter.
 */
const sharesClaimPlan: Readonly<Record<string, string>> = { ...claimPlan, jit: "off", plan_cache_mode: "force_generic_plan" }

/**
 * What every claim runs under (`Db.runWithSettings`): the pins above, and no wait for the WAL flush at commit
 * (see `claimReady`). On a direct connection these are the sessions' own settings, given at connect, so a claim
 * is one statement and one round trip (no BEGIN, SET, COMMIT): a wake-up's claim of one job took 1.5-1.8 ms as a
 * transaction with local settings, 0.4 ms as one statement (docs/benchmarks.md).
 */
export const claimSettings: Readonly<Record<string, string>> = { ...sharesClaimPlan, synchronous_commit: "off" }

/** The plain claims' pick: the stage's first `limit` ready jobs in claim order, locked, skipping locked ones. */
const readyIds = (sql: Sql, at: At, stage: string, limit: number) =>
  sql`
      select id from jobs
      where stage = ${stage} and status = 'queued' and available_at <= ${SqlClock.now(sql, at)}
        and (select set_config('synchronous_commit', 'off', true)) = 'off'
        -- a paused stage claims nothing (the pools stop asking; this guards the moment before they hear it)
        and not exists (select 1 from stage_controls c where c.stage = ${stage} and c.paused)
      order by priority, available_at, id
      limit ${limit}
      for update skip locked`

/**
 * The order of a claimed job's fields in `claimedJobs`' arrays (`Rows.decodeClaimed` reads them by position).
 * Timestamps are epoch milliseconds, the id is text (a bigint can pass 2^53).
 */
export const claimedFields = [
  "id", "stage", "org_id", "subject_id", "payload", "priority", "status", "attempts", "max_attempts", "polls",
  "available_at", "locked_by", "locked_until", "lease", "dedupe_key", "errors", "last_error", "created_at",
  "updated_at", "started_at", "last_run_ms", "progress", "progress_message", "timeout_ms"
] as const

/**
 * Claimed jobs as the claims return them: one JSON array of them (in `order`, or in none), each job an array
 * of its fields in `claimedFields` order. Not rows: porsager's parse of a 25-column row cost the worker ~26 µs
 * a job, JSON.parse of the same jobs as objects ~13 µs, and arrays (no keys to write, escape and parse) with
 * timestamps as numbers (no date text to format and parse) ~8 µs, and less of the server's time than objects
 * (docs/benchmarks.md).
 */
const claimedJobs = (sql: Sql, from: ReturnType<Sql>, order: ReturnType<Sql> | null) => {
  // whole milliseconds, as a Date holds them (truncated, as JavaScript parses the timestamp's text): the float's
  // error at today's epoch is ~0.0002 ms, far under the half microsecond added
  const ms = (column: string) => sql`floor(date_part('epoch', c.${sql(column)}) * 1000 + 0.0005)`
  return sql`(select coalesce(json_agg(json_build_array(
      c.id::text, c.stage, c.org_id, c.subject_id, c.payload, c.priority, c.status, c.attempts, c.max_attempts, c.polls,
      ${ms("available_at")}, c.locked_by, ${ms("locked_until")}, c.lease, c.dedupe_key, c.errors, c.last_error,
      ${ms("created_at")}, ${ms("updated_at")}, ${ms("started_at")}, c.last_run_ms, c.progress, c.progress_message, c.timeout_ms
    )${order === null ? sql`` : sql` order by ${order}`}), '[]'::json) from ${from})`
}

/** `jobs_archive`'s columns as every hand-off to the history inserts them (a finished job's whole row, once). */
const archiveColumns = (sql: Sql) =>
  sql`id, stage, org_id, subject_id, payload, priority, status, attempts, max_attempts, polls, dedupe_key, errors,
      last_error, output, progress, progress_message, timeout_ms, created_at, started_at, finished_at, last_run_ms,
      keep_until`

/**
 * The insert that keeps cancelled queued or waiting jobs (`rows`, deleted from `jobs` by the caller) in the history
 * for their stage's retention (none when it is 0); returns a row per job kept. Used by a cancel and a bulk cancel.
 */
export const archiveCancelled = (
  sql: Sql, at: At, rows: ReturnType<Sql>, retention: { readonly defaultMs: number; readonly byStage: string }
) =>
  sql`
      insert into jobs_archive (${archiveColumns(sql)})
      -- a job that never finished a run: no output
      select id, stage, org_id, subject_id, payload, priority, 'cancelled', attempts, max_attempts, polls, dedupe_key,
             errors, last_error, null, progress, progress_message, timeout_ms, created_at, started_at, ${SqlClock.now(sql, at)}, last_run_ms,
             ${SqlClock.now(sql, at)} + coalesce((${retention.byStage}::text::jsonb ->> stage)::float8, ${retention.defaultMs}::float8) * interval '1 millisecond'
      from ${rows}
      where coalesce((${retention.byStage}::text::jsonb ->> stage)::float8, ${retention.defaultMs}::float8) > 0
      returning 1`

/** Every claim's `started` events, one per job of its `claimed` CTE; the worker is the row's shared data. */
const startedEvents = (sql: Sql, workerId: string, limit: number) =>
  logEvents(sql, sql`
      select org_id, stage, id, subject_id, 'started', attempts + 1, null::jsonb from claimed order by id`,
  sql`jsonb_build_object('worker', ${workerId}::text)`, limit)

/** What the plain claims write on each claimed row (`update jobs j set …`): a new lease for `workerId`. */
const claimedBy = (sql: Sql, at: At, workerId: string, leaseMs: number) =>
  sql`status = 'running', locked_by = ${workerId}, locked_until = ${SqlClock.now(sql, at)} + ${leaseMs} * interval '1 millisecond',
        lease = j.lease + 1, updated_at = ${SqlClock.now(sql, at)}, started_at = coalesce(j.started_at, ${SqlClock.now(sql, at)})`

/**
 * Claims due jobs. Locking: FOR UPDATE SKIP LOCKED on the ready index, so claimers never wait on each other.
 * The claim commits without waiting for its WAL flush (`synchronous_commit` off for this transaction only):
 * a crash can lose only the lease, which leaves the job queued or lets the reaper requeue it, and the fence
 * refuses any outcome written under a lost lease. It saves a flush on every wake-up.
 */
export const claimReady = (sql: Sql, at: At, stage: string, limit: number, workerId: string, leaseMs: number) =>
  sql<Array<{ jobs: ReadonlyArray<ReadonlyArray<unknown>> }>>`
    with next as (${readyIds(sql, at, stage, limit)}
    ), claimed as (
      update jobs j
      set ${claimedBy(sql, at, workerId, leaseMs)}
      -- by primary key, one lookup per claimed id: a join with \`next\` planned generically (the claim's sessions
      -- force generic plans) merge-joined the whole primary key, 75-100 ms a claim at 300,000 rows
      where j.id = any(array(select id from next))
      returning j.*
    ), logged as (
      ${startedEvents(sql, workerId, limit)}
    )
    -- in no order: sorting them here cost the server more than the worker (PgQueue sorts them)
    select ${claimedJobs(sql, sql`claimed c`, null)} as jobs`

/**
 * The plain claim, taken only when fair shares would claim the same jobs (`fits`), with whether they would:
 * - every ready job fits in the claim (at most `limit`): fair shares take them all as well. A fair stage's claim
 *   at a wake-up (a few jobs ready, no backlog) then needs none of the fair claim's walk over orgs: 0.3 ms instead
 *   of 0.8-1.0 ms for one job on PostgreSQL 18;
 * - or the most urgent ready priority holds one org's jobs only (no other org has a queued job of that priority,
 *   due or not: two descents of `jobs_ready_by_org`): fair shares give that org the whole claim, and fill it past
 *   its jobs in the plain order too (`claimShares`' `rest`). A backlog of one org (a library user without
 *   tenants: every job's org is null) is claimed at the plain claim's cost, 3-4 µs of the server's time a job
 *   less than the fair claim's (docs/benchmarks.md).
 * Otherwise it claims nothing (the `limit + 1` rows it locked are let go at its commit) and the fair claim
 * decides. Only for stages with no caps or rates (their room is counted by org in `claimShares`).
 */
// A queued job of the stage at `top`'s priority whose org sorts after (`>`) or before (`<`) `top`'s (1, or null:
// none): one descent of jobs_ready_by_org, in its order (as the fair claim's walk), which the claim's settings
// make the only plan. A scalar subquery, not EXISTS, which drops the order and the limit: the generic plan then
// filtered the stage's whole backlog through another index (117,701 rows read for a claim of 10)
const otherOrg = (sql: Sql, stage: string, side: ReturnType<Sql>) => sql`
        select 1 from jobs o
        where o.stage = ${stage} and o.status = 'queued' and o.priority = (select priority from top)
          and coalesce(o.org_id, '') ${side} (select org_key from top)
        order by coalesce(o.org_id, ''), o.available_at, o.id
        limit 1`

export const claimReadyIfAll = (sql: Sql, at: At, stage: string, limit: number, workerId: string, leaseMs: number) =>
  sql<Array<{ fits: boolean; jobs: ReadonlyArray<ReadonlyArray<unknown>> }>>`
    with next as (
      select id, priority, coalesce(org_id, '') as org_key from jobs
      where stage = ${stage} and status = 'queued' and available_at <= ${SqlClock.now(sql, at)}
        and (select set_config('synchronous_commit', 'off', true)) = 'off'
        and not exists (select 1 from stage_controls c where c.stage = ${stage} and c.paused)
      order by priority, available_at, id
      limit ${limit + 1}
      for update skip locked
    ), top as (
      select priority, org_key from next limit 1
    ), fits as (
      select (select count(*) from next) <= ${limit}
          or ((${otherOrg(sql, stage, sql`>`)}) is null and (${otherOrg(sql, stage, sql`<`)}) is null) as ok
    ), claimed as (
      update jobs j
      set ${claimedBy(sql, at, workerId, leaseMs)}
      where j.id = any(array(select id from next limit ${limit})) and (select ok from fits)
      returning j.*
    ), logged as (
      ${startedEvents(sql, workerId, limit)}
    )
    select (select ok from fits) as fits, ${claimedJobs(sql, sql`claimed c`, null)} as jobs`

/** A stage's effective limits for one claim (code, configuration and run-time overrides merged). */
export interface ClaimShares {
  readonly fair: boolean
  readonly maxRunning: number | null
  readonly maxRunningPerOrg: number | null
  readonly rate: { readonly limit: number; readonly perMs: number; readonly burst: number; readonly perOrg: boolean } | null
}

/** Serialises the claims of one capped or rate-limited stage, across processes, until the transaction ends. */
export const lockStageLimits = (sql: Sql, schema: string, stage: string) =>
  sql`select pg_advisory_xact_lock(hashtext(${`pgfiber.limits.${schema}`}), hashtext(${stage}))`

/**
 * Claims with fair shares, caps or a token bucket; one row: the claimed jobs (`claimedJobs`) in claim order, and
 * when the bucket is what stopped it, the ms until its next token.
 *
 * Fairness, at the most urgent priority with a ready job: a loose index scan over `jobs_ready_by_org` visits
 * the orgs with queued jobs in org order, starting after `cursor` (the last org the previous claim of this
 * process visited) and wrapping, at most `limit` of them (one index descent each, never a scan of the
 * backlog). Each of the k visited orgs offers its oldest ready jobs, ceil(limit / k) at most; those that
 * filled their share make up for those that could not; the claim takes them round by round: every org's r-th
 * before any org's (r+1)-th. What is still missing comes from the next priorities, in age order (unless caps
 * or buckets are per org). So with k orgs ready, every org is visited at least once in ceil(k / limit) claims.
 * Not fair (but capped or rate-limited per org): the same walk, in age order.
 * Caps: the stage's running leases are counted here, by org; the bucket is refilled and spent here. Both are
 * exact only under `lockStageLimits`, taken by an earlier statement of the same transaction, so that this
 * statement's snapshot sees every claim committed before it (a READ COMMITTED snapshot is taken per statement).
 * Locking: FOR UPDATE SKIP LOCKED in each read of an org's share (and of the extra and the next priorities):
 * a job another claim in flight holds is skipped and the org's next one locked instead, so claims of several
 * processes at once take different jobs and come back full. Locking only the picks afterwards left every claim
 * but the first with the same heads to skip: with 4 processes a claim of 250 came back with ~50 on average, five
 * times the claims (docs/benchmarks.md). The update finds the rows by the ctid they were locked at (a Tid Scan,
 * not a primary-key descent per job). The bucket rows it spends.
 */
export const claimShares = (
  sql: Sql, at: At, stage: string, limit: number, workerId: string, leaseMs: number, s: ClaimShares, cursor: string | null
) => {
  const byOrg = s.fair || s.maxRunningPerOrg !== null || (s.rate?.perOrg ?? false)
  const rate = s.rate ?? { limit: 1, perMs: 1000, burst: 1, perOrg: false }
  const limited = s.rate !== null
  // tokens in a bucket row at this statement's start, refilled since it was last spent and capped at the burst
  const refilled = (b: string) =>
    sql`least(${rate.burst}::float8, coalesce(${sql(b)}.tokens + greatest(0, extract(epoch from ${SqlClock.now(sql, at, "statement")} - ${sql(b)}.refilled_at)) * 1000
          * ${rate.limit}::float8 / ${rate.perMs}::float8, ${rate.burst}::float8))`
  const perOrgLimits = s.maxRunningPerOrg !== null || rate.perOrg && limited
  // the first queued job of the next org in index order: one descent lands on the org and on its oldest job
  const headAfter = (cond: ReturnType<typeof sql>) => sql`
    select coalesce(j.org_id, '') as org_key, j.id, j.available_at, j.ctid as tid from jobs j
    where j.stage = ${stage} and j.status = 'queued' and j.priority = (select priority from prio) and ${cond}
    order by coalesce(j.org_id, ''), j.available_at, j.id limit 1`
  const candidates = byOrg
    ? sql`
      after_cursor(org_key, id, available_at, tid, n) as (
        -- two statements (cursor or none), not one with "$cursor is null or ...": that OR is no index condition,
        -- so a generic plan would scan the stage's whole index from its start
        (select h.*, 1 from (${headAfter(cursor === null ? sql`true` : sql`coalesce(j.org_id, '') > ${cursor}::text`)}) h)
        union all
        select h.*, g.n + 1 from after_cursor g
        cross join lateral (${headAfter(sql`coalesce(j.org_id, '') > g.org_key`)}) h
        where g.n < ${limit}::int
      ), from_start(org_key, id, available_at, tid, n) as (
        (select h.*, (select count(*) from after_cursor) + 1
         from (${headAfter(sql`coalesce(j.org_id, '') <= ${cursor}::text`)}) h
         where ${cursor}::text is not null and (select count(*) from after_cursor) < ${limit}::int)
        union all
        select h.*, g.n + 1 from from_start g
        cross join lateral (${headAfter(sql`coalesce(j.org_id, '') > g.org_key and coalesce(j.org_id, '') <= ${cursor}::text`)}) h
        where g.n < ${limit}::int
      ), visited as (
        select * from after_cursor union all select * from from_start
      ), offers as (
        -- room: what the org's cap and bucket allow; offer: its fair share of this claim within that room
        select v.org_key, v.n, v.id, v.tid, v.available_at, o.room,
               least(o.room, ${s.fair ? sql`ceil(${limit}::float8 / (select count(*) from visited))::int` : sql`${limit}::int`}) as offer
        from visited v
        left join running r on r.org_key = v.org_key
        left join rate_buckets b on b.stage = ${stage} and b.org_key = v.org_key
        cross join lateral (
          select least(${limit}::int,
                       ${s.maxRunningPerOrg === null ? sql`${limit}::int` : sql`greatest(0, ${s.maxRunningPerOrg}::int - coalesce(r.n, 0))::int`},
                       ${limited && rate.perOrg ? sql`floor(${refilled("b")})::int` : sql`${limit}::int`}) as room) o
      ), shares as (
        -- each org's oldest ready jobs from its head on, up to its share, locked as they are read: a job another
        -- claim in flight holds is skipped and the org's next one taken, so claims running at once in several
        -- processes take different jobs instead of all picking the same heads and coming back short
        select f.org_key, f.room, f.offer, c.id, c.tid, c.available_at, c.priority
        from offers f cross join lateral (
          select j.id, j.ctid as tid, j.available_at, j.priority from jobs j
          where j.stage = ${stage} and j.status = 'queued' and j.priority = (select priority from prio)
            and coalesce(j.org_id, '') = f.org_key and j.available_at <= ${SqlClock.now(sql, at)}
            -- the org's key leads the row comparison (the same order, as the key is equal): only jobs_ready_by_org
            -- can serve it. With (available_at, id) alone, the planner (15 and 18) took jobs_due for a range from
            -- the head's available_at, guessing it narrow, and an incremental sort (which enable_sort = off does
            -- not price) read and sorted every job enqueued in the head's instant (a bulk enqueue shares one
            -- now()) or after it in any stage or org: 50-140 ms a claim of 500 at 1M queued, ~20 ms now
            and (coalesce(j.org_id, ''), j.available_at, j.id) >= (f.org_key, f.available_at, f.id)
          order by j.available_at, j.id
          limit f.offer
          for update of j skip locked
        ) c
        where f.offer >= 1 and f.available_at <= ${SqlClock.now(sql, at)}
      ), filled as (
        -- orgs with fewer ready jobs than their share leave the claim short: the orgs that filled theirs
        -- offer more, up to that shortfall each (still round by round: these rank after every first share)
        select f.org_key, f.offer, f.room - f.offer as more
        from offers f
        where f.offer < f.room and f.offer = (select count(*) from shares s where s.org_key = f.org_key)
      ), extra as (
        select f.org_key, c.id, c.tid, c.available_at, c.priority
        from filled f cross join lateral (
          select j.id, j.ctid as tid, j.available_at, j.priority from jobs j
          where j.stage = ${stage} and j.status = 'queued' and j.priority = (select priority from prio)
            and coalesce(j.org_id, '') = f.org_key and j.available_at <= ${SqlClock.now(sql, at)}
          order by j.available_at, j.id
          offset f.offer
          limit least(f.more, ${limit}::int - (select count(*) from shares))
          for update of j skip locked
        ) c
        where (select count(*) from shares) < ${limit}::int
      ), rest as (
        -- the most urgent priority could not fill the claim: the next ones, in claim order (not by org)
        select coalesce(j.org_id, '') as org_key, j.id, j.ctid as tid, j.available_at, j.priority from jobs j
        where ${!perOrgLimits} and j.stage = ${stage} and j.status = 'queued' and j.available_at <= ${SqlClock.now(sql, at)}
          and j.priority > (select priority from prio)
          and (select count(*) from shares) + (select count(*) from extra) < ${limit}::int
        order by j.priority, j.available_at, j.id
        limit greatest(0, ${limit}::int - (select count(*) from shares) - (select count(*) from extra))
        for update of j skip locked
      ), candidates as (
        select u.id, u.tid, u.org_key, u.available_at, u.priority,
               row_number() over (partition by u.priority, u.org_key order by u.available_at, u.id) as org_rank
        from (select org_key, id, tid, available_at, priority from shares
              union all select org_key, id, tid, available_at, priority from extra
              union all select org_key, id, tid, available_at, priority from rest) u
      )`
    : sql`
      candidates as (
        select j.id, j.ctid as tid, coalesce(j.org_id, '') as org_key, j.available_at, j.priority, 1::bigint as org_rank from jobs j
        where j.stage = ${stage} and j.status = 'queued' and j.available_at <= ${SqlClock.now(sql, at)}
        order by j.priority, j.available_at, j.id
        limit ${limit}
        for update of j skip locked
      )`
  return sql<Array<{
    jobs: ReadonlyArray<ReadonlyArray<unknown>>
    rate_wait_ms: number | null
    capped: boolean
    cursor: string | null
    orgs: number | null
  }>>`
    with recursive
    prio as (
      select priority from jobs
      where stage = ${stage} and status = 'queued' and available_at <= ${SqlClock.now(sql, at)}
        -- a paused stage claims nothing (the pools stop asking; this guards the moment before they hear it)
        and not exists (select 1 from stage_controls c where c.stage = ${stage} and c.paused)
      order by priority, available_at, id limit 1
    ), running as (
      select coalesce(org_id, '') as org_key, count(*)::int as n from jobs
      where ${s.maxRunning !== null || s.maxRunningPerOrg !== null} and stage = ${stage} and status <> 'queued' and status <> 'waiting'
      group by 1
    ), stage_bucket as (
      select ${refilled("b")} as tokens
      from (select 1) one left join rate_buckets b on b.stage = ${stage} and b.org_key = ''
    ), room as (
      select least(${limit}::int,
                   ${s.maxRunning === null ? sql`${limit}::int` : sql`greatest(0, ${s.maxRunning}::int - (select coalesce(sum(n), 0) from running))::int`},
                   ${limited && !rate.perOrg ? sql`floor((select tokens from stage_bucket))::int` : sql`${limit}::int`}) as n
    ), ${candidates}, picked as (
      select id, tid, org_key, row_number() over (order by priority, ${s.fair ? sql`org_rank,` : sql``} available_at, id) as ord
      from candidates
      order by priority, ${s.fair ? sql`org_rank,` : sql``} available_at, id
      limit (select n from room)
    ), locked as (
      -- every candidate was locked as it was read (FOR UPDATE SKIP LOCKED in the walk's reads)
      select id, tid from picked
      where (select set_config('synchronous_commit', 'off', true)) = 'off'
        and not exists (select 1 from stage_controls c where c.stage = ${stage} and c.paused)
    ), claimed as (
      update jobs j
      set status = 'running', locked_by = ${workerId}, locked_until = ${SqlClock.now(sql, at)} + ${leaseMs} * interval '1 millisecond',
          lease = j.lease + 1, updated_at = ${SqlClock.now(sql, at, "statement")}, started_at = coalesce(j.started_at, ${SqlClock.now(sql, at, "statement")})
      where j.ctid = any(array(select tid from locked))
      returning j.*
    ), logged as (
      ${startedEvents(sql, workerId, limit)}
    ), spent as (
      select ${rate.perOrg ? sql`p.org_key` : sql`''`} as org_key, count(*)::int as n
      from claimed c join picked p on p.id = c.id
      where ${limited}
      group by 1
    ), spend as (
      insert into rate_buckets as b (stage, org_key, tokens, refilled_at, next_token_at)
      select ${stage}, t.org_key, t.tokens, t.at,
             case when t.tokens < 1 then t.at + (1 - t.tokens) * ${rate.perMs}::float8 / ${rate.limit}::float8 * interval '1 millisecond' end
      from (
        select s.org_key, ${refilled("prev")} - s.n as tokens,
               greatest(${SqlClock.now(sql, at, "statement")}, coalesce(prev.refilled_at, ${SqlClock.now(sql, at, "statement")})) as at
        from spent s left join rate_buckets prev on prev.stage = ${stage} and prev.org_key = s.org_key
      ) t
      on conflict (stage, org_key) do update
        set tokens = excluded.tokens, refilled_at = excluded.refilled_at, next_token_at = excluded.next_token_at
      returning b.org_key, b.tokens
    ), after as (
      -- what each bucket that limits this stage holds now: the spent ones as written, the others as refilled
      ${rate.perOrg
      ? sql`select coalesce(sp.tokens, ${refilled("b")}) as tokens from visited h
            left join spend sp on sp.org_key = h.org_key
            left join rate_buckets b on b.stage = ${stage} and b.org_key = h.org_key`
      : sql`select coalesce((select tokens from spend), (select tokens from stage_bucket)) as tokens`}
    )
    select
      ${claimedJobs(sql, sql`claimed c join picked p on p.id = c.id`, sql`p.ord`)} as jobs,
      case when ${limited} and (select count(*) from claimed) < ${limit}::int and exists (select 1 from prio)
                and (select min(tokens) from after) < 1
           then ((1 - (select min(tokens) from after)) * ${rate.perMs}::float8 / greatest(${rate.limit}::float8, 1e-9))::float8
      end as rate_wait_ms,
      (${s.maxRunning !== null || s.maxRunningPerOrg !== null} and (select count(*) from claimed) < ${limit}::int
        and exists (select 1 from prio)) as capped,
      ${byOrg ? sql`(select org_key from visited order by n desc limit 1)` : sql`null::text`} as cursor,
      -- the orgs the walk found at the claim's priority (it stops at the limit): one, with a limit over one, and the plain claim would do
      ${byOrg ? sql`(select count(*)::int from visited)` : sql`null::int`} as orgs`
}

/** Run-time limit overrides. Locking: none (a small table read by claimers through a one-second cache). */
export const selectLimitOverrides = (sql: Sql) => sql<Array<Record<string, unknown>>>`select * from stage_limits order by stage`

/** Merges fields into a stage's override (nulls keep the stored value). Locking: that row. */
export const upsertLimitOverride = (sql: Sql, at: At, stage: string, o: {
  fair: boolean | null; maxRunning: number | null; maxRunningPerOrg: number | null; rateLimit: number | null
  ratePerMs: number | null; rateBurst: number | null; ratePerOrg: boolean | null
}) =>
  sql<Array<Record<string, unknown>>>`
    insert into stage_limits as l (stage, fair, max_running, max_running_per_org, rate_limit, rate_per_ms, rate_burst, rate_per_org)
    values (${stage}, ${o.fair}, ${o.maxRunning}, ${o.maxRunningPerOrg}, ${o.rateLimit}, ${o.ratePerMs}, ${o.rateBurst}, ${o.ratePerOrg})
    on conflict (stage) do update set
      fair = coalesce(excluded.fair, l.fair),
      max_running = coalesce(excluded.max_running, l.max_running),
      max_running_per_org = coalesce(excluded.max_running_per_org, l.max_running_per_org),
      rate_limit = coalesce(excluded.rate_limit, l.rate_limit),
      rate_per_ms = coalesce(excluded.rate_per_ms, l.rate_per_ms),
      rate_burst = coalesce(excluded.rate_burst, l.rate_burst),
      rate_per_org = coalesce(excluded.rate_per_org, l.rate_per_org),
      updated_at = ${SqlClock.now(sql, at)}
    returning *`

/** Drops a stage's override and its buckets (a changed rate starts from a full bucket). Locking: those rows. */
export const deleteLimitOverride = (sql: Sql, stage: string) =>
  sql<Array<{ stage: string }>>`
    with buckets as (delete from rate_buckets where stage = ${stage})
    delete from stage_limits where stage = ${stage} returning stage`

/**
 * Empties the error history of leased jobs (their lease still held) whose claimed row did not decode; returns the
 * history it replaced, as text, for the dead letter's reason.
 */
export const clearErrorHistory = (sql: Sql, ids: ReadonlyArray<string>, leases: ReadonlyArray<number>) =>
  sql<Array<{ id: string; errors: string }>>`
    with bad as (
      select j.id, j.errors::text as errors
      from jobs j join unnest(${ids}::bigint[], ${leases}::int[]) as u(id, lease) on j.id = u.id and j.lease = u.lease
      where j.status = 'running'
      for update of j
    )
    update jobs j set errors = '[]'::jsonb from bad where j.id = bad.id
    returning j.id::text as id, bad.errors`

/**
 * Extends held leases, and writes the progress reported since the last beat (`reported` 0: unchanged). Returns
 * the ids whose lease still holds, as this statement's snapshot sees them.
 * Locking: SKIP LOCKED on the caller's own running jobs, so a heartbeat never waits for a row lock and can take
 * part in no deadlock, whatever order other statements lock in. A row it skips is locked by its own settle (the
 * job is finishing) or by a cancel (its next beat finds it cancelled): still held, extended at the next beat
 * (a beat comes every quarter of a lease), and its progress report of this beat is not written. Unindexed
 * columns, so HOT.
 */
export const extendLeases = (
  sql: Sql, at: At,
  ids: ReadonlyArray<string>,
  leases: ReadonlyArray<number>,
  leaseMs: number,
  progress: {
    /** 1 where progress was reported since the last beat, else 0 */
    readonly reported: ReadonlyArray<number>
    readonly values: ReadonlyArray<number | null>
    readonly messages: ReadonlyArray<string | null>
  }
) =>
  sql<Array<{ id: string }>>`
    with beats as (
      select * from unnest(${ids}::bigint[], ${leases}::int[], ${progress.reported}::int[], ${progress.values}::float4[],
                           ${progress.messages}::text[]) as h(id, lease, reported, progress, message)
    ), held as (
      select j.id from jobs j join beats h on j.id = h.id and j.lease = h.lease where j.status = 'running'
    ), free as (
      select j.id, h.reported, h.progress, h.message
      from jobs j join beats h on j.id = h.id and j.lease = h.lease
      where j.status = 'running'
      for update of j skip locked
    ), extended as (
      update jobs j set locked_until = ${SqlClock.now(sql, at)} + ${leaseMs} * interval '1 millisecond', updated_at = ${SqlClock.now(sql, at)},
        progress = case when free.reported = 1 then free.progress else j.progress end,
        progress_message = case when free.reported = 1 then free.message else j.progress_message end
      from free where j.id = free.id
      returning j.id, j.stage, j.org_id, j.subject_id, j.attempts, free.reported, j.progress, j.progress_message
    ), logged as (
      ${logEvents(sql, sql`
      select org_id, stage, id, subject_id, 'progress', attempts + 1,
             jsonb_build_object('progress', progress, 'message', progress_message)
      from extended where reported = 1 order by id`, undefined, ids.length)}
    )
    select id from held`

/**
 * Settles a batch of outcomes of every kind in one statement (the settler's group commit). Each input row is
 * (id, lease, kind, delay_ms, tag, message, output, run_ms, retain_ms, progress, progress_message) with kind one
 * of complete | retry |
 * reschedule | dead | release; a retry with no attempt left becomes dead, and a job cancelled while it ran is
 * removed by anything but a completion. A finished job (completed, dead, removed as cancelled) whose retention
 * (`retain_ms`, else its stage's in `retainByStage`, else `retainDefaultMs`) is above zero is handed to
 * `jobs_archive` in the same statement; at zero it is only deleted. Each failed attempt's history entry names
 * the worker that held the lease. Returns one row per outcome whose lease still held, with the action taken;
 * the others were fenced. Releases and due requeues wake their stages, requeues for later 'pgfiber:later' (every
 * Waker re-arms its timer); with `wakeFreed` (a capped stage) every
 * settled job's stage is woken too, so a claimer in any process waiting for a free slot under the cap looks again.
 * Locking: the caller's own leased rows, locked in id order first; a fenced row is never locked. Archive rows are
 * new (keyed by job id).
 */
export const settleOutcomes = (
  sql: Sql, at: At,
  schema: string,
  o: {
    readonly ids: ReadonlyArray<string>
    readonly leases: ReadonlyArray<number>
    readonly kinds: ReadonlyArray<string>
    readonly delays: ReadonlyArray<number>
    readonly tags: ReadonlyArray<string | null>
    readonly messages: ReadonlyArray<string | null>
    readonly outputs: ReadonlyArray<string | null>
    readonly runMs: ReadonlyArray<number | null>
    readonly retainMs: ReadonlyArray<number | null>
    /** The run's last progress report not yet written (null: none; the job's own stays). */
    readonly progress: ReadonlyArray<number | null>
    readonly progressMessages: ReadonlyArray<string | null>
  },
  retention: { readonly defaultMs: number; readonly byStage: string },
  wakeFreed = false
) =>
  sql<Array<{ id: string; action: string; reason: string | null }>>`
    with input as (
      select * from unnest(${o.ids}::bigint[], ${o.leases}::int[], ${o.kinds}::text[], ${o.delays}::float8[],
                           ${o.tags}::text[], ${o.messages}::text[], ${o.outputs}::text[], ${o.runMs}::float8[],
                           ${o.retainMs}::float8[], ${o.progress}::float4[], ${o.progressMessages}::text[])
        as i(id, lease, kind, delay_ms, tag, message, output, run_ms, retain_ms, progress, progress_message)
    ), held as (
      select j.id, j.stage, i.delay_ms, i.tag, i.message, i.output, i.run_ms,
             i.progress is not null as reported, i.progress, i.progress_message,
             coalesce(i.retain_ms, (${retention.byStage}::text::jsonb ->> j.stage)::float8, ${retention.defaultMs}::float8) as retain_ms,
             case when i.kind = 'complete' then 'complete'
                  when j.status = 'cancelled' then 'remove'
                  when i.kind = 'retry' and j.attempts + 1 >= j.max_attempts then 'dead'
                  else i.kind end as action
      from jobs j join input i on j.id = i.id and j.lease = i.lease
      where j.status in ('running', 'cancelled')
      order by j.id
      for update of j
    ), deleted as (
      delete from jobs j using held h where j.id = h.id and h.action in ('complete', 'remove')
      returning j.*, h.action, h.output as result, h.run_ms as run_ms_now, h.retain_ms as keep_ms,
        h.reported, h.progress as progress_now, h.progress_message as progress_message_now
    ), died as (
      delete from jobs j using held h where j.id = h.id and h.action = 'dead'
      -- a job claimed with its attempts already spent (the reaper recorded the last one) keeps count and history
      returning j.*, h.tag as dead_tag, h.message as dead_message, h.run_ms as run_ms_now, h.retain_ms as keep_ms,
        h.reported, h.progress as progress_now, h.progress_message as progress_message_now,
        case when j.attempts >= j.max_attempts then j.attempts else j.attempts + 1 end as final_attempts,
        case when j.attempts >= j.max_attempts then j.errors
             else j.errors || jsonb_build_array(jsonb_build_object('attempt', j.attempts + 1, 'at', ${SqlClock.now(sql, at)},
                    'tag', h.tag, 'message', h.message, 'worker', j.locked_by)) end as final_errors
    ), buried as (
      insert into dead_letters (job_id, stage, org_id, subject_id, payload, priority, attempts, max_attempts,
                                dedupe_key, reason, error_history, job_created_at, dead_at)
      select id, stage, org_id, subject_id, payload, priority, final_attempts, max_attempts, dedupe_key, dead_message,
             final_errors, created_at, ${SqlClock.now(sql, at)}
      from died
      returning job_id, reason
    ), kept as (
      insert into jobs_archive (${archiveColumns(sql)})
      select id, stage, org_id, subject_id, payload, priority,
             case when action = 'complete' then 'completed' else 'cancelled' end, attempts, max_attempts, polls,
             dedupe_key, errors, last_error, case when action = 'complete' then result::jsonb end,
             case when reported then progress_now else progress end,
             case when reported then progress_message_now else progress_message end,
             timeout_ms, created_at, started_at, ${SqlClock.now(sql, at)}, coalesce(run_ms_now, last_run_ms),
             ${SqlClock.now(sql, at)} + keep_ms * interval '1 millisecond'
      from deleted where keep_ms > 0
      union all
      select id, stage, org_id, subject_id, payload, priority, 'dead', final_attempts, max_attempts, polls,
             dedupe_key, final_errors, dead_message, null,
             case when reported then progress_now else progress end,
             case when reported then progress_message_now else progress_message end, timeout_ms,
             created_at, started_at, ${SqlClock.now(sql, at)}, coalesce(run_ms_now, last_run_ms), ${SqlClock.now(sql, at)} + keep_ms * interval '1 millisecond'
      from died where keep_ms > 0
    ), requeued as (
      update jobs j
      set status = 'queued', locked_by = null, locked_until = null, updated_at = ${SqlClock.now(sql, at)},
          available_at = ${SqlClock.now(sql, at)} + h.delay_ms * interval '1 millisecond',
          attempts = j.attempts + (h.action = 'retry')::int,
          polls = j.polls + (h.action = 'reschedule')::int,
          last_run_ms = coalesce(h.run_ms, j.last_run_ms),
          progress = case when h.reported then h.progress else j.progress end,
          progress_message = case when h.reported then h.progress_message else j.progress_message end,
          last_error = case when h.action = 'retry' then h.message else j.last_error end,
          errors = case when h.action = 'retry'
                        then j.errors || jsonb_build_array(jsonb_build_object(
                          'attempt', j.attempts + 1, 'at', ${SqlClock.now(sql, at)}, 'tag', h.tag, 'message', h.message, 'worker', j.locked_by))
                        else j.errors end
      from held h where j.id = h.id and h.action in ('retry', 'reschedule', 'release')
      returning j.id, j.stage, h.action, h.delay_ms, j.org_id, j.subject_id, j.attempts, h.tag, h.message
    ), logged as (
      -- a report not yet written by a heartbeat, then the outcome: the job's progress event comes first
      ${logEvents(sql, sql`
      select org_id, stage, id, subject_id, kind, attempt, data from (
        select j.org_id, j.stage, j.id, j.subject_id, 'progress' as kind, j.attempts + 1 as attempt,
               jsonb_build_object('progress', h.progress, 'message', h.progress_message) as data, 0 as step
        from held h join jobs j on j.id = h.id where h.reported
        union all
        select org_id, stage, id, subject_id, case when action = 'complete' then 'completed' else 'cancelled' end,
               attempts + 1,
               case when action = 'complete'
                    then jsonb_build_object('outputBytes', coalesce(octet_length(result), 0), 'runMs', run_ms_now) end, 1
        from deleted
        union all
        select org_id, stage, id, subject_id, 'dead', final_attempts,
               jsonb_build_object('tag', dead_tag, 'message', dead_message, 'runMs', run_ms_now), 1
        from died
        union all
        select org_id, stage, id, subject_id, case when action = 'retry' then 'retried' else 'rescheduled' end,
               case when action = 'retry' then attempts else attempts + 1 end,
               jsonb_build_object('delayMs', delay_ms, 'tag', tag, 'message', message), 1
        from requeued where action <> 'release'
      ) e order by id, step`, undefined, o.ids.length)}
    ), woken as (
      select pg_notify(${channel(schema)}, stage) from (
        select stage from requeued where delay_ms <= 0
        union select stage from held where ${wakeFreed}) s
      -- a retry or poll for later: every process's next-due timer hears of it, not only this one's
      union all
      select pg_notify(${channel(schema)}, ${laterTopic}) where exists (select 1 from requeued where delay_ms > 0)
    ), released as (
      ${finishedSettled(sql, at, sql`deleted`, sql`case when action = 'complete' then 'completed' else 'cancelled' end`, sql`null::text`, retention)}
      union all
      ${finishedSettled(sql, at, sql`died`, sql`'dead'`, sql`dead_message`, retention)}
    )
    select id::text, action, null::text as reason from deleted
    union all select job_id::text, 'dead', reason from buried
    -- the aggregate forces the notify CTE to run, whether or not anything was requeued (a freed slot wakes too)
    union all select id::text, action, null from requeued
    union all select null, null, null from (select count(*) as n from woken) w where w.n < 0
    union all select null, null, null from (select count(*) as n from released) r where r.n < 0`

/**
 * Settles a batch of completions only (no follow-ups), the settler's common case, in a statement of its own:
 * `settleOutcomes`' work for kind `complete` (a job cancelled while it ran completes too), without its outcome
 * kinds, its lock in id order and its other writes: about 35 % less of the server's time per job
 * (docs/benchmarks.md). Each input row is (id, lease, output, run_ms); the retention is `retainMs` for every
 * job, else its stage's in `retainByStage`, else `retainDefaultMs`. Returns the ids it did not complete (their
 * leases had moved on: fenced), usually none, so the worker parses no row per job. With `wakeFreed` every
 * completed job's stage is woken.
 * Locking: the caller's own leased rows, in whatever order the delete finds them: nothing else that waits for
 * one of them holds another (a heartbeat waits for none, `extendLeases`; a cancel takes one row; each outcome is
 * settled by one statement). A row whose lease moved on is never locked. Archive rows are new (keyed by job id).
 */
export const completeOutcomes = (
  sql: Sql, at: At,
  schema: string,
  o: {
    readonly ids: ReadonlyArray<string>
    readonly leases: ReadonlyArray<number>
    readonly outputs: ReadonlyArray<string | null>
    readonly runMs: ReadonlyArray<number | null>
  },
  retainMs: number | null,
  retention: { readonly defaultMs: number; readonly byStage: string },
  wakeFreed = false
) =>
  sql<Array<{ id: string }>>`
    with deleted as (
      delete from jobs j
      using unnest(${o.ids}::bigint[], ${o.leases}::int[], ${o.outputs}::text[], ${o.runMs}::float8[]) as i(id, lease, output, run_ms)
      where j.id = i.id and j.lease = i.lease and j.status in ('running', 'cancelled')
      returning j.*, i.output as result, i.run_ms as run_ms_now,
        coalesce(${retainMs}::float8, (${retention.byStage}::text::jsonb ->> j.stage)::float8, ${retention.defaultMs}::float8) as keep_ms
    ), kept as (
      insert into jobs_archive (${archiveColumns(sql)})
      select id, stage, org_id, subject_id, payload, priority, 'completed', attempts, max_attempts, polls,
             dedupe_key, errors, last_error, result::jsonb, progress, progress_message, timeout_ms,
             created_at, started_at, ${SqlClock.now(sql, at)}, coalesce(run_ms_now, last_run_ms), ${SqlClock.now(sql, at)} + keep_ms * interval '1 millisecond'
      from deleted where keep_ms > 0
    ), logged as (
      ${logEvents(sql, sql`
      -- a job cancelled while it ran completes too, as the history records it
      select org_id, stage, id, subject_id, 'completed', attempts + 1,
             jsonb_build_object('outputBytes', coalesce(octet_length(result), 0), 'runMs', run_ms_now)
      from deleted order by id`, undefined, o.ids.length)}
    ), woken as (
      select pg_notify(${channel(schema)}, stage) from (select distinct stage from deleted where ${wakeFreed}) s
    ), released as (
      ${finishedSettled(sql, at, sql`deleted`, sql`'completed'`, sql`null::text`, retention)}
    )
    select i.id::text from unnest(${o.ids}::bigint[]) as i(id) where not exists (select 1 from deleted d where d.id = i.id)
    -- the aggregates force the notify and release CTEs to run
    union all select null from (select count(*) as n from woken) w where w.n < 0
    union all select null from (select count(*) as n from released) r where r.n < 0`

/** Only one reaper runs at a time, across every process: the others skip this round. */
export const tryReaperLock = (sql: Sql, schema: string) =>
  sql<Array<{ locked: boolean }>>`select pg_try_advisory_xact_lock(hashtext(${`pgfiber.reaper.${schema}`})) as locked`

/** Removes cancelled jobs whose worker is gone. Locking: SKIP LOCKED, so a live worker's row is left alone. */
export const removeExpiredCancelled = (sql: Sql, at: At, retention: { readonly defaultMs: number; readonly byStage: string }) =>
  sql<Array<{ id: string }>>`
    with removed as (
      delete from jobs where id in (
        select id from jobs where status = 'cancelled' and locked_until < ${SqlClock.now(sql, at)} for update skip locked)
      returning id, has_dependents, batch_id
    ), released as (
      ${finishedSettled(sql, at, sql`removed`, sql`'cancelled'`, sql`null::text`, retention)}
    )
    select removed.id from removed cross join (select count(*) from released) r`

/**
 * Requeues expired leases, spending the attempt, and wakes their stages; one whose last attempt that was is
 * requeued too (attempts = max_attempts): the reaper may run in a process that lacks the stage, so the
 * stage's own claim dead-letters it and runs its onDeadLetter. Locking: SKIP LOCKED over expired rows.
 */
export const requeueExpired = (sql: Sql, at: At, schema: string) =>
  sql<Array<{ id: string }>>`
    with expired as (
      update jobs set status = 'queued', attempts = attempts + 1, available_at = ${SqlClock.now(sql, at)},
        last_error = 'lease expired: the worker ' || coalesce(locked_by, '?') || ' stopped heartbeating',
        errors = errors || jsonb_build_array(jsonb_build_object('attempt', attempts + 1, 'at', ${SqlClock.now(sql, at)}, 'tag', 'LeaseExpired',
          'message', 'lease expired: the worker ' || coalesce(locked_by, '?') || ' stopped heartbeating', 'worker', locked_by)),
        locked_by = null, locked_until = null, updated_at = ${SqlClock.now(sql, at)}
      where id in (
        select id from jobs where status = 'running' and locked_until < ${SqlClock.now(sql, at)} for update skip locked)
      returning id, stage, org_id, subject_id, attempts, last_error
    ), logged as (
      ${logEvents(sql, sql`
      select org_id, stage, id, subject_id, 'retried', attempts,
             jsonb_build_object('delayMs', 0, 'tag', 'LeaseExpired', 'message', last_error)
      from expired order by id`)}
    ), woken as (
      select pg_notify(${channel(schema)}, stage) from (select distinct stage from expired) s
    )
    select expired.id from expired cross join (select count(*) from woken) w`

/**
 * When the waker should look again, as ms from the database's now. With `seenBy` (the safety sweep's round, once
 * per sweep interval), the same statement also marks that process's stage registry rows seen, so the registry's
 * refresh costs no statement of its own; every other call sends the plain question (bench/nextWakeCost.ts).
 * Locking: none on jobs (reads on two partial indexes); with `seenBy`, that process's registry rows.
 */
export const nextWake = (sql: Sql, at: At, stages: ReadonlyArray<string>, seenBy: string | null) => {
  // each stage's next due time once, read by both columns: the earliest, and the stages due now (the timer wakes
  // only their pools: an idle stage's pool woken for another stage's backlog would claim nothing and ask again)
  const due = sql`
      due as (
        select s.stage, (select min(available_at) from jobs where jobs.stage = s.stage and status = 'queued') as at
        from unnest(${stages}::text[]) as s(stage))`
  const columns = sql`
      (extract(epoch from (select min(at) from due) - ${SqlClock.now(sql, at)}) * 1000)::float8 as job_due_in_ms,
      (select array_agg(stage) from due where at <= ${SqlClock.now(sql, at)}) as due_now,
      (extract(epoch from (select min(locked_until) from jobs where status <> 'queued') - ${SqlClock.now(sql, at)}) * 1000)::float8
        as lease_expires_in_ms`
  return seenBy === null
    ? sql<Array<NextWakeRow>>`with ${due} select ${columns}`
    : sql<Array<NextWakeRow>>`
      with seen as (update stage_processes set last_seen_at = ${SqlClock.now(sql, at)} where worker_id = ${seenBy} returning 1),
      ${due}
      select (select count(*) from seen)::int as seen, ${columns}`
}

interface NextWakeRow {
  readonly job_due_in_ms: number | null
  /** The stages with a job due now; null: none. */
  readonly due_now: ReadonlyArray<string> | null
  readonly lease_expires_in_ms: number | null
}

/**
 * Cancels a job: a queued one is deleted (into the history, as `cancelled`, when its stage keeps any), a
 * running one is marked for its worker. Locking: that row.
 */
export const cancelJob = (sql: Sql, at: At, id: string, retention: { readonly defaultMs: number; readonly byStage: string }) =>
  sql<Array<{ outcome: string; stage: string | null; org_id: string | null }>>`
    with target as (select id, status, stage, org_id from jobs where id = ${id} for update),
    removed as (delete from jobs j using target t where j.id = t.id and t.status in ('queued', 'waiting') returning j.*),
    -- its dependents are cancelled (or dead-lettered, or released) down their chains, as for any cancelled parent
    released as (
      ${finishedSettled(sql, at, sql`removed`, sql`'cancelled'`, sql`null::text`, retention)}
    ),
    kept as (${archiveCancelled(sql, at, sql`removed`, retention)}),
    marked as (
      update jobs j set status = 'cancelled', updated_at = ${SqlClock.now(sql, at)}
      from target t where j.id = t.id and t.status = 'running' returning j.id),
    logged as (
      ${logEvents(sql, sql`
      select org_id, stage, id, subject_id, 'cancelled', attempts, null::jsonb from removed`, undefined, 1)})
    select case when exists (select 1 from removed) and (select count(*) from released) >= 0 then 'cancelled'
                when exists (select 1 from marked) then 'cancelling'
                when exists (select 1 from target) then 'cancelling'
                else 'not-found' end as outcome,
           (select stage from target) as stage, (select org_id from target) as org_id`

/**
 * Makes one delayed job due now ("run now"): a queued job whose run time is later gets it now, and its stage is
 * NOTIFYed so a worker claims it at once. Locking: that row (SKIP LOCKED: a claim in flight wins).
 */
export const makeDue = (sql: Sql, at: At, schema: string, id: string) =>
  sql<Array<{ outcome: string; stage: string | null }>>`
    with target as (select id, stage, status, available_at > ${SqlClock.now(sql, at)} as later from jobs where id = ${id}),
    due as (
      update jobs j set available_at = ${SqlClock.now(sql, at)}, updated_at = ${SqlClock.now(sql, at)}
      from target t where j.id = t.id and t.status = 'queued' and t.later
      returning j.stage
    ), woken as (select pg_notify(${channel(schema)}, stage) from due)
    select case when exists (select 1 from due) then 'due'
                when exists (select 1 from target) then 'not-delayed'
                else 'not-found' end as outcome,
           (select stage from target) as stage, (select count(*) from woken) as woken`

export const selectJob = (sql: Sql, id: string) => sql<Array<Record<string, unknown>>>`select * from jobs where id = ${id}`

/** A finished job from the kept history. Locking: none; by primary key. */
export const selectArchivedJob = (sql: Sql, id: string) =>
  sql<Array<Record<string, unknown>>>`select * from jobs_archive where id = ${id}`

/** Finished jobs, newest first: a stage's history page. Locking: none; the primary key backwards, or a rare stage's rows by the (stage, keep_until) index. */
export const listArchivedJobs = (sql: Sql, stage: string | null, status: string | null, beforeId: string | null, limit: number) =>
  sql<Array<Record<string, unknown>>>`
    select * from jobs_archive
    where (${stage}::text is null or stage = ${stage}::text)
      and (${status}::text is null or status = ${status}::text)
      and (${beforeId}::bigint is null or id < ${beforeId}::bigint)
    order by id desc limit ${limit}`

/**
 * Deletes up to `limit` history rows whose retention has passed, each stage's oldest `keep_until` first: a
 * loose scan of the `(stage, keep_until)` index finds the stages (one descent each), then each stage's expired
 * rows are a range of it (migration 0015: one index for pruning and stage pages). The archive is partitioned by
 * finish time (0022) and a partition whose rows have all expired is dropped whole (ArchivePartitions), so a row
 * kept at least a partition's width is left to that drop until it has waited one width past its `keep_until`
 * (a longer-kept stage holds its partition); a row kept less than a width is deleted here on time. A stage's
 * newest row tells which kind it is, so a long-kept stage's rows waiting for their drop are not read. Locking:
 * SKIP LOCKED on the rows it takes, so two pruners (a worker's housekeeping, pg_cron) share the work; a batch
 * per statement keeps each transaction short, so pruning a large history never holds the settle's inserts.
 */
export const pruneArchive = (sql: Sql, at: At, limit: number) =>
  sql<Array<{ n: number }>>`
    with recursive stages as (
      (select stage from jobs_archive order by stage limit 1)
      union all
      select (select a.stage from jobs_archive a where a.stage > s.stage order by a.stage limit 1)
      from stages s where s.stage is not null
    ), part as (
      select coalesce(max(ends_at - starts_at), interval '0') as width from jobs_archive_partitions
    ), gone as (
      delete from jobs_archive where id = any(array(
        select due.id from stages s cross join part cross join lateral (
          select case when (select a.keep_until - a.finished_at from jobs_archive a where a.stage = s.stage
                            order by a.keep_until desc limit 1) < part.width then ${SqlClock.now(sql, at)} else ${SqlClock.now(sql, at)} - part.width end as upto
        ) kind cross join lateral (
          select a.id from jobs_archive a where a.stage = s.stage and a.keep_until <= kind.upto
            and (a.keep_until - a.finished_at < part.width or a.keep_until <= ${SqlClock.now(sql, at)} - part.width)
          order by a.keep_until limit ${limit} for update skip locked) due
        where s.stage is not null
        limit ${limit}))
      returning 1
    )
    select count(*)::int as n from gone`

/** Every stage's control row (paused or not). Locking: none. */
export const selectStageControls = (sql: Sql) =>
  sql<Array<{ stage: string; paused: boolean; changed_by: string | null; changed_at: Date }>>`
    select stage, paused, changed_by, changed_at from stage_controls order by stage`

/** Pauses or resumes a stage; the table's trigger NOTIFYs every worker. Locking: that stage's control row. */
export const setStagePaused = (sql: Sql, at: At, stage: string, paused: boolean, by: string | null) =>
  sql`
    insert into stage_controls (stage, paused, changed_by, changed_at) values (${stage}, ${paused}, ${by}, ${SqlClock.now(sql, at)})
    on conflict (stage) do update set paused = excluded.paused, changed_by = excluded.changed_by, changed_at = ${SqlClock.now(sql, at)}`

/**
 * Deletes a stage's queued jobs (running ones finish); each goes to the history as `cancelled`, its last error
 * saying who purged it, when the stage keeps any (its retention here, or as its worker registered it); what waits
 * on them is settled as for cancelled parents. Locking: SKIP LOCKED, so a claim in flight keeps its rows.
 */
export const purgeQueued = (
  sql: Sql, at: At, stage: string, by: string, retention: { readonly defaultMs: number; readonly byStage: string }
) =>
  sql<Array<{ n: number }>>`
    with gone as (
      delete from jobs where id in (
        select id from jobs where stage = ${stage} and status = 'queued' for update skip locked)
      returning *
    ), keep as (
      -- the stage's retention: this build's, else as the worker that runs it registered it, else the default
      select coalesce((${retention.byStage}::text::jsonb ->> ${stage})::float8,
                      (select r.retain_ms from stage_registry r where r.stage = ${stage}),
                      ${retention.defaultMs}::float8) as ms
    ), kept as (
      insert into jobs_archive (${archiveColumns(sql)})
      select id, stage, org_id, subject_id, payload, priority, 'cancelled', attempts, max_attempts, polls, dedupe_key,
             errors, ${`purged by ${by}`}, null, progress, progress_message, timeout_ms, created_at, started_at, ${SqlClock.now(sql, at)}, last_run_ms,
             ${SqlClock.now(sql, at)} + keep.ms * interval '1 millisecond'
      from gone cross join keep
      where keep.ms > 0
    ), logged as (
      ${logEvents(sql, sql`
      select org_id, stage, id, subject_id, 'cancelled', attempts, jsonb_build_object('message', ${`purged by ${by}`}::text)
      from gone order by id`)}
    ), released as (
      ${finishedSettled(sql, at, sql`gone`, sql`'cancelled'`, sql`'purged'::text`, retention)}
    )
    select count(*)::int as n from gone cross join (select count(*) from released) r`

export const listJobs = (
  sql: Sql, stage: string | null, status: string | null, afterId: string | null, limit: number
) =>
  sql<Array<Record<string, unknown>>>`
    select * from jobs
    where (${stage}::text is null or stage = ${stage}::text)
      and (${status}::text is null or status = ${status}::text)
      and (${afterId}::bigint is null or id > ${afterId}::bigint)
    order by id limit ${limit}`

/** Depth per stage and state. Locking: none; one pass over the live table plus open dead letters. */
export const stageStats = (sql: Sql, at: At) =>
  sql<Array<{
    stage: string
    ready: string
    scheduled: string
    running: string
    cancelling: string
    dead_letters: string
    oldest_ready_ms: number | null
    paused: boolean
    rate_limited: boolean
  }>>`
    with live as (
      select stage,
        count(*) filter (where status = 'queued' and available_at <= ${SqlClock.now(sql, at)}) as ready,
        count(*) filter (where status = 'queued' and available_at > ${SqlClock.now(sql, at)}) as scheduled,
        count(*) filter (where status = 'running') as running,
        count(*) filter (where status = 'cancelled') as cancelling,
        extract(epoch from ${SqlClock.now(sql, at)} - min(available_at) filter (where status = 'queued' and available_at <= ${SqlClock.now(sql, at)})) * 1000
          as oldest_ready_ms
      from jobs group by stage
    ), dead as (
      select stage, count(*) as dead_letters from dead_letters where resolution_status is null group by stage
    ), known as (
      select coalesce(live.stage, dead.stage) as stage, ready, scheduled, running, cancelling, dead_letters, oldest_ready_ms
      from live full join dead on live.stage = dead.stage
    ), limited as (
      select distinct stage from rate_buckets where next_token_at > ${SqlClock.now(sql, at)}
    )
    select coalesce(known.stage, c.stage) as stage,
           coalesce(ready, 0) as ready, coalesce(scheduled, 0) as scheduled, coalesce(running, 0) as running,
           coalesce(cancelling, 0) as cancelling, coalesce(dead_letters, 0) as dead_letters,
           coalesce(oldest_ready_ms, 0)::float8 as oldest_ready_ms, coalesce(c.paused, false) as paused,
           (coalesce(ready, 0) > 0 and exists (select 1 from limited l where l.stage = known.stage)) as rate_limited
    from known full join (select stage, paused from stage_controls where paused) c on known.stage = c.stage
    order by 1`

export const selectDeadLetter = (sql: Sql, id: string) =>
  sql<Array<Record<string, unknown>>>`select * from dead_letters where id = ${id}`

export const listDeadLetters = (
  sql: Sql, stage: string | null, unresolvedOnly: boolean, afterId: string | null, limit: number
) =>
  sql<Array<Record<string, unknown>>>`
    select * from dead_letters
    where (${stage}::text is null or stage = ${stage}::text)
      and (not ${unresolvedOnly}::boolean or resolution_status is null)
      and (${afterId}::bigint is null or id > ${afterId}::bigint)
    order by id limit ${limit}`

/** Marks a dead letter retried with the id of the new job. Locking: that dead letter's row. */
export const markDeadLetterRetried = (sql: Sql, at: At, id: string, jobId: string) =>
  sql<Array<{ id: string }>>`
    update dead_letters set resolution_status = 'retried', resolved_at = ${SqlClock.now(sql, at)}, retried_job_id = ${jobId}
    where id = ${id} returning id`

export const markDeadLetterResolved = (sql: Sql, at: At, id: string, notes: string | null) =>
  sql<Array<{ id: string }>>`
    update dead_letters set resolution_status = 'resolved', resolved_at = ${SqlClock.now(sql, at)}, resolution_notes = ${notes}
    where id = ${id} returning id`

export const purgeDeadLetters = (sql: Sql, at: At, olderThanMs: number | null, includeUnresolved: boolean) =>
  sql<Array<{ id: string }>>`
    delete from dead_letters
    where (${includeUnresolved}::boolean or resolution_status is not null)
      and (${olderThanMs}::float8 is null or dead_at < ${SqlClock.now(sql, at)} - ${olderThanMs}::float8 * interval '1 millisecond')
    returning id`
