"""One ingest DAG run on each of Airflow's executors in the local stack: the LocalExecutor,
then the CeleryExecutor with 1 and with 2 workers (``kafka-ingest stack up --airflow
--executor celery --workers N``), on the same events.

    . .venv/bin/activate
    python benchmarks/bench_executors.py --events 300000 --partitions 3

The events are produced once (no poison) to a fresh topic; each configuration ingests all
of them into a fresh database, triggered through the REST API. Throughput is events read
divided by the time from the first slice's start to the last slice's end, as Airflow
records them on the task instances (so the scheduler's and the executor's own latency
between slices counts, the run's plan and report tasks do not). Printed, and written to
``benchmarks/results/executors.json``. Leaves Airflow's services stopped.
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

import httpx
import yaml
from harness import wait

from kafka_ingest.config import parse_pipelines
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest_dev import stack
from kafka_ingest_dev.airflow_services import RestApi
from kafka_ingest_dev.databases import airflow_postgres_conn, create_database, drop_database
from kafka_ingest_dev.samples import produce_sample

RESULTS = Path(__file__).resolve().parent / "results" / "executors.json"
CONFIGS = (("local", None), ("celery", 1), ("celery", 2))


def _one_run(api: httpx.Client, dag_id: str) -> dict[str, Any]:
    wait(f"{dag_id} to be parsed", lambda: api.get(f"/dags/{dag_id}").status_code == 200, 180)
    api.patch(f"/dags/{dag_id}", json={"is_paused": False}).raise_for_status()
    started = api.post(f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": {}})
    started.raise_for_status()
    run_id = started.json()["dag_run_id"]

    def finished() -> str | None:
        state = api.get(f"/dags/{dag_id}/dagRuns/{run_id}").json()["state"]
        return state if state in ("success", "failed") else None

    state = wait(f"run {run_id}", finished, 900)
    tis = api.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances").json()["task_instances"]
    slices = [t for t in tis if t["task_id"] == "ingest"]
    if state != "success" or any(t["state"] != "success" for t in slices):
        raise SystemExit(f"run {run_id} {state}: {[(t['task_id'], t['state']) for t in tis]}")
    report = api.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/report/xcomEntries/"
                     "return_value").json()["value"]
    first = min(datetime.fromisoformat(t["start_date"]) for t in slices)
    last = max(datetime.fromisoformat(t["end_date"]) for t in slices)
    seconds = (last - first).total_seconds()
    return {"read": report["read"], "inserted": report["inserted"], "seconds": seconds,
            "events_per_s": round(report["read"] / seconds),
            "slices": sorted((t["rendered_map_index"], t["hostname"],
                              round(t["duration"] or 0, 2)) for t in slices)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--chunk-size", type=int, default=20_000)
    args = parser.parse_args()

    env = stack.up()
    os.environ.update(env)
    clients = KafkaClients({"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]})
    name = f"bench_exec_{uuid.uuid4().hex[:8]}"
    pipeline = parse_pipelines({"pipelines": {name: {
        "topic": f"bench-{name}", "dlq_topic": f"bench-{name}-dlq", "table": "telemetry_metrics",
        "contract": {"event_type": "metric_event", "version": 2}, "schedule": None,
        "chunk_size": args.chunk_size, "max_records_per_partition": args.events,
        "partitions": args.partitions, "retries": 0,
    }}})[name]
    since = time.monotonic()
    sample = produce_sample(clients, pipeline, count=args.events, poison=0,
                            partitions=args.partitions)
    print(f"produced {sample['produced']} messages over {args.partitions} partitions in "
          f"{time.monotonic() - since:.1f} s", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-executors-"))
    pipelines_file = workdir / "pipelines.yaml"
    body = pipeline.model_dump(mode="json", exclude={"name"})
    pipelines_file.write_text(yaml.safe_dump({"pipelines": {name: body}}))
    dag_id = f"{name}_ingest"
    results, dsns = [], []
    try:
        for executor, workers in CONFIGS:
            dsn = create_database(env["KAFKA_INGEST_PG_DSN"], prefix="bench")
            dsns.append(dsn)
            airflow_env = {"KAFKA_INGEST_PIPELINES": str(pipelines_file),
                           "AIRFLOW_CONN_POSTGRES_DEFAULT": airflow_postgres_conn(dsn)}
            stack.stop_airflow()
            up = stack.up(airflow=True, airflow_env=airflow_env, executor=executor,
                          workers=workers)
            with RestApi(up).client as api:
                result = {"executor": executor, "workers": workers, **_one_run(api, dag_id)}
            results.append(result)
            print(json.dumps(result), flush=True)
    finally:
        stack.stop_airflow()
        subprocess.run([sys.executable, "-m", "airflow", "dags", "delete", dag_id, "--yes"],
                       env={**os.environ, "KAFKA_INGEST_PIPELINES": str(pipelines_file)},
                       capture_output=True, check=False)
        for dsn in dsns:
            drop_database(env["KAFKA_INGEST_PG_DSN"], dsn)
        with contextlib.suppress(Exception):
            admin = clients.admin()
            for future in admin.delete_topics([pipeline.topic, pipeline.dlq_topic]).values():
                future.result(30)
    print(f"\n{'executor':<24} {'read':>8} {'seconds':>8} {'events/s':>9}")
    for r in results:
        label = r["executor"] + (f", {r['workers']} worker(s)" if r["workers"] else "")
        print(f"{label:<24} {r['read']:>8} {r['seconds']:>8.2f} {r['events_per_s']:>9}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"events": args.events, "partitions": args.partitions,
                                   "chunk_size": args.chunk_size, "cpus": os.cpu_count(),
                                   "load_after": os.getloadavg(), "runs": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
