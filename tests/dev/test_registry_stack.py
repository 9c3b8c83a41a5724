"""The local stack's schema registry against itself: a real Apicurio Registry, no mocks.

What the registry-encoded pipelines rely on: Confluent's REST API at ``/apis/ccompat/v7``,
the global compatibility BACKWARD (Apicurio's own default, NONE, would take any change),
schemas served back by id, both of its ports on loopback only, and ``stack env`` /
``stack status`` saying where it is. The shared registry is never stopped here (other
tests use it): the stop path runs on a registry of its own, on its own state dir and ports.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafka_ingest_dev import apicurio, stack
from kafka_ingest_dev.procs import alive, free_ports

pytestmark = pytest.mark.integration

#: Version 1 of the test subject, and what BACKWARD compatibility makes of a version 2.
ORDER_V1 = {"type": "record", "name": "Order", "namespace": "test.registry",
            "fields": [{"name": "order_id", "type": "long"}]}
#: A new field without a default: a reader of v2 cannot read v1 data. Refused.
ORDER_V2_REQUIRED = {**ORDER_V1, "fields": [*ORDER_V1["fields"],
                                            {"name": "customer_id", "type": "string"}]}
#: The same field with a default: additive evolution, accepted.
ORDER_V2_OPTIONAL = {**ORDER_V1, "fields": [
    *ORDER_V1["fields"], {"name": "customer_id", "type": ["null", "string"], "default": None}]}
#: Bounds the JVM is started with (-Xmx256m): heap plus metaspace, code and threads.
RSS_LIMIT_MB = 600


def _call(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    return apicurio.request(method, url, body)


def _register(url: str, subject: str, schema: dict[str, Any]) -> tuple[int, Any]:
    return _call("POST", f"{url}/subjects/{subject}/versions", {"schema": json.dumps(schema)})


@pytest.fixture
def subject(registry_url: str) -> Iterator[str]:
    """A fresh subject name; the subject is deleted afterwards (soft, then for good)."""
    name = f"test-registry-{uuid.uuid4().hex[:12]}-value"
    try:
        yield name
    finally:
        _call("DELETE", f"{registry_url}/subjects/{name}")
        _call("DELETE", f"{registry_url}/subjects/{name}?permanent=true")


def _listen_addresses(port: int) -> set[str]:
    """The addresses a socket LISTENs on at ``port``, read from /proc/net/tcp and tcp6
    (each 32-bit word of an address is in the host's byte order, little-endian here)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if fields[3] != "0A" or int(hex_port, 16) != port:  # 0A: TCP_LISTEN
                continue
            raw = bytes.fromhex(address)
            ordered = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            found.add(str(ipaddress.ip_address(ordered)))
    return found


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def _registry_ports() -> list[int]:
    """The ports the running registry should hold: its API, and (3.x) its management
    interface."""
    server = stack.settings().registry
    management = server.started_with().get("management")
    return [server.port, *([server.management_port] if management else [])]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def _exports(names: list[str]) -> dict[str, str]:
    """``eval "$(kafka-ingest stack env)"`` in a shell (the command itself, in a process of
    its own); the values of ``names``."""
    cli = Path(sys.executable).parent / "kafka-ingest"
    script = (f'exports="$({shlex.quote(str(cli))} stack env)" || exit 1\n'
              'eval "$exports"\n'
              + "".join(f'printf "%s\\0" "${name}"\n' for name in names))
    done = subprocess.run(["bash", "-c", script], capture_output=True, check=False,
                          timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return dict(zip(names, done.stdout.decode().split("\0"), strict=False))


# --------------------------------------------------------------------------- shared registry


def test_the_registry_answers_confluents_api(registry_url: str) -> None:
    assert registry_url.startswith("http://127.0.0.1:")
    assert registry_url.endswith("/apis/ccompat/v7")
    status, subjects = _call("GET", f"{registry_url}/subjects")
    assert status == 200
    assert isinstance(subjects, list)
    assert all(isinstance(name, str) for name in subjects)


def test_the_global_compatibility_is_backward(registry_url: str) -> None:
    assert _call("GET", f"{registry_url}/config") == (200, {"compatibilityLevel": "BACKWARD"})


def test_an_avro_schema_is_registered_and_served_by_its_id(registry_url: str,
                                                           subject: str) -> None:
    status, body = _register(registry_url, subject, ORDER_V1)
    assert status == 200, body
    schema_id = body["id"]
    assert isinstance(schema_id, int) and schema_id > 0
    status, found = _call("GET", f"{registry_url}/schemas/ids/{schema_id}")
    assert status == 200, found
    assert json.loads(found["schema"]) == ORDER_V1
    assert found.get("schemaType", "AVRO") == "AVRO"  # Confluent omits the default type
    assert _call("GET", f"{registry_url}/subjects/{subject}/versions") == (200, [1])
    # The same schema again is the same id, not a new version.
    assert _register(registry_url, subject, ORDER_V1) == (200, {"id": schema_id})


def test_an_incompatible_version_is_refused_a_compatible_one_taken(registry_url: str,
                                                                   subject: str) -> None:
    assert _register(registry_url, subject, ORDER_V1)[0] == 200
    status, body = _register(registry_url, subject, ORDER_V2_REQUIRED)
    assert status == 409, body
    assert body["error_code"] == 409
    status, body = _register(registry_url, subject, ORDER_V2_OPTIONAL)
    assert status == 200, body
    assert _call("GET", f"{registry_url}/subjects/{subject}/versions") == (200, [1, 2])


def test_both_ports_listen_on_loopback_only(registry_url: str) -> None:
    ports = _registry_ports()
    assert ports[0] == stack.settings().registry_port
    for port in ports:
        addresses = _listen_addresses(port)
        assert addresses, f"nothing listens on port {port}"
        assert all(_loopback(a) for a in addresses), (port, addresses)


def test_stack_env_exports_the_url_and_an_airflow_connection(registry_url: str) -> None:
    # Airflow's own parser reads the connection (imported here, not under capsys: importing
    # Airflow points a logging handler at the stderr of the moment).
    from airflow.models.connection import Connection

    values = _exports(["KAFKA_INGEST_SCHEMA_REGISTRY_URL",
                       "AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT"])
    assert values["KAFKA_INGEST_SCHEMA_REGISTRY_URL"] == registry_url
    conn = Connection.from_json(values["AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT"],
                                conn_id="schema_registry_default")
    assert (conn.conn_type, conn.host, conn.port) == (
        "http", "127.0.0.1", stack.settings().registry_port)
    # the pipelines read it as the registry's settings: the scheme in schema, the path in
    # the extra (plugins/kafka_ingest_hook.registry_settings)
    from kafka_ingest.kafka.registry import registry_settings_from

    settings = registry_settings_from(source="stack env", host=conn.host, port=conn.port,
                                      scheme=conn.schema, login=conn.login,
                                      password=conn.password, extra=conn.extra_dejson)
    assert settings.url == registry_url


def test_stack_status_reports_the_registry(registry_url: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    parts = {part.name: part for part in stack.status()}
    registry = parts["registry"]
    assert registry.up and registry.pid is not None, registry
    assert registry.address == registry_url
    assert "compatibility BACKWARD" in registry.detail
    stack.main(["status"])
    lines = [line for line in capsys.readouterr().out.splitlines()
             if line.startswith("registry ")]
    assert len(lines) == 1
    assert lines[0].split()[1:3] == ["up", registry_url]


def test_a_plain_up_leaves_the_registry_running(registry_url: str) -> None:
    before = stack.settings().registry.pid()
    assert before is not None
    env = stack.up()
    assert stack.settings().registry.pid() == before
    assert env["KAFKA_INGEST_SCHEMA_REGISTRY_URL"] == registry_url


# --------------------------------------------------------------------------- its own registry


@pytest.fixture
def own_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A state dir and ports of its own (Kafka's and Postgres' too, so nothing here can
    reach the shared stack); its registry is stopped afterwards whatever happens."""
    monkeypatch.setenv("KAFKA_INGEST_STATE_DIR", str(tmp_path))
    names = ("KAFKA_INGEST_REGISTRY_PORT", "KAFKA_INGEST_REGISTRY_MANAGEMENT_PORT",
             "KAFKA_INGEST_KAFKA_PORT", "KAFKA_INGEST_CONTROLLER_PORT", "KAFKA_INGEST_PG_PORT")
    for name, port in zip(names, free_ports(len(names)), strict=True):
        monkeypatch.setenv(name, str(port))
    try:
        yield tmp_path
    finally:
        stack.stop_registry()


def test_a_registry_of_its_own_starts_empty_and_its_stop_leaves_nothing(
        own_stack: Path, capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    url = stack.start_registry(report=print)
    took = time.monotonic() - started
    server = stack.settings().registry
    pid = server.pid()
    assert pid is not None and server.home == own_stack / "registry"
    rss = _rss_mb(pid)
    with capsys.disabled():
        print(f"\nown registry: up in {took:.1f} s, RSS {rss:.0f} MB ({server.release()})")
    assert rss < RSS_LIMIT_MB
    assert url == f"http://127.0.0.1:{server.port}/apis/ccompat/v7"
    assert _call("GET", f"{url}/subjects") == (200, [])
    assert _call("GET", f"{url}/config") == (200, {"compatibilityLevel": "BACKWARD"})
    ports = _registry_ports()
    assert all(_listen_addresses(p) for p in ports)
    # A second start finds it running.
    stack.start_registry()
    assert server.pid() == pid

    assert stack.main(["down", "--registry"]) == 0
    assert f"registry: stopped (pid {pid})" in capsys.readouterr().out
    assert not alive(pid)
    assert not server.pidfile.exists()
    assert all(not _listen_addresses(p) for p in ports)
    assert "registry" not in {part.name for part in stack.status()}
    assert "KAFKA_INGEST_SCHEMA_REGISTRY_URL" not in stack.env()
    # Stopping what is not running says so and succeeds.
    assert stack.main(["down", "--registry"]) == 0
    assert "registry: not running" in capsys.readouterr().out
