-- The stage registry: every worker process records the stages it runs, so every operator surface (CLI, HTTP,
-- dashboard) can work on any stage, whichever process defined it.
--
-- `stage_registry` is one row per stage as its latest process declared it: visibility, concurrency, the limits
-- and retention in its code, its jobs' defaults and the payload's JSON Schema (derived from its Schema). The
-- row stays when the last process stops, so a stage with jobs and no live process is still known and shown as
-- such. `stage_processes` is one row per process and stage: written at the pool's start, its `last_seen_at`
-- refreshed by the Waker's safety sweep (inside the statement the sweep already sends), deleted at a clean
-- shutdown. A row is live while it was seen within three of its process's sweeps.
create table {{schema}}.stage_registry (
  stage          text        primary key check (stage ~ '^[a-z][a-z0-9_.:-]{0,62}$'),
  visibility     text        not null check (visibility in ('public', 'internal')),
  concurrency    integer     not null,
  -- the limits in the stage's code: { fair, maxRunning, maxRunningPerOrg, rate: { limit, perMs, burst, perOrg } | null }
  limits         jsonb       not null,
  -- null: the service's default retention
  retain_ms      float8,
  max_attempts   integer     not null,
  priority       integer     not null,
  -- null when the Schema has no JSON Schema form: an operator's payload is then taken as any JSON object
  payload_schema jsonb,
  registered_by  text        not null,
  updated_at     timestamptz not null default now()
);

create table {{schema}}.stage_processes (
  worker_id    text        not null,
  stage        text        not null references {{schema}}.stage_registry (stage) on delete cascade,
  concurrency  integer     not null,
  -- the process's sweep interval: a row not seen for three of them belongs to a process that is gone
  sweep_ms     float8      not null,
  started_at   timestamptz not null default now(),
  last_seen_at timestamptz not null default now(),
  primary key (worker_id, stage)
);
create index stage_processes_stage on {{schema}}.stage_processes (stage);

-- A tenant learns of public stages only (the refusal of an unknown stage lists them); never of processes: it
-- may read the table (a tenant's request lists registered stages with theirs) but no policy lets it see a row.
grant select on {{schema}}.stage_registry, {{schema}}.stage_processes to pgfiber_tenant;
alter table {{schema}}.stage_registry enable row level security;
create policy stage_registry_public on {{schema}}.stage_registry to pgfiber_tenant using (visibility = 'public');
alter table {{schema}}.stage_processes enable row level security;
