-- Jobs that wait for other jobs: a job may depend on parents (`dependsOn`); it stays `waiting` until every parent
-- has finished, and is released (made `queued`, its stage NOTIFYed) by the statement that settles its last parent.
--
-- `job_dependencies` holds one row per edge (the dependent `job_id` waits on `depends_on`), with what the
-- dependent does when that parent dies or is cancelled: `cancel` (the default), `dead` (dead-lettered), `continue`
-- (counts as done). Edges are kept after both ends finish, so a finished job still shows its parents and children
-- (pruned with the history, JobsSql.pruneDependencies).
--
-- Two nullable columns on `jobs`, so adding them rewrites nothing and the claim's index does not change:
-- `waiting_on` counts a waiting job's parents not finished yet (decremented under the dependent's row lock, so
-- parents settled at once by different processes release it exactly once); `has_dependents` marks a parent, and is
-- the settle's only extra test: a job without it costs the settle nothing more (it is read from the row the settle
-- deletes anyway).
--
-- The enqueue of a dependent locks its live parents (`for update`) and sets their mark; a settle that reached a
-- parent first makes that enqueue wait and then find the parent in the history. A settle that waited for the
-- enqueue's lock started (took its snapshot) before the dependent existed, so the release runs in
-- `settle_finished`, a volatile function whose statements each take a fresh snapshot (READ COMMITTED): called by
-- the settle after its delete has locked the parent, it sees every dependent committed before that lock was had.

alter table {{schema}}.jobs drop constraint if exists jobs_status_check;
alter table {{schema}}.jobs add constraint jobs_status_check
  check (status in ('waiting', 'queued', 'running', 'cancelled')) not valid;
alter table {{schema}}.jobs validate constraint jobs_status_check;

alter table {{schema}}.jobs
  add column waiting_on     integer,
  add column has_dependents boolean;

create table {{schema}}.job_dependencies (
  job_id     bigint not null,
  depends_on bigint not null,
  -- the dependent's org, which is its parent's too (enqueue refuses a parent of another org)
  org_id     text,
  on_failure text   not null default 'cancel' check (on_failure in ('cancel', 'dead', 'continue')),
  created_at timestamptz not null default now(),
  primary key (depends_on, job_id)
);
create index job_dependencies_job on {{schema}}.job_dependencies (job_id);

grant select, insert, update, delete on {{schema}}.job_dependencies to pgfiber_tenant;
alter table {{schema}}.job_dependencies enable row level security;
create policy job_dependencies_by_org on {{schema}}.job_dependencies to pgfiber_tenant
  using (org_id = current_setting('pgfiber.org_id', true))
  with check (org_id = current_setting('pgfiber.org_id', true));

-- A waiting job is not claimable: its insert wakes nobody (its release does). Every inserted job is logged as
-- enqueued (0020's event log), waiting or not.
create or replace function {{schema}}.jobs_notify_inserted() returns trigger
language plpgsql as $$
declare
  inserted_stage text;
begin
  insert into {{schema}}.job_events (org_id, stage, job_id, subject_id, kind, attempt, data)
  select org_id, stage, id, subject_id, 'enqueued', 0,
         case when available_at > now() then jsonb_build_object('runAt', available_at) end
  from new_jobs order by id;
  for inserted_stage in select distinct stage from new_jobs where status = 'queued' loop
    perform pg_notify('{{schema}}_jobs', inserted_stage);
  end loop;
  if exists (select 1 from new_jobs where status = 'queued' and available_at > now()) then
    perform pg_notify('{{schema}}_jobs', 'pgfiber:later');
  end if;
  return null;
end
$$;

-- Batches: a group of jobs with callback jobs (`on_complete`, `on_failure`: stage, payload, priority, max attempts),
-- enqueued exactly once, when the batch is sealed and its last job has finished, with the batch's counts in their
-- payload (`batch`). Jobs join while it is open (each join adds to `total` under the batch row's lock); every
-- finished job of it adds to `completed` or `failed` under that lock too, so of two settles that finish its last
-- jobs at once the second sees the first's count, and only one sets `finished_at` (the callbacks' guard).
create table {{schema}}.job_batches (
  id          bigint generated always as identity primary key,
  org_id      text,
  on_complete jsonb,
  on_failure  jsonb,
  total       integer not null default 0,
  completed   integer not null default 0,
  failed      integer not null default 0,
  sealed      boolean not null default false,
  finished_at timestamptz,
  -- the callback jobs enqueued when it finished
  callbacks   bigint[],
  created_at  timestamptz not null default now()
);
alter table {{schema}}.jobs add column batch_id bigint;

grant select, insert, update, delete on {{schema}}.job_batches to pgfiber_tenant;
alter table {{schema}}.job_batches enable row level security;
create policy job_batches_by_org on {{schema}}.job_batches to pgfiber_tenant
  using (org_id = current_setting('pgfiber.org_id', true))
  with check (org_id = current_setting('pgfiber.org_id', true));

-- Enqueues the callbacks of batches that just finished (`finished_at` set by the caller, under the row's lock):
-- `on_complete` always, `on_failure` too when some job failed; each with `batch` (id, total, completed, failed)
-- added to its payload. Locking: the batch rows (the caller's own), new job rows.
create function {{schema}}.enqueue_batch_callbacks(batch_ids bigint[]) returns integer
language plpgsql volatile as $$
declare
  n integer;
begin
  with finished as (
    select * from {{schema}}.job_batches where id = any(batch_ids) and finished_at is not null and callbacks is null
  ), specs as (
    select b.id as batch_id, b.org_id, spec,
           jsonb_build_object('id', b.id::text, 'total', b.total, 'completed', b.completed, 'failed', b.failed) as counts
    from finished b
    cross join lateral (
      select b.on_complete as spec where b.on_complete is not null
      union all
      select b.on_failure where b.on_failure is not null and b.failed > 0
    ) s
  ), inserted as (
    insert into {{schema}}.jobs (stage, org_id, payload, priority, max_attempts)
    select spec ->> 'stage', org_id, coalesce(spec -> 'payload', '{}'::jsonb) || jsonb_build_object('batch', counts),
           coalesce((spec ->> 'priority')::smallint, 50), coalesce((spec ->> 'maxAttempts')::int, 5)
    from specs
    returning id, org_id, payload
  ), recorded as (
    update {{schema}}.job_batches b set callbacks = coalesce(
      (select array_agg(i.id order by i.id) from inserted i where (i.payload -> 'batch' ->> 'id')::bigint = b.id), '{}')
    from finished f where b.id = f.id
    returning b.id
  )
  select (select count(*) from inserted)::int + 0 * (select count(*) from recorded)::int into n;
  return n;
end
$$;

-- Jobs that just finished (`ids`, each with its fate: completed, dead or cancelled, a reason for the last two, and
-- its batch) settle what depends on them. Their dependents: each edge that counts as done (a completed parent, or
-- `continue`) takes one off the dependent's `waiting_on`, and the dependent whose count reaches 0 becomes queued and
-- its stage is woken; a waiting dependent of a failed parent is cancelled or dead-lettered with the reason (into
-- the history per its stage's retention, `retain_default_ms` / `retain_by_stage` as the settle's), and settles in
-- turn, down the chain. Their batches: counted, and the callbacks of each batch that has finished enqueued.
-- Returns how many rows it touched. Called by every statement that finishes jobs, only when one of them has
-- `has_dependents` or a `batch_id`.
-- Locking: each dependent's row, by UPDATE or DELETE (waiting rows: no claim or heartbeat takes them), and each
-- batch row; concurrent settles of two parents of one dependent (two jobs of one batch) serialise there, the
-- second reading the first's count. Each statement here takes a fresh snapshot (a volatile function, READ
-- COMMITTED), so it sees dependents committed after the calling settle's snapshot, before it locked their parent.
create function {{schema}}.settle_finished(ids bigint[], fates text[], reasons text[], batch_ids bigint[],
                                          retain_default_ms float8, retain_by_stage jsonb)
returns integer
language plpgsql volatile as $$
declare
  touched integer := 0;
  n integer;
  failed_ids bigint[];
  failed_fates text[];
  failed_reasons text[];
  failed_batches bigint[];
  done_batches bigint[];
begin
  -- the waiting dependents, locked in id order first, so two settles that share dependents cannot deadlock
  perform count(*) from (
    select j.id from {{schema}}.jobs j
    where j.id in (select d.job_id from {{schema}}.job_dependencies d where d.depends_on = any(ids)) and j.status = 'waiting'
    order by j.id for update of j
  ) locked;

  with parents as (
    select * from unnest(ids, fates, reasons) as p(id, fate, reason)
  ), done as (
    select d.job_id, count(*)::int as n
    from {{schema}}.job_dependencies d join parents p on d.depends_on = p.id
    where p.fate = 'completed' or d.on_failure = 'continue'
    group by d.job_id
  ), counted as (
    update {{schema}}.jobs j
    set waiting_on = j.waiting_on - done.n,
        status = case when j.waiting_on - done.n <= 0 then 'queued' else 'waiting' end,
        available_at = case when j.waiting_on - done.n <= 0 then greatest(j.available_at, now()) else j.available_at end,
        updated_at = now()
    from done
    where j.id = done.job_id and j.status = 'waiting'
    returning j.stage, j.status, j.available_at
  ), woken as (
    select pg_notify('{{schema}}_jobs', stage) from (select distinct stage from counted where status = 'queued') s
    union all
    select pg_notify('{{schema}}_jobs', 'pgfiber:later')
    where exists (select 1 from counted where status = 'queued' and available_at > now())
  )
  select (select count(*) from counted)::int + 0 * (select count(*) from woken)::int into n;
  touched := touched + n;

  -- dependents of failed parents (by `cancel` or `dead` edges) leave the queue with a failed parent's reason
  with parents as (
    select * from unnest(ids, fates, reasons) as p(id, fate, reason)
  ), hit as (
    select distinct on (d.job_id) d.job_id, d.on_failure,
           'parent job ' || p.id || case when p.fate = 'dead' then ' was dead-lettered' else ' was cancelled' end
             || coalesce(': ' || p.reason, '') as reason
    from {{schema}}.job_dependencies d join parents p on d.depends_on = p.id
    where p.fate <> 'completed' and d.on_failure <> 'continue'
    order by d.job_id, d.on_failure desc, p.id
  ), gone as (
    delete from {{schema}}.jobs j using hit h
    where j.id = h.job_id and j.status = 'waiting'
    returning j.*, h.on_failure, left(h.reason, 4000) as reason,
      coalesce((retain_by_stage ->> j.stage)::float8, retain_default_ms) as keep_ms
  ), buried as (
    insert into {{schema}}.dead_letters (job_id, stage, org_id, subject_id, payload, priority, attempts, max_attempts,
                                         dedupe_key, reason, error_history, job_created_at)
    select id, stage, org_id, subject_id, payload, priority, attempts, max_attempts, dedupe_key, reason, errors, created_at
    from gone where on_failure = 'dead'
  ), kept as (
    insert into {{schema}}.jobs_archive (id, stage, org_id, subject_id, payload, priority, status, attempts,
                                         max_attempts, polls, dedupe_key, errors, last_error, output, progress,
                                         progress_message, timeout_ms, created_at, started_at, finished_at,
                                         last_run_ms, keep_until)
    select id, stage, org_id, subject_id, payload, priority,
           case when on_failure = 'dead' then 'dead' else 'cancelled' end, attempts, max_attempts, polls, dedupe_key,
           errors, reason, null, progress, progress_message, timeout_ms, created_at, started_at, now(), last_run_ms,
           now() + keep_ms * interval '1 millisecond'
    from gone where keep_ms > 0
  ), logged as (
    -- the event log (0020): each dependent that leaves with its parent, with the parent's reason
    insert into {{schema}}.job_events (org_id, stage, job_id, subject_id, kind, attempt, data)
    select org_id, stage, id, subject_id, case when on_failure = 'dead' then 'dead' else 'cancelled' end, attempts,
           jsonb_build_object('message', reason)
    from gone order by id
  )
  select array_agg(id) filter (where has_dependents or batch_id is not null),
         array_agg(case when on_failure = 'dead' then 'dead' else 'cancelled' end) filter (where has_dependents or batch_id is not null),
         array_agg(reason) filter (where has_dependents or batch_id is not null),
         array_agg(batch_id) filter (where has_dependents or batch_id is not null),
         count(*)::int
  into failed_ids, failed_fates, failed_reasons, failed_batches, n
  from gone;
  touched := touched + n;

  -- down the chain (before the batches: every job row is locked before any batch row): the dependents just cancelled or dead-lettered have dependents (or batches) of their own
  if failed_ids is not null then
    touched := touched + {{schema}}.settle_finished(failed_ids, failed_fates, failed_reasons, failed_batches,
                                                    retain_default_ms, retain_by_stage);
  end if;

  -- their batches count them; a sealed batch whose last job this was has finished
  perform count(*) from (
    select b.id from {{schema}}.job_batches b where b.id = any(batch_ids) and b.finished_at is null order by b.id for update
  ) locked;
  with counts as (
    select b.batch_id, count(*) filter (where b.fate = 'completed')::int as c, count(*) filter (where b.fate <> 'completed')::int as f
    from unnest(fates, batch_ids) as b(fate, batch_id) where b.batch_id is not null group by b.batch_id
  ), counted as (
    update {{schema}}.job_batches b
    set completed = b.completed + counts.c, failed = b.failed + counts.f,
        finished_at = case when b.sealed and b.completed + counts.c + b.failed + counts.f >= b.total then now() end
    from counts where b.id = counts.batch_id and b.finished_at is null
    returning b.id, b.finished_at
  )
  select array_agg(id) filter (where finished_at is not null) into done_batches from counted;
  if done_batches is not null then
    touched := touched + {{schema}}.enqueue_batch_callbacks(done_batches);
  end if;

  return touched;
end
$$;

-- Uniqueness over a time window: at most one job per (org, dedupe key, window) where windows are aligned periods
-- of `uniqueFor` (e.g. each clock hour), counting finished jobs too (today's `jobs_dedupe` counts live ones only).
-- The first enqueue of a window inserts its row; a concurrent one waits on that insert (ON CONFLICT) and then
-- returns the same job. Rows are pruned once their window has passed (`expires_at`).
create table {{schema}}.job_unique_windows (
  org_key      text        not null,
  org_id       text,
  dedupe_key   text        not null,
  window_start timestamptz not null,
  expires_at   timestamptz not null,
  job_id       bigint,
  primary key (org_key, dedupe_key, window_start)
);
create index job_unique_windows_expiry on {{schema}}.job_unique_windows (expires_at);

grant select, insert, update, delete on {{schema}}.job_unique_windows to pgfiber_tenant;
alter table {{schema}}.job_unique_windows enable row level security;
create policy job_unique_windows_by_org on {{schema}}.job_unique_windows to pgfiber_tenant
  using (org_id = current_setting('pgfiber.org_id', true))
  with check (org_id = current_setting('pgfiber.org_id', true));
