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
- ``Airflow provider``: ``ConsumeFromTopicOperator.execute()`` with a per-message
  ``apply_function`` (validate, ``INSERT ... ON CONFLICT DO NOTHING``, autocommit) and with
  ``apply_function_batch`` (validate the batch, ``executemany``, one transaction per batch).
- ``seeds' loop``: ``poll()`` one message, validate, insert, ``commit(asynchronous=False)``;
  capped at the first ``--seeds-cap`` messages (2,000), nothing extrapolated.

Peers with no DLQ (provider, seeds) drop what the contract rejects; their tables are
checked like the others.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
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

        self.parse = get_contract(*CONTRACT).model_validate_json
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
                msg = consumer.poll(1.0)
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
                          *, count: int, partitions: int, tag: str) -> dict[str, Any]:
    """The sample ``produce_sample`` wrote (same generator, tag, seed, keys, partitions),
    each value as :func:`connect_value`; returns what to expect."""
    from kafka_ingest.kafka.topics import ensure_topics
    from kafka_ingest_dev.samples import Outgoing, produce_records, sample_stream

    ensure_topics(clients, {topic: partitions})
    expect: dict[str, int] = {}
    size = 0

    def records() -> Iterator[Outgoing]:
        nonlocal size
        for s in sample_stream(bi._pipeline(doc), count, 1, tag=tag, partitions=partitions):
            value = connect_value(s)
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


def fetch_connect_jars() -> Path:
    """Connect's jars in ``<cache>/libs``, the sink plugin in ``<cache>/plugins/...``; fetched
    by Maven once (a marker file says the fetch finished)."""
    cache = connect_cache()
    marker = cache / ".complete"
    if marker.is_file():
        return cache
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError("the Kafka Connect peer needs Maven (apt-get install maven)")
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file():
            return cache
        t0 = time.perf_counter()
        for profile, out in (("worker", cache / "libs"),
                             ("plugin", cache / "plugins" / "debezium-connector-jdbc")):
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            cmd = [mvn, "-q", "-B", "-f", str(POM), "-P", profile,
                   "dependency:copy-dependencies", f"-DoutputDirectory={out}",
                   "-Dmdep.includeScope=runtime"]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
                raise RuntimeError(f"mvn could not fetch the {profile} jars: {tail}")
        marker.write_text(POM.read_text(encoding="utf-8"), encoding="utf-8")
        print(f"fetched Kafka Connect and the Debezium JDBC sink into {cache} in "
              f"{time.perf_counter() - t0:.0f}s", flush=True)
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
        conn.execute(sql.SQL(CONNECT_TABLE).format(sql.Identifier(name)))  # type: ignore[arg-type]


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


@dataclass
class PeerData:
    """What the peers share in one run: the jars and the Connect topics."""

    cache: Path
    connect_topic: str
    connect_produced: int
    connect_value_mb: float
    warm_topic: str
    warm_rows: int
    seeds_cap: int


def prepare(b: bi.Bench) -> PeerData:
    """Fetch the jars (once), produce the Connect topics: the measured one (same sample) and
    a throwaway one for warming the long-lived worker."""
    cache = fetch_connect_jars()
    doc = (bi.BASE_PIPELINE, b.base_body)
    topic, warm = f"bench-{b.tag}-connect", f"bench-{b.tag}-connect-warmup"
    t0 = time.perf_counter()
    data = produce_connect_topic(b.clients, doc, topic, count=b.args.events,
                                 partitions=b.args.partitions, tag=b.tag)
    if data["produced"] != b.produced or data["expect"] != b.expect:
        raise RuntimeError(f"the Connect topic differs from the sample: {data} vs "
                           f"{b.produced} {b.expect}")
    warm_n = max(1000, min(b.args.events // 2, 50_000))
    warm_data = produce_connect_topic(b.clients, doc, warm, count=warm_n,
                                      partitions=b.args.partitions, tag=f"{b.tag}w")
    print(f"produced the same sample in JsonConverter's envelope to {topic} "
          f"({data['value_mb']:.0f} MB of values) and {warm_data['produced']:,} to {warm} in "
          f"{time.perf_counter() - t0:.1f}s", flush=True)
    cap = b.args.seeds_cap or SEEDS_CAP
    return PeerData(cache, topic, data["produced"], data["value_mb"], warm,
                    warm_data["expect"].get("row", 0), cap)


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
    ("operator_batch", measure_operator_batch),
    ("operator_row", measure_operator_row),
    ("seeds", measure_seeds),
]
