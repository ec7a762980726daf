-- Optional: pgfiber's housekeeping from pg_cron, inside the database (seed 002's cron.schedule pattern).
--
-- You do not need this when a `pgfiber start` or `pgfiber worker` runs somewhere: every worker runs the reaper
-- itself, and the same jobs are pgfiber schedules (`pgfiber.reap-expired`, `pgfiber.dead-letter-retention`,
-- `pgfiber.history-retention`, `pgfiber.events-retention`;
-- `pgfiber schedules disable …` them if you run this instead). It is for deployments where nothing runs continuously (`pgfiber tick` from cron or a serverless
-- function; each tick also reaps first) and for keeping the dead-letter table short.
--
-- Before running it: replace `pgfiber.` with your PGFIBER_SCHEMA followed by a dot, 'pgfiber_jobs' with
-- '<schema>_jobs', and 'pgfiber.reaper.pgfiber' with 'pgfiber.reaper.<schema>'. Run as a role that owns the
-- schema's tables (pg_cron runs each job as the user who scheduled it):
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -f deploy/pg_cron.sql
-- The reaper below is the one in src/queue/JobsSql.ts (tryReaperLock, removeExpiredCancelled,
-- requeueExpired), under the same advisory lock, so it never races a worker's reaper.

create extension if not exists pg_cron;

-- Every minute: jobs whose worker died (lease expired, no heartbeat) go back to the queue with the attempt
-- spent, even the last one: the stage's next claim dead-letters such a job and runs the stage's onDeadLetter
-- (marking its call or document failed), which SQL here cannot do. Cancelled jobs whose worker is gone are removed.
select cron.schedule('pgfiber-reap-expired', '* * * * *', $reap$
do $body$
declare
  woken record;
begin
  if not pg_try_advisory_xact_lock(hashtext('pgfiber.reaper.pgfiber')) then
    return;  -- a worker is reaping right now
  end if;

  delete from pgfiber.jobs where id in (
    select id from pgfiber.jobs where status = 'cancelled' and locked_until < now() for update skip locked);

  for woken in
    with expired as (
      update pgfiber.jobs set status = 'queued', attempts = attempts + 1, available_at = now(),
        last_error = 'lease expired: the worker ' || coalesce(locked_by, '?') || ' stopped heartbeating',
        errors = errors || jsonb_build_array(jsonb_build_object('attempt', attempts + 1, 'at', now(), 'tag', 'LeaseExpired',
          'message', 'lease expired: the worker ' || coalesce(locked_by, '?') || ' stopped heartbeating', 'worker', locked_by)),
        locked_by = null, locked_until = null, updated_at = now()
      where id in (select id from pgfiber.jobs where status = 'running' and locked_until < now() for update skip locked)
      returning id, stage, org_id, subject_id, attempts, last_error
    ), logged as (
      -- the event log's `retried` (as JobsSql.requeueExpired writes it): a row per org and stage (migration 0023),
      -- at most 1,000 jobs a row
      insert into pgfiber.job_events (org_id, stage, kind, job_ids, subject_ids, attempts, data)
      select org_id, stage, 'retried', array_agg(id order by id), array_agg(subject_id order by id),
             array_agg(attempts order by id),
             array_agg(jsonb_build_object('delayMs', 0, 'tag', 'LeaseExpired', 'message', last_error) order by id)
      from (select *, (row_number() over (partition by org_id, stage order by id) - 1) / 1000 as chunk from expired) e
      group by org_id, stage, chunk
      order by min(id)
    )
    select distinct stage from expired
  loop
    perform pg_notify('pgfiber_jobs', woken.stage);  -- wakes listening workers, as a worker's reaper does
  end loop;
end
$body$;
$reap$);

-- Daily at 03:17: dead letters that were handled (retried or resolved) more than 30 days ago are deleted;
-- unresolved ones stay until someone looks at them (`pgfiber dlq list`). Same as `pgfiber dlq purge --older-than "30 days"`.
select cron.schedule('pgfiber-dead-letter-retention', '17 3 * * *', $purge$
  delete from pgfiber.dead_letters
  where resolution_status is not null and dead_at < now() - interval '30 days'
$purge$);

-- Every 10 minutes: the history's partitions (migration 0022) that hold nothing still kept are dropped and the
-- next two days' are created (a day each), then finished jobs kept as history (jobs_archive) whose retention has
-- passed are deleted, 5,000 at a time, each batch its own short transaction, until none is due (what the
-- `pgfiber.history-retention` schedule does). SKIP LOCKED lets it run beside a worker's pruning.
select cron.schedule('pgfiber-history-retention', '*/10 * * * *', $prune$
do $body$
declare
  n integer;
begin
  perform pgfiber.archive_drop_expired_partitions();
  perform pgfiber.archive_create_partitions(interval '1 day', interval '2 days');
  commit;
  loop
    -- each stage's oldest keep_until first, on the (stage, keep_until) index (as JobsSql.pruneArchive)
    with recursive stages as (
      (select stage from pgfiber.jobs_archive order by stage limit 1)
      union all
      select (select a.stage from pgfiber.jobs_archive a where a.stage > s.stage order by a.stage limit 1)
      from stages s where s.stage is not null
    ), part as (
      -- a row kept at least a partition's width waits for its partition's drop, or a width past its keep_until
      select coalesce(max(ends_at - starts_at), interval '0') as width from pgfiber.jobs_archive_partitions
    )
    delete from pgfiber.jobs_archive where id = any(array(
      select due.id from stages s cross join part cross join lateral (
        select case when (select a.keep_until - a.finished_at from pgfiber.jobs_archive a where a.stage = s.stage
                          order by a.keep_until desc limit 1) < part.width then now() else now() - part.width end as upto
      ) kind cross join lateral (
        select a.id from pgfiber.jobs_archive a where a.stage = s.stage and a.keep_until <= kind.upto
          and (a.keep_until - a.finished_at < part.width or a.keep_until <= now() - part.width)
        order by a.keep_until limit 5000 for update skip locked) due
      where s.stage is not null
      limit 5000));
    get diagnostics n = row_count;
    commit;  -- pg_cron runs a DO block as a procedure call: each batch commits on its own
    exit when n < 5000;
  end loop;
end
$body$;
$prune$);

-- Every 10 minutes: job events (job_events, migrations 0020 and 0023) older than a day are deleted, 5,000 rows at a time from
-- the front of the log (as EventsSql.pruneEvents; the `pgfiber.events-retention` schedule, PGFIBER_EVENTS_RETAIN).
select cron.schedule('pgfiber-events-retention', '5-59/10 * * * *', $events$
do $body$
declare
  n integer;
begin
  loop
    delete from pgfiber.job_events where id = any(array(
      select id from (select id, at from pgfiber.job_events order by id limit 5000) oldest
      where at < now() - interval '1 day'));
    get diagnostics n = row_count;
    commit;
    exit when n < 5000;
  end loop;
end
$body$;
$events$);

-- To see what ran:      select * from cron.job_run_details where command like '%pgfiber%' order by start_time desc limit 20;
-- To stop:              select cron.unschedule('pgfiber-reap-expired'); select cron.unschedule('pgfiber-dead-letter-retention');
--                       select cron.unschedule('pgfiber-history-retention'); select cron.unschedule('pgfiber-events-retention');
