-- Bookkeeping shared by every pipeline.

-- The next offset to read per (pipeline, topic, partition): the source of truth.
-- It only moves by compare-and-set in the same transaction as the rows it covers.
CREATE TABLE ingest_offsets (
    pipeline     text        NOT NULL,
    topic        text        NOT NULL,
    partition    integer     NOT NULL CHECK (partition >= 0),
    next_offset  bigint      NOT NULL CHECK (next_offset >= 0),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, topic, partition)
);

-- The slice each Airflow run planned, so a retry finishes exactly that slice.
CREATE TABLE run_plans (
    pipeline      text        NOT NULL,
    run_id        text        NOT NULL,
    mode          text        NOT NULL CHECK (mode IN ('live', 'backfill', 'replay')),
    topic         text        NOT NULL,
    partition     integer     NOT NULL,
    start_offset  bigint      NOT NULL,
    end_offset    bigint      NOT NULL CHECK (end_offset >= start_offset),
    planned_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, run_id, topic, partition)
);

-- One row per committed chunk: the audit trail and the source of `kafka-ingest status`.
CREATE TABLE ingest_runs (
    id             bigserial   PRIMARY KEY,
    pipeline       text        NOT NULL,
    run_id         text        NOT NULL,
    mode           text        NOT NULL,
    topic          text        NOT NULL,
    partition      integer     NOT NULL,
    start_offset   bigint      NOT NULL,
    end_offset     bigint      NOT NULL,
    read           integer     NOT NULL,
    inserted       integer     NOT NULL,
    duplicates     integer     NOT NULL,
    stale          integer     NOT NULL,
    dead_lettered  integer     NOT NULL,
    tombstones     integer     NOT NULL,
    bytes          bigint      NOT NULL,
    seconds        double precision NOT NULL,
    committed_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ingest_runs_pipeline_idx ON ingest_runs (pipeline, committed_at DESC);

-- Offsets that retention deleted before they were ingested (on_offset_gap: skip).
CREATE TABLE offset_gaps (
    id           bigserial   PRIMARY KEY,
    pipeline     text        NOT NULL,
    topic        text        NOT NULL,
    partition    integer     NOT NULL,
    from_offset  bigint      NOT NULL,
    to_offset    bigint      NOT NULL,
    run_id       text,
    detected_at  timestamptz NOT NULL DEFAULT now()
);

-- Every dead letter, for SQL inspection and replay; mirrors the DLQ record's headers.
CREATE TABLE dead_letters (
    pipeline          text        NOT NULL,
    source_topic      text        NOT NULL,
    source_partition  integer     NOT NULL,
    source_offset     bigint      NOT NULL,
    kafka_key         bytea,
    kafka_timestamp   timestamptz,
    contract          text        NOT NULL,
    error_class       text        NOT NULL,
    error_detail      text        NOT NULL,
    status            text        NOT NULL DEFAULT 'parked' CHECK (status IN ('parked', 'recovered')),
    attempts          integer     NOT NULL DEFAULT 1,
    first_failed_at   timestamptz NOT NULL DEFAULT now(),
    last_failed_at    timestamptz NOT NULL DEFAULT now(),
    recovered_at      timestamptz,
    dlq_topic         text        NOT NULL,
    dlq_partition     integer,
    dlq_offset        bigint,
    PRIMARY KEY (pipeline, source_topic, source_partition, source_offset)
);
CREATE INDEX dead_letters_status_idx ON dead_letters (pipeline, status, error_class);
