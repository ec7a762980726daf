/**
 * Every statement on the jobs and dead_letters tables, one named function each, with its locking strategy.
 * Table names are unqualified: the pool's search_path is the pgfiber schema. Times come from the database
 * clock (`now()`), so workers on different hosts agree.
 */
import type { Sql } from "../layers/Db.js"
import type { ValidJob } from "./Job.js"

export const channel = (schema: string) => `${schema}_jobs`

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
 * Inserts a batch in one statement. Locking: new rows only; a dedupe-key conflict (per org: `jobs_dedupe` is
 * unique on (org_id, dedupe_key), no-org jobs in a space of their own) takes the live row's lock for a no-op
 * update so its id comes back (`deduped`), which waits for a concurrent completion to settle.
 */
export const insertJobs = (sql: Sql, jobs: ReadonlyArray<ValidJob>) => {
  const c = columns(jobs)
  return sql<Array<{ id: string; deduped: boolean }>>`
    insert into jobs (stage, org_id, subject_id, payload, priority, available_at, max_attempts, dedupe_key, timeout_ms)
    select stage, org_id, subject_id, payload::jsonb, priority,
           coalesce(run_at, now() + delay_ms * interval '1 millisecond'), max_attempts, dedupe_key, timeout_ms
    from unnest(${c.stages}::text[], ${c.orgs}::text[], ${c.subjects}::text[], ${c.payloads}::text[],
                ${c.priorities}::int[], ${c.delays}::float8[], ${c.runAts}::timestamptz[], ${c.maxAttempts}::int[],
                ${c.dedupeKeys}::text[], ${c.timeouts}::int[]) with ordinality
         as t(stage, org_id, subject_id, payload, priority, delay_ms, run_at, max_attempts, dedupe_key, timeout_ms, ord)
    order by ord
    on conflict (org_id, dedupe_key) where dedupe_key is not null do update set dedupe_key = excluded.dedupe_key
    returning id, (xmax <> 0) as deduped`
}

/**
 * Inserts a batch whose duplicates update the live job while it is still queued: `replace` takes the new
 * payload, priority and run time; `debounce` the same, but the run time only ever moves later. A running job
 * is left as it is. Updated rows' stages are NOTIFYed (the insert trigger sees only inserted rows), since a
 * run time may have moved earlier. Locking: new rows, and the live row of each conflicting key.
 */
export const insertJobsReplacing = (sql: Sql, schema: string, jobs: ReadonlyArray<ValidJob>, mode: "replace" | "debounce") => {
  const c = columns(jobs)
  return sql<Array<{ id: string; deduped: boolean; org_id: string | null; dedupe_key: string }>>`
    with written as (
      insert into jobs as j (stage, org_id, subject_id, payload, priority, available_at, max_attempts, dedupe_key, timeout_ms)
      select stage, org_id, subject_id, payload::jsonb, priority,
             coalesce(run_at, now() + delay_ms * interval '1 millisecond'), max_attempts, dedupe_key, timeout_ms
      from unnest(${c.stages}::text[], ${c.orgs}::text[], ${c.subjects}::text[], ${c.payloads}::text[],
                  ${c.priorities}::int[], ${c.delays}::float8[], ${c.runAts}::timestamptz[], ${c.maxAttempts}::int[],
                  ${c.dedupeKeys}::text[], ${c.timeouts}::int[]) with ordinality
           as t(stage, org_id, subject_id, payload, priority, delay_ms, run_at, max_attempts, dedupe_key, timeout_ms, ord)
      order by ord
      on conflict (org_id, dedupe_key) where dedupe_key is not null do update set
        payload = case when j.status = 'queued' then excluded.payload else j.payload end,
        priority = case when j.status = 'queued' then excluded.priority else j.priority end,
        available_at = case
          when j.status <> 'queued' then j.available_at
          when ${mode}::text = 'debounce' then greatest(j.available_at, excluded.available_at)
          else excluded.available_at end,
        updated_at = case when j.status = 'queued' then now() else j.updated_at end
      returning j.id, j.stage, j.org_id, j.dedupe_key, (j.xmax <> 0) as deduped
    ), woken as (
      select pg_notify(${channel(schema)}, stage) from (select distinct stage from written where deduped) s
    )
    select written.id, written.deduped, written.org_id, written.dedupe_key from written cross join (select count(*) from woken) w`
}

/**
 * The claim's plan, whatever the statistics say: an ordered scan of `jobs_ready` (stage, then the claim's exact
 * order, over queued rows only) that stops at the limit. With statistics taken while the table was small (as they
 * are after a restart or a quiet spell) the planner otherwise picks a bitmap scan and sorts the whole backlog,
 * so each claim costs more the longer the queue grows: 86 ms instead of 4 ms for 100 of 46,000 (docs/benchmarks.md).
 * Local to the claim's own transaction (`Db.runWithSettings`).
 */
export const claimPlan: Readonly<Record<string, string>> = {
  enable_seqscan: "off",
  enable_bitmapscan: "off",
  enable_sort: "off"
}

/**
 * Claims due jobs. Locking: FOR UPDATE SKIP LOCKED on the ready index, so claimers never wait on each other.
 * The claim commits without waiting for its WAL flush (`synchronous_commit` off for this transaction only):
 * a crash can lose only the lease, which leaves the job queued or lets the reaper requeue it, and the fence
 * refuses any outcome written under a lost lease. It saves a flush on every wake-up.
 */
export const claimReady = (sql: Sql, stage: string, limit: number, workerId: string, leaseMs: number) =>
  sql<Array<Record<string, unknown>>>`
    with next as (
      select id from jobs
      where stage = ${stage} and status = 'queued' and available_at <= now()
        and (select set_config('synchronous_commit', 'off', true)) = 'off'
        -- a paused stage claims nothing (the pools stop asking; this guards the moment before they hear it)
        and not exists (select 1 from stage_controls c where c.stage = ${stage} and c.paused)
      order by priority, available_at, id
      limit ${limit}
      for update skip locked
    )
    update jobs j
    set status = 'running', locked_by = ${workerId}, locked_until = now() + ${leaseMs} * interval '1 millisecond',
        lease = j.lease + 1, updated_at = now(), started_at = coalesce(j.started_at, now())
    from next where j.id = next.id
    returning j.*`

/**
 * Extends held leases, and writes the progress reported since the last beat (`reported` 0: unchanged).
 * Locking: row locks on the caller's own running jobs, taken in id order first (as settles take theirs), so a
 * beat and a settle of the same rows never deadlock; unindexed columns, so HOT.
 */
export const extendLeases = (
  sql: Sql,
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
    with held as (
      select j.id, h.reported, h.progress, h.message
      from jobs j join unnest(${ids}::bigint[], ${leases}::int[], ${progress.reported}::int[], ${progress.values}::float4[],
                              ${progress.messages}::text[]) as h(id, lease, reported, progress, message)
        on j.id = h.id and j.lease = h.lease
      where j.status = 'running'
      order by j.id
      for update of j
    )
    update jobs j set locked_until = now() + ${leaseMs} * interval '1 millisecond', updated_at = now(),
      progress = case when held.reported = 1 then held.progress else j.progress end,
      progress_message = case when held.reported = 1 then held.message else j.progress_message end
    from held where j.id = held.id
    returning j.id`

/**
 * Settles a batch of outcomes of every kind in one statement (the settler's group commit). Each input row is
 * (id, lease, kind, delay_ms, tag, message, output, run_ms, retain_ms) with kind one of complete | retry |
 * reschedule | dead | release; a retry with no attempt left becomes dead, and a job cancelled while it ran is
 * removed by anything but a completion. A finished job (completed, dead, removed as cancelled) whose retention
 * (`retain_ms`, else its stage's in `retainByStage`, else `retainDefaultMs`) is above zero is handed to
 * `jobs_archive` in the same statement; at zero it is only deleted. Each failed attempt's history entry names
 * the worker that held the lease. Returns one row per outcome whose lease still held, with the action taken;
 * the others were fenced. Releases and due requeues wake their stages.
 * Locking: the caller's own leased rows, locked in id order first (as heartbeats do), so two statements
 * touching the same rows never deadlock; a fenced row is never locked. Archive rows are new (keyed by job id).
 */
export const settleOutcomes = (
  sql: Sql,
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
  },
  retention: { readonly defaultMs: number; readonly byStage: string }
) =>
  sql<Array<{ id: string; action: string; reason: string | null }>>`
    with input as (
      select * from unnest(${o.ids}::bigint[], ${o.leases}::int[], ${o.kinds}::text[], ${o.delays}::float8[],
                           ${o.tags}::text[], ${o.messages}::text[], ${o.outputs}::text[], ${o.runMs}::float8[],
                           ${o.retainMs}::float8[])
        as i(id, lease, kind, delay_ms, tag, message, output, run_ms, retain_ms)
    ), held as (
      select j.id, i.delay_ms, i.tag, i.message, i.output, i.run_ms,
             coalesce(i.retain_ms, (${retention.byStage}::jsonb ->> j.stage)::float8, ${retention.defaultMs}::float8) as retain_ms,
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
      returning j.*, h.action, h.output as result, h.run_ms as run_ms_now, h.retain_ms as keep_ms
    ), died as (
      delete from jobs j using held h where j.id = h.id and h.action = 'dead'
      -- a job claimed with its attempts already spent (the reaper recorded the last one) keeps count and history
      returning j.*, h.message as dead_message, h.run_ms as run_ms_now, h.retain_ms as keep_ms,
        case when j.attempts >= j.max_attempts then j.attempts else j.attempts + 1 end as final_attempts,
        case when j.attempts >= j.max_attempts then j.errors
             else j.errors || jsonb_build_array(jsonb_build_object('attempt', j.attempts + 1, 'at', now(),
                    'tag', h.tag, 'message', h.message, 'worker', j.locked_by)) end as final_errors
    ), buried as (
      insert into dead_letters (job_id, stage, org_id, subject_id, payload, priority, attempts, max_attempts,
                                dedupe_key, reason, error_history, job_created_at)
      select id, stage, org_id, subject_id, payload, priority, final_attempts, max_attempts, dedupe_key, dead_message,
             final_errors, created_at
      from died
      returning job_id, reason
    ), kept as (
      insert into jobs_archive (id, stage, org_id, subject_id, payload, priority, status, attempts, max_attempts, polls,
                                dedupe_key, errors, last_error, output, progress, progress_message, timeout_ms,
                                created_at, started_at, finished_at, last_run_ms, keep_until)
      select id, stage, org_id, subject_id, payload, priority,
             case when action = 'complete' then 'completed' else 'cancelled' end, attempts, max_attempts, polls,
             dedupe_key, errors, last_error, case when action = 'complete' then result::jsonb end, progress,
             progress_message, timeout_ms, created_at, started_at, now(), coalesce(run_ms_now, last_run_ms),
             now() + keep_ms * interval '1 millisecond'
      from deleted where keep_ms > 0
      union all
      select id, stage, org_id, subject_id, payload, priority, 'dead', final_attempts, max_attempts, polls,
             dedupe_key, final_errors, dead_message, null, progress, progress_message, timeout_ms,
             created_at, started_at, now(), coalesce(run_ms_now, last_run_ms), now() + keep_ms * interval '1 millisecond'
      from died where keep_ms > 0
    ), requeued as (
      update jobs j
      set status = 'queued', locked_by = null, locked_until = null, updated_at = now(),
          available_at = now() + h.delay_ms * interval '1 millisecond',
          attempts = j.attempts + (h.action = 'retry')::int,
          polls = j.polls + (h.action = 'reschedule')::int,
          last_run_ms = coalesce(h.run_ms, j.last_run_ms),
          last_error = case when h.action = 'retry' then h.message else j.last_error end,
          errors = case when h.action = 'retry'
                        then j.errors || jsonb_build_array(jsonb_build_object(
                          'attempt', j.attempts + 1, 'at', now(), 'tag', h.tag, 'message', h.message, 'worker', j.locked_by))
                        else j.errors end
      from held h where j.id = h.id and h.action in ('retry', 'reschedule', 'release')
      returning j.id, j.stage, h.action, h.delay_ms
    ), woken as (
      select pg_notify(${channel(schema)}, stage) from (select distinct stage from requeued where delay_ms <= 0) s
    )
    select id::text, action, null::text as reason from deleted
    union all select job_id::text, 'dead', reason from buried
    -- the aggregate forces the notify CTE to run
    union all select id::text, action, null from requeued cross join (select count(*) from woken) w`

/** Only one reaper runs at a time, across every process: the others skip this round. */
export const tryReaperLock = (sql: Sql, schema: string) =>
  sql<Array<{ locked: boolean }>>`select pg_try_advisory_xact_lock(hashtext(${`pgfiber.reaper.${schema}`})) as locked`

/** Removes cancelled jobs whose worker is gone. Locking: SKIP LOCKED, so a live worker's row is left alone. */
export const removeExpiredCancelled = (sql: Sql) =>
  sql<Array<{ id: string }>>`
    delete from jobs where id in (
      select id from jobs where status = 'cancelled' and locked_until < now() for update skip locked)
    returning id`

/**
 * Requeues expired leases, spending the attempt, and wakes their stages; one whose last attempt that was is
 * requeued too (attempts = max_attempts): the reaper may run in a process that lacks the stage, so the
 * stage's own claim dead-letters it and runs its onDeadLetter. Locking: SKIP LOCKED over expired rows.
 */
export const requeueExpired = (sql: Sql, schema: string) =>
  sql<Array<{ id: string }>>`
    with expired as (
      update jobs set status = 'queued', attempts = attempts + 1, available_at = now(),
        last_error = 'lease expired: the worker ' || coalesce(locked_by, '?') || ' stopped heartbeating',
        errors = errors || jsonb_build_array(jsonb_build_object('attempt', attempts + 1, 'at', now(), 'tag', 'LeaseExpired',
          'message', 'lease expired: the worker ' || coalesce(locked_by, '?') || ' stopped heartbeating', 'worker', locked_by)),
        locked_by = null, locked_until = null, updated_at = now()
      where id in (
        select id from jobs where status = 'running' and locked_until < now() for update skip locked)
      returning id, stage
    ), woken as (
      select pg_notify(${channel(schema)}, stage) from (select distinct stage from expired) s
    )
    select expired.id from expired cross join (select count(*) from woken) w`

/** When the waker should look again, as ms from the database's now. Locking: none (reads on two partial indexes). */
export const nextWake = (sql: Sql, stages: ReadonlyArray<string>) =>
  sql<Array<{ job_due_in_ms: number | null; lease_expires_in_ms: number | null }>>`
    select
      (extract(epoch from (
        select min(d.at) from unnest(${stages}::text[]) as s(stage)
        cross join lateral (select min(available_at) as at from jobs
                            where jobs.stage = s.stage and status = 'queued') d) - now()) * 1000)::float8
        as job_due_in_ms,
      (extract(epoch from (select min(locked_until) from jobs where status <> 'queued') - now()) * 1000)::float8
        as lease_expires_in_ms`

/**
 * Cancels a job: a queued one is deleted (into the history, as `cancelled`, when its stage keeps any), a
 * running one is marked for its worker. Locking: that row.
 */
export const cancelJob = (sql: Sql, id: string, retention: { readonly defaultMs: number; readonly byStage: string }) =>
  sql<Array<{ outcome: string; stage: string | null; org_id: string | null }>>`
    with target as (select id, status, stage, org_id from jobs where id = ${id} for update),
    removed as (delete from jobs j using target t where j.id = t.id and t.status = 'queued' returning j.*),
    kept as (
      insert into jobs_archive (id, stage, org_id, subject_id, payload, priority, status, attempts, max_attempts, polls,
                                dedupe_key, errors, last_error, timeout_ms, created_at, started_at, finished_at,
                                last_run_ms, keep_until)
      select id, stage, org_id, subject_id, payload, priority, 'cancelled', attempts, max_attempts, polls, dedupe_key,
             errors, last_error, timeout_ms, created_at, started_at, now(), last_run_ms,
             now() + coalesce((${retention.byStage}::jsonb ->> stage)::float8, ${retention.defaultMs}::float8) * interval '1 millisecond'
      from removed
      where coalesce((${retention.byStage}::jsonb ->> stage)::float8, ${retention.defaultMs}::float8) > 0
    ),
    marked as (
      update jobs j set status = 'cancelled', updated_at = now()
      from target t where j.id = t.id and t.status = 'running' returning j.id)
    select case when exists (select 1 from removed) then 'cancelled'
                when exists (select 1 from marked) then 'cancelling'
                when exists (select 1 from target) then 'cancelling'
                else 'not-found' end as outcome,
           (select stage from target) as stage, (select org_id from target) as org_id`

export const selectJob = (sql: Sql, id: string) => sql<Array<Record<string, unknown>>>`select * from jobs where id = ${id}`

/** A finished job from the kept history. Locking: none; by primary key. */
export const selectArchivedJob = (sql: Sql, id: string) =>
  sql<Array<Record<string, unknown>>>`select * from jobs_archive where id = ${id}`

/** Finished jobs, newest first: a stage's history page. Locking: none; the (stage, finished_at) index. */
export const listArchivedJobs = (sql: Sql, stage: string | null, status: string | null, beforeId: string | null, limit: number) =>
  sql<Array<Record<string, unknown>>>`
    select * from jobs_archive
    where (${stage}::text is null or stage = ${stage}::text)
      and (${status}::text is null or status = ${status}::text)
      and (${beforeId}::bigint is null or id < ${beforeId}::bigint)
    order by id desc limit ${limit}`

/**
 * Deletes up to `limit` history rows whose retention has passed, oldest first. Locking: SKIP LOCKED on the
 * rows it takes, so two pruners (a worker's housekeeping, pg_cron) share the work; a batch per statement
 * keeps each transaction short, so pruning a large history never holds the settle's inserts.
 */
export const pruneArchive = (sql: Sql, limit: number) =>
  sql<Array<{ n: number }>>`
    with gone as (
      delete from jobs_archive where id in (
        select id from jobs_archive where keep_until <= now() order by keep_until limit ${limit} for update skip locked)
      returning 1
    )
    select count(*)::int as n from gone`

/** Every stage's control row (paused or not). Locking: none. */
export const selectStageControls = (sql: Sql) =>
  sql<Array<{ stage: string; paused: boolean; changed_by: string | null; changed_at: Date }>>`
    select stage, paused, changed_by, changed_at from stage_controls order by stage`

/** Pauses or resumes a stage; the table's trigger NOTIFYs every worker. Locking: that stage's control row. */
export const setStagePaused = (sql: Sql, stage: string, paused: boolean, by: string | null) =>
  sql`
    insert into stage_controls (stage, paused, changed_by, changed_at) values (${stage}, ${paused}, ${by}, now())
    on conflict (stage) do update set paused = excluded.paused, changed_by = excluded.changed_by, changed_at = now()`

/** Deletes a stage's queued jobs (running ones finish). Locking: SKIP LOCKED, so a claim in flight keeps its rows. */
export const purgeQueued = (sql: Sql, stage: string) =>
  sql<Array<{ n: number }>>`
    with gone as (
      delete from jobs where id in (
        select id from jobs where stage = ${stage} and status = 'queued' for update skip locked)
      returning 1
    )
    select count(*)::int as n from gone`

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
export const stageStats = (sql: Sql) =>
  sql<Array<{
    stage: string
    ready: string
    scheduled: string
    running: string
    cancelling: string
    dead_letters: string
    oldest_ready_ms: number | null
    paused: boolean
  }>>`
    with live as (
      select stage,
        count(*) filter (where status = 'queued' and available_at <= now()) as ready,
        count(*) filter (where status = 'queued' and available_at > now()) as scheduled,
        count(*) filter (where status = 'running') as running,
        count(*) filter (where status = 'cancelled') as cancelling,
        extract(epoch from now() - min(available_at) filter (where status = 'queued' and available_at <= now())) * 1000
          as oldest_ready_ms
      from jobs group by stage
    ), dead as (
      select stage, count(*) as dead_letters from dead_letters where resolution_status is null group by stage
    ), known as (
      select coalesce(live.stage, dead.stage) as stage, ready, scheduled, running, cancelling, dead_letters, oldest_ready_ms
      from live full join dead on live.stage = dead.stage
    )
    select coalesce(known.stage, c.stage) as stage,
           coalesce(ready, 0) as ready, coalesce(scheduled, 0) as scheduled, coalesce(running, 0) as running,
           coalesce(cancelling, 0) as cancelling, coalesce(dead_letters, 0) as dead_letters,
           coalesce(oldest_ready_ms, 0)::float8 as oldest_ready_ms, coalesce(c.paused, false) as paused
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
export const markDeadLetterRetried = (sql: Sql, id: string, jobId: string) =>
  sql<Array<{ id: string }>>`
    update dead_letters set resolution_status = 'retried', resolved_at = now(), retried_job_id = ${jobId}
    where id = ${id} returning id`

export const markDeadLetterResolved = (sql: Sql, id: string, notes: string | null) =>
  sql<Array<{ id: string }>>`
    update dead_letters set resolution_status = 'resolved', resolved_at = now(), resolution_notes = ${notes}
    where id = ${id} returning id`

export const purgeDeadLetters = (sql: Sql, olderThanMs: number | null, includeUnresolved: boolean) =>
  sql<Array<{ id: string }>>`
    delete from dead_letters
    where (${includeUnresolved}::boolean or resolution_status is not null)
      and (${olderThanMs}::float8 is null or dead_at < now() - ${olderThanMs}::float8 * interval '1 millisecond')
    returning id`
