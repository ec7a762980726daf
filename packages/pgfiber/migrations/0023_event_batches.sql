-- The event log in batches: one row per statement, org, stage and kind (at most 1,000 jobs a row) where 0020
-- wrote one row per job. A claim of 500 jobs writes one row, not 500; each job's claim and settle wrote an event
-- row of their own (three with the enqueue), which cost the bulk drain 17 % (docs/benchmarks.md). The jobs of a
-- row are in `job_ids` with, position by position, their subject, attempt and data (`subject_ids` and `data` null
-- when every job's is). An event's id is its row's id × 1024 + its position (0-based): ids stay integers, in the
-- log's read order within a transaction, and a reader resumes inside a row (EventsSql.readEvents unnests them).
--
-- The upgrade copies the kept events, each to a row of its own (event id = old id × 1024). A client that resumes
-- with an id from before the upgrade is taken to a point at or before it: it may see events again, never miss one.
-- It rewrites the log once, under the migration's lock: to make it quick, shorten PGFIBER_EVENTS_RETAIN first.
alter table {{schema}}.job_events rename to job_events_0020;
alter index {{schema}}.job_events_tx rename to job_events_0020_tx;
create table {{schema}}.job_events (
  id bigint generated always as identity primary key,
  tx xid8 not null default pg_current_xact_id(),
  org_id text,
  stage text not null,
  kind text not null check (kind in ('enqueued', 'started', 'progress', 'completed', 'retried', 'rescheduled', 'dead', 'cancelled')),
  job_ids bigint[] not null check (cardinality(job_ids) between 1 and 1000),
  subject_ids text[],
  attempts int[] not null,
  data jsonb[],
  at timestamptz not null default now()
);
insert into {{schema}}.job_events (id, tx, org_id, stage, kind, job_ids, subject_ids, attempts, data, at)
overriding system value
select id, tx, org_id, stage, kind, array[job_id], case when subject_id is not null then array[subject_id] end,
       array[attempt], case when data is not null then array[data] end, at
from {{schema}}.job_events_0020 order by id;
select setval(pg_get_serial_sequence('{{schema}}.job_events', 'id'),
              greatest((select max(id) from {{schema}}.job_events_0020), 1));
drop table {{schema}}.job_events_0020;

-- the readers' order and the "is anything held back" probe
create index job_events_tx on {{schema}}.job_events (tx, id);
alter table {{schema}}.job_events set (fillfactor = 100, autovacuum_vacuum_scale_factor = 0.05);
grant select, insert on {{schema}}.job_events to pgfiber_tenant;
alter table {{schema}}.job_events enable row level security;
create policy job_events_by_org on {{schema}}.job_events to pgfiber_tenant
  using (org_id = current_setting('pgfiber.org_id', true))
  with check (org_id = current_setting('pgfiber.org_id', true));

-- 0020's trigger, on the new table: one NOTIFY per statement, and a webhook delivery job per event an org's
-- webhook wants (each event's id as above)
create or replace function {{schema}}.job_events_notify() returns trigger
language plpgsql as $$
begin
  if exists (select 1 from new_events) then
    perform pg_notify('{{schema}}_jobs', 'pgfiber:events');
    if exists (select 1 from {{schema}}.webhooks) then
      insert into {{schema}}.jobs (stage, org_id, subject_id, payload, max_attempts)
      select 'pgfiber.webhook', w.org_id, u.job_id::text,
             jsonb_build_object('webhookId', w.id::text, 'eventId', (e.id * 1024 + u.n - 1)::text), 10
      from new_events e
      cross join lateral unnest(e.job_ids) with ordinality as u(job_id, n)
      join {{schema}}.webhooks w on w.org_id = e.org_id and e.kind = any(w.kinds) and (w.stages is null or e.stage = any(w.stages))
      where e.stage <> 'pgfiber.webhook'
      order by e.id, u.n, w.id;
    end if;
  end if;
  return null;
end
$$;
create trigger job_events_notify after insert on {{schema}}.job_events
  referencing new table as new_events
  for each statement execute function {{schema}}.job_events_notify();

-- Enqueued, by the insert trigger (0021's function otherwise): one row per org and stage of the statement
create or replace function {{schema}}.jobs_notify_inserted() returns trigger
language plpgsql as $$
declare
  inserted_stage text;
begin
  insert into {{schema}}.job_events (org_id, stage, kind, job_ids, subject_ids, attempts, data)
  select org_id, stage, 'enqueued', array_agg(id order by id),
         case when bool_or(subject_id is not null) then array_agg(subject_id order by id) end,
         array_agg(0 order by id),
         case when bool_or(available_at > now())
              then array_agg(case when available_at > now() then jsonb_build_object('runAt', available_at) end order by id) end
  from (select id, org_id, stage, subject_id, available_at,
               (row_number() over (partition by org_id, stage order by id) - 1) / 1000 as chunk
        from new_jobs) j
  group by org_id, stage, chunk
  order by min(id);
  for inserted_stage in select distinct stage from new_jobs where status = 'queued' loop
    perform pg_notify('{{schema}}_jobs', inserted_stage);
  end loop;
  if exists (select 1 from new_jobs where status = 'queued' and available_at > now()) then
    perform pg_notify('{{schema}}_jobs', 'pgfiber:later');
  end if;
  return null;
end
$$;

-- 0021's settle of what depends on finished jobs, its event log insert batched like the rest
create or replace function {{schema}}.settle_finished(ids bigint[], fates text[], reasons text[], batch_ids bigint[],
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
    insert into {{schema}}.job_events (org_id, stage, kind, job_ids, subject_ids, attempts, data)
    select org_id, stage, kind, array_agg(id order by id), array_agg(subject_id order by id),
           array_agg(attempts order by id), array_agg(jsonb_build_object('message', reason) order by id)
    from (select *, case when on_failure = 'dead' then 'dead' else 'cancelled' end as kind,
                 (row_number() over (partition by org_id, stage, on_failure = 'dead' order by id) - 1) / 1000 as chunk
          from gone) g
    group by org_id, stage, kind, chunk
    order by min(id)
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
