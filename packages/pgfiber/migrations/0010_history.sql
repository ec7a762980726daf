-- A job's whole life: kept history, output, progress, timestamps, per-job timeout, and per-stage pause.
--
-- `jobs` stays the hot table of live work: finished jobs still leave it in the settle statement, which now
-- hands them (completed, dead-lettered, cancelled) to `jobs_archive` when their stage keeps history
-- (retention > 0). The archive is read by id (`Queue.get`, GET /jobs/:id) and pruned in batches by
-- `keep_until`, never scanned by the claim. New columns on `jobs` are nullable without defaults: adding them
-- rewrites nothing, and the claim's index (`jobs_ready`) does not change.

alter table {{schema}}.jobs
  -- the first run's start (the claim that first ran it), kept across retries
  add column started_at       timestamptz,
  -- the last finished run's length in ms (measured by the worker)
  add column last_run_ms      double precision,
  -- what the handler last reported, written by the heartbeat at most once a second per job
  add column progress         real,
  add column progress_message text,
  -- overrides the stage's timeout for this job
  add column timeout_ms       integer check (timeout_ms is null or timeout_ms > 0);

create table {{schema}}.jobs_archive (
  id               bigint      primary key,
  stage            text        not null,
  org_id           text,
  subject_id       text,
  payload          jsonb       not null,
  priority         smallint    not null,
  status           text        not null check (status in ('completed', 'dead', 'cancelled')),
  attempts         integer     not null,
  max_attempts     integer     not null,
  polls            integer     not null default 0,
  dedupe_key       text,
  errors           jsonb       not null default '[]'::jsonb,
  last_error       text,
  -- the handler's result (encoded by the stage's `output` Schema); null when it returned none
  output           jsonb,
  progress         real,
  progress_message text,
  timeout_ms       integer,
  created_at       timestamptz not null,
  started_at       timestamptz,
  finished_at      timestamptz not null default now(),
  last_run_ms      double precision,
  -- finished_at + the stage's retention: pruned after this
  keep_until       timestamptz not null
);
-- the pruner takes the oldest first, in batches
create index jobs_archive_prune on {{schema}}.jobs_archive (keep_until);
create index jobs_archive_stage on {{schema}}.jobs_archive (stage, finished_at);
create index jobs_archive_org on {{schema}}.jobs_archive (org_id) where org_id is not null;

-- Tenancy as on `jobs` (0001): a tenant reads (and, cancelling its queued job, writes) only its org's history.
grant select, insert, delete on {{schema}}.jobs_archive to pgfiber_tenant;
alter table {{schema}}.jobs_archive enable row level security;
create policy jobs_archive_by_org on {{schema}}.jobs_archive to pgfiber_tenant
  using (org_id = current_setting('pgfiber.org_id', true))
  with check (org_id = current_setting('pgfiber.org_id', true));

-- Per-stage control: a paused stage claims nothing (enqueues still succeed; running jobs finish). Shared by
-- every org: only the owner (operators, admin keys) changes it, so tenants get no grant. A change NOTIFYs
-- '<schema>_jobs' with the payload 'pgfiber:stages', which every worker's listener hears.
create table {{schema}}.stage_controls (
  stage      text        primary key check (stage ~ '^[a-z][a-z0-9_.:-]{0,62}$'),
  paused     boolean     not null default false,
  changed_by text,
  changed_at timestamptz not null default now()
);

-- tenants read it (a claim made for one org, `pgfiber tick --org`, checks it) and never write it
grant select on {{schema}}.stage_controls to pgfiber_tenant;

create function {{schema}}.stage_controls_notify() returns trigger
language plpgsql as $$
begin
  perform pg_notify('{{schema}}_jobs', 'pgfiber:stages');
  return null;
end
$$;

create trigger stage_controls_notify after insert or update or delete on {{schema}}.stage_controls
  for each statement execute function {{schema}}.stage_controls_notify();
