"""Real Debezium for the mirror's tests: a source database in the stack's Postgres, captured
by Debezium's Postgres connector on the stack's Kafka Connect worker (``stack up --connect``).

:func:`debezium_source` (the ``debezium_source`` fixture in ``tests/conftest.py``) makes,
per test:

- a database ``dbz_<hex>`` owned by a role of the same name that may replicate
  (``LOGIN REPLICATION``, made by the stack's superuser), with the given tables and a
  marker table (:data:`MARKER`);
- a connector ``dbz-<hex>`` (``plugin.name=pgoutput``, ``topic.prefix`` ``dbz_<hex>``, its
  own slot and publication, ``snapshot.mode=initial`` then streaming,
  ``skipped.operations=none`` so truncates are emitted, one partition per table topic);

waits until the snapshot is on Kafka, yields a :class:`DebeziumSource`, and on teardown
deletes the connector, then drops the slot, the database (with its publication), the role
and the topics.

**How "caught up" is known** (:meth:`DebeziumSource.caught_up`): a row with a fresh token
goes into the marker table (after whatever the test wrote), and the wait is over once (1)
that row's change event is on the marker's topic (the connector streams the WAL in commit
order, so it has sent everything committed before) and (2) the slot's
``confirmed_flush_lsn`` has passed that event's LSN: Connect stores a source offset only
once every record before it was acknowledged by Kafka, and Debezium confirms to Postgres,
at each store, the commit position of the transaction before the stored record's, so
records sent to other topics before the marker are on Kafka too. That position passes the
marker only with a record after it, so a second marker follows the first as soon as the
first is seen. The marker table is left out of the snapshot
(``snapshot.include.collection.list``): a token is only ever streamed; one inserted before
the slot existed (the very first wait) is never seen, so a new token goes in every
:data:`MARKER_RETRY_S` until one arrives.

Deadlines follow the worker's and the connector's configured intervals (the worker's
offset flush, Debezium's poll interval, the marker's retry), with a margin for a loaded
machine; the first snapshot also waits for the connector's start (:data:`SNAPSHOT_TIMEOUT_S`).
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from kafka_ingest.config import Format
from kafka_ingest.decode.codecs import PayloadReader, codec_for
from kafka_ingest.decode.codecs.wire import HEADER_SIZE
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.metadata import topic_partitions, watermarks
from kafka_ingest.kafka.reader import read_range
from kafka_ingest.kafka.registry import RegistrySettings, SchemaRegistry
from kafka_ingest_dev import kafka_connect, stack
from kafka_ingest_dev.stack import postgres as stack_postgres
from tests.support.topics import delete_topics

#: The table whose rows say "everything before me is on Kafka" (see the module's docstring).
MARKER = "kafka_ingest_marker"
#: Debezium's placeholder for a TOASTed value an UPDATE did not change (REPLICA IDENTITY
#: DEFAULT: the old tuple holds only the key, the new one points at TOAST it did not rewrite).
UNAVAILABLE = "__debezium_unavailable_value"

#: Intervals the waits are built from: the worker's ``offset.flush.interval.ms``,
#: Debezium's ``poll.interval.ms`` (set below), and how often a new marker token is written
#: while none arrives.
OFFSET_FLUSH_S = kafka_connect.OFFSET_FLUSH_INTERVAL_S
POLL_INTERVAL_S = 0.2
MARKER_RETRY_S = 2.0
#: One catch-up: a marker's trip (poll, produce, read) and two offset flushes, twenty times
#: over for a loaded 2-core machine.
CATCH_UP_TIMEOUT_S = 20 * (POLL_INTERVAL_S + 2 * OFFSET_FLUSH_S + MARKER_RETRY_S)
#: The first snapshot: the connector's and its task's start (slot, publication, snapshot
#: transaction), bounded like the worker's own start, then a catch-up.
SNAPSHOT_TIMEOUT_S = kafka_connect.START_TIMEOUT_S + CATCH_UP_TIMEOUT_S
#: How often a wait looks again: Debezium's poll interval (nothing new reaches Kafka sooner).
_POLL_S = POLL_INTERVAL_S
#: How often a wait asks the worker whether the connector failed (a failure is reported
#: within this, with its trace).
_STATUS_EVERY_S = 1.0


@dataclass(frozen=True)
class ChangeEvent:
    """One record of a table's topic: its offset, key and value as JsonConverter wrote
    them (``{"schema": ..., "payload": ...}``; ``value`` None for a tombstone)."""

    offset: int
    key: dict[str, Any] | None
    value: dict[str, Any] | None

    @property
    def tombstone(self) -> bool:
        return self.value is None

    @property
    def op(self) -> str | None:
        """``r`` snapshot, ``c`` insert, ``u`` update, ``d`` delete, ``t`` truncate; None
        for a tombstone."""
        return None if self.value is None else self.value["payload"]["op"]

    @property
    def payload(self) -> dict[str, Any]:
        assert self.value is not None, f"offset {self.offset} is a tombstone"
        return self.value["payload"]

    @property
    def after(self) -> dict[str, Any] | None:
        return self.payload["after"]

    @property
    def before(self) -> dict[str, Any] | None:
        return self.payload["before"]

    @property
    def key_payload(self) -> dict[str, Any] | None:
        return None if self.key is None else self.key["payload"]

    def row_fields(self) -> list[str]:
        """The field names of the row struct (``after``'s schema) this event carries."""
        assert self.value is not None
        for part in self.value["schema"]["fields"]:
            if part["field"] == "after":
                return [f["field"] for f in part["fields"]]
        raise AssertionError(f"no 'after' in the schema of offset {self.offset}")


class _Decoder:
    """A topic's keys and values as :class:`ChangeEvent` takes them: JsonConverter's as
    they are; with ``registry_url`` (a Confluent-compatible API), a value in the wire format
    (a Connect converter of the registry's, :func:`kafka_connect.registry_converter`)
    decoded by its writer schema through the Avro codec, as ``{"schema": the Connect
    schema it stands for, "payload": the record}``."""

    def __init__(self, registry_url: str | None) -> None:
        self.codec = codec_for(Format.AVRO)
        self.registry = (SchemaRegistry(RegistrySettings({"url": registry_url}))
                         if registry_url else None)
        self._readers: dict[int, tuple[PayloadReader, dict[str, Any] | None]] = {}

    def __call__(self, raw: bytes | None) -> dict[str, Any] | None:
        if raw is None:
            return None
        schema_id = self.codec.schema_id(raw) if self.registry is not None else None
        if schema_id is None:
            return dict(json.loads(raw))
        if schema_id not in self._readers:
            assert self.registry is not None
            schema = self.codec.schema(self.registry, schema_id)
            assert schema is not None, f"schema id {schema_id} is not registered"
            self._readers[schema_id] = (self.codec.reader(schema),
                                        self.codec.connect_schema(schema))
        read, connect = self._readers[schema_id]
        return {"schema": connect, "payload": read(raw, HEADER_SIZE)}

    def close(self) -> None:
        if self.registry is not None:
            self.registry.close()


@dataclass
class DebeziumSource:
    """A source database captured by a running connector, and what a test reads of it."""

    name: str
    dsn: str
    connector: str
    topic_prefix: str
    slot: str
    publication: str
    worker_url: str
    clients: KafkaClients
    #: Table name -> its change-event topic (``<prefix>.public.<table>``).
    topics: dict[str, str]
    #: The registry the connector writes Avro to (None: JsonConverter with its schema).
    registry_url: str | None = None
    #: How far :meth:`next_events` has read each topic.
    _read_to: dict[str, int] = field(default_factory=dict)
    #: What the waits poll with, made once (:meth:`close`): a consumer that assigns, a
    #: session on the source (autocommit: it holds no lock between statements).
    _consumer: Any = None
    _session: psycopg.Connection[Any] | None = None
    _status_checked_at: float = -_STATUS_EVERY_S

    def __post_init__(self) -> None:
        self.decode = _Decoder(self.registry_url)

    def close(self) -> None:
        """Close what the waits polled with (before the source database is dropped)."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._session is not None:
            self._session.close()
            self._session = None

    # ----------------------------------------------------------------------- the source

    def execute(self, statement: str, params: Sequence[Any] | None = None) -> None:
        """Run one statement on the source (autocommit, as the tables' owner)."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(statement, params)  # type: ignore[arg-type]

    def query(self, statement: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        """Rows of one statement on the source, on the session the waits poll with."""
        if self._session is None or self._session.closed:
            self._session = psycopg.connect(self.dsn, autocommit=True)
        return self._session.execute(statement, params).fetchall()  # type: ignore[arg-type]

    def current_lsn(self) -> str:
        return str(self.query("SELECT pg_current_wal_lsn()")[0][0])

    # ----------------------------------------------------------------------- Kafka

    def events(self, table: str, start: int = 0) -> list[ChangeEvent]:
        """Every record of ``table``'s topic from offset ``start`` to its end now."""
        topic = self.topics[table]
        if self._consumer is None:
            self._consumer = self.clients.consumer(f"test-dbz-{uuid.uuid4().hex[:8]}")
        consumer = self._consumer
        try:
            low, high = watermarks(consumer, topic, [0])[0]
        except Exception:  # the topic is made by the connector's first record
            return []
        out: list[ChangeEvent] = []
        for chunk in read_range(consumer, topic, 0, max(low, start), high, chunk_size=500):
            out.extend(ChangeEvent(m.offset(), self.decode(m.key()), self.decode(m.value()))
                       for m in chunk.messages)
        return out

    def next_events(self, table: str, n: int, *, wait: bool = True,
                    timeout_s: float = CATCH_UP_TIMEOUT_S) -> list[ChangeEvent]:
        """The ``n`` records of ``table``'s topic after those an earlier call returned,
        waiting for them (a deadline of ``timeout_s``); raises if there are more. After
        :meth:`caught_up` everything is there already: ``wait=False`` fails at once when
        fewer are."""
        start = self._read_to.get(table, 0)
        deadline = time.monotonic() + (timeout_s if wait else 0.0)
        while len(found := self.events(table, start)) < n:
            self._check_running()
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.topics[table]}: {len(found)} records after "
                                     f"offset {start} within {timeout_s:.0f} s, not {n}: "
                                     f"{[(e.offset, e.op) for e in found]}")
            time.sleep(_POLL_S)
        if len(found) > n:
            raise AssertionError(f"{self.topics[table]}: {len(found)} records after offset "
                                 f"{start}, not {n}: {[(e.offset, e.op) for e in found]}")
        self._read_to[table] = found[-1].offset + 1
        return found

    def skip_to_end(self, table: str) -> None:
        """Start the next :meth:`next_events` after what the topic holds now."""
        found = self.events(table, self._read_to.get(table, 0))
        if found:
            self._read_to[table] = found[-1].offset + 1

    def caught_up(self, *, timeout_s: float = CATCH_UP_TIMEOUT_S) -> None:
        """Wait until every change committed on the source so far is on Kafka (see the
        module's docstring: a marker row, then the slot's confirmed LSN past it)."""
        deadline = time.monotonic() + timeout_s
        tokens: set[str] = set()
        next_token = 0.0
        lsn: int | None = None
        flushed = -1
        while lsn is None or (flushed := self._confirmed_flush()) < lsn:
            if lsn is None and (lsn := self._marker_lsn(tokens)) is not None:
                next_token = 0.0  # the follow-up marker, now: see _write_marker
            if time.monotonic() >= next_token:
                tokens.add(self._write_marker())
                next_token = time.monotonic() + MARKER_RETRY_S
            what = (f"a marker on {self.topics[MARKER]}" if lsn is None
                    else f"slot {self.slot} confirmed {flushed}, marker at {lsn}")
            self._wait_a_poll(deadline, timeout_s, what)
        self.skip_to_end(MARKER)

    def _write_marker(self) -> str:
        """A marker row with a fresh token, in a transaction of its own. Debezium confirms
        the commit position of the last transaction *before* the latest record whose offset
        Connect stored, so the slot passes a marker's position only once a later record
        (the next marker) was sent and acknowledged: a marker seen on Kafka is followed by
        one more."""
        token = uuid.uuid4().hex
        self.execute(f"INSERT INTO {MARKER} (token) VALUES (%s)", (token,))
        return token

    def _marker_lsn(self, tokens: set[str]) -> int | None:
        for event in self.events(MARKER, self._read_to.get(MARKER, 0)):
            if event.op == "c" and (event.after or {}).get("token") in tokens:
                return int(event.payload["source"]["lsn"])
        return None

    def _confirmed_flush(self) -> int:
        rows = self.query("SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots "
                          "WHERE slot_name = %s", (self.slot,))
        return int(rows[0][0]) if rows and rows[0][0] is not None else -1

    def _wait_a_poll(self, deadline: float, timeout_s: float, what: str) -> None:
        self._check_running()
        if time.monotonic() > deadline:
            raise AssertionError(f"connector {self.connector} not caught up within "
                                 f"{timeout_s:.0f} s: {what}")
        time.sleep(_POLL_S)

    def _check_running(self) -> None:
        """Fail, with its trace, if the connector or its task failed (asked once every
        :data:`_STATUS_EVERY_S` of a wait)."""
        if time.monotonic() - self._status_checked_at < _STATUS_EVERY_S:
            return
        self._status_checked_at = time.monotonic()
        status, body = kafka_connect.request(
            "GET", f"{self.worker_url}/connectors/{self.connector}/status")
        if status != 200:
            raise AssertionError(f"connector {self.connector}: HTTP {status} {body}")
        for part in [body.get("connector", {}), *body.get("tasks", [])]:
            if part.get("state") == "FAILED":
                raise AssertionError(f"connector {self.connector} failed: "
                                     f"{str(part.get('trace'))[:3000]}")


# --------------------------------------------------------------------------- setup


def connector_config(src: DebeziumSource, tables: Sequence[str]) -> dict[str, str]:
    """Debezium's Postgres source for ``tables`` (and the marker) of ``src``."""
    pg = conninfo_to_dict(src.dsn)
    captured = [f"public.{t}" for t in tables]
    return {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "plugin.name": "pgoutput",
        "database.hostname": str(pg.get("host", "127.0.0.1")),
        "database.port": str(pg.get("port", 5432)),
        "database.user": str(pg["user"]),
        "database.password": str(pg["password"]),
        "database.dbname": str(pg["dbname"]),
        "topic.prefix": src.topic_prefix,
        "slot.name": src.slot,
        "publication.name": src.publication,
        # The publication names the captured tables only (the connector makes it).
        "publication.autocreate.mode": "filtered",
        "table.include.list": ",".join([*captured, f"public.{MARKER}"]),
        "snapshot.mode": "initial",
        "snapshot.include.collection.list": ",".join(captured),
        # Truncates are emitted (op t); Debezium skips them unless told otherwise.
        "skipped.operations": "none",
        "poll.interval.ms": str(int(POLL_INTERVAL_S * 1000)),
        "topic.creation.default.replication.factor": "-1",
        "topic.creation.default.partitions": "1",
        **(kafka_connect.registry_converter(src.registry_url) if src.registry_url else {}),
    }


def _superuser() -> Any:
    """The stack's superuser over Postgres' private socket (roles with REPLICATION need it)."""
    settings = stack.settings()
    return stack_postgres.admin(stack.primary_node(settings))


def _create_source(admin_dsn: str, name: str, tables: Mapping[str, str],
                   setup: Sequence[str]) -> str:
    """The role and database ``name`` with ``tables`` and the marker; ``setup`` run after
    them (rows the snapshot should carry, REPLICA IDENTITY, ...); returns the role's DSN."""
    password = uuid.uuid4().hex
    ident = sql.Identifier(name)
    with _superuser() as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN REPLICATION PASSWORD {}").format(
            ident, sql.Literal(password)))
        conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(ident, ident))
    dsn = make_conninfo(admin_dsn, dbname=name, user=name, password=password)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table, columns in {**tables, MARKER: "token text PRIMARY KEY"}.items():
            conn.execute(sql.SQL("CREATE TABLE {} ({})").format(  # type: ignore[arg-type]
                sql.Identifier(table), sql.SQL(columns)))  # type: ignore[arg-type]
        for statement in setup:
            conn.execute(statement)  # type: ignore[arg-type]
    return dsn


def _drop_source(name: str, slot: str) -> None:
    """Drop the slot (once no walsender holds it), the database and the role."""
    ident = sql.Identifier(name)
    with _superuser() as conn:
        deadline = time.monotonic() + kafka_connect.START_TIMEOUT_S
        while True:
            row = conn.execute("SELECT active_pid FROM pg_replication_slots "
                               "WHERE slot_name = %s", (slot,)).fetchone()
            if row is None:
                break
            if row[0] is None:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                break
            if time.monotonic() > deadline:  # a stuck walsender: end it, then drop
                conn.execute("SELECT pg_terminate_backend(%s)", (row[0],))
            time.sleep(_POLL_S)
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(ident))


def _delete_connector(worker_url: str, connector: str) -> None:
    """DELETE it and wait until the worker no longer lists it (its task stopped, so the
    slot is free)."""
    url = f"{worker_url}/connectors/{connector}"
    kafka_connect.request("DELETE", url)
    deadline = time.monotonic() + kafka_connect.START_TIMEOUT_S
    while kafka_connect.request("GET", url)[0] != 404 and time.monotonic() < deadline:
        time.sleep(_POLL_S)


def _delete_topics(clients: KafkaClients, prefix: str) -> None:
    names = topic_partitions(clients.admin(), timeout_s=10)
    delete_topics(clients, (t for t in names if t.startswith(f"{prefix}.")))


def _delete_subjects(registry_url: str | None, prefix: str) -> None:
    """The subjects the converter registered for the topics of ``prefix`` (best effort)."""
    if registry_url is None:
        return
    with contextlib.suppress(httpx.HTTPError, ValueError):
        subjects = httpx.get(f"{registry_url}/subjects", timeout=30).json()
        for subject in (s for s in subjects if s.startswith(f"{prefix}.")):
            for permanent in ("false", "true"):  # soft first, as the API asks
                httpx.delete(f"{registry_url}/subjects/{subject}",
                             params={"permanent": permanent}, timeout=30)


@contextlib.contextmanager
def debezium_source(worker_url: str, clients: KafkaClients, admin_dsn: str,
                    tables: Mapping[str, str], *, setup: Sequence[str] = (),
                    snapshot_timeout_s: float = SNAPSHOT_TIMEOUT_S,
                    registry_url: str | None = None) -> Iterator[DebeziumSource]:
    """A source database with ``tables`` (name -> column definitions), ``setup`` run on it,
    captured by a new connector (its keys and values in JsonConverter's JSON with their
    schema, or with ``registry_url``, Avro through Apicurio's converter); yielded once the
    snapshot is on Kafka; all of it removed afterwards."""
    name = f"dbz_{uuid.uuid4().hex[:12]}"
    dsn = _create_source(admin_dsn, name, tables, setup)
    src = DebeziumSource(
        name=name, dsn=dsn, connector=name.replace("_", "-"), topic_prefix=name,
        slot=name, publication=name, worker_url=worker_url, clients=clients,
        topics={t: f"{name}.public.{t}" for t in [*tables, MARKER]}, registry_url=registry_url)
    try:
        status, body = kafka_connect.request(
            "PUT", f"{worker_url}/connectors/{src.connector}/config",
            connector_config(src, list(tables)))
        if status not in (200, 201):
            raise AssertionError(f"Connect refused connector {src.connector}: HTTP {status} "
                                 f"{body}")
        try:
            src.caught_up(timeout_s=snapshot_timeout_s)
            yield src
        finally:
            _delete_connector(worker_url, src.connector)
    finally:
        src.decode.close()
        src.close()
        _drop_source(name, src.slot)
        _delete_topics(clients, name)
        _delete_subjects(registry_url, name)


#: What the ``debezium_source`` fixture hands a test: ``make(tables, setup=...)``.
MakeSource = Callable[..., DebeziumSource]
