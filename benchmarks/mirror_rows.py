"""The mirror rows of ``bench_ingest.py --peers``: one table's change events, captured by
Debezium's Postgres connector, applied to a copy of the table by the project (an
``envelope: debezium`` pipeline as ``schema from-topic`` declares it) and by Debezium's JDBC
sink (``primary.key.mode=record_key``, ``delete.enabled=true``, ``insert.mode=upsert``),
each checked to leave a table equal to its source, column for column.

- **The source** (:func:`mirror_topic`, once per run): a table :data:`SOURCE_TABLE` in a
  database of its own on the stack's Postgres, captured by a new Debezium Postgres
  connector on the stack's Kafka Connect worker (``stack up --connect``; started here if it
  is not running) through ``tests/support/debezium.py``'s ``debezium_source`` (the one
  home for a captured source: role, slot, publication, connector, "caught up", cleanup).
  Then :func:`write_changes`: ``--events`` row changes, 60% inserts, then updates (30%)
  and deletes (10%) interleaved, in transactions of :data:`TXN_ROWS` rows; the connector
  streams them to one topic (one partition; JsonConverter with schemas, key and value),
  a delete as its event and a tombstone. The topic must then hold exactly the changes
  made (each statement's row count) plus a tombstone per delete.
- ``project, mirror`` (:func:`measure_mirror`): ``schema from-topic`` (the CLI) declares
  the mirror from the topic once per run; per run a pipeline of that declaration with its
  own table (``schema apply``, the CLI), group and DLQ; timed: ``plan_run`` +
  ``ingest_range`` in a spawned process, as the project row.
- ``Debezium JDBC sink, mirror, fresh JVM`` / ``warm worker``
  (:func:`measure_connect_mirror_fresh`, ``..._warm``): ``peers.connect``'s machinery (the
  benchmark's own ``ConnectStandalone``, timed until the connector's group has committed
  the end of the topic and the table holds the source's row count), the sink configured by
  ``connect/jdbc-sink-mirror.properties``, into a table made with the source's own DDL. The
  warm worker's warm-up connector reads the same topic into a throwaway table.

After each run the target table is compared with the source table (every column, as text,
ordered by key): a difference fails the row.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import yaml
from harness import (
    Bench,
    Measure,
    Target,
    as_measure,
    committed,
    cpu_spent,
    rss_mb,
    run_child,
    server_cpu,
)
from peers.common import sink_timeout, warm_count
from peers.connect import (
    CONNECT_DIR,
    ConnectWorker,
    await_sink,
    connect_worker,
    fetch_connect_jars,
    read_properties,
    remove_connector,
)
from psycopg import sql

from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.metadata import watermarks

ROOT = Path(__file__).resolve().parents[1]
SOURCE_TABLE = "accounts"
#: The source table: a key and columns of mixed types (numeric, timestamptz, jsonb, text,
#: an integer that is sometimes null).
SOURCE_DDL = ("id bigint PRIMARY KEY, owner text NOT NULL, balance numeric(14,2) NOT NULL, "
              "qty integer, changed_at timestamptz NOT NULL, profile jsonb, notes text")
COLUMNS = ("id", "owner", "balance", "qty", "changed_at", "profile", "notes")
#: The mix of row changes: inserts, then updates and deletes interleaved.
MIX = (0.6, 0.3, 0.1)
#: Rows a source transaction changes.
TXN_ROWS = 500
EVENT_TYPE = "bench_mirror"
PROJECT_MIRROR = "project, mirror (plan_run + ingest_range, envelope: debezium)"
CONNECT_FRESH = "Debezium JDBC sink, mirror, fresh JVM"
CONNECT_WARM = "Debezium JDBC sink, mirror, warm worker"
#: The target: the project's events/s at least this many times the sink's, and its process
#: CPU per event at most the sink's divided by the second figure.
TARGET = (3.0, 4.0)


@dataclass
class MirrorData:
    """The run's change-event topic, what made it, and the declaration of its mirror."""

    topic: str
    source_dsn: str
    messages: int
    changes: dict[str, int]
    rows: int
    document: dict[str, Any]
    produce_s: float
    value_mb: float
    work: Path
    cache: Path = field(default_factory=Path)

    def info(self) -> dict[str, Any]:
        """What the results' JSON says of it."""
        return {"topic_records": self.messages, "changes": self.changes,
                "source_rows": self.rows, "value_mb": round(self.value_mb, 1),
                "debezium_capture_s": round(self.produce_s, 1)}


# --------------------------------------------------------------------------- the source


def write_changes(dsn: str, events: int) -> dict[str, int]:
    """``events`` row changes on the source table (60% inserts, then updates and deletes
    interleaved), in transactions of :data:`TXN_ROWS` rows; the rows each kind changed."""
    n_ins = max(1, round(events * MIX[0]))
    n_upd = round(events * MIX[1])
    n_del = max(0, events - n_ins - n_upd)
    done = {"insert": 0, "update": 0, "delete": 0}
    table = sql.Identifier(SOURCE_TABLE)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for lo in range(1, n_ins + 1, TXN_ROWS):
            done["insert"] += conn.execute(sql.SQL(
                "INSERT INTO {} SELECT i, 'owner ' || i, (i * 37 %% 1000000) / 100.0, "
                "CASE WHEN i %% 10 = 0 THEN NULL ELSE (i %% 1000)::int END, "
                "TIMESTAMPTZ '2026-01-01 00:00:00+00' + i * INTERVAL '1.123457 second', "
                "jsonb_build_object('tier', i %% 5, 'tags', jsonb_build_array('a', i %% 7)), "
                "CASE WHEN i %% 7 = 0 THEN NULL ELSE repeat('n', (i %% 40 + 1)::int) END "
                "FROM generate_series(%s::bigint, %s::bigint) i").format(table),
                (lo, min(lo + TXN_ROWS - 1, n_ins))).rowcount
        # an update batch, then its share of deletes: some deleted rows were updated first
        batches = max(1, -(-n_upd // TXN_ROWS))
        for j in range(batches):
            ids = [k * 7 % n_ins + 1 for k in range(j * TXN_ROWS, min((j + 1) * TXN_ROWS, n_upd))]
            if ids:
                done["update"] += conn.execute(sql.SQL(
                    "UPDATE {} SET balance = balance + 1.5, qty = coalesce(qty, 0) + 1, "
                    "changed_at = changed_at + INTERVAL '1 hour', "
                    "profile = profile || jsonb_build_object('step', %s::int), "
                    "notes = 'updated' WHERE id = ANY(%s)").format(table), (j, ids)).rowcount
            ids = [k * 13 % n_ins + 1
                   for k in range(j * n_del // batches, (j + 1) * n_del // batches)]
            if ids:
                done["delete"] += conn.execute(
                    sql.SQL("DELETE FROM {} WHERE id = ANY(%s)").format(table), (ids,)).rowcount
    return done


def _topic_size(clients: KafkaClients, topic: str) -> int:
    consumer = clients.consumer(f"bench-ends-{topic}")
    try:
        low, high = watermarks(consumer, topic, [0])[0]
        return high - low
    finally:
        consumer.close()


def _value_mb(clients: KafkaClients, topic: str) -> float:
    from kafka_ingest.kafka.reader import read_range

    consumer = clients.consumer(f"bench-size-{topic}")
    size = 0
    try:
        low, high = watermarks(consumer, topic, [0])[0]
        for chunk in read_range(consumer, topic, 0, low, high, chunk_size=20_000):
            size += sum(len(m.value() or b"") for m in chunk.messages)
    finally:
        consumer.close()
    return size / 1e6


def _cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "kafka_ingest.cli", *args], env=env,
                          capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"kafka-ingest {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def _env(b: Bench, pipelines: Path | None = None) -> dict[str, str]:
    env = {**os.environ, "KAFKA_INGEST_PG_DSN": b.dsn, "KAFKA_INGEST_PG_ADMIN_DSN": b.dsn,
           "KAFKA_INGEST_PG_GRANT_TO": ""}
    if pipelines is not None:
        env["KAFKA_INGEST_PIPELINES"] = str(pipelines)
    return env


@contextlib.contextmanager
def mirror_topic(b: Bench) -> Iterator[MirrorData]:
    """The source table captured by a new Debezium connector, ``--events`` changes made and
    on Kafka, the mirror declared from the topic; all of it removed on exit."""
    import tempfile

    from kafka_ingest_dev import stack

    if str(ROOT) not in sys.path:  # the one home of a captured source is the tests' support
        sys.path.append(str(ROOT))
    from tests.support import debezium

    worker_url = stack.start_connect(report=lambda line: print(line, flush=True))
    admin_dsn = os.environ["KAFKA_INGEST_PG_ADMIN_DSN"]
    with debezium.debezium_source(worker_url, b.clients, admin_dsn,
                                  {SOURCE_TABLE: SOURCE_DDL}) as src:
        topic = src.topics[SOURCE_TABLE]
        t0 = time.perf_counter()
        changes = write_changes(src.dsn, b.args.events)
        src.caught_up(timeout_s=max(debezium.CATCH_UP_TIMEOUT_S, b.args.events / 200))
        produce_s = time.perf_counter() - t0
        messages = _topic_size(b.clients, topic)
        want = changes["insert"] + changes["update"] + 2 * changes["delete"]
        if messages != want:
            raise RuntimeError(f"{topic} holds {messages} records; the changes made "
                               f"({changes}) and a tombstone per delete are {want}")
        rows = int(src.query(sql.SQL("SELECT count(*) FROM {}").format(  # type: ignore[arg-type]
            sql.Identifier(SOURCE_TABLE)))[0][0])
        document = yaml.safe_load(_cli(_env(b), "schema", "from-topic", topic, "--event-type",
                                       EVENT_TYPE, "--pipeline", EVENT_TYPE))
        data = MirrorData(topic, src.dsn, messages, changes, rows, document, produce_s,
                          _value_mb(b.clients, topic),
                          Path(tempfile.mkdtemp(prefix="bench-mirror-")))
        print(f"mirror: {changes} on {SOURCE_TABLE} captured by Debezium to {topic}: "
              f"{messages:,} records ({data.value_mb:.0f} MB of values) in {produce_s:.1f}s; "
              f"{rows:,} rows at the source", flush=True)
        if wanted_connect(b):
            data.cache = fetch_connect_jars()
        try:
            yield data
        finally:
            import shutil

            shutil.rmtree(data.work, ignore_errors=True)


# --------------------------------------------------------------------------- the check


def _text_rows(dsn: str, table: str) -> list[tuple[str | None, ...]]:
    """Every row of ``table``, each column as Postgres prints it (UTC), ordered by key."""
    cols = sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(c)) for c in COLUMNS)
    with psycopg.connect(dsn) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        return conn.execute(sql.SQL("SELECT {} FROM {} ORDER BY id").format(
            cols, sql.Identifier(table))).fetchall()


def check_mirror(b: Bench, table: str) -> int:
    """``table`` equals the source table, every column; raise naming the first difference.
    Returns the row count."""
    mine, source = _text_rows(b.dsn, table), _text_rows(b.mirror.source_dsn, SOURCE_TABLE)
    if mine != source:
        diff = next(((m, s) for m, s in zip(mine, source, strict=False) if m != s), None)
        raise RuntimeError(f"{table}: {len(mine)} rows against the source's {len(source)}; "
                           f"first difference (mirror, source): {diff}")
    return len(mine)


# --------------------------------------------------------------------------- the project


def _declaration(b: Bench, rep: int) -> tuple[str, dict[str, Any]]:
    """``schema from-topic``'s document with the pipeline renamed for run ``rep``: its own
    table, group and DLQ; the chunk size of the bench and, as the project row, no cap on
    the records a run reads."""
    name = f"bench_mirror_{rep}"
    document = json.loads(json.dumps(b.mirror.document))
    (entry,) = document["pipelines"].values()
    entry.update(table=name, consumer_group=f"bench-{b.tag}-mirror{rep}",
                 dlq_topic=f"{b.source}-mirror-dlq", chunk_size=b.args.chunk_size,
                 max_records_per_partition=100_000_000)  # one run reads the whole topic
    document["pipelines"] = {name: entry}
    return name, document


def child_mirror(t: Target, document: dict[str, Any], name: str,
                 run_id: str) -> dict[str, Any]:
    """The project row's child on the mirror's pipeline: plan_run + ingest_range per range."""
    from project_rows import timed_run

    from kafka_ingest.config import parse_pipelines
    from kafka_ingest.db import Database

    start_rss = rss_mb()
    pipeline = parse_pipelines(document)[name]
    return timed_run(pipeline, KafkaClients(t.kafka), Database(t.dsn), run_id, start_rss)


def measure_mirror(b: Bench, rep: int) -> Measure:
    m: MirrorData = b.mirror
    name, document = _declaration(b, rep)
    pipelines = m.work / f"{name}.yaml"
    pipelines.write_text(yaml.safe_dump(document), encoding="utf-8")
    for command in (("schema", "apply", name), ("topics", "create", name)):
        _cli(_env(b, pipelines), *command)
    target = Target(b.clients.config, b.dsn, m.topic, {}, b.args.chunk_size, "")
    raw = run_child(child_mirror, target, document, name, f"bench-{b.tag}-mirror{rep}")
    detail = raw["detail"]
    if detail["read"] != m.messages or detail.get("dead_lettered", 0):
        raise RuntimeError(f"{PROJECT_MIRROR}: read {detail['read']} of {m.messages}, "
                           f"dead-lettered {detail.get('dead_lettered')}: {detail}")
    raw["detail"] = {**detail, "rows": check_mirror(b, name)}
    return as_measure(PROJECT_MIRROR, raw)


# --------------------------------------------------------------------------- the JDBC sink


def sink_config(b: Bench, name: str, table: str) -> dict[str, str]:
    from psycopg.conninfo import conninfo_to_dict

    pg = conninfo_to_dict(b.dsn)
    return read_properties(CONNECT_DIR / "jdbc-sink-mirror.properties", {
        "name": name, "topic": b.mirror.topic, "table": table,
        "host": pg.get("host", "127.0.0.1"), "port": pg.get("port", 5432),
        "dbname": pg["dbname"], "user": pg["user"], "password": pg.get("password", "")})


def make_sink_table(b: Bench, table: str) -> None:
    """The sink's target: the source's own DDL (the sink does not create it:
    ``schema.evolution=none``)."""
    with psycopg.connect(b.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} ({})").format(  # type: ignore[arg-type]
            sql.Identifier(table), sql.SQL(SOURCE_DDL)))  # type: ignore[arg-type]


def _sink_detail(b: Bench, table: str) -> dict[str, Any]:
    return {"rows": check_mirror(b, table), "value_mb": round(b.mirror.value_mb, 1)}


def measure_connect_mirror_fresh(b: Bench, rep: int) -> Measure:
    """``ConnectStandalone`` started with the sink on its command line; time to done."""
    m: MirrorData = b.mirror
    name, table = f"bench-{b.tag}-mirror-fresh{rep}", f"bench_mirror_connect_fresh_{rep}"
    make_sink_table(b, table)
    servers = server_cpu()
    with connect_worker(m.cache, b.clients.config["bootstrap.servers"], "connect-mirror-fresh",
                        sink_config(b, name, table)) as w:
        done = await_sink(b, w, name, m.topic, table, m.rows, sink_timeout(b))
        secs, cpu, peak = done - w.started, w.cpu_s(), w.rss_mb()
        spent = cpu_spent(servers)
        detail = {"jvm_rest_ready_s": round(w.ready_s or 0.0, 2)}
    detail.update(_sink_detail(b, table))
    return Measure(CONNECT_FRESH, m.messages, secs, peak, 0.0, detail, cpu, spent)


def measure_connect_mirror_warm(b: Bench, rep: int) -> Measure:
    """A long-lived worker: a first connector applies the topic's first records (as many as
    the Connect peer's warm-up topic holds: ``warm_count``) to a throwaway table (JIT, pools,
    metadata warm) and is deleted; then the measured one, from its PUT."""
    m: MirrorData = b.mirror
    warm_name, warm_table = f"bench-{b.tag}-mirror-warmup{rep}", f"bench_mirror_warmup_{rep}"
    name, table = f"bench-{b.tag}-mirror-warm{rep}", f"bench_mirror_connect_warm_{rep}"
    make_sink_table(b, warm_table)
    make_sink_table(b, table)
    with connect_worker(m.cache, b.clients.config["bootstrap.servers"],
                        "connect-mirror-warm") as w:
        w.wait_ready()
        w.rest("PUT", f"/connectors/{warm_name}/config", sink_config(b, warm_name, warm_table))
        warm = await_records(b, w, warm_name, m.topic, min(m.messages, warm_count(b)))
        remove_connector(w, warm_name)
        start_rss = w.rss_mb("VmRSS")
        c0, t0, servers = w.cpu_s(), time.perf_counter(), server_cpu()
        w.rest("PUT", f"/connectors/{name}/config", sink_config(b, name, table))
        done = await_sink(b, w, name, m.topic, table, m.rows, sink_timeout(b))
        secs, cpu, peak = done - t0, w.cpu_s() - c0, w.rss_mb()
        spent = cpu_spent(servers)
    with psycopg.connect(b.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(warm_table)))
    return Measure(CONNECT_WARM, m.messages, secs, peak, start_rss,
                   {"warmup_records": warm, **_sink_detail(b, table)}, cpu, spent)


def await_records(b: Bench, worker: ConnectWorker, name: str, topic: str, n: int) -> int:
    """Poll until the connector's group has committed at least ``n`` records of ``topic``
    (one partition); return the committed offset."""
    admin = b.clients.admin()
    deadline = time.monotonic() + sink_timeout(b)
    while (done := committed(admin, f"connect-{name}", topic, [0])[0]) < n:
        worker.check_alive()
        if trace := worker.failure(name):
            raise RuntimeError(f"connector {name} failed:\n{trace}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"connector {name}: {done} of {n} records after "
                               f"{sink_timeout(b):.0f}s{worker.tail()}")
        time.sleep(0.2)  # a poll interval: the warm-up is not timed
    return done


# --------------------------------------------------------------------------- rows, report


PATHS: list[tuple[str, Callable[[Bench, int], Measure]]] = [
    ("mirror", measure_mirror),
    ("mirror_connect_fresh", measure_connect_mirror_fresh),
    ("mirror_connect_warm", measure_connect_mirror_warm),
]
KEYS = {k for k, _ in PATHS}


def _selected(b: Bench, keys: set[str]) -> bool:
    keys = keys - set(b.args.skip)
    return bool(keys) and (b.args.only is None or bool(keys & set(b.args.only)))


def wanted(b: Bench) -> bool:
    """Whether this run measures a mirror row: with ``--peers``, or named by ``--only``."""
    return (b.args.peers or bool(set(b.args.only or ()) & KEYS)) and _selected(b, KEYS)


def wanted_connect(b: Bench) -> bool:
    return _selected(b, KEYS - {"mirror"})


def compare(results: list[Measure]) -> dict[str, Any]:
    """The project's mirror row against each JDBC sink row: events/s and process CPU per
    event, each as a ratio, against :data:`TARGET`."""
    by_path = {m.path: m for m in results}
    project = by_path.get(PROJECT_MIRROR)
    if project is None or not project.events:
        return {}
    out: dict[str, Any] = {"target": {"events_per_s": TARGET[0], "cpu_per_event": TARGET[1]}}
    for label, path in (("fresh", CONNECT_FRESH), ("warm", CONNECT_WARM)):
        peer = by_path.get(path)
        if peer is None or not peer.events or not peer.rate:
            continue
        mine, theirs = project.cpu_s / project.events * 1e6, peer.cpu_s / peer.events * 1e6
        out[label] = {"events_per_s": round(project.rate), "peer_events_per_s": round(peer.rate),
                      "rate_ratio": round(project.rate / peer.rate, 2),
                      "cpu_us_per_event": round(mine, 2),
                      "peer_cpu_us_per_event": round(theirs, 2),
                      "cpu_ratio": round(theirs / mine, 2) if mine else None}
    return out


def report(cmp: dict[str, Any], *, smoke: bool = False) -> str:
    lines = ["mirror (Debezium change events), the project against Debezium's JDBC sink"
             f" (target: {TARGET[0]:g}x the events/s, {TARGET[1]:g}x less process CPU per"
             " event)" + (" -- smoke: a check, not a measurement" if smoke else "") + ":"]
    for label in ("fresh", "warm"):
        if (c := cmp.get(label)) is None:
            continue
        met = (c["rate_ratio"] >= TARGET[0]
               and (c["cpu_ratio"] or 0) >= TARGET[1])
        lines.append(f"  vs the {label} JVM: {c['events_per_s']:,} against "
                     f"{c['peer_events_per_s']:,} events/s = {c['rate_ratio']:.2f}x; process "
                     f"CPU {c['cpu_us_per_event']:.1f} against {c['peer_cpu_us_per_event']:.1f}"
                     f" µs/event = {c['cpu_ratio']}x less; target "
                     f"{'met' if met else 'NOT met'}")
    return "\n".join(lines)
