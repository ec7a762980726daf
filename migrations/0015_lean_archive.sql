-- Kept history, cheaper to write: every finished job is inserted into `jobs_archive` by the settle statement,
-- which is on the worker's critical path (a pool claims again only once its outcomes are settled), so each
-- index on the archive is paid once per job, under the settle's commit. 0010 gave it three b-trees besides the
-- primary key: `(keep_until)` for the pruner, `(stage, finished_at)` for a stage's history page, and the org's.
-- Measured on a 1M backlog (EXPLAIN (ANALYZE, BUFFERS, WAL) of one settle of 80 completions): the archive's
-- insert took 0.8-1.0 ms and wrote 30 KB of WAL with them, 0.4-0.5 ms and 19 KB with the primary key alone.
--
-- One b-tree on (stage, id) now serves both readers: a stage's history page is ordered by id (newest first),
-- which `(stage, finished_at)` could not give without sorting the whole stage; the pruner walks each stage's
-- rows in id order (a stage's retention is one setting, so its oldest ids expire first) instead of
-- `(keep_until)` across stages (JobsSql.pruneArchive, deploy/pg_cron.sql). Reads by id use the primary key,
-- a tenant's reads the org index (row-level security), both unchanged.
--
-- Building the index locks the archive against inserts (settles wait) for as long as it takes: about a second
-- per million archived rows.

drop index if exists {{schema}}.jobs_archive_prune;
drop index if exists {{schema}}.jobs_archive_stage;
create index jobs_archive_stage on {{schema}}.jobs_archive (stage, id);
