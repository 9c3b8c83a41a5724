-- Target tables of the example pipelines: the contract's fields plus provenance.

CREATE TABLE telemetry_metrics (
    event_id          varchar(128)     PRIMARY KEY,
    device_id         varchar(128)     NOT NULL,
    "timestamp"       timestamptz      NOT NULL,
    metric_value      double precision NOT NULL,
    status            varchar(32)      NOT NULL,
    unit              varchar(32),
    source_topic      text             NOT NULL,
    source_partition  integer          NOT NULL,
    source_offset     bigint           NOT NULL,
    kafka_key         bytea,
    kafka_timestamp   timestamptz,
    ingested_at       timestamptz      NOT NULL DEFAULT now()
);

CREATE TABLE orders_created (
    event_id          varchar(128)     PRIMARY KEY,
    order_id          bigint           NOT NULL,
    customer_id       varchar(64)      NOT NULL,
    total             numeric(14, 2)   NOT NULL,
    "timestamp"       timestamptz      NOT NULL,
    source_topic      text             NOT NULL,
    source_partition  integer          NOT NULL,
    source_offset     bigint           NOT NULL,
    kafka_key         bytea,
    kafka_timestamp   timestamptz,
    ingested_at       timestamptz      NOT NULL DEFAULT now()
);

-- Latest state per device (upsert mode 'latest'): one row per device_id.
CREATE TABLE device_state (
    device_id         varchar(128)     PRIMARY KEY,
    event_id          varchar(128)     NOT NULL,
    "timestamp"       timestamptz      NOT NULL,
    metric_value      double precision NOT NULL,
    status            varchar(32)      NOT NULL,
    unit              varchar(32),
    source_topic      text             NOT NULL,
    source_partition  integer          NOT NULL,
    source_offset     bigint           NOT NULL,
    kafka_key         bytea,
    kafka_timestamp   timestamptz,
    ingested_at       timestamptz      NOT NULL DEFAULT now()
);
CREATE INDEX device_state_event_id_idx ON device_state (event_id);
