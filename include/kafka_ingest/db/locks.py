"""Advisory locks: one writer per (pipeline, partition) at a time."""

from __future__ import annotations

import logging
from collections.abc import Iterable
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


def hold_keys(conn: psycopg.Connection[Any], name: str, partitions: Iterable[int],
              *, timeout_s: float, every: bool = False) -> None:
    """Take the transaction advisory locks of (``name``, partition) for each partition, in
    order (no deadlock), waiting up to ``timeout_s`` each; held until the transaction ends.

    A deleting pipeline's chunk transactions take them for the source partitions they
    write (a key lives in one partition): its rows and its deletion markers are two tables,
    and each statement at READ COMMITTED decides from its own snapshot, so two
    transactions writing the same keys at once (a live chunk and a backfill or a replay
    beside it) could each miss the other's row or marker. Held, they run one after the
    other; a backfill waits at most one live chunk. Failing to get one in time is
    transient.

    Before them, each takes (``name``, -1) shared; ``every`` takes it exclusive instead,
    holding the keys of every partition: for a transaction whose keys may sit in other
    partitions than the chunks beside it write them in, yet be ordered against them (a
    replay: the letters of an older incarnation of a topic created again with other
    partitions; orderable, by the incarnation, wherever they sit).
    """
    given = sorted(set(partitions))
    if not given:
        return
    wanted = [] if every else given
    row = conn.execute("SELECT current_setting('lock_timeout')").fetchone()
    before = str(row[0]) if row else "0"
    try:
        conn.execute("SELECT set_config('lock_timeout', %s, true)",
                     (f"{int(timeout_s * 1000)}",))
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s), -1)" if every
                     else "SELECT pg_advisory_xact_lock_shared(hashtext(%s), -1)", (name,))
        for partition in wanted:
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s), %s)", (name, partition))
        conn.execute("SELECT set_config('lock_timeout', %s, true)", (before,))
    except psycopg.errors.LockNotAvailable as exc:
        held = "every partition" if every else str(wanted)
        raise DatabaseUnavailable(
            "advisory lock", f"the keys of {name} ({held}) are being written by another "
            f"transaction for over {timeout_s}s") from exc
