-- Search over live jobs and bulk actions on them (Bulk.ts, BulkSql.ts).
--
-- `jobs_payload` serves payload containment (`payload @> '{"customer":42}'`, and `key=value` searches, which are
-- containment too): jsonb_path_ops keeps one hash per path-and-value, smaller and faster for @> than the default
-- opclass, and its pending list (fastupdate, the default) keeps an insert's cost to an append. Its cost on
-- enqueue and a search's time at a 1M-job backlog are in docs/benchmarks.md.
-- Built inside this migration's transaction, `jobs` takes no writes while it builds (docs/operations.md, Migrations on
-- deploy); `if not exists`, so an operator may build it beforehand with `create index concurrently`.
create index if not exists jobs_payload on {{schema}}.jobs using gin (payload jsonb_path_ops);

-- Error-text search (a substring of `last_error`, case-insensitive) uses a trigram index when pg_trgm can be had:
-- already installed, or installable by this role (it is a trusted extension since PostgreSQL 13). Only rows with
-- an error are indexed, so a fresh job's insert pays nothing for it. Without pg_trgm the search is a scan bounded
-- by the other filters (stage, org, status, age), and still correct.
do $$
declare
  ext_schema text;
begin
  select n.nspname into ext_schema from pg_extension e join pg_namespace n on n.oid = e.extnamespace where e.extname = 'pg_trgm';
  if ext_schema is null and exists (select 1 from pg_available_extensions where name = 'pg_trgm')
     and exists (select 1 from pg_namespace where nspname = 'public') then
    begin
      -- in public, not in this schema: dropping one pgfiber schema must not take the extension from another
      create extension if not exists pg_trgm with schema public;
      ext_schema := 'public';
    exception when others then
      ext_schema := null;
    end;
  end if;
  if ext_schema is not null then
    execute format('create index if not exists jobs_last_error on {{schema}}.jobs using gin (last_error %I.gin_trgm_ops) where last_error is not null', ext_schema);
  end if;
end
$$;

-- Who did what to which jobs, by filter: one row per bulk action, written as it starts and finished as it ends (cancel, retry, run-now, priority) with its
-- filter, how many jobs matched and were changed, and the actor (an API key's id, "cli", a dashboard viewer).
-- Cancelled jobs also go to the history (jobs_archive) as a single cancel puts them.
create table {{schema}}.job_actions (
  id          bigint      generated always as identity primary key,
  action      text        not null check (action in ('cancel', 'retry', 'run-now', 'priority')),
  -- the filter as given (stage, status, org, subject, payload, error, age), and the new priority for 'priority'
  filter      jsonb       not null,
  priority    smallint,
  -- the org the action was scoped to (a tenant's key: always its own); null: an operator's, every org
  org_id      text,
  actor       text        not null,
  -- jobs the action applied to when it started, and how many it changed
  matched     integer     not null,
  affected    integer     not null,
  started_at  timestamptz not null default now(),
  -- null while it runs; `interrupted`: it ended before its last batch (its changes so far stay)
  finished_at timestamptz,
  interrupted boolean     not null default false
);
create index job_actions_org on {{schema}}.job_actions (org_id, id) where org_id is not null;

-- a tenant records and reads its own org's actions only
grant select, insert, update on {{schema}}.job_actions to pgfiber_tenant;
alter table {{schema}}.job_actions enable row level security;
create policy job_actions_by_org on {{schema}}.job_actions to pgfiber_tenant
  using (org_id = current_setting('pgfiber.org_id', true))
  with check (org_id = current_setting('pgfiber.org_id', true));
