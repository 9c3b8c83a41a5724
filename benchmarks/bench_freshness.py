"""Freshness and per-run overhead under the real scheduler and triggerer
(``kafka-ingest stack up --airflow``), cron every minute against ``schedule: on_data``.

    . .venv/bin/activate
    python benchmarks/bench_freshness.py --rate 2000 --seconds 300 --quiet-seconds 180

Three parts, each on pipelines of its own in one pipelines file (3 partitions each), in a
fresh database:

1. **Overhead per run**: runs triggered through the REST API with nothing new to read,
   then with 1,000 new events: the time from the trigger to the run's end, the task
   instances that ran a process, and the sum of their durations (median of ``--repeat``).
2. **Freshness**: a steady stream of ``--rate`` events/s for ``--seconds`` into one
   topic read by a cron pipeline (every minute), then the same into another read by an
   ``on_data`` pipeline; after the producer stops and the pipeline drained, p50/p95/p99
   of ``ingested_at - kafka_timestamp`` from the table itself, and the runs it took.
3. **A quiet topic**: ``--quiet`` pipelines on empty topics, cron every minute, then the
   same number ``on_data``, each for ``--quiet-seconds``: the runs they started and the CPU
   seconds Airflow's services and their task processes used, per pipeline-hour (the
   baseline: the same services with every DAG paused, measured in the same run).

Printed, and written to ``benchmarks/results/freshness.json``. Leaves Airflow stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import yaml
from confluent_kafka import Producer
from harness import airflow_cpu, wait
from psycopg.conninfo import make_conninfo

from kafka_ingest.config import Pipeline, parse_pipelines
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.topics import ensure_topics
from kafka_ingest_dev import stack
from kafka_ingest_dev.airflow_services import RestApi, watchers_running
from kafka_ingest_dev.databases import airflow_postgres_conn, create_database, drop_database
from kafka_ingest_dev.samples import produce_sample

RESULTS = Path(__file__).resolve().parent / "results" / "freshness.json"
PARTITIONS = 3
TERMINAL = ("success", "failed")


def _pipeline(name: str, **body: Any) -> dict[str, Any]:
    return {name: {"topic": f"bench-{name}", "dlq_topic": f"bench-{name}-dlq",
                   "table": "telemetry_metrics", "partitions": PARTITIONS, "retries": 1,
                   "contract": {"event_type": "metric_event", "version": 2}, **body}}


# --------------------------------------------------------------------------- 1. overhead


def _run_once(api: RestApi, dag_id: str) -> dict[str, Any]:
    started = time.monotonic()
    posted = api.client.post(f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": {}})
    posted.raise_for_status()
    run_id = posted.json()["dag_run_id"]
    state = wait(f"run {run_id}", lambda: (s := api.get(
        f"/dags/{dag_id}/dagRuns/{run_id}")["state"]) in TERMINAL and s, 600, 0.2)
    seconds = time.monotonic() - started
    tis = api.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
    ran = [t for t in tis if t["hostname"]]  # a task process ran (a skip raised inside too)
    run = api.get(f"/dags/{dag_id}/dagRuns/{run_id}")
    spans = {f"{t['task_id']}[{t['map_index']}]": (t["start_date"], t["end_date"]) for t in ran}
    return {"state": state, "trigger_to_done_s": round(seconds, 2), "tasks_run": len(ran),
            "queued_at": run["queued_at"], "start_date": run["start_date"],
            "end_date": run["end_date"], "tasks": spans,
            "task_seconds": round(sum(t["duration"] or 0 for t in ran), 2),
            "task_instances": len(tis)}


def overhead(api: RestApi, clients: KafkaClients, pipeline: Pipeline, repeat: int
             ) -> dict[str, Any]:
    dag_id = f"{pipeline.name}_ingest"
    api.pause(dag_id, False)
    _run_once(api, dag_id)  # the first run also creates the stored offsets
    out: dict[str, Any] = {}
    for label, events in (("no new data", 0), ("1,000 new events", 1000)):
        rows = []
        for _ in range(repeat):
            if events:
                produce_sample(clients, pipeline, count=events, poison=0,
                               partitions=PARTITIONS)
            rows.append(_run_once(api, dag_id))
        out[label] = {k: statistics.median(r[k] for r in rows)
                      for k in ("trigger_to_done_s", "tasks_run", "task_seconds")}
        out[label]["runs"] = rows
        print(f"overhead, {label}: {out[label]}", flush=True)
    api.pause(dag_id, True)
    return out


# --------------------------------------------------------------------------- 2. freshness


def steady(servers: str, topic: str, rate: int, seconds: float) -> int:
    """Produce ``rate`` metric events a second for ``seconds`` (10 batches a second)."""
    producer = Producer({"bootstrap.servers": servers, "linger.ms": 5, "acks": "all"})
    tag, sent, batch = uuid.uuid4().hex[:8], 0, max(1, rate // 10)
    start = time.monotonic()
    while (now := time.monotonic()) - start < seconds:
        due = int((now - start) * rate)
        while sent < due:
            for _ in range(min(batch, due - sent)):
                value = json.dumps({"event_id": f"{tag}-{sent}", "version": 2,
                                    "device_id": f"d-{sent % 50}", "metric_value": 1.0,
                                    "timestamp": time.time()}).encode()
                while True:
                    try:
                        producer.produce(topic, value=value, partition=sent % PARTITIONS)
                        break
                    except BufferError:
                        producer.poll(0.05)
                sent += 1
            producer.poll(0)
        time.sleep(0.1 - ((time.monotonic() - start) % 0.1))
    if producer.flush(60) != 0:
        raise SystemExit("the producer could not deliver every event")
    return sent


def _lag_zero(dsn: str, pipeline: Pipeline, produced: int) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT coalesce(sum(next_offset), 0) FROM ingest_offsets"
                           " WHERE pipeline = %s", (pipeline.name,)).fetchone()
    return row is not None and int(row[0]) >= produced


def freshness(api: RestApi, env: dict[str, str], dsn: str, pipeline: Pipeline, rate: int,
              seconds: float) -> dict[str, Any]:
    dag_id = f"{pipeline.name}_ingest"
    before = {r["dag_run_id"] for r in api.runs(dag_id)}
    api.pause(dag_id, False)
    if pipeline.event_driven:  # its trigger starts after the unpause: tens of seconds
        airflow_dsn = make_conninfo(env["KAFKA_INGEST_PG_DSN"], dbname="airflow")
        wait(f"{pipeline.name}'s lag trigger", lambda: watchers_running(
            airflow_dsn, f"{pipeline.name}_new_data"), 300, 1)
    produced = steady(env["KAFKA_BOOTSTRAP_SERVERS"], pipeline.topic, rate, seconds)
    drain = time.monotonic()
    wait(f"{pipeline.name} to drain", lambda: _lag_zero(dsn, pipeline, produced), 300, 1)
    drained_s = time.monotonic() - drain
    api.pause(dag_id, True)
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*), percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY"
            " extract(epoch FROM ingested_at - kafka_timestamp)), max(extract(epoch FROM"
            " ingested_at - kafka_timestamp)) FROM telemetry_metrics WHERE source_topic = %s",
            (pipeline.topic,)).fetchone()
    if row is None or not row[0]:
        raise SystemExit(f"{pipeline.name}: no row landed")
    count, (p50, p95, p99), worst = row
    runs = [r for r in api.runs(dag_id) if r["dag_run_id"] not in before]
    out = {"schedule": pipeline.schedule, "produced": produced, "rows": count,
           "p50_s": round(p50, 2), "p95_s": round(p95, 2), "p99_s": round(p99, 2),
           "max_s": round(float(worst), 2), "runs": len(runs),
           "drained_after_stop_s": round(drained_s, 1)}
    print(f"freshness, {pipeline.schedule}: {out}", flush=True)
    return out


# --------------------------------------------------------------------------- 3. quiet


def _airflow_cpu_s() -> float:
    return sum(airflow_cpu().values())


def quiet(api: RestApi, dag_ids: list[str], seconds: float, label: str) -> dict[str, Any]:
    before = {d: {r["dag_run_id"] for r in api.runs(d)} for d in dag_ids}
    for d in dag_ids:
        api.pause(d, False)
    cpu0 = _airflow_cpu_s()
    time.sleep(seconds)
    cpu = _airflow_cpu_s() - cpu0
    for d in dag_ids:
        api.pause(d, True)
    runs = sum(len([r for r in api.runs(d) if r["dag_run_id"] not in before[d]])
               for d in dag_ids)
    out = {"pipelines": len(dag_ids), "seconds": seconds, "runs": runs,
           "airflow_cpu_s": round(cpu, 1)}
    print(f"quiet, {label}: {out}", flush=True)
    return out


# --------------------------------------------------------------------------- main


@contextlib.contextmanager
def services(pipelines_file: Path, dsn: str, dag_ids: list[str]) -> Iterator[RestApi]:
    stack.stop_airflow()
    up = stack.up(airflow=True, airflow_env={
        "KAFKA_INGEST_PIPELINES": str(pipelines_file),
        "AIRFLOW_CONN_POSTGRES_DEFAULT": airflow_postgres_conn(dsn)})
    api = RestApi(up)
    for d in dag_ids:
        def parsed(d: str = d) -> bool:
            return bool(api.client.get(f"/dags/{d}").status_code == 200)

        wait(f"{d} to be parsed", parsed, 300)
    try:
        yield api
    finally:
        stack.stop_airflow()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=int, default=2000, help="events/s of the stream")
    parser.add_argument("--seconds", type=float, default=300.0, help="how long it runs")
    parser.add_argument("--quiet", type=int, default=5, help="quiet pipelines per mode")
    parser.add_argument("--quiet-seconds", type=float, default=180.0)
    parser.add_argument("--repeat", type=int, default=3, help="runs per overhead row")
    parser.add_argument("--min-batch", type=int, default=4000)
    parser.add_argument("--max-wait", type=float, default=5.0)
    parser.add_argument("--parts", default="overhead,freshness,quiet",
                        help="which parts to run, comma-separated")
    parser.add_argument("--schedules", default="cron,ondata",
                        help="the freshness part's pipelines, comma-separated")
    args = parser.parse_args()
    parts = set(args.parts.split(","))

    env = stack.up()
    os.environ.update(env)
    clients = KafkaClients({"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]})
    tag = uuid.uuid4().hex[:6]
    on_data = {"min_batch": args.min_batch, "max_wait_seconds": args.max_wait,
               "poll_seconds": 1.0}
    doc: dict[str, Any] = {"pipelines": {
        **_pipeline(f"ovh_{tag}", schedule=None),
        **_pipeline(f"cron_{tag}", schedule="* * * * *"),
        **_pipeline(f"ondata_{tag}", schedule="on_data", on_data=on_data),
        **{k: v for i in range(args.quiet) for k, v in (
            _pipeline(f"qcron{i}_{tag}", schedule="* * * * *")
            | _pipeline(f"qdata{i}_{tag}", schedule="on_data", on_data=on_data)).items()},
    }}
    pipelines = parse_pipelines(doc)
    ensure_topics(clients, {t: PARTITIONS for p in pipelines.values()
                            for t in (p.topic, p.dlq_topic)})
    workdir = Path(tempfile.mkdtemp(prefix="bench-freshness-"))
    pipelines_file = workdir / "pipelines.yaml"
    pipelines_file.write_text(yaml.safe_dump(doc))
    dsn = create_database(env["KAFKA_INGEST_PG_DSN"], prefix="bench")
    dag_ids = [f"{n}_ingest" for n in pipelines]
    results: dict[str, Any] = {"rate": args.rate, "seconds": args.seconds,
                               "cpus": os.cpu_count(), "on_data": on_data}
    try:
        with services(pipelines_file, dsn, dag_ids) as api:
            if "overhead" in parts:
                results["overhead"] = overhead(api, clients, pipelines[f"ovh_{tag}"],
                                               args.repeat)
            results["freshness"] = [
                freshness(api, env, dsn, pipelines[f"{kind}_{tag}"], args.rate, args.seconds)
                for kind in args.schedules.split(",") if "freshness" in parts]
            results["quiet"] = {} if "quiet" not in parts else {
                "paused (baseline)": quiet(api, [], args.quiet_seconds, "every DAG paused"),
                "cron * * * * *": quiet(api, [f"qcron{i}_{tag}_ingest"
                                              for i in range(args.quiet)],
                                        args.quiet_seconds, "cron every minute"),
                "on_data": quiet(api, [f"qdata{i}_{tag}_ingest" for i in range(args.quiet)],
                                 args.quiet_seconds, "on_data"),
            }
    finally:
        drop_database(env["KAFKA_INGEST_PG_DSN"], dsn)
        with contextlib.suppress(Exception):
            admin = clients.admin()
            for future in admin.delete_topics([t for p in pipelines.values()
                                               for t in (p.topic, p.dlq_topic)]).values():
                future.result(30)
    base = results["quiet"].get("paused (baseline)", {}).get("airflow_cpu_s", 0.0)
    for row in results["quiet"].values():
        hours = row["pipelines"] * row["seconds"] / 3600
        row["cpu_s_per_pipeline_hour"] = (round((row["airflow_cpu_s"] - base) / hours, 1)
                                          if hours else None)
    print(f"\n{'overhead per run':<20} {'trigger to done s':>18} {'tasks run':>10} "
          f"{'task s':>7}")
    for label, r in results.get("overhead", {}).items():
        print(f"{label:<20} {r['trigger_to_done_s']:>18} {r['tasks_run']:>10} "
              f"{r['task_seconds']:>7}")
    print(f"\n{'freshness':<16} {'p50 s':>7} {'p95 s':>7} {'p99 s':>7} {'max s':>7} {'runs':>5}")
    for r in results["freshness"]:
        print(f"{r['schedule']:<16} {r['p50_s']:>7} {r['p95_s']:>7} {r['p99_s']:>7} "
              f"{r['max_s']:>7} {r['runs']:>5}")
    print(f"\n{'quiet':<20} {'runs':>5} {'CPU s':>7} {'CPU s/pipeline-hour':>20}")
    for label, r in results["quiet"].items():
        per = r["cpu_s_per_pipeline_hour"]
        print(f"{label:<20} {r['runs']:>5} {r['airflow_cpu_s']:>7} "
              f"{'-' if per is None else per:>20}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    if parts != {"overhead", "freshness", "quiet"}:
        results["parts"] = sorted(parts)
    RESULTS.write_text(json.dumps({**results, "at": datetime.now().isoformat(),
                                   "load_after": os.getloadavg()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
