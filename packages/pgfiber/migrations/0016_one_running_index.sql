-- One index over running leases instead of two. A claim turns queued rows into running ones, and every index whose
-- predicate the new row version meets gets an entry for it: the primary key, `jobs_inflight` (id, 0001: the
-- reaper and the next-due timer) and `jobs_running_by_stage` (stage, org, 0011: the caps' count), both over
-- `status <> 'queued'`. Measured on PostgreSQL 15 (20,000 jobs claimed in claims of 508, the backend's CPU,
-- interleaved, medians of 10; docs/benchmarks.md): one index on (stage) instead of the two took 9-10 % off a
-- claim's server time, both gone 18-25 %.
--
-- `jobs_running` on (stage) serves all three: the caps count a stage's running jobs by org from its range (the
-- org read from the row), and the reaper and the timer read the whole index as they read `jobs_inflight`, which
-- holds as many entries (every running job). Building it locks `jobs` against writes for as long as it takes: one
-- scan of the table, indexing only the running rows. It drops
-- only indexes: the previous build's statements name none, and its plans find `jobs_running` in their place, so it
-- keeps working on the migrated schema during a rolling deploy.

create index jobs_running on {{schema}}.jobs (stage) where status <> 'queued';
drop index {{schema}}.jobs_inflight;
drop index {{schema}}.jobs_running_by_stage;
