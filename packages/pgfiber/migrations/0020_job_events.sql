-- The event log: every job's lifecycle (enqueued, started, progress, completed, retried, rescheduled, dead,
-- cancelled) as rows, written by the statements that already run (the insert trigger below for enqueues, a
-- CTE of the claim, heartbeat, settle, cancel and reaper statements for the rest), so logging costs no round
-- trip. Readers follow it by cursor, in (tx, id) order (EventsSql.readEvents): `id` is assigned when a row is
-- written, not when its transaction commits, so a reader going by id alone could pass an id that a slower
-- transaction commits later; a reader that takes only rows whose transaction is older than every running one
-- (`tx < pg_snapshot_xmin(pg_current_snapshot())`) and orders them by (tx, id) never sees a row appear behind
-- its cursor. docs/events.md has the reasoning and the measurements.
create table {{schema}}.job_events (
  id bigint generated always as identity primary key,
  tx xid8 not null default pg_current_xact_id(),
  org_id text,
  stage text not null,
  job_id bigint not null,
  subject_id text,
  kind text not null check (kind in ('enqueued', 'started', 'progress', 'completed', 'retried', 'rescheduled', 'dead', 'cancelled')),
  attempt int not null default 0,
  data jsonb,
  at timestamptz not null default now()
);
-- the readers' order and the "is anything held back" probe
create index job_events_tx on {{schema}}.job_events (tx, id);
-- appended and pruned from the front: no updates, so no room kept for them
alter table {{schema}}.job_events set (fillfactor = 100, autovacuum_vacuum_scale_factor = 0.05);

grant select, insert on {{schema}}.job_events to pgfiber_tenant;
alter table {{schema}}.job_events enable row level security;
create policy job_events_by_org on {{schema}}.job_events to pgfiber_tenant
  using (org_id = current_setting('pgfiber.org_id', true))
  with check (org_id = current_setting('pgfiber.org_id', true));

-- Webhook subscriptions: an org's URL, the event kinds (and optionally stages) it wants, and the secret its
-- deliveries are signed with (Standard Webhooks: `whsec_` + base64; shown once, at creation).
create table {{schema}}.webhooks (
  id bigint generated always as identity primary key,
  org_id text not null,
  url text not null,
  kinds text[] not null,
  stages text[],
  secret text not null,
  created_at timestamptz not null default now()
);
create index webhooks_org on {{schema}}.webhooks (org_id);
grant select, insert, delete on {{schema}}.webhooks to pgfiber_tenant;
alter table {{schema}}.webhooks enable row level security;
create policy webhooks_by_org on {{schema}}.webhooks to pgfiber_tenant
  using (org_id = current_setting('pgfiber.org_id', true))
  with check (org_id = current_setting('pgfiber.org_id', true));

-- One NOTIFY per statement that logged anything, on the jobs channel every process already LISTENs to, with
-- one fixed payload: PostgreSQL folds identical notifications of a transaction into one, and readers read
-- forward from their own cursor anyway, so the payload needs no id.
-- And each event an org's webhook wants becomes a delivery job (stage `pgfiber.webhook`) in the same
-- transaction: delivered at least once, retried on the stage's backoff, dead-lettered, whichever process runs
-- it. The deliveries' own events are never delivered (no webhook of webhooks).
create function {{schema}}.job_events_notify() returns trigger
language plpgsql as $$
begin
  if exists (select 1 from new_events) then
    perform pg_notify('{{schema}}_jobs', 'pgfiber:events');
    if exists (select 1 from {{schema}}.webhooks) then
      insert into {{schema}}.jobs (stage, org_id, subject_id, payload, max_attempts)
      select 'pgfiber.webhook', w.org_id, e.job_id::text,
             jsonb_build_object('webhookId', w.id::text, 'eventId', e.id::text), 10
      from new_events e
      join {{schema}}.webhooks w on w.org_id = e.org_id and e.kind = any(w.kinds) and (w.stages is null or e.stage = any(w.stages))
      where e.stage <> 'pgfiber.webhook'
      order by e.id, w.id;
    end if;
  end if;
  return null;
end
$$;
create trigger job_events_notify after insert on {{schema}}.job_events
  referencing new table as new_events
  for each statement execute function {{schema}}.job_events_notify();

-- Enqueued: logged by the insert trigger every enqueue already fires (the API's, a producer's own SQL insert,
-- the documents trigger), in the statement's order. The rest of the function is 0017's.
create or replace function {{schema}}.jobs_notify_inserted() returns trigger
language plpgsql as $$
declare
  inserted_stage text;
begin
  insert into {{schema}}.job_events (org_id, stage, job_id, subject_id, kind, attempt, data)
  select org_id, stage, id, subject_id, 'enqueued', 0,
         case when available_at > now() then jsonb_build_object('runAt', available_at) end
  from new_jobs order by id;
  for inserted_stage in select distinct stage from new_jobs loop
    perform pg_notify('{{schema}}_jobs', inserted_stage);
  end loop;
  if exists (select 1 from new_jobs where available_at > now()) then
    perform pg_notify('{{schema}}_jobs', 'pgfiber:later');
  end if;
  return null;
end
$$;
