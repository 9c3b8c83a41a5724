"""``Kafka Connect + Debezium JDBC sink``: the sample in JsonConverter's envelope, loaded by
``ConnectStandalone`` with the Debezium JDBC sink, in a fresh JVM (the time includes
starting Connect) and in a warm worker (a first connector on a throwaway topic, then the
measured one, both through the REST API). The jars are fetched once by Maven, through the
dev stack's one home for Connect's jars (``kafka_ingest_dev.kafka_connect.fetch_jars``:
the worker and the Debezium plugins, the JDBC sink among them); the worker and sink
settings for the benchmark are ``connect/worker.properties`` and
``connect/jdbc-sink.properties``. What the converter rejects, Connect dead-letters (its
DLQ topic, with the ``__connect.errors.*`` headers), which the check counts.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from harness import (
    BASE_PIPELINE,
    RESULTS,
    Bench,
    Measure,
    check_rows,
    committed,
    count_rows,
    cpu_spent,
    expected_dead,
    proc_cpu_s,
    proc_rss_mb,
    server_cpu,
)
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.metadata import partitions_of, watermarks
from kafka_ingest.kafka.reader import read_range
from kafka_ingest_dev import kafka_connect
from kafka_ingest_dev.procs import free_ports
from peers.common import PeerData, produce_topic, sink_timeout, warm_count

CONNECT_DIR = Path(__file__).resolve().parents[1] / "connect"
#: The pom the jars come from (the dev stack's: one home for Connect's jars).
POM = kafka_connect.POM
#: What ``ConnectStandalone`` gets from ``connect-standalone.sh`` / ``kafka-run-class.sh``.
CONNECT_JVM = [
    "-Xms256M", "-Xmx2G", "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15", "-Djava.awt.headless=true",
]  # fmt: skip

KEYS = {"connect_fresh", "connect_warm"}


# --------------------------------------------------------------------------- the topic


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


# --------------------------------------------------------------------------- the jars


def connect_cache() -> Path:
    """Where :func:`fetch_connect_jars` puts them (named after the pom that lists them)."""
    return kafka_connect.cache_dir()


def fetch_connect_jars() -> Path:
    """Connect's jars in ``<cache>/libs``, each plugin (the JDBC sink among them) in
    ``<cache>/plugins/<name>``; fetched by Maven once, shared with the dev stack's worker."""
    return kafka_connect.fetch_jars()


# --------------------------------------------------------------------------- the worker


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


class ConnectWorker:
    """One ``ConnectStandalone`` JVM (started here, stopped by its pid), its REST API and
    its resource use from ``/proc``."""

    def __init__(self, cache: Path, bootstrap: str, connector: dict[str, str] | None = None):
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("the Kafka Connect peer needs Java 17+")
        self.work = Path(tempfile.mkdtemp(prefix="bench-connect-"))
        self.port = free_ports(1)[0]
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
        """utime + stime of the JVM (every thread), in seconds."""
        return proc_cpu_s(self.proc.pid, children=False) or 0.0

    def rss_mb(self, key: str = "VmHWM") -> float:
        return proc_rss_mb(self.proc.pid, key) or 0.0

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
            RESULTS.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.log, RESULTS.parent / f"{log_name}.log")
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


# --------------------------------------------------------------------------- the runs


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


def remove_connector(worker: ConnectWorker, name: str, timeout_s: float = 30) -> None:
    """Delete a connector and wait until the worker no longer lists it (its task stopped),
    polling at a sink's poll interval."""
    worker.rest("DELETE", f"/connectors/{name}")
    deadline = time.monotonic() + timeout_s
    while name in worker.rest("GET", "/connectors") and time.monotonic() < deadline:
        time.sleep(0.05)


def make_connect_table(dsn: str, name: str) -> None:
    """The target table as the record's schema types it (the event's ``timestamp`` stays a
    double: Connect has no SMT for float epoch seconds), plus the provenance columns."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(CONNECT_TABLE).format(sql.Identifier(name)))


def sink_config(b: Bench, name: str, topic: str, table: str, dlq: str) -> dict[str, str]:
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


def await_sink(b: Bench, worker: ConnectWorker, name: str, topic: str, table: str,
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
            rows = count_rows(b.dsn, table)
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


def count_dlq(b: Bench, dlq: str, want: int, timeout_s: float = 30) -> dict[str, int]:
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


def prepare(b: Bench, data: PeerData) -> None:
    """Fetch the jars (once), produce the Connect topics: the measured one (same sample) and
    a throwaway one for warming the long-lived worker."""
    data.cache = fetch_connect_jars()
    doc = (BASE_PIPELINE, b.base_body)
    topic, warm = f"bench-{b.tag}-connect", f"bench-{b.tag}-connect-warmup"
    t0 = time.perf_counter()
    made = produce_topic(b.clients, doc, topic, count=b.args.events,
                         partitions=b.args.partitions, tag=b.tag, value_of=connect_value)
    if made["produced"] != b.produced or made["expect"] != b.expect:
        raise RuntimeError(f"the Connect topic differs from the sample: {made} vs "
                           f"{b.produced} {b.expect}")
    warm_data = produce_topic(b.clients, doc, warm, count=warm_count(b),
                              partitions=b.args.partitions, tag=f"{b.tag}w",
                              value_of=connect_value)
    print(f"produced the same sample in JsonConverter's envelope to {topic} "
          f"({made['value_mb']:.0f} MB of values) and {warm_data['produced']:,} to {warm} in "
          f"{time.perf_counter() - t0:.1f}s", flush=True)
    data.connect_topic, data.connect_produced = topic, made["produced"]
    data.connect_value_mb = made["value_mb"]
    data.warm_topic, data.warm_rows = warm, warm_data["expect"].get("row", 0)


def _check_connect(b: Bench, table: str, dlq: str) -> dict[str, Any]:
    rows = check_rows(b, table, b.expect.get("row", 0))
    dead = count_dlq(b, dlq, expected_dead(b.expect))
    if dead["records"] != expected_dead(b.expect) or dead["with_error_headers"] != dead["records"]:
        raise RuntimeError(f"Connect's DLQ {dlq}: {dead}; expected {expected_dead(b.expect)} "
                           "records, each with __connect.errors.* headers")
    return {"rows": rows, "dead_lettered": dead["records"],
            "topic_value_mb": round(b.peers.connect_value_mb, 1)}


def measure_connect_fresh(b: Bench, rep: int) -> Measure:
    """Start ConnectStandalone with the connector on its command line; time to done."""
    p: PeerData = b.peers
    name, table = f"bench-{b.tag}-fresh{rep}", f"bench_connect_fresh_{rep}"
    dlq = f"bench-{b.tag}-connect-dlq-fresh{rep}"
    make_connect_table(b.dsn, table)
    config = sink_config(b, name, p.connect_topic, table, dlq)
    servers = server_cpu()
    with connect_worker(p.cache, b.clients.config["bootstrap.servers"], "connect-fresh",
                        config) as w:
        done = await_sink(b, w, name, p.connect_topic, table, b.expect.get("row", 0),
                          sink_timeout(b))
        secs, cpu, peak = done - w.started, w.cpu_s(), w.rss_mb()
        spent = cpu_spent(servers)
        detail = {"jvm_rest_ready_s": round(w.ready_s or 0.0, 2)}
    detail.update(_check_connect(b, table, dlq))
    return Measure("Kafka Connect + Debezium JDBC sink, fresh JVM", p.connect_produced,
                      secs, peak, 0.0, detail, cpu, spent)


def measure_connect_warm(b: Bench, rep: int) -> Measure:
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
        await_sink(b, w, warm_name, p.warm_topic, warm_table, p.warm_rows, sink_timeout(b))
        remove_connector(w, warm_name)
        start_rss = w.rss_mb("VmRSS")
        c0, t0, servers = w.cpu_s(), time.perf_counter(), server_cpu()
        w.rest("PUT", f"/connectors/{name}/config",
                sink_config(b, name, p.connect_topic, table, dlq))
        done = await_sink(b, w, name, p.connect_topic, table, b.expect.get("row", 0),
                          sink_timeout(b))
        secs, cpu, peak = done - t0, w.cpu_s() - c0, w.rss_mb()
        spent = cpu_spent(servers)
    with psycopg.connect(b.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(warm_table)))
    detail = {"warmup_rows": p.warm_rows, **_check_connect(b, table, dlq)}
    return Measure("Kafka Connect + Debezium JDBC sink, warm worker", p.connect_produced,
                      secs, peak, start_rss, detail, cpu, spent)
