-- A run's plan is pinned per request, not per run id alone: Airflow's backfill with
-- --reprocess-behavior clears an existing run and re-runs it as a backfill under the same
-- run id, and that run must plan the backfill, not reuse the old live slice.
ALTER TABLE run_plans ADD COLUMN request_key text NOT NULL DEFAULT 'live';
ALTER TABLE run_plans DROP CONSTRAINT run_plans_pkey;
ALTER TABLE run_plans ADD PRIMARY KEY (pipeline, run_id, request_key, topic, partition);
