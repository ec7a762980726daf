-- The jobs table churns: every job is inserted, updated by its claim and heartbeats, and deleted, so at a steady
-- 600 jobs/s it turns over many times a minute while holding few live rows. The defaults (vacuum and analyze after
-- 20 % / 10 % of the table changed) scale with a row count that is small one minute and a backlog the next; these
-- fixed thresholds keep dead rows and statistics in step with the churn whatever the table's size. The claim's
-- plan does not depend on them (JobsSql.claimPlan pins it to the ordered scan of jobs_ready, the partial index
-- that serves the claim's filter and order exactly); the other statements' plans and the table's size do.
alter table {{schema}}.jobs set (
  autovacuum_vacuum_scale_factor = 0,
  autovacuum_vacuum_threshold = 2000,
  autovacuum_vacuum_insert_scale_factor = 0,
  autovacuum_vacuum_insert_threshold = 5000,
  autovacuum_analyze_scale_factor = 0,
  autovacuum_analyze_threshold = 2000,
  -- vacuuming this table is cheap and urgent: do not throttle it
  autovacuum_vacuum_cost_delay = 0
);
