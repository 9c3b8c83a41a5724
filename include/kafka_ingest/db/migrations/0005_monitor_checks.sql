-- One row per check of the monitor DAG (kafka_ingest_monitor) per pipeline: its memory.
-- The lag-growth rule compares the newest lag_growth_checks + 1 totals; freshness counts
-- from the first check when no live chunk was ever committed; `kafka-ingest status`
-- shows the newest check that breached a rule. Append-only (the runtime role inserts).
CREATE TABLE monitor_checks (
    id          bigserial   PRIMARY KEY,
    pipeline    text        NOT NULL,
    checked_at  timestamptz NOT NULL DEFAULT now(),
    total_lag   bigint      NOT NULL,          -- summed over partitions, from the stored offsets
    group_lag   bigint,                        -- what lag tools see; NULL if not known
    dlq_rate    double precision,              -- in the rule's window; NULL if nothing was read
    parked      bigint      NOT NULL,
    breaches    text[]      NOT NULL DEFAULT '{}'   -- the rules breached at this check
);
CREATE INDEX monitor_checks_pipeline_idx ON monitor_checks (pipeline, id DESC);
