"""A real Prometheus and promtool for the tests: installed from the Go module, run on loopback.

Development tooling, like :mod:`kafka_ingest_dev.faults` (whose Toxiproxy install this
follows); the runtime never imports it.

- :func:`install` builds ``cmd/prometheus`` and ``cmd/promtool`` of
  ``github.com/prometheus/prometheus@v0.316.0`` with one ``go install`` into
  ``${XDG_CACHE_HOME:-~/.cache}/kafka-ingest/prometheus-0.316.0/`` once (3 min 28 s and
  394 CPU seconds on these two cores with a cold Go build cache, against 6 min 34 s and
  733 for the full build; seconds on a warm one; later calls only check a marker). Go
  1.26.7+ is needed: the module's ``go.mod`` says so. Built without the cloud service
  discoveries (:data:`BUILD_FLAGS`) and without the web UI's assets (that takes Node and
  the ``builtinassets`` tag): static targets and the HTTP API are all the tests use.
- :func:`check_rules` / :func:`run_rule_tests` run ``promtool check rules`` /
  ``promtool test rules`` and raise :class:`PromtoolError` with promtool's output.
- :class:`PrometheusServer` is one Prometheus: its port, its directory (``prometheus.yml``
  written from its :class:`Target` s and rule files on every start, the TSDB, pid file,
  log), started and stopped like the stack's other processes, or used as a context
  manager. A target's bearer token goes to a file of mode 0600 that the configuration
  names (``authorization.credentials_file``), so the token is never in the configuration
  or a log.
- :class:`PrometheusAPI` is a small client of the HTTP API (instant queries, alerts,
  targets, reload), and :func:`wait_for` polls with a time-out the caller gives.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import httpx
import yaml

from kafka_ingest_dev.gotools import cache_dir, go_install
from kafka_ingest_dev.procs import StackError, child_env, port_free, terminate
from kafka_ingest_dev.service import LocalService

log = logging.getLogger(__name__)

PROMETHEUS_VERSION = "0.316.0"
PROMETHEUS_MODULE = "github.com/prometheus/prometheus"
#: The commands :func:`install` builds, each ``<module>/cmd/<name>``.
COMMANDS = ("prometheus", "promtool")
#: Built without the cloud service discoveries (AWS, Azure, GCE, ... : the module's own
#: ``remove_all_sd`` tag; the tests scrape static targets) and without debug symbols.
BUILD_FLAGS = ("-tags=remove_all_sd", "-trimpath", "-ldflags=-s -w")
#: Overrides the build's time-out (seconds), e.g. for a slow CI runner.
INSTALL_TIMEOUT_ENV = "KAFKA_INGEST_PROMETHEUS_INSTALL_TIMEOUT_S"
_INSTALL_TIMEOUT_S = 1800.0
_PROMTOOL_TIMEOUT_S = 60.0
START_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 15.0
_REQUEST_TIMEOUT_S = 5.0

T = TypeVar("T")


# --------------------------------------------------------------------------- install


@dataclass(frozen=True)
class Binaries:
    """The two programs :func:`install` built."""

    prometheus: Path
    promtool: Path


def install_dir() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/kafka-ingest/prometheus-<version>``, shared by every
    checkout and state directory, like Toxiproxy and the Kafka jars."""
    return cache_dir("prometheus", PROMETHEUS_VERSION)


def _install_timeout_s(timeout_s: float | None) -> float:
    if timeout_s is not None:
        return timeout_s
    raw = os.environ.get(INSTALL_TIMEOUT_ENV, "").strip()
    try:
        return float(raw) if raw else _INSTALL_TIMEOUT_S
    except ValueError:
        raise ValueError(f"{INSTALL_TIMEOUT_ENV}={raw!r}: say how many seconds") from None


def install(*, timeout_s: float | None = None) -> Binaries:
    """Prometheus and promtool, built with one ``go install`` the first time
    (:func:`kafka_ingest_dev.gotools.go_install`). ``timeout_s``: the build's bound
    (default 30 min, or ``$KAFKA_INGEST_PROMETHEUS_INSTALL_TIMEOUT_S``)."""
    target = go_install(
        "prometheus", PROMETHEUS_VERSION,
        [f"{PROMETHEUS_MODULE}/cmd/{c}@v{PROMETHEUS_VERSION}" for c in COMMANDS], COMMANDS,
        flags=BUILD_FLAGS, timeout_s=_install_timeout_s(timeout_s),
        needs="Prometheus is built from its Go module and needs Go 1.26.7+",
        timeout_hint=f"set {INSTALL_TIMEOUT_ENV} for more")
    return Binaries(target / "prometheus", target / "promtool")


# --------------------------------------------------------------------------- promtool


class PromtoolError(RuntimeError):
    """promtool rejected a file (or did not finish); the message carries its output."""

    def __init__(self, args: Sequence[str], returncode: int | None, output: str) -> None:
        self.command = tuple(args)
        self.returncode = returncode
        self.output = output
        status = f"exit {returncode}" if returncode is not None else "timed out"
        super().__init__(f"promtool {' '.join(args)}: {status}:\n{output.strip()}")


def promtool(*args: str, binary: Path | None = None,
             timeout_s: float = _PROMTOOL_TIMEOUT_S) -> str:
    """Run ``promtool args``; its output (stdout then stderr), or :class:`PromtoolError`."""
    cmd = [str(binary or install().promtool), *args]
    try:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout_s, check=False, env=child_env())
    except subprocess.TimeoutExpired as exc:
        raise PromtoolError(args, None, f"no answer within {timeout_s:.0f} s") from exc
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise PromtoolError(args, done.returncode, output)
    return output


def check_rules(path: Path | str, *, binary: Path | None = None) -> str:
    """``promtool check rules path``: promtool's report (``SUCCESS: 1 rules found``)."""
    return promtool("check", "rules", str(path), binary=binary)


def run_rule_tests(path: Path | str, *, binary: Path | None = None) -> str:
    """``promtool test rules path`` (a unit-test file of rules). Not named ``test_rules``:
    a test module importing it would have pytest collect it as a test."""
    return promtool("test", "rules", str(path), binary=binary)


# --------------------------------------------------------------------------- configuration


_JOB_FILE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class Target:
    """One scrape job of one ``host:port``. ``bearer_token`` is written to a file of mode
    0600 that the configuration names; it is left out of ``repr`` so it is not logged."""

    job: str
    address: str
    metrics_path: str = "/metrics"
    scheme: str = "http"
    bearer_token: str | None = field(default=None, repr=False)
    #: The CA that signs an ``https`` target's certificate (e.g. the stack's own).
    ca_file: Path | None = None

    def __post_init__(self) -> None:
        if not self.job:
            raise ValueError("a scrape target needs a job name")
        host, _, port = self.address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"target {self.job}: address {self.address!r} is not host:port")
        if self.scheme not in ("http", "https"):
            raise ValueError(f"target {self.job}: scheme {self.scheme!r} is not http or https")
        if not self.metrics_path.startswith("/"):
            raise ValueError(f"target {self.job}: metrics_path {self.metrics_path!r} "
                             "must start with /")


def render_config(targets: Sequence[Target], *, token_files: dict[str, Path],
                  rule_files: Iterable[Path] = (), scrape_interval: str = "1s",
                  evaluation_interval: str = "1s") -> str:
    """``prometheus.yml`` for these targets; ``token_files`` maps the job of each target
    with a bearer token to the file holding it (the token itself never enters here)."""
    jobs = [t.job for t in targets]
    duplicated = sorted({j for j in jobs if jobs.count(j) > 1})
    if duplicated:
        raise ValueError(f"scrape jobs must be unique (Prometheus refuses the file): "
                         f"{', '.join(duplicated)}")
    scrape_configs = []
    for target in targets:
        job: dict[str, Any] = {
            "job_name": target.job,
            "metrics_path": target.metrics_path,
            "scheme": target.scheme,
            "static_configs": [{"targets": [target.address]}],
        }
        if target.bearer_token is not None:
            job["authorization"] = {"type": "Bearer",
                                    "credentials_file": str(token_files[target.job])}
        if target.ca_file is not None:
            job["tls_config"] = {"ca_file": str(target.ca_file)}
        scrape_configs.append(job)
    doc = {
        "global": {"scrape_interval": scrape_interval,
                   "evaluation_interval": evaluation_interval},
        "rule_files": [str(Path(p).resolve()) for p in rule_files],
        "scrape_configs": scrape_configs,
    }
    header = "# Written by kafka_ingest_dev.prometheus on every start; edit the caller.\n"
    return header + yaml.safe_dump(doc, sort_keys=False)


def _write_secret(path: Path, secret: str) -> None:
    """Write ``secret`` readable by its owner only (also when the file existed)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(secret)


# --------------------------------------------------------------------------- the server


@dataclass(frozen=True)
class PrometheusServer(LocalService):
    """One Prometheus on ``127.0.0.1:port`` with its files in ``home``.

    >>> with PrometheusServer(port, tmp_path, targets=(Target("app", "127.0.0.1:8000"),),
    ...                       rule_files=(rules,)) as prom:
    ...     prom.api.wait_for_alert("IngestLagHigh", timeout_s=60)
    """

    port: int
    home: Path
    targets: tuple[Target, ...] = ()
    rule_files: tuple[Path, ...] = ()
    scrape_interval: str = "1s"
    evaluation_interval: str = "1s"
    #: How long :meth:`start` (and so ``with``) waits for ``/-/ready``.
    start_timeout_s: float = START_TIMEOUT_S
    name = "prometheus"
    stop_timeout_s = _STOP_TIMEOUT_S

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        return self.url

    @property
    def api(self) -> PrometheusAPI:
        return PrometheusAPI(self.url)

    @property
    def config_file(self) -> Path:
        return self.home / "prometheus.yml"

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def secrets_dir(self) -> Path:
        return self.home / "secrets"


    def token_file(self, job: str) -> Path:
        return self.secrets_dir / f"{_JOB_FILE.sub('_', job)}.token"

    def markers(self) -> tuple[str, ...]:
        """Its command line names our configuration file, which lives in ``home``."""
        return (str(self.config_file),)

    def answers(self) -> bool:
        return self.api.ready()

    def write_config(self) -> Path:
        """Write the token files (0600, in a 0700 directory) and ``prometheus.yml``."""
        self.home.mkdir(parents=True, exist_ok=True)
        token_files = {t.job: self.token_file(t.job) for t in self.targets
                       if t.bearer_token is not None}
        text = render_config(self.targets, token_files=token_files,
                             rule_files=self.rule_files,
                             scrape_interval=self.scrape_interval,
                             evaluation_interval=self.evaluation_interval)
        if token_files:
            self.secrets_dir.mkdir(mode=0o700, exist_ok=True)
            self.secrets_dir.chmod(0o700)
            for target in self.targets:
                if target.bearer_token is not None:
                    _write_secret(token_files[target.job], target.bearer_token)
        self.config_file.write_text(text)
        return self.config_file

    def command(self, binary: Path) -> list[str]:
        return [str(binary), f"--config.file={self.config_file}",
                f"--storage.tsdb.path={self.data_dir}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle"]

    def start(self, *, timeout_s: float | None = None) -> int:
        """Write the configuration, start Prometheus (after stopping one of ours left
        running in ``home``) and wait until ``/-/ready`` answers 200; its pid. If it
        exits, or is not ready within ``timeout_s`` (default :attr:`start_timeout_s`;
        then it is stopped first), raise :class:`StackError` with the tail of its log."""
        timeout_s = self.start_timeout_s if timeout_s is None else timeout_s
        binary = install().prometheus
        stale = self.pid()
        if stale is not None:
            terminate(stale, _STOP_TIMEOUT_S)
        if not port_free(self.port):
            raise StackError(f"port 127.0.0.1:{self.port} for Prometheus is held by another "
                             "process: stop it, or choose another port")
        self.write_config()
        pid = self.spawn(self.command(binary))
        try:
            self.await_ready(pid, timeout_s)
        except StackError:
            self.stop()  # not ready in time: no Prometheus left behind
            raise
        return pid

    def __enter__(self) -> PrometheusServer:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


# --------------------------------------------------------------------------- the client


class PrometheusError(RuntimeError):
    """Prometheus' API answered with an error (or not at all)."""

    def __init__(self, method: str, path: str, status: int | None, detail: str) -> None:
        super().__init__(f"prometheus {method} {path}: "
                         f"{status if status is not None else 'no answer'}: {detail}")
        self.status = status
        self.detail = detail


class PrometheusAPI:
    """A client of Prometheus' HTTP API (``/api/v1``). One connection per call: the tests
    ask a few questions a second at most, and nothing is left to close."""

    def __init__(self, url: str, *, timeout_s: float = _REQUEST_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, params: dict[str, str] | None = None) -> Any:
        """The ``data`` of a ``{"status": "success"}`` answer."""
        try:
            reply = httpx.request(method, self.url + path, params=params,
                                  timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise PrometheusError(method, path, None, str(exc)) from exc
        try:
            body = reply.json()
        except ValueError as exc:  # not JSON: a proxy, or not Prometheus at all
            raise PrometheusError(method, path, reply.status_code,
                                  reply.text[:200]) from exc
        if not isinstance(body, dict) or body.get("status") != "success":
            detail = (f"{body.get('errorType')}: {body.get('error')}"
                      if isinstance(body, dict) else str(body)[:200])
            raise PrometheusError(method, path, reply.status_code, detail)
        return body.get("data")

    def ready(self) -> bool:
        """``/-/ready`` answers 200 (the TSDB is open and the configuration loaded)."""
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def reload(self) -> None:
        """``POST /-/reload``: read the configuration and rule files again (the server runs
        with ``--web.enable-lifecycle``); Prometheus answers 500 if the new file is bad."""
        try:
            reply = httpx.post(f"{self.url}/-/reload", timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise PrometheusError("POST", "/-/reload", None, str(exc)) from exc
        if reply.status_code != 200:
            raise PrometheusError("POST", "/-/reload", reply.status_code, reply.text.strip())

    def query(self, expr: str, *, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query: one ``{"metric": {...}, "value": [t, "v"]}`` per series (a
        scalar or string result comes as one such item with no labels)."""
        params = {"query": expr} | ({"time": str(at)} if at is not None else {})
        data = self._call("GET", "/api/v1/query", params)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts: ``labels``, ``annotations``, ``state`` (``pending``/``firing``),
        ``activeAt``, ``value``."""
        return list(self._call("GET", "/api/v1/alerts")["alerts"])

    def targets(self) -> list[dict[str, Any]]:
        """Active targets: ``labels`` (``job``, ``instance``), ``health``, ``lastError``."""
        return list(self._call("GET", "/api/v1/targets", {"state": "active"})
                    ["activeTargets"])

    def rules(self) -> list[dict[str, Any]]:
        """The loaded rule groups (``name``, ``file``, ``rules``)."""
        return list(self._call("GET", "/api/v1/rules")["groups"])

    def config(self) -> str:
        """The configuration as loaded (YAML; Prometheus masks secrets in it)."""
        return str(self._call("GET", "/api/v1/status/config")["yaml"])

    def wait_for_query(self, expr: str, *, timeout_s: float,
                       accept: Callable[[list[dict[str, Any]]], bool] = bool,
                       ) -> list[dict[str, Any]]:
        """Query ``expr`` until ``accept`` takes the result (default: any series)."""
        return wait_for(lambda: _accepted(self.query(expr), accept), timeout_s=timeout_s,
                        what=f"query {expr!r}")

    def wait_for_alert(self, name: str, *, timeout_s: float,
                       state: str = "firing") -> dict[str, Any]:
        """The first active alert ``name`` in ``state``."""
        return wait_for(lambda: next((a for a in self.alerts()
                                      if a["labels"].get("alertname") == name
                                      and a["state"] == state), None),
                        timeout_s=timeout_s, what=f"alert {name} {state}")

    def wait_for_targets_up(self, *, timeout_s: float) -> list[dict[str, Any]]:
        """The active targets once there are some and every one was scraped well."""
        return wait_for(lambda: _accepted(self.targets(), lambda ts: bool(ts) and all(
            t["health"] == "up" for t in ts)), timeout_s=timeout_s, what="targets up")


def _accepted(value: T, accept: Callable[[T], bool]) -> T | None:
    return value if accept(value) else None


def wait_for(probe: Callable[[], T | None], *, timeout_s: float, what: str,
             interval_s: float = 0.25) -> T:
    """Call ``probe`` until it returns a truthy value (not None, False or empty); that
    value. After ``timeout_s`` raise ``TimeoutError`` naming ``what``. An exception from
    ``probe`` is not a "not yet": it propagates."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(interval_s)


__all__ = [
    "COMMANDS",
    "INSTALL_TIMEOUT_ENV",
    "PROMETHEUS_MODULE",
    "PROMETHEUS_VERSION",
    "START_TIMEOUT_S",
    "Binaries",
    "PrometheusAPI",
    "PrometheusError",
    "PrometheusServer",
    "PromtoolError",
    "Target",
    "check_rules",
    "install",
    "install_dir",
    "promtool",
    "render_config",
    "run_rule_tests",
    "wait_for",
]
