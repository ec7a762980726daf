-- Recurring schedules as rows. Each row is a cron expression (5 or 6 fields, in an IANA time zone) or a fixed
-- interval, and a cursor: `next_tick_at`, the next tick nobody has fired yet. Firing a tick advances the
-- cursor with a compare-and-set and enqueues the tick's job in the same transaction, so however many workers
-- reach the tick at once, one job is written (src/queue/SchedulesSql.ts). The cron arithmetic is done by the
-- workers (croner); the database holds the state and the clock.

create table {{schema}}.schedules (
  -- '' for schedules that belong to no org (system work): part of the key, so two orgs may use one name
  org_key        text        not null default '',
  name           text        not null check (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'),
  org_id         text        generated always as (nullif(org_key, '')) stored,
  stage          text        not null check (stage ~ '^[a-z][a-z0-9_.:-]{0,62}$'),
  payload        jsonb       not null default '{}'::jsonb,
  priority       smallint    not null default 50 check (priority between 0 and 100),
  max_attempts   integer     not null default 5 check (max_attempts between 1 and 1000),
  cron           text,
  interval_ms    bigint      check (interval_ms >= 1000),
  time_zone      text        not null default 'UTC',
  enabled        boolean     not null default true,
  -- after downtime: 'skip' fires only the latest missed tick, 'backfill' the latest `backfill_limit` of them
  catch_up       text        not null default 'skip' check (catch_up in ('skip', 'backfill')),
  backfill_limit integer     not null default 1 check (backfill_limit between 1 and 1000),
  next_tick_at   timestamptz not null,
  last_tick_at   timestamptz,
  -- 'code': declared with a stage and upserted at start-up; 'runtime': added by an operator or a tenant
  source         text        not null default 'runtime' check (source in ('code', 'runtime')),
  -- the code's definition when last upserted: a deploy that changes it wins, an unchanged one keeps
  -- whatever an operator changed since (e.g. the cron expression or `enabled`)
  declared       jsonb,
  created_at     timestamptz not null default now(),
  updated_at     timestamptz not null default now(),
  primary key (org_key, name),
  check ((cron is null) <> (interval_ms is null))
);

-- the cursor scan: enabled schedules by their next tick
create index schedules_due on {{schema}}.schedules (next_tick_at) where enabled;

-- A change of definition (not the cursor moving on) tells every worker to reload its schedules, on the jobs
-- channel, with a payload no stage can have ('$schedules'); sent at commit, so a rolled-back edit says nothing.
create function {{schema}}.schedules_notify_changed() returns trigger
language plpgsql as $$
begin
  perform pg_notify('{{schema}}_jobs', '$schedules');
  return null;
end
$$;

create trigger schedules_notify_changed after insert or delete on {{schema}}.schedules
  for each statement execute function {{schema}}.schedules_notify_changed();
create trigger schedules_notify_updated after update on {{schema}}.schedules
  for each row
  when ((old.cron, old.interval_ms, old.time_zone, old.enabled, old.stage, old.payload)
        is distinct from (new.cron, new.interval_ms, new.time_zone, new.enabled, new.stage, new.payload)
        or old.next_tick_at > new.next_tick_at)
  execute function {{schema}}.schedules_notify_changed();

-- Tenants (HTTP API keys) see and manage only their org's schedules, as with jobs.
grant select, insert, update, delete on {{schema}}.schedules to pgfiber_tenant;
alter table {{schema}}.schedules enable row level security;
create policy schedules_by_org on {{schema}}.schedules to pgfiber_tenant
  using (org_id = current_setting('pgfiber.org_id', true))
  with check (org_id = current_setting('pgfiber.org_id', true));
