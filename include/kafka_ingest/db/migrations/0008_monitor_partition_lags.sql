-- The lag of each partition at each monitor check, {"<partition>": lag}, so the pipelines
-- page draws the lag per partition over time. NULL for checks recorded before this.
ALTER TABLE monitor_checks ADD COLUMN partition_lags jsonb;
