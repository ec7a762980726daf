-- The dashboard: operator keys, and the per-minute counts its charts are drawn from.
--
-- An API key gets a scope: 'org' (as before: bound to one org, every request under that org's row-level
-- security) or 'admin' (an operator's key, `pgfiber keys create --admin`: the dashboard shows it every org;
-- it may name no org at all, and then it cannot act on the HTTP API, which always works for one org).

alter table {{schema}}.api_keys add column scope text not null default 'org' check (scope in ('org', 'admin'));
alter table {{schema}}.api_keys alter column org_id drop not null;
alter table {{schema}}.api_keys add constraint api_keys_org_scope check (scope = 'admin' or org_id is not null);

-- Completions, failures and run time per minute, stage and org, written by the workers from what they settled
-- (one batched upsert per process and minute, src/dashboard/MinuteStats.ts): the dashboard's charts read this
-- small table, never the jobs tables. Rows older than the kept window are deleted by the same writers.
create table {{schema}}.job_stats_minute (
  minute        timestamptz not null,
  stage         text        not null,
  -- '' for jobs of no org: part of the key (a primary key cannot hold a null)
  org_key       text        not null default '',
  org_id        text        generated always as (nullif(org_key, '')) stored,
  completed     integer     not null default 0,
  retried       integer     not null default 0,
  dead_lettered integer     not null default 0,
  -- handler run time of the runs counted above
  run_ms_sum    float8      not null default 0,
  run_ms_max    float8      not null default 0,
  runs          integer     not null default 0,
  primary key (minute, stage, org_key)
);

-- a tenant's dashboard reads its own org's rows only
grant select on {{schema}}.job_stats_minute to pgfiber_tenant;
alter table {{schema}}.job_stats_minute enable row level security;
create policy job_stats_minute_by_org on {{schema}}.job_stats_minute to pgfiber_tenant
  using (org_id = current_setting('pgfiber.org_id', true));
