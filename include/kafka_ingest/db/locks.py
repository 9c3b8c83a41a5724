"""Advisory locks: one writer per (pipeline, partition) at a time."""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from kafka_ingest.errors import DatabaseUnavailable

log = logging.getLogger(__name__)


def lock_partition(conn: psycopg.Connection[Any], name: str, partition: int,
                   *, timeout_s: float) -> None:
    """Take the session advisory lock of (name, partition), waiting up to ``timeout_s``.

    Held by whoever moves the partition's stored cursor (a live or replay slice for the
    whole slice, ``kafka-ingest reset-offsets``), so it spans a slice's chunk transactions
    and dies with the connection (a killed worker never leaves it behind). Slices that
    move no cursor (backfills, dry runs) take none: they never wait for a live slice.
    Failing to get it in time is transient.
    """
    timeout = f"{int(timeout_s * 1000)}"
    try:
        with conn.transaction():  # set_config(..., true) ends with this transaction
            conn.execute("SELECT set_config('lock_timeout', %s, true)", (timeout,))
            conn.execute("SELECT pg_advisory_lock(hashtext(%s), %s)", (name, partition))
    except psycopg.errors.LockNotAvailable as exc:
        raise DatabaseUnavailable(
            "advisory lock",
            f"{name}[{partition}] is being written by another run for over {timeout_s}s",
        ) from exc


def unlock_partition(conn: psycopg.Connection[Any], name: str, partition: int) -> None:
    """Release the session lock; a broken connection has released it already."""
    if conn.closed:
        return
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_unlock(hashtext(%s), %s)", (name, partition))
    except psycopg.Error:
        log.warning("could not release the lock of %s[%d]; it ends with the connection",
                    name, partition)
