"""Shared fixtures: the real local stack, a fresh database per test, random topics.

Unit tests (tests/unit) use none of these and need no service. Everything else runs
against the real Kafka broker and Postgres started by ``kafka_ingest_dev.stack``.

``KAFKA_INGEST_TEST_BURN_CPU=N`` (``make test-busy``: 1) keeps N cores busy for the whole
session, so the suite also runs on a loaded machine on purpose.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kafka_ingest_dev.databases import fresh_database
from tests.support import ROOT, background, workers
from tests.support.pipelines import declarations
from tests.support.topics import delete_topics

sys.path.insert(0, str(ROOT / "plugins"))

BURN_CPU_ENV = "KAFKA_INGEST_TEST_BURN_CPU"
#: A busy loop on one core. It asks the kernel for SIGKILL when its parent dies (Linux's
#: PR_SET_PDEATHSIG), so it goes with pytest even when pytest is SIGKILLed, and leaves at
#: once if pytest was gone before it asked. Nice as pytest: it competes with the tests.
_BURNER = """\
import ctypes, os, signal, sys
PR_SET_PDEATHSIG = 1
if sys.platform == "linux":
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
if os.getppid() != int(sys.argv[1]):
    sys.exit()
while True:
    pass
"""
_BURNERS = pytest.StashKey[list[subprocess.Popen[bytes]]]()


def _cores_to_burn() -> int:
    raw = os.environ.get(BURN_CPU_ENV, "").strip() or "0"
    if not raw.isdigit():
        raise pytest.UsageError(f"{BURN_CPU_ENV}={raw!r}: say how many cores to keep busy")
    return int(raw)


def _stop_burners(burners: list[subprocess.Popen[bytes]]) -> None:
    for burner in burners:
        if burner.poll() is None:
            burner.kill()
    for burner in burners:
        with contextlib.suppress(subprocess.TimeoutExpired):
            burner.wait(10)


def pytest_configure(config: pytest.Config) -> None:
    """Start the CPU burners (``KAFKA_INGEST_TEST_BURN_CPU``) for the session; the session
    owns them: ``pytest_unconfigure`` (also after Ctrl-C) and ``atexit`` kill them, the
    kernel does when pytest is killed. Started from the main thread, which lives as long as
    pytest: the parent-death signal follows the thread that forked."""
    workers.configure_controller(config)
    workers.configure_worker(config)
    if not workers.is_worker(config):
        background.configure()
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistHooks(), "kafka-ingest-xdist")
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: its controller burns
        return
    burners = [subprocess.Popen([sys.executable, "-c", _BURNER, str(os.getpid())],
                                stdin=subprocess.DEVNULL)
               for _ in range(_cores_to_burn())]
    config.stash[_BURNERS] = burners
    atexit.register(_stop_burners, burners)


class _XdistHooks:
    """The hooks that only pytest-xdist knows (registered only where it is installed)."""

    def pytest_configure_node(self, node: Any) -> None:
        workers.configure_node(node)

    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        return workers.make_scheduler(config, log)

    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """The controller starts the selected modules' background work (on the first
        worker's collection: they all collect the same)."""
        if node.config.option.collectonly:
            return
        root = node.config.rootpath
        background.start_modules(root / i.split("::", 1)[0] for i in ids)


def pytest_unconfigure(config: pytest.Config) -> None:
    workers.unconfigure(config)
    workers.stop_worker_airflow(config)
    _stop_burners(config.stash.get(_BURNERS, []))
    if not workers.is_worker(config):
        background.stop_all()


@pytest.hookimpl(trylast=True)  # after ``-k`` and ``-m`` have deselected what they do
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the session (:func:`tests.support.workers.order`). Without xdist, a selected
    test module with background work (:mod:`tests.support.background`: the soak) has it
    started now, so that it runs beside the other tests and its test, after them, takes it
    over; with xdist the controller starts it (:class:`_XdistHooks`)."""
    workers.order(items, config)
    if config.option.collectonly or workers.distributed(config):
        return
    background.start_modules(Path(str(i.path)) for i in items
                             if workers.kind(i) == workers.BACKGROUND)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """With xdist: an ``exclusive`` test has the shared stack alone, from its fixtures'
    set-up to their tear-down (tests/support/workers.py)."""
    with workers.holding_the_stack(item):
        yield


def pytest_report_header(config: pytest.Config) -> str | None:
    burners = config.stash.get(_BURNERS, [])
    if not burners:
        return None
    return (f"{BURN_CPU_ENV}: {len(burners)} core(s) kept busy by CPU burners (pids "
            f"{', '.join(str(b.pid) for b in burners)})")


#: The test topics' settings (:func:`topics`): no retention by time.
TEST_TOPIC_CONFIG = {"retention.ms": "-1"}


@pytest.fixture(scope="session")
def stack_env() -> dict[str, str]:
    """Start (or reuse) the local stack and export its environment to this process."""
    from kafka_ingest_dev import stack

    env = stack.up()
    os.environ.update(env)
    return env


@pytest.fixture(scope="session")
def kafka_config(stack_env: dict[str, str]) -> dict[str, Any]:
    return {"bootstrap.servers": stack_env["KAFKA_BOOTSTRAP_SERVERS"]}


@pytest.fixture(scope="session")
def clients(kafka_config: dict[str, Any]) -> Any:
    from kafka_ingest.kafka.clients import KafkaClients

    return KafkaClients(kafka_config)


@pytest.fixture
def pg_dsn(stack_env: dict[str, str]) -> Iterator[str]:
    """A fresh, migrated database for one test (a copy of a migrated template), dropped
    afterwards."""
    with fresh_database(stack_env["KAFKA_INGEST_PG_DSN"], cloned=True) as dsn:
        yield dsn


@pytest.fixture
def db(pg_dsn: str) -> Any:
    from kafka_ingest.db import Database

    return Database(pg_dsn, lock_timeout_s=5.0)


@pytest.fixture
def topics(clients: Any) -> Iterator[Callable[..., str]]:
    """``topics(partitions=3)`` creates a randomly named topic; all are deleted after.

    Their records are kept whatever their timestamps (:data:`TEST_TOPIC_CONFIG`): tests
    produce records stamped at fixed past times (2026-01-01), which the broker's retention
    by time (7 days by default, checked every 5 minutes) would otherwise delete between the
    produce and the read, now and then."""
    from kafka_ingest.kafka.topics import ensure_topics

    made: list[str] = []

    def make(partitions: int = 3, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        ensure_topics(clients, {name: partitions}, config=TEST_TOPIC_CONFIG)
        made.append(name)
        return name

    yield make
    delete_topics(clients, made)


@pytest.fixture
def make_pipeline(topics: Callable[..., str]) -> Callable[..., Any]:
    """``make_pipeline("telemetry_metrics", chunk_size=500)``: a shipped pipeline on fresh
    random source and DLQ topics, with overrides."""
    from kafka_ingest.config import load_pipelines, parse_pipelines

    shipped = load_pipelines()

    def make(base: str = "telemetry_metrics", *, partitions: int = 3,
             **overrides: Any) -> Any:
        body = shipped[base].model_dump(mode="json", exclude={"name"})
        body.update(topic=topics(partitions, "src"), dlq_topic=topics(partitions, "dlq"))
        body.update(overrides)
        return parse_pipelines({"pipelines": {base: body},
                                "contracts": declarations(shipped[base])})[base]

    return make


class _Hook(BaseHTTPRequestHandler):
    """Records each POST; answers 500 on ``/broken``, else 204."""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received.append((self.path, self.headers["Content-Type"],  # type: ignore[attr-defined]
                                     json.loads(body)))
        self.send_response(500 if self.path == "/broken" else 204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:  # keep the test output quiet
        pass


@pytest.fixture
def webhook() -> Iterator[Any]:
    """An HTTP server on 127.0.0.1 in a thread (no service needed); ``.received`` lists
    (path, content type, JSON body) of each POST."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    server.received = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def registry_url(stack_env: dict[str, str]) -> str:
    """The local stack's schema registry (``stack up --registry``), started if it is not
    running: the URL of its Confluent-compatible API, exported to this process with the
    rest of the stack's environment."""
    from kafka_ingest_dev import stack

    env = stack.up(registry=True)
    os.environ.update(env)
    return env["KAFKA_INGEST_SCHEMA_REGISTRY_URL"]


@pytest.fixture
def sr(registry_url: str) -> Iterator[Any]:
    """The producing side's registry client (confluent-kafka's own)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    client = SchemaRegistryClient({"url": registry_url})
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def connect_url(stack_env: dict[str, str]) -> str:
    """The local stack's Kafka Connect worker (``stack up --connect``: Debezium's Postgres
    source on it), started once per session when a test first asks for it."""
    from kafka_ingest_dev import stack

    return stack.start_connect()


@pytest.fixture
def debezium_source(connect_url: str, clients: Any,
                    stack_env: dict[str, str]) -> Iterator[Callable[..., Any]]:
    """``debezium_source({"customers": "id int PRIMARY KEY, name text"}, setup=[...])``: a
    source database captured by a new Debezium connector, yielded once its snapshot is on
    Kafka (:mod:`tests.support.debezium`); removed, slot and all, after the test."""
    from tests.support.debezium import debezium_source as make_source

    with contextlib.ExitStack() as made:
        yield lambda tables, **kw: made.enter_context(
            make_source(connect_url, clients, stack_env["KAFKA_INGEST_PG_ADMIN_DSN"], tables,
                        **kw))
