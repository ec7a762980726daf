-- Each event row's number of events, stored beside it: a reader finds where its page of events ends by summing
-- these (EventsSql.readEvents) without reading the rows' arrays, which are TOASTed and compressed past ~250 jobs.
-- Summing `cardinality(job_ids)` decompressed every row between the cursor and the page's end bound: 21 ms of
-- the server's time per page of 5,000 events read from the beginning, against 5 ms with this column
-- (docs/benchmarks.md, "Reading the event log"). Generated, so every writer (JobsSql, the triggers of 0023,
-- deploy/pg_cron.sql) fills it without a change.
--
-- Adding a stored generated column rewrites the log once, under the migration's lock (statements that log events
-- wait for it): to make it quick, shorten PGFIBER_EVENTS_RETAIN and let the retention schedule prune first.
alter table {{schema}}.job_events add column jobs int generated always as (cardinality(job_ids)) stored;
