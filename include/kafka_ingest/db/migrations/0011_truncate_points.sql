-- A mirror's truncates (`envelope: debezium`, `on_truncate: truncate`): where the newest
-- truncate of each partition of a pipeline's topic was. A truncate deletes every row
-- placed before it in its partition (and every row of an older incarnation of the topic);
-- a row placed there that comes later (a dead letter replayed, a backfill, a record
-- before the offsets the mirror began at) is older than the truncate: the writers count
-- it stale, as they count one older than its key's deletion marker. Written in the same
-- transaction as the rows; one row per partition, so it costs nothing per deleted row.
CREATE TABLE truncate_points (
    pipeline            text        NOT NULL,
    source_topic        text        NOT NULL,
    source_partition    integer     NOT NULL,
    -- the place of the newest truncate read from this partition: (incarnation, offset)
    source_incarnation  integer     NOT NULL,
    source_offset       bigint      NOT NULL,
    truncated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, source_topic, source_partition)
);

-- The roles already granted the runtime privileges (`migrate --grant-to`) get this
-- table's, so a mirror's truncate goes on after this migration.
DO $$
DECLARE
    runtime regrole;
BEGIN
    FOR runtime IN
        SELECT DISTINCT a.grantee::regrole
        FROM pg_class c, aclexplode(c.relacl) a
        WHERE c.oid = 'ingest_runs'::regclass AND a.privilege_type = 'INSERT'
          AND a.grantee <> 0 AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE ON truncate_points TO %s', runtime);
    END LOOP;
END $$;
