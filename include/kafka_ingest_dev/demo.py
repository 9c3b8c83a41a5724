"""``kafka-ingest demo``: the main job end to end on the local stack.

Starts Kafka, Postgres and Airflow's metadata database (``stack up``), migrates the
schema, produces sample events with every kind of poison pill, runs the pipeline's ingest
DAG for real (``airflow dags test``, in-process tasks against the real metadata
database), and prints what landed: rows, dead letters by reason, lag.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from psycopg import sql

from kafka_ingest.cli import database, kafka_clients, new_run_id, print_table
from kafka_ingest.config import Pipeline, get_pipeline, load_pipelines
from kafka_ingest.db import Database, migrate
from kafka_ingest.db.tables import apply_pipelines
from kafka_ingest.engine.ingest import run_ingest
from kafka_ingest.ops.lag import lag
from kafka_ingest_dev import stack
from kafka_ingest_dev.procs import child_env
from kafka_ingest_dev.samples import produce_sample, produce_state_sample

_NOT_DEAD = {"row", "duplicate", "tombstone"}


def _airflow_bin() -> str:
    candidate = Path(sys.executable).with_name("airflow")
    return str(candidate) if candidate.exists() else "airflow"


def run_dag(dag_id: str, env: dict[str, str], *, conf: dict[str, Any] | None = None,
            log_file: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run a DAG for real with ``airflow dags test`` and the stack's environment."""
    cmd = [_airflow_bin(), "dags", "test", dag_id]
    if conf:
        cmd += ["-c", json.dumps(conf)]
    proc = subprocess.run(cmd, env=child_env(env), capture_output=True, text=True,
                          check=False)
    if log_file is not None:
        log_file.write_text(proc.stdout + proc.stderr, encoding="utf-8")
    return proc


def _figure(key: str, value: Any) -> str:
    """One figure of a run's sums as a person reads it: counts as they are, bytes in MB,
    seconds to the hundredth, the DLQ rate as a percentage."""
    label = {"dead_lettered": "dead-lettered", "known_dead": "already dead-lettered",
             "lag_after": "lag after", "dlq_rate": "DLQ rate"}.get(key, key)
    if key == "bytes" and isinstance(value, int | float):
        return f"{value / 1e6:.1f} MB"
    if key == "seconds" and isinstance(value, int | float):
        return f"{value:.2f}s"
    if key == "dlq_rate" and isinstance(value, int | float):
        return f"{label} {value:.2%}"
    if isinstance(value, float):
        return f"{label} {value:.3g}"
    return f"{label} {value}"


def sums_text(pipeline: str, sums: Mapping[str, Any]) -> str:
    """A run's sums (``run_ingest``'s, or the report task's) on one line: ``telemetry_metrics:
    read 20061, inserted 20001, ..., 3.7 MB, 0.28s, ...``; the run id is left out."""
    figures = [_figure(k, v) for k, v in sums.items() if k != "run_id"]
    return f"{pipeline}: {', '.join(figures)}"


def report_line(line: str, pipeline: str) -> str | None:
    """What the demo shows of one line of the DAG run's output: a slice's report as the
    slice wrote it, the run's sums (the report task prints them as a dict) through
    :func:`sums_text`, anything else ``None``."""
    if " live: read " in line:
        text = line.split("[kafka_ingest.engine.slices]", maxsplit=1)[0]
        return text[text.find(pipeline):].strip()[:240]
    start = line.find(f"{pipeline}: {{")
    if start < 0:
        return None
    raw = line[start + len(pipeline) + 2:]
    try:
        sums = ast.literal_eval(raw[:raw.index("}") + 1])
    except (ValueError, SyntaxError):  # not the sums after all: show it as it is
        return line[start:].strip()[:240]
    return sums_text(pipeline, sums) if isinstance(sums, dict) else line[start:].strip()[:240]


def _counts(db: Database, table: str, pipeline: str) -> dict[str, Any]:
    with db.session() as conn:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
            sql.Identifier(table))).fetchone()
        dead = conn.execute(
            "SELECT error_class, count(*) FROM dead_letters WHERE pipeline = %s"
            " GROUP BY 1 ORDER BY 2 DESC, 1", (pipeline,),
        ).fetchall()
    return {"rows": row[0] if row else 0, "dead_letters": {c: n for c, n in dead}}


def main(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    print("1/5 starting the local stack (Kafka, Postgres, Airflow metadata DB) ...")
    env = stack.up()
    os.environ.update(env)
    pipeline = get_pipeline(args.pipeline)
    db = Database(env["KAFKA_INGEST_PG_DSN"])
    with db.session() as conn:
        applied = migrate(conn)
        tables = [c.table for plan in apply_pipelines(conn, load_pipelines().values())
                  for c in plan.changes]
    print(f"2/5 schema: {', '.join(applied) or 'up to date'}"
          f"{'; tables made from contracts: ' + ', '.join(sorted(set(tables))) if tables else ''}")
    before = _counts(db, pipeline.table, pipeline.name)
    sample = produce_sample(kafka_clients(), pipeline, count=args.count, poison=args.poison)
    print(f"3/5 produced {sample['produced']} messages to {pipeline.topic!r}: "
          f"{args.count} events, duplicates, and {args.poison} of every poison-pill kind")
    dag_id = f"{pipeline.name}_ingest"
    print("4/5 running one micro-batch with `kafka-ingest run` ..." if args.cli else
          f"4/5 running the DAG {dag_id!r} with `airflow dags test` ...")
    code = _run_once(args, env, dag_id, pipeline.name)
    if code:
        return code
    after = _counts(db, pipeline.table, pipeline.name)
    print("5/5 summary")
    print(f"    rows in {pipeline.table}: {after['rows']} (+{after['rows'] - before['rows']})")
    print(f"    expected from this sample: {sample['expect'].get('row', 0)} new rows, "
          f"{sample['expect'].get('duplicate', 0)} duplicates, "
          f"{sample['expect'].get('tombstone', 0)} tombstones skipped")
    new_dead = {c: n - before["dead_letters"].get(c, 0) for c, n in after["dead_letters"].items()
                if n != before["dead_letters"].get(c, 0)}
    print(f"    dead letters of this run by reason: {new_dead} "
          f"(expected: { {k: v for k, v in sample['expect'].items() if k not in _NOT_DEAD} })")
    print(f"    dead-letter topic: {pipeline.dlq_topic}")
    print("    lag per partition:")
    print_table([r.to_dict() for r in lag(pipeline, kafka_clients(), database())])
    if args.state_pipeline:
        code = _state_demo(args, env, get_pipeline(args.state_pipeline), db)
        if code:
            return code
    event_driven = sorted(p.name for p in load_pipelines().values() if p.event_driven)
    if event_driven:
        print(f"    event-driven (schedule: on_data): {', '.join(event_driven)}: under the real "
              "scheduler (`kafka-ingest stack up --airflow`) a lag trigger starts their runs "
              "as soon as new data is there; the UI's Browse > Kafka ingest shows every "
              "pipeline")
    print(f"done in {time.monotonic() - t0:.1f}s. Try: kafka-ingest status {pipeline.name}")
    return 0


def _run_once(args: argparse.Namespace, env: dict[str, str], dag_id: str,
              pipeline_name: str) -> int:
    """One micro-batch of a pipeline: its DAG (or ``kafka-ingest run`` with ``--cli``)."""
    if args.cli:
        summary = run_ingest(get_pipeline(pipeline_name), kafka_clients(), database(),
                             run_id=new_run_id("cli"))
        print("   ", sums_text(pipeline_name, summary))
        return 0
    log_file = Path(env["KAFKA_INGEST_STATE_DIR"]) / f"demo-{dag_id}.log"
    print(f"    (log: {log_file})")
    proc = run_dag(dag_id, env, log_file=log_file)
    if proc.returncode != 0:
        print((proc.stdout + proc.stderr)[-4000:], file=sys.stderr)
        print(f"the DAG run failed; full log in {log_file}", file=sys.stderr)
        return 1
    for line in (proc.stdout + proc.stderr).splitlines():
        shown = report_line(line, pipeline_name)
        if shown is not None:
            print("   ", shown)
    return 0


def _state_demo(args: argparse.Namespace, env: dict[str, str], pipeline: Pipeline,
                db: Database) -> int:
    """The declared pipeline: a state topic with deletes, mirrored into its table."""
    print(f"+   {pipeline.name}: declared in the pipelines file, no Python (contract "
          f"{pipeline.model.key()}); its table {pipeline.table} was made by `schema apply`")
    sample = produce_state_sample(kafka_clients(), pipeline, accounts=200, updates=2000)
    print(f"    produced {sample.produced} records to {pipeline.topic!r}: updates, "
          f"{sample.tombstones} tombstones (deletes), re-inserts, 3 poison pills")
    code = _run_once(args, env, f"{pipeline.name}_ingest", pipeline.name)
    if code:
        return code
    with db.session() as conn:
        stored = dict(conn.execute(sql.SQL("SELECT {}, event_id FROM {}").format(
            sql.Identifier(*pipeline.upsert.keys), sql.Identifier(pipeline.table))))
    wrong = [a for a, e in sample.final.items() if stored.get(a) != e]
    wrong += [a for a in sample.deleted if a in stored]
    print(f"    {len(sample.final)} accounts live, {len(sample.deleted)} deleted by the log; "
          f"the table {'mirrors it exactly' if not wrong else f'DIFFERS on {len(wrong)} accounts'}"
          f" (expected dead letters: {sample.poison})")
    return 1 if wrong else 0
