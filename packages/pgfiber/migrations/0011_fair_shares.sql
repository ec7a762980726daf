-- Fair shares and rate limits (src/queue/JobsSql.ts: claimFair, claimLimited).
--
-- Fair claiming walks the orgs that have queued jobs in one stage and priority with a loose index scan (one
-- index descent per org, never a scan of the backlog) and takes each org's oldest ready jobs from the same
-- index. `coalesce(org_id, '')` puts the jobs of no org in one group of their own.
create index jobs_ready_by_org on {{schema}}.jobs (stage, priority, (coalesce(org_id, '')), available_at, id)
  where status = 'queued';

-- The claim of a capped stage counts the stage's running leases, by org.
create index jobs_running_by_stage on {{schema}}.jobs (stage, (coalesce(org_id, ''))) where status <> 'queued';

-- Run-time overrides of a stage's limits (`pgfiber limits set`, PUT /limits/:stage), over what the code and
-- configuration say. A null column is "not overridden"; 0 means "no limit" (an override can lift a limit).
create table {{schema}}.stage_limits (
  stage                text        primary key check (stage ~ '^[a-z][a-z0-9_.:-]{0,62}$'),
  fair                 boolean,
  max_running          integer     check (max_running >= 0),
  max_running_per_org  integer     check (max_running_per_org >= 0),
  -- a token bucket: `rate_limit` tokens every `rate_per_ms`, holding at most `rate_burst`
  rate_limit           integer     check (rate_limit >= 0),
  rate_per_ms          bigint      check (rate_per_ms >= 1),
  rate_burst           integer     check (rate_burst >= 1),
  rate_per_org         boolean,
  updated_at           timestamptz not null default now()
);

-- Token buckets, one per stage (org_key '') or per stage and org when the limit is per org. Consumed by the
-- claim under the stage's advisory lock; `refilled_at` only moves forward.
create table {{schema}}.rate_buckets (
  stage       text             not null,
  org_key     text             not null default '',
  tokens      double precision not null,
  refilled_at timestamptz      not null,
  -- when the bucket next holds a whole token, if the last claim left it below one: "rate limited" in stats
  next_token_at timestamptz,
  primary key (stage, org_key)
);

-- A tenant's claim (`POST /jobs/tick` under row-level security) reads the overrides and spends its org's
-- tokens; changing limits is for the owner (the CLI) and admin keys only, through the service.
grant select on {{schema}}.stage_limits to pgfiber_tenant;
grant select, insert, update on {{schema}}.rate_buckets to pgfiber_tenant;
-- ... and only the stage's shared bucket (org_key '') or its own org's
alter table {{schema}}.rate_buckets enable row level security;
create policy rate_buckets_by_org on {{schema}}.rate_buckets to pgfiber_tenant
  using (org_key in ('', current_setting('pgfiber.org_id', true)))
  with check (org_key in ('', current_setting('pgfiber.org_id', true)));
