"""How the write cost grows with the target table and its primary-key index.

The project's own write path (``UnitOfWork.rows.upsert`` + COMMIT, 20,000-row chunks: the
staging ``COPY``, then the new-keys ``INSERT``, or ``ON CONFLICT DO NOTHING`` with
``--paths conflict``) fills one fresh table from empty to ``--rows``, and every
``--bucket`` rows it prints what the bucket cost: the backend's CPU per row, the whole
server's (checkpoints, WAL writer and autovacuum included), wall time per row, and the
table's and the index's size at its end. Keys are the sample's (``--keys seq``: ids that
rise, so the index grows at its right edge) or random (``--keys random``: UUIDs, so every
insert lands on a random leaf page and the index's working set is all of it).

    python benchmarks/bench_table_growth.py --rows 5000000 --keys seq,random

Results are printed and written to ``benchmarks/results/table_growth.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import harness
import psycopg

from kafka_ingest.config import load_pipelines
from kafka_ingest.contracts.columns import millis_to_pg, seconds_to_pg
from kafka_ingest.db.uow import UnitOfWork
from kafka_ingest.db.writers import NewKeys
from kafka_ingest.records import Row, row_source

CHUNK = 20_000
RESULTS = Path(__file__).resolve().parent / "results" / "table_growth.json"


def rows(start: int, n: int, keys: str, tag: str) -> list[Row]:
    """``n`` valid rows of the telemetry table, offsets from ``start``."""
    epoch, ms = 1.7e9, 1_700_000_000_000
    return [(f"{tag}-m-{i:012d}" if keys == "seq" else uuid.uuid4().hex, f"dev-{i % 997}",
                 seconds_to_pg(epoch + i / 1000), i * 0.5, "OK", "C", "growth", 0, i, b"k",
                 millis_to_pg(ms + i))
            for i in range(start, start + n)]


def backend_cpu_s(pid: int) -> float:
    fields = harness.proc_stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") if fields else 0.0


def sizes_mb(conn: psycopg.Connection[Any], table: str) -> tuple[float, float]:
    heap, index = conn.execute(
        "SELECT pg_table_size(%s::regclass), pg_indexes_size(%s::regclass)",
        (table, table)).fetchone() or (0, 0)
    conn.commit()
    return round(heap / 2**20, 1), round(index / 2**20, 1)


def wal_lsn(conn: psycopg.Connection[Any]) -> int:
    """The server's current WAL position, in bytes."""
    row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    conn.commit()
    return int(row[0]) if row else 0


def fill(dsn: str, table: str, *, total: int, bucket: int, keys: str,
         path: str) -> list[dict[str, Any]]:
    """Fill ``table`` to ``total`` rows; one figure per ``bucket`` rows."""
    base = load_pipelines()[harness.BASE_PIPELINE].model_dump(mode="json", exclude={"name"})
    pipeline = harness.pipeline_of((table, {**base, "table": table}))
    tag = uuid.uuid4().hex[:6]
    points: list[dict[str, Any]] = []
    with psycopg.connect(dsn) as conn:
        pid = conn.info.backend_pid
        for start in range(0, total, bucket):
            chunks = [rows(s, min(CHUNK, total - s), keys, tag)
                      for s in range(start, min(start + bucket, total), CHUNK)]
            n = sum(map(len, chunks))
            lsn = wal_lsn(conn)
            b0, s0, c0, w0 = (backend_cpu_s(pid), harness.server_cpu().get("postgres", 0.0),
                              time.process_time(), time.perf_counter())
            for chunk in chunks:
                new_keys = NewKeys()
                if path == "conflict":
                    new_keys.met_stored_key()  # straight to ON CONFLICT
                with UnitOfWork(conn, pipeline, new_keys=new_keys) as uow:
                    up = uow.rows.upsert(chunk)
                    uow.commit()
                if up.inserted != len(chunk):
                    raise RuntimeError(f"chunk at {row_source(chunk[0]).offset}: {up}")
            wall, client = time.perf_counter() - w0, time.process_time() - c0
            backend = backend_cpu_s(pid) - b0
            server = harness.server_cpu().get("postgres", 0.0) - s0
            heap, index = sizes_mb(conn, table)
            wal = (wal_lsn(conn) - lsn) / n
            point = {"keys": keys, "path": path, "rows_before": start, "rows_after": start + n,
                     "backend_us_per_row": round(1e6 * backend / n, 2),
                     "server_us_per_row": round(1e6 * server / n, 2),
                     "client_us_per_row": round(1e6 * client / n, 2),
                     "wall_us_per_row": round(1e6 * wall / n, 2),
                     "wal_bytes_per_row": round(wal),
                     "table_mb": heap, "index_mb": index}
            print(f"  {keys:6s} {path:8s} {start + n:>11,} rows: backend "
                  f"{point['backend_us_per_row']:.2f} us/row, server "
                  f"{point['server_us_per_row']:.2f}, wall {point['wall_us_per_row']:.2f}, WAL "
                  f"{wal:.0f} B/row;"
                  f" table {heap:,.0f} MB, index {index:,.0f} MB", flush=True)
            points.append(point)
    return points


def report(points: list[dict[str, Any]]) -> str:
    lines = ["| keys | path | rows in the table | backend µs/row | server µs/row |"
             " wall µs/row | WAL B/row | table MB | index MB |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|"]
    lines += [f"| {p['keys']} | {p['path']} | {p['rows_before']:,} to {p['rows_after']:,} |"
              f" {p['backend_us_per_row']:.2f} | {p['server_us_per_row']:.2f} |"
              f" {p['wall_us_per_row']:.2f} | {p['wal_bytes_per_row']} | {p['table_mb']:,.0f} |"
              f" {p['index_mb']:,.0f} |"
              for p in points]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=5_000_000)
    p.add_argument("--bucket", type=int, default=1_000_000)
    p.add_argument("--keys", type=lambda t: t.split(","), default=["seq", "random"])
    p.add_argument("--paths", type=lambda t: t.split(","), default=["new"],
                   help="new (the COPY of new keys) and/or conflict (ON CONFLICT DO NOTHING)")
    args = p.parse_args(argv)
    env = harness.up()
    load_before = [round(x, 2) for x in os.getloadavg()]
    points: list[dict[str, Any]] = []
    for keys in args.keys:
        for path in args.paths:
            with harness.fresh_database(env["KAFKA_INGEST_PG_DSN"]) as dsn:
                harness.make_table(dsn, "growth")
                points += fill(dsn, "growth", total=args.rows, bucket=args.bucket, keys=keys,
                               path=path)
    info = {"command": "python benchmarks/bench_table_growth.py " + " ".join(
                sys.argv[1:] if argv is None else argv),
            "when": datetime.now(tz=UTC).isoformat(), "load_before": load_before,
            "load_after": [round(x, 2) for x in os.getloadavg()],
            "machine": {**harness.machine(), **harness.server_versions(env["KAFKA_INGEST_PG_DSN"])}}
    print(f"\n{info['command']}\nload average before {load_before}, after "
          f"{info['load_after']}\n\n{report(points)}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({**info, "points": points}, indent=1))
    print(f"\nwritten: {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
