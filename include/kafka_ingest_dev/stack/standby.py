"""A streaming standby of the stack's Postgres, and failing over to it.

``up --replica`` (``--sync``): a standby under ``<state>/postgres-standby`` on
``127.0.0.1:15434`` (``KAFKA_INGEST_PG_STANDBY_PORT``), made by ``pg_basebackup`` through
a replication slot; asynchronous, or synchronous (``synchronous_standby_names``,
``synchronous_commit = remote_apply``) with ``--sync``. :func:`failover` SIGKILLs the
primary, promotes the standby and makes the dead primary's place a fresh standby of the
new one; :func:`pause_replication` cuts the standby off (the failover tests make it miss
acknowledged transactions so); :func:`remove_replica` removes it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import time
from dataclasses import dataclass

from kafka_ingest_dev.procs import StackError, tail, wait_gone
from kafka_ingest_dev.stack import postgres, proxies
from kafka_ingest_dev.stack.postgres import PgNode, other_node, primary_node
from kafka_ingest_dev.stack.settings import Report, Settings, locked, settings

log = logging.getLogger(__name__)

FAILOVER_TIMEOUT_S = 60.0
_POLL_S = 0.1


def await_streaming(s: Settings, primary: PgNode, timeout_s: float = FAILOVER_TIMEOUT_S,
                    ) -> None:
    """Until the standby streams from ``primary`` and has applied all the WAL the primary
    had written when the wait began (asked of the standby: the primary hears of the
    standby's apply position only now and then)."""
    standby = other_node(s, primary)
    with postgres.admin(primary) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    target = row[0] if row else None
    deadline = time.monotonic() + timeout_s
    while True:
        seen = postgres.replication(primary)
        if seen is not None and seen[0] == "streaming" and _applied(standby, target):
            return
        if time.monotonic() > deadline:
            raise StackError(f"{standby.name} is not streaming from {primary.name} after "
                             f"{timeout_s:.0f} s (seen: {seen}): {tail(standby.logfile, 3)}")
        time.sleep(_POLL_S)


def _applied(standby: PgNode, target: str | None) -> bool:
    """The standby has replayed WAL up to ``target`` (False while it answers nothing)."""
    try:
        with postgres.admin(standby) as conn:
            row = conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn",
                               (target,)).fetchone()
    except Exception:  # starting up: not yet
        return False
    return bool(row and row[0])  # NULL: nothing replayed yet


def _make_standby(primary: PgNode, standby: PgNode) -> None:
    """A fresh standby of ``primary`` in ``standby``'s place: ``pg_basebackup`` (WAL
    streamed, a fast checkpoint) into an emptied data directory, through a replication
    slot made for it (dropped first if an earlier standby left one)."""
    if standby.pid() is not None:
        raise StackError(f"{standby.name} runs: stop it before it is made again")
    postgres.drop_standby_slot(primary)
    shutil.rmtree(standby.data, ignore_errors=True)
    standby.paused_marker.unlink(missing_ok=True)
    standby.home.mkdir(parents=True, exist_ok=True)
    postgres.chown_postgres(standby.home)
    postgres.run([str(postgres.bindir() / "pg_basebackup"), "-D", str(standby.data),
                  "-h", str(primary.socket_dir), "-p", str(primary.port), "-U", "postgres",
                  "-X", "stream", "-c", "fast", "-C", "-S", postgres.STANDBY_NAME,
                  "--no-password"],
                 f"pg_basebackup of {primary.name} into {standby.name}")
    signal_file = standby.data / "standby.signal"
    signal_file.touch()
    postgres.chown_postgres(signal_file)
    for leftover in ("postmaster.opts", "postmaster.pid"):
        (standby.data / leftover).unlink(missing_ok=True)


def _ensure_standby(s: Settings, emit: Report) -> None:
    """``--replica``: the standby made (once) and running, streaming from the primary;
    under ``--sync`` the primary then waits for it on every commit."""
    primary = primary_node(s)
    standby = other_node(s, primary)
    since = time.monotonic()
    made = not standby.exists or not standby.standby
    if made:
        _make_standby(primary, standby)
    pid, started = postgres.start(s, standby)
    if standby.paused_marker.is_file():
        emit(f"{standby.name}: running (pid {pid}), replication paused "
             f"({standby.paused_marker}): pause_replication(False) resumes it")
        return
    await_streaming(s, primary)
    postgres.reconfigure(s, primary)  # --sync: synchronous_standby_names, once it streams
    what = "made from the primary and started" if made else "started" if started else "running"
    emit(f"{standby.name}: {what} on 127.0.0.1:{standby.port} (pid {pid}), {s.replica} "
         f"replication from {primary.name}, streaming, in {time.monotonic() - since:.1f} s")


def set_replica(s: Settings, replica: str | None) -> None:
    """Record ``up --replica``'s mode (``async``/``sync``); None keeps what is recorded."""
    if replica is None:
        return
    if replica not in ("async", "sync"):
        raise StackError(f"replica={replica!r}: choose async or sync")
    s.replica_marker.write_text(f"{replica}\n")


def start_nodes(s: Settings, emit: Report) -> None:
    """The primary, then (``--replica``) its standby: before any commit, since under
    ``--sync`` a commit waits for the standby."""
    since = time.monotonic()
    primary = primary_node(s)
    pid, started = postgres.start(s, primary)
    if primary.standby:  # a failover cut short between its kill and the end of its promote
        _promote(s, primary)
    emit(primary.started(pid, started, since))
    if s.replica is None:  # a standby removed while the primary was down left its slot
        postgres.drop_standby_slot(primary, inactive_only=True)
    else:
        _ensure_standby(s, emit)


# --------------------------------------------------------------------------- failover


@dataclass(frozen=True)
class Failover:
    """What :func:`failover` did: the node killed, the node promoted, how far the standby
    was behind when the primary died (bytes of WAL it had not applied: with asynchronous
    replication, the last transactions the old primary acknowledged are gone with them),
    and how long the promotion and the rebuild of the new standby took."""

    killed: str
    killed_pid: int
    promoted: str
    port: int
    unapplied_bytes: int | None
    promote_s: float
    rebuild_s: float | None

    def line(self) -> str:
        behind = ("unknown" if self.unapplied_bytes is None
                  else f"{self.unapplied_bytes} bytes of WAL")
        rebuilt = ("not rebuilt" if self.rebuild_s is None
                   else f"rebuilt as its standby in {self.rebuild_s:.1f} s")
        return (f"failover: killed {self.killed} (pid {self.killed_pid}; its standby was "
                f"behind by {behind}), promoted {self.promoted} on 127.0.0.1:{self.port} in "
                f"{self.promote_s:.1f} s; {self.killed} {rebuilt}")


def failover(*, rebuild: bool = True, report: Report | None = None) -> Failover:
    """SIGKILL the primary (no shutdown checkpoint, no last WAL sent: a machine lost) and
    promote the standby; then, unless ``rebuild`` is False, make the dead primary's place
    a fresh standby of the new primary (``pg_basebackup``), so a second failover moves
    the primary back. Clients on ``stack env --replica``'s multi-host connection string
    (``target_session_attrs=read-write``) reach the new primary on their next connect."""
    emit = report or log.info
    s = settings()
    with locked(s):
        if s.replica is None:
            raise StackError("the stack has no standby: run `kafka-ingest stack up --replica`")
        old = primary_node(s)
        new = other_node(s, old)
        old_pid, new_pid = old.pid(), new.pid()
        if old_pid is None or new_pid is None or not new.standby:
            raise StackError(f"failover needs {old.name} running as the primary and "
                             f"{new.name} as its standby: run `kafka-ingest stack up`")
        behind = _wal_behind(old, new)
        kill_postmaster(old_pid)
        # From here the old primary never comes back as one: a failover cut short (a
        # time-out, a crash) leaves the marker on the node being promoted, and the next
        # `stack up` finishes the promotion.
        s.primary_marker.write_text(f"{new.name}\n")
        proxies.repoint(s)
        since = time.monotonic()
        _promote(s, new)
        promote_s = time.monotonic() - since
        rebuild_s = _rebuild(s, new, old) if rebuild else None
        done = Failover(old.name, old_pid, new.name, new.port, behind, promote_s, rebuild_s)
    emit(done.line())
    return done


def _rebuild(s: Settings, new: PgNode, old: PgNode) -> float:
    """Make ``old`` a standby of the promoted ``new``; how long it took."""
    since = time.monotonic()
    try:
        _make_standby(new, old)
        postgres.start(s, old)
        await_streaming(s, new)
        postgres.reconfigure(s, new)
    except Exception as exc:
        raise StackError(f"{new.name} was promoted (the primary, on 127.0.0.1:{new.port}); "
                         f"making {old.name} its standby failed: {exc}") from exc
    return time.monotonic() - since


def _promote(s: Settings, node: PgNode) -> None:
    postgres.run([str(postgres.bindir() / "pg_ctl"), "-D", str(node.data), "-w", "-t",
                  str(int(FAILOVER_TIMEOUT_S)), "promote"], f"pg_ctl promote ({node.name})",
                 timeout_s=FAILOVER_TIMEOUT_S + 30)
    postgres.reconfigure(s, node)  # no primary_conninfo; no synchronous standby until rebuilt


def _wal_behind(primary: PgNode, standby: PgNode) -> int | None:
    """Bytes of WAL the primary wrote that the standby has not applied (None: one of them
    does not answer)."""
    try:
        with postgres.admin(primary) as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        with postgres.admin(standby) as conn:
            behind = conn.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn,"
                                  " pg_last_wal_replay_lsn())::bigint",
                                  (row[0] if row else None,)).fetchone()
    except Exception:  # a primary not answering still fails over
        return None
    return None if behind is None or behind[0] is None else max(0, int(behind[0]))


def kill_postmaster(pid: int) -> None:
    """SIGKILL a postmaster and wait until its backends noticed and exited too (they
    hold its shared memory: the data directory is not free before)."""
    import psutil

    children: list[psutil.Process] = []
    with contextlib.suppress(psutil.Error):
        children = psutil.Process(pid).children(recursive=True)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if not wait_gone(pid, postgres.TIMEOUT_S):
        raise StackError(f"the postmaster (pid {pid}) survived SIGKILL")
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.wait(postgres.TIMEOUT_S)


def pause_replication(paused: bool = True) -> None:
    """Cut the standby off from the primary (its WAL receiver stops; the primary goes on
    committing: under ``--sync`` its commits wait) or, with ``paused`` False, let it
    stream again and catch up. The failover tests use it to make an asynchronous
    standby miss transactions the primary acknowledged."""
    s = settings()
    with locked(s):
        primary = primary_node(s)
        standby = other_node(s, primary)
        if s.replica is None or standby.pid() is None:
            raise StackError("no standby runs: run `kafka-ingest stack up --replica`")
        if paused:
            standby.paused_marker.write_text("replication paused by pause_replication()\n")
        else:
            standby.paused_marker.unlink(missing_ok=True)
        postgres.reconfigure(s, standby)
        if not paused:
            await_streaming(s, primary)
            return
        deadline = time.monotonic() + FAILOVER_TIMEOUT_S
        while postgres.replication(primary) is not None:
            if time.monotonic() > deadline:
                raise StackError(f"{standby.name} still streams after its conninfo was "
                                 "emptied")
            time.sleep(_POLL_S)


def remove_replica(*, report: Report | None = None) -> None:
    """``stack down --replica``: stop the standby, delete its data and its slot, and
    forget ``--replica``. The primary must be the stack's first node (after an odd number
    of failovers, fail over once more first)."""
    emit = report or log.info
    s = settings()
    with locked(s):
        first, second = s.pg_nodes
        if primary_node(s) != first:
            raise StackError(f"{second.name} is the primary: run `kafka-ingest stack "
                             "failover` to move it back first")
        s.replica_marker.unlink(missing_ok=True)
        postgres.reconfigure(s, first)  # no synchronous standby to wait for from here on
        emit(second.stop())
        shutil.rmtree(second.home, ignore_errors=True)
        if first.pid() is not None:
            postgres.drop_standby_slot(first)
        emit(f"{second.name}: removed; the stack has no standby")
