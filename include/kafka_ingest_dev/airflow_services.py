"""Airflow for real in the local stack: api-server, scheduler, dag-processor and triggerer.

``kafka-ingest stack up --airflow`` runs the four services Airflow 3 needs on loopback
(port 18080 by default, ``KAFKA_INGEST_AIRFLOW_PORT``) against the stack's metadata
database, with the LocalExecutor sized to the machine (two task slots per core) instead
of its default 32 workers. The UI and the REST API share the api-server; tasks report to
its execution API. Login: the simple auth manager's user ``admin`` with a random password
kept in ``<airflow home>/passwords.json`` (0600) and printed by ``kafka-ingest stack env``
as ``AIRFLOW_API_PASSWORD``.

Each service is a process group of its own (the LocalExecutor's workers are its children),
stopped with SIGTERM, then SIGKILL, by ``stack down``.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka_ingest_dev.procs import CHILDREN, PartStatus, StackError, our_pid, tail, terminate

SERVICES = ("api-server", "scheduler", "dag-processor", "triggerer")
USER = "admin"
_START_TIMEOUT_S = 180.0
_STOP_TIMEOUT_S = 30.0
#: What the api-server's health endpoint reports for each service but itself.
_HEALTH_KEYS = {"scheduler": "scheduler", "dag-processor": "dag_processor",
                "triggerer": "triggerer"}


def _slots() -> int:
    """Task slots for the LocalExecutor: two per core (tasks mostly wait on Kafka and
    Postgres), never fewer than two."""
    return max(2, 2 * (os.cpu_count() or 1))


@dataclass(frozen=True)
class AirflowServices:
    """Airflow's services of one stack: where they keep their state, which port they use."""

    home: Path
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def run_dir(self) -> Path:
        return self.home / "run"

    @property
    def passwords_file(self) -> Path:
        return self.home / "passwords.json"

    def pidfile(self, name: str) -> Path:
        return self.run_dir / f"{name}.pid"

    def logfile(self, name: str) -> Path:
        return self.home / "services" / f"{name}.log"

    def password(self) -> str:
        """The admin's password, made once (the simple auth manager reads this file)."""
        if not self.passwords_file.is_file():
            self.home.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.passwords_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                json.dump({USER: secrets.token_urlsafe(18)}, fh)
        stored: dict[str, str] = json.loads(self.passwords_file.read_text())
        return stored[USER]

    def settings(self) -> dict[str, str]:
        """The Airflow settings every service (and a client of them) needs."""
        return {
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(_slots()),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.passwords_file),
            # New DAG files are seen within seconds, not the default five minutes.
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
        }

    def client_env(self) -> dict[str, str]:
        """What ``stack env`` adds while the services run."""
        return {"AIRFLOW_API_URL": self.url, "AIRFLOW_API_USER": USER,
                "AIRFLOW_API_PASSWORD": self.password()}

    def pids(self) -> dict[str, int | None]:
        # The api-server retitles itself "airflow api_server -- host:... port:...".
        return {name: our_pid(self.pidfile(name), f"airflow {name}",
                              f"airflow {name.replace('-', '_')}") for name in SERVICES}

    def running(self) -> bool:
        return self.pids()["api-server"] is not None

    def start(self, env: Mapping[str, str], report: Callable[[str], None]) -> None:
        """Start the services that are not running (with ``env`` plus :meth:`settings`),
        then wait until the api-server says every one of them is healthy."""
        self.password()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logfile("x").parent.mkdir(parents=True, exist_ok=True)
        full = {**env, **self.settings()}
        since = time.monotonic()
        started = []
        for name, pid in self.pids().items():
            if pid is None:
                started.append(name)
                self._spawn(name, full)
        self._await_healthy()
        took = time.monotonic() - since
        verb = f"started {', '.join(started)} in {took:.1f} s" if started else "already running"
        report(f"airflow: {verb}; UI and REST API on {self.url} (LocalExecutor, {_slots()} "
               f"slots); log in as {USER!r} with AIRFLOW_API_PASSWORD from "
               "`kafka-ingest stack env`")

    def _spawn(self, name: str, env: Mapping[str, str]) -> None:
        args = [sys.executable, "-m", "airflow", name]
        if name == "api-server":
            args += ["--host", "127.0.0.1", "--port", str(self.port)]
        with self.logfile(name).open("ab") as out:
            child = subprocess.Popen(args, env=dict(env), stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        CHILDREN[child.pid] = child
        self.pidfile(name).write_text(f"{child.pid}\n")

    def health(self) -> dict[str, Any] | None:
        """The api-server's health report, or None while it does not answer."""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health",  # noqa: S310
                                        timeout=3) as response:
                report: dict[str, Any] = json.load(response)
                return report
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def _unhealthy(self, report: dict[str, Any] | None) -> list[str]:
        if report is None:
            return ["api-server"]
        return [name for name, key in _HEALTH_KEYS.items()
                if (report.get(key) or {}).get("status") != "healthy"]

    def _await_healthy(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        waiting = list(SERVICES)
        while time.monotonic() < deadline:
            dead = [name for name, pid in self.pids().items() if pid is None]
            if dead:
                raise StackError(f"airflow {dead[0]} exited while starting: "
                                 f"{tail(self.logfile(dead[0]), 3)}")
            waiting = self._unhealthy(self.health())
            if not waiting:
                return
            time.sleep(0.5)
        raise StackError(f"airflow {', '.join(waiting)} not healthy within "
                         f"{_START_TIMEOUT_S:.0f} s; see {self.logfile(waiting[0])}")

    def stop(self) -> list[str]:
        lines = []
        for name, pid in self.pids().items():
            if pid is None:
                self.pidfile(name).unlink(missing_ok=True)
                continue
            terminate(pid, _STOP_TIMEOUT_S, group=True)
            self.pidfile(name).unlink(missing_ok=True)
            lines.append(f"airflow {name}: stopped (pid {pid})")
        return lines or ["airflow services: not running"]

    def status(self) -> list[PartStatus]:
        pids = self.pids()
        if not any(pids.values()):
            return []
        unhealthy = self._unhealthy(self.health())
        return [PartStatus(name, self.url if name == "api-server" else "-",
                           pid is not None and name not in unhealthy, pid)
                for name, pid in pids.items()]
