"""``up --connect``: the stack's Kafka Connect worker (:mod:`kafka_ingest_dev.kafka_connect`).

``ConnectStandalone`` with Debezium's Postgres source (and JDBC sink) on its plugin path,
JsonConverter keys and values with schemas; its REST API on ``http://127.0.0.1:18083``
(``KAFKA_INGEST_CONNECT_PORT``); ``<state>/connect``. Like the registry it is started only
when asked for (the mirror's tests start it on demand), and a plain ``up`` leaves a running
one alone; ``down`` stops it, ``down --connect`` only it.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from kafka_ingest_dev import kafka_connect
from kafka_ingest_dev.procs import StackError, binary, read_or_none, require_free
from kafka_ingest_dev.stack.settings import Settings

log = logging.getLogger(__name__)


def begin(s: Settings, pool: ThreadPoolExecutor) -> Future[Path] | None:
    """The jars' cache, fetched in ``pool`` (the first start downloads them: that runs beside
    Postgres' start, never beside another Maven process of the stack's pool); None when a
    worker with this configuration runs already. A worker whose configuration changed (its
    port, the brokers, the jars) is stopped here, to be started again by :func:`start`."""
    worker = s.connect
    pid = worker.pid()
    if pid is not None and read_or_none(worker.props) != kafka_connect.properties(
            worker, kafka_connect.cache_dir() / "plugins"):
        log.info("connect: its configuration changed (port, brokers or jars); restarting it")
        worker.stop()
        pid = None
    if pid is not None:
        return None
    require_free(worker.port, "Kafka Connect's REST API", "KAFKA_INGEST_CONNECT_PORT")
    binary("java", "a Java 17+ runtime")
    return pool.submit(kafka_connect.fetch_jars)


def start(s: Settings, fetch: Future[Path] | None, since: float) -> str:
    """Launch the worker once its jars are there (Kafka must answer by now: the worker asks
    the cluster for its id as it starts) and wait until its REST API answers; the line
    ``up`` prints, with the connector plugins it found."""
    worker = s.connect
    if fetch is None:
        pid, started = worker.pid(), False
    else:
        pid, started = kafka_connect.launch(worker, fetch.result(), binary("java", "Java")), True
    if pid is None:  # stopped between begin() and now
        raise StackError("connect: the worker exited; run `stack up --connect`")
    if started or not worker.answers():
        worker.await_ready(pid)
    plugins = ", ".join(sorted(c.rsplit(".", 1)[-1] for c in worker.plugins()
                               if c.startswith("io.debezium")))
    return f"{worker.started(pid, started, since)} (plugins: {plugins})"


def client_env(s: Settings) -> dict[str, str]:
    """``stack env`` while the worker runs: its REST API's URL."""
    worker = s.connect
    if worker.pid() is None:
        return {}
    return {"KAFKA_INGEST_CONNECT_URL": worker.url}
