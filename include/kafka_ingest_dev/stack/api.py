"""The stack as a whole: :func:`up`, :func:`down`, :func:`status`, and starting or
stopping one optional part (the registry, the Connect worker, Airflow's services).

Each takes the stack's lock (:func:`~kafka_ingest_dev.stack.settings.locked`), so two
shells or test workers never start the same part twice.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

from kafka_ingest_dev import tls
from kafka_ingest_dev.procs import PartStatus, binary, child_env
from kafka_ingest_dev.stack import airflow_db, kafka, postgres, proxies, standby
from kafka_ingest_dev.stack import connect as kafka_connect
from kafka_ingest_dev.stack import registry as schema_registry
from kafka_ingest_dev.stack.environment import env
from kafka_ingest_dev.stack.postgres import PG_APP_ROLE, other_node, primary_node
from kafka_ingest_dev.stack.settings import Report, Settings, locked, settings

# The package's name: what `up`'s lines have always been logged as.
log = logging.getLogger("kafka_ingest_dev.stack")


def _remember_options(s: Settings, *, secure: bool, brokers: int | None, faults: bool,
                      replica: str | None) -> None:
    """The sticky options, written into the state directory before anything starts."""
    if secure and not s.secure:
        tls.ensure(s.tls_dir)
        s.secure_marker.write_text("SASL_SSL listener and Postgres TLS on\n")
    elif s.secure:
        tls.ensure(s.tls_dir)
    if brokers is not None:
        kafka.set_brokers(s, brokers)
    if faults and not s.faults:
        s.faults_marker.write_text("Toxiproxy in front of Kafka and Postgres\n")
    standby.set_replica(s, replica)


def up(*, report: Report | None = None, secure: bool = False, airflow: bool = False,
       airflow_env: dict[str, str] | None = None, executor: str | None = None,
       workers: int | None = None,
       faults: bool = False, brokers: int | None = None,
       registry: bool = False, connect: bool = False,
       replica: str | None = None) -> dict[str, str]:
    """Start whatever is not running, wait until each part answers, return ``env()``.

    Idempotent: when everything runs it only checks health (well under a second). The
    jar download and the broker's boot run while Postgres starts and Airflow migrates, so
    a cold start costs the slower of the two rather than their sum. ``report`` receives
    one line per part.

    ``secure`` (sticky: later ``up`` calls keep it) adds a SASL_SSL listener to Kafka and
    TLS to Postgres, with a CA, a server certificate and SCRAM users made in the state
    directory; a running broker is restarted to take the listener.

    ``faults`` (sticky too) adds Toxiproxy in front of each Kafka node and of Postgres,
    and a listener behind it to each broker (restarted to take it); the returned
    environment then points through the proxies. ``brokers`` (sticky: the size of the
    cluster in this state dir, 1 unless said) runs that many KRaft nodes.

    ``airflow`` also starts Airflow's api-server, scheduler, dag-processor and triggerer
    (:mod:`kafka_ingest_dev.airflow_services`), with this process's environment less
    the user's libpq variables (every process the stack starts gets that:
    :func:`~kafka_ingest_dev.procs.child_env`), the stack's, and ``airflow_env`` (e.g.
    another pipelines file or connection) on top;
    ``executor`` ``"local"`` or ``"celery"`` (with ``workers`` Celery workers and Redis),
    None keeping the running one. Another executor than the running one restarts them.

    ``replica`` (``"async"`` or ``"sync"``; sticky) adds a streaming standby of Postgres
    (``pg_basebackup`` through a replication slot, on ``127.0.0.1:15434``): ``"sync"``
    makes the primary acknowledge a commit only once the standby applied it
    (``synchronous_standby_names``, ``synchronous_commit = remote_apply``). The returned
    environment then names both nodes (``env(replica=True)``), and so does Airflow's, so
    :func:`~kafka_ingest_dev.stack.standby.failover` moves every client to the new primary.

    ``registry`` also starts the schema registry (:mod:`kafka_ingest_dev.apicurio`: empty,
    compatibility BACKWARD) unless it runs; not sticky: a later ``up`` leaves it as it is,
    running or not. It boots beside Postgres, and is up before Airflow's services start,
    so they get its connection.

    ``connect`` also starts a Kafka Connect worker with Debezium's Postgres source on it
    (:mod:`kafka_ingest_dev.kafka_connect`) unless it runs; not sticky either. Its jars
    are fetched beside Postgres' start; the worker starts once Kafka answers.
    """
    emit = report or log.info
    s = settings()
    with locked(s), ThreadPoolExecutor(max_workers=1) as pool:
        _remember_options(s, secure=secure, brokers=brokers, faults=faults, replica=replica)
        kafka_since = time.monotonic()
        launch = kafka.begin(s, pool)
        registry_since = time.monotonic()
        registry_launch = schema_registry.begin(s, pool, emit) if registry else None
        connect_since = time.monotonic()
        connect_fetch = kafka_connect.begin(s, pool) if connect else None
        standby.start_nodes(s, emit)
        postgres.bootstrap(s)
        emit(airflow_db.ensure(s, env()))
        for node, kafka_pid, kafka_started in launch.result():
            node.await_ready(kafka_pid)
            emit(node.started(kafka_pid, kafka_started, kafka_since))
        kafka.await_cluster(s, fresh=any(started for _, _, started in launch.result()))
        if s.faults:
            emit(proxies.ensure(s))
        kafka.install_tools(s, binary("java", "a Java 17+ runtime"), kafka.fetch_jars(s))
        if s.secure:
            kafka.create_scram_user(s)
            emit(f"secure: Kafka SASL_SSL (SCRAM-SHA-512) on {s.secure_bootstrap}, Postgres "
                 f"TLS for {PG_APP_ROLE}; `kafka-ingest stack env --secure` points at them")
        if registry_launch is not None:
            emit(schema_registry.await_ready(s, registry_launch, registry_since))
        if connect:
            emit(kafka_connect.start(s, connect_fetch, connect_since))
        if airflow:
            s.airflow.start(child_env(env(replica=s.replica is not None), airflow_env),
                            emit, executor=executor, workers=workers)
    return env(secure=s.secure and secure, faults=faults, replica=s.replica is not None)



def down(*, report: Report | None = None) -> None:
    """Stop the broker and Postgres this stack started (by pid file); keep their data."""
    emit = report or log.info
    s = settings()
    with locked(s):
        for line in s.airflow.stop():
            emit(line)
        if s.faults or s.toxiproxy.pid() is not None:
            emit(s.toxiproxy.stop())
        if s.registry.pidfile.is_file():
            emit(s.registry.stop())
        if s.connect.pidfile.is_file():  # before Kafka: its tasks flush on the way out
            emit(s.connect.stop())
        emit(kafka.stop(s))
        primary = primary_node(s)
        emit(primary.stop())
        second = other_node(s, primary)
        if second.pid() is not None:
            emit(second.stop())


def status() -> list[PartStatus]:
    """Each part with its address and whether it answers right now."""
    s = settings()
    return [*kafka.status(s), *postgres.status(s), airflow_db.status(s), *s.airflow.status(),
            *([s.toxiproxy.status()] if s.faults else []),
            *([s.registry.status()] if s.registry.pidfile.is_file() else []),
            *([s.connect.status()] if s.connect.pidfile.is_file() else [])]


def start_registry(*, report: Report | None = None) -> str:
    """Start only the schema registry, unless it runs, and wait until it answers; return
    its URL. What ``up(registry=True)`` does for it, without Kafka or Postgres: the
    registry's own tests run it on a state dir (and ports) of their own this way."""
    emit = report or log.info
    s = settings()
    with locked(s), ThreadPoolExecutor(max_workers=1) as pool:
        since = time.monotonic()
        emit(schema_registry.await_ready(s, schema_registry.begin(s, pool, emit), since))
    return s.registry.url


def stop_registry(*, report: Report | None = None) -> None:
    """Stop only the schema registry (its schemas go with it: they live in its memory)."""
    emit = report or log.info
    s = settings()
    with locked(s):
        emit(s.registry.stop())


def start_connect(*, report: Report | None = None) -> str:
    """Start only the Kafka Connect worker, unless it runs (Kafka must be up), and wait
    until its REST API answers; return its URL. What ``up(connect=True)`` does for it, with
    nothing else: the mirror's tests start it this way, once per session, when the first
    of them needs it."""
    emit = report or log.info
    s = settings()
    with locked(s), ThreadPoolExecutor(max_workers=1) as pool:
        since = time.monotonic()
        emit(kafka_connect.start(s, kafka_connect.begin(s, pool), since))
    return s.connect.url


def stop_connect(*, report: Report | None = None) -> None:
    """Stop only the Kafka Connect worker (its connectors go with it; their offsets stay
    in ``<state>/connect``)."""
    emit = report or log.info
    s = settings()
    with locked(s):
        emit(s.connect.stop())


def stop_airflow(*, report: Report | None = None) -> None:
    """Stop only Airflow's services (``stack up --airflow`` starts them again)."""
    emit = report or log.info
    s = settings()
    with locked(s):
        for line in s.airflow.stop():
            emit(line)
