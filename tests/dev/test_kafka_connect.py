"""The stack's Kafka Connect worker (``stack up --connect``): its configuration, its flags,
that its start is idempotent, that it carries Debezium's Postgres source, and that ``stack
down`` stops it."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from kafka_ingest_dev import kafka_connect, stack
from kafka_ingest_dev.procs import alive, free_ports, port_free
from kafka_ingest_dev.stack.cli import parser

POSTGRES_SOURCE = "io.debezium.connector.postgresql.PostgresConnector"


def _props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines()
                if line and not line.startswith("#"))


def test_the_worker_speaks_jsonconverter_with_schemas_on_loopback(tmp_path: Path) -> None:
    worker = kafka_connect.Worker(18099, "127.0.0.1:1,127.0.0.1:2", tmp_path)
    props = _props(kafka_connect.properties(worker, tmp_path / "plugins"))
    json_converter = "org.apache.kafka.connect.json.JsonConverter"
    # Keys and values: JsonConverter's {"schema", "payload"}, the envelope's default form.
    assert props["key.converter"] == props["value.converter"] == json_converter
    assert props["key.converter.schemas.enable"] == "true"
    assert props["value.converter.schemas.enable"] == "true"
    assert props["listeners"] == "http://127.0.0.1:18099"
    assert props["bootstrap.servers"] == "127.0.0.1:1,127.0.0.1:2"
    assert props["plugin.path"] == str(tmp_path / "plugins")
    assert props["offset.storage.file.filename"] == str(tmp_path / "connect.offsets")


def test_the_pom_has_a_profile_for_the_worker_and_each_plugin() -> None:
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    root = ET.parse(kafka_connect.POM).getroot()  # noqa: S314 - our own pom
    profiles = {p.findtext("m:id", namespaces=ns) for p in root.iterfind(".//m:profile", ns)}
    assert profiles == {"worker", *kafka_connect.PLUGINS}
    assert root.findtext("m:properties/m:debezium.version", namespaces=ns) == "3.6.1.Final"


def test_up_and_down_take_connect() -> None:
    assert parser().parse_args(["up", "--connect"]).connect
    assert parser().parse_args(["down", "--connect"]).connect
    assert not parser().parse_args(["up"]).connect


# --------------------------------------------------------------------------- the shared one


def test_the_worker_carries_debeziums_postgres_source(connect_url: str) -> None:
    worker = stack.settings().connect
    assert connect_url == worker.url
    assert POSTGRES_SOURCE in worker.plugins()


def test_a_second_start_leaves_the_running_worker_alone(connect_url: str) -> None:
    before = stack.settings().connect.pid()
    lines: list[str] = []
    assert stack.start_connect(report=lines.append) == connect_url
    assert stack.settings().connect.pid() == before
    assert len(lines) == 1 and lines[0].startswith(f"connect: already running on {connect_url}")


def test_up_with_connect_finds_it_running_and_a_plain_up_leaves_it(connect_url: str) -> None:
    before = stack.settings().connect.pid()
    lines: list[str] = []
    env = stack.up(report=lines.append, connect=True)
    assert [line for line in lines if line.startswith("connect: ")] == [
        f"connect: already running on {connect_url} (pid {before}) "
        "(plugins: JdbcSinkConnector, PostgresConnector)"]
    assert env["KAFKA_INGEST_CONNECT_URL"] == connect_url
    stack.up()
    assert stack.settings().connect.pid() == before


def test_status_and_env_show_the_worker(connect_url: str) -> None:
    parts = {part.name: part for part in stack.status()}
    assert parts["connect"].up and parts["connect"].address == connect_url
    assert stack.env()["KAFKA_INGEST_CONNECT_URL"] == connect_url


# --------------------------------------------------------------------------- its own


@pytest.fixture
def own_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
              stack_env: dict[str, str]) -> Iterator[Path]:
    """A state dir and a REST port of its own (the shared Kafka as its brokers: a standalone
    worker makes no topic); whatever it started is stopped afterwards."""
    monkeypatch.setenv("KAFKA_INGEST_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("KAFKA_INGEST_CONNECT_PORT", str(free_ports(1)[0]))
    try:
        yield tmp_path
    finally:
        stack.stop_connect()


def test_a_worker_of_its_own_is_stopped_by_stack_down(own_state: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    url = stack.start_connect(report=print)
    took = time.monotonic() - started
    worker = stack.settings().connect
    pid = worker.pid()
    assert pid is not None and worker.home == own_state / "connect"
    assert url == f"http://127.0.0.1:{worker.port}"
    assert POSTGRES_SOURCE in worker.plugins()
    with capsys.disabled():
        print(f"\nown Connect worker: REST API answering in {took:.1f} s")
    lines: list[str] = []
    stack.down(report=lines.append)  # nothing else runs in this state dir
    assert f"connect: stopped (pid {pid})" in lines
    assert not alive(pid) and port_free(worker.port) and not worker.pidfile.exists()
    # SIGTERM: Connect's own orderly shutdown, to its end.
    assert "INFO Kafka Connect stopped" in worker.logfile.read_text(errors="replace")
