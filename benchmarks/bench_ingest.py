"""Ingest benchmark: events/s read -> committed in Postgres, peak memory and CPU, per path.

Usage (the local stack is started if it is not running)::

    python benchmarks/bench_ingest.py [--events 200000] [--chunk-size 20000]
                                      [--partitions 3] [--repeat 3] [--no-parallel]
                                      [--peers] [--smoke] [--only KEY,...]
                                      [--scale | --scale-only] [--scale-sizes N,...]
                                      [--scale-partitions P,...]

One run produces the sample once (telemetry events, every poison pill once, so the DLQ
path runs) to a fresh random topic, then measures every path on that same data, each in
its own freshly spawned process so peak RSS (``VmHWM``) and CPU seconds are that path's
alone:

- ``A  raw read``: ``reader.read_range`` over each partition, nothing else (Kafka's ceiling);
- ``B  naive loader``: ``json.loads`` + ``executemany(INSERT ... ON CONFLICT DO NOTHING)``
  per chunk, what a simple DAG does (no DLQ, no offsets, no audit; it drops what it cannot
  load, with a hand-written guard for values Postgres would reject);
- ``project``: ``ingest.plan_run`` + ``ingest.ingest_range`` per range, the DAG's path,
  ranges one after another (as ``kafka-ingest run`` does);
- ``project, parallel``: the same, one process per range started together (as mapped tasks
  on separate workers);
- ``validate only`` / ``sink only``: ``validate.validate_chunk`` and ``the table writer's upsert``
  (+ COMMIT) timed alone; reading (and validating, for the sink) is done but not timed;
- ``kafka-ingest (avro)`` (``bench_avro.py``): the project row's child on the same events
  Avro-encoded (confluent-kafka's ``AvroSerializer``, a schema in the stack's registry,
  which is started if needed), with its ratio to the JSON row, and ``validate only, avro``:
  where ``validate_chunk``'s time goes per stage, Avro beside JSON.

``--peers`` adds, on the same sample (``peers.py``): a plain binary COPY ceiling, Kafka
Connect + the Debezium JDBC sink (fresh JVM and warm worker), Spark Structured Streaming
(``availableNow``, ``foreachBatch`` + JDBC; fresh JVM and warm session; pyspark is
pip-installed on first use), the Airflow provider's ``ConsumeFromTopicOperator`` (per
message and per batch) and the seeds' poll/commit loop (first 2,000 messages only).
``--scale`` adds the project path at 0.1M, 1M and 3M events and at 1, 2 and 3 partitions.
``--smoke``: tiny sizes as a check of every path; the exit status is 1 if any run failed or
loaded the wrong rows (so it is for every invocation).

Why spawn and not fork: the parent holds librdkafka clients (threads); forking them is
unsafe, and a forked child would inherit the parent's memory high-water mark.
Every run is checked against what the sample promised (rows, duplicates, dead letters,
tombstones) before its figure is accepted: a fast wrong run is not a result.
The database and topics are created for the run and removed at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import platform
import resource
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from kafka_ingest.config import Pipeline, load_pipelines, parse_pipelines
from kafka_ingest.db import Database, UnitOfWork
from kafka_ingest.decode.validate import validate_chunk
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.reader import read_range
from kafka_ingest.ranges import OffsetRange
from kafka_ingest_dev import databases

# peers.py imports this module by name; run as a script (or as a spawned child's
# __mp_main__), this module is that name, not a second copy.
sys.modules.setdefault("bench_ingest", sys.modules[__name__])

RESULTS = Path(__file__).resolve().parent / "results" / "latest.json"
BASE_PIPELINE = "telemetry_metrics"
TEMPLATE_TABLE = "telemetry_metrics"
EPOCH_END = 253_402_300_800  # the contract's bound (exclusive): year 10000
_CTX = mp.get_context("spawn")


# --------------------------------------------------------------------------- data types


@dataclass(frozen=True)
class Target:
    """What a child needs to reach the data: picklable, no open clients."""

    kafka: dict[str, Any]
    dsn: str
    topic: str
    ranges: dict[int, tuple[int, int]]
    chunk_size: int
    group: str


@dataclass
class Measure:
    """One measured path: what it did, how long, how much memory."""

    path: str
    events: int
    seconds: float
    peak_rss_mb: float
    start_rss_mb: float
    detail: dict[str, Any] = field(default_factory=dict)
    #: CPU seconds (user + sys, every thread) the measured process spent in the timed part.
    cpu_s: float = 0.0
    #: CPU seconds of the local stack's servers ("postgres": the server and its backends;
    #: "kafka": the broker) over the whole child run (untimed setup included; Connect: the
    #: timed part); empty when they cannot be read (a stack this project did not start).
    server_cpu_s: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    @property
    def core_us_per_event(self) -> float | None:
        """CPU per event over the process, Postgres and the broker (core-microseconds);
        None when a server's CPU could not be read."""
        if not self.events or not {"postgres", "kafka"} <= set(self.server_cpu_s):
            return None
        total = self.cpu_s + self.server_cpu_s["postgres"] + self.server_cpu_s["kafka"]
        return total / self.events * 1e6


# --------------------------------------------------------------------------- child side


def _rss_mb(key: str = "VmHWM") -> float:
    """Peak (``VmHWM``) or current (``VmRSS``) resident memory of this process, in MB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _chunks(t: Target, consumer: Any) -> Iterator[Any]:
    for p, (start, end) in sorted(t.ranges.items()):
        yield from read_range(consumer, t.topic, p, start, end, chunk_size=t.chunk_size)


def _pipeline(doc: tuple[str, dict[str, Any]]) -> Pipeline:
    name, body = doc
    return parse_pipelines({"pipelines": {name: body}})[name]


def child_read(t: Target) -> dict[str, Any]:
    """Baseline A: bounded read only."""
    start_rss = _rss_mb()
    consumer = KafkaClients(t.kafka).consumer(t.group)
    n = size = 0
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        for chunk in _chunks(t, consumer):
            n += len(chunk.messages)
            size += sum(len(m.value() or b"") for m in chunk.messages)
    finally:
        consumer.close()
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"events": n, "seconds": secs, "cpu_s": cpu, "start_rss_mb": start_rss,
            "peak_rss_mb": _rss_mb(), "detail": {"value_mb": round(size / 1e6, 1)}}


_NAIVE_COLUMNS = ("event_id", "device_id", "timestamp", "metric_value", "status", "unit",
                  "source_topic", "source_partition", "source_offset", "kafka_key",
                  "kafka_timestamp")


def _naive_insert(table: str) -> sql.Composed:
    return sql.SQL(
        "INSERT INTO {} ({}) VALUES (%s, %s, to_timestamp(%s), %s, %s, %s, %s, %s, %s, %s,"
        " to_timestamp(%s)) ON CONFLICT (event_id) DO NOTHING"
    ).format(sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, _NAIVE_COLUMNS)))


def _text_ok(value: Any, limit: int) -> bool:
    return isinstance(value, str) and len(value) <= limit and "\x00" not in value


def _naive_row(msg: Any) -> tuple[Any, ...] | None:
    """What a simple loader keeps: loadable objects whose values the table accepts."""
    try:
        e = json.loads(msg.value())
        ts, value = float(e["timestamp"]), float(e["metric_value"])
        row = (e["event_id"], e["device_id"], ts, value, e.get("status", "OK"), e.get("unit"))
    except (TypeError, ValueError, KeyError, OverflowError):
        return None
    fits = (_text_ok(row[0], 128) and _text_ok(row[1], 128) and _text_ok(row[4], 32)
            and (row[5] is None or _text_ok(row[5], 32))
            and math.isfinite(value) and 0 <= ts < EPOCH_END)
    if not fits:
        return None
    kind, ms = msg.timestamp()
    return (*row, msg.topic(), msg.partition(), msg.offset(), msg.key(),
            ms / 1000 if kind and ms >= 0 else None)


def child_naive(t: Target, table: str) -> dict[str, Any]:
    """Baseline B: json.loads + executemany INSERT ... ON CONFLICT DO NOTHING per chunk."""
    start_rss = _rss_mb()
    insert = _naive_insert(table)
    consumer = KafkaClients(t.kafka).consumer(t.group)
    n = kept = 0
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        with psycopg.connect(t.dsn) as conn:
            for chunk in _chunks(t, consumer):
                n += len(chunk.messages)
                rows = [r for r in map(_naive_row, chunk.messages) if r is not None]
                kept += len(rows)
                with conn.cursor() as cur:
                    cur.executemany(insert, rows)
                conn.commit()
    finally:
        consumer.close()
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"events": n, "seconds": secs, "cpu_s": cpu, "start_rss_mb": start_rss,
            "peak_rss_mb": _rss_mb(), "detail": {"rows_sent": kept, "skipped": n - kept}}


def child_project(t: Target, doc: tuple[str, dict[str, Any]], run_id: str,
                  registry_url: str | None = None) -> dict[str, Any]:
    """The project: plan_run + ingest_range per range, one after another (with
    ``registry_url``, the engine's clients carry that schema registry: the Avro row)."""
    from kafka_ingest.engine.ingest import ingest_range, plan_run, summarize
    from kafka_ingest.kafka.registry import RegistrySettings

    start_rss = _rss_mb()
    pipeline = _pipeline(doc)
    registry = RegistrySettings({"url": registry_url}) if registry_url else None
    clients, db = KafkaClients(t.kafka, registry=registry), Database(t.dsn)
    t0, c0 = time.perf_counter(), time.process_time()
    ranges = plan_run(pipeline, clients, db, run_id=run_id)
    reports = [ingest_range(pipeline, r, clients, db, run_id=run_id).to_dict() for r in ranges]
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    summary = summarize(reports)
    return {"events": summary["read"], "seconds": secs, "cpu_s": cpu, "start_rss_mb": start_rss,
            "peak_rss_mb": _rss_mb(), "detail": summary}


def child_project_range(t: Target, doc: tuple[str, dict[str, Any]], run_id: str,
                        rng: dict[str, Any], barrier: Any) -> dict[str, Any]:
    """One mapped task: ingest_range of one planned range, started with its siblings."""
    from kafka_ingest.engine.ingest import ingest_range

    start_rss = _rss_mb()
    pipeline = _pipeline(doc)
    clients, db = KafkaClients(t.kafka), Database(t.dsn)
    barrier.wait(60)
    began, c0 = time.monotonic(), time.process_time()  # monotonic: comparable across processes
    report = ingest_range(pipeline, OffsetRange.from_dict(rng), clients, db, run_id=run_id)
    ended = time.monotonic()
    return {"events": report.read, "seconds": ended - began, "start_rss_mb": start_rss,
            "cpu_s": time.process_time() - c0,
            "peak_rss_mb": _rss_mb(), "detail": {**report.to_dict(), "began": began,
                                                 "ended": ended}}


def child_validate(t: Target, doc: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """validate_chunk alone, chunk by chunk (the read is not timed)."""
    start_rss = _rss_mb()
    pipeline = _pipeline(doc)
    consumer = KafkaClients(t.kafka).consumer(t.group)
    n = rows = dead = 0
    secs = cpu = 0.0
    try:
        for chunk in _chunks(t, consumer):
            t0, c0 = time.perf_counter(), time.process_time()
            result = validate_chunk(chunk.messages, pipeline)
            secs, cpu = secs + time.perf_counter() - t0, cpu + time.process_time() - c0
            n, rows, dead = n + result.read, rows + len(result.rows), dead + len(result.dead)
    finally:
        consumer.close()
    return {"events": n, "seconds": secs, "cpu_s": cpu, "start_rss_mb": start_rss,
            "peak_rss_mb": _rss_mb(), "detail": {"rows": rows, "dead": dead}}


def child_sink(t: Target, doc: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """the table writer's upsert + COMMIT of validated rows, per chunk (read + validate untimed).

    ``events`` here are rows sent to Postgres, not messages read.
    """
    start_rss = _rss_mb()
    pipeline = _pipeline(doc)
    consumer = KafkaClients(t.kafka).consumer(t.group)
    rows = inserted = 0
    secs = cpu = 0.0
    try:
        with psycopg.connect(t.dsn) as conn:
            for chunk in _chunks(t, consumer):
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
            "peak_rss_mb": _rss_mb(), "detail": {"inserted": inserted}}


def _child_main(queue: Any, fn: Callable[..., dict[str, Any]], args: tuple[Any, ...]) -> None:
    try:
        queue.put(("ok", fn(*args)))
    except BaseException:
        queue.put(("error", traceback.format_exc()))


# --------------------------------------------------------------------------- parent side


def start_child(fn: Callable[..., dict[str, Any]], *args: Any) -> tuple[Any, Any]:
    queue = _CTX.Queue()
    proc = _CTX.Process(target=_child_main, args=(queue, fn, args), daemon=True)
    proc.start()
    return proc, queue


def collect(proc: Any, queue: Any, *, timeout_s: float = 1800) -> dict[str, Any]:
    """The child's result; raise with its traceback if it failed or died."""
    import queue as queue_mod

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            status, payload = queue.get(timeout=1.0)
            break
        except queue_mod.Empty:
            if not proc.is_alive():
                raise RuntimeError(f"child {proc.pid} died (exit {proc.exitcode})") from None
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"child {proc.pid} timed out after {timeout_s}s") from None
    proc.join(30)
    if status != "ok":
        raise RuntimeError(f"child failed:\n{payload}")
    return payload


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3 onwards)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _proc_cpu_s(pid: int | None, *, children: bool) -> float | None:
    """utime + stime of ``pid``, and with ``children`` of every child of it, running or
    ended (a server's backends), in seconds."""
    fields = _stat(pid) if pid is not None else None
    if fields is None:
        return None
    ticks = sum(int(f) for f in fields[11:15 if children else 13])
    if children:
        for entry in Path("/proc").iterdir():
            child = _stat(int(entry.name)) if entry.name.isdigit() else None
            if child is not None and child[1] == str(pid):
                ticks += int(child[11]) + int(child[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def server_cpu() -> dict[str, float]:
    """CPU seconds so far of the local stack's Postgres (the server and all its backends,
    running or ended) and Kafka broker; what cannot be read is left out."""
    from kafka_ingest_dev import stack

    found = {"postgres": _proc_cpu_s(stack.postmaster_pid(), children=True),
             "kafka": _proc_cpu_s(stack.broker_pid(1), children=False)}
    return {k: v for k, v in found.items() if v is not None}


def cpu_spent(before: dict[str, float]) -> dict[str, float]:
    """What the servers spent since ``before`` (a :func:`server_cpu` reading)."""
    after = server_cpu()
    return {k: round(after[k] - before[k], 2) for k in before if k in after}


def run_child(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    before = server_cpu()
    raw = collect(*start_child(fn, *args))
    return {**raw, "server_cpu_s": cpu_spent(before)}


def as_measure(path: str, raw: dict[str, Any]) -> Measure:
    return Measure(path, raw["events"], raw["seconds"], raw["peak_rss_mb"],
                   raw["start_rss_mb"], raw.get("detail", {}), raw.get("cpu_s", 0.0),
                   raw.get("server_cpu_s", {}))


def fresh_database(admin_dsn: str) -> AbstractContextManager[str]:
    """A new migrated database, dropped on exit (waiting out a Postgres restart)."""
    return databases.fresh_database(admin_dsn, prefix="bench", wait_s=120.0)


@contextmanager
def fresh_topics(clients: KafkaClients, tag: str, partitions: int) -> Iterator[tuple[str, str]]:
    """A random source topic and DLQ topic, deleted (with the bench's groups) on exit."""
    from kafka_ingest.kafka.topics import ensure_topics

    source, dlq = f"bench-{tag}", f"bench-{tag}-dlq"
    ensure_topics(clients, {source: partitions, dlq: partitions})
    try:
        yield source, dlq
    finally:
        admin = clients.admin()
        try:  # the peers add topics of their own, all named <source>-...
            ours = [name for name in admin.list_topics(timeout=30).topics
                    if name == source or name.startswith(f"{source}-")]
        except Exception as exc:  # best effort, as below
            print(f"warning: could not list topics: {exc}", file=sys.stderr)
            ours = [source, dlq]
        for future in admin.delete_topics(ours, operation_timeout=30).values():
            try:
                future.result(30)
            except Exception as exc:  # best effort: a leftover topic is harmless
                print(f"warning: could not delete a topic: {exc}", file=sys.stderr)
        _delete_groups(clients, tag)


def _delete_groups(clients: KafkaClients, tag: str) -> None:
    admin = clients.admin()
    try:
        listed = admin.list_consumer_groups(request_timeout=10).result()
        ours = [g.group_id for g in listed.valid  # Connect's are connect-<connector name>
                if g.group_id.startswith((f"bench-{tag}", f"connect-bench-{tag}"))]
        if ours:
            for future in admin.delete_consumer_groups(ours, request_timeout=10).values():
                future.result()
    except Exception as exc:  # best effort, as above
        print(f"warning: could not delete consumer groups: {exc}", file=sys.stderr)


def make_table(dsn: str, name: str) -> None:
    """An empty copy of the example target table (columns, defaults, primary key)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL)").format(
            sql.Identifier(name), sql.Identifier(TEMPLATE_TABLE)))


def count_rows(dsn: str, table: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
        return int(row.fetchone()[0])  # type: ignore[index]


@dataclass
class Bench:
    """The run's fixed inputs: where the data is and what the sample promised."""

    args: argparse.Namespace
    clients: KafkaClients
    dsn: str
    tag: str
    source: str
    dlq: str
    expect: dict[str, int]
    produced: int
    target: Target
    base_body: dict[str, Any]
    #: peers.PeerData when --peers: the Connect and Spark jars and topics
    peers: Any = None
    #: bench_avro.AvroData when an Avro row runs: the same sample, Avro-encoded
    avro: Any = None

    def pipeline_doc(self, name: str) -> tuple[str, dict[str, Any]]:
        """A pipeline on the bench topics writing to its own table ``name``."""
        body = {**self.base_body, "table": name, "consumer_group": f"bench-{self.tag}-{name}"}
        return name, body


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
    return as_measure("project (DAG path, ranges in turn)", raw)


def measure_parallel(b: Bench, rep: int) -> Measure:
    """Plan in this process (a few ms), then one child per range, released together."""
    from kafka_ingest.engine.ingest import plan_run, summarize

    name = f"bench_parallel_{rep}"
    make_table(b.dsn, name)
    doc, run_id = b.pipeline_doc(name), f"bench__{b.tag}_par{rep}"
    t0 = time.perf_counter()
    ranges = plan_run(_pipeline(doc), b.clients, Database(b.dsn), run_id=run_id)
    plan_s = time.perf_counter() - t0
    barrier = _CTX.Barrier(len(ranges))
    before = server_cpu()
    procs = [start_child(child_project_range, b.target, doc, run_id, r.to_dict(), barrier)
             for r in ranges]
    raws = [collect(p, q) for p, q in procs]
    servers = cpu_spent(before)
    began = min(r["detail"]["began"] for r in raws)
    ended = max(r["detail"]["ended"] for r in raws)
    summary = summarize([r["detail"] for r in raws])
    check_project(b, summary, name)
    return Measure("project, parallel (one process per range)", summary["read"],
                   plan_s + ended - began, max(r["peak_rss_mb"] for r in raws),
                   max(r["start_rss_mb"] for r in raws), summary,
                   sum(r["cpu_s"] for r in raws), servers)


def measure_naive(b: Bench, rep: int) -> Measure:
    name = f"bench_naive_{rep}"
    make_table(b.dsn, name)
    raw = run_child(child_naive, b.target, name)
    raw["detail"]["stored"] = count_rows(b.dsn, name)
    _check_read(b, raw)  # what it stores is its own business (see the table's note)
    return as_measure("B  naive loader (json.loads + executemany)", raw)


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


def median_of(runs: list[Measure]) -> Measure:
    """The run with the median time, carrying every run's seconds and the worst RSS."""
    ordered = sorted(runs, key=lambda m: m.seconds)
    mid = ordered[(len(ordered) - 1) // 2]
    return Measure(mid.path, mid.events, mid.seconds, max(m.peak_rss_mb for m in runs),
                   mid.start_rss_mb, {**mid.detail, "all_seconds": [round(m.seconds, 3)
                                                                    for m in runs]},
                   mid.cpu_s, mid.server_cpu_s)


# --------------------------------------------------------------------------- reporting


def machine() -> dict[str, Any]:
    import confluent_kafka
    import pydantic
    import pydantic_core

    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {
        "nproc": len(os.sched_getaffinity(0)), "cpu": cpu,
        "mem_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(), "platform": platform.platform(),
        "confluent_kafka": confluent_kafka.__version__,
        "librdkafka": confluent_kafka.libversion()[0],
        "pydantic": pydantic.VERSION, "pydantic_core": pydantic_core.__version__,
        "psycopg": psycopg.__version__, "libpq": psycopg.pq.version(),
    }


def server_versions(dsn: str) -> dict[str, str]:
    with psycopg.connect(dsn) as conn:
        pg = str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
    return {"postgres": pg}


PROJECT_PATH = "project (DAG path, ranges in turn)"
PARALLEL_PATH = "project, parallel (one process per range)"


def _times(a: Measure | None, m: Measure) -> str:
    """How many times ``a``'s events/s is ``m``'s ("-" for ``a`` itself or no figure)."""
    return f"{a.rate / m.rate:.2f}x" if a and a is not m and m.rate else "-"


def table(results: list[Measure], baseline: Measure | None) -> str:
    project = next((m for m in results if m.path == PROJECT_PATH), None)
    parallel = next((m for m in results if m.path == PARALLEL_PATH), None)
    head = ("| path | events | seconds | events/s | vs B | project ÷ this | parallel ÷ this "
            "| peak RSS MB | CPU s | Postgres CPU s | Kafka CPU s | core-µs/event "
            "| this ÷ project (CPU) |")
    rows = [head, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for m in results:
        ratio = f"{m.rate / baseline.rate:.2f}x" if baseline and baseline.rate else "-"
        rows.append(f"| {m.path} | {m.events:,} | {m.seconds:.2f} | {m.rate:,.0f} | {ratio} "
                    f"| {_times(project, m)} | {_times(parallel, m)} "
                    f"| {m.peak_rss_mb:.0f} | {m.cpu_s:.1f} | {_servers(m)} "
                    f"| {_per_event(m)} | {_cpu_times(project, m)} |")
    return "\n".join(rows)


def _per_event(m: Measure) -> str:
    per = m.core_us_per_event
    return "-" if per is None else f"{per:.1f}"


def _cpu_times(project: Measure | None, m: Measure) -> str:
    """How many times the project's CPU per event ``m`` spends ("-" for the project)."""
    if project is None or m is project:
        return "-"
    mine, theirs = project.core_us_per_event, m.core_us_per_event
    return f"{theirs / mine:.2f}x" if mine and theirs else "-"


def _servers(m: Measure) -> str:
    return " | ".join(f"{m.server_cpu_s[k]:.1f}" if k in m.server_cpu_s else "-"
                      for k in ("postgres", "kafka"))


def scale_table(points: list[dict[str, Any]]) -> str:
    rows = ["| events | partitions | path | seconds | events/s | s per 100k events "
            "| peak RSS MB | CPU s | Postgres CPU s | Kafka CPU s | core-µs/event |",
            "|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for p in points:
        m = p["measure"]
        rows.append(f"| {p['events']:,} | {p['partitions']} | {m.path} | {m.seconds:.2f} "
                    f"| {m.rate:,.0f} | {m.seconds / m.events * 100_000:.2f} "
                    f"| {m.peak_rss_mb:.0f} | {m.cpu_s:.1f} | {_servers(m)} "
                    f"| {_per_event(m)} |")
    sizes = [p["measure"] for p in points if p.get("sweep") == "events"]
    if len(sizes) > 1:  # linear means the same seconds per 100k at every size
        per = [m.seconds / m.events * 1e5 for m in sizes]
        rows.append(f"\nseconds per 100k events, largest size / smallest: "
                    f"{per[-1] / per[0]:.2f} (1.00 = linear)")
    return "\n".join(rows)


def _as_json(m: Measure) -> dict[str, Any]:
    per = m.core_us_per_event
    return {**asdict(m), "events_per_s": round(m.rate),
            "core_us_per_event": None if per is None else round(per, 2)}


def write_json(path: Path, results: list[Measure], info: dict[str, Any],
               scale: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {**info, "results": [_as_json(m) for m in results],
           "scale": [{**p, "measure": _as_json(p["measure"]),
                      "s_per_100k": round(p["measure"].seconds / p["measure"].events * 1e5, 3)}
                     for p in scale]}
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------- main


def _int_list(text: str) -> list[int]:
    return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=200_000, help="valid events to produce")
    p.add_argument("--chunk-size", type=int, default=20_000)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--repeat", type=int, default=3,
                   help="runs of each path; the median run is reported (default 3)")
    p.add_argument("--no-parallel", action="store_true",
                   help="skip the one-process-per-range project run")
    p.add_argument("--peers", action="store_true",
                   help="add the peers (benchmarks/peers.py): COPY ceiling, Kafka Connect + "
                        "Debezium JDBC sink, Spark Structured Streaming, the Airflow provider's "
                        "operator, the seeds' loop")
    p.add_argument("--only", type=lambda text: [x.strip() for x in text.split(",")],
                   default=None, help="comma-separated path keys to run (e.g. project,"
                   "connect_warm); default all. Keys: " + ", ".join(k for k, _ in PATHS)
                   + ", avro, avro_stages, copy, connect_fresh, connect_warm, spark_fresh,"
                   " spark_warm, operator_batch, operator_row, seeds")
    p.add_argument("--skip", type=lambda text: [x.strip() for x in text.split(",")],
                   default=[], help="comma-separated path keys to leave out (the test "
                   "command's smoke leaves out the Spark rows: pyspark is a 450 MB install)")
    p.add_argument("--seeds-cap", type=int, default=2000,
                   help="messages the seeds' loop runs on (default 2000)")
    p.add_argument("--smoke", action="store_true",
                   help="a check, not a measurement: results go to results/smoke.json; the "
                        "exit status says whether every path ran and loaded the right rows")
    p.add_argument("--scale", action="store_true",
                   help="also run the project path at --scale-sizes events (on --partitions) "
                        "and at --scale-partitions partitions (on --events); long")
    p.add_argument("--scale-only", action="store_true", help="--scale without the comparison")
    p.add_argument("--scale-sizes", type=_int_list, default=[100_000, 1_000_000, 3_000_000],
                   help="comma-separated event counts (default 100000,1000000,3000000)")
    p.add_argument("--scale-partitions", type=_int_list, default=[1, 2, 3],
                   help="comma-separated partition counts (default 1,2,3)")
    args = p.parse_args(argv)
    args.scale = args.scale or args.scale_only
    return args


def prepare(args: argparse.Namespace, clients: KafkaClients, dsn: str, tag: str,
            topics: tuple[str, str]) -> Bench:
    """Produce the sample once; every path reads this same data."""
    from kafka_ingest.kafka.reader import partitions_of, watermarks
    from kafka_ingest_dev.samples import produce_sample

    source, dlq = topics
    base = load_pipelines()[BASE_PIPELINE].model_dump(mode="json", exclude={"name"})
    body = {**base, "topic": source, "dlq_topic": dlq, "chunk_size": args.chunk_size,
            "max_records_per_partition": 100_000_000}
    t0 = time.perf_counter()
    sample = produce_sample(clients, _pipeline((BASE_PIPELINE, body)), count=args.events,
                            poison=1, partitions=args.partitions, tag=tag)
    print(f"produced {sample['produced']:,} messages to {source} in "
          f"{time.perf_counter() - t0:.1f}s; expect {sample['expect']}", flush=True)
    consumer = clients.consumer(f"bench-{tag}-plan")
    try:
        marks = watermarks(consumer, source, partitions_of(consumer, source))
    finally:
        consumer.close()
    target = Target(clients.config, dsn, source, marks, args.chunk_size, f"bench-{tag}-read")
    return Bench(args, clients, dsn, tag, source, dlq, sample["expect"], sample["produced"],
                 target, body)


PATHS: list[tuple[str, Callable[[Bench, int], Measure]]] = [
    ("read", measure_read),
    ("naive", measure_naive),
    ("project", measure_project),
    ("parallel", measure_parallel),
    ("validate", measure_validate),
    ("sink", measure_sink),
]


def _paths(b: Bench) -> list[tuple[str, Callable[[Bench, int], Measure]]]:
    import bench_avro

    paths: list[tuple[str, Callable[[Bench, int], Measure]]] = []
    for key, fn in PATHS:
        if not (key == "parallel" and b.args.no_parallel):
            paths.append((key, fn))
        if key == "project":  # the Avro rows beside the JSON one they are compared with
            paths += bench_avro.PATHS
    if b.args.peers:
        import peers

        paths += peers.PATHS
    return [(k, f) for k, f in paths
            if (b.args.only is None or k in b.args.only) and k not in b.args.skip]


def measure_all(b: Bench) -> tuple[list[Measure], list[str]]:
    """Each path ``--repeat`` times, interleaved so drift hits every path alike. A path
    that fails (or loads the wrong rows) is reported and the others go on."""
    runs: dict[str, list[Measure]] = {}
    failures: list[str] = []
    for rep in range(1, b.args.repeat + 1):
        for key, fn in _paths(b):
            try:
                m = fn(b, rep)
            except Exception as exc:
                failures.append(f"run {rep} {key}: {type(exc).__name__}: {exc}")
                print(f"  run {rep} {key}: FAILED: {traceback.format_exc()}", flush=True)
                continue
            runs.setdefault(key, []).append(m)
            print(f"  run {rep} {m.path}: {m.events:,} in {m.seconds:.2f}s = "
                  f"{m.rate:,.0f}/s, peak RSS {m.peak_rss_mb:.0f} MB, CPU {m.cpu_s:.1f}s",
                  flush=True)
    return [median_of(v) for v in runs.values()], failures


def _drop_tables(dsn: str, prefix: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        names = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            " AND starts_with(tablename, %s)", (prefix,))]
        for name in names:
            conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(name)))


def scale_point(args: argparse.Namespace, clients: KafkaClients, admin_dsn: str, *,
                events: int, partitions: int, parallel: bool,
                sweep: str) -> list[dict[str, Any]]:
    """The project path (and, if asked, the parallel one) on a fresh sample of ``events``
    on ``partitions`` partitions: median of ``--repeat`` runs, each checked."""
    point = argparse.Namespace(**{**vars(args), "events": events, "partitions": partitions})
    tag = uuid.uuid4().hex[:8]
    measures: dict[str, list[Measure]] = {}
    with fresh_database(admin_dsn) as dsn, fresh_topics(clients, tag, partitions) as topics:
        b = prepare(point, clients, dsn, tag, topics)
        for rep in range(1, args.repeat + 1):
            for key, fn in [("project", measure_project),
                            *([("parallel", measure_parallel)] if parallel else [])]:
                m = fn(b, rep)
                _drop_tables(dsn, f"bench_{key}_")  # a 3M-row table per run adds up
                measures.setdefault(key, []).append(m)
                print(f"  scale {events:,} events / {partitions} partitions, run {rep} "
                      f"{m.path}: {m.seconds:.2f}s = {m.rate:,.0f}/s, "
                      f"{m.seconds / m.events * 1e5:.2f} s per 100k", flush=True)
    return [{"sweep": sweep, "events": events, "partitions": partitions,
             "measure": median_of(runs)} for runs in measures.values()]


def run_scale(args: argparse.Namespace, clients: KafkaClients,
              admin_dsn: str) -> list[dict[str, Any]]:
    points: list[dict[str, Any]] = []
    for n in args.scale_sizes:
        points += scale_point(args, clients, admin_dsn, events=n, partitions=args.partitions,
                              parallel=False, sweep="events")
    for parts in args.scale_partitions:
        points += scale_point(args, clients, admin_dsn, events=args.events, partitions=parts,
                              parallel=not args.no_parallel, sweep="partitions")
    return points


def main(argv: list[str] | None = None) -> int:
    import bench_avro

    from kafka_ingest_dev import stack

    args = parse_args(argv)
    avro = not args.scale_only and bench_avro.wanted(args.only)
    env = stack.up(report=lambda line: print(line, flush=True), registry=avro)
    os.environ.update(env)  # the children see the stack (Airflow's home, connections)
    clients = KafkaClients({"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]})
    admin_dsn = env["KAFKA_INGEST_PG_DSN"]
    tag = uuid.uuid4().hex[:8]
    load_before = [round(x, 2) for x in os.getloadavg()]  # other work on the box skews figures
    command = "python benchmarks/bench_ingest.py " + " ".join(sys.argv[1:] if argv is None
                                                              else argv)
    started = time.monotonic()
    results: list[Measure] = []
    failures: list[str] = []
    info: dict[str, Any] = {}
    if not args.scale_only:
        with fresh_database(admin_dsn) as dsn, \
                fresh_topics(clients, tag, args.partitions) as topics, ExitStack() as later:
            b = prepare(args, clients, dsn, tag, topics)
            if avro:
                b.avro = later.enter_context(bench_avro.avro_topic(
                    b, env[bench_avro.REGISTRY_ENV]))
            if args.peers:
                import peers

                b.peers = peers.prepare(b)
            results, failures = measure_all(b)
            info = {"produced": b.produced, "expect": b.expect}
            if b.avro is not None:
                info["avro_expect"] = b.avro.expect
    scale = run_scale(args, clients, admin_dsn) if args.scale else []
    info = {"command": command.strip(), "when": datetime.now(tz=UTC).isoformat(),
            "load_before": load_before, "load_after": [round(x, 2) for x in os.getloadavg()],
            "machine": {**machine(), **server_versions(admin_dsn)}, **info,
            "args": vars(args), "wall_s": round(time.monotonic() - started, 1),
            "failures": failures}
    baseline = next((m for m in results if m.path.startswith("B ")), None)
    avro_vs_json = bench_avro.compare(results)
    if avro_vs_json:
        info["avro_vs_json"] = avro_vs_json
    print(f"\n{info['command']}\nmachine: {json.dumps(info['machine'])}\n"
          f"load average (1, 5, 15 min) before {load_before}, after {info['load_after']}\n")
    if results:
        print(table(results, baseline))
    if avro_vs_json:
        print("\n" + bench_avro.report(avro_vs_json, smoke=args.smoke))
    if scale:
        print("\n" + scale_table(scale))
    out = RESULTS.with_name("smoke.json" if args.smoke else
                            "scale.json" if args.scale_only else RESULTS.name)
    write_json(out, results, info, scale)
    print(f"\nwritten: {out} (wall {info['wall_s']:.0f}s)")
    if failures:
        print(f"\n{len(failures)} run(s) FAILED:\n" + "\n".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
