-- A backfill that meets a poison pill already in dead_letters neither produces it to the
-- DLQ again nor bumps its attempts: it counts it as known_dead, one more term of the
-- reconciliation (read = inserted + duplicates + stale + dead_lettered + known_dead +
-- tombstones).
ALTER TABLE ingest_runs ADD COLUMN known_dead integer NOT NULL DEFAULT 0;
