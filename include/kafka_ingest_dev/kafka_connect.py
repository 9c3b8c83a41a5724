"""A Kafka Connect worker for the local stack, with Debezium's Postgres source on it.

Development tooling, like :mod:`kafka_ingest_dev.apicurio` (the stack runs it when started
with ``kafka-ingest stack up --connect``; the mirror's tests start it on demand); the
runtime never imports it.

- **The jars**: :func:`fetch_jars` runs Maven on ``connect/pom.xml`` once per profile into
  ``${XDG_CACHE_HOME:-~/.cache}/kafka-ingest/connect-<sha256 of the pom>``: the worker's
  jars in ``libs/`` (Apicurio Registry's converters among them), each plugin in
  ``plugins/<profile>/`` (:data:`PLUGINS`: Debezium's Postgres source, and Debezium's JDBC
  sink, the benchmark's peer). One home for Connect's
  jars: the benchmark (``benchmarks/peers/connect.py``) fetches them through this function.
- :class:`Worker` is one stack's worker, a :class:`~kafka_ingest_dev.service.LocalService`
  under ``<state>/connect`` (the configuration written on every start, the offsets file,
  pid file, log), its REST API on ``127.0.0.1:18083`` (``KAFKA_INGEST_CONNECT_PORT``).
  :func:`launch` starts the JVM without waiting; ``worker.await_ready()`` polls the REST
  API; ``worker.stop()`` ends it.

**Standalone, not distributed.** ``ConnectStandalone`` keeps source offsets in a file and
connectors in memory; connectors come and go through the same REST API a distributed worker
has. Chosen because the stack's users of it (the tests, a developer trying a mirror) register
a connector, read its topics and delete it: a distributed worker would add three compacted
internal topics to the shared broker, a group join at start and a rebalance at every
connector created or deleted (seconds each), for durability of connector configurations the
tests do not want (a connector outliving its test would keep its replication slot busy).
Trade-off: a restarted worker has no connectors (whoever registered them registers them
again; Debezium resumes from the offsets file and the slot).

Converters: Connect's ``JsonConverter`` for keys and values with ``schemas.enable=true``:
every message carries its Connect schema, the wire form Debezium's envelope is decoded from
by default. A connector may name Apicurio's ``AvroConverter`` instead (on the worker's
class path), which writes keys and values in the registry's wire format and registers
their schemas in the stack's Apicurio (:func:`registry_converter`).
"""

from __future__ import annotations

import fcntl
import hashlib
import http.client
import json
import logging
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka_ingest_dev.procs import StackError, binary, child_env
from kafka_ingest_dev.service import LocalService

log = logging.getLogger(__name__)

CONNECT_DIR = Path(__file__).resolve().parent / "connect"
POM = CONNECT_DIR / "pom.xml"
#: The pom's profile for the worker, and one per plugin (each also its directory name).
WORKER_PROFILE = "worker"
PLUGINS = ("debezium-connector-postgres", "debezium-connector-jdbc")
DEFAULT_PORT = 18083
START_TIMEOUT_S = 120.0
_STOP_TIMEOUT_S = 30.0
_FETCH_TIMEOUT_S = 900.0
_REQUEST_TIMEOUT_S = 10.0
#: ``offset.flush.interval.ms``: how often source offsets are stored. Debezium confirms the
#: slot's LSN to Postgres at each, so a short interval keeps the slot from holding WAL back
#: for long, and tells a test soon that what it wrote is on Kafka.
OFFSET_FLUSH_INTERVAL_S = 1.0
#: A bounded JVM for a development worker: a few connectors, small tables. The serial
#: collector and the client compiler cost less memory and start-up CPU than G1 and C2.
JVM_OPTIONS = ("-Xms64m", "-Xmx768m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
               "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true")
MAIN_CLASS = "org.apache.kafka.connect.cli.ConnectStandalone"


# --------------------------------------------------------------------------- the jars


def cache_dir() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/kafka-ingest/connect-<sha256 of connect/pom.xml>``."""
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    digest = hashlib.sha256(POM.read_bytes()).hexdigest()[:12]
    return Path(xdg) / "kafka-ingest" / f"connect-{digest}"


def fetched() -> bool:
    return (cache_dir() / ".complete").is_file()


def fetch_jars() -> Path:
    """The cache directory with Connect's jars in ``libs/`` and each of :data:`PLUGINS` in
    ``plugins/<name>/``, fetched by Maven the first time (under a lock: a concurrent caller
    waits for the one fetch; a marker written last makes an interrupted fetch start again)."""
    cache = cache_dir()
    marker = cache / ".complete"
    if marker.is_file():
        return cache
    mvn = binary("mvn", "Maven (apt-get install maven)")
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file():  # another process fetched them meanwhile
            return cache
        started = time.monotonic()
        targets = [(WORKER_PROFILE, cache / "libs"),
                   *((name, cache / "plugins" / name) for name in PLUGINS)]
        for profile, out in targets:
            _copy_dependencies(mvn, profile, out)
        marker.write_text(POM.read_text(encoding="utf-8"), encoding="utf-8")
        log.info("Kafka Connect's jars fetched into %s in %.1f s", cache,
                 time.monotonic() - started)
    return cache


def _copy_dependencies(mvn: str, profile: str, out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cmd = [mvn, "-q", "-B", "-f", str(POM), "-P", profile, "dependency:copy-dependencies",
           f"-DoutputDirectory={out}", "-Dmdep.includeScope=runtime"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False,
                              timeout=_FETCH_TIMEOUT_S, env=child_env())
    except subprocess.TimeoutExpired:
        raise StackError(f"mvn did not fetch Connect's {profile} jars within "
                         f"{_FETCH_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        errors = [line for line in (done.stdout + done.stderr).splitlines()
                  if "[ERROR]" in line] or (done.stdout + done.stderr).splitlines()[-1:]
        raise StackError(f"mvn could not fetch Connect's {profile} jars: "
                         f"{(errors or ['no output'])[0].strip()}")


# --------------------------------------------------------------------------- the worker


@dataclass(frozen=True)
class Worker(LocalService):
    """One stack's Connect worker: its REST port, the brokers it talks to, its directory."""

    port: int
    bootstrap: str
    home: Path
    name = "connect"
    start_timeout_s = START_TIMEOUT_S
    stop_timeout_s = _STOP_TIMEOUT_S

    @property
    def url(self) -> str:
        """The REST API (``/connectors``, ``/connector-plugins``)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        return self.url

    @property
    def props(self) -> Path:
        return self.home / "worker.properties"

    @property
    def offsets(self) -> Path:
        return self.home / "connect.offsets"

    def markers(self) -> tuple[str, ...]:
        """Its command line names our configuration file, which lives in this state dir."""
        return (str(self.props),)

    def answers(self) -> bool:
        """Health: the REST API lists the installed connector plugins."""
        try:
            status, body = request("GET", f"{self.url}/connector-plugins", timeout_s=2.0)
        except OSError:
            return False
        return status == 200 and isinstance(body, list)

    def plugins(self) -> list[str]:
        """The connector classes the worker found on its plugin path."""
        status, body = request("GET", f"{self.url}/connector-plugins")
        if status != 200 or not isinstance(body, list):
            raise StackError(f"Kafka Connect at {self.url} did not list its plugins: "
                             f"HTTP {status} {body}")
        return [str(p.get("class")) for p in body if isinstance(p, dict)]


def properties(worker: Worker, plugin_path: Path) -> str:
    """The worker's configuration (``ConnectStandalone``'s first argument)."""
    props = {
        "bootstrap.servers": worker.bootstrap,
        # Keys and values in JsonConverter's {"schema": ..., "payload": ...} form.
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": "true",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "true",
        "offset.storage.file.filename": str(worker.offsets),
        "offset.flush.interval.ms": str(int(OFFSET_FLUSH_INTERVAL_S * 1000)),
        "plugin.path": str(plugin_path),
        # Plugins found through their ServiceLoader manifests (KIP-898) rather than by
        # scanning every class of every jar, which costs seconds at each start.
        "plugin.discovery": "service_load",
        "listeners": f"http://127.0.0.1:{worker.port}",
        # Lets a connector set producer.override.* (e.g. a test's linger or batch size).
        "connector.client.config.override.policy": "All",
    }
    header = "# Written by kafka-ingest stack up on every start; edit kafka_connect.py instead.\n"
    return header + "".join(f"{key}={value}\n" for key, value in props.items())


#: Apicurio's converter for Avro (in the pom's worker profile).
AVRO_CONVERTER = "io.apicurio.registry.utils.converter.AvroConverter"


def registry_converter(registry_url: str) -> dict[str, str]:
    """A connector's settings that write its record keys and values with Apicurio's
    ``AvroConverter`` to the registry at ``registry_url`` (its base address, or its
    Confluent-compatible API's), as a Confluent serializer writes them: the wire header
    (magic byte and the 4-byte id the Confluent-compatible API serves the schema by, the
    content id) in front of each payload, not in Kafka headers, and the schema registered
    under ``<topic>-key`` / ``<topic>-value``."""
    base = registry_url.split("/apis/", 1)[0].rstrip("/")
    settings = {}
    for part in ("key", "value"):
        settings.update({
            f"{part}.converter": AVRO_CONVERTER,
            f"{part}.converter.apicurio.registry.url": f"{base}/apis/registry/v2",
            f"{part}.converter.apicurio.registry.auto-register": "true",
            f"{part}.converter.apicurio.registry.find-latest": "true",
            f"{part}.converter.apicurio.registry.headers.enabled": "false",
            f"{part}.converter.apicurio.registry.as-confluent": "true",
            f"{part}.converter.apicurio.registry.use-id": "contentId",
        })
    return settings


def launch(worker: Worker, cache: Path, java: str) -> int:
    """Write the configuration and spawn the worker; do not wait."""
    worker.home.mkdir(parents=True, exist_ok=True)
    worker.props.write_text(properties(worker, cache / "plugins"))
    return worker.spawn([
        java, *JVM_OPTIONS,
        f"-Dlog4j2.configurationFile={CONNECT_DIR / 'log4j2.properties'}",
        "-cp", f"{cache / 'libs'}/*", MAIN_CLASS, str(worker.props),
    ])


# --------------------------------------------------------------------------- the client


def request(method: str, url: str, body: Any = None, *,
            timeout_s: float = _REQUEST_TIMEOUT_S) -> tuple[int, Any]:
    """One call of Connect's REST API: (HTTP status, decoded JSON body). An HTTP error is
    an answer too; only no answer at all (or a garbled one) raises ``OSError``."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,  # noqa: S310 - http only
                                 headers={"Content-Type": "application/json",
                                          "Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except http.client.HTTPException as exc:  # e.g. a connection cut mid-answer
        raise OSError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


__all__ = [
    "CONNECT_DIR",
    "DEFAULT_PORT",
    "OFFSET_FLUSH_INTERVAL_S",
    "PLUGINS",
    "POM",
    "START_TIMEOUT_S",
    "Worker",
    "cache_dir",
    "fetch_jars",
    "fetched",
    "launch",
    "properties",
    "request",
]
