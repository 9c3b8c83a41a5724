"""Network faults for the local stack: Toxiproxy in front of Kafka and Postgres.

Development tooling, like :mod:`kafka_ingest_dev.stack` (which runs the server when the
stack is started with ``kafka-ingest stack up --faults``); the runtime never imports it.

- :func:`install` builds Toxiproxy's server from its Go module
  (``github.com/Shopify/toxiproxy/v2/cmd/server@v2.12.0``) with ``go install`` into
  ``${XDG_CACHE_HOME:-~/.cache}/kafka-ingest/toxiproxy-2.12.0/`` once, so a fresh machine
  or CI gets it from the project's own files (Go 1.23+ is needed to build it).
- :class:`Server` runs it on loopback (``start``, ``stop``, ``status``), with a pid file
  and a log in the state directory, like the stack's other processes
  (:class:`~kafka_ingest_dev.service.LocalService`).
- :class:`Toxiproxy` is a small client of its REST API: proxies, and toxics on them
  (``latency``, ``bandwidth``, ``reset_peer``, ``timeout``, ``slicer``, ``limit_data``,
  ``slow_close``), each on the ``downstream`` (server to client, Toxiproxy's default) or
  ``upstream`` (client to server) direction.

What the toxics do to connections that are already open (read from Toxiproxy 2.12's
sources; the fault tests rely on it):

- ``timeout`` with ``timeout=0`` drops every byte in its direction until it is removed and
  never closes the connection: a black hole. The client's TCP peer is the proxy, which
  keeps acknowledging, so TCP keepalives and ``tcp_user_timeout`` never fire; only an
  application-level time-out ends the wait. A client that closes its side is still
  passed on (the server sees the close).
- ``reset_peer`` with ``timeout=0`` closes the connection at the next byte in its
  direction and drops that byte. For connections opened while the toxic is present the
  close is a TCP RST (``SO_LINGER`` 0); for connections it cuts in flight it is an abrupt
  close (FIN) with the data in flight lost: to the client, "connection closed by peer"
  either way. New connections keep being cut while it is present.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka_ingest_dev.gotools import cache_dir, go_install
from kafka_ingest_dev.procs import require_free, terminate
from kafka_ingest_dev.service import LocalService

log = logging.getLogger(__name__)

TOXIPROXY_VERSION = "2.12.0"
TOXIPROXY_MODULE = "github.com/Shopify/toxiproxy/v2/cmd/server"
#: Where the API listens unless ``KAFKA_INGEST_TOXIPROXY_PORT`` says otherwise.
DEFAULT_API_PORT = 18474
_INSTALL_TIMEOUT_S = 900.0
_START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 10.0

DOWNSTREAM = "downstream"  # server -> client (Toxiproxy's default)
UPSTREAM = "upstream"  # client -> server
BOTH = (DOWNSTREAM, UPSTREAM)


# --------------------------------------------------------------------------- install


def install_dir() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/kafka-ingest/toxiproxy-<version>``, shared by every
    checkout and state directory, like the Kafka jars."""
    return cache_dir("toxiproxy", TOXIPROXY_VERSION)


def install() -> Path:
    """The Toxiproxy server binary, built with ``go install`` the first time (a few tens of
    seconds; :func:`kafka_ingest_dev.gotools.go_install`)."""
    target = go_install("toxiproxy", TOXIPROXY_VERSION,
                        [f"{TOXIPROXY_MODULE}@v{TOXIPROXY_VERSION}"], ["server"],
                        timeout_s=_INSTALL_TIMEOUT_S,
                        needs="Toxiproxy is built from its Go module and needs Go 1.23+")
    return target / "server"


# --------------------------------------------------------------------------- the server


@dataclass(frozen=True)
class Server(LocalService):
    """Where one stack's Toxiproxy lives: its API port and its state directory."""

    port: int
    home: Path
    name = "toxiproxy"
    start_timeout_s = _START_TIMEOUT_S
    stop_timeout_s = _STOP_TIMEOUT_S

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


    @property
    def config(self) -> Path:
        """The (empty) proxies file the server starts with: a path of this stack's on its
        command line, which tells our server from another whatever port either listens on
        (the stack fills it with proxies over the API)."""
        return self.home / "toxiproxy.json"

    def markers(self) -> tuple[str, ...]:
        """Our proxies file, whatever port this process's settings give (a ``down`` from
        a shell without the ``up``'s port settings finds it too); a server started before
        it had one is known by its API port."""
        return str(self.config), f"-port {self.port} "

    def answers(self) -> bool:
        try:
            Toxiproxy(self.url, timeout_s=1.0).version()
        except (ToxiproxyError, OSError):
            return False
        return True

    def start(self) -> tuple[int, bool]:
        """(pid, started): start Toxiproxy on 127.0.0.1 unless it runs (built first if
        missing); wait until it answers."""
        running = self.pid()
        if running is not None and self.answers():
            return running, False
        if running is not None:  # alive but deaf: start afresh
            terminate(running, self.stop_timeout_s)
        binary = install()
        require_free(self.port, "Toxiproxy's API", "KAFKA_INGEST_TOXIPROXY_PORT")
        self.home.mkdir(parents=True, exist_ok=True)
        self.config.write_text("[]\n")
        pid = self.spawn([str(binary), "-host", "127.0.0.1", "-port", str(self.port),
                          "-config", str(self.config)])
        self.await_ready(pid)
        return pid, True


# --------------------------------------------------------------------------- the client


class ToxiproxyError(RuntimeError):
    """Toxiproxy's API answered with an error (or not at all)."""

    def __init__(self, method: str, path: str, status: int | None, detail: str) -> None:
        super().__init__(f"toxiproxy {method} {path}: "
                         f"{status if status is not None else 'no answer'}: {detail}")
        self.status = status


@dataclass(frozen=True)
class Proxy:
    """A proxy as Toxiproxy describes it."""

    name: str
    listen: str
    upstream: str
    enabled: bool
    toxics: tuple[dict[str, Any], ...] = ()

    @classmethod
    def from_api(cls, body: dict[str, Any]) -> Proxy:
        return cls(body["name"], body["listen"], body["upstream"], bool(body["enabled"]),
                   tuple(body.get("toxics") or ()))


class Toxiproxy:
    """A client of Toxiproxy's REST API (``http://127.0.0.1:18474`` by default; the fault
    stack prints it as ``TOXIPROXY_URL``).

    >>> tp = Toxiproxy(os.environ["TOXIPROXY_URL"])
    >>> with tp.toxic("postgres", "latency", latency=300):
    ...     run_the_slice()
    """

    def __init__(self, url: str | None = None, *, timeout_s: float = 5.0) -> None:
        self.url = (url or os.environ.get("TOXIPROXY_URL")
                    or f"http://127.0.0.1:{DEFAULT_API_PORT}").rstrip("/")
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(  # noqa: S310 - http on loopback, built here
            self.url + path, data=data, method=method,
            headers={"Content-Type": "application/json"} if data is not None else {})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:  # noqa: S310
                text = reply.read().decode()
        except urllib.error.HTTPError as exc:
            raise ToxiproxyError(method, path, exc.code,
                                 exc.read().decode(errors="replace").strip()) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise ToxiproxyError(method, path, None, str(exc)) from exc
        return json.loads(text) if text.strip() else None

    # proxies

    def version(self) -> str:
        answer = self._call("GET", "/version")
        return str(answer.get("version") if isinstance(answer, dict) else answer)

    def populate(self, proxies: list[dict[str, Any]]) -> list[Proxy]:
        """Create these proxies, or replace those whose address changed (idempotent)."""
        answer = self._call("POST", "/populate", proxies)
        return [Proxy.from_api(p) for p in answer.get("proxies", [])]

    def reset(self) -> None:
        """Enable every proxy and remove every toxic."""
        self._call("POST", "/reset")

    # toxics

    def toxics(self, proxy: str) -> list[dict[str, Any]]:
        return list(self._call("GET", f"/proxies/{proxy}/toxics") or [])

    def add_toxic(self, proxy: str, kind: str, *, name: str | None = None,
                  stream: str = DOWNSTREAM, toxicity: float = 1.0,
                  **attributes: Any) -> str:
        """Add a toxic of type ``kind`` to ``proxy``; return its name
        (``<kind>_<stream>_<random>`` unless given). Attributes are the toxic's, e.g.
        ``latency=300, jitter=0`` or ``rate=64`` (KB/s) or ``timeout=0``."""
        name = name or f"{kind}_{stream}_{uuid.uuid4().hex[:6]}"
        self._call("POST", f"/proxies/{proxy}/toxics", {
            "name": name, "type": kind, "stream": stream, "toxicity": toxicity,
            "attributes": attributes})
        return name

    def remove_toxic(self, proxy: str, name: str) -> None:
        """Remove a toxic; one already gone is not an error."""
        try:
            self._call("DELETE", f"/proxies/{proxy}/toxics/{name}")
        except ToxiproxyError as exc:
            if exc.status != 404:
                raise

    def clear(self, proxy: str) -> None:
        """Remove every toxic of ``proxy``."""
        for toxic in self.toxics(proxy):
            self.remove_toxic(proxy, toxic["name"])

    @contextlib.contextmanager
    def toxic(self, proxy: str, kind: str, *, streams: tuple[str, ...] = (DOWNSTREAM,),
              toxicity: float = 1.0, **attributes: Any) -> Iterator[list[str]]:
        """A toxic of type ``kind`` on each of ``streams`` of ``proxy`` while the block
        runs."""
        names = [self.add_toxic(proxy, kind, stream=s, toxicity=toxicity, **attributes)
                 for s in streams]
        try:
            yield names
        finally:
            for name in names:
                self.remove_toxic(proxy, name)

    # the toxics the fault tests use, by name

    def latency(self, proxy: str, ms: int, *, jitter: int = 0,
                streams: tuple[str, ...] = (DOWNSTREAM,)) -> list[str]:
        """Delay every chunk of data by ``ms`` (± ``jitter``) milliseconds."""
        return [self.add_toxic(proxy, "latency", stream=s, latency=ms, jitter=jitter)
                for s in streams]

    def bandwidth(self, proxy: str, kb_per_s: int,
                  *, streams: tuple[str, ...] = BOTH) -> list[str]:
        """Limit the rate to ``kb_per_s`` kilobytes per second."""
        return [self.add_toxic(proxy, "bandwidth", stream=s, rate=kb_per_s) for s in streams]

    def reset_peer(self, proxy: str, *, timeout_ms: int = 0,
                   streams: tuple[str, ...] = BOTH) -> list[str]:
        """Close connections at their next byte (after ``timeout_ms``), data lost."""
        return [self.add_toxic(proxy, "reset_peer", stream=s, timeout=timeout_ms)
                for s in streams]

    def black_hole(self, proxy: str, *, streams: tuple[str, ...] = BOTH) -> list[str]:
        """A ``timeout`` toxic with ``timeout=0``: no byte passes, nothing is closed."""
        return [self.add_toxic(proxy, "timeout", stream=s, timeout=0) for s in streams]

    def slicer(self, proxy: str, *, average_size: int = 64, size_variation: int = 32,
               delay_us: int = 100, streams: tuple[str, ...] = (DOWNSTREAM,)) -> list[str]:
        """Cut the data into small packets, ``delay_us`` microseconds apart."""
        return [self.add_toxic(proxy, "slicer", stream=s, average_size=average_size,
                               size_variation=size_variation, delay=delay_us)
                for s in streams]

    def limit_data(self, proxy: str, nbytes: int,
                   *, streams: tuple[str, ...] = (UPSTREAM,)) -> list[str]:
        """Close each connection once ``nbytes`` passed (counted from now)."""
        return [self.add_toxic(proxy, "limit_data", stream=s, bytes=nbytes) for s in streams]

    def remove(self, proxy: str, names: list[str]) -> None:
        for name in names:
            self.remove_toxic(proxy, name)


__all__ = [
    "BOTH",
    "DEFAULT_API_PORT",
    "DOWNSTREAM",
    "TOXIPROXY_VERSION",
    "UPSTREAM",
    "Proxy",
    "Server",
    "Toxiproxy",
    "ToxiproxyError",
    "install",
    "install_dir",
]
