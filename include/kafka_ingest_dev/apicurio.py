"""A schema registry for the local stack: Apicurio Registry, in memory, on loopback.

Development tooling, like :mod:`kafka_ingest_dev.faults` (the stack runs it when started
with ``kafka-ingest stack up --registry``); the runtime never imports it.

- **The release** follows the Java found (:func:`find_javas`, :func:`choose`): Apicurio
  Registry 3.3.3 needs Java 21+; where the machine has only Java 17, 2.6.13.Final, the
  last 2.x, runs instead (and the stack says so). Both speak Confluent's REST API at
  ``/apis/ccompat/v7``, which is what the pipelines' clients use.
- :func:`install` fetches ``io.apicurio:apicurio-registry-app:<version>:tar.gz:all`` from
  Maven Central with Maven once, unpacked into
  ``${XDG_CACHE_HOME:-~/.cache}/kafka-ingest/apicurio-registry-<version>/app`` (a marker
  makes an interrupted fetch start again), shared by every checkout, like Kafka's jars.
- :class:`Server` is one stack's registry: its ports and ``<state>/registry`` (the
  configuration written on every start, pid file, log), a
  :class:`~kafka_ingest_dev.service.LocalService`. :func:`launch` starts the JVM
  (``-Xmx256m``) without waiting; :func:`await_ready` polls the API until it answers,
  with a deadline, then sets the global compatibility to ``BACKWARD`` (Apicurio's own
  default is ``NONE``, which would accept any change); ``server.stop()`` ends it.

Storage is H2 in memory: schemas live as long as the process, so a restart empties the
registry (its ids start at 1 again). Trade-off: nothing to migrate or clean up, and tests
get a fresh registry for the price of a restart; a test that needs a schema registers it.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.client
import json
import logging
import os
import re
import shutil
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka_ingest_dev.procs import PartStatus, StackError, accepts, child_env, read_or_none
from kafka_ingest_dev.service import LocalService

log = logging.getLogger(__name__)

GROUP_ARTIFACT = "io.apicurio:apicurio-registry-app"
#: The Confluent-compatible API: what ``KAFKA_INGEST_SCHEMA_REGISTRY_URL`` points at.
CCOMPAT_PATH = "/apis/ccompat/v7"
DEFAULT_PORT = 18081
#: Quarkus' management interface (health, metrics; 0.0.0.0:9000 unless told otherwise).
DEFAULT_MANAGEMENT_PORT = 18082
#: The global compatibility set at every start.
COMPATIBILITY = "BACKWARD"
_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
_INSTALL_TIMEOUT_S = 900.0
_JAVA_VERSION_TIMEOUT_S = 20.0
START_TIMEOUT_S = 90.0
_STOP_TIMEOUT_S = 30.0
_REQUEST_TIMEOUT_S = 5.0
#: A bounded JVM: the heap, a serial collector and the client compiler only (a
#: development registry serves a handful of requests; C2 and G1 cost memory and CPU).
JVM_OPTIONS = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
               "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true")


# --------------------------------------------------------------------------- releases


@dataclass(frozen=True)
class Release:
    """An Apicurio Registry release the stack can run, and the Java it needs."""

    version: str
    min_java: int
    #: The jar ``java -jar`` starts, relative to the unpacked archive.
    jar: str
    #: Whether it serves Quarkus' management interface (health, metrics) on its own port.
    management: bool

    @property
    def artifact(self) -> str:
        """Maven coordinates of the distribution (the ``all`` archive: app + libraries)."""
        return f"{GROUP_ARTIFACT}:{self.version}:tar.gz:all"


#: Preferred first. 3.x unpacks to Quarkus' fast-jar layout; 2.x to a legacy runner jar.
RELEASES = (
    Release("3.3.3", 21, "quarkus-run.jar", management=True),
    Release("2.6.13.Final", 17, "apicurio-registry-app-2.6.13.Final-runner.jar",
            management=False),
)
RELEASE = RELEASES[0]


@dataclass(frozen=True)
class Java:
    """A Java runtime found on the machine: its ``java`` and its feature release."""

    path: str
    major: int


_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def java_major(version_output: str) -> int | None:
    """The feature release ``java -version`` reports (``"17.0.15"`` -> 17, ``"25"`` -> 25,
    the old ``"1.8.0_392"`` -> 8), or None if it says no version."""
    found = _VERSION.search(version_output)
    if found is None:
        return None
    major, minor = int(found.group(1)), found.group(2)
    return int(minor) if major == 1 and minor is not None else major


def choose(javas: Sequence[Java]) -> tuple[Release, Java]:
    """The newest release some Java can run, with the first such Java in ``javas`` (the
    order :func:`find_javas` gives: ``$JAVA_HOME``, then PATH, then ``/usr/lib/jvm``)."""
    for release in RELEASES:
        for java in javas:
            if java.major >= release.min_java:
                return release, java
    seen = ", ".join(f"{j.path} ({j.major})" for j in javas) or "none"
    raise StackError(f"the schema registry needs Java {RELEASES[-1].min_java}+ (Apicurio "
                     f"Registry {RELEASE.version}: Java {RELEASE.min_java}+); found: {seen}. "
                     "Install a JDK under /usr/lib/jvm or set JAVA_HOME")


def java_candidates() -> list[str]:
    """``$JAVA_HOME/bin/java``, ``java`` on PATH, then every ``/usr/lib/jvm/*/bin/java``,
    each once (by real path: Debian's ``/usr/lib/jvm`` has aliases)."""
    found: list[str] = []
    home = os.environ.get("JAVA_HOME")
    for path in [
        str(Path(home) / "bin" / "java") if home else None,
        shutil.which("java"),
        *sorted(str(p) for p in Path("/usr/lib/jvm").glob("*/bin/java")),
    ]:
        if path and Path(path).is_file() and os.access(path, os.X_OK):
            found.append(path)
    unique: dict[str, str] = {}
    for path in found:
        unique.setdefault(os.path.realpath(path), path)
    return list(unique.values())


def find_javas(paths: Iterable[str] | None = None) -> list[Java]:
    """Each candidate that answers ``java -version`` with a version, in candidate order."""
    javas = []
    for path in java_candidates() if paths is None else paths:
        try:
            done = subprocess.run([path, "-version"], capture_output=True, text=True,
                                  timeout=_JAVA_VERSION_TIMEOUT_S, check=False,
                                  env=child_env())
        except (OSError, subprocess.TimeoutExpired):
            continue
        major = java_major(done.stderr + done.stdout)
        if done.returncode == 0 and major is not None:
            javas.append(Java(path, major))
    return javas


# --------------------------------------------------------------------------- install


def cache_dir(release: Release) -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/kafka-ingest/apicurio-registry-<version>``."""
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "kafka-ingest" / f"apicurio-registry-{release.version}"


def installed(release: Release) -> bool:
    return (cache_dir(release) / ".complete").is_file()


def install(release: Release, mvn: str) -> Path:
    """The unpacked distribution (``<cache>/app``), fetched by Maven the first time (a
    158 MB archive from Maven Central, unpacked then deleted). Safe to call from several
    processes: the second waits for the first's fetch."""
    cache = cache_dir(release)
    app = cache / "app"
    marker = cache / ".complete"
    if marker.is_file():
        return app
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file():  # another process fetched it meanwhile
            return app
        started = time.monotonic()
        download = cache / "download"
        for stale in (download, app, cache / "app.partial"):
            shutil.rmtree(stale, ignore_errors=True)
        # cwd: the cache, so a pom.xml in the caller's directory never becomes the project.
        cmd = [mvn, "-q", "-B", "dependency:copy", f"-Dartifact={release.artifact}",
               f"-DoutputDirectory={download}"]
        try:
            done = subprocess.run(cmd, cwd=cache, capture_output=True, text=True,
                                  timeout=_INSTALL_TIMEOUT_S, check=False, env=child_env())
        except subprocess.TimeoutExpired:
            raise StackError(f"mvn did not fetch {release.artifact} within "
                             f"{_INSTALL_TIMEOUT_S:.0f} s") from None
        archives = sorted(download.glob("*.tar.gz"))
        if done.returncode != 0 or len(archives) != 1:
            errors = [line for line in (done.stdout + done.stderr).splitlines()
                      if "[ERROR]" in line] or ["no archive"]
            raise StackError(f"mvn could not fetch {release.artifact}: {errors[0].strip()}")
        _unpack(archives[0], cache / "app.partial")
        (cache / "app.partial").rename(app)
        shutil.rmtree(download, ignore_errors=True)
        if not (app / release.jar).is_file():
            raise StackError(f"{release.artifact} has no {release.jar}; see {app}")
        marker.write_text(f"{release.version}\n")
        log.info("apicurio registry %s fetched into %s in %.1f s", release.version, app,
                 time.monotonic() - started)
    return app


def _unpack(archive: Path, target: Path) -> None:
    with tarfile.open(archive) as tar:
        # "data": regular files and directories under target only (no links out of it).
        tar.extractall(target, filter="data")


# --------------------------------------------------------------------------- the server


@dataclass(frozen=True)
class Server(LocalService):
    """One stack's registry: its loopback ports and its directory under the state dir."""

    port: int
    management_port: int
    home: Path
    name = "registry"
    start_timeout_s = START_TIMEOUT_S
    stop_timeout_s = _STOP_TIMEOUT_S

    @property
    def url(self) -> str:
        """The Confluent-compatible API clients use."""
        return f"http://127.0.0.1:{self.port}{CCOMPAT_PATH}"

    @property
    def address(self) -> str:
        return self.url

    @property
    def props(self) -> Path:
        return self.home / "registry.properties"


    @property
    def release_file(self) -> Path:
        """The release and the Java the running process was started with (JSON)."""
        return self.home / "release.json"

    def markers(self) -> tuple[str, ...]:
        """Its command line names our configuration file, which lives in this state dir."""
        return (str(self.props),)

    def started_with(self) -> dict[str, Any]:
        """What :func:`launch` recorded: ``version``, ``java``, ``java_major``,
        ``management`` (empty if nothing)."""
        try:
            recorded = json.loads(read_or_none(self.release_file) or "")
        except ValueError:
            return {}
        return recorded if isinstance(recorded, dict) else {}

    def release(self) -> str:
        """``3.3.3 on Java 25`` ("?" if nothing was recorded)."""
        started = self.started_with()
        if "version" not in started:
            return "?"
        return f"{started['version']} on Java {started.get('java_major', '?')}"

    def answers(self, timeout_s: float = 2.0) -> bool:
        """Health: the ccompat API lists subjects."""
        if not accepts(self.port):
            return False
        try:
            status, body = request("GET", f"{self.url}/subjects", timeout_s=timeout_s)
        except OSError:
            return False
        return status == 200 and isinstance(body, list)

    def status(self) -> PartStatus:
        """Up once it answers with a compatibility level: its release, the level and (3.x)
        the management interface's address."""
        pid = self.pid()
        if pid is None:
            return PartStatus(self.name, self.url, False, detail="not running")
        level = compatibility(self) if self.answers(3.0) else None
        if level is None:
            return PartStatus(self.name, self.url, False, pid, "process alive, not answering")
        management = (f", management 127.0.0.1:{self.management_port}"
                      if self.started_with().get("management") else "")
        detail = f"apicurio {self.release()}, compatibility {level}{management}"
        return PartStatus(self.name, self.url, True, pid, detail)


def properties(server: Server) -> str:
    """The registry's configuration, passed with ``-Dquarkus.config.locations`` (which
    outranks the application's own ``application.properties``). Both interfaces on
    127.0.0.1 only; quiet logs (warnings; no access log, no banner); H2 in memory. The
    ``apicurio.*`` keys are 3.x's: a 2.x registry (in memory already) ignores them."""
    props = {
        "quarkus.http.host": "127.0.0.1",
        "quarkus.http.port": str(server.port),
        "quarkus.management.host": "127.0.0.1",
        "quarkus.management.port": str(server.management_port),
        "quarkus.http.access-log.enabled": "false",
        "quarkus.banner.enabled": "false",
        "quarkus.log.level": "WARN",
        'quarkus.log.category."io.apicurio".level': "WARN",
        "apicurio.storage.kind": "sql",
        "apicurio.storage.sql.kind": "h2",
        "apicurio.datasource.url": "jdbc:h2:mem:registry",
        # 20 idle connections by default, to an in-memory database.
        "apicurio.datasource.jdbc.initial-size": "2",
        "apicurio.datasource.jdbc.min-size": "2",
        "apicurio.datasource.jdbc.max-size": "20",
        "apicurio.storage.snapshot.location": str(server.home),
        "apicurio.import.work-dir": str(server.home),
    }
    header = "# Written by kafka-ingest stack up on every start; edit apicurio.py instead.\n"
    return header + "".join(f"{key}={value}\n" for key, value in props.items())


def launch(server: Server, release: Release, java: Java, app: Path) -> int:
    """Write the configuration and spawn the registry; do not wait."""
    server.home.mkdir(parents=True, exist_ok=True)
    server.props.write_text(properties(server))
    server.release_file.write_text(json.dumps(
        {"version": release.version, "java": java.path, "java_major": java.major,
         "management": release.management}) + "\n")
    return server.spawn([java.path, *JVM_OPTIONS, f"-Dquarkus.config.locations={server.props}",
                         "-jar", str(app / release.jar)])


def await_ready(server: Server, pid: int, timeout_s: float = START_TIMEOUT_S) -> None:
    """Poll until the API answers, then set the global compatibility; fail fast (with its
    log) if the JVM exits, and after ``timeout_s`` in all."""
    server.await_ready(pid, timeout_s)
    set_compatibility(server, COMPATIBILITY)


def set_compatibility(server: Server, level: str) -> None:
    """``PUT /config``: the global compatibility every subject without its own gets."""
    status, body = request("PUT", f"{server.url}/config", {"compatibility": level})
    if status != 200 or not isinstance(body, dict) or body.get("compatibility") != level:
        raise StackError(f"the schema registry refused compatibility {level}: "
                         f"HTTP {status} {body}")


def compatibility(server: Server) -> str | None:
    """The global compatibility, or None when the registry does not say."""
    with contextlib.suppress(OSError):
        status, body = request("GET", f"{server.url}/config")
        if status == 200 and isinstance(body, dict):
            return body.get("compatibilityLevel")
    return None


# --------------------------------------------------------------------------- the client


def request(method: str, url: str, body: Any = None, *,
            timeout_s: float = _REQUEST_TIMEOUT_S) -> tuple[int, Any]:
    """One call of the registry's REST API: (HTTP status, decoded JSON body). An HTTP error
    is an answer too; only no answer at all (or a garbled one) raises ``OSError``."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,  # noqa: S310 - http only
                                 headers={"Content-Type": _CONTENT_TYPE,
                                          "Accept": _CONTENT_TYPE})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except http.client.HTTPException as exc:  # e.g. a connection cut mid-answer
        raise OSError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


__all__ = [
    "CCOMPAT_PATH",
    "COMPATIBILITY",
    "DEFAULT_MANAGEMENT_PORT",
    "DEFAULT_PORT",
    "RELEASE",
    "RELEASES",
    "Java",
    "Release",
    "Server",
    "await_ready",
    "choose",
    "compatibility",
    "find_javas",
    "install",
    "installed",
    "java_major",
    "launch",
    "properties",
    "request",
    "set_compatibility",
]
