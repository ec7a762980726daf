-- Kept history partitioned by finish time, so retention drops whole partitions instead of deleting rows.
--
-- `jobs_archive` becomes a table partitioned by range of `finished_at`: one partition per period (a day by
-- default), created ahead by the housekeeping stage (`archive_create_partitions`), and dropped by it once no row
-- in it is still kept (`archive_drop_expired_partitions`: every row's `keep_until` has passed). A stage whose
-- retention is shorter than a partition is still pruned on time by the batched delete (JobsSql.pruneArchive),
-- which works through the parent as before. A default partition catches any row no period covers (housekeeping
-- stopped for longer than it creates ahead), so a settle's insert never fails for want of a partition.
--
-- The existing table is kept, not copied: it is renamed `jobs_archive_legacy` and attached as the first
-- partition, covering everything that finished before tomorrow (UTC), then dropped like any other partition
-- once its last row's retention passes. The migration holds the old table's lock (settles wait) while it
-- builds one unique index on (id, finished_at) over the old rows and reads them once to check the bound; build
-- that index beforehand with `create unique index concurrently jobs_archive_legacy_id on <schema>.jobs_archive
-- (id, finished_at)` and only the read remains (docs/operations.md).
--
-- A partitioned table's unique index must hold its partition key: the archive's is (id, finished_at). Ids stay
-- unique (they come from `jobs`); every read by id probes each partition's index, and nothing inserts into the
-- archive `on conflict`. Row-level security is the parent's: a tenant reaches the history only through
-- `jobs_archive` (whose policy applies to every partition read through it) and has no grant on any partition.
--
-- Dead letters stay one table: they are few (failures only), updated in place when resolved, and purged by
-- `resolved_at`, not by the time they died, so partitions by time would not let them be dropped whole.

alter table {{schema}}.jobs_archive rename to jobs_archive_legacy;
alter table {{schema}}.jobs_archive_legacy rename constraint jobs_archive_pkey to jobs_archive_legacy_pkey;
alter index {{schema}}.jobs_archive_stage rename to jobs_archive_legacy_stage;
alter index {{schema}}.jobs_archive_org rename to jobs_archive_legacy_org;

create table {{schema}}.jobs_archive (like {{schema}}.jobs_archive_legacy including defaults including constraints)
  partition by range (finished_at);
create unique index jobs_archive_id on {{schema}}.jobs_archive (id, finished_at);
create index jobs_archive_stage on {{schema}}.jobs_archive (stage, keep_until);
create index jobs_archive_org on {{schema}}.jobs_archive (org_id) where org_id is not null;

-- the old rows: the attach uses the old table's (stage, keep_until) and org indexes as they are, and this one
-- (built here unless it was built concurrently beforehand); the old primary key on id alone is then dropped
create unique index if not exists jobs_archive_legacy_id on {{schema}}.jobs_archive_legacy (id, finished_at);
alter table {{schema}}.jobs_archive_legacy drop constraint jobs_archive_legacy_pkey;
alter table {{schema}}.jobs_archive attach partition {{schema}}.jobs_archive_legacy
  for values from (minvalue) to ((date_trunc('day', now() at time zone 'UTC') + interval '1 day') at time zone 'UTC');
create table {{schema}}.jobs_archive_default partition of {{schema}}.jobs_archive default;

-- Tenancy as 0010 set it, now on the parent; the partitions are reached through it only.
revoke all on {{schema}}.jobs_archive_legacy from pgfiber_tenant;
drop policy if exists jobs_archive_by_org on {{schema}}.jobs_archive_legacy;
grant select, insert, delete on {{schema}}.jobs_archive to pgfiber_tenant;
alter table {{schema}}.jobs_archive enable row level security;
create policy jobs_archive_by_org on {{schema}}.jobs_archive to pgfiber_tenant
  using (org_id = current_setting('pgfiber.org_id', true))
  with check (org_id = current_setting('pgfiber.org_id', true));

-- The range partitions and the period each covers (the legacy one from the beginning of time), read by the two
-- functions below and by operators; the default partition is not listed.
create table {{schema}}.jobs_archive_partitions (
  name      text        primary key,
  starts_at timestamptz,
  ends_at   timestamptz not null
);
insert into {{schema}}.jobs_archive_partitions (name, starts_at, ends_at)
values ('jobs_archive_legacy', null, (date_trunc('day', now() at time zone 'UTC') + interval '1 day') at time zone 'UTC');

-- Creates the partitions that cover `at` up to `at + ahead`, each `width` long and aligned on multiples of it
-- from the Unix epoch (a day: UTC midnights), continuing after the newest one; returns their names. A period
-- whose rows already went to the default partition is skipped (they stay there until their retention passes).
-- Creating a partition locks the parent briefly: a lock not had within 2 s gives up until the next run.
create function {{schema}}.archive_create_partitions(width interval, ahead interval, at timestamptz default now())
returns setof text language plpgsql set lock_timeout = '2s' as $$
declare
  step    double precision := extract(epoch from width);
  start   timestamptz;
  newest  timestamptz;
  name    text;
begin
  if step < 3600 or step > 31 * 86400 then
    raise exception 'archive partition width must be between 1 hour and 31 days, not %', width using errcode = '22023';
  end if;
  -- one maintainer at a time (a worker's housekeeping and pg_cron may both run it): the other one skips
  if not pg_try_advisory_xact_lock(hashtext('pgfiber.archive_partitions.{{schema}}')) then return; end if;
  select max(ends_at) into newest from {{schema}}.jobs_archive_partitions;
  start := greatest(newest, to_timestamp(floor(extract(epoch from at) / step) * step));
  while start < at + ahead loop
    name := 'jobs_archive_p' || to_char(start at time zone 'UTC', 'YYYYMMDD"t"HH24MI');
    begin
      execute format('create table {{schema}}.%I partition of {{schema}}.jobs_archive for values from (%L) to (%L)',
                     name, start, start + width);
      insert into {{schema}}.jobs_archive_partitions (name, starts_at, ends_at) values (name, start, start + width);
      return next name;
    exception
      -- the default partition holds rows of this period: leave them there
      when check_violation then null;
      when lock_not_available then return;
    end;
    start := start + width;
  end loop;
end
$$;

-- Drops every partition whose period ended by `at` and that holds no row still kept (no `keep_until` after
-- `at`: each stage's latest, one descent of the (stage, keep_until) index each); returns their names. Dropping
-- a partition locks the parent for a moment (settles wait); a lock not had within 2 s (a long read of the
-- history) leaves the partition for the next run.
create function {{schema}}.archive_drop_expired_partitions(at timestamptz default now())
returns setof text language plpgsql set lock_timeout = '2s' as $$
declare
  p    record;
  kept boolean;
begin
  if not pg_try_advisory_xact_lock(hashtext('pgfiber.archive_partitions.{{schema}}')) then return; end if;
  for p in select name from {{schema}}.jobs_archive_partitions where ends_at <= at order by ends_at loop
    if to_regclass(format('{{schema}}.%I', p.name)) is null then
      -- dropped by hand: forget it
      delete from {{schema}}.jobs_archive_partitions where name = p.name;
      continue;
    end if;
    execute format($q$
      with recursive stages as (
        (select stage from {{schema}}.%1$I order by stage limit 1)
        union all
        select (select a.stage from {{schema}}.%1$I a where a.stage > s.stage order by a.stage limit 1)
        from stages s where s.stage is not null
      )
      select exists (
        select 1 from stages s
        where s.stage is not null
          and (select max(a.keep_until) from {{schema}}.%1$I a where a.stage = s.stage) > $1)$q$, p.name)
      into kept using at;
    continue when kept;
    begin
      execute format('drop table {{schema}}.%I', p.name);
      delete from {{schema}}.jobs_archive_partitions where name = p.name;
      return next p.name;
    exception when lock_not_available then return;
    end;
  end loop;
end
$$;

-- Today and the next two days' partitions, so a fresh database is partitioned from its first finished job.
select {{schema}}.archive_create_partitions(interval '1 day', interval '2 days');
