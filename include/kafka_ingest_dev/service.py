"""One process of the local stack, as every dev service is run: :class:`LocalService`.

Kafka's nodes, Postgres' servers, the schema registry, Toxiproxy, Prometheus, Redis and
Airflow's services differ in how they start and how they answer; what they share is
written once here: where a service lives (``home``, its pid file and log), how its
process is told from another that got its pid (:meth:`~LocalService.markers`), how it is
spawned (its own session, stdout and stderr to its log, the environment of
:func:`~kafka_ingest_dev.procs.child_env`), how a start is waited for (its answer, with a
deadline, failing at once with its log's tail if the process exits), how it is stopped
(SIGTERM, then SIGKILL) and what ``stack status`` says of it.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from kafka_ingest_dev.procs import (
    CHILDREN,
    PartStatus,
    StackError,
    alive,
    child_env,
    our_pid,
    tail,
    terminate,
)

_POLL_S = 0.1


class LocalService:
    """A process of the local stack: started by this package, found by its pid file.

    A subclass (usually a frozen dataclass) gives :attr:`name`, :attr:`home`,
    :attr:`address`, :meth:`markers` and :meth:`answers` (and :attr:`pidfile`,
    :attr:`logfile` when they are not ``<home>/<name>.pid`` and ``.log``); a service
    started by a tool of its own (Postgres' ``pg_ctl``) overrides :meth:`stop` and never
    calls :meth:`spawn`.
    """

    #: Its name in ``stack status`` and in the lines ``up`` and ``down`` print.
    name: str
    #: Its directory: configuration, pid file, log, data.
    home: Path
    #: How long :meth:`await_ready` waits for its first answer, and :meth:`stop` for
    #: SIGTERM to end it (then SIGKILL, as long again).
    start_timeout_s: float = 60.0
    stop_timeout_s: float = 30.0

    @property
    def pidfile(self) -> Path:
        """``<home>/<name>.pid`` unless the service keeps it elsewhere."""
        return self.home / f"{self.name}.pid"

    @property
    def logfile(self) -> Path:
        """``<home>/<name>.log`` unless the service logs elsewhere."""
        return self.home / f"{self.name}.log"

    @property
    def address(self) -> str:
        """Where it listens, as ``stack status`` shows it."""
        raise NotImplementedError

    def markers(self) -> tuple[str, ...]:
        """Strings only our process has on its command line (any one suffices): a path of
        this state directory, so a pid reused by another process is not taken for ours."""
        raise NotImplementedError

    def answers(self) -> bool:
        """Health: it serves a client right now."""
        raise NotImplementedError

    # ----------------------------------------------------------------------- lifecycle

    def pid(self) -> int | None:
        """Its pid, if it runs and is the one we started."""
        return our_pid(self.pidfile, *self.markers())

    def spawn(self, command: Sequence[str], *env: Mapping[str, str] | None,
              cwd: Path | None = None) -> int:
        """Start ``command`` in a session of its own, its output appended to the log, with
        ``child_env(*env)`` (never the user's libpq variables); write the pid file and
        return the pid. Does not wait: :meth:`await_ready` does."""
        for directory in {self.home, self.logfile.parent, self.pidfile.parent}:
            directory.mkdir(parents=True, exist_ok=True)
        with self.logfile.open("ab") as out:
            child = subprocess.Popen(list(command), stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, cwd=cwd or self.home,
                                     start_new_session=True, env=child_env(*env))
        CHILDREN[child.pid] = child
        self.pidfile.write_text(f"{child.pid}\n")
        return child.pid

    def await_ready(self, pid: int, timeout_s: float | None = None) -> None:
        """Poll :meth:`answers` until it says yes; raise :class:`StackError` with the log's
        tail as soon as ``pid`` exits, or after ``timeout_s`` (:attr:`start_timeout_s`)."""
        timeout_s = self.start_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while not self.answers():
            if not alive(pid):
                self.pidfile.unlink(missing_ok=True)
                raise StackError(f"{self.name} exited while starting: {tail(self.logfile)}")
            if time.monotonic() > deadline:
                raise StackError(f"{self.name} did not answer on {self.address} within "
                                 f"{timeout_s:.0f} s; see {self.logfile}")
            time.sleep(_POLL_S)

    def stop(self) -> str:
        """SIGTERM (each of these shuts down cleanly), SIGKILL after
        :attr:`stop_timeout_s`; the line ``stack down`` prints."""
        pid = self.pid()
        if pid is None:
            self.pidfile.unlink(missing_ok=True)
            return f"{self.name}: not running"
        terminate(pid, self.stop_timeout_s)
        self.pidfile.unlink(missing_ok=True)
        return f"{self.name}: stopped (pid {pid})"

    def status(self) -> PartStatus:
        """Its line in ``stack status``: up only if the process is ours and answers."""
        pid = self.pid()
        healthy = pid is not None and self.answers()
        detail = "" if healthy or pid is None else "process alive, not answering"
        return PartStatus(self.name, self.address, healthy, pid, detail)

    def started(self, pid: int, started: bool, since: float, *,
                where: str | None = None) -> str:
        """The line ``up`` prints: started now (and how long it took) or found running;
        ``where`` says more than :attr:`address` (Toxiproxy's proxies)."""
        where = where or self.address
        if not started:
            return f"{self.name}: already running on {where} (pid {pid})"
        return f"{self.name}: started on {where} (pid {pid}) in {time.monotonic() - since:.1f} s"
