-- Looks (the pipelines page, the Prometheus metrics, `kafka-ingest status`, the monitor)
-- that cost the same at ten million chunks as at ten, and a retention for the bookkeeping
-- tables that never takes what the guarantees need.

-- The ledger's counters, kept as chunks are written: one row per (pipeline, mode, topic,
-- partition) with the sums of its chunks and its newest chunk, moved by a statement
-- trigger on `ingest_runs` (one upsert per statement and key, in the chunk's transaction
-- and its round trip; whatever writes the ledger keeps them right). Keyed per partition:
-- the slices of one run commit at once, and one row per pipeline would make each wait
-- for the others' COMMIT; rows are upserted in key order, so two statements lock the rows
-- they share in the same order. SECURITY DEFINER: the runtime role only reads the totals.
-- Never pruned: the totals survive the retention of `ingest_runs`, so the counters never
-- go backwards.
CREATE TABLE ingest_totals (
    pipeline           text             NOT NULL,
    mode               text             NOT NULL,
    topic              text             NOT NULL,
    partition          integer          NOT NULL,
    chunks             bigint           NOT NULL,
    read               bigint           NOT NULL,
    inserted           bigint           NOT NULL,
    duplicates         bigint           NOT NULL,
    stale              bigint           NOT NULL,
    dead_lettered      bigint           NOT NULL,
    known_dead         bigint           NOT NULL,
    tombstones         bigint           NOT NULL,
    deleted            bigint           NOT NULL,
    bytes              bigint           NOT NULL,
    seconds            double precision NOT NULL,
    -- The newest chunk of the partition in this mode (its `ingest_runs` row): the
    -- latest committed_at, then the latest id.
    last_id            bigint           NOT NULL,
    last_run_id        text             NOT NULL,
    last_start_offset  bigint           NOT NULL,
    last_end_offset    bigint           NOT NULL,
    last_committed_at  timestamptz      NOT NULL,
    PRIMARY KEY (pipeline, mode, topic, partition)
);

CREATE FUNCTION ingest_runs_totaled() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    INSERT INTO ingest_totals AS t
    SELECT DISTINCT ON (pipeline, mode, topic, partition)
           pipeline, mode, topic, partition, count(*) OVER w, sum(read) OVER w,
           sum(inserted) OVER w, sum(duplicates) OVER w, sum(stale) OVER w,
           sum(dead_lettered) OVER w, sum(known_dead) OVER w, sum(tombstones) OVER w,
           sum(deleted) OVER w, sum(bytes) OVER w, sum(seconds) OVER w,
           id, run_id, start_offset, end_offset, committed_at
    FROM added_runs
    WINDOW w AS (PARTITION BY pipeline, mode, topic, partition)
    ORDER BY pipeline, mode, topic, partition, committed_at DESC, id DESC
    ON CONFLICT (pipeline, mode, topic, partition) DO UPDATE SET
        chunks = t.chunks + EXCLUDED.chunks, read = t.read + EXCLUDED.read,
        inserted = t.inserted + EXCLUDED.inserted,
        duplicates = t.duplicates + EXCLUDED.duplicates, stale = t.stale + EXCLUDED.stale,
        dead_lettered = t.dead_lettered + EXCLUDED.dead_lettered,
        known_dead = t.known_dead + EXCLUDED.known_dead,
        tombstones = t.tombstones + EXCLUDED.tombstones, deleted = t.deleted + EXCLUDED.deleted,
        bytes = t.bytes + EXCLUDED.bytes, seconds = t.seconds + EXCLUDED.seconds,
        last_id = CASE WHEN (EXCLUDED.last_committed_at, EXCLUDED.last_id)
            > (t.last_committed_at, t.last_id) THEN EXCLUDED.last_id ELSE t.last_id END,
        last_run_id = CASE WHEN (EXCLUDED.last_committed_at, EXCLUDED.last_id)
            > (t.last_committed_at, t.last_id) THEN EXCLUDED.last_run_id ELSE t.last_run_id END,
        last_start_offset = CASE WHEN (EXCLUDED.last_committed_at, EXCLUDED.last_id)
            > (t.last_committed_at, t.last_id) THEN EXCLUDED.last_start_offset
            ELSE t.last_start_offset END,
        last_end_offset = CASE WHEN (EXCLUDED.last_committed_at, EXCLUDED.last_id)
            > (t.last_committed_at, t.last_id) THEN EXCLUDED.last_end_offset
            ELSE t.last_end_offset END,
        last_committed_at = GREATEST(t.last_committed_at, EXCLUDED.last_committed_at);
    RETURN NULL;
END $$;

CREATE TRIGGER ingest_runs_totaled AFTER INSERT ON ingest_runs
    REFERENCING NEW TABLE AS added_runs
    FOR EACH STATEMENT EXECUTE FUNCTION ingest_runs_totaled();

-- The totals of the ledger so far (the trigger's query, over every row; after the trigger,
-- whose lock keeps chunks out until this migration commits, so none is missed).
INSERT INTO ingest_totals
SELECT DISTINCT ON (pipeline, mode, topic, partition)
       pipeline, mode, topic, partition, count(*) OVER w, sum(read) OVER w,
       sum(inserted) OVER w, sum(duplicates) OVER w, sum(stale) OVER w,
       sum(dead_lettered) OVER w, sum(known_dead) OVER w, sum(tombstones) OVER w,
       sum(deleted) OVER w, sum(bytes) OVER w, sum(seconds) OVER w,
       id, run_id, start_offset, end_offset, committed_at
FROM ingest_runs
WINDOW w AS (PARTITION BY pipeline, mode, topic, partition)
ORDER BY pipeline, mode, topic, partition, committed_at DESC, id DESC;

-- The dead letters by (pipeline, status, error class, source partition), kept by the
-- statement triggers below as letters are inserted, change status or class, or are
-- deleted, whatever writes them (a chunk, a replay, an operator's SQL): one upsert per
-- statement and key, from the statement's transition tables. Keyed by source partition,
-- like the chunks that write the letters, so concurrent slices do not wait on one row.
-- `recovered` counts every recovery: the retention's deletes of recovered letters leave
-- it as it is (a counter never goes back); deleting a parked letter takes it off
-- `parked`. `last_failed_at`: the newest failure of the letters counted (the looks read
-- the parked letters' own, from dead_letters_parked_idx, since a recovery cannot lower
-- a maximum kept here). Rows at 0 letters stay (one per key ever used).
CREATE TABLE dead_letter_totals (
    pipeline          text        NOT NULL,
    status            text        NOT NULL,
    error_class       text        NOT NULL,
    source_topic      text        NOT NULL,
    source_partition  integer     NOT NULL,
    letters           bigint      NOT NULL,
    last_failed_at    timestamptz,
    PRIMARY KEY (pipeline, status, error_class, source_topic, source_partition)
);

-- One function for the triggers: the letters a statement added (+1 each), took away (-1
-- each; deleted recovered letters excepted) and changed (-1 at the old key, +1 at the
-- new), netted per key and applied in key order (so two statements lock the rows
-- they share in the same order). SECURITY DEFINER: the runtime role only reads the
-- totals.
CREATE FUNCTION dead_letters_counted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO dead_letter_totals AS t
        SELECT pipeline, status, error_class, source_topic, source_partition, count(*),
               max(last_failed_at)
        FROM added_letters GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3, 4, 5
        ON CONFLICT (pipeline, status, error_class, source_topic, source_partition)
        DO UPDATE SET letters = t.letters + EXCLUDED.letters,
                      last_failed_at = GREATEST(t.last_failed_at, EXCLUDED.last_failed_at);
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO dead_letter_totals AS t
        SELECT pipeline, status, error_class, source_topic, source_partition, sum(n),
               max(last_failed_at)
        FROM (SELECT pipeline, status, error_class, source_topic, source_partition,
                     -1 AS n, NULL::timestamptz AS last_failed_at FROM old_letters
              UNION ALL
              SELECT pipeline, status, error_class, source_topic, source_partition,
                     1, last_failed_at FROM new_letters) AS moved
        GROUP BY 1, 2, 3, 4, 5 HAVING sum(n) <> 0 ORDER BY 1, 2, 3, 4, 5
        ON CONFLICT (pipeline, status, error_class, source_topic, source_partition)
        DO UPDATE SET letters = t.letters + EXCLUDED.letters,
                      last_failed_at = GREATEST(t.last_failed_at, EXCLUDED.last_failed_at);
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO dead_letter_totals AS t
        SELECT pipeline, status, error_class, source_topic, source_partition, -count(*),
               NULL::timestamptz
        FROM gone_letters WHERE status = 'parked'
        GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3, 4, 5
        ON CONFLICT (pipeline, status, error_class, source_topic, source_partition)
        DO UPDATE SET letters = t.letters + EXCLUDED.letters;
    ELSE  -- TRUNCATE: no letter is parked any more
        UPDATE dead_letter_totals SET letters = 0 WHERE status = 'parked';
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER dead_letters_counted_insert AFTER INSERT ON dead_letters
    REFERENCING NEW TABLE AS added_letters
    FOR EACH STATEMENT EXECUTE FUNCTION dead_letters_counted();
CREATE TRIGGER dead_letters_counted_update AFTER UPDATE ON dead_letters
    REFERENCING OLD TABLE AS old_letters NEW TABLE AS new_letters
    FOR EACH STATEMENT EXECUTE FUNCTION dead_letters_counted();
CREATE TRIGGER dead_letters_counted_delete AFTER DELETE ON dead_letters
    REFERENCING OLD TABLE AS gone_letters
    FOR EACH STATEMENT EXECUTE FUNCTION dead_letters_counted();
CREATE TRIGGER dead_letters_counted_truncate AFTER TRUNCATE ON dead_letters
    FOR EACH STATEMENT EXECUTE FUNCTION dead_letters_counted();

-- The letters so far (after the triggers: their lock keeps writers out until this commits,
-- so no letter is counted twice or missed).
INSERT INTO dead_letter_totals
SELECT pipeline, status, error_class, source_topic, source_partition, count(*),
       max(last_failed_at)
FROM dead_letters GROUP BY 1, 2, 3, 4, 5;

-- The parked letters of a class, newest failure last (the page's "last failed"), and the
-- recovered ones by age (the retention); no look reads a recovered letter.
DROP INDEX dead_letters_status_idx;
CREATE INDEX dead_letters_parked_idx ON dead_letters (pipeline, error_class, last_failed_at)
    WHERE status = 'parked';
CREATE INDEX dead_letters_recovered_idx ON dead_letters (pipeline, recovered_at)
    WHERE status = 'recovered';

-- The monitor's checks by time (the page's 24 hours, the retention) and its newest alert.
CREATE INDEX monitor_checks_time_idx ON monitor_checks (pipeline, checked_at);
CREATE INDEX monitor_checks_alert_idx ON monitor_checks (pipeline, id DESC)
    WHERE cardinality(breaches) > 0;

-- Plans by age (the retention); a pipeline's newest offset gap (`kafka-ingest status`).
CREATE INDEX run_plans_age_idx ON run_plans (pipeline, planned_at);
CREATE INDEX offset_gaps_pipeline_idx ON offset_gaps (pipeline, id DESC);

-- Retention (the monitor DAG, kafka_ingest.ops.retention): each function deletes one
-- bounded batch of what may go, oldest first, and returns how many rows went. The
-- runtime role gets EXECUTE on them and still no DELETE on the bookkeeping: each function
-- says what may go, and nothing younger than a day ever does.

-- Chunks committed before p_before (the totals keep their counts).
CREATE FUNCTION prune_ingest_runs(p_pipeline text, p_before timestamptz, p_batch integer)
RETURNS integer LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    WITH gone AS (
        DELETE FROM ingest_runs WHERE id IN (
            SELECT id FROM ingest_runs
            WHERE pipeline = p_pipeline
              AND committed_at < LEAST(p_before, now() - interval '1 day')
            ORDER BY committed_at LIMIT p_batch)
        RETURNING 1)
    SELECT count(*)::integer FROM gone
$$;

-- The pipeline's plans (its ingest runs', and its replay runs' under '<pipeline>:replay',
-- kafka_ingest.engine.replay.replay_key) pinned before p_before whose every range is
-- done: empty, or ended at or before the pipeline's stored offset of its partition (on
-- the source topic, or the replay cursor on the DLQ topic). A plan with a range still
-- ahead of its cursor is what a retry of its run finishes: it stays, however old. (A
-- backfill's or an explicit replay's ranges are in its request: a run planned again
-- plans them again.)
CREATE FUNCTION prune_run_plans(p_pipeline text, p_before timestamptz, p_batch integer)
RETURNS integer LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    WITH done AS (
        SELECT p.pipeline, p.run_id, p.request_key
        FROM run_plans p
        LEFT JOIN ingest_offsets o
          ON o.pipeline = p_pipeline AND o.topic = p.topic AND o.partition = p.partition
        WHERE p.pipeline IN (p_pipeline, p_pipeline || ':replay')
          AND p.planned_at < LEAST(p_before, now() - interval '1 day')
        GROUP BY p.pipeline, p.run_id, p.request_key
        HAVING bool_and(p.end_offset <= p.start_offset
                        OR coalesce(o.next_offset >= p.end_offset, false))
        ORDER BY min(p.planned_at) LIMIT p_batch),
    gone AS (
        DELETE FROM run_plans r USING done d
        WHERE r.pipeline = d.pipeline AND r.run_id = d.run_id
          AND r.request_key = d.request_key
        RETURNING 1)
    SELECT count(*)::integer FROM gone
$$;

-- Checks recorded before p_before, except those the rules and `kafka-ingest status` read:
-- the newest p_keep (the lag-growth rule's memory; at least one), the first (the
-- freshness rule's "watched since" of a pipeline that never committed a live chunk) and
-- the newest that breached a rule (the last alert).
CREATE FUNCTION prune_monitor_checks(p_pipeline text, p_before timestamptz, p_keep integer,
                                     p_batch integer)
RETURNS integer LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    WITH kept AS (
        (SELECT id FROM monitor_checks WHERE pipeline = p_pipeline
         ORDER BY id DESC LIMIT GREATEST(p_keep, 1))
        UNION ALL
        (SELECT id FROM monitor_checks WHERE pipeline = p_pipeline ORDER BY id LIMIT 1)
        UNION ALL
        (SELECT id FROM monitor_checks WHERE pipeline = p_pipeline
           AND cardinality(breaches) > 0 ORDER BY id DESC LIMIT 1)),
    gone AS (
        DELETE FROM monitor_checks WHERE id IN (
            SELECT id FROM monitor_checks
            WHERE pipeline = p_pipeline
              AND checked_at < LEAST(p_before, now() - interval '1 day')
              AND id NOT IN (SELECT id FROM kept)
            ORDER BY checked_at LIMIT p_batch)
        RETURNING 1)
    SELECT count(*)::integer FROM gone
$$;

-- Letters recovered before p_before; a parked letter never goes. Checked again on the
-- row deleted, so a letter parked again meanwhile stays.
CREATE FUNCTION prune_recovered_letters(p_pipeline text, p_before timestamptz,
                                        p_batch integer)
RETURNS integer LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    WITH old AS (
        SELECT source_topic, source_incarnation, source_partition, source_offset
        FROM dead_letters
        WHERE pipeline = p_pipeline AND status = 'recovered'
          AND recovered_at < LEAST(p_before, now() - interval '1 day')
        ORDER BY recovered_at LIMIT p_batch),
    gone AS (
        DELETE FROM dead_letters d USING old
        WHERE d.pipeline = p_pipeline AND d.source_topic = old.source_topic
          AND d.source_incarnation = old.source_incarnation
          AND d.source_partition = old.source_partition
          AND d.source_offset = old.source_offset
          AND d.status = 'recovered'
          AND d.recovered_at < LEAST(p_before, now() - interval '1 day')
        RETURNING 1)
    SELECT count(*)::integer FROM gone
$$;

REVOKE EXECUTE ON FUNCTION prune_ingest_runs(text, timestamptz, integer),
    prune_run_plans(text, timestamptz, integer),
    prune_monitor_checks(text, timestamptz, integer, integer),
    prune_recovered_letters(text, timestamptz, integer),
    ingest_runs_totaled(), dead_letters_counted() FROM PUBLIC;

-- The roles already granted the runtime privileges (`migrate --grant-to`) get the new
-- ones here, so what they run goes on after this migration: reading the totals (the
-- triggers write them as the owner), and the retention's functions.
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
        EXECUTE format('GRANT SELECT ON ingest_totals, dead_letter_totals TO %s', runtime);
        EXECUTE format('GRANT EXECUTE ON FUNCTION prune_ingest_runs(text, timestamptz, integer),'
                       ' prune_run_plans(text, timestamptz, integer),'
                       ' prune_monitor_checks(text, timestamptz, integer, integer),'
                       ' prune_recovered_letters(text, timestamptz, integer) TO %s', runtime);
    END LOOP;
END $$;
