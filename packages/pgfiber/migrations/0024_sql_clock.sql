-- The queue's functions take the time they run at, as every statement of the queue does (SqlClock.ts): `at_time`,
-- defaulting to now(), so production is as before (each statement passes coalesce(null, now()), which is now())
-- and a test that passes its TestClock's time sees one clock in every time a job's path writes or compares.
-- A new argument makes a new function (an overload), so the old ones are dropped first; the settle that calls
-- them passes the new argument from this build on.

drop function {{schema}}.settle_finished(bigint[], text[], text[], bigint[], float8, jsonb);
drop function {{schema}}.enqueue_batch_callbacks(bigint[]);

-- 0021's batch callbacks, written at `at_time` (their run time and creation; the columns' defaults were now())
create function {{schema}}.enqueue_batch_callbacks(batch_ids bigint[], at_time timestamptz default now()) returns integer
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
    insert into {{schema}}.jobs (stage, org_id, payload, priority, max_attempts, available_at, created_at, updated_at)
    select spec ->> 'stage', org_id, coalesce(spec -> 'payload', '{}'::jsonb) || jsonb_build_object('batch', counts),
           coalesce((spec ->> 'priority')::smallint, 50), coalesce((spec ->> 'maxAttempts')::int, 5), at_time, at_time, at_time
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

-- 0023's insert trigger: a trigger takes no argument, so a new row's own `created_at` (now() by default, the
-- statement's time when the statement writes it) is its "now": the enqueued event's runAt and the 'pgfiber:later'
-- wake-up compare the run time with it. For a row inserted with the default it is exactly now(), as before.
create or replace function {{schema}}.jobs_notify_inserted() returns trigger
language plpgsql as $$
declare
  inserted_stage text;
begin
  insert into {{schema}}.job_events (org_id, stage, kind, job_ids, subject_ids, attempts, data)
  select org_id, stage, 'enqueued', array_agg(id order by id),
         case when bool_or(subject_id is not null) then array_agg(subject_id order by id) end,
         array_agg(0 order by id),
         case when bool_or(available_at > created_at)
              then array_agg(case when available_at > created_at then jsonb_build_object('runAt', available_at) end order by id) end
  from (select id, org_id, stage, subject_id, available_at, created_at,
               (row_number() over (partition by org_id, stage order by id) - 1) / 1000 as chunk
        from new_jobs) j
  group by org_id, stage, chunk
  order by min(id);
  for inserted_stage in select distinct stage from new_jobs where status = 'queued' loop
    perform pg_notify('{{schema}}_jobs', inserted_stage);
  end loop;
  if exists (select 1 from new_jobs where status = 'queued' and available_at > created_at) then
    perform pg_notify('{{schema}}_jobs', 'pgfiber:later');
  end if;
  return null;
end
$$;

-- 0023's settle of what depends on finished jobs, at `at_time`: released dependents' run time, the history's finish
-- and keep times, dead letters' time and batches' finish
create function {{schema}}.settle_finished(ids bigint[], fates text[], reasons text[], batch_ids bigint[],
                                          retain_default_ms float8, retain_by_stage jsonb, at_time timestamptz default now())
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
        available_at = case when j.waiting_on - done.n <= 0 then greatest(j.available_at, at_time) else j.available_at end,
        updated_at = at_time
    from done
    where j.id = done.job_id and j.status = 'waiting'
    returning j.stage, j.status, j.available_at
  ), woken as (
    select pg_notify('{{schema}}_jobs', stage) from (select distinct stage from counted where status = 'queued') s
    union all
    select pg_notify('{{schema}}_jobs', 'pgfiber:later')
    where exists (select 1 from counted where status = 'queued' and available_at > at_time)
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
                                         dedupe_key, reason, error_history, job_created_at, dead_at)
    select id, stage, org_id, subject_id, payload, priority, attempts, max_attempts, dedupe_key, reason, errors, created_at, at_time
    from gone where on_failure = 'dead'
  ), kept as (
    insert into {{schema}}.jobs_archive (id, stage, org_id, subject_id, payload, priority, status, attempts,
                                         max_attempts, polls, dedupe_key, errors, last_error, output, progress,
                                         progress_message, timeout_ms, created_at, started_at, finished_at,
                                         last_run_ms, keep_until)
    select id, stage, org_id, subject_id, payload, priority,
           case when on_failure = 'dead' then 'dead' else 'cancelled' end, attempts, max_attempts, polls, dedupe_key,
           errors, reason, null, progress, progress_message, timeout_ms, created_at, started_at, at_time, last_run_ms,
           at_time + keep_ms * interval '1 millisecond'
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
                                                    retain_default_ms, retain_by_stage, at_time);
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
        finished_at = case when b.sealed and b.completed + counts.c + b.failed + counts.f >= b.total then at_time end
    from counts where b.id = counts.batch_id and b.finished_at is null
    returning b.id, b.finished_at
  )
  select array_agg(id) filter (where finished_at is not null) into done_batches from counted;
  if done_batches is not null then
    touched := touched + {{schema}}.enqueue_batch_callbacks(done_batches, at_time);
  end if;

  return touched;
end
$$;
