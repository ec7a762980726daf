-- pgfiber queue: the hot jobs table, the dead-letter table, the insert trigger that wakes workers,
-- and row-level security by org. `{{schema}}` is replaced by the configured schema name (PGFIBER_SCHEMA).

create table {{schema}}.jobs (
  id            bigint generated always as identity primary key,
  stage         text        not null check (stage ~ '^[a-z][a-z0-9_.:-]{0,62}$'),
  org_id        text,
  subject_id    text,
  payload       jsonb       not null default '{}'::jsonb,
  -- lower runs first: fast = 10, normal = 50, bulk = 90
  priority      smallint    not null default 50 check (priority between 0 and 100),
  -- completed jobs are deleted and dead ones move to dead_letters, so only live states stay here
  status        text        not null default 'queued' check (status in ('queued', 'running', 'cancelled')),
  attempts      integer     not null default 0 check (attempts >= 0),
  max_attempts  integer     not null default 5 check (max_attempts between 1 and 1000),
  -- NotReady reschedules: they spend no attempt but are bounded by the stage's poll budget
  polls         integer     not null default 0,
  available_at  timestamptz not null default now(),
  locked_by     text,
  locked_until  timestamptz,
  -- bumped by every claim: the fencing token a worker must present to complete, retry or fail its job
  lease         integer     not null default 0,
  dedupe_key    text,
  errors        jsonb       not null default '[]'::jsonb,
  last_error    text,
  created_at    timestamptz not null default now(),
  updated_at    timestamptz not null default now()
) with (fillfactor = 70);  -- room on each page so heartbeats (unindexed columns) are HOT updates

-- the claim: per stage, priority then available_at, only queued rows
create index jobs_ready on {{schema}}.jobs (stage, priority, available_at, id) where status = 'queued';
-- the reaper and the next-due timer
create index jobs_inflight on {{schema}}.jobs (id) where status <> 'queued';
create index jobs_due on {{schema}}.jobs (available_at) where status = 'queued';
-- dedupe keys are unique among live (queued or running) jobs: finished ones have left the table
create unique index jobs_dedupe on {{schema}}.jobs (dedupe_key) where dedupe_key is not null;
create index jobs_subject on {{schema}}.jobs (subject_id) where subject_id is not null;
create index jobs_org on {{schema}}.jobs (org_id) where org_id is not null;

create table {{schema}}.dead_letters (
  id                bigint generated always as identity primary key,
  job_id            bigint      not null,
  stage             text        not null,
  org_id            text,
  subject_id        text,
  payload           jsonb       not null,
  priority          smallint    not null,
  attempts          integer     not null,
  max_attempts      integer     not null,
  dedupe_key        text,
  reason            text        not null,
  error_history     jsonb       not null default '[]'::jsonb,
  job_created_at    timestamptz not null,
  dead_at           timestamptz not null default now(),
  resolution_status text check (resolution_status in ('retried', 'resolved')),
  resolution_notes  text,
  resolved_at       timestamptz,
  retried_job_id    bigint
);
create index dead_letters_open on {{schema}}.dead_letters (stage, dead_at) where resolution_status is null;
create index dead_letters_org on {{schema}}.dead_letters (org_id) where org_id is not null;

-- One NOTIFY per stage per statement (not per row), sent at commit of the inserting transaction:
-- a rolled-back insert wakes nobody, and a 10,000-row insert wakes each stage once.
create function {{schema}}.jobs_notify_inserted() returns trigger
language plpgsql as $$
declare
  inserted_stage text;
begin
  for inserted_stage in select distinct stage from new_jobs loop
    perform pg_notify('{{schema}}_jobs', inserted_stage);
  end loop;
  return null;
end
$$;

create trigger jobs_notify_inserted after insert on {{schema}}.jobs
  referencing new table as new_jobs
  for each statement execute function {{schema}}.jobs_notify_inserted();

-- Row-level security: the service connects as the owner (not subject to RLS); work done for an org
-- (HTTP API requests) switches to the pgfiber_tenant role with `pgfiber.org_id` set for the transaction.
do $$
begin
  create role pgfiber_tenant nologin;
exception
  when duplicate_object or unique_violation then null;
end
$$;
do $$
begin
  execute format('grant pgfiber_tenant to %I', current_user);
exception
  when others then null;  -- already a member, or a superuser, who needs no grant
end
$$;
grant usage on schema {{schema}} to pgfiber_tenant;
grant select, insert, update, delete on {{schema}}.jobs, {{schema}}.dead_letters to pgfiber_tenant;

alter table {{schema}}.jobs enable row level security;
alter table {{schema}}.dead_letters enable row level security;
create policy jobs_by_org on {{schema}}.jobs to pgfiber_tenant
  using (org_id = current_setting('pgfiber.org_id', true))
  with check (org_id = current_setting('pgfiber.org_id', true));
create policy dead_letters_by_org on {{schema}}.dead_letters to pgfiber_tenant
  using (org_id = current_setting('pgfiber.org_id', true))
  with check (org_id = current_setting('pgfiber.org_id', true));
