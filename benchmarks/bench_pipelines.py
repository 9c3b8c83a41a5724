"""Hundreds of pipelines on one Airflow (``kafka-ingest stack up --airflow``): what grows
with their number.

    . .venv/bin/activate
    python benchmarks/bench_pipelines.py --pipelines 500

Generates ``--pipelines`` ``on_data`` pipelines (1 partition each, empty topics; the safety
cron's ticks are all in the future, so unpausing starts no run) and measures:

- **parse**: each DAG file imported in-process as the DAG processor imports it;
- **registration**: from the services' start until every DAG is known to the REST API, and
  from unpausing them all until a triggerer runs every lag trigger;
- **quiet**: over ``--window`` seconds with every DAG unpaused and nothing new, the CPU of
  the scheduler, the triggerer and the DAG processor, the runs started (0 is the target),
  and the connections the triggerer holds to Kafka and Postgres;
- **a few pipelines get data**: 100 events on each of 5 topics, the time until each
  pipeline's run is queued;
- **the monitor DAG**: one run of ``kafka_ingest_monitor`` over all pipelines, trigger to
  done, and the checks it recorded.

Printed, and written to ``benchmarks/results/pipelines.json``. Leaves Airflow stopped and
the topics deleted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import psycopg
import yaml
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from kafka_ingest.config import parse_pipelines
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.topics import ensure_topics
from kafka_ingest_dev import stack
from kafka_ingest_dev.airflow_services import RestApi, watchers_running
from kafka_ingest_dev.databases import airflow_postgres_conn, create_database, drop_database
from kafka_ingest_dev.samples import produce_sample

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import airflow_cpu, wait

RESULTS = Path(__file__).resolve().parent / "results" / "pipelines.json"
ROOT = Path(__file__).resolve().parents[1]
NEVER = "59 23 31 12 *"  # its latest tick is before the DAGs' start date: no run at unpause


def parse_seconds(pipelines_file: Path) -> dict[str, float]:
    """Each DAG file imported in a fresh interpreter, as the DAG processor does."""
    out = {}
    for name in ("ingest_dags", "dlq_replay_dags", "monitor_dags"):
        code = ("import sys, time; sys.path.insert(0, 'plugins')\n"
                "from airflow.dag_processing.dagbag import DagBag\n"
                f"t = time.perf_counter(); b = DagBag('dags/{name}.py')\n"
                "assert not b.import_errors, b.import_errors\n"
                "print(len(b.dags), time.perf_counter() - t)")
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                              text=True, check=True, timeout=600, env={
                                  **os.environ, "KAFKA_INGEST_PIPELINES": str(pipelines_file),
                                  "AIRFLOW_HOME": tempfile.mkdtemp(prefix="bench-parse-"),
                                  "AIRFLOW__CORE__LOAD_EXAMPLES": "False"})
        dags, seconds = done.stdout.split()[-2:]
        out[name] = round(float(seconds), 2)
        print(f"parse {name}: {dags} DAGs in {float(seconds):.2f} s", flush=True)
    return out


def _airflow_dsn(env: dict[str, str]) -> str:
    return make_conninfo(env["KAFKA_INGEST_PG_DSN"], dbname="airflow")


def _connections(proc: psutil.Process, ports: dict[str, int]) -> dict[str, int]:
    found = dict.fromkeys(ports, 0)
    for p in (proc, *proc.children(recursive=True)):
        with contextlib.suppress(psutil.Error):
            for c in p.net_connections(kind="tcp"):
                for name, port in ports.items():
                    if c.raddr and c.raddr.port == port and c.status == "ESTABLISHED":
                        found[name] += 1
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pipelines", type=int, default=500)
    parser.add_argument("--window", type=float, default=120.0)
    args = parser.parse_args()

    env = stack.up()
    os.environ.update(env)
    clients = KafkaClients({"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]})
    tag = uuid.uuid4().hex[:6]
    names = [f"p{i:04d}_{tag}" for i in range(args.pipelines)]
    doc = {"pipelines": {n: {
        "topic": f"bench-{n}", "dlq_topic": f"bench-{n}-dlq", "table": "telemetry_metrics",
        "contract": {"event_type": "metric_event", "version": 2}, "partitions": 1,
        "retries": 1, "schedule": "on_data",
        "on_data": {"min_batch": 50, "max_wait_seconds": 5, "poll_seconds": 1,
                    "safety_schedule": NEVER}} for n in names}}
    pipelines = parse_pipelines(doc)
    workdir = Path(tempfile.mkdtemp(prefix="bench-pipelines-"))
    pipelines_file = workdir / "pipelines.yaml"
    pipelines_file.write_text(yaml.safe_dump(doc))
    results: dict[str, Any] = {"pipelines": args.pipelines, "cpus": os.cpu_count()}
    results["parse_s"] = parse_seconds(pipelines_file)
    started = time.monotonic()
    ensure_topics(clients, {t: 1 for p in pipelines.values() for t in (p.topic, p.dlq_topic)})
    results["topics_created_s"] = round(time.monotonic() - started, 1)
    dsn = create_database(env["KAFKA_INGEST_PG_DSN"], prefix="bench")
    pg_port = int(conninfo_to_dict(dsn).get("port") or 5432)
    kafka_port = int(env["KAFKA_BOOTSTRAP_SERVERS"].rsplit(":", 1)[1])
    api: RestApi | None = None
    try:
        stack.stop_airflow()
        started = time.monotonic()
        up = stack.up(airflow=True, airflow_env={
            "KAFKA_INGEST_PIPELINES": str(pipelines_file),
            "AIRFLOW_CONN_POSTGRES_DEFAULT": airflow_postgres_conn(dsn)})
        api = RestApi(up)
        wanted = len(names) * 2 + 1  # ingest and replay per pipeline, and the monitor
        wait("every DAG to be known", lambda: api.get(
            f"/dags?dag_id_pattern=%25{tag}%25&limit=1")["total_entries"] >= wanted - 1, 900, 2)
        results["all_dags_known_s"] = round(time.monotonic() - started, 1)
        print(f"{wanted - 1} DAGs known {results['all_dags_known_s']} s after the start",
              flush=True)
        started = time.monotonic()
        api.client.patch(f"/dags?dag_id_pattern=%25{tag}_ingest", json={"is_paused": False}
                         ).raise_for_status()
        wait("every lag trigger to run", lambda: watchers_running(
            _airflow_dsn(env), f"%{tag}%_new_data") >= len(names), 900, 2)
        results["all_triggers_running_s"] = round(time.monotonic() - started, 1)
        print(f"{len(names)} lag triggers running {results['all_triggers_running_s']} s after "
              "the unpause", flush=True)

        before, runs_before = (airflow_cpu(),
                               api.get("/dags/~/dagRuns?limit=1")["total_entries"])
        time.sleep(args.window)
        after = airflow_cpu()
        triggerer = stack.settings().airflow.pids()["triggerer"]
        if triggerer is None:
            raise SystemExit("the triggerer is not running")
        results["quiet"] = {
            "window_s": args.window,
            "cpu_s_per_minute": {k: round((after[k] - before[k]) * 60 / args.window, 2)
                                 for k in after if k in before},
            "runs_started": api.get("/dags/~/dagRuns?limit=1")["total_entries"] - runs_before,
            "triggerer_connections": _connections(psutil.Process(triggerer),
                                                  {"kafka": kafka_port, "postgres": pg_port}),
        }
        print(f"quiet: {results['quiet']}", flush=True)

        fed = names[: 5]
        produced_at = time.time()
        for n in fed:
            produce_sample(clients, pipelines[n], count=100, poison=0, partitions=1)

        def queued() -> dict[str, float] | None:
            out = {}
            for n in fed:
                runs = api.get(f"/dags/{n}_ingest/dagRuns?limit=5")["dag_runs"]
                if not runs:
                    return None
                out[n] = datetime.fromisoformat(runs[0]["queued_at"]).timestamp() - produced_at
            return out
        delays = wait("the fed pipelines' runs", queued, 300, 1)
        results["data_to_queued_run_s"] = {n: round(d, 1) for n, d in delays.items()}
        print(f"new data to a queued run: {results['data_to_queued_run_s']}", flush=True)

        monitor = "kafka_ingest_monitor"
        api.pause(monitor, False)
        started = time.monotonic()
        run_id = api.client.post(f"/dags/{monitor}/dagRuns",
                                 json={"logical_date": None, "conf": {}}).json()["dag_run_id"]
        state = wait("the monitor's run", lambda: (s := api.get(
            f"/dags/{monitor}/dagRuns/{run_id}")["state"]) in ("success", "failed") and s, 900)
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT count(*) FROM monitor_checks").fetchone()
        tis = api.get(f"/dags/{monitor}/dagRuns/{run_id}/taskInstances")["task_instances"]
        results["monitor"] = {"state": state, "trigger_to_done_s":
                              round(time.monotonic() - started, 1),
                              "tasks": len(tis), "task_seconds":
                              round(sum(t["duration"] or 0 for t in tis), 1),
                              "checks_recorded": int(row[0]) if row else 0}
        print(f"monitor: {results['monitor']}", flush=True)
        with psycopg.connect(env["KAFKA_INGEST_PG_DSN"]) as conn:
            row = conn.execute("SELECT count(*) FROM pg_stat_activity").fetchone()
        results["postgres_sessions"] = int(row[0]) if row else 0
    finally:
        with contextlib.suppress(Exception):  # the bench's DAGs leave the metadata database
            for n in names if api is not None else ():
                for dag_id in (f"{n}_ingest", f"{n}_dlq_replay"):
                    api.client.delete(f"/dags/{dag_id}")  # type: ignore[union-attr]
        stack.stop_airflow()
        drop_database(env["KAFKA_INGEST_PG_DSN"], dsn)
        with contextlib.suppress(Exception):
            admin = clients.admin()
            for future in admin.delete_topics([t for p in pipelines.values()
                                               for t in (p.topic, p.dlq_topic)]).values():
                future.result(60)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({**results, "at": datetime.now().isoformat()}, indent=2))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
