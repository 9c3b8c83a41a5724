"""``up --registry``: the stack's schema registry (:mod:`kafka_ingest_dev.apicurio`).

Apicurio Registry fetched once from Maven Central into the user cache, H2 in memory,
global compatibility ``BACKWARD``; its Confluent-compatible API on
``http://127.0.0.1:18081/apis/ccompat/v7``, its management interface on
``127.0.0.1:18082`` (``KAFKA_INGEST_REGISTRY_PORT``, ``..._REGISTRY_MANAGEMENT_PORT``);
``<state>/registry``. Like Airflow's services it is started only when asked for, and a
plain ``up`` leaves a running one alone.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import Future, ThreadPoolExecutor

from kafka_ingest_dev import apicurio
from kafka_ingest_dev.procs import binary, read_or_none, require_free
from kafka_ingest_dev.stack.settings import Report, Settings

log = logging.getLogger(__name__)

#: (pid, started) of the registry: started by this call, or found running.
Launch = tuple[int, bool]


def _preflight(s: Settings, emit: Report) -> tuple[apicurio.Release, apicurio.Java, str]:
    """Fail in a second, before the download, on what the user must fix: no Java 17+, no
    Maven for a first fetch, a port taken. Returns the release, its Java and mvn; says so
    when no Java 21+ makes it fall back to the 2.x release."""
    javas = apicurio.find_javas()
    release, java = apicurio.choose(javas)
    if release is not apicurio.RELEASE:
        line = (f"registry: no Java {apicurio.RELEASE.min_java}+ for Apicurio Registry "
                f"{apicurio.RELEASE.version} (found: "
                f"{', '.join(f'{j.path} ({j.major})' for j in javas)}); falling back to "
                f"{release.version} on Java {java.major} ({java.path})")
        log.warning("%s", line)
        emit(line)
    mvn = "" if apicurio.installed(release) else binary("mvn", "Maven (apt-get install maven)")
    server = s.registry
    require_free(server.port, "the schema registry", "KAFKA_INGEST_REGISTRY_PORT")
    require_free(server.management_port, "the schema registry's management interface",
                 "KAFKA_INGEST_REGISTRY_MANAGEMENT_PORT")
    return release, java, mvn


def begin(s: Settings, pool: ThreadPoolExecutor, emit: Report) -> Future[Launch]:
    """(pid, started) of the registry, launching it in ``pool`` unless it runs (the first
    start downloads it: that runs beside Postgres and Airflow, after Kafka's launch, so two
    Maven processes never share the local repository). A registry whose configuration
    changed (its ports) is restarted."""
    server = s.registry
    pid = server.pid()
    if pid is not None and read_or_none(server.props) != apicurio.properties(server):
        log.info("registry: its configuration changed (e.g. its ports); restarting it")
        server.stop()
        pid = None
    if pid is not None:
        done: Future[Launch] = Future()
        done.set_result((pid, False))
        return done
    release, java, mvn = _preflight(s, emit)
    return pool.submit(
        lambda: (apicurio.launch(server, release, java, apicurio.install(release, mvn)), True))


def await_ready(s: Settings, launch: Future[Launch], since: float) -> str:
    """Wait until the registry answers; one just started (or found running but not yet
    answering: an ``up`` cut short) then gets the global compatibility BACKWARD."""
    server = s.registry
    pid, started = launch.result()
    if started or not server.answers():
        apicurio.await_ready(server, pid)
    level = apicurio.compatibility(server)
    return (f"{server.started(pid, started, since)} "
            f"(apicurio {server.release()}, compatibility {level})")


def client_env(s: Settings) -> dict[str, str]:
    """``stack env`` while the registry runs: its URL for the CLI, its Airflow connection
    (``http``, the scheme in ``schema`` as Airflow's HTTP hook reads it, the API's path in
    the extra; see ``kafka_ingest.kafka.registry.registry_settings_from``)."""
    server = s.registry
    if server.pid() is None:
        return {}
    conn = {"conn_type": "http", "host": "127.0.0.1", "port": server.port, "schema": "http",
            "extra": {"path": apicurio.CCOMPAT_PATH}}
    return {"KAFKA_INGEST_SCHEMA_REGISTRY_URL": server.url,
            "AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT": json.dumps(conn)}

