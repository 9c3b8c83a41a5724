"""Processes of the local stack: pid files that cannot be fooled by a reused pid, clean
stops (SIGTERM, then SIGKILL), ports, the environment its processes start with, and the
one error the stack raises."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_POLL_S = 0.1

#: libpq's environment variables (PostgreSQL 18), each a default for a connection setting
#: or a session setting, and those the server programs read themselves (``postgres``:
#: PGPORT as its port, PGDATA, PGDATESTYLE, PGCLIENTENCODING; ``pg_ctl``: PGCTLTIMEOUT).
#: A user's shell holds some for its own psql (``stack env --replica`` exports
#: ``PGPORT=15432,15434``, which no server can listen on); the stack's own processes must
#: not read them.
LIBPQ_VARIABLES = frozenset({
    "PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGPASSWORD", "PGPASSFILE",
    "PGREQUIREAUTH", "PGCHANNELBINDING", "PGSERVICE", "PGSERVICEFILE", "PGOPTIONS",
    "PGAPPNAME", "PGSSLMODE", "PGREQUIRESSL", "PGSSLNEGOTIATION", "PGSSLCOMPRESSION",
    "PGSSLCERT", "PGSSLKEY", "PGSSLCERTMODE", "PGSSLROOTCERT", "PGSSLCRL", "PGSSLCRLDIR",
    "PGSSLSNI", "PGREQUIREPEER", "PGSSLMINPROTOCOLVERSION", "PGSSLMAXPROTOCOLVERSION",
    "PGMINPROTOCOLVERSION", "PGMAXPROTOCOLVERSION", "PGGSSENCMODE", "PGKRBSRVNAME",
    "PGGSSLIB", "PGGSSDELEGATION", "PGCONNECT_TIMEOUT", "PGCLIENTENCODING",
    "PGTARGETSESSIONATTRS", "PGLOADBALANCEHOSTS", "PGOAUTHDEBUG",
    "PGDATESTYLE", "PGTZ", "PGGEQO", "PGSYSCONFDIR", "PGLOCALEDIR",
    "PGDATA", "PGCTLTIMEOUT",
})

#: Values that stand for "libpq's built-in default" where an empty one does not (the
#: authentication methods: every one the stack's servers use, ``none`` for trust).
_NEUTRAL = {"min_protocol_version": "3.0", "max_protocol_version": "3.0",
            "sslcertmode": "allow", "require_auth": "password,md5,scram-sha-256,none",
            "connect_timeout": "0"}


def child_env(*layers: Mapping[str, str] | None) -> dict[str, str]:
    """The environment of a process the stack starts: this process's, without the user's
    libpq variables (:data:`LIBPQ_VARIABLES`), then ``layers`` on top in order (the
    stack's own settings: a PG* variable there is set on purpose and stays)."""
    env = {k: v for k, v in os.environ.items() if k not in LIBPQ_VARIABLES}
    for layer in layers:
        env.update(layer or {})
    return env


def own_libpq(**params: Any) -> dict[str, Any]:
    """``params`` for an in-process libpq connection of the stack's own (its superuser
    over the unix socket, its health probes), plus libpq's built-in default for every
    setting whose variable is set here and that ``params`` leaves out: libpq reads the
    environment at each connect, and ``os.environ`` cannot be changed safely in a process
    with threads. (PGSERVICE has no neutral value and is left as it is; PGDATESTYLE, PGTZ
    and PGGEQO are session settings, harmless when valid.)"""
    import psycopg

    pinned = dict(params)
    for option in psycopg.pq.Conninfo.get_defaults():
        keyword = option.keyword.decode()
        variable = option.envvar.decode() if option.envvar else None
        if (variable is None or variable not in os.environ or keyword in pinned
                or keyword == "service"):
            continue
        default = option.compiled.decode() if option.compiled is not None else None
        pinned[keyword] = default if default is not None else _NEUTRAL.get(keyword, "")
    return pinned

# Processes started by this interpreter, so they can be reaped (not left as zombies that
# still look alive) when the same process also stops them, as the tests do.
CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


class StackError(RuntimeError):
    """The stack cannot be brought up: a missing binary, a busy port, a part that died.

    The message is one line saying what to install or free; ``main`` prints it and exits 2.
    """



def reap(pid: int) -> None:
    """Collect our own exited child so it stops looking alive."""
    child = CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        CHILDREN.pop(pid, None)


def alive(pid: int) -> bool:
    """True while ``pid`` is a live, non-zombie process."""
    reap(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return True


def cmdline(pid: int) -> str | None:
    """The command line of ``pid``, or None where /proc is not available."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None


def our_pid(pidfile: Path, *markers: str) -> int | None:
    """The pid in ``pidfile`` if that process is alive and is the one we started.

    A marker (a path only our process has on its command line; any of several, for a
    process that retitles itself) guards against a pid reused by an unrelated process
    after a reboot or crash. An empty command line says nothing: setproctitle clears it
    for an instant while it retitles the process.
    """
    try:
        pid = int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if not alive(pid):
        return None
    command = cmdline(pid)
    if command is None or not command.strip():  # no /proc, or being retitled right now
        return pid
    return pid if any(m in command for m in markers) else None


def wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(_POLL_S)
    return not alive(pid)


def terminate(pid: int, timeout_s: float, *, group: bool = False) -> None:
    """SIGTERM (a clean, durable shutdown), then SIGKILL if it does not exit in time;
    ``group``: to the whole process group the process leads (its workers too)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        if wait_gone(pid, timeout_s):
            return
    raise StackError(f"process {pid} survived SIGKILL; stop it by hand")


def port_free(port: int) -> bool:
    """Whether a listener could bind 127.0.0.1:port (TIME_WAIT does not count as busy)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def require_free(port: int, what: str, env_name: str) -> None:
    if not port_free(port):
        raise StackError(
            f"port 127.0.0.1:{port} for {what} is held by a process this stack did not "
            f"start: stop it, or choose another port with {env_name}"
        )


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (held together while they are picked, so two
    calls cannot hand out one port twice)."""
    socks = []
    try:
        for _ in range(n):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def accepts(port: int) -> bool:
    """A cheap, silent liveness probe before asking a client library (which logs errors)."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
        return True
    return False


def read_or_none(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:])


def binary(name: str, install: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise StackError(f"{name} not found on PATH: install {install}")
    return found


@dataclass(frozen=True)
class PartStatus:
    """One part of the stack as ``status`` sees it."""

    name: str
    address: str
    up: bool
    pid: int | None = None
    detail: str = ""

    def line(self) -> str:
        """Render as the fixed-width line ``stack status`` prints."""
        state = "up" if self.up else "down"
        pid = f" pid {self.pid}" if self.pid else ""
        detail = f" ({self.detail})" if self.detail else ""
        return f"{self.name:<16} {state:<5} {self.address}{pid}{detail}"
