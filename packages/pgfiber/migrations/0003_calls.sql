-- The call pipeline (seed 000): a recorded call, the artifacts its stages write to storage, its transcript
-- and its analysis. Every table carries org_id and is scoped by row-level security like the jobs table.
-- Stages write idempotently: artifacts `on conflict do nothing`, one transcript and one analysis per call.

create table {{schema}}.calls (
  id            uuid        primary key,
  org_id        text        not null,
  -- where the recording came from, as given (storage URI) and as the storage key the stages read
  source_uri    text        not null,
  source_key    text        not null,
  -- moves forward only: queued → extracting → transcribing → analyzing → done; failed when a stage gives up
  status        text        not null default 'queued'
                check (status in ('queued', 'extracting', 'transcribing', 'analyzing', 'done', 'failed')),
  error         text,
  -- the SpeechKit operation transcribe_start started, kept so a redelivered start polls it instead of paying twice
  operation_id  text,
  operation_started_at timestamptz,
  created_at    timestamptz not null default now(),
  updated_at    timestamptz not null default now(),
  completed_at  timestamptz,
  -- the target of the child tables' (call_id, org_id) keys: a row can never name another org's call
  unique (id, org_id)
);
create index calls_org on {{schema}}.calls (org_id, created_at desc);
create index calls_unfinished on {{schema}}.calls (status) where status not in ('done', 'failed');

create table {{schema}}.call_artifacts (
  call_id       uuid        not null,
  org_id        text        not null,
  kind          text        not null check (kind ~ '^[a-z][a-z0-9_]{0,62}$'),
  storage_key   text        not null,
  content_type  text,
  bytes         bigint      check (bytes >= 0),
  duration_ms   integer     check (duration_ms >= 0),
  channels      smallint    check (channels >= 0),
  created_at    timestamptz not null default now(),
  primary key (call_id, kind),
  foreign key (call_id, org_id) references {{schema}}.calls (id, org_id) on delete cascade
);

create table {{schema}}.transcripts (
  call_id       uuid        primary key,
  org_id        text        not null,
  provider      text        not null default 'speechkit',
  operation_id  text        not null,
  language      text,
  -- [{ "startMs", "endMs", "channel", "text" }], ordered by start time then channel
  segments      jsonb       not null check (jsonb_typeof(segments) = 'array'),
  duration_ms   integer     check (duration_ms >= 0),
  created_at    timestamptz not null default now(),
  foreign key (call_id, org_id) references {{schema}}.calls (id, org_id) on delete cascade
);

create table {{schema}}.analyses (
  call_id       uuid        primary key,
  org_id        text        not null,
  analyzer      text        not null,
  -- the Analyzer's CallAnalysis, whole
  analysis      jsonb       not null check (jsonb_typeof(analysis) = 'object'),
  created_at    timestamptz not null default now(),
  updated_at    timestamptz not null default now(),
  foreign key (call_id, org_id) references {{schema}}.calls (id, org_id) on delete cascade
);

grant select, insert, update, delete
  on {{schema}}.calls, {{schema}}.call_artifacts, {{schema}}.transcripts, {{schema}}.analyses
  to pgfiber_tenant;

alter table {{schema}}.calls enable row level security;
alter table {{schema}}.call_artifacts enable row level security;
alter table {{schema}}.transcripts enable row level security;
alter table {{schema}}.analyses enable row level security;
create policy calls_by_org on {{schema}}.calls to pgfiber_tenant
  using (org_id = current_setting('pgfiber.org_id', true))
  with check (org_id = current_setting('pgfiber.org_id', true));
create policy call_artifacts_by_org on {{schema}}.call_artifacts to pgfiber_tenant
  using (org_id = current_setting('pgfiber.org_id', true))
  with check (org_id = current_setting('pgfiber.org_id', true));
create policy transcripts_by_org on {{schema}}.transcripts to pgfiber_tenant
  using (org_id = current_setting('pgfiber.org_id', true))
  with check (org_id = current_setting('pgfiber.org_id', true));
create policy analyses_by_org on {{schema}}.analyses to pgfiber_tenant
  using (org_id = current_setting('pgfiber.org_id', true))
  with check (org_id = current_setting('pgfiber.org_id', true));
