"""The project's own rows of ``bench_ingest.py``: what the DAG runs, and its parts alone.

- ``A  raw read``: ``reader.read_range`` over each partition, nothing else (Kafka's
  ceiling);
- ``project``: ``ingest.plan_run`` + ``ingest.ingest_range`` per range, the DAG's path,
  ranges one after another (as ``kafka-ingest run`` does);
- ``project, parallel``: the same, one process per range started together (as mapped
  tasks on separate workers);
- ``validate only`` / ``sink only``: ``validate.validate_chunk`` and
  ``the table writer's upsert`` (+ COMMIT) timed alone; reading (and validating, for the
  sink) is done but not timed.

Each ``child_*`` runs in a spawned process (:func:`harness.run_child`); each
``measure_*`` checks what its child did against what the sample promised before its
figure is accepted.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import psycopg
from harness import (
    BASE_PIPELINE,
    CTX,
    PARALLEL_PATH,
    PROJECT_PATH,
    Bench,
    Measure,
    Target,
    as_measure,
    chunks,
    collect,
    count_rows,
    cpu_spent,
    make_table,
    pipeline_of,
    rss_mb,
    run_child,
    server_cpu,
    start_child,
)

from kafka_ingest.db import Database, UnitOfWork
from kafka_ingest.decode.validate import validate_chunk
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.ranges import OffsetRange

# --------------------------------------------------------------------------- children


def child_read(t: Target) -> dict[str, Any]:
    """Baseline A: bounded read only."""
    start_rss = rss_mb()
    consumer = KafkaClients(t.kafka).consumer(t.group)
    n = size = 0
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        for chunk in chunks(t, consumer):
            n += len(chunk.messages)
            size += sum(len(m.value() or b"") for m in chunk.messages)
    finally:
        consumer.close()
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"events": n, "seconds": secs, "cpu_s": cpu, "start_rss_mb": start_rss,
            "peak_rss_mb": rss_mb(), "detail": {"value_mb": round(size / 1e6, 1)}}


def child_project(t: Target, doc: tuple[str, dict[str, Any]], run_id: str,
                  registry_url: str | None = None) -> dict[str, Any]:
    """The project: plan_run + ingest_range per range, one after another (with
    ``registry_url``, the engine's clients carry that schema registry: the Avro row).

    What the row's path imports is imported before the clock starts, as the engine is
    (:func:`timed_run`): for the Avro row, the registry client library too (0.13 s once per
    process; it came with the engine's import until the engine made it lazy)."""
    from kafka_ingest.kafka.registry import RegistrySettings, client_api

    start_rss = rss_mb()
    pipeline = pipeline_of(doc)
    registry = RegistrySettings({"url": registry_url}) if registry_url else None
    if registry is not None:
        client_api()
    clients, db = KafkaClients(t.kafka, registry=registry), Database(t.dsn)
    return timed_run(pipeline, clients, db, run_id, start_rss)


def timed_run(pipeline: Any, clients: Any, db: Any, run_id: str,
              start_rss: float) -> dict[str, Any]:
    """One run as the DAG chains it (plan_run, then ingest_range per range), timed: wall,
    this process's CPU, peak RSS; the summary as the detail, with the packages first
    imported while the clock ran (``imported_while_timed``: what a row imports lazily is
    part of its time, so rows are compared on the same basis only when it is said)."""
    from kafka_ingest.engine.ingest import ingest_range, plan_run, summarize

    loaded = set(sys.modules)
    t0, c0 = time.perf_counter(), time.process_time()
    ranges = plan_run(pipeline, clients, db, run_id=run_id)
    reports = [ingest_range(pipeline, r, clients, db, run_id=run_id).to_dict() for r in ranges]
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    summary = summarize(reports)
    summary["imported_while_timed"] = sorted(
        {".".join(name.split(".")[:2]) for name in set(sys.modules) - loaded})
    return {"events": summary["read"], "seconds": secs, "cpu_s": cpu, "start_rss_mb": start_rss,
            "peak_rss_mb": rss_mb(), "detail": summary}


def child_project_range(t: Target, doc: tuple[str, dict[str, Any]], run_id: str,
                        rng: dict[str, Any], barrier: Any) -> dict[str, Any]:
    """One mapped task: ingest_range of one planned range, started with its siblings."""
    from kafka_ingest.engine.ingest import ingest_range

    start_rss = rss_mb()
    pipeline = pipeline_of(doc)
    clients, db = KafkaClients(t.kafka), Database(t.dsn)
    barrier.wait(60)
    began, c0 = time.monotonic(), time.process_time()  # monotonic: comparable across processes
    report = ingest_range(pipeline, OffsetRange.from_dict(rng), clients, db, run_id=run_id)
    ended = time.monotonic()
    return {"events": report.read, "seconds": ended - began, "start_rss_mb": start_rss,
            "cpu_s": time.process_time() - c0,
            "peak_rss_mb": rss_mb(), "detail": {**report.to_dict(), "began": began,
                                                 "ended": ended}}


def child_validate(t: Target, doc: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """validate_chunk alone, chunk by chunk (the read is not timed)."""
    start_rss = rss_mb()
    pipeline = pipeline_of(doc)
    consumer = KafkaClients(t.kafka).consumer(t.group)
    n = rows = dead = 0
    secs = cpu = 0.0
    try:
        for chunk in chunks(t, consumer):
            t0, c0 = time.perf_counter(), time.process_time()
            result = validate_chunk(chunk.messages, pipeline)
            secs, cpu = secs + time.perf_counter() - t0, cpu + time.process_time() - c0
            n, rows, dead = n + result.read, rows + len(result.rows), dead + len(result.dead)
    finally:
        consumer.close()
    return {"events": n, "seconds": secs, "cpu_s": cpu, "start_rss_mb": start_rss,
            "peak_rss_mb": rss_mb(), "detail": {"rows": rows, "dead": dead}}


def child_sink(t: Target, doc: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """the table writer's upsert + COMMIT of validated rows, per chunk (read + validate untimed).

    ``events`` here are rows sent to Postgres, not messages read.
    """
    start_rss = rss_mb()
    pipeline = pipeline_of(doc)
    consumer = KafkaClients(t.kafka).consumer(t.group)
    rows = inserted = 0
    secs = cpu = 0.0
    try:
        with psycopg.connect(t.dsn) as conn:
            for chunk in chunks(t, consumer):
                prepared = validate_chunk(chunk.messages, pipeline).rows
                t0, c0 = time.perf_counter(), time.process_time()
                with UnitOfWork(conn, pipeline) as uow:  # one per chunk, as the slice's
                    result = uow.rows.upsert(prepared)
                    uow.commit()
                secs, cpu = secs + time.perf_counter() - t0, cpu + time.process_time() - c0
                rows, inserted = rows + len(prepared), inserted + result.inserted
    finally:
        consumer.close()
    return {"events": rows, "seconds": secs, "cpu_s": cpu, "start_rss_mb": start_rss,
            "peak_rss_mb": rss_mb(), "detail": {"inserted": inserted}}


# --------------------------------------------------------------------------- the rows


def check_project(b: Bench, summary: dict[str, Any], table: str, *,
                  expect: dict[str, int] | None = None, produced: int | None = None) -> None:
    """The run must have done exactly what the sample (or ``expect``/``produced``: the
    Avro topic's) promised, or the figure is void."""
    e = b.expect if expect is None else expect
    dead = sum(v for k, v in e.items() if k not in {"row", "duplicate", "tombstone"})
    want = {"read": b.produced if produced is None else produced, "inserted": e.get("row", 0),
            "duplicates": e.get("duplicate", 0), "tombstones": e.get("tombstone", 0),
            "dead_lettered": dead}
    got = {k: summary.get(k) for k in want}
    stored = count_rows(b.dsn, table)
    if got != want or stored != want["inserted"]:
        raise RuntimeError(f"project run into {table} is wrong: got {got}, table has {stored}"
                           f" rows; expected {want}")


def measure_project(b: Bench, rep: int) -> Measure:
    name = f"bench_project_{rep}"
    make_table(b.dsn, name)
    raw = run_child(child_project, b.target, b.pipeline_doc(name), f"bench__{b.tag}_{rep}")
    check_project(b, raw["detail"], name)
    return as_measure(PROJECT_PATH, raw)


def measure_parallel(b: Bench, rep: int) -> Measure:
    """Plan in this process (a few ms), then one child per range, released together."""
    from kafka_ingest.engine.ingest import plan_run, summarize

    name = f"bench_parallel_{rep}"
    make_table(b.dsn, name)
    doc, run_id = b.pipeline_doc(name), f"bench__{b.tag}_par{rep}"
    t0 = time.perf_counter()
    ranges = plan_run(pipeline_of(doc), b.clients, Database(b.dsn), run_id=run_id)
    plan_s = time.perf_counter() - t0
    barrier = CTX.Barrier(len(ranges))
    before = server_cpu()
    procs = [start_child(child_project_range, b.target, doc, run_id, r.to_dict(), barrier)
             for r in ranges]
    raws = [collect(p, q) for p, q in procs]
    servers = cpu_spent(before)
    began = min(r["detail"]["began"] for r in raws)
    ended = max(r["detail"]["ended"] for r in raws)
    summary = summarize([r["detail"] for r in raws])
    check_project(b, summary, name)
    return Measure(PARALLEL_PATH, summary["read"],
                   plan_s + ended - began, max(r["peak_rss_mb"] for r in raws),
                   max(r["start_rss_mb"] for r in raws), summary,
                   sum(r["cpu_s"] for r in raws), servers)


def measure_sink(b: Bench, rep: int) -> Measure:
    name = f"bench_sink_{rep}"
    make_table(b.dsn, name)
    raw = run_child(child_sink, b.target, b.pipeline_doc(name))
    stored, want = count_rows(b.dsn, name), b.expect.get("row", 0)
    if stored != want:
        raise RuntimeError(f"sink only: {name} has {stored} rows; expected {want}")
    return as_measure("sink only (the table writer's upsert + COMMIT; rows)", raw)


def _check_read(b: Bench, raw: dict[str, Any]) -> None:
    if raw["events"] != b.produced:
        raise RuntimeError(f"read {raw['events']} messages of {b.produced}")


def measure_read(b: Bench, _rep: int) -> Measure:
    raw = run_child(child_read, b.target)
    _check_read(b, raw)
    return as_measure("A  raw read (reader.read_range)", raw)


def measure_validate(b: Bench, _rep: int) -> Measure:
    raw = run_child(child_validate, b.target, b.pipeline_doc(BASE_PIPELINE))
    _check_read(b, raw)
    e, got = b.expect, raw["detail"]
    want = {"rows": e.get("row", 0) + e.get("duplicate", 0),
            "dead": sum(v for k, v in e.items() if k not in {"row", "duplicate", "tombstone"})}
    if {k: got.get(k) for k in want} != want:
        raise RuntimeError(f"validate only: {got}; expected {want}")
    return as_measure("validate only (validate_chunk)", raw)
