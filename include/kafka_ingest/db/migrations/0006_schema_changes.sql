-- Tables made and evolved from contracts (`kafka-ingest schema apply`, or a pipeline's
-- auto_create/auto_evolve): one row per DDL statement applied, in order.
CREATE TABLE schema_changes (
    id          bigserial   PRIMARY KEY,
    pipeline    text        NOT NULL,
    table_name  text        NOT NULL,
    why         text        NOT NULL,
    statement   text        NOT NULL,
    applied_by  text        NOT NULL DEFAULT current_user,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- Rows deleted by tombstones (on_tombstone: delete), per chunk.
ALTER TABLE ingest_runs ADD COLUMN deleted integer NOT NULL DEFAULT 0;
