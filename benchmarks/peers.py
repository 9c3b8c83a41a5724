"""Peers for ``bench_ingest.py --peers``: other ways to load the same sample, same run.

Every peer reads the data the project's rows read (or, for Kafka Connect, the same sample
stream in JsonConverter's envelope), runs in its own process, and is checked before its
figure is accepted: the valid events once in its table, nothing else.

- ``COPY ceiling``: binary ``COPY`` of the validated rows into an empty table with no key
  (no conflict handling), ``COMMIT`` per chunk; read and validation not timed.
- ``Kafka Connect + Debezium JDBC sink``, in a fresh JVM (the time includes starting Connect)
  and in a warm worker (a first connector on a throwaway topic, then the measured one, both
  through the REST API). The jars are fetched once by Maven (``connect/pom.xml``); the
  worker and sink settings are ``connect/worker.properties`` and
  ``connect/jdbc-sink.properties``.
- ``Spark Structured Streaming``: a Kafka source read with ``trigger(availableNow=True)``,
  ``foreachBatch`` parsing with ``from_json`` and the contract's rules as Spark SQL, a JDBC
  write to a staging table per batch, then ``INSERT ... SELECT DISTINCT ON ... ON CONFLICT
  DO NOTHING`` into the target; in a fresh JVM (the time includes starting the session) and
  in a warm session (a first query on a throwaway topic, then the measured one). pyspark is
  a benchmark extra (``spark/requirements.txt``), pip-installed on first use; the Kafka
  connector and the JDBC driver are fetched once by Maven (``spark/pom.xml``).
- ``Airflow provider``: ``ConsumeFromTopicOperator.execute()`` with a per-message
  ``apply_function`` (validate, ``INSERT ... ON CONFLICT DO NOTHING``, autocommit) and with
  ``apply_function_batch`` (validate the batch, ``executemany``, one transaction per batch).
- ``seeds' loop``: ``poll()`` one message, validate, insert, ``commit(asynchronous=False)``;
  capped at the first ``--seeds-cap`` messages (2,000), nothing extrapolated.

Peers with no DLQ (provider, seeds, Spark) drop what the contract rejects; their tables
are checked like the others.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bench_ingest as bi  # the script itself when it runs (it registers under this name)
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from kafka_ingest.contracts import get_contract
from kafka_ingest.decode.validate import validate_chunk
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.reader import partitions_of, read_range, watermarks

CONNECT_DIR = Path(__file__).resolve().parent / "connect"
POM = CONNECT_DIR / "pom.xml"
SPARK_DIR = Path(__file__).resolve().parent / "spark"
SPARK_POM = SPARK_DIR / "pom.xml"
SPARK_REQUIREMENTS = SPARK_DIR / "requirements.txt"
CONTRACT = ("metric_event", 2)
#: The operator's batch size (its default), and how many messages the seeds' loop gets.
OPERATOR_BATCH = 1000
SEEDS_CAP = 2000
#: What ``ConnectStandalone`` gets from ``connect-standalone.sh`` / ``kafka-run-class.sh``.
CONNECT_JVM = [
    "-Xms256M", "-Xmx2G", "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15", "-Djava.awt.headless=true",
]  # fmt: skip
_CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- shared checks


#: The telemetry table's columns and their types, as the peers write them (their own code,
#: as a user would write it: it does not follow the project's internal row shapes).
COLUMNS: tuple[tuple[str, str], ...] = (
    ("event_id", "text"), ("device_id", "text"), ("timestamp", "timestamptz"),
    ("metric_value", "float8"), ("status", "text"), ("unit", "text"),
    ("source_topic", "text"), ("source_partition", "int4"), ("source_offset", "int8"),
    ("kafka_key", "bytea"), ("kafka_timestamp", "timestamptz"),
)


def valid_ids_filter(tag: str) -> tuple[str, list[str]]:
    """SQL that is true for an event id the sample produced as a valid event."""
    pattern = tag.replace("_", r"\_") + "-m-%"
    return "(event_id LIKE %s OR event_id LIKE %s)", [pattern, r"%-poison-extra\_fields"]


def check_rows(b: bi.Bench, table: str, want: int) -> int:
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


def expected_dead(expect: dict[str, int]) -> int:
    return sum(v for k, v in expect.items() if k not in {"row", "duplicate", "tombstone"})


def _ends(t: bi.Target) -> dict[int, int]:
    return {p: end for p, (_start, end) in t.ranges.items()}


def check_committed(b: bi.Bench, group: str, want: dict[int, int]) -> None:
    admin = b.clients.admin()
    got = committed(admin, group, b.source, want)
    if got != want:
        raise RuntimeError(f"group {group} committed {got}; expected {want}")


# --------------------------------------------------------------------------- child side


def _insert_sql(table: str) -> sql.Composed:
    names = [name for name, _ in COLUMNS]
    return sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT (event_id) DO NOTHING").format(
        sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, names)),
        sql.SQL(", ").join(sql.Placeholder() * len(names)))


class _Loader:
    """What the provider's and the seeds' callables do with one message: size limit and
    contract (else drop it: these peers have no DLQ), then the row with its provenance."""

    def __init__(self, max_bytes: int) -> None:
        from pydantic import ValidationError

        self.parse: Callable[[bytes], Any] = get_contract(*CONTRACT).model_validate_json
        self.invalid = ValidationError
        self.max_bytes = max_bytes
        self.read = self.dropped = 0

    def row(self, msg: Any) -> tuple[Any, ...] | None:
        self.read += 1
        value = msg.value()
        if value is None or len(value) > self.max_bytes:
            self.dropped += 1
            return None
        try:
            event = self.parse(value)
        except self.invalid:
            self.dropped += 1
            return None
        kind, ms = msg.timestamp()
        ts = datetime.fromtimestamp(ms / 1000, tz=UTC) if kind and ms >= 0 else None
        return (event.event_id, event.device_id, datetime.fromtimestamp(event.timestamp, tz=UTC),
                event.metric_value, event.status, event.unit,
                msg.topic(), msg.partition(), msg.offset(), msg.key(), ts)


def child_operator(t: bi.Target, style: str, table: str, group: str, total: int,
                   max_bytes: int) -> dict[str, Any]:
    """The provider's ConsumeFromTopicOperator, run through its own ``execute()``."""
    conn_id = "bench_kafka"
    extra = {**t.kafka, "group.id": group, "auto.offset.reset": "earliest",
             "enable.auto.commit": "false"}  # as the operator asks for with commit_cadence
    os.environ[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps(
        {"conn_type": "kafka", "extra": extra})
    from airflow.providers.apache.kafka.operators.consume import ConsumeFromTopicOperator

    loader = _Loader(max_bytes)
    insert = _insert_sql(table)
    conn = psycopg.connect(t.dsn, autocommit=(style == "row"))
    cur = conn.cursor()

    def per_message(msg: Any) -> None:
        row = loader.row(msg)
        if row is not None:
            cur.execute(insert, row)  # autocommit: one transaction per row

    def per_batch(msgs: list[Any]) -> None:
        rows = [r for r in map(loader.row, msgs) if r is not None]
        cur.executemany(insert, rows)
        conn.commit()  # one transaction per batch

    fn = {"apply_function": per_message} if style == "row" else \
        {"apply_function_batch": per_batch}
    op = ConsumeFromTopicOperator(
        task_id=f"consume_{style}", kafka_config_id=conn_id, topics=[t.topic],
        max_messages=total, max_batch_size=OPERATOR_BATCH, commit_cadence="end_of_batch",
        poll_timeout=10, **fn)
    start_rss = bi._rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        op.execute(context={})
    finally:
        conn.close()
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"events": loader.read, "seconds": secs, "cpu_s": cpu, "start_rss_mb": start_rss,
            "peak_rss_mb": bi._rss_mb(), "detail": {"dropped": loader.dropped}}


def child_seeds(t: bi.Target, table: str, group: str, cap: int,
                max_bytes: int) -> dict[str, Any]:
    """The seeds' loop: poll one message, validate, insert, commit it synchronously."""
    from confluent_kafka import Consumer

    loader = _Loader(max_bytes)
    insert = _insert_sql(table)
    last: dict[int, int] = {}
    start_rss = bi._rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    first = None
    consumer = Consumer({**t.kafka, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    deadline = time.monotonic() + 600
    try:
        with psycopg.connect(t.dsn, autocommit=True) as conn:
            consumer.subscribe([t.topic])
            while loader.read < cap:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"read {loader.read} of {cap} messages in 600 s")
                msg: Any = consumer.poll(1.0)
                if msg is None or msg.error():
                    continue
                first = first or time.perf_counter() - t0
                row = loader.row(msg)
                if row is not None:
                    conn.execute(insert, row)
                consumer.commit(message=msg, asynchronous=False)
                last[msg.partition()] = msg.offset()
    finally:
        consumer.close()
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"events": loader.read, "seconds": secs, "cpu_s": cpu, "start_rss_mb": start_rss,
            "peak_rss_mb": bi._rss_mb(),
            "detail": {"dropped": loader.dropped, "last_offsets": last,
                       "first_message_s": round(first or 0.0, 3)}}


def child_copy(t: bi.Target, table: str, max_bytes: int) -> dict[str, Any]:
    """Binary COPY of the validated rows into a table with no key, COMMIT per chunk (read
    and validation not timed). ``events`` are rows sent to Postgres."""
    loader = _Loader(max_bytes)
    stmt = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
        sql.Identifier(table), sql.SQL(", ").join(sql.Identifier(n) for n, _ in COLUMNS))
    types = [pg for _, pg in COLUMNS]
    start_rss = bi._rss_mb()
    consumer = KafkaClients(t.kafka).consumer(t.group)
    rows = 0
    secs = cpu = 0.0
    try:
        with psycopg.connect(t.dsn) as conn:
            for chunk in bi._chunks(t, consumer):
                prepared = [r for r in map(loader.row, chunk.messages) if r is not None]
                t0, c0 = time.perf_counter(), time.process_time()
                with conn.cursor().copy(stmt) as copy:
                    copy.set_types(types)
                    for row in prepared:
                        copy.write_row(row)
                conn.commit()
                secs += time.perf_counter() - t0
                cpu += time.process_time() - c0
                rows += len(prepared)
    finally:
        consumer.close()
    return {"events": rows, "seconds": secs, "cpu_s": cpu, "start_rss_mb": start_rss,
            "peak_rss_mb": bi._rss_mb(), "detail": {}}


# --------------------------------------------------------------------------- Connect data


#: The JsonConverter schema of metric_event v2 (the contract's fields, as Connect types).
ENVELOPE_SCHEMA = {
    "type": "struct", "name": "metric_event.v2", "optional": False,
    "fields": [
        {"field": "event_id", "type": "string", "optional": False},
        {"field": "device_id", "type": "string", "optional": False},
        {"field": "timestamp", "type": "double", "optional": False},
        {"field": "metric_value", "type": "double", "optional": False},
        {"field": "status", "type": "string", "optional": False},
        {"field": "version", "type": "int32", "optional": True},
        {"field": "unit", "type": "string", "optional": True},
    ],
}
_SCHEMA_JSON = json.dumps(ENVELOPE_SCHEMA, separators=(",", ":")).encode()


def envelope(value: bytes) -> bytes:
    """``value`` (a JSON object) as JsonConverter's ``{"schema": ..., "payload": value}``."""
    return b'{"schema":' + _SCHEMA_JSON + b',"payload":' + value + b"}"


def connect_value(sample: Any) -> bytes | None:
    """The project's loadable events go in the envelope, byte for byte; poison pills keep
    their bytes (no envelope, so the converter rejects them and Connect dead-letters them);
    a tombstone stays null."""
    if sample.value is not None and sample.expect in {"row", "duplicate"}:
        return envelope(sample.value)
    return sample.value


def produce_connect_topic(clients: KafkaClients, doc: tuple[str, dict[str, Any]], topic: str,
                          *, count: int, partitions: int, tag: str,
                          value_of: Callable[[Any], bytes | None] = connect_value,
                          ) -> dict[str, Any]:
    """The sample ``produce_sample`` wrote (same generator, tag, seed, keys, partitions),
    each value as ``value_of`` makes it (:func:`connect_value`: JsonConverter's envelope);
    returns what to expect."""
    from kafka_ingest.kafka.topics import ensure_topics
    from kafka_ingest_dev.samples import Outgoing, produce_records, sample_stream

    ensure_topics(clients, {topic: partitions})
    expect: dict[str, int] = {}
    size = 0

    def records() -> Iterator[Outgoing]:
        nonlocal size
        for s in sample_stream(bi._pipeline(doc), count, 1, tag=tag, partitions=partitions):
            value = value_of(s)
            size += len(value or b"")
            expect[s.expect] = expect.get(s.expect, 0) + 1
            yield s.key, value, s.partition, None

    produce_records(clients.producer(), topic, records())
    return {"produced": sum(expect.values()), "expect": expect, "value_mb": size / 1e6}


# --------------------------------------------------------------------------- Connect jars


def connect_cache() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/kafka-ingest/connect-<sha256 of connect/pom.xml>``."""
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    digest = hashlib.sha256(POM.read_bytes()).hexdigest()[:12]
    return Path(xdg) / "kafka-ingest" / f"connect-{digest}"


def fetch_once(cache: Path, peer: str, fetch: Callable[[str, Path], str]) -> str:
    """``fetch(mvn, cache)`` once per cache (under a lock: concurrent runs wait for one
    fetch); what it returns is kept in a marker file, which also says the fetch finished.
    Returns the marker's text."""
    marker = cache / ".complete"
    if not marker.is_file():
        mvn = shutil.which("mvn")
        if mvn is None:
            raise RuntimeError(f"the {peer} peer needs Maven (apt-get install maven)")
        cache.mkdir(parents=True, exist_ok=True)
        with (cache / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not marker.is_file():
                t0 = time.perf_counter()
                text = fetch(mvn, cache)
                marker.write_text(text, encoding="utf-8")
                print(f"fetched the {peer} peer's jars into {cache} in "
                      f"{time.perf_counter() - t0:.0f}s", flush=True)
    return marker.read_text(encoding="utf-8")


def run_mvn(cmd: list[str], what: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise RuntimeError(f"mvn could not fetch {what}: {tail}")


def fetch_connect_jars() -> Path:
    """Connect's jars in ``<cache>/libs``, the sink plugin in ``<cache>/plugins/...``; fetched
    by Maven once."""

    def fetch(mvn: str, cache: Path) -> str:
        for profile, out in (("worker", cache / "libs"),
                             ("plugin", cache / "plugins" / "debezium-connector-jdbc")):
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            run_mvn([mvn, "-q", "-B", "-f", str(POM), "-P", profile,
                     "dependency:copy-dependencies", f"-DoutputDirectory={out}",
                     "-Dmdep.includeScope=runtime"], f"the {profile} jars")
        return POM.read_text(encoding="utf-8")

    cache = connect_cache()
    fetch_once(cache, "Kafka Connect", fetch)
    return cache


# --------------------------------------------------------------------------- Connect worker


def read_properties(path: Path, values: dict[str, Any]) -> dict[str, str]:
    """``key=value`` lines of ``path`` (``#`` comments), ``{name}`` filled from ``values``."""
    props: dict[str, str] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        props[key.strip()] = value.strip().format_map(values)
    return props


def write_properties(path: Path, props: dict[str, str]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()), encoding="utf-8")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ConnectWorker:
    """One ``ConnectStandalone`` JVM (started here, stopped by its pid), its REST API and
    its resource use from ``/proc``."""

    def __init__(self, cache: Path, bootstrap: str, connector: dict[str, str] | None = None):
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("the Kafka Connect peer needs Java 17+")
        self.work = Path(tempfile.mkdtemp(prefix="bench-connect-"))
        self.port = _free_port()
        props = read_properties(CONNECT_DIR / "worker.properties", {
            "bootstrap": bootstrap, "work": self.work, "plugins": cache / "plugins",
            "rest_port": self.port})
        cmd = [java, *CONNECT_JVM,
               f"-Dlog4j2.configurationFile={CONNECT_DIR / 'log4j2.properties'}",
               "-cp", f"{cache / 'libs'}/*", "org.apache.kafka.connect.cli.ConnectStandalone",
               str(write_properties(self.work / "worker.properties", props))]
        if connector is not None:
            cmd.append(str(write_properties(self.work / "connector.properties", connector)))
        self.log = self.work / "connect.log"
        self.started = time.perf_counter()
        with self.log.open("wb") as out:
            # Same session as the benchmark: Ctrl-C in the terminal stops the JVM too.
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, cwd=self.work)
        self.ready_s: float | None = None

    # resources
    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime + stime, all threads

    def rss_mb(self, key: str = "VmHWM") -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
        return 0.0

    # REST
    def rest(self, method: str, path: str, body: Any = None, timeout: float = 10) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310
            raw = resp.read()
        return json.loads(raw) if raw else None

    def answers(self) -> bool:
        try:
            self.rest("GET", "/", timeout=1)
        except (OSError, urllib.error.URLError):
            return False
        if self.ready_s is None:
            self.ready_s = time.perf_counter() - self.started
        return True

    def wait_ready(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.answers():
            self.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"Connect's REST API did not answer in {timeout_s}s"
                                   f"{self.tail()}")
            time.sleep(0.05)  # polling interval of a start-up, not a wait for a result

    def failure(self, name: str) -> str | None:
        """The connector's or a task's trace if one FAILED, else None."""
        try:
            status = self.rest("GET", f"/connectors/{name}/status", timeout=2)
        except (OSError, urllib.error.URLError, ValueError):
            return None
        for part in [status.get("connector", {}), *status.get("tasks", [])]:
            if part.get("state") == "FAILED":
                return str(part.get("trace", "FAILED"))[:3000]
        return None

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"Connect exited with {self.proc.returncode}{self.tail()}")

    def tail(self, lines: int = 25) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return f"\n--- {self.log} (last {lines} lines) ---\n" + "\n".join(text)

    def stop(self, *, keep: bool = False, log_name: str = "connect") -> None:
        """SIGTERM to our JVM, SIGKILL after 30 s; its log is copied to
        ``results/<log_name>.log``; the work dir is removed unless ``keep``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        with contextlib.suppress(OSError):
            bi.RESULTS.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.log, bi.RESULTS.parent / f"{log_name}.log")
        if keep:
            print(f"  (Connect's work dir kept: {self.work})", flush=True)
        else:
            shutil.rmtree(self.work, ignore_errors=True)


@contextlib.contextmanager
def connect_worker(cache: Path, bootstrap: str, log_name: str,
                   connector: dict[str, str] | None = None) -> Iterator[ConnectWorker]:
    worker = ConnectWorker(cache, bootstrap, connector)
    ok = False
    try:
        yield worker
        ok = True
    finally:
        worker.stop(keep=not ok, log_name=log_name)


# --------------------------------------------------------------------------- Connect runs


CONNECT_TABLE = """
CREATE TABLE {} (
    event_id          varchar(128)     PRIMARY KEY,
    device_id         varchar(128)     NOT NULL,
    "timestamp"       double precision NOT NULL,
    metric_value      double precision NOT NULL,
    status            varchar(32)      NOT NULL,
    version           integer,
    unit              varchar(32),
    source_topic      text             NOT NULL,
    source_partition  integer          NOT NULL,
    source_offset     bigint           NOT NULL,
    kafka_timestamp   timestamptz,
    ingested_at       timestamptz      NOT NULL DEFAULT now()
)"""


def make_connect_table(dsn: str, name: str) -> None:
    """The target table as the record's schema types it (the event's ``timestamp`` stays a
    double: Connect has no SMT for float epoch seconds), plus the provenance columns."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(CONNECT_TABLE).format(sql.Identifier(name)))


def sink_config(b: bi.Bench, name: str, topic: str, table: str, dlq: str) -> dict[str, str]:
    pg = conninfo_to_dict(b.dsn)
    return read_properties(CONNECT_DIR / "jdbc-sink.properties", {
        "name": name, "tasks": b.args.partitions, "topic": topic, "table": table, "dlq": dlq,
        "host": pg.get("host", "127.0.0.1"), "port": pg.get("port", 5432),
        "dbname": pg["dbname"], "user": pg["user"], "password": pg.get("password", "")})


def _topic_ends(clients: KafkaClients, topic: str) -> dict[int, int]:
    consumer = clients.consumer(f"bench-ends-{topic}")
    try:
        return {p: hi for p, (_lo, hi) in
                watermarks(consumer, topic, partitions_of(consumer, topic)).items()}
    finally:
        consumer.close()


def await_sink(b: bi.Bench, worker: ConnectWorker, name: str, topic: str, table: str,
               want_rows: int, timeout_s: float) -> float:
    """Poll until the connector's group has committed the end of ``topic`` and the table
    holds ``want_rows``; return ``perf_counter()`` when that was first seen."""
    ends = _topic_ends(b.clients, topic)
    group = f"connect-{name}"
    admin = b.clients.admin()
    deadline = time.monotonic() + timeout_s
    next_status = 0.0
    rows = -1
    while True:
        seen = time.perf_counter()
        if committed(admin, group, topic, ends) == ends:
            rows = bi.count_rows(b.dsn, table)
            if rows == want_rows:
                return seen
        worker.check_alive()
        if time.monotonic() >= next_status:  # the REST API once a second: fail fast
            next_status = time.monotonic() + 1.0
            if worker.answers() and (trace := worker.failure(name)):
                raise RuntimeError(f"connector {name} failed:\n{trace}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"connector {name}: not done after {timeout_s:.0f}s (group "
                               f"{group} offsets vs ends {ends}, table rows {rows})"
                               f"{worker.tail()}")
        time.sleep(0.05)  # the polling interval: the figure's resolution is 50 ms


def count_dlq(b: bi.Bench, dlq: str, want: int, timeout_s: float = 30) -> dict[str, int]:
    """Records in Connect's DLQ topic and how many carry the error headers; waits for
    ``want`` (the DLQ producer is asynchronous)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            n = sum(_topic_ends(b.clients, dlq).values())
        except Exception:  # the topic may not exist yet: Connect creates it
            n = 0
        if n >= want or time.monotonic() > deadline:
            break
        time.sleep(0.2)  # the DLQ producer is asynchronous; a poll interval
    with_headers = 0
    if n:
        consumer = b.clients.consumer(f"bench-{b.tag}-dlqcount")
        try:
            for p, (lo, hi) in watermarks(consumer, dlq, partitions_of(consumer, dlq)).items():
                for chunk in read_range(consumer, dlq, p, lo, hi, chunk_size=1000):
                    with_headers += sum(
                        any(k == "__connect.errors.exception.class.name"
                            for k, _ in (m.headers() or [])) for m in chunk.messages)
        finally:
            consumer.close()
    return {"records": n, "with_error_headers": with_headers}


CONNECT_KEYS = {"connect_fresh", "connect_warm"}
SPARK_KEYS = {"spark_fresh", "spark_warm"}


@dataclass
class PeerData:
    """What the peers share in one run: the jars, the Connect topics, the Spark warm-up
    topic (each only when a row that needs it runs)."""

    cache: Path
    seeds_cap: int
    connect_topic: str = ""
    connect_produced: int = 0
    connect_value_mb: float = 0.0
    warm_topic: str = ""
    warm_rows: int = 0
    spark_jars: tuple[str, ...] = ()
    spark_warm_topic: str = ""
    spark_warm_produced: int = 0
    spark_warm_rows: int = 0


def _wanted(b: bi.Bench, keys: set[str]) -> bool:
    keys = keys - set(getattr(b.args, "skip", ()))
    return bool(keys) and (b.args.only is None or bool(keys & set(b.args.only)))


def _warm_count(b: bi.Bench) -> int:
    """Events in a warm-up topic: half the sample, at least 1,000, at most 50,000."""
    return max(1000, min(b.args.events // 2, 50_000))


def prepare(b: bi.Bench) -> PeerData:
    """What the selected peers need, once per run: Connect's jars and topics, Spark's extra,
    jars and warm-up topic."""
    data = PeerData(connect_cache(), b.args.seeds_cap or SEEDS_CAP)
    if _wanted(b, CONNECT_KEYS):
        prepare_connect(b, data)
    if _wanted(b, SPARK_KEYS):
        prepare_spark(b, data)
    return data


def prepare_connect(b: bi.Bench, data: PeerData) -> None:
    """Fetch the jars (once), produce the Connect topics: the measured one (same sample) and
    a throwaway one for warming the long-lived worker."""
    data.cache = fetch_connect_jars()
    doc = (bi.BASE_PIPELINE, b.base_body)
    topic, warm = f"bench-{b.tag}-connect", f"bench-{b.tag}-connect-warmup"
    t0 = time.perf_counter()
    made = produce_connect_topic(b.clients, doc, topic, count=b.args.events,
                                 partitions=b.args.partitions, tag=b.tag)
    if made["produced"] != b.produced or made["expect"] != b.expect:
        raise RuntimeError(f"the Connect topic differs from the sample: {made} vs "
                           f"{b.produced} {b.expect}")
    warm_data = produce_connect_topic(b.clients, doc, warm, count=_warm_count(b),
                                      partitions=b.args.partitions, tag=f"{b.tag}w")
    print(f"produced the same sample in JsonConverter's envelope to {topic} "
          f"({made['value_mb']:.0f} MB of values) and {warm_data['produced']:,} to {warm} in "
          f"{time.perf_counter() - t0:.1f}s", flush=True)
    data.connect_topic, data.connect_produced = topic, made["produced"]
    data.connect_value_mb = made["value_mb"]
    data.warm_topic, data.warm_rows = warm, warm_data["expect"].get("row", 0)


def _sink_timeout(b: bi.Bench) -> float:
    return max(180.0, b.produced / 500)


def _check_connect(b: bi.Bench, table: str, dlq: str) -> dict[str, Any]:
    rows = check_rows(b, table, b.expect.get("row", 0))
    dead = count_dlq(b, dlq, expected_dead(b.expect))
    if dead["records"] != expected_dead(b.expect) or dead["with_error_headers"] != dead["records"]:
        raise RuntimeError(f"Connect's DLQ {dlq}: {dead}; expected {expected_dead(b.expect)} "
                           "records, each with __connect.errors.* headers")
    return {"rows": rows, "dead_lettered": dead["records"],
            "topic_value_mb": round(b.peers.connect_value_mb, 1)}


def measure_connect_fresh(b: bi.Bench, rep: int) -> bi.Measure:
    """Start ConnectStandalone with the connector on its command line; time to done."""
    p: PeerData = b.peers
    name, table = f"bench-{b.tag}-fresh{rep}", f"bench_connect_fresh_{rep}"
    dlq = f"bench-{b.tag}-connect-dlq-fresh{rep}"
    make_connect_table(b.dsn, table)
    config = sink_config(b, name, p.connect_topic, table, dlq)
    servers = bi.server_cpu()
    with connect_worker(p.cache, b.clients.config["bootstrap.servers"], "connect-fresh",
                        config) as w:
        done = await_sink(b, w, name, p.connect_topic, table, b.expect.get("row", 0),
                          _sink_timeout(b))
        secs, cpu, peak = done - w.started, w.cpu_s(), w.rss_mb()
        spent = bi.cpu_spent(servers)
        detail = {"jvm_rest_ready_s": round(w.ready_s or 0.0, 2)}
    detail.update(_check_connect(b, table, dlq))
    return bi.Measure("Kafka Connect + Debezium JDBC sink, fresh JVM", p.connect_produced,
                      secs, peak, 0.0, detail, cpu, spent)


def measure_connect_warm(b: bi.Bench, rep: int) -> bi.Measure:
    """A long-lived worker: a first connector on the throwaway topic (JIT, pools, metadata
    warm), deleted; then the measured connector, from its PUT to done."""
    p: PeerData = b.peers
    bootstrap = b.clients.config["bootstrap.servers"]
    warm_name, warm_table = f"bench-{b.tag}-warmup{rep}", f"bench_connect_warmup_{rep}"
    name, table = f"bench-{b.tag}-warm{rep}", f"bench_connect_warm_{rep}"
    dlq = f"bench-{b.tag}-connect-dlq-warm{rep}"
    make_connect_table(b.dsn, warm_table)
    make_connect_table(b.dsn, table)
    with connect_worker(p.cache, bootstrap, "connect-warm") as w:
        w.wait_ready()
        w.rest("PUT", f"/connectors/{warm_name}/config", sink_config(
            b, warm_name, p.warm_topic, warm_table, f"bench-{b.tag}-connect-dlq-warmup{rep}"))
        await_sink(b, w, warm_name, p.warm_topic, warm_table, p.warm_rows, _sink_timeout(b))
        w.rest("DELETE", f"/connectors/{warm_name}")
        deadline = time.monotonic() + 30
        while warm_name in w.rest("GET", "/connectors") and time.monotonic() < deadline:
            time.sleep(0.05)  # until the worker has stopped its task: a poll interval
        start_rss = w.rss_mb("VmRSS")
        c0, t0, servers = w.cpu_s(), time.perf_counter(), bi.server_cpu()
        w.rest("PUT", f"/connectors/{name}/config",
                sink_config(b, name, p.connect_topic, table, dlq))
        done = await_sink(b, w, name, p.connect_topic, table, b.expect.get("row", 0),
                          _sink_timeout(b))
        secs, cpu, peak = done - t0, w.cpu_s() - c0, w.rss_mb()
        spent = bi.cpu_spent(servers)
    with psycopg.connect(b.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(warm_table)))
    detail = {"warmup_rows": p.warm_rows, **_check_connect(b, table, dlq)}
    return bi.Measure("Kafka Connect + Debezium JDBC sink, warm worker", p.connect_produced,
                      secs, peak, start_rss, detail, cpu, spent)


# --------------------------------------------------------------------------- Spark extra, jars


def pinned(requirements: Path) -> dict[str, str]:
    """The ``name==version`` lines of a requirements file (comments and blank lines skipped)."""
    pins: dict[str, str] = {}
    for raw in requirements.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not version.strip():
            raise ValueError(f"{requirements}: {raw!r} is not pinned (name==version)")
        pins[name.strip().lower()] = version.strip()
    return pins


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def ensure_pyspark() -> Path:
    """The Spark peer's benchmark extra (``spark/requirements.txt``: pyspark and py4j, pinned)
    in this interpreter's environment (the project's ``.venv``), pip-installed on first use
    or when the pins change; returns pyspark's ``jars/`` directory."""
    pins = pinned(SPARK_REQUIREMENTS)
    if any(_installed(name) != version for name, version in pins.items()):
        cmd = [sys.executable, "-m", "pip", "install", "-q", "-r", str(SPARK_REQUIREMENTS)]
        print(f"the Spark peer needs {', '.join(f'{n}=={v}' for n, v in pins.items())} "
              f"(a benchmark extra, not a runtime dependency); installing: {' '.join(cmd)}",
              flush=True)
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
            raise RuntimeError(f"pip could not install {SPARK_REQUIREMENTS}: {tail}")
        importlib.invalidate_caches()
        print(f"installed the Spark peer's extra in {time.perf_counter() - t0:.0f}s", flush=True)
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise RuntimeError(f"pyspark is not importable by {sys.executable}")
    return Path(spec.origin).parent / "jars"


def spark_cache() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/kafka-ingest/spark-<sha256 of spark/pom.xml and
    spark/requirements.txt, 12 hex>``."""
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    digest = hashlib.sha256(SPARK_POM.read_bytes() + SPARK_REQUIREMENTS.read_bytes())
    return Path(xdg) / "kafka-ingest" / f"spark-{digest.hexdigest()[:12]}"


def shipped_by_pyspark(artifact: str, pyspark_jars: Iterable[str]) -> bool:
    """Whether pyspark's ``jars/`` has ``artifact`` (any version): ``slf4j-api`` is in
    ``slf4j-api-2.0.17.jar``, ``commons-pool2`` is not in ``commons-pool-1.5.4.jar``."""
    pattern = re.compile(re.escape(artifact) + r"-\d[^/]*\.jar")
    return any(pattern.fullmatch(name) for name in pyspark_jars)


def fetch_spark_jars(pyspark_jars: Path) -> tuple[str, ...]:
    """The jars the Spark peer adds to pyspark's (the Kafka source, its Kafka client, the
    JDBC driver) in ``<cache>/jars``, fetched by Maven once: ``spark/pom.xml``'s runtime
    dependencies less what pyspark ships (its Hadoop client, Scala, slf4j, compression
    codecs). The marker file lists them."""

    def fetch(mvn: str, cache: Path) -> str:
        every, jars = cache / "all", cache / "jars"
        for d in (every, jars):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
        # stripVersion: <artifactId>.jar, so that pyspark's copy is recognised by name
        run_mvn([mvn, "-q", "-B", "-f", str(SPARK_POM), "dependency:copy-dependencies",
                 f"-DoutputDirectory={every}", "-Dmdep.includeScope=runtime",
                 "-Dmdep.stripVersion=true"], "the Spark peer's jars")
        theirs = [j.name for j in pyspark_jars.glob("*.jar")]
        kept = sorted(j.name for j in every.glob("*.jar")
                      if not shipped_by_pyspark(j.stem, theirs))
        for name in kept:
            (every / name).rename(jars / name)
        shutil.rmtree(every, ignore_errors=True)
        print(f"the Spark peer's jars: {', '.join(kept)} (the rest of spark/pom.xml's "
              "dependencies pyspark ships)", flush=True)
        return "\n".join(kept) + "\n"

    cache = spark_cache()
    return tuple(str(cache / "jars" / n) for n in fetch_once(cache, "Spark", fetch).split())


# --------------------------------------------------------------------------- Spark job


#: Offsets per micro-batch (the Kafka source's ``maxOffsetsPerTrigger``). availableNow reads
#: up to the end offsets seen when the query starts, in batches of at most this many. A
#: batch has a fixed cost, about 1 s here whatever its size (planning the batch's query,
#: the JDBC writer's connections, the checkpoint's offset and commit files, the staging
#: table, the merge): 20,061 messages took 2.5-3.3 s in one batch, 5.9-8.7 s in five (four
#: of 5,000). So batches are large; what bounds them is that a batch is what runs again after a
#: failure and what Postgres sorts in one statement (100,000 rows of ~150 bytes). Memory
#: does not: the tasks stream a batch's records, never hold it. The 200k-event sample is 3
#: batches (100,000, 100,000, 421), the smoke's 3,000 one.
SPARK_MAX_OFFSETS = 100_000
#: Rows per JDBC ``executeBatch`` (Spark's ``batchsize``; its default is 1,000, which
#: measured the same within the noise here: pgjdbc's reWriteBatchedInserts sends either as
#: INSERTs of up to 128 rows; 10,000 is fewer round trips per task).
SPARK_JDBC_BATCH = 10_000
#: metric_event v2's fields as Spark types (``from_json``'s explicit schema), and the column
#: where Jackson leaves a record it could not read whole.
SPARK_SCHEMA = ("event_id STRING, device_id STRING, `timestamp` DOUBLE, metric_value DOUBLE, "
                "status STRING, version INT, unit STRING, _corrupt_record STRING")
#: ``from_json``'s options (Spark's JSON defaults are lenient where the contract is not).
SPARK_JSON_OPTIONS = {
    # PERMISSIVE (the default, stated): a record Jackson cannot read, or a value of the
    # wrong type for its field ("12" for a double, 2.0 for an int, a number too large for an
    # int), is kept whole in this column instead of being read in part; it is then dropped.
    "mode": "PERMISSIVE",
    "columnNameOfCorruptRecord": "_corrupt_record",
    # NaN and Infinity literals: not JSON, and the contract refuses them (Spark accepts them
    # by default).
    "allowNonNumericNumbers": "false",
    # 'single-quoted' names and strings: not JSON (Spark accepts them by default).
    "allowSingleQuotes": "false",
}


def _text_ok(col: str, limit: int) -> str:
    """The contract's ``short_text``: 1 to ``limit`` characters, no NUL."""
    return f"char_length({col}) BETWEEN 1 AND {limit} AND NOT contains({col}, chr(0))"


def spark_rules(max_bytes: int) -> list[str]:
    """metric_event v2 (strict: no NaN or infinity, bounded texts without NUL, the version
    1-2, the timestamp an epoch in range) as Spark SQL over the Kafka record (``value``, its
    text ``json``) and the parsed fields; a row is loaded when every rule holds. The rules on
    ``value`` and ``json`` alone are applied before the parse."""
    absent = "{0} IS NULL AND NOT array_contains(json_object_keys(json), '{0}')"
    return [
        # a value (not a tombstone), within the pipeline's size limit (as the project's and
        # the other peers'), and UTF-8
        "value IS NOT NULL", f"octet_length(value) <= {max_bytes}", "is_valid_utf8(json)",
        # a JSON object that Jackson read whole, each field of its declared type
        "_corrupt_record IS NULL",
        _text_ok("event_id", 128), _text_ok("device_id", 128),
        # absent: the default ("OK", version 1); an explicit null is refused, as pydantic
        # does (Spark reads it as absent). The keys are only looked up when the field is null.
        f"({absent.format('status')} OR {_text_ok('status', 32)})",
        f"({absent.format('version')} OR version BETWEEN 1 AND 2)",
        f"(unit IS NULL OR {_text_ok('unit', 32)})",  # optional, null allowed
        # false for NaN too (Spark orders NaN above every number) and for null
        f"`timestamp` >= 0 AND `timestamp` < {bi.EPOCH_END}",
        "metric_value IS NOT NULL AND NOT isnan(metric_value)"
        " AND abs(metric_value) != double('Infinity')",  # a 400-digit number reads as inf
    ]


#: What the foreachBatch writes to the staging table: the event's fields and the record's
#: provenance; ``timestamp`` (epoch seconds) and the Kafka timestamp (epoch ms) travel as
#: numbers and Postgres converts them, as the project does (no time zone in the job).
SPARK_STAGED: tuple[str, ...] = (
    "event_id", "device_id", "`timestamp`", "metric_value",
    "coalesce(status, 'OK') AS status", "unit", "topic AS source_topic",
    "`partition` AS source_partition", "`offset` AS source_offset", "key AS kafka_key",
    "IF(unix_millis(kafka_ts) >= 0, unix_millis(kafka_ts), NULL) AS kafka_timestamp_ms",
)
#: The staging table's columns (``COLUMNS`` with the two timestamps as numbers), and how
#: each becomes the target's column.
STAGE_COLUMNS: tuple[tuple[str, str, str], ...] = tuple(
    ("timestamp", "float8", 'to_timestamp("timestamp")') if name == "timestamp" else
    ("kafka_timestamp_ms", "int8", "to_timestamp(kafka_timestamp_ms / 1000.0)")
    if name == "kafka_timestamp" else (name, pg, f'"{name}"')
    for name, pg in COLUMNS)


def stage_ddl(stage: str) -> sql.Composed:
    """An UNLOGGED staging table (no WAL: it lives for one batch) for one batch's rows."""
    columns = sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(pg))
                                 for n, pg, _ in STAGE_COLUMNS)
    return sql.SQL("CREATE UNLOGGED TABLE {} ({})").format(sql.Identifier(stage), columns)


def merge_sql(table: str, stage: str) -> sql.Composed:
    """The batch's rows into the target: one row per event id (the first by partition and
    offset), and nothing for an id already there (a duplicate from an earlier batch, or a
    batch run again)."""
    return sql.SQL(
        "INSERT INTO {} ({}) SELECT DISTINCT ON (event_id) {} FROM {}"
        " ORDER BY event_id, source_partition, source_offset ON CONFLICT (event_id) DO NOTHING"
    ).format(sql.Identifier(table), sql.SQL(", ").join(sql.Identifier(n) for n, _ in COLUMNS),
             sql.SQL(", ").join(sql.SQL(expr) for _, _, expr in STAGE_COLUMNS),
             sql.Identifier(stage))


def spark_conf(jars: Iterable[str], work: Path) -> dict[str, str]:
    """The session's settings for this job, as a careful Spark user sets them."""
    return {
        # Spark in one JVM on the same two cores the other peers have (local mode: the
        # driver runs the tasks; there is no cluster to start or to ship data to).
        "spark.master": "local[2]",
        "spark.app.name": "kafka-ingest-bench",
        # The Kafka source, its client and the JDBC driver, fetched once by Maven: nothing
        # resolved (Ivy) or fetched at start.
        "spark.jars": ",".join(jars),
        # The default heap (1g), stated because it must be set before the JVM starts: a
        # batch is streamed through the tasks row by row, never held whole.
        "spark.driver.memory": "1g",
        # No web UI and no console progress bar: nobody looks at them.
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # The job has no shuffle; should one appear, 2 partitions for 2 cores, not 200.
        "spark.sql.shuffle.partitions": "2",
        # The driver's RPC and block manager on the loopback interface only.
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        # Scratch space and the (unused) warehouse in the run's temp dir, not the repo.
        "spark.local.dir": str(work / "local"),
        "spark.sql.warehouse.dir": str(work / "warehouse"),
        # Adaptive query execution is off in streaming queries anyway (said once, it is not
        # logged as a warning at each start).
        "spark.sql.adaptive.enabled": "false",
        # No instant is turned into wall-clock time in the job; UTC all the same.
        "spark.sql.session.timeZone": "UTC",
        # pyspark's console level (WARN), to a file (spark/log4j2.properties).
        "spark.driver.extraJavaOptions":
            f"-Dlog4j2.configurationFile=file:{SPARK_DIR / 'log4j2.properties'}"
            f" -Dkafka_ingest.spark.log={work / 'spark.log'}",
    }


def kafka_source_options(bootstrap: str, topic: str, group_prefix: str) -> dict[str, str]:
    """``readStream.format("kafka")``'s options."""
    return {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": topic,
        # The whole topic from its first record (the checkpoint is new: no offsets yet).
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": str(SPARK_MAX_OFFSETS),
        # At least two tasks per batch, so that both cores parse and write even when the
        # topic has one partition (Spark splits the partition's offset range; on this
        # 2-core box, shared with Kafka and Postgres: 2.5-3.3 s against 2.6-3.9 s without,
        # 20,061 messages on one partition, within the noise).
        "minPartitions": "2",
        # failOnDataLoss (default true): offsets gone from the topic fail the query rather
        # than being skipped.
        "failOnDataLoss": "true",
        # The consumers' group ids carry the run's tag (the benchmark deletes its groups).
        "groupIdPrefix": group_prefix,
    }


def jdbc_options(dsn: str, table: str) -> dict[str, str]:
    """The JDBC writer's options for one batch's staging table."""
    pg = conninfo_to_dict(dsn)
    opts = {
        # reWriteBatchedInserts: pgjdbc sends each JDBC batch as multi-row INSERTs (as the
        # Connect sink's URL does)
        "url": f"jdbc:postgresql://{pg.get('host', '127.0.0.1')}:{pg.get('port', 5432)}/"
               f"{pg['dbname']}?reWriteBatchedInserts=true",
        "driver": "org.postgresql.Driver",
        "dbtable": table,
        "batchsize": str(SPARK_JDBC_BATCH),
        # At most one connection per core (Spark coalesces a batch with more partitions).
        "numPartitions": "2",
    }
    for key in ("user", "password"):
        if pg.get(key):
            opts[key] = str(pg[key])
    return opts


@dataclass(frozen=True)
class SparkJob:
    """One availableNow query: what it reads and where it loads it (picklable)."""

    bootstrap: str
    topic: str
    dsn: str
    table: str
    max_bytes: int
    group_prefix: str
    timeout_s: float


def valid_rows(batch: Any, max_bytes: int) -> Any:
    """A micro-batch's Kafka records -> the valid events' staging rows (Spark SQL only).

    The parse is ``inline(array(from_json(...)))``, a generator: with a plain
    ``select(from_json(...))`` Spark's optimizer pushes the filter below the projection and
    substitutes ``from_json`` into each reference, so every record is parsed twice or more
    (``explain()`` shows it; ``avoidDoubleFilterEval`` only covers UDFs); a filter on a
    generator's output stays above it."""
    from pyspark.sql import functions as F

    parsed = F.inline(F.array(F.from_json(F.col("json"), SPARK_SCHEMA, SPARK_JSON_OPTIONS)))
    return (batch.selectExpr("topic", "`partition`", "`offset`", "key", "timestamp AS kafka_ts",
                             "value", "CAST(value AS STRING) AS json")
            .select("*", parsed)
            .where(" AND ".join(f"({rule})" for rule in spark_rules(max_bytes)))
            .selectExpr(*SPARK_STAGED))


class _SparkBatchLoader:
    """``foreachBatch``: the batch's valid rows into a staging table of its own (JDBC
    write), then :func:`merge_sql` and the staging table dropped, in one transaction. A batch
    that runs again (after a failure, from the checkpoint) starts from a new staging table
    and loads nothing twice."""

    def __init__(self, job: SparkJob) -> None:
        self.job = job
        self.conn = psycopg.connect(job.dsn, autocommit=True)
        self.batches = self.inserted = 0
        self.write_s = self.merge_s = 0.0

    def __call__(self, batch: Any, batch_id: int) -> None:
        stage = f"{self.job.table}_stage_{batch_id}"
        self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(stage)))
        self.conn.execute(stage_ddl(stage))
        t0 = time.perf_counter()
        (valid_rows(batch, self.job.max_bytes).write.format("jdbc")
         .options(**jdbc_options(self.job.dsn, stage)).mode("append").save())
        t1 = time.perf_counter()
        with self.conn.transaction():
            inserted = self.conn.execute(merge_sql(self.job.table, stage)).rowcount
            self.conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(stage)))
        self.write_s += t1 - t0
        self.merge_s += time.perf_counter() - t1
        self.batches += 1
        self.inserted += inserted

    def close(self) -> None:
        self.conn.close()


def _progress(query: Any, topic: str) -> dict[str, Any]:
    """Messages read and the end offsets reached, from the query's progress reports."""
    batches = {p.batchId: p for p in query.recentProgress}
    if sorted(batches) != list(range(len(batches))):
        raise RuntimeError(f"progress of batches {sorted(batches)}: some are missing "
                           "(spark.sql.streaming.numRecentProgressUpdates)")
    last = batches[max(batches)] if batches else None
    ends = json.loads(last.sources[0].endOffset)[topic] if last else {}
    return {"events": sum(p.numInputRows for p in batches.values()),
            "end_offsets": {int(k): int(v) for k, v in ends.items()},
            "batch_s": [round(p.batchDuration / 1000, 2) for _, p in sorted(batches.items())]}


def run_spark_query(spark: Any, job: SparkJob, checkpoint: Path) -> dict[str, Any]:
    """``job``'s query, ``trigger(availableNow=True)``, until it ends; what it did."""
    loader = _SparkBatchLoader(job)
    stream = (spark.readStream.format("kafka")
              .options(**kafka_source_options(job.bootstrap, job.topic, job.group_prefix))
              .load())
    query = (stream.writeStream.foreachBatch(loader).trigger(availableNow=True)
             .option("checkpointLocation", str(checkpoint)).queryName(job.table).start())
    try:
        if not query.awaitTermination(job.timeout_s):  # raises if the query failed
            query.stop()
            raise RuntimeError(f"the query on {job.topic} is not done after {job.timeout_s}s")
    finally:
        loader.close()
    return {**_progress(query, job.topic), "batches": loader.batches, "inserted": loader.inserted,
            "jdbc_write_s": round(loader.write_s, 2), "merge_s": round(loader.merge_s, 2)}


def _jvm_cpu_s(pid: int) -> float:
    """utime + stime of the JVM (every thread), and of what it waited for (the launcher
    ``spark-submit`` ran in that process before it became the JVM)."""
    cpu = bi._proc_cpu_s(pid, children=True)
    if cpu is None:
        raise RuntimeError(f"cannot read /proc/{pid}/stat")
    return cpu


def _jvm_rss_mb(pid: int, key: str = "VmHWM") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


@contextlib.contextmanager
def spark_session(jars: tuple[str, ...], log_name: str) -> Iterator[tuple[Any, Path]]:
    """A Spark session with :func:`spark_conf` (its JVM started by pyspark) and its work dir
    (scratch space, checkpoints, log), removed at the end, the log copied to
    ``results/<log_name>.log``."""
    from pyspark.sql import SparkSession

    work = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # the JVM's own address: loopback only
    spark: Any = None
    try:
        builder: Any = SparkSession.builder
        spark = builder.config(map=spark_conf(jars, work)).getOrCreate()
        yield spark, work
    finally:
        if spark is not None:
            spark.stop()
        with contextlib.suppress(OSError):
            bi.RESULTS.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(work / "spark.log", bi.RESULTS.parent / f"{log_name}.log")
        shutil.rmtree(work, ignore_errors=True)


def child_spark(jars: tuple[str, ...], job: SparkJob, warmup: SparkJob | None,
                log_name: str) -> dict[str, Any]:
    """A Spark session (a JVM of its own, started here), ``warmup``'s query if any, then
    ``job``'s. Timed from creating the session (fresh) or from starting the measured query
    (warm) to its end; CPU is the JVM's (``/proc``) and this driver's, RSS the JVM's."""
    start_rss, jvm0 = 0.0, 0.0
    t0, c0, servers = time.perf_counter(), time.process_time(), bi.server_cpu()
    with spark_session(jars, log_name) as (spark, work):
        jvm = int(spark._jvm.java.lang.ProcessHandle.current().pid())
        detail: dict[str, Any] = {
            "session_start_s": round(time.perf_counter() - t0, 2), "spark": spark.version,
            "java": str(spark._jvm.java.lang.System.getProperty("java.version")),
            "max_offsets_per_trigger": SPARK_MAX_OFFSETS}
        if warmup is not None:
            detail["warmup"] = run_spark_query(spark, warmup, work / "checkpoint-warmup")
            start_rss, jvm0 = _jvm_rss_mb(jvm, "VmRSS"), _jvm_cpu_s(jvm)
            t0, c0, servers = time.perf_counter(), time.process_time(), bi.server_cpu()
        detail.update(run_spark_query(spark, job, work / "checkpoint"))
        secs, py_cpu = time.perf_counter() - t0, time.process_time() - c0
        jvm_cpu, spent, peak = _jvm_cpu_s(jvm) - jvm0, bi.cpu_spent(servers), _jvm_rss_mb(jvm)
    detail.update(jvm_cpu_s=round(jvm_cpu, 2), driver_cpu_s=round(py_cpu, 2),
                  driver_rss_mb=round(bi._rss_mb(), 1))
    return {"events": detail.pop("events"), "seconds": secs, "cpu_s": jvm_cpu + py_cpu,
            "start_rss_mb": start_rss, "peak_rss_mb": peak, "server_cpu_s": spent,
            "detail": detail}


# --------------------------------------------------------------------------- Spark runs


def prepare_spark(b: bi.Bench, data: PeerData) -> None:
    """pyspark (installed on first use), the jars (fetched once), and a throwaway topic of
    other events (same generator, another tag; plain JSON) for warming the session."""
    data.spark_jars = fetch_spark_jars(ensure_pyspark())
    topic = f"bench-{b.tag}-spark-warmup"
    t0 = time.perf_counter()
    made = produce_connect_topic(b.clients, (bi.BASE_PIPELINE, b.base_body), topic,
                                 count=_warm_count(b), partitions=b.args.partitions,
                                 tag=f"{b.tag}s", value_of=lambda sample: sample.value)
    print(f"produced {made['produced']:,} messages to {topic} (Spark's warm-up) in "
          f"{time.perf_counter() - t0:.1f}s", flush=True)
    data.spark_warm_topic, data.spark_warm_produced = topic, made["produced"]
    data.spark_warm_rows = made["expect"].get("row", 0)


def _spark_job(b: bi.Bench, topic: str, table: str) -> SparkJob:
    bi.make_table(b.dsn, table)
    return SparkJob(b.clients.config["bootstrap.servers"], topic, b.dsn, table, _max_bytes(b),
                    f"bench-{b.tag}-spark", _sink_timeout(b))


def _check_spark(b: bi.Bench, raw: dict[str, Any], table: str) -> None:
    """Every message read, the query at the end of the topic, the valid events once in the
    table and nothing else."""
    got, detail = raw["events"], raw["detail"]
    if got != b.produced or detail["end_offsets"] != _ends(b.target):
        raise RuntimeError(f"Spark read {got} of {b.produced} messages, up to "
                           f"{detail['end_offsets']}; expected {_ends(b.target)}")
    detail["rows"] = check_rows(b, table, b.expect.get("row", 0))
    if detail["inserted"] != detail["rows"]:
        raise RuntimeError(f"{table}: the batches inserted {detail['inserted']} rows; the "
                           f"table has {detail['rows']}")


SPARK_LABEL = "Spark Structured Streaming (foreachBatch: from_json, JDBC staging, INSERT)"


def measure_spark_fresh(b: bi.Bench, rep: int) -> bi.Measure:
    """A new Python process starts a Spark session (its JVM) and runs the query; timed from
    creating the session."""
    table = f"bench_spark_fresh_{rep}"
    job = _spark_job(b, b.source, table)
    raw = bi.collect(*bi.start_child(child_spark, b.peers.spark_jars, job, None,
                                     "spark-fresh"))
    _check_spark(b, raw, table)
    return bi.as_measure(f"{SPARK_LABEL}, fresh JVM", raw)


def measure_spark_warm(b: bi.Bench, rep: int) -> bi.Measure:
    """One session: a first query on the throwaway topic (JIT, class loading, the Kafka and
    JDBC clients warm), then the measured one, timed from its start."""
    p: PeerData = b.peers
    warm_table, table = f"bench_spark_warmup_{rep}", f"bench_spark_warm_{rep}"
    warmup = _spark_job(b, p.spark_warm_topic, warm_table)
    job = _spark_job(b, b.source, table)
    raw = bi.collect(*bi.start_child(child_spark, p.spark_jars, job, warmup, "spark-warm"))
    warm = raw["detail"]["warmup"]
    stored = bi.count_rows(b.dsn, warm_table)
    if warm["events"] != p.spark_warm_produced or stored != p.spark_warm_rows:
        raise RuntimeError(f"Spark's warm-up read {warm['events']} of {p.spark_warm_produced}"
                           f" messages and stored {stored} rows of {p.spark_warm_rows}")
    with psycopg.connect(b.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(warm_table)))
    _check_spark(b, raw, table)
    return bi.as_measure(f"{SPARK_LABEL}, warm session", raw)


# --------------------------------------------------------------------------- Python peers


def _max_bytes(b: bi.Bench) -> int:
    return bi._pipeline((bi.BASE_PIPELINE, b.base_body)).max_message_bytes


def _measure_operator(b: bi.Bench, rep: int, style: str, label: str) -> bi.Measure:
    table, group = f"bench_op_{style}_{rep}", f"bench-{b.tag}-op-{style}-{rep}"
    bi.make_table(b.dsn, table)
    raw = bi.run_child(child_operator, b.target, style, table, group, b.produced, _max_bytes(b))
    if raw["events"] != b.produced:
        raise RuntimeError(f"the operator read {raw['events']} of {b.produced} messages")
    raw["detail"]["rows"] = check_rows(b, table, b.expect.get("row", 0))
    check_committed(b, group, _ends(b.target))
    return bi.as_measure(label, raw)


def measure_operator_batch(b: bi.Bench, rep: int) -> bi.Measure:
    return _measure_operator(b, rep, "batch", "Airflow ConsumeFromTopicOperator, "
                             f"apply_function_batch + executemany ({OPERATOR_BATCH:,}/txn)")


def measure_operator_row(b: bi.Bench, rep: int) -> bi.Measure:
    return _measure_operator(b, rep, "row", "Airflow ConsumeFromTopicOperator, "
                             "apply_function per message (INSERT, autocommit)")


def measure_seeds(b: bi.Bench, rep: int) -> bi.Measure:
    cap = min(b.peers.seeds_cap, b.produced)
    table, group = f"bench_seeds_{rep}", f"bench-{b.tag}-seeds-{rep}"
    bi.make_table(b.dsn, table)
    raw = bi.run_child(child_seeds, b.target, table, group, cap, _max_bytes(b))
    last = {int(k): v for k, v in raw["detail"].pop("last_offsets").items()}
    raw["detail"]["rows"] = check_seeds(b, table, last)
    check_committed(b, group, {part: offset + 1 for part, offset in last.items()})
    return bi.as_measure(f"seeds' loop (poll + commit per message), first {cap:,} messages "
                         "only", raw)


def check_seeds(b: bi.Bench, table: str, last: dict[int, int]) -> int:
    """The table holds exactly the valid events among the messages the loop read (each
    partition's prefix up to ``last``), as the project's validate_chunk sees them."""
    pipeline = bi._pipeline((bi.BASE_PIPELINE, b.base_body))
    want: set[str] = set()
    consumer = b.clients.consumer(f"bench-{b.tag}-seedcheck")
    try:
        for p, end in last.items():
            start = b.target.ranges[p][0]
            for chunk in read_range(consumer, b.source, p, start, end + 1, chunk_size=5000):
                rows = validate_chunk(chunk.messages, pipeline).rows
                want.update(getattr(r, "values", r)[0] for r in rows)  # the event id
    finally:
        consumer.close()
    with psycopg.connect(b.dsn) as conn:
        got = {r[0] for r in conn.execute(
            sql.SQL("SELECT event_id FROM {}").format(sql.Identifier(table)))}
    if got != want:
        raise RuntimeError(f"{table}: {len(got)} rows, expected the {len(want)} valid events"
                           f" read; missing {sorted(want - got)[:3]},"
                           f" extra {sorted(got - want)[:3]}")
    return len(got)


def measure_copy(b: bi.Bench, rep: int) -> bi.Measure:
    table = f"bench_copy_{rep}"
    with psycopg.connect(b.dsn, autocommit=True) as conn:  # no key, no index: no conflicts
        conn.execute(sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS)").format(
            sql.Identifier(table), sql.Identifier(bi.TEMPLATE_TABLE)))
    raw = bi.run_child(child_copy, b.target, table, _max_bytes(b))
    stored = bi.count_rows(b.dsn, table)
    if stored != raw["events"]:
        raise RuntimeError(f"{table}: {stored} rows after COPY of {raw['events']}")
    return bi.as_measure("COPY ceiling (binary COPY, no key, COMMIT per chunk; rows)", raw)


PATHS: list[tuple[str, Any]] = [
    ("copy", measure_copy),
    ("connect_fresh", measure_connect_fresh),
    ("connect_warm", measure_connect_warm),
    ("spark_fresh", measure_spark_fresh),
    ("spark_warm", measure_spark_warm),
    ("operator_batch", measure_operator_batch),
    ("operator_row", measure_operator_row),
    ("seeds", measure_seeds),
]
