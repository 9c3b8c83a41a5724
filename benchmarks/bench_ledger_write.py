"""What keeping the ledger's totals costs each chunk: a chunk's audit row with the
``ingest_totals`` trigger (migration 0010) against the same row without it, on the local
stack's Postgres.

Each round is one transaction like the end of a chunk's: the audit row's INSERT
(``kafka_ingest.db.repositories.RunsRepository.add``), then COMMIT, over ``--partitions``
partitions, on a ledger already holding ``--history`` chunks. The two forms alternate in
blocks of ``--block`` rounds (so a busy neighbour slows both alike). Printed: the median
and the 95th percentile of the INSERT and of INSERT + COMMIT for each, and the time the
trigger adds per chunk.

    .venv/bin/python benchmarks/bench_ledger_write.py --rounds 4000 --history 200000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import psycopg

from kafka_ingest.db.repositories import RunRecord, RunsRepository
from kafka_ingest.records import ChunkCounts
from kafka_ingest_dev.databases import fresh_database


def _history(conn: psycopg.Connection[Any], chunks: int, partitions: int) -> None:
    conn.execute(
        "INSERT INTO ingest_runs (pipeline, run_id, mode, topic, partition, start_offset,"
        " end_offset, read, inserted, duplicates, stale, dead_lettered, known_dead, tombstones,"
        " deleted, bytes, seconds, committed_at)"
        " SELECT 'bench', 'old', 'live', 't', i %% %s, i * 20000, (i + 1) * 20000, 20000, 20000,"
        " 0, 0, 0, 0, 0, 0, 2400000, 0.12, now() - (%s - i) * interval '1 second'"
        " FROM generate_series(1::bigint, %s) AS i", (partitions, chunks, chunks))
    conn.commit()
    conn.autocommit = True
    conn.execute("VACUUM ANALYZE ingest_runs")
    conn.autocommit = False


def _round(conn: psycopg.Connection[Any], record: RunRecord) -> tuple[float, float]:
    t0 = time.perf_counter()
    RunsRepository(conn).add(record)
    t1 = time.perf_counter()
    conn.commit()
    return t1 - t0, time.perf_counter() - t0


def _ms(values: list[float]) -> dict[str, float]:
    return {"p50": round(statistics.median(values) * 1e3, 3),
            "p95": round(statistics.quantiles(values, n=20)[18] * 1e3, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4000)
    parser.add_argument("--history", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--block", type=int, default=100)
    args = parser.parse_args()
    times: dict[str, tuple[list[float], list[float]]] = {"without": ([], []), "with": ([], [])}
    with fresh_database(os.environ["KAFKA_INGEST_PG_DSN"], prefix="bench") as dsn, \
            psycopg.connect(dsn, autocommit=False) as conn:
        _history(conn, args.history, args.partitions)
        for i in range(args.rounds):
            form = ("without", "with")[(i // args.block) % 2]
            if i % args.block == 0:
                conn.execute(f"ALTER TABLE ingest_runs {'ENABLE' if form == 'with' else 'DISABLE'}"
                             " TRIGGER ingest_runs_totaled")
                conn.commit()
            counts = ChunkCounts(read=20000, inserted=19990, duplicates=5, dead_lettered=5,
                                 bytes=2_400_000)
            stmt_s, txn_s = _round(conn, RunRecord(
                pipeline="bench", run_id=f"run{i // 10}", mode="live", topic="t",
                partition=i % args.partitions, start_offset=i * 20000,
                end_offset=(i + 1) * 20000, counts=counts, seconds=0.125))
            times[form][0].append(stmt_s)
            times[form][1].append(txn_s)
    out: dict[str, Any] = {"rounds": args.rounds, "history": args.history,
                           "partitions": args.partitions}
    for form, (stmt, txn) in times.items():
        out[f"{form}_trigger"] = {"insert_ms": _ms(stmt), "with_commit_ms": _ms(txn)}
    out["added_per_chunk_ms_p50"] = round(
        out["with_trigger"]["with_commit_ms"]["p50"]
        - out["without_trigger"]["with_commit_ms"]["p50"], 3)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
