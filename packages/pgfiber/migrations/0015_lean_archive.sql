-- Kept history, cheaper to write: every finished job is inserted into `jobs_archive` by the settle statement,
-- which is on a busy pool's critical path (it claims no more while 10 x concurrency outcomes wait to be
-- settled), so each index on the archive is paid once per job, inside the settle. 0010 gave the archive three
-- b-trees besides the primary key: `(keep_until)` for the pruner, `(stage, finished_at)` for a stage's history
-- page, and the org's (only rows with an org). EXPLAIN (ANALYZE, BUFFERS, WAL) of one settle of 80 completions
-- on a 1M backlog (PostgreSQL 15): the archive's insert took a median 0.72 ms and 30 KB of WAL with 0010's
-- indexes, 0.62 ms and 25 KB with this one's, about 0.4 ms and 19 KB with the primary key alone.
--
-- One b-tree on (stage, keep_until) now serves both: the pruner walks each stage's expired rows in
-- `keep_until` order (a loose scan finds the stages, one descent each; JobsSql.pruneArchive,
-- deploy/pg_cron.sql), and a stage's history page (newest id first) reads a rare stage's rows through it and
-- sorts them, a common stage's by walking the primary key backwards, as `(stage, finished_at)` served it. Reads
-- by id use the primary key, a tenant's reads the org index (row-level security), both unchanged.
--
-- Building the index locks the archive against inserts (settles wait) for as long as it takes: 0.76 s for
-- 294,000 archived rows on PostgreSQL 15 at load average ~20 on 2 cores, so a few seconds per million.

drop index if exists {{schema}}.jobs_archive_prune;
drop index if exists {{schema}}.jobs_archive_stage;
create index jobs_archive_stage on {{schema}}.jobs_archive (stage, keep_until);
