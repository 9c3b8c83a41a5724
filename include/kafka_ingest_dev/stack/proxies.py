"""``up --faults``: Toxiproxy in front of each Kafka node and of Postgres.

Toxiproxy (:mod:`kafka_ingest_dev.faults`, its API on ``127.0.0.1:18474``) gets one proxy
per Kafka node, to the node's ``FAULTS`` listener (advertised as the proxy's address, so
a client that bootstraps through the proxy stays on it), and one in front of the
Postgres primary (moved by a failover). ``stack env --faults`` points clients through
them; Airflow's own metadata database stays direct: the orchestrator that retries must
survive the data path's faults.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from kafka_ingest_dev import faults as fault_proxy
from kafka_ingest_dev.procs import require_free
from kafka_ingest_dev.stack.postgres import primary_node
from kafka_ingest_dev.stack.settings import Settings, settings


def _proxies(s: Settings) -> list[dict[str, Any]]:
    """One proxy per Kafka node (to its FAULTS listener) and one in front of Postgres."""
    found = [{"name": n.proxy_name, "listen": f"127.0.0.1:{n.proxy_port}",
              "upstream": f"127.0.0.1:{n.faults_port}", "enabled": True} for n in s.nodes]
    found.append({"name": "postgres", "listen": f"127.0.0.1:{s.pg_proxy_port}",
                  "upstream": f"127.0.0.1:{primary_node(s).port}", "enabled": True})
    return found


def ensure(s: Settings) -> str:
    """Toxiproxy running (built first if missing) with the stack's proxies."""
    since = time.monotonic()
    server = s.toxiproxy
    if server.pid() is None:
        for proxy in _proxies(s):
            port = int(proxy["listen"].rsplit(":", 1)[1])
            require_free(port, f"Toxiproxy's {proxy['name']} proxy",
                         "KAFKA_INGEST_KAFKA_PROXY_PORT" if proxy["name"].startswith("kafka")
                         else "KAFKA_INGEST_PG_PROXY_PORT")
    pid, started = server.start()
    fault_proxy.Toxiproxy(server.url).populate(_proxies(s))
    names = ", ".join(f"{p['name']} {p['listen']} -> {p['upstream']}" for p in _proxies(s))
    return server.started(pid, started, since, where=f"{server.url} ({names})")


def repoint(s: Settings) -> None:
    """Postgres' proxy in front of the (new) primary, after a failover."""
    if s.faults and s.toxiproxy.pid() is not None:
        with contextlib.suppress(Exception):  # the proxy is a test aid, not the failover
            fault_proxy.Toxiproxy(s.toxiproxy.url).populate(_proxies(s))


def toxiproxy() -> fault_proxy.Toxiproxy:
    """A client of this stack's Toxiproxy (``up --faults``)."""
    return fault_proxy.Toxiproxy(settings().toxiproxy.url)
