"""Breaking the stack on purpose: the durability, chaos and fault tests' controls.

Stop, kill and start one Kafka node; restart every broker or the Postgres primary on the
same data; the pids the tests aim at. (The standby's controls, ``failover`` and
``pause_replication``, are :mod:`kafka_ingest_dev.stack.standby`'s.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from kafka_ingest_dev.procs import StackError, wait_gone
from kafka_ingest_dev.stack import kafka, postgres
from kafka_ingest_dev.stack.postgres import primary_node
from kafka_ingest_dev.stack.settings import locked, settings


def broker_pid(node_id: int) -> int | None:
    """The pid of Kafka node ``node_id`` (its ``node.id``), if it runs."""
    return kafka.cluster_node(settings(), node_id).pid()


def postmaster_pid() -> int | None:
    """The pid of this stack's Postgres primary, if it runs."""
    return primary_node(settings()).pid()


def restart_kafka() -> None:
    """Stop the broker(s) cleanly and start them again on the same data (durability tests)."""
    s = settings()
    with locked(s):
        kafka.stop(s)
        java = kafka.preflight(s)
        for node, pid in [(n, kafka.launch(s, java, n)) for n in s.nodes]:
            node.await_ready(pid)


def stop_broker(node_id: int) -> None:
    """Stop Kafka node ``node_id`` cleanly (SIGTERM: a controlled shutdown that hands its
    partitions' leadership over first); the other nodes keep running."""
    s = settings()
    with locked(s):
        kafka.cluster_node(s, node_id).stop()


def kill_broker(node_id: int) -> int | None:
    """SIGKILL Kafka node ``node_id``, like a machine lost: no controlled shutdown, the
    controller notices when its heartbeats stop. Returns the pid killed (None: not
    running). Not under the stack's lock, so it lands exactly when called."""
    node = kafka.cluster_node(settings(), node_id)
    pid = node.pid()
    if pid is None:
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if not wait_gone(pid, node.stop_timeout_s):
        raise StackError(f"Kafka node {node_id} (pid {pid}) survived SIGKILL")
    node.pidfile.unlink(missing_ok=True)
    return pid


def start_broker(node_id: int) -> int:
    """Start Kafka node ``node_id`` again on its data (a no-op if it runs) and wait until
    it answers and the cluster lists it as a live broker; return its pid."""
    s = settings()
    with locked(s):
        node = kafka.cluster_node(s, node_id)
        pid = node.pid()
        if pid is None:
            pid = kafka.launch(s, kafka.preflight(s, [node]), node)
        node.await_ready(pid)
        if s.brokers > 1:
            kafka.await_brokers(s, [node_id])
        return pid


def restart_postgres(*, immediate: bool = False, down_s: float = 0.0) -> None:
    """Stop the primary (fast mode: connections are cut; ``immediate``: no shutdown
    checkpoint, crash recovery at the start, as after a power loss), wait ``down_s``, and
    start it on the same data (a standby reconnects by itself)."""
    s = settings()
    with locked(s):
        primary_node(s).stop(mode="immediate" if immediate else "fast")
        time.sleep(down_s)
        postgres.start(s)
        postgres.bootstrap(s)
