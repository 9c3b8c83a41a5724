"""Airflow for real in the local stack: api-server, scheduler, dag-processor and triggerer,
with the LocalExecutor or the CeleryExecutor (Redis and N Celery workers).

``kafka-ingest stack up --airflow`` runs the four services Airflow 3 needs on loopback
(port 18080 by default, ``KAFKA_INGEST_AIRFLOW_PORT``) against the stack's metadata
database, with the LocalExecutor sized to the machine (two task slots per core) instead
of its default 32 workers. The UI and the REST API share the api-server; tasks report to
its execution API. Login: the simple auth manager's user ``admin`` with a random password
kept in ``<airflow home>/passwords.json`` (0600) and printed by ``kafka-ingest stack env``
as ``AIRFLOW_API_PASSWORD``.

``--executor celery --workers N`` adds Debian's ``redis-server`` on 127.0.0.1 (port 16379,
``KAFKA_INGEST_REDIS_PORT``; no persistence: a queue lost with Redis is re-sent by the
scheduler) as the broker, the metadata database as Celery's result backend, and N
``airflow celery worker`` processes named ``worker-<i>@<host>``. Each worker reports its
own name as the task instances' ``hostname`` (``[core] hostname_callable`` is
:func:`worker_hostname`; Celery's ``--celery-hostname`` alone does not reach Airflow), so
the UI and the REST API say which worker ran which slice. The machine's task slots (two
per core) are shared out among the workers. Logs go to the shared local log folder, which
the api-server reads directly (one machine), so the workers serve none.

The executor is kept while the services run (``up --airflow`` without ``--executor``
keeps it); asking for another one, or another number of workers, stops every service and
starts them anew. Each process is a process group of its own (the executors' task
processes are its children), stopped with SIGTERM, then SIGKILL, by ``stack down``.

When the pipelines file names Airflow pools (``pool``, ``pool_slots``), ``up --airflow``
creates or resizes them with ``airflow pools import``, as a deployment would.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kafka_ingest_dev.procs import (
    PartStatus,
    StackError,
    alive,
    binary,
    read_or_none,
    require_free,
    tail,
    wait_gone,
)
from kafka_ingest_dev.service import LocalService

SERVICES = ("api-server", "scheduler", "dag-processor", "triggerer")
EXECUTORS = {"local": "LocalExecutor", "celery": "CeleryExecutor"}
DEFAULT_WORKERS = 2
REDIS_PORT = 16379
USER = "admin"
#: ``[core] hostname_callable`` of the stack's Celery workers.
HOSTNAME_CALLABLE = "kafka_ingest_dev.airflow_services.worker_hostname"
#: The worker's name, read by :func:`worker_hostname` in the worker's task processes.
WORKER_NAME_ENV = "KAFKA_INGEST_WORKER_NAME"
_START_TIMEOUT_S = 180.0
#: How long a task's call to the execution API waits for the api-server (Airflow's 5 s is
#: too short for a loaded two-core machine: :meth:`AirflowServices.settings`).
EXECUTION_API_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 30.0
#: The triggerer ends on SIGTERM only once its trigger runner's loop comes round (12 s
#: measured); a second SIGTERM, this long after the first, is its own forced exit (2 s),
#: which loses nothing: its triggers are rows in the metadata database, picked up by the
#: next triggerer.
_NUDGE_S = 2.0
_POOLS_TIMEOUT_S = 120.0
#: What the api-server's health endpoint reports for each service but itself.
_HEALTH_KEYS = {"scheduler": "scheduler", "dag-processor": "dag_processor",
                "triggerer": "triggerer"}


def worker_hostname() -> str:
    """The ``[core] hostname_callable`` of the stack's Celery workers: the worker's name
    (``worker-<i>@<host>``, from ``KAFKA_INGEST_WORKER_NAME``), else the machine's FQDN.

    Airflow records this as each task instance's ``hostname``; its default (the FQDN)
    would give every worker on one machine the same one.
    """
    return os.environ.get(WORKER_NAME_ENV) or socket.getfqdn()


def _slots() -> int:
    """Task slots of the machine: two per core (tasks mostly wait on Kafka and Postgres),
    never fewer than two."""
    return max(2, 2 * (os.cpu_count() or 1))


@dataclass(frozen=True)
class Executor:
    """Which executor the services run with; ``workers`` counts Celery workers."""

    name: str = "local"
    workers: int = 0

    def __post_init__(self) -> None:
        if self.name not in EXECUTORS:
            raise StackError(f"unknown executor {self.name!r}: one of {', '.join(EXECUTORS)}")
        if self.celery and self.workers < 1:
            raise StackError("the Celery executor needs at least one worker (--workers N)")

    @property
    def celery(self) -> bool:
        return self.name == "celery"

    @property
    def concurrency(self) -> int:
        """Task slots per Celery worker: the machine's slots shared out, at least one."""
        return max(1, _slots() // self.workers) if self.celery else 0

    @property
    def parallelism(self) -> int:
        return self.concurrency * self.workers if self.celery else _slots()

    def describe(self) -> str:
        if not self.celery:
            return f"LocalExecutor, {self.parallelism} slots"
        return (f"CeleryExecutor, {self.workers} worker(s) x {self.concurrency} slots, "
                "Redis broker")

    def worker_names(self) -> list[str]:
        host = socket.gethostname()
        return [f"worker-{i}@{host}" for i in range(1, self.workers + 1)]


def _result_backend(sql_alchemy_conn: str) -> str:
    """Celery's result backend in the metadata database: ``db+postgresql://...``."""
    scheme, sep, rest = sql_alchemy_conn.partition("://")
    if not sep:
        raise StackError("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN is not a database URL")
    return f"db+{scheme.split('+')[0]}://{rest}"


def _health(url: str) -> dict[str, Any] | None:
    """The api-server's health report, or None while it does not answer."""
    try:
        with urllib.request.urlopen(f"{url}/api/v2/monitor/health",  # noqa: S310
                                    timeout=3) as response:
            report: dict[str, Any] = json.load(response)
            return report
    except (OSError, urllib.error.URLError, ValueError):
        return None


def _unhealthy(report: dict[str, Any] | None) -> list[str]:
    """The services the api-server's report does not call healthy (all, without one)."""
    if report is None:
        return ["api-server"]
    return [name for name, key in _HEALTH_KEYS.items()
            if (report.get(key) or {}).get("status") != "healthy"]


def _ping(broker_url: str, names: list[str], timeout_s: float) -> set[str]:
    """The Celery workers (node names) that answer a ping through the broker."""
    from celery import Celery

    app = Celery(broker=broker_url)
    try:
        replies = app.control.ping(destination=names, timeout=timeout_s) or []
    except Exception:  # the broker went away mid-ping: nobody answered
        return set()
    finally:
        app.close()
    return {node for reply in replies for node in reply}


def _spawned_alive(process: LocalService) -> bool:
    """Whether the process in its pid file lives: a service just started may be rewriting
    its title (setproctitle clears it first), so its marker cannot be asked for here;
    seconds after we wrote the pid file it cannot be a reused pid either."""
    try:
        return alive(int(process.pidfile.read_text().split()[0]))
    except (OSError, ValueError, IndexError):
        return False


@dataclass(frozen=True)
class AirflowProcess(LocalService):
    """One of Airflow's processes: a service (``api-server``, ``scheduler``,
    ``dag-processor``, ``triggerer``) or a Celery worker (``worker-<i>``), each the leader
    of a process group of its own (the executors' task processes are its children), its
    pid file in ``<home>/run``, its log in ``<home>/services``."""

    name: str
    home: Path
    #: The api-server's URL (the services' health report); the Celery broker.
    api_url: str
    broker: Redis

    @property
    def pidfile(self) -> Path:
        return self.home / "run" / f"{self.name}.pid"

    @property
    def logfile(self) -> Path:
        return self.home / "services" / f"{self.name}.log"

    @property
    def worker(self) -> bool:
        return self.name.startswith("worker-")

    @property
    def node(self) -> str:
        """A worker's Celery node name, ``worker-<i>@<host>``."""
        return f"{self.name}@{socket.gethostname()}"

    @property
    def address(self) -> str:
        if self.worker:
            return self.node
        return self.api_url if self.name == "api-server" else "-"

    def markers(self) -> tuple[str, ...]:
        # The api-server retitles itself "airflow api_server -- host:... port:..."; Celery
        # retitles its worker "[celeryd: worker-1@host:MainProcess] ...".
        if self.worker:
            return f"{self.name}@", f"--celery-hostname {self.name}@"
        return f"airflow {self.name}", f"airflow {self.name.replace('-', '_')}"

    def answers(self) -> bool:
        """The api-server's report calls it healthy; a worker answers a ping."""
        if self.worker:
            return self.broker.answers() and self.node in _ping(self.broker.url, [self.node], 1.0)
        return self.name not in _unhealthy(_health(self.api_url))


@dataclass(frozen=True)
class Redis(LocalService):
    """Debian's ``redis-server``, the Celery broker: loopback only, no persistence (a
    lost queue is re-sent by the scheduler); its files in ``<airflow home>/redis``, its
    pid file and log beside the services'."""

    #: ``<airflow home>/redis``.
    home: Path
    port: int
    name = "redis"
    start_timeout_s = 30.0

    @property
    def conf(self) -> Path:
        return self.home / "redis.conf"

    @property
    def pidfile(self) -> Path:
        return self.home.parent / "run" / "redis.pid"

    @property
    def logfile(self) -> Path:
        return self.home.parent / "services" / "redis.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def markers(self) -> tuple[str, ...]:
        """Redis shows the config file its title template names."""
        return (str(self.conf),)

    def answers(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(
                ("127.0.0.1", self.port), 1.0) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
        return False

    def config(self) -> str:
        """Loopback only, no persistence (a lost queue is re-sent by the scheduler)."""
        return (
            "# Written by kafka-ingest stack up on every start; edit airflow_services.py.\n"
            "bind 127.0.0.1\n"
            f"port {self.port}\n"
            f"dir {self.home}\n"
            'save ""\n'
            "appendonly no\n"
            "protected-mode yes\n"
            "daemonize no\n"
            # The config file's path in the process title: what tells our Redis from another.
            'proc-title-template "{title} {listen-addr} {config-file}"\n'
        )

    def start(self) -> bool:
        """Start Redis unless it runs and wait until it answers; whether it started."""
        if self.pid() is not None:
            return False
        server = binary("redis-server", "Redis (apt-get install redis-server)")
        require_free(self.port, "Redis (the Celery broker)", "KAFKA_INGEST_REDIS_PORT")
        self.home.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(self.config())
        self.await_ready(self.spawn([server, str(self.conf)]))
        return True


@dataclass(frozen=True)
class AirflowServices:
    """Airflow's services of one stack: where they keep their state, which ports they use."""

    home: Path
    port: int
    redis_port: int = REDIS_PORT

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def broker_url(self) -> str:
        return self.redis.url

    @property
    def run_dir(self) -> Path:
        return self.home / "run"

    @property
    def passwords_file(self) -> Path:
        return self.home / "passwords.json"

    @property
    def executor_file(self) -> Path:
        """The executor the running services were started with (and its settings)."""
        return self.run_dir / "executor.json"

    @property
    def redis(self) -> Redis:
        return Redis(self.home / "redis", self.redis_port)

    def process(self, name: str) -> AirflowProcess:
        """The service or Celery worker ``name`` (``scheduler``, ``worker-1``)."""
        return AirflowProcess(name, self.home, self.url, self.redis)

    def password(self) -> str:
        """The admin's password, made once (the simple auth manager reads this file)."""
        return self._secret(self.passwords_file, USER, 18)

    @property
    def metrics_token_file(self) -> Path:
        return self.home / "metrics-token.json"

    def metrics_token(self) -> str:
        """The bearer token scrapers send to ``/kafka-ingest/metrics``, made once."""
        return self._secret(self.metrics_token_file, "token", 24)

    def _secret(self, path: Path, key: str, size: int) -> str:
        """``key`` of the JSON file ``path``, made once with a random value (mode 0600)."""
        if not path.is_file():
            self.home.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                json.dump({key: secrets.token_urlsafe(size)}, fh)
        stored: dict[str, str] = json.loads(path.read_text())
        return stored[key]

    def settings(self, executor: Executor | None = None, *,
                 sql_alchemy_conn: str = "") -> dict[str, str]:
        """The Airflow settings every service (and a client of them) needs."""
        executor = executor or Executor()
        return {
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.passwords_file),
            # New DAG files are seen within seconds, not the default five minutes.
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
            # A task's calls to the execution API wait this long for the api-server (one
            # worker on a two-core machine that also runs Kafka, Postgres and the tests can
            # take tens of seconds), not Airflow's 5 s: a call that times out is retried, and
            # a retried start of a try that the server did take fails the try.
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": str(EXECUTION_API_TIMEOUT_S),
            **self._executor_settings(executor, sql_alchemy_conn),
        }

    def _executor_settings(self, executor: Executor, sql_alchemy_conn: str) -> dict[str, str]:
        settings = {"AIRFLOW__CORE__EXECUTOR": EXECUTORS[executor.name],
                    "AIRFLOW__CORE__PARALLELISM": str(executor.parallelism)}
        if executor.celery:
            settings.update({
                "AIRFLOW__CELERY__BROKER_URL": self.broker_url,
                "AIRFLOW__CELERY__RESULT_BACKEND": _result_backend(sql_alchemy_conn),
                "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(executor.concurrency),
            })
        return settings

    def client_env(self) -> dict[str, str]:
        """What ``stack env`` adds while the services run: the REST API's address and login,
        and the running executor's settings (so ``airflow celery ...`` works in the shell)."""
        recorded = self._recorded()
        return {"AIRFLOW_API_URL": self.url, "AIRFLOW_API_USER": USER,
                "AIRFLOW_API_PASSWORD": self.password(),
                "KAFKA_INGEST_METRICS_TOKEN": self.metrics_token(),
                **(recorded[1] if recorded else {})}

    # ----------------------------------------------------------------------- processes

    def _recorded(self) -> tuple[Executor, dict[str, str]] | None:
        raw = read_or_none(self.executor_file)
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            return Executor(**data["executor"]), dict(data["settings"])
        except (ValueError, KeyError, TypeError, StackError):
            return None

    def executor(self) -> Executor | None:
        """The executor of the running services (any of them: a crashed api-server does not
        make the workers someone else's), or None when none runs."""
        if not any(self.pids().values()):
            return None
        recorded = self._recorded()
        return recorded[0] if recorded else Executor()

    def processes(self) -> list[LocalService]:
        """The services, then Redis and the Celery workers that have a pid file (those
        started and not yet stopped)."""
        workers = sorted(p.stem for p in self.run_dir.glob("worker-*.pid"))
        redis = [self.redis] if self.redis.pidfile.is_file() else []
        return [*map(self.process, SERVICES), *redis, *map(self.process, workers)]

    def pids(self) -> dict[str, int | None]:
        return {proc.name: proc.pid() for proc in self.processes()}

    def running(self) -> bool:
        return self.pids()["api-server"] is not None

    def start(self, env: Mapping[str, str], report: Callable[[str], None], *,
              executor: str | None = None, workers: int | None = None) -> None:
        """Start the services that are not running (with ``env`` plus :meth:`settings`),
        then wait until the api-server says every one of them is healthy and every Celery
        worker answers; then create the pools the pipelines name.

        ``executor`` None keeps the running services' executor (else the LocalExecutor);
        another executor or number of workers than the running one stops them all first.
        """
        wanted = self._wanted(executor, workers)
        current = self.executor()
        if current is not None and current != wanted:
            report(f"airflow: running with {current.describe()}; restarting with "
                   f"{wanted.describe()}")
            for line in self.stop():
                report(line)
        self.password()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        executor_env = self._executor_settings(
            wanted, env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", ""))
        self._record(wanted, executor_env)
        # The api-server's /kafka-ingest/metrics accepts this token (plugins/kafka_ingest_ui)
        # unless ``env`` brings its own.
        full = {"KAFKA_INGEST_METRICS_TOKEN": self.metrics_token(), **env,
                **self.settings(wanted, sql_alchemy_conn=env.get(
                    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", ""))}
        since = time.monotonic()
        started = []
        if wanted.celery and self.redis.start():
            started.append("redis")
        for name, pid in self.pids().items():
            if name in SERVICES and pid is None:
                started.append(name)
                self._spawn(name, [name], full)
        if wanted.celery:
            started += self._start_workers(wanted, full)
        self._await_healthy(wanted)
        took = time.monotonic() - since
        verb = f"started {', '.join(started)} in {took:.1f} s" if started else "already running"
        report(f"airflow: {verb}; UI and REST API on {self.url} ({wanted.describe()}); log "
               f"in as {USER!r} with AIRFLOW_API_PASSWORD from `kafka-ingest stack env`")
        pools = self.ensure_pools(full)
        if pools:
            report("airflow: pools " + ", ".join(f"{n} ({s} slots)" for n, s in pools.items()))

    def _wanted(self, executor: str | None, workers: int | None) -> Executor:
        current = self.executor()
        name = executor or (current.name if current else "local")
        if name != "celery":
            if workers:
                raise StackError("--workers needs --executor celery")
            return Executor(name)
        if workers:
            return Executor("celery", workers)
        return current if current is not None and current.celery else Executor(
            "celery", DEFAULT_WORKERS)

    def _record(self, executor: Executor, settings: dict[str, str]) -> None:
        data = {"executor": asdict(executor), "settings": settings}
        tmp = self.executor_file.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2)
        tmp.replace(self.executor_file)

    def _spawn(self, name: str, args: list[str], env: Mapping[str, str]) -> None:
        command = [sys.executable, "-m", "airflow", *args]
        if name == "api-server":
            command += ["--host", "127.0.0.1", "--port", str(self.port)]
        self.process(name).spawn(command, env)

    # ----------------------------------------------------------------------- celery

    def _start_workers(self, executor: Executor, env: Mapping[str, str]) -> list[str]:
        pids = self.pids()
        started = []
        for node in executor.worker_names():
            name = node.split("@")[0]
            if pids.get(name) is not None:
                continue
            worker_env = {**env, "AIRFLOW__CORE__HOSTNAME_CALLABLE": HOSTNAME_CALLABLE,
                          WORKER_NAME_ENV: node}
            self._spawn(name, ["celery", "worker", "--celery-hostname", node,
                               "--concurrency", str(executor.concurrency),
                               "--skip-serve-logs", "--without-mingle", "--without-gossip"],
                        worker_env)
            started.append(name)
        return started

    def ping_workers(self, names: list[str], timeout_s: float = 1.0) -> set[str]:
        """The Celery workers (node names) that answer a ping through the broker."""
        if not names or not self.redis.answers():
            return set()
        return _ping(self.broker_url, names, timeout_s)

    # ----------------------------------------------------------------------- health

    def health(self) -> dict[str, Any] | None:
        """The api-server's health report, or None while it does not answer."""
        return _health(self.url)

    def _await_healthy(self, executor: Executor) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        nodes = executor.worker_names()
        waiting = list(SERVICES)
        while time.monotonic() < deadline:
            dead = [proc for proc in self.processes() if not _spawned_alive(proc)]
            if dead:
                raise StackError(f"airflow {dead[0].name} exited while starting: "
                                 f"{tail(dead[0].logfile, 3)}")
            waiting = _unhealthy(self.health())
            if not waiting:
                silent = sorted(set(nodes) - self.ping_workers(nodes))
                waiting = [node.split("@")[0] for node in silent]
            if not waiting:
                return
            time.sleep(0.5)
        raise StackError(f"airflow {', '.join(waiting)} not healthy within "
                         f"{_START_TIMEOUT_S:.0f} s; see {self.process(waiting[0]).logfile}")

    # ----------------------------------------------------------------------- pools

    def ensure_pools(self, env: Mapping[str, str]) -> dict[str, int]:
        """Create or resize the Airflow pools the pipelines file (``KAFKA_INGEST_PIPELINES``
        in ``env``, else the shipped one) names, with ``airflow pools import``."""
        from kafka_ingest.config import airflow_pools, load_pipelines, pool_import_document

        try:
            pipelines = load_pipelines(env.get("KAFKA_INGEST_PIPELINES") or None)
        except ValueError as exc:
            raise StackError(f"cannot create the pipelines' pools: {exc}") from None
        pools = airflow_pools(pipelines)
        if not pools:
            return {}
        path = self.run_dir / "pools.json"
        path.write_text(json.dumps(pool_import_document(pipelines), indent=2))
        done = subprocess.run([sys.executable, "-m", "airflow", "pools", "import", str(path)],
                              env=dict(env), capture_output=True, text=True,
                              timeout=_POOLS_TIMEOUT_S, check=False)
        if done.returncode != 0:
            detail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
            raise StackError(f"airflow pools import failed: {detail[0]}")
        return pools

    # ----------------------------------------------------------------------- stop, status

    def stop(self) -> list[str]:
        """SIGTERM every service's process group at once (workers finish or give back their
        tasks), a second one to the triggerer after :data:`_NUDGE_S`, SIGKILL what is left
        after the time-out; Redis last."""
        pids = self.pids()
        lines = []
        for wave in ([n for n in pids if n != "redis"], ["redis"]):
            live = {name: pid for name in wave if (pid := pids.get(name)) is not None}
            for pid in live.values():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + _STOP_TIMEOUT_S
            if (pid := live.get("triggerer")) is not None and not wait_gone(pid, _NUDGE_S):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGTERM)  # its own "exit now"
            for name, pid in live.items():
                if not wait_gone(pid, max(0.0, deadline - time.monotonic())):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
                    if not wait_gone(pid, 10):
                        raise StackError(f"process {pid} ({name}) survived SIGKILL; "
                                         "stop it by hand")
                lines.append(f"airflow {name}: stopped (pid {pid})")
        for proc in self.processes():
            proc.pidfile.unlink(missing_ok=True)
        self.executor_file.unlink(missing_ok=True)
        return lines or ["airflow services: not running"]

    def kill_worker(self, name: str) -> list[int]:
        """SIGKILL the Celery worker ``name`` (``worker-1``) and every task process it
        started (they run in process groups of their own): what losing its machine does.
        Returns the pids.

        Every group is stopped (SIGSTOP) before any is killed: killed one group after the
        other, a task's supervisor could see its task process die and report the try
        failed at once (seen once in 10 kills), which a lost machine never does; Airflow
        must notice the silence instead."""
        import psutil

        pid = self.pids().get(name)
        if pid is None:
            raise StackError(f"no Celery worker {name!r} runs")
        worker = psutil.Process(pid)
        with contextlib.suppress(ProcessLookupError):  # first, so it forks no more tasks
            os.killpg(os.getpgid(pid), signal.SIGSTOP)
        victims = [worker, *worker.children(recursive=True)]
        groups = set()
        for proc in victims:
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                groups.add(os.getpgid(proc.pid))
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for group in groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, sig)
        psutil.wait_procs(victims, timeout=10)
        return [proc.pid for proc in victims]

    def status(self) -> list[PartStatus]:
        """A line for each process, while any of them runs."""
        processes = self.processes()
        if not any(proc.pid() for proc in processes):
            return []
        return [proc.status() for proc in processes]


class RestApi:
    """The REST API of the stack's api-server, logged in as its admin (``env``: the
    ``AIRFLOW_API_*`` settings that :meth:`AirflowServices.client_env` gives)."""

    def __init__(self, env: Mapping[str, str], *, timeout_s: float = 30.0) -> None:
        import httpx

        token = httpx.post(f"{env['AIRFLOW_API_URL']}/auth/token", timeout=timeout_s, json={
            "username": env["AIRFLOW_API_USER"], "password": env["AIRFLOW_API_PASSWORD"]})
        token.raise_for_status()
        self.client = httpx.Client(base_url=f"{env['AIRFLOW_API_URL']}/api/v2",
                                   timeout=timeout_s, headers={
                                       "Authorization": f"Bearer {token.json()['access_token']}"})

    def get(self, path: str) -> Any:
        response = self.client.get(path)
        response.raise_for_status()
        return response.json()

    def pause(self, dag_id: str, paused: bool) -> None:
        self.client.patch(f"/dags/{dag_id}", json={"is_paused": paused}).raise_for_status()

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        return list(self.get(f"/dags/{dag_id}/dagRuns?limit=1000")["dag_runs"])

    def task_instances(self, dag_id: str) -> list[dict[str, Any]]:
        """Every task instance of every run of the DAG (its latest try each)."""
        out: list[dict[str, Any]] = []
        while True:
            page = self.get(f"/dags/{dag_id}/dagRuns/~/taskInstances?limit=100"
                            f"&offset={len(out)}")
            out += page["task_instances"]
            if not page["task_instances"] or len(out) >= page["total_entries"]:
                return out


def watchers_running(airflow_dsn: str, asset_name_like: str) -> int:
    """How many Asset watchers whose Asset's name is ``LIKE asset_name_like`` a triggerer
    runs (Airflow's metadata database: the watcher, its trigger, the triggerer it is
    assigned to). Airflow registers a watcher when it parses an unpaused DAG scheduled on
    the Asset, and a triggerer picks the trigger up after that: tens of seconds."""
    import psycopg

    with psycopg.connect(airflow_dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM asset_watcher w JOIN asset a ON a.id = w.asset_id"
            " JOIN trigger t ON t.id = w.trigger_id WHERE a.name LIKE %s"
            " AND t.triggerer_id IS NOT NULL", (asset_name_like,)).fetchone()
    return int(row[0]) if row else 0
