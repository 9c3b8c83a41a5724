"""The benchmarks' harness: what every script and every row shares.

- **Data types**: :class:`Target` (where a child finds the data: picklable), :class:`Measure`
  (one measured run), :class:`Bench` (one run's fixed inputs: the sample and what it
  promised).
- **Children**: every measured path runs in its own freshly *spawned* process
  (:func:`run_child`), so its peak RSS (``VmHWM``) and CPU seconds are its own; the parent
  holds librdkafka clients (threads), which a fork would copy unsafely, with its memory
  high-water mark. :func:`rss_mb`, :func:`chunks` and :func:`pipeline_of` are the
  children's helpers.
- **CPU of the stack's servers**: :func:`server_cpu` / :func:`cpu_spent` read Postgres'
  (the server and its backends, reaped ones too) and the broker's CPU seconds from
  ``/proc``; :func:`airflow_cpu` Airflow's services'.
- **The stack**: :func:`up` starts it (printing each part's line), :func:`fresh_database`
  and :func:`fresh_topics` give each run its own database and topics, removed after.
- **Checks**: a fast wrong run is not a result: :func:`check_rows` (exactly the sample's
  valid events, once each), :func:`check_committed` (a group's offsets), ...
- **Reporting**: :func:`median_of`, :func:`table`, :func:`scale_table`, :func:`write_json`,
  :func:`machine`.

The scripts (``bench_*.py``), the project's rows (:mod:`project_rows`, :mod:`avro_rows`)
and the peers (:mod:`peers`) import this module; it imports none of them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from kafka_ingest.config import Pipeline, parse_pipelines
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.reader import read_range
from kafka_ingest_dev import databases

RESULTS = Path(__file__).resolve().parent / "results" / "latest.json"
BASE_PIPELINE = "telemetry_metrics"
TEMPLATE_TABLE = "telemetry_metrics"
EPOCH_END = 253_402_300_800  # the contract's bound (exclusive): year 10000
PROJECT_PATH = "project (DAG path, ranges in turn)"
PARALLEL_PATH = "project, parallel (one process per range)"
CTX = mp.get_context("spawn")

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
    #: peers.common.PeerData when --peers: the Connect and Spark jars and topics
    peers: Any = None
    #: avro_rows.AvroData when an Avro row runs: the same sample, Avro-encoded
    avro: Any = None
    #: mirror_rows.MirrorData when a mirror row runs: the change-event topic and its source
    mirror: Any = None

    def pipeline_doc(self, name: str) -> tuple[str, dict[str, Any]]:
        """A pipeline on the bench topics writing to its own table ``name``."""
        body = {**self.base_body, "table": name, "consumer_group": f"bench-{self.tag}-{name}"}
        return name, body


# --------------------------------------------------------------------------- child side


def proc_rss_mb(pid: int | str, key: str = "VmHWM") -> float | None:
    """Peak (``VmHWM``) or current (``VmRSS``) resident memory of ``pid`` (``"self"``: this
    process), in MB; None where ``/proc`` does not say."""
    with suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return None


def rss_mb(key: str = "VmHWM") -> float:
    """Peak (``VmHWM``) or current (``VmRSS``) resident memory of this process, in MB."""
    found = proc_rss_mb("self", key)
    return found if found is not None else (
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def chunks(t: Target, consumer: Any) -> Iterator[Any]:
    for p, (start, end) in sorted(t.ranges.items()):
        yield from read_range(consumer, t.topic, p, start, end, chunk_size=t.chunk_size)


def pipeline_of(doc: tuple[str, dict[str, Any]]) -> Pipeline:
    name, body = doc
    return parse_pipelines({"pipelines": {name: body}})[name]


def _child_main(queue: Any, fn: Callable[..., dict[str, Any]], args: tuple[Any, ...]) -> None:
    try:
        queue.put(("ok", fn(*args)))
    except BaseException:
        queue.put(("error", traceback.format_exc()))


# --------------------------------------------------------------------------- parent side


def start_child(fn: Callable[..., dict[str, Any]], *args: Any) -> tuple[Any, Any]:
    queue = CTX.Queue()
    proc = CTX.Process(target=_child_main, args=(queue, fn, args), daemon=True)
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


def run_child(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    before = server_cpu()
    raw = collect(*start_child(fn, *args))
    return {**raw, "server_cpu_s": cpu_spent(before)}


def as_measure(path: str, raw: dict[str, Any]) -> Measure:
    return Measure(path, raw["events"], raw["seconds"], raw["peak_rss_mb"],
                   raw["start_rss_mb"], raw.get("detail", {}), raw.get("cpu_s", 0.0),
                   raw.get("server_cpu_s", {}))


def median_of(runs: list[Measure]) -> Measure:
    """The run with the median time, carrying every run's seconds and the worst RSS."""
    ordered = sorted(runs, key=lambda m: m.seconds)
    mid = ordered[(len(ordered) - 1) // 2]
    return Measure(mid.path, mid.events, mid.seconds, max(m.peak_rss_mb for m in runs),
                   mid.start_rss_mb, {**mid.detail, "all_seconds": [round(m.seconds, 3)
                                                                    for m in runs]},
                   mid.cpu_s, mid.server_cpu_s)


# --------------------------------------------------------------------------- CPU


def proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3 onwards)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def proc_cpu_s(pid: int | None, *, children: bool) -> float | None:
    """utime + stime of ``pid``, and with ``children`` of every child of it, running or
    ended (a server's backends), in seconds."""
    fields = proc_stat(pid) if pid is not None else None
    if fields is None:
        return None
    ticks = sum(int(f) for f in fields[11:15 if children else 13])
    if children:
        for entry in Path("/proc").iterdir():
            child = proc_stat(int(entry.name)) if entry.name.isdigit() else None
            if child is not None and child[1] == str(pid):
                ticks += int(child[11]) + int(child[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def server_cpu() -> dict[str, float]:
    """CPU seconds so far of the local stack's Postgres (the server and all its backends,
    running or ended) and Kafka broker; what cannot be read is left out."""
    from kafka_ingest_dev import stack

    found = {"postgres": proc_cpu_s(stack.postmaster_pid(), children=True),
             "kafka": proc_cpu_s(stack.broker_pid(1), children=False)}
    return {k: v for k, v in found.items() if v is not None}


def cpu_spent(before: dict[str, float]) -> dict[str, float]:
    """What the servers spent since ``before`` (a :func:`server_cpu` reading)."""
    after = server_cpu()
    return {k: round(after[k] - before[k], 2) for k in before if k in after}


def airflow_cpu() -> dict[str, float]:
    """CPU seconds of each of the stack's Airflow services, their reaped task processes
    included."""
    import psutil

    from kafka_ingest_dev import stack

    out = {}
    for name, pid in stack.settings().airflow.pids().items():
        if pid is None:
            continue
        total = 0.0
        with suppress(psutil.Error):
            proc = psutil.Process(pid)
            for p in (proc, *proc.children(recursive=True)):
                with suppress(psutil.Error):
                    t = p.cpu_times()
                    total += t.user + t.system + t.children_user + t.children_system
        out[name] = total
    return out


# --------------------------------------------------------------------------- the stack


def up(*, registry: bool = False) -> dict[str, str]:
    """Start the local stack if needed (``registry``: its schema registry too), printing
    each part's line; put its environment into this process's (the spawned children, and
    Airflow's home and connections, see it) and return it."""
    from kafka_ingest_dev import stack

    env = stack.up(report=lambda line: print(line, flush=True), registry=registry)
    os.environ.update(env)
    return env


def wait(what: str, check: Callable[[], Any], timeout_s: float, interval_s: float = 0.5) -> Any:
    """Call ``check`` every ``interval_s`` until it returns something true; that value. A
    benchmark that waits longer than ``timeout_s`` for ``what`` stops with a message."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval_s)
    raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for {what}")


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


def drop_tables(dsn: str, prefix: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        names = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            " AND starts_with(tablename, %s)", (prefix,))]
        for name in names:
            conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(name)))


# --------------------------------------------------------------------------- checks


def valid_ids_filter(tag: str) -> tuple[str, list[str]]:
    """SQL that is true for an event id the sample produced as a valid event."""
    pattern = tag.replace("_", r"\_") + "-m-%"
    return "(event_id LIKE %s OR event_id LIKE %s)", [pattern, r"%-poison-extra\_fields"]


def check_rows(b: Bench, table: str, want: int) -> int:
    """The table holds exactly ``want`` rows, every one a valid event of the sample (so all
    of them, once); raise otherwise. Returns the row count."""
    cond, params = valid_ids_filter(b.tag)
    query = sql.SQL("SELECT count(*), count(*) FILTER (WHERE {}) FROM {}").format(
        sql.SQL(cond), sql.Identifier(table))
    with psycopg.connect(b.dsn) as conn:
        total, good = conn.execute(query, params).fetchone()  # type: ignore[misc]
    if total != want or good != want:
        raise RuntimeError(f"{table}: {total} rows, {good} of them valid sample events; "
                           f"expected exactly the {want} valid events")
    return int(total)


def committed(admin: Any, group: str, topic: str, parts: Iterable[int]) -> dict[int, int]:
    """The group's committed offsets on ``topic`` (negative where none). ``admin`` must
    outlive the call: a collected AdminClient never completes its futures."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in parts])
    result = admin.list_consumer_group_offsets([request])[group].result(30)
    return {tp.partition: tp.offset for tp in result.topic_partitions}


def check_committed(b: Bench, group: str, want: dict[int, int]) -> None:
    admin = b.clients.admin()
    got = committed(admin, group, b.source, want)
    if got != want:
        raise RuntimeError(f"group {group} committed {got}; expected {want}")


def expected_dead(expect: dict[str, int]) -> int:
    return sum(v for k, v in expect.items() if k not in {"row", "duplicate", "tombstone"})


def range_ends(t: Target) -> dict[int, int]:
    return {p: end for p, (_start, end) in t.ranges.items()}


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
