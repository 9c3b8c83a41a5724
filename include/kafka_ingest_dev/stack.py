"""The real local stack: Apache Kafka (KRaft), PostgreSQL and Airflow's metadata database.

Development tooling: the runtime package ``kafka_ingest`` never imports this module; only
``kafka-ingest stack ...``, the demo and the tests know the local stack.

``kafka-ingest stack up`` runs the same software a deployment runs, without Docker, on
loopback only, so integration, DAG and chaos tests exercise real brokers and a real
database rather than fakes:

- **Kafka**: the official ``org.apache.kafka`` jars from Maven Central (fetched once by
  Maven into ``${XDG_CACHE_HOME:-~/.cache}/kafka-ingest/kafka-<version>/libs``), one JVM
  acting as broker and controller with a static quorum; ``127.0.0.1:19092``.
- **PostgreSQL**: Debian's server binaries, a cluster under ``<state>/postgres/data``;
  ``127.0.0.1:15432``, role/password ``kafka_ingest``, databases ``kafka_ingest`` (the
  pipelines) and ``airflow`` (Airflow's metadata).
- **Airflow**: no daemon; ``AIRFLOW_HOME=<state>/airflow`` and ``airflow db migrate``
  against the ``airflow`` database, re-run only when the installed Airflow version changes.
- **Schema registry** (``up --registry``): Apicurio Registry
  (:mod:`kafka_ingest_dev.apicurio`) fetched once from Maven Central into the same cache,
  H2 in memory, global compatibility ``BACKWARD``; its Confluent-compatible API on
  ``http://127.0.0.1:18081/apis/ccompat/v7``, its management interface on
  ``127.0.0.1:18082`` (``KAFKA_INGEST_REGISTRY_PORT``, ``..._REGISTRY_MANAGEMENT_PORT``);
  ``<state>/registry``. Like Airflow's services it is started only when asked for, and a
  plain ``up`` leaves a running one alone; ``down`` stops it, ``down --registry`` only it.

Two options change the shape of the stack, and stick to its state directory:

- ``up --brokers 3``: three KRaft nodes (each broker and controller, a 3-voter static
  quorum) on their own ports and log dirs, internal topics with three replicas, two in
  sync; :func:`stop_broker`, :func:`kill_broker` and :func:`start_broker` take one node
  down and up again. Only on a state directory whose Kafka has no data yet (a quorum is
  fixed when it is formatted); the tests run it as a stack of its own.
- ``up --faults``: Toxiproxy (:mod:`kafka_ingest_dev.faults`, API on ``127.0.0.1:18474``)
  with one proxy in front of each Kafka node and one in front of Postgres. Each broker gets
  an extra ``FAULTS`` listener advertised as its proxy's address, so a client that
  bootstraps through the proxy stays on it; the plain listeners stay as they are.
  ``stack env --faults`` points clients through the proxies (Airflow's own metadata
  database stays direct: the orchestrator that retries must survive the data path's
  faults) and adds ``TOXIPROXY_URL``.

- ``up --replica`` (``--sync``): a streaming standby of Postgres under
  ``<state>/postgres-standby`` on ``127.0.0.1:15434`` (``KAFKA_INGEST_PG_STANDBY_PORT``),
  made by ``pg_basebackup`` through a replication slot; asynchronous, or synchronous
  (``synchronous_standby_names``, ``synchronous_commit = remote_apply``) with ``--sync``.
  ``stack env --replica`` names both nodes (``host=127.0.0.1,127.0.0.1
  port=15432,15434 target_session_attrs=read-write``), Airflow's metadata database
  included; ``stack failover`` SIGKILLs the primary, promotes the standby and makes the
  dead primary's place a fresh standby of the new one (:func:`failover`);
  ``down --replica`` removes the standby.

Everything lives in the state directory (data survives ``down``/``up``); ``down`` stops
only the processes whose pid files this module wrote. The processes start without the
user's libpq variables (a shell's ``PGPORT=15432,15434`` from ``stack env --replica`` is
for its psql, not for the servers), and the stack's own connections pin what those would
change (:func:`~kafka_ingest_dev.procs.child_env`,
:func:`~kafka_ingest_dev.procs.own_libpq`). Trade-off: the processes are not
supervised, so a crashed broker stays down until the next ``up`` (which is idempotent and
cheap when everything already runs).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import logging
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka_ingest_dev import apicurio, tls
from kafka_ingest_dev import faults as fault_proxy
from kafka_ingest_dev.airflow_services import REDIS_PORT, AirflowServices
from kafka_ingest_dev.databases import airflow_postgres_conn
from kafka_ingest_dev.procs import (
    CHILDREN,
    PartStatus,
    StackError,
    accepts,
    alive,
    binary,
    child_env,
    our_pid,
    own_libpq,
    read_or_none,
    require_free,
    tail,
    terminate,
    wait_gone,
)

__all__ = [
    "KAFKA_VERSION",
    "PartStatus",
    "StackError",
    "broker_pid",
    "down",
    "env",
    "failover",
    "isolated_env",
    "kill_broker",
    "main",
    "pause_replication",
    "primary_node",
    "remove_replica",
    "restart_kafka",
    "restart_postgres",
    "start_broker",
    "start_registry",
    "state_dir",
    "status",
    "stop_airflow",
    "stop_broker",
    "stop_registry",
    "toxiproxy",
    "up",
]

log = logging.getLogger(__name__)

KAFKA_VERSION = "4.1.1"
PG_ROLE = "kafka_ingest"
# The plaintext development stack's owner password: loopback only, documented, and the
# same as docker-compose.yml's. The secure stack's runtime role gets a random one.
PG_PASSWORD = "kafka_ingest"  # noqa: S105
PG_DATABASE = "kafka_ingest"
#: The secure stack's runtime role (least privilege); PG_ROLE owns the schema.
PG_APP_ROLE = "kafka_ingest_app"
AIRFLOW_DATABASE = "airflow"
KAFKA_GROUP_ID = "kafka-ingest"

_BROKER_DIR = Path(__file__).resolve().parent / "broker"
_KAFKA_START_TIMEOUT_S = 90.0
_KAFKA_STOP_TIMEOUT_S = 30.0
_PG_TIMEOUT_S = 60
_MIGRATE_TIMEOUT_S = 900.0
_POLL_S = 0.1

Report = Callable[[str], None]


@dataclass(frozen=True)
class KafkaNode:
    """One KRaft node of the local cluster: broker and controller in one JVM."""

    node_id: int
    port: int
    controller_port: int
    #: The broker's ``FAULTS`` listener (behind Toxiproxy) and the proxy's own port.
    faults_port: int
    proxy_port: int
    home: Path

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pidfile(self) -> Path:
        return self.home / "kafka.pid"

    @property
    def props(self) -> Path:
        return self.home / "server.properties"

    @property
    def log(self) -> Path:
        return self.home / "broker.log"

    @property
    def proxy_name(self) -> str:
        """Its proxy in Toxiproxy: ``kafka``, then ``kafka-2``, ``kafka-3``."""
        return "kafka" if self.node_id == 1 else f"kafka-{self.node_id}"


@dataclass(frozen=True)
class PgNode:
    """One Postgres server of the stack: its directory (``data``, ``run`` for the unix
    socket, ``postgres.log``) and its loopback port."""

    name: str
    home: Path
    port: int

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def socket_dir(self) -> Path:
        return self.home / "run"

    @property
    def log(self) -> Path:
        return self.home / "postgres.log"

    @property
    def standby(self) -> bool:
        """A standby (it has ``standby.signal``; promotion removes it)."""
        return (self.data / "standby.signal").is_file()

    @property
    def exists(self) -> bool:
        return (self.data / "PG_VERSION").is_file()


@dataclass(frozen=True)
class Settings:
    """Where the stack lives and which loopback ports it uses (env-overridable)."""

    state: Path
    cache: Path
    repo: Path | None
    kafka_port: int
    controller_port: int
    secure_port: int
    airflow_port: int
    pg_port: int
    pg_home: Path
    #: ``--faults``: Toxiproxy's API, and per Kafka node (node 1's; node n adds 100 * (n-1)
    #: unless ``..._PORT_<n>`` says otherwise) the proxy clients use and the broker's
    #: listener behind it; Postgres' proxy.
    toxiproxy_port: int = fault_proxy.DEFAULT_API_PORT
    kafka_proxy_port: int = 19095
    kafka_faults_port: int = 19096
    pg_proxy_port: int = 15433
    #: ``up --replica``: the streaming standby's port.
    pg_standby_port: int = 15434
    #: ``--registry``: the schema registry's API and its management interface.
    registry_port: int = apicurio.DEFAULT_PORT
    registry_management_port: int = apicurio.DEFAULT_MANAGEMENT_PORT

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    @property
    def kafka_dir(self) -> Path:
        return self.state / "kafka"

    @property
    def kafka_pidfile(self) -> Path:
        return self.kafka_dir / "kafka.pid"

    @property
    def kafka_props(self) -> Path:
        return self.kafka_dir / "server.properties"

    @property
    def pg_dir(self) -> Path:
        return self.pg_home

    @property
    def pg_data(self) -> Path:
        return self.pg_dir / "data"

    @property
    def pg_socket_dir(self) -> Path:
        return self.pg_dir / "run"

    @property
    def pg_nodes(self) -> tuple[PgNode, PgNode]:
        """The stack's Postgres server and the place of its standby (``up --replica``);
        either may be the primary: ``stack failover`` swaps them."""
        return (PgNode("postgres", self.pg_dir, self.pg_port),
                PgNode("postgres-standby", self.pg_dir.with_name("postgres-standby"),
                       self.pg_standby_port))

    @property
    def replica_marker(self) -> Path:
        """Present once ``up --replica`` ran; holds ``async`` or ``sync``."""
        return self.state / "postgres-replica"

    @property
    def replica(self) -> str | None:
        """The standby's replication mode (``async``/``sync``), None without one."""
        text = read_or_none(self.replica_marker)
        return text.strip() if text else None

    @property
    def airflow_home(self) -> Path:
        return self.state / "airflow"

    @property
    def secure_bootstrap(self) -> str:
        return f"127.0.0.1:{self.secure_port}"

    @property
    def tls_dir(self) -> Path:
        return self.state / "tls"

    @property
    def bin_dir(self) -> Path:
        """Kafka's command-line tools, as wrapper scripts ``stack env`` puts on PATH."""
        return self.state / "bin"

    @property
    def secure_marker(self) -> Path:
        """Present once ``up --secure`` ran: the stack stays secure across restarts."""
        return self.state / "secure"

    @property
    def secure(self) -> bool:
        return self.secure_marker.is_file()

    @property
    def faults_marker(self) -> Path:
        """Present once ``up --faults`` ran: Toxiproxy runs with the stack from then on."""
        return self.state / "faults"

    @property
    def faults(self) -> bool:
        return self.faults_marker.is_file()

    @property
    def toxiproxy(self) -> fault_proxy.Server:
        return fault_proxy.Server(self.toxiproxy_port, self.state / "toxiproxy")

    @property
    def brokers_file(self) -> Path:
        """The number of Kafka nodes, written by ``up --brokers N`` (absent: one)."""
        return self.state / "kafka-brokers"

    @property
    def brokers(self) -> int:
        text = (read_or_none(self.brokers_file) or "").strip()
        return int(text) if text.isdigit() else 1

    def node(self, node_id: int) -> KafkaNode:
        """Kafka node ``node_id`` (1-based): node 1 is the single broker's ports and
        directory; node n its own, ``KAFKA_INGEST_KAFKA_PORT_<n>`` (and ``_CONTROLLER_``,
        ``_KAFKA_PROXY_``, ``_KAFKA_FAULTS_``) or node 1's plus 100 * (n - 1)."""
        if node_id == 1:
            return KafkaNode(1, self.kafka_port, self.controller_port, self.kafka_faults_port,
                             self.kafka_proxy_port, self.kafka_dir)
        step = 100 * (node_id - 1)
        return KafkaNode(
            node_id,
            _port(f"KAFKA_INGEST_KAFKA_PORT_{node_id}", self.kafka_port + step),
            _port(f"KAFKA_INGEST_CONTROLLER_PORT_{node_id}", self.controller_port + step),
            _port(f"KAFKA_INGEST_KAFKA_FAULTS_PORT_{node_id}", self.kafka_faults_port + step),
            _port(f"KAFKA_INGEST_KAFKA_PROXY_PORT_{node_id}", self.kafka_proxy_port + step),
            self.state / f"kafka-{node_id}",
        )

    @property
    def nodes(self) -> list[KafkaNode]:
        return [self.node(n) for n in range(1, self.brokers + 1)]

    @property
    def bootstrap_servers(self) -> str:
        """Every node's plaintext address (one node: :attr:`bootstrap`)."""
        return ",".join(n.bootstrap for n in self.nodes)

    @property
    def proxied_bootstrap(self) -> str:
        """Every node's address through its Toxiproxy proxy (``--faults``)."""
        return ",".join(f"127.0.0.1:{n.proxy_port}" for n in self.nodes)

    @property
    def airflow(self) -> AirflowServices:
        return AirflowServices(self.airflow_home, self.airflow_port,
                               _port("KAFKA_INGEST_REDIS_PORT", REDIS_PORT))

    @property
    def registry(self) -> apicurio.Server:
        return apicurio.Server(self.registry_port, self.registry_management_port,
                               self.state / "registry")


# --------------------------------------------------------------------------- settings


def repo_root() -> Path | None:
    """The checkout this package sits in (``include/kafka_ingest_dev`` -> repo), if any."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() else None


def state_dir() -> Path:
    """``$KAFKA_INGEST_STATE_DIR``, else ``<repo>/.state`` in a checkout, else XDG state."""
    explicit = os.environ.get("KAFKA_INGEST_STATE_DIR")
    if explicit:
        return Path(explicit).expanduser().resolve()
    root = repo_root()
    if root is not None:
        return root / ".state"
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "kafka-ingest"


def _pg_home(state: Path) -> Path:
    """``<state>/postgres``, unless Postgres (run as the ``postgres`` user when we are root)
    could not reach it through a private parent such as ``/root``: then a directory under
    ``/var/tmp`` named after the state dir, so each checkout still gets its own cluster."""
    inside = state / "postgres"
    if os.geteuid() != 0 or all(p.stat().st_mode & 0o001 for p in state.parents if p.exists()):
        return inside
    digest = hashlib.sha256(str(state).encode()).hexdigest()[:12]
    # A directory of our own (named by the state dir's hash), made 0700 by initdb.
    return Path("/var/tmp/kafka-ingest") / digest / "postgres"  # noqa: S108


def _cache_dir() -> Path:
    """Jars are shared by every checkout and state dir, so they go to the user cache, in a
    directory named after the pom that lists them."""
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    pom = hashlib.sha256((_BROKER_DIR / "pom.xml").read_bytes()).hexdigest()[:12]
    return Path(xdg) / "kafka-ingest" / f"kafka-{KAFKA_VERSION}-{pom}"


def _port(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise StackError(f"{name}={raw!r} is not a port number") from None


#: Every environment variable that names a port of the stack; Kafka nodes 2..n take
#: ``<name>_<n>`` for each of :data:`NODE_PORT_VARIABLES`.
PORT_VARIABLES = (
    "KAFKA_INGEST_KAFKA_PORT", "KAFKA_INGEST_CONTROLLER_PORT", "KAFKA_INGEST_KAFKA_SECURE_PORT",
    "KAFKA_INGEST_PG_PORT", "KAFKA_INGEST_PG_STANDBY_PORT", "KAFKA_INGEST_AIRFLOW_PORT",
    "KAFKA_INGEST_REDIS_PORT", "KAFKA_INGEST_TOXIPROXY_PORT", "KAFKA_INGEST_KAFKA_PROXY_PORT",
    "KAFKA_INGEST_KAFKA_FAULTS_PORT", "KAFKA_INGEST_PG_PROXY_PORT",
    "KAFKA_INGEST_REGISTRY_PORT", "KAFKA_INGEST_REGISTRY_MANAGEMENT_PORT",
)
NODE_PORT_VARIABLES = ("KAFKA_INGEST_KAFKA_PORT", "KAFKA_INGEST_CONTROLLER_PORT",
                       "KAFKA_INGEST_KAFKA_PROXY_PORT", "KAFKA_INGEST_KAFKA_FAULTS_PORT")


def isolated_env(state: Path, *, brokers: int = 1) -> dict[str, str]:
    """The environment of a stack of its own beside the shared one: its state dir and a
    free loopback port for every port it may open (the fault tests', the soak's)."""
    from kafka_ingest_dev.procs import free_ports

    names = [*PORT_VARIABLES,
             *(f"{n}_{i}" for i in range(2, brokers + 1) for n in NODE_PORT_VARIABLES)]
    return {"KAFKA_INGEST_STATE_DIR": str(state),
            **dict(zip(names, map(str, free_ports(len(names))), strict=True))}


def settings() -> Settings:
    """Read the environment once per call: tests change ports and state dirs at will."""
    state = state_dir()
    return Settings(
        state=state,
        cache=_cache_dir(),
        repo=repo_root(),
        kafka_port=_port("KAFKA_INGEST_KAFKA_PORT", 19092),
        controller_port=_port("KAFKA_INGEST_CONTROLLER_PORT", 19093),
        secure_port=_port("KAFKA_INGEST_KAFKA_SECURE_PORT", 19094),
        airflow_port=_port("KAFKA_INGEST_AIRFLOW_PORT", 18080),
        pg_port=_port("KAFKA_INGEST_PG_PORT", 15432),
        pg_home=_pg_home(state),
        toxiproxy_port=_port("KAFKA_INGEST_TOXIPROXY_PORT", fault_proxy.DEFAULT_API_PORT),
        kafka_proxy_port=_port("KAFKA_INGEST_KAFKA_PROXY_PORT", 19095),
        kafka_faults_port=_port("KAFKA_INGEST_KAFKA_FAULTS_PORT", 19096),
        pg_proxy_port=_port("KAFKA_INGEST_PG_PROXY_PORT", 15433),
        pg_standby_port=_port("KAFKA_INGEST_PG_STANDBY_PORT", 15434),
        registry_port=_port("KAFKA_INGEST_REGISTRY_PORT", apicurio.DEFAULT_PORT),
        registry_management_port=_port("KAFKA_INGEST_REGISTRY_MANAGEMENT_PORT",
                                       apicurio.DEFAULT_MANAGEMENT_PORT),
    )


# --------------------------------------------------------------------------- processes


@contextlib.contextmanager
def _locked(s: Settings) -> Iterator[None]:
    """Serialise ``up``/``down`` across processes (pytest-xdist workers, two shells)."""
    s.state.mkdir(parents=True, exist_ok=True)
    with (s.state / ".stack.lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- kafka


def _fetch_kafka_jars(s: Settings) -> Path:
    """Download the broker's and tools' jars once; the marker makes an interrupted download
    redo. (The cache directory is named after the pom, so a changed pom fetches anew while
    a running broker keeps the jars it started with.)"""
    libs = s.cache / "libs"
    marker = s.cache / ".complete"
    if marker.is_file():
        return libs
    mvn = binary("mvn", "Maven (apt-get install maven)")
    shutil.rmtree(libs, ignore_errors=True)
    libs.mkdir(parents=True)
    cmd = [
        mvn, "-q", "-B", "-f", str(_BROKER_DIR / "pom.xml"), "dependency:copy-dependencies",
        f"-DoutputDirectory={libs}", "-Dmdep.includeScope=runtime",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=child_env())
    if done.returncode != 0:
        detail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
        raise StackError(f"mvn could not fetch Kafka {KAFKA_VERSION} jars: {detail[0]}")
    marker.write_text(f"{KAFKA_VERSION}\n")
    return libs


#: The Kafka tools ``stack env`` puts on PATH, with their main classes (kafka-tools 4.x).
KAFKA_TOOLS = {
    "kafka-topics": "org.apache.kafka.tools.TopicCommand",
    "kafka-consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "kafka-console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "kafka-console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "kafka-get-offsets": "org.apache.kafka.tools.GetOffsetShell",
}


def _install_kafka_tools(s: Settings, java: str, libs: Path) -> None:
    """Small wrapper scripts in ``<state>/bin`` that run Kafka's own tools from the jars."""
    s.bin_dir.mkdir(parents=True, exist_ok=True)
    log_config = _BROKER_DIR / "tools-log4j2.yaml"
    for name, main_class in KAFKA_TOOLS.items():
        script = (
            "#!/bin/sh\n"
            f"# Kafka's {name}, from the local stack's jars (written by kafka-ingest stack up).\n"
            f"exec {shlex.quote(java)} -Xmx256m -Dlog4j2.configurationFile="
            f"{shlex.quote(str(log_config))} -cp {shlex.quote(str(libs))}'/*' "
            f'{main_class} "$@"\n'
        )
        path = s.bin_dir / name
        if read_or_none(path) != script:
            path.write_text(script)
            path.chmod(0o755)


def _kafka_properties(s: Settings, node: KafkaNode | None = None) -> str:
    """One KRaft node, broker and controller. A single node keeps one replica of
    everything; with ``--brokers 3`` the three nodes form a static 3-voter quorum and the
    internal topics get three replicas, two in sync (the pipelines' topics get theirs
    from the pipelines file: ``replication_factor``, ``topic_config``)."""
    node = node or s.node(1)
    nodes = s.nodes
    replicas, min_isr = str(min(len(nodes), 3)), str(min(len(nodes), 2))
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node.node_id),
        "controller.quorum.voters": ",".join(
            f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in nodes),
        "listeners": f"PLAINTEXT://127.0.0.1:{node.port},"
        f"CONTROLLER://127.0.0.1:{node.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{node.bootstrap}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(node.home / "data"),
        "num.partitions": "1",
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": replicas,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": min_isr,
        "group.initial.rebalance.delay.ms": "0",
    }
    if len(nodes) > 1:
        props["default.replication.factor"] = replicas
    if s.secure:
        props.update(_secure_listener(s))
    if s.faults:
        props.update(_faults_listener(props, node))
    header = "# Written by kafka-ingest stack up on every start; edit stack.py instead.\n"
    return header + "".join(f"{key}={value}\n" for key, value in props.items())


def _faults_listener(props: dict[str, str], node: KafkaNode) -> dict[str, str]:
    """A plaintext ``FAULTS`` listener beside the others, advertised as the node's
    Toxiproxy proxy: a client that bootstraps through the proxy is sent to the proxy for
    every later connection too, so every byte it exchanges can be delayed or cut."""
    return {
        "listeners": f"{props['listeners']},FAULTS://127.0.0.1:{node.faults_port}",
        "advertised.listeners":
            f"{props['advertised.listeners']},FAULTS://127.0.0.1:{node.proxy_port}",
        "listener.security.protocol.map":
            f"{props['listener.security.protocol.map']},FAULTS:PLAINTEXT",
    }


def _secure_listener(s: Settings) -> dict[str, str]:
    """A ``SASL_SSL`` listener beside the plaintext one: SCRAM-SHA-512 over TLS, with the
    stack's own certificate (a PEM keystore); brokers and controllers keep plaintext."""
    files = tls.TlsFiles(s.tls_dir)
    name = "listener.name.sasl_ssl"
    return {
        "listeners": f"PLAINTEXT://127.0.0.1:{s.kafka_port},"
        f"SASL_SSL://127.0.0.1:{s.secure_port},CONTROLLER://127.0.0.1:{s.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{s.bootstrap},SASL_SSL://{s.secure_bootstrap}",
        "listener.security.protocol.map":
            "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        f"{name}.scram-sha-512.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        f"{name}.ssl.keystore.type": "PEM",
        f"{name}.ssl.keystore.location": str(files.server_pem),
    }


def _create_scram_user(s: Settings) -> None:
    """Create (or reset) the SCRAM-SHA-512 user over the plaintext listener; idempotent."""
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    creds = tls.credentials(tls.TlsFiles(s.tls_dir))
    config: dict[str, Any] = {"bootstrap.servers": s.bootstrap, "logger": log}
    admin = AdminClient(config)
    upsert = UserScramCredentialUpsertion(
        creds["kafka_user"], ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
        creds["kafka_password"].encode())
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(30)


def _java_cmd(java: str, libs: Path, main_class: str, *args: str) -> list[str]:
    return [java, "-cp", f"{libs}/*", main_class, *args]


def _cluster_id(s: Settings) -> str:
    """One id for every node of the cluster, made when the first node is formatted (a
    stack formatted before the id was kept has it in node 1's meta.properties)."""
    path = s.state / "kafka-cluster-id"
    stored = (read_or_none(path) or "").strip()
    if stored:
        return stored
    meta = read_or_none(s.kafka_dir / "data" / "meta.properties") or ""
    found = [line.split("=", 1)[1].strip() for line in meta.splitlines()
             if line.startswith("cluster.id=")]
    cluster_id = found[0] if found else (
        base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode())
    path.write_text(f"{cluster_id}\n")
    return cluster_id


def _format_kafka_storage(s: Settings, java: str, libs: Path, node: KafkaNode) -> None:
    """Format the log dir on first start only: formatting again would lose the data."""
    if (node.home / "data" / "meta.properties").is_file():
        return
    # `--cluster-id=<id>`, not `-t <id>`: a random id may start with "-".
    cmd = _java_cmd(
        java, libs, "kafka.tools.StorageTool", "format", f"--cluster-id={_cluster_id(s)}",
        "-c", str(node.props),
    )  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=child_env())
    if done.returncode != 0:
        detail = (done.stdout + done.stderr).strip().replace("\n", " | ")
        raise StackError(f"formatting Kafka storage failed: {detail[-300:]}")


def _node_name(s: Settings, node: KafkaNode) -> str:
    return "kafka" if s.brokers == 1 else f"kafka-{node.node_id}"


def _kafka_pid(s: Settings, node: KafkaNode | None = None) -> int | None:
    node = node or s.node(1)
    return our_pid(node.pidfile, str(node.props))


def _kafka_preflight(s: Settings, nodes: list[KafkaNode] | None = None) -> str:
    """Fail in a second, before any slow step, on what the user must fix; return java."""
    java = binary("java", "a Java 17+ runtime (apt-get install openjdk-17-jre-headless)")
    if not (s.cache / ".complete").is_file():
        binary("mvn", "Maven (apt-get install maven)")
    for node in nodes if nodes is not None else s.nodes:
        suffix = "" if node.node_id == 1 else f"_{node.node_id}"
        require_free(node.port, f"Kafka node {node.node_id}", f"KAFKA_INGEST_KAFKA_PORT{suffix}")
        require_free(node.controller_port, f"the controller of Kafka node {node.node_id}",
                     f"KAFKA_INGEST_CONTROLLER_PORT{suffix}")
        if s.faults:
            require_free(node.faults_port, f"the FAULTS listener of Kafka node {node.node_id}",
                         f"KAFKA_INGEST_KAFKA_FAULTS_PORT{suffix}")
    if s.secure:
        require_free(s.secure_port, "Kafka's SASL_SSL listener", "KAFKA_INGEST_KAFKA_SECURE_PORT")
    return java


def _launch_kafka(s: Settings, java: str, node: KafkaNode | None = None) -> int:
    """Fetch the jars if needed, format on first start, spawn the node; do not wait."""
    node = node or s.node(1)
    libs = _fetch_kafka_jars(s)
    node.home.mkdir(parents=True, exist_ok=True)
    node.props.write_text(_kafka_properties(s, node))
    _format_kafka_storage(s, java, libs, node)
    jvm = [
        "-Xmx512m", "-Xms256m", "-XX:+UseG1GC", "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={_BROKER_DIR / 'log4j2.yaml'}",
    ]  # fmt: skip
    cmd = [java, *jvm, "-cp", f"{libs}/*", "kafka.Kafka", str(node.props)]
    with node.log.open("ab") as out:
        child = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            cwd=node.home, start_new_session=True, env=child_env(),
        )  # fmt: skip
    CHILDREN[child.pid] = child
    node.pidfile.write_text(f"{child.pid}\n")
    return child.pid


def _kafka_answers(s: Settings, timeout_s: float, node: KafkaNode | None = None) -> bool:
    """Health: the node answers a metadata request (AdminClient.list_topics)."""
    node = node or s.node(1)
    if not accepts(node.port):
        return False
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    # librdkafka logs through ours, not to stderr, while the broker is still booting.
    config: dict[str, Any] = {"bootstrap.servers": node.bootstrap, "logger": log}
    admin = AdminClient(config)
    try:
        admin.list_topics(timeout=timeout_s)
    except KafkaException:
        return False
    return True


def _await_kafka(s: Settings, pid: int, node: KafkaNode | None = None) -> None:
    """Poll until the node answers; fail fast (with its log) if the JVM exits."""
    node = node or s.node(1)
    deadline = time.monotonic() + _KAFKA_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if not alive(pid):
            node.pidfile.unlink(missing_ok=True)
            raise StackError(f"the Kafka broker exited while starting: {tail(node.log)}")
        if _kafka_answers(s, timeout_s=2.0, node=node):
            return
        time.sleep(_POLL_S)
    raise StackError(
        f"Kafka did not answer on {node.bootstrap} within {_KAFKA_START_TIMEOUT_S:.0f} s; "
        f"see {node.log}"
    )


def _await_cluster(s: Settings, *, fresh: bool) -> None:
    """Every node listed as a live broker; on a node just started, its coordinators."""
    if s.brokers > 1:
        _await_brokers(s, [n.node_id for n in s.nodes])
    if fresh:
        _await_coordinators(s)


#: librdkafka's lines while the coordinators load: the retries the wait expects, not shown
#: (a wait that fails says why in its StackError).
_READY_LOG = logging.getLogger(f"{__name__}.ready")
_READY_LOG.addHandler(logging.NullHandler())
_READY_LOG.propagate = False

#: Where the stack proves its coordinators work, then leaves no trace but this topic.
READY_TOPIC = "kafka-ingest-stack-ready"


def _await_coordinators(s: Settings) -> None:
    """Poll until a new broker's coordinators serve clients: an idempotent producer gets
    its producer id (delivers a record) and a group commit lands. Until then librdkafka
    logs "Coordinator load in progress: retrying" for every client a newcomer starts."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    common: dict[str, Any] = {"bootstrap.servers": s.bootstrap_servers, "logger": _READY_LOG}
    deadline = time.monotonic() + _KAFKA_START_TIMEOUT_S
    admin = AdminClient(common)  # kept: a destroyed client fails its futures
    created = admin.create_topics([NewTopic(READY_TOPIC, 1, 1)])
    try:
        created[READY_TOPIC].result(_KAFKA_START_TIMEOUT_S)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise StackError(f"could not create {READY_TOPIC} on {s.bootstrap_servers}: "
                             f"{exc}") from exc
    producer = Producer({**common, "enable.idempotence": True, "acks": "all",
                         "message.timeout.ms": int(_KAFKA_START_TIMEOUT_S * 1000)})
    delivered: list[Any] = []
    producer.produce(READY_TOPIC, b"ready", on_delivery=lambda err, _m: delivered.append(err))
    while not delivered and time.monotonic() < deadline:
        producer.poll(_POLL_S)
    if delivered != [None]:
        raise StackError(f"Kafka on {s.bootstrap_servers} did not take an idempotent "
                         f"producer's record within {_KAFKA_START_TIMEOUT_S:.0f} s: "
                         f"{delivered or 'no delivery report'}")
    consumer = Consumer({**common, "group.id": READY_TOPIC, "enable.auto.commit": False})
    try:
        while True:
            try:
                consumer.commit(offsets=[TopicPartition(READY_TOPIC, 0, 1)],
                                asynchronous=False)
                return
            except KafkaException as exc:
                if time.monotonic() > deadline:
                    raise StackError(f"Kafka's group coordinator on {s.bootstrap_servers} "
                                     f"did not take a commit within "
                                     f"{_KAFKA_START_TIMEOUT_S:.0f} s: {exc}") from exc
                time.sleep(_POLL_S)
    finally:
        consumer.close()


def _await_brokers(s: Settings, node_ids: list[int]) -> None:
    """Poll until the cluster's metadata lists every one of ``node_ids`` as a live broker."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    config: dict[str, Any] = {"bootstrap.servers": s.bootstrap_servers, "logger": log}
    admin = AdminClient(config)
    deadline = time.monotonic() + _KAFKA_START_TIMEOUT_S
    seen: set[int] = set()
    while time.monotonic() < deadline:
        with contextlib.suppress(KafkaException):
            seen = set(admin.list_topics(timeout=2.0).brokers)
            if seen >= set(node_ids):
                return
        time.sleep(_POLL_S)
    raise StackError(f"the Kafka cluster lists brokers {sorted(seen)}, not yet "
                     f"{sorted(set(node_ids) - seen)}, after {_KAFKA_START_TIMEOUT_S:.0f} s; "
                     "see the nodes' broker.log")


def _stop_node(s: Settings, node: KafkaNode) -> str:
    pid = _kafka_pid(s, node)
    if pid is None:
        node.pidfile.unlink(missing_ok=True)
        return f"{_node_name(s, node)}: not running"
    terminate(pid, _KAFKA_STOP_TIMEOUT_S)
    node.pidfile.unlink(missing_ok=True)
    return f"{_node_name(s, node)}: stopped (pid {pid})"


def _stop_kafka(s: Settings) -> str:
    """Stop every node at once (one by one, the last ones would wait for a quorum)."""
    nodes = s.nodes
    if len(nodes) == 1:
        return _stop_node(s, nodes[0])
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        return "\n".join(pool.map(lambda n: _stop_node(s, n), nodes))


def _kafka_status(s: Settings) -> list[PartStatus]:
    parts = []
    for node in s.nodes:
        pid = _kafka_pid(s, node)
        healthy = pid is not None and _kafka_answers(s, timeout_s=3.0, node=node)
        detail = "" if healthy or pid is None else "process alive, not answering"
        parts.append(PartStatus(_node_name(s, node), node.bootstrap, healthy, pid, detail))
    return parts


# --------------------------------------------------------------------------- faults


def _toxiproxy_proxies(s: Settings) -> list[dict[str, Any]]:
    """One proxy per Kafka node (to its FAULTS listener) and one in front of Postgres."""
    proxies = [{"name": n.proxy_name, "listen": f"127.0.0.1:{n.proxy_port}",
                "upstream": f"127.0.0.1:{n.faults_port}", "enabled": True} for n in s.nodes]
    proxies.append({"name": "postgres", "listen": f"127.0.0.1:{s.pg_proxy_port}",
                    "upstream": f"127.0.0.1:{primary_node(s).port}", "enabled": True})
    return proxies


def _ensure_toxiproxy(s: Settings) -> str:
    """Toxiproxy running (built first if missing) with the stack's proxies."""
    since = time.monotonic()
    server = s.toxiproxy
    client = fault_proxy.Toxiproxy(server.url)
    if server.pid() is None:
        for proxy in _toxiproxy_proxies(s):
            port = int(proxy["listen"].rsplit(":", 1)[1])
            require_free(port, f"Toxiproxy's {proxy['name']} proxy",
                         "KAFKA_INGEST_KAFKA_PROXY_PORT" if proxy["name"].startswith("kafka")
                         else "KAFKA_INGEST_PG_PROXY_PORT")
    pid, started = fault_proxy.start_server(server)
    client.populate(_toxiproxy_proxies(s))
    names = ", ".join(f"{p['name']} {p['listen']} -> {p['upstream']}"
                      for p in _toxiproxy_proxies(s))
    return (_started("toxiproxy", f"{server.url} ({names})", pid, started, since))


def toxiproxy() -> fault_proxy.Toxiproxy:
    """A client of this stack's Toxiproxy (``up --faults``)."""
    return fault_proxy.Toxiproxy(settings().toxiproxy.url)


def _toxiproxy_status(s: Settings) -> PartStatus:
    server = s.toxiproxy
    pid = server.pid()
    healthy = pid is not None and server.answers()
    detail = "" if healthy or pid is None else "process alive, not answering"
    return PartStatus("toxiproxy", server.url.removeprefix("http://"), healthy, pid, detail)


# --------------------------------------------------------------------------- registry

#: (pid, started) of the registry: started by this call, or found running.
RegistryLaunch = tuple[int, bool]


def _registry_preflight(s: Settings,
                        emit: Report) -> tuple[apicurio.Release, apicurio.Java, str]:
    """Fail in a second, before the download, on what the user must fix: no Java 17+, no
    Maven for a first fetch, a port taken. Returns the release, its Java and mvn; says so
    when no Java 21+ makes it fall back to the 2.x release."""
    javas = apicurio.find_javas()
    release, java = apicurio.choose(javas)
    if release is not apicurio.RELEASE:
        line = (f"registry: no Java {apicurio.RELEASE.min_java}+ for Apicurio Registry "
                f"{apicurio.RELEASE.version} (found: "
                f"{', '.join(f'{j.path} ({j.major})' for j in javas)}); falling back to "
                f"{release.version} on Java {java.major} ({java.path})")
        log.warning("%s", line)
        emit(line)
    mvn = "" if apicurio.installed(release) else binary("mvn", "Maven (apt-get install maven)")
    server = s.registry
    require_free(server.port, "the schema registry", "KAFKA_INGEST_REGISTRY_PORT")
    require_free(server.management_port, "the schema registry's management interface",
                 "KAFKA_INGEST_REGISTRY_MANAGEMENT_PORT")
    return release, java, mvn


def _begin_registry(s: Settings, pool: ThreadPoolExecutor,
                    emit: Report) -> Future[RegistryLaunch]:
    """(pid, started) of the registry, launching it in ``pool`` unless it runs (the first
    start downloads it: that runs beside Postgres and Airflow, after Kafka's launch, so two
    Maven processes never share the local repository). A registry whose configuration
    changed (its ports) is restarted."""
    server = s.registry
    pid = server.pid()
    if pid is not None and read_or_none(server.props) != apicurio.properties(server):
        log.info("registry: its configuration changed (e.g. its ports); restarting it")
        apicurio.stop(server)
        pid = None
    if pid is not None:
        done: Future[RegistryLaunch] = Future()
        done.set_result((pid, False))
        return done
    release, java, mvn = _registry_preflight(s, emit)
    return pool.submit(
        lambda: (apicurio.launch(server, release, java, apicurio.install(release, mvn)), True))


def _await_registry(s: Settings, launch: Future[RegistryLaunch], since: float) -> str:
    """Wait until the registry answers; one just started (or found running but not yet
    answering: an ``up`` cut short) then gets the global compatibility BACKWARD."""
    server = s.registry
    pid, started = launch.result()
    if started or not server.answers():
        apicurio.await_ready(server, pid)
    level = apicurio.compatibility(server)
    return (f"{_started('registry', server.url, pid, started, since)} "
            f"(apicurio {server.release()}, compatibility {level})")


def _registry_env(s: Settings) -> dict[str, str]:
    """``stack env`` while the registry runs: its URL for the CLI, its Airflow connection
    (``http``, the scheme in ``schema`` as Airflow's HTTP hook reads it, the API's path in
    the extra; see ``kafka_ingest.kafka.registry.registry_settings_from``)."""
    server = s.registry
    if server.pid() is None:
        return {}
    conn = {"conn_type": "http", "host": "127.0.0.1", "port": server.port, "schema": "http",
            "extra": {"path": apicurio.CCOMPAT_PATH}}
    return {"KAFKA_INGEST_SCHEMA_REGISTRY_URL": server.url,
            "AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT": json.dumps(conn)}


# --------------------------------------------------------------------------- postgres


def _pg_bindir() -> Path:
    """The newest Debian PostgreSQL server under /usr/lib/postgresql/<major>/bin."""
    candidates = [
        path.parent
        for path in Path("/usr/lib/postgresql").glob("*/bin/pg_ctl")
        if path.parent.parent.name.isdigit()
    ]
    if not candidates:
        raise StackError(
            "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin: run the "
            "setup step (apt-get install postgresql)"
        )
    return max(candidates, key=lambda path: int(path.parent.name))


def _as_postgres(cmd: list[str]) -> list[str]:
    """Postgres refuses to run as root; as root run its tools as the ``postgres`` user."""
    if os.geteuid() != 0:
        return cmd
    # runuser lives in sbin, which a non-login root shell may not have on PATH.
    runuser = shutil.which("runuser") or shutil.which("runuser", path="/usr/sbin:/sbin")
    if runuser is None:
        raise StackError("runuser not found: install util-linux, or run the stack as non-root")
    return [runuser, "-u", "postgres", "--", *cmd]


def _pg_run(cmd: list[str], what: str, timeout_s: float = 600.0) -> None:
    """Run a Postgres tool (as ``postgres`` when root), bounded: a tool still running after
    ``timeout_s`` is killed with its process group (``runuser`` does not pass a kill on)."""
    with subprocess.Popen(_as_postgres(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, start_new_session=True, env=child_env()) as proc:
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise StackError(f"{what} did not finish within {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        detail = out.strip().replace("\n", " | ")
        raise StackError(f"{what} failed: {detail[-300:]}")


def _chown_postgres(path: Path, *, recursive: bool = False) -> None:
    if os.geteuid() != 0:
        return
    paths = [path, *path.rglob("*")] if recursive else [path]
    for each in paths:
        shutil.chown(each, "postgres", "postgres")


def _check_traversable(s: Settings) -> None:
    """As root, the ``postgres`` user must reach the data dir through every parent."""
    if os.geteuid() != 0:
        return
    for parent in s.pg_dir.parents:
        if parent.is_relative_to(s.state) and parent.exists():
            parent.chmod(parent.stat().st_mode | 0o111)
            continue
        if not parent.stat().st_mode & 0o001:
            raise StackError(
                f"the postgres OS user cannot enter {parent}: run `chmod o+x {parent}` or "
                "set KAFKA_INGEST_STATE_DIR to a directory it can reach"
            )


#: The standby's ``application_name`` (what ``synchronous_standby_names`` names) and its
#: replication slot on the primary.
STANDBY_NAME = "kafka_ingest_standby"
_FAILOVER_TIMEOUT_S = 60.0


def _pg_config(s: Settings, node: PgNode) -> str:
    """Settings for tests: durable (fsync stays on), loopback only, room for workers; a
    standby streams from the primary through its slot (``primary_conninfo`` empty while
    :func:`pause_replication` holds it); a primary with a running standby under
    ``--replica --sync`` acknowledges a commit only once the standby applied it (a standby
    not running makes no commit wait forever: :func:`_ensure_standby` turns it on once the
    standby streams)."""
    other = _other_node(s, node)
    if node.standby:
        conninfo = "" if _paused_marker(node).is_file() else (
            f"host={other.socket_dir} port={other.port} user=postgres "
            f"application_name={STANDBY_NAME}")
        replication = (f"primary_conninfo = '{conninfo}'\n"
                       f"primary_slot_name = '{STANDBY_NAME}'\n")
    elif s.replica == "sync" and other.standby and _postmaster_pid(s, other) is not None:
        replication = (f"synchronous_standby_names = '{STANDBY_NAME}'\n"
                       "synchronous_commit = remote_apply\n")
    else:
        replication = ""
    return (
        "# Written by kafka-ingest stack up on every start; edit stack.py instead.\n"
        "listen_addresses = '127.0.0.1'\n"
        f"port = {node.port}\n"
        f"unix_socket_directories = '{node.socket_dir}'\n"
        "max_connections = 200\n"
        "shared_buffers = 128MB\n"
        "fsync = on\n"
        "password_encryption = 'scram-sha-256'\n"
        "log_min_messages = warning\n"
        "log_line_prefix = '%m [%p] %q%u@%d '\n"
        + replication
        + ("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n"
           "ssl_min_protocol_version = 'TLSv1.2'\n" if s.secure else "")
    )


def _pg_hba(s: Settings) -> str:
    """Trust on the private unix socket, SCRAM on loopback; on the secure stack the
    pipelines' runtime role may connect only over TLS (``hostssl``), never in plain text."""
    secure = (
        f"hostssl all {PG_APP_ROLE} 127.0.0.1/32 scram-sha-256\n"
        f"host    all {PG_APP_ROLE} 127.0.0.1/32 reject\n" if s.secure else "")
    return (
        "# Written by kafka-ingest stack up on every start; edit stack.py instead.\n"
        "local   all         all                 trust\n"
        "local   replication all                 trust\n"
        f"{secure}"
        "host    all         all  127.0.0.1/32   scram-sha-256\n"
        "host    all         all  ::1/128        scram-sha-256\n"
    )


def _configure_postgres(s: Settings, node: PgNode) -> bool:
    """Write the settings, pg_hba.conf and (secure) the server's certificate into the data
    directory; return whether anything changed."""
    wanted = {"kafka_ingest.conf": _pg_config(s, node), "pg_hba.conf": _pg_hba(s)}
    if s.secure:
        files = tls.TlsFiles(s.tls_dir)
        wanted["server.crt"] = files.server_cert.read_text()
        wanted["server.key"] = files.server_key.read_text()
    changed = False
    for name, text in wanted.items():
        path = node.data / name
        if read_or_none(path) == text:
            continue
        path.write_text(text)
        path.chmod(0o600)
        _chown_postgres(path)
        changed = True
    return changed


def _reconfigure(s: Settings, node: PgNode) -> None:
    """Rewrite a running node's settings and reload them if they changed."""
    if _configure_postgres(s, node) and _postmaster_pid(s, node) is not None:
        _pg_run([str(_pg_bindir() / "pg_ctl"), "-D", str(node.data), "reload"],
                "pg_ctl reload")


def _init_postgres(s: Settings, bindir: Path) -> None:
    """initdb once: trust on the private unix socket, SCRAM on 127.0.0.1."""
    if (s.pg_data / "PG_VERSION").is_file():
        return
    s.pg_socket_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    _chown_postgres(s.pg_dir, recursive=True)
    _pg_run(
        [
            str(bindir / "initdb"), "-D", str(s.pg_data), "--username=postgres",
            "--encoding=UTF8", "--no-locale", "--auth-local=trust",
            "--auth-host=scram-sha-256",
        ],
        "initdb",
    )  # fmt: skip
    with (s.pg_data / "postgresql.conf").open("a") as conf:
        conf.write("\ninclude = 'kafka_ingest.conf'\n")


def _primary_marker(s: Settings) -> Path:
    return s.state / "postgres-primary"


def primary_node(s: Settings) -> PgNode:
    """The node that takes writes: the first unless ``stack failover`` moved it."""
    first, second = s.pg_nodes
    return second if read_or_none(_primary_marker(s)) == f"{second.name}\n" else first


def _other_node(s: Settings, node: PgNode) -> PgNode:
    first, second = s.pg_nodes
    return second if node.name == first.name else first


def _paused_marker(node: PgNode) -> Path:
    return node.home / "replication-paused"


def _postmaster_pid(s: Settings, node: PgNode | None = None) -> int | None:
    node = node or primary_node(s)
    return our_pid(node.data / "postmaster.pid", str(node.data))


def _start_postgres(s: Settings, node: PgNode | None = None) -> tuple[int, bool]:
    """Start the node (the primary unless told) unless it runs; pg_ctl -w polls until it
    accepts connections (a standby: until it is consistent)."""
    node = node or primary_node(s)
    pid = _postmaster_pid(s, node)
    if pid is not None:
        _reconfigure(s, node)  # ssl, pg_hba.conf, replication: all take effect on a reload
        return pid, False
    bindir = _pg_bindir()
    require_free(node.port, f"PostgreSQL ({node.name})",
                 "KAFKA_INGEST_PG_PORT" if node.home == s.pg_dir else
                 "KAFKA_INGEST_PG_STANDBY_PORT")
    node.home.mkdir(parents=True, exist_ok=True)
    _check_traversable(s)
    if node.home == s.pg_dir:
        _init_postgres(s, bindir)
    elif not node.exists:
        raise StackError(f"{node.name} has no data directory: `kafka-ingest stack up "
                         "--replica` makes it from the primary")
    node.socket_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    _chown_postgres(node.socket_dir)
    _configure_postgres(s, node)
    node.log.touch()
    _chown_postgres(node.log)
    cmd = [
        str(bindir / "pg_ctl"), "-D", str(node.data), "-l", str(node.log), "-w",
        "-t", str(_PG_TIMEOUT_S), "start",
    ]  # fmt: skip
    done = subprocess.run(
        _as_postgres(cmd), capture_output=True, text=True, check=False, start_new_session=True,
        env=child_env(),
    )
    if done.returncode != 0:
        raise StackError(f"PostgreSQL ({node.name}) did not start: {tail(node.log, 3)}")
    pid = _postmaster_pid(s, node)
    if pid is None:
        raise StackError(f"PostgreSQL started but left no postmaster.pid in {node.data}")
    return pid, True


def _admin(node: PgNode, dbname: str = "postgres") -> Any:
    """A superuser connection over the node's private unix socket (autocommit)."""
    import psycopg

    return psycopg.connect(autocommit=True, **own_libpq(
        host=str(node.socket_dir), port=node.port, user="postgres", dbname=dbname,
        connect_timeout=10))


def _bootstrap_postgres(s: Settings) -> None:
    """Create the role and both databases if missing (cheap, so done on every ``up``)."""
    from psycopg import sql

    with _admin(primary_node(s)) as conn:
        role = conn.execute("SELECT rolcreatedb FROM pg_roles WHERE rolname = %s", (PG_ROLE,))
        found_role = role.fetchone()
        if found_role is None:
            # CREATEDB: the test fixtures make a fresh database per test as this role.
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN CREATEDB PASSWORD {}").format(
                    sql.Identifier(PG_ROLE), sql.Literal(PG_PASSWORD)
                )
            )
        elif not found_role[0]:
            conn.execute(sql.SQL("ALTER ROLE {} CREATEDB").format(sql.Identifier(PG_ROLE)))
        # DROP DATABASE ... WITH (FORCE) of a per-test database must also end the autovacuum
        # worker that a fresh, just-filled database attracts; without this it fails with
        # "must be a member of the role whose process is being terminated".
        conn.execute(sql.SQL("GRANT pg_signal_backend TO {}").format(sql.Identifier(PG_ROLE)))
        if s.secure:
            _ensure_app_role(conn, tls.credentials(tls.TlsFiles(s.tls_dir))["pg_app_password"])
        for database in (PG_DATABASE, AIRFLOW_DATABASE):
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
            if found.fetchone() is None:
                conn.execute(
                    sql.SQL("CREATE DATABASE {} OWNER {}").format(
                        sql.Identifier(database), sql.Identifier(PG_ROLE)
                    )
                )


def _ensure_app_role(conn: Any, password: str) -> None:
    """The pipelines' runtime role: it logs in (over TLS only, see pg_hba.conf) and gets
    only the DML its tables need, granted by ``kafka-ingest migrate`` under ``stack env
    --secure`` (which names it in ``KAFKA_INGEST_PG_GRANT_TO``)."""
    from psycopg import sql

    exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (PG_APP_ROLE,))
    verb = "ALTER" if exists.fetchone() else "CREATE"
    conn.execute(sql.SQL(verb + " ROLE {} LOGIN NOCREATEDB NOCREATEROLE PASSWORD {}").format(
        sql.Identifier(PG_APP_ROLE), sql.Literal(password)))


def _stop_postgres(s: Settings, node: PgNode | None = None, *, mode: str = "fast") -> str:
    node = node or primary_node(s)
    pid = _postmaster_pid(s, node)
    if pid is None:
        return f"{node.name}: not running"
    cmd = [str(_pg_bindir() / "pg_ctl"), "-D", str(node.data), "-m", mode, "-w", "stop"]
    subprocess.run(_as_postgres(cmd), capture_output=True, check=False, env=child_env())
    terminate(pid, _PG_TIMEOUT_S)  # a no-op when pg_ctl already stopped it
    return f"{node.name}: stopped (pid {pid})"


# --------------------------------------------------------------------------- standby


def _replication(primary: PgNode) -> tuple[str, int] | None:
    """(state, bytes the standby has yet to apply) as the primary sees its standby."""
    with _admin(primary) as conn:
        row = conn.execute(
            "SELECT state, pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)::bigint"
            " FROM pg_stat_replication WHERE application_name = %s", (STANDBY_NAME,)
        ).fetchone()
    return None if row is None else (str(row[0]), int(row[1] or 0))


def _await_streaming(s: Settings, primary: PgNode, timeout_s: float = _FAILOVER_TIMEOUT_S,
                     ) -> None:
    """Until the standby streams from ``primary`` and has applied all the WAL the primary
    had written when the wait began (asked of the standby: the primary hears of the
    standby's apply position only now and then)."""
    standby = _other_node(s, primary)
    with _admin(primary) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    target = row[0] if row else None
    deadline = time.monotonic() + timeout_s
    while True:
        seen = _replication(primary)
        if seen is not None and seen[0] == "streaming" and _applied(standby, target):
            return
        if time.monotonic() > deadline:
            raise StackError(f"{standby.name} is not streaming from {primary.name} after "
                             f"{timeout_s:.0f} s (seen: {seen}): {tail(standby.log, 3)}")
        time.sleep(_POLL_S)


def _applied(standby: PgNode, target: str | None) -> bool:
    """The standby has replayed WAL up to ``target`` (False while it answers nothing)."""
    try:
        with _admin(standby) as conn:
            row = conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn",
                               (target,)).fetchone()
    except Exception:  # starting up: not yet
        return False
    return bool(row and row[0])  # NULL: nothing replayed yet


def _make_standby(s: Settings, primary: PgNode, standby: PgNode) -> None:
    """A fresh standby of ``primary`` in ``standby``'s place: ``pg_basebackup`` (WAL
    streamed, a fast checkpoint) into an emptied data directory, through a replication
    slot made for it (dropped first if an earlier standby left one)."""
    if _postmaster_pid(s, standby) is not None:
        raise StackError(f"{standby.name} runs: stop it before it is made again")
    with _admin(primary) as conn:
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                     " WHERE slot_name = %s", (STANDBY_NAME,))
    shutil.rmtree(standby.data, ignore_errors=True)
    _paused_marker(standby).unlink(missing_ok=True)
    standby.home.mkdir(parents=True, exist_ok=True)
    _chown_postgres(standby.home)
    _pg_run([str(_pg_bindir() / "pg_basebackup"), "-D", str(standby.data),
             "-h", str(primary.socket_dir), "-p", str(primary.port), "-U", "postgres",
             "-X", "stream", "-c", "fast", "-C", "-S", STANDBY_NAME, "--no-password"],
            f"pg_basebackup of {primary.name} into {standby.name}")
    signal_file = standby.data / "standby.signal"
    signal_file.touch()
    _chown_postgres(signal_file)
    for leftover in ("postmaster.opts", "postmaster.pid"):
        (standby.data / leftover).unlink(missing_ok=True)


def _ensure_standby(s: Settings, emit: Report) -> None:
    """``--replica``: the standby made (once) and running, streaming from the primary;
    under ``--sync`` the primary then waits for it on every commit."""
    primary = primary_node(s)
    standby = _other_node(s, primary)
    since = time.monotonic()
    made = not standby.exists or not standby.standby
    if made:
        _make_standby(s, primary, standby)
    pid, started = _start_postgres(s, standby)
    if _paused_marker(standby).is_file():
        emit(f"{standby.name}: running (pid {pid}), replication paused "
             f"({_paused_marker(standby)}): pause_replication(False) resumes it")
        return
    _await_streaming(s, primary)
    _reconfigure(s, primary)  # --sync: synchronous_standby_names, once the standby streams
    what = "made from the primary and started" if made else "started" if started else "running"
    emit(f"{standby.name}: {what} on 127.0.0.1:{standby.port} (pid {pid}), {s.replica} "
         f"replication from {primary.name}, streaming, in {time.monotonic() - since:.1f} s")


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
    with _locked(s):
        if s.replica is None:
            raise StackError("the stack has no standby: run `kafka-ingest stack up --replica`")
        old = primary_node(s)
        new = _other_node(s, old)
        old_pid, new_pid = _postmaster_pid(s, old), _postmaster_pid(s, new)
        if old_pid is None or new_pid is None or not new.standby:
            raise StackError(f"failover needs {old.name} running as the primary and "
                             f"{new.name} as its standby: run `kafka-ingest stack up`")
        behind = _wal_behind(old, new)
        _kill_postmaster(old_pid)
        # From here the old primary never comes back as one: a failover cut short (a
        # time-out, a crash) leaves the marker on the node being promoted, and the next
        # `stack up` finishes the promotion.
        _primary_marker(s).write_text(f"{new.name}\n")
        _repoint_fault_proxy(s)
        since = time.monotonic()
        _promote(s, new)
        promote_s = time.monotonic() - since
        rebuild_s = None
        if rebuild:
            since = time.monotonic()
            try:
                _make_standby(s, new, old)
                _start_postgres(s, old)
                _await_streaming(s, new)
                _reconfigure(s, new)
            except Exception as exc:
                raise StackError(f"{new.name} was promoted (the primary, on 127.0.0.1:"
                                 f"{new.port}); making {old.name} its standby failed: "
                                 f"{exc}") from exc
            rebuild_s = time.monotonic() - since
        done = Failover(old.name, old_pid, new.name, new.port, behind, promote_s, rebuild_s)
    emit(done.line())
    return done


def _promote(s: Settings, node: PgNode) -> None:
    _pg_run([str(_pg_bindir() / "pg_ctl"), "-D", str(node.data), "-w", "-t",
             str(int(_FAILOVER_TIMEOUT_S)), "promote"], f"pg_ctl promote ({node.name})",
            timeout_s=_FAILOVER_TIMEOUT_S + 30)
    _reconfigure(s, node)  # no primary_conninfo; no synchronous standby until rebuilt


def _repoint_fault_proxy(s: Settings) -> None:
    """``--faults``: Postgres' proxy in front of the (new) primary."""
    if s.faults and s.toxiproxy.pid() is not None:
        with contextlib.suppress(Exception):  # the proxy is a test aid, not the failover
            fault_proxy.Toxiproxy(s.toxiproxy.url).populate(_toxiproxy_proxies(s))


def _wal_behind(primary: PgNode, standby: PgNode) -> int | None:
    """Bytes of WAL the primary wrote that the standby has not applied (None: one of them
    does not answer)."""
    try:
        with _admin(primary) as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        with _admin(standby) as conn:
            behind = conn.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn,"
                                  " pg_last_wal_replay_lsn())::bigint",
                                  (row[0] if row else None,)).fetchone()
    except Exception:  # a primary not answering still fails over
        return None
    return None if behind is None or behind[0] is None else max(0, int(behind[0]))


def _kill_postmaster(pid: int) -> None:
    """SIGKILL a postmaster and wait until its backends noticed and exited too (they
    hold its shared memory: the data directory is not free before)."""
    import psutil

    children: list[psutil.Process] = []
    with contextlib.suppress(psutil.Error):
        children = psutil.Process(pid).children(recursive=True)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if not wait_gone(pid, _PG_TIMEOUT_S):
        raise StackError(f"the postmaster (pid {pid}) survived SIGKILL")
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.wait(_PG_TIMEOUT_S)


def pause_replication(paused: bool = True) -> None:
    """Cut the standby off from the primary (its WAL receiver stops; the primary goes on
    committing: under ``--sync`` its commits wait) or, with ``paused`` False, let it
    stream again and catch up. The failover tests use it to make an asynchronous
    standby miss transactions the primary acknowledged."""
    s = settings()
    with _locked(s):
        primary = primary_node(s)
        standby = _other_node(s, primary)
        if s.replica is None or _postmaster_pid(s, standby) is None:
            raise StackError("no standby runs: run `kafka-ingest stack up --replica`")
        marker = _paused_marker(standby)
        if paused:
            marker.write_text("replication paused by pause_replication()\n")
        else:
            marker.unlink(missing_ok=True)
        _reconfigure(s, standby)
        if not paused:
            _await_streaming(s, primary)
            return
        deadline = time.monotonic() + _FAILOVER_TIMEOUT_S
        while _replication(primary) is not None:
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
    with _locked(s):
        first, second = s.pg_nodes
        if primary_node(s) != first:
            raise StackError(f"{second.name} is the primary: run `kafka-ingest stack "
                             "failover` to move it back first")
        s.replica_marker.unlink(missing_ok=True)
        _reconfigure(s, first)  # no synchronous standby to wait for from here on
        emit(_stop_postgres(s, second))
        shutil.rmtree(second.home, ignore_errors=True)
        if _postmaster_pid(s, first) is not None:
            with _admin(first) as conn:
                conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM"
                             " pg_replication_slots WHERE slot_name = %s", (STANDBY_NAME,))
        emit(f"{second.name}: removed; the stack has no standby")


def _pg_dsn(s: Settings, database: str) -> str:
    return (f"postgresql://{PG_ROLE}:{PG_PASSWORD}@127.0.0.1:{primary_node(s).port}/"
            f"{database}")


def _connect(dsn: str) -> Any:
    """A short health probe's connection to ``dsn``, whatever PG* variables are set here."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    return psycopg.connect(**own_libpq(**conninfo_to_dict(dsn), connect_timeout=3))


def _pg_answers(s: Settings) -> bool:
    import psycopg

    try:
        _connect(_pg_dsn(s, PG_DATABASE)).close()
    except psycopg.Error:
        return False
    return True


def _postgres_status(s: Settings) -> list[PartStatus]:
    primary = primary_node(s)
    pid = _postmaster_pid(s, primary)
    healthy = pid is not None and _pg_answers(s)
    detail = "" if healthy or pid is None else "process alive, not answering"
    if s.replica is None:
        return [PartStatus("postgres", f"127.0.0.1:{primary.port}", healthy, pid, detail)]
    standby = _other_node(s, primary)
    spid = _postmaster_pid(s, standby)
    seen = None
    if healthy:
        with contextlib.suppress(Exception):
            seen = _replication(primary)
    streaming = spid is not None and seen is not None and seen[0] == "streaming"
    return [
        PartStatus(primary.name, f"127.0.0.1:{primary.port}", healthy, pid,
                   f"primary{', ' + detail if detail else ''}"),
        PartStatus(standby.name, f"127.0.0.1:{standby.port}", streaming, spid,
                   f"{s.replica} standby, " + ("not running" if spid is None else
                                               "not streaming" if seen is None else
                                               f"{seen[0]}, {seen[1]} bytes behind")),
    ]


# --------------------------------------------------------------------------- airflow


def _airflow_version() -> str | None:
    """The installed Airflow, read from package metadata (the core never imports it)."""
    for dist in ("apache-airflow-core", "apache-airflow"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(dist)
    return None


def _airflow_secrets(s: Settings) -> dict[str, str]:
    """JWT secret and Fernet key, generated once: every Airflow process must share them."""
    path = s.state / "airflow-secrets.json"
    if not path.is_file():
        s.state.mkdir(parents=True, exist_ok=True)
        fresh = {
            "jwt_secret": secrets.token_urlsafe(32),
            "fernet_key": base64.urlsafe_b64encode(os.urandom(32)).decode(),
        }
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(fresh, indent=2) + "\n")
        tmp.chmod(0o600)
        # link() fails if another process won the race; then its secrets are the ones.
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
        tmp.unlink()
    stored: dict[str, str] = json.loads(path.read_text())
    return stored


def _migrate_marker(s: Settings) -> Path:
    return s.airflow_home / ".db-migrated"


def _airflow_db_current(s: Settings, version: str) -> bool:
    """Migrated by this Airflow version, and the database still has its schema."""
    marker = _migrate_marker(s)
    if not marker.is_file() or marker.read_text().strip() != version:
        return False
    import psycopg

    try:
        with _connect(_pg_dsn(s, AIRFLOW_DATABASE)) as conn:
            row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    except psycopg.Error:
        return False
    return row is not None


def _ensure_airflow_db(s: Settings) -> str:
    version = _airflow_version()
    if version is None:
        return "airflow-db: skipped (apache-airflow is not installed)"
    if _airflow_db_current(s, version):
        return f"airflow-db: up to date (airflow {version})"
    s.airflow_home.mkdir(parents=True, exist_ok=True)
    logfile = s.airflow_home / "db-migrate.log"
    started = time.monotonic()
    with logfile.open("ab") as out:
        done = subprocess.run(
            [sys.executable, "-m", "airflow", "db", "migrate"],
            env=child_env(env()), stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT, timeout=_MIGRATE_TIMEOUT_S, check=False,
        )  # fmt: skip
    if done.returncode != 0:
        raise StackError(f"airflow db migrate failed: {tail(logfile, 3)}")
    _migrate_marker(s).write_text(f"{version}\n")
    took = time.monotonic() - started
    return f"airflow-db: migrated (airflow {version}) in {took:.1f} s"


def _airflow_status(s: Settings) -> PartStatus:
    version = _airflow_version()
    address = f"127.0.0.1:{primary_node(s).port}/{AIRFLOW_DATABASE}"
    if version is None:
        return PartStatus("airflow-db", address, False, detail="apache-airflow not installed")
    if not _pg_answers(s):  # no database to ask: down, not "not migrated"
        return PartStatus("airflow-db", address, False, detail="Postgres is down")
    current = _airflow_db_current(s, version)
    detail = f"airflow {version}" if current else "not migrated (run stack up)"
    return PartStatus("airflow-db", address, current, detail=detail)


# --------------------------------------------------------------------------- public API


def _kafka_client_config(s: Settings, *, secure: bool, faults: bool = False) -> dict[str, Any]:
    """The librdkafka settings a client of this stack needs (``faults``: through the
    proxies; every node's address, so a cluster is reached with any node down)."""
    if faults:
        return {"bootstrap.servers": s.proxied_bootstrap, "socket.timeout.ms": 10000}
    if not secure:
        return {"bootstrap.servers": s.bootstrap_servers, "socket.timeout.ms": 10000}
    files = tls.TlsFiles(s.tls_dir)
    creds = tls.credentials(files)
    return {
        "bootstrap.servers": s.secure_bootstrap,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": creds["kafka_user"],
        "sasl.password": creds["kafka_password"],
        "ssl.ca.location": str(files.ca_cert),
        "socket.timeout.ms": 10000,
    }


def _pg_params(s: Settings, *, secure: bool, owner: bool = False,
               faults: bool = False, replica: bool = False) -> dict[str, Any]:
    """libpq parameters: the owner role in plain text, or (secure) TLS verified against the
    stack's CA, as the runtime role unless ``owner``; ``faults``: through the proxy;
    ``replica``: both nodes, the one that takes writes chosen at each connect (libpq's
    multi-host string with ``target_session_attrs=read-write``); else the primary."""
    params: dict[str, Any] = {"host": "127.0.0.1", "port": primary_node(s).port,
                              "dbname": PG_DATABASE, "user": PG_ROLE, "password": PG_PASSWORD}
    if faults:
        params["port"] = s.pg_proxy_port
    if replica:
        params.update(host=",".join("127.0.0.1" for _ in s.pg_nodes),
                      port=",".join(str(node.port) for node in s.pg_nodes),
                      target_session_attrs="read-write")
    if secure:
        files = tls.TlsFiles(s.tls_dir)
        if not owner:
            params.update(user=PG_APP_ROLE,
                          password=tls.credentials(files)["pg_app_password"])
        params.update(sslmode="verify-full", sslrootcert=str(files.ca_cert))
    return params


def _airflow_db_url(s: Settings, *, replica: bool) -> str:
    """Airflow's metadata database (SQLAlchemy, psycopg2): the primary, or (``replica``)
    both nodes, psycopg2 passing them to libpq as one multi-host string."""
    base = f"postgresql+psycopg2://{PG_ROLE}:{PG_PASSWORD}@"
    if not replica:
        return f"{base}127.0.0.1:{primary_node(s).port}/{AIRFLOW_DATABASE}"
    hosts = "&".join(f"host=127.0.0.1:{node.port}" for node in s.pg_nodes)
    return f"{base}/{AIRFLOW_DATABASE}?{hosts}&target_session_attrs=read-write"


def _with_tools(s: Settings) -> str:
    """PATH with Kafka's tools (and this interpreter's scripts: kafka-ingest, airflow) first."""
    first = [str(s.bin_dir), str(Path(sys.executable).parent)]
    rest = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p not in first]
    return os.pathsep.join(first + rest)


def env(*, secure: bool = False, faults: bool = False, replica: bool = False,
        ) -> dict[str, str]:
    """The environment that points clients, tests and Airflow at the local stack; with
    ``secure``, at its SASL_SSL listener and at Postgres over verified TLS as the runtime
    role (``KAFKA_INGEST_PG_ADMIN_DSN``: the schema owner, for migrations, and
    ``KAFKA_INGEST_PG_GRANT_TO``: the runtime role, so a plain ``kafka-ingest migrate``
    grants it what it needs; empty on the other stacks, whose pipelines run as the owner,
    so a shell that had the secure environment stops granting); with ``faults``, at Kafka
    and Postgres through Toxiproxy, plus ``TOXIPROXY_URL`` (Airflow's metadata database
    stays direct); with ``replica``, at both Postgres nodes through multi-host connection
    strings that follow a failover (``target_session_attrs=read-write``), Airflow's
    metadata database included (with ``faults`` too, Kafka goes through the proxies and
    Postgres straight to both nodes: the proxy fronts one)."""
    from psycopg.conninfo import make_conninfo

    s = settings()
    if secure and not s.secure:
        raise StackError("the stack is not secure: run `kafka-ingest stack up --secure` first")
    if faults and not s.faults:
        raise StackError("the stack has no fault proxies: run `kafka-ingest stack up --faults` "
                         "first")
    if faults and secure:
        raise StackError("the fault proxies front the plaintext listeners: --faults and "
                         "--secure do not go together")
    if replica and s.replica is None:
        raise StackError("the stack has no standby: run `kafka-ingest stack up --replica` "
                         "first")
    airflow_secrets = _airflow_secrets(s)
    project = s.repo or Path.cwd()
    kafka = _kafka_client_config(s, secure=secure, faults=faults)
    pg = _pg_params(s, secure=secure, faults=faults, replica=replica)
    airflow_db = _airflow_db_url(s, replica=replica)
    return {
        "KAFKA_INGEST_STATE_DIR": str(s.state),
        "PATH": _with_tools(s),
        "KAFKA_BOOTSTRAP_SERVERS": kafka["bootstrap.servers"],
        "KAFKA_INGEST_KAFKA_CONFIG": json.dumps(kafka),
        "KAFKA_INGEST_PG_DSN": make_conninfo(**pg),
        "KAFKA_INGEST_PG_ADMIN_DSN": make_conninfo(**_pg_params(
            s, secure=secure, owner=True, faults=faults, replica=replica)),
        "KAFKA_INGEST_PG_GRANT_TO": PG_APP_ROLE if secure else "",
        "PGHOST": pg["host"],
        "PGPORT": str(pg["port"]),
        "PGUSER": pg["user"],
        "PGPASSWORD": pg["password"],
        "PGDATABASE": pg["dbname"],
        "PGSSLMODE": pg.get("sslmode", "prefer"),
        **({"PGTARGETSESSIONATTRS": "read-write"} if replica else {}),
        **({"PGSSLROOTCERT": pg["sslrootcert"]} if secure else {}),
        "AIRFLOW_HOME": str(s.airflow_home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(project / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(project / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__FERNET_KEY": airflow_secrets["fernet_key"],
        "AIRFLOW__API_AUTH__JWT_SECRET": airflow_secrets["jwt_secret"],
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": airflow_db,
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps(
            {"conn_type": "kafka", "extra": {**kafka, "group.id": KAFKA_GROUP_ID}}),
        "AIRFLOW_CONN_POSTGRES_DEFAULT": airflow_postgres_conn(make_conninfo(**pg)),
        **({"TOXIPROXY_URL": s.toxiproxy.url} if faults else {}),
        **(s.airflow.client_env() if s.airflow.running() else {}),
        **_registry_env(s),
    }


def _started(name: str, address: str, pid: int, started: bool, since: float) -> str:
    if not started:
        return f"{name}: already running on {address} (pid {pid})"
    return f"{name}: started on {address} (pid {pid}) in {time.monotonic() - since:.1f} s"


Launched = list[tuple[KafkaNode, int, bool]]


def _begin_kafka(s: Settings, pool: ThreadPoolExecutor) -> Future[Launched]:
    """(node, pid, started) of each Kafka node, launching in ``pool`` those not running.

    The first start downloads the jars: that runs beside Postgres and Airflow. The
    preflight (java, mvn, ports) stays in the caller so its errors come at once. A node
    whose configuration changed (``--secure``, ``--faults``) makes every node restart.
    """
    nodes = s.nodes
    running = {n.node_id: _kafka_pid(s, n) for n in nodes}
    if any(pid is not None and read_or_none(n.props) != _kafka_properties(s, n)
           for n, pid in zip(nodes, running.values(), strict=True)):
        log.info("kafka: its configuration changed (e.g. --secure, --faults); restarting it")
        _stop_kafka(s)
        running = dict.fromkeys(running)
    missing = [n for n in nodes if running[n.node_id] is None]
    java = _kafka_preflight(s, missing) if missing else ""

    def launch() -> Launched:
        started = {n.node_id: _launch_kafka(s, java, n) for n in missing}
        return [(n, started.get(n.node_id) or running[n.node_id] or 0, n.node_id in started)
                for n in nodes]

    if missing:
        return pool.submit(launch)
    done: Future[Launched] = Future()
    done.set_result(launch())
    return done


def _set_brokers(s: Settings, brokers: int) -> None:
    """Record the cluster's size; a formatted cluster cannot change it (its quorum was
    written into the nodes' storage when they were formatted)."""
    if not 1 <= brokers <= 9:
        raise StackError(f"--brokers {brokers}: choose 1 to 9 Kafka nodes")
    if brokers == s.brokers:
        return
    if brokers > 1 and s.secure:
        raise StackError("--brokers with --secure is not supported: the SASL_SSL listener is "
                         "node 1's; use another KAFKA_INGEST_STATE_DIR for the cluster")
    formatted = [n for n in s.nodes if (n.home / "data" / "meta.properties").is_file()]
    if formatted:
        raise StackError(
            f"this state dir holds a {s.brokers}-node Kafka cluster ({formatted[0].home}); "
            f"a {brokers}-node one needs its own: set KAFKA_INGEST_STATE_DIR to a fresh "
            "directory (and free ports), or remove the kafka* directories of this one")
    s.brokers_file.write_text(f"{brokers}\n")


def _start_pg_nodes(s: Settings, emit: Report) -> None:
    """The primary, then (``--replica``) its standby: before any commit, since under
    ``--sync`` a commit waits for the standby."""
    since = time.monotonic()
    primary = primary_node(s)
    pid, started = _start_postgres(s, primary)
    if primary.standby:  # a failover cut short between its kill and the end of its promote
        _promote(s, primary)
    emit(_started(primary.name, f"127.0.0.1:{primary.port}", pid, started, since))
    if s.replica is None:  # a standby removed while the primary was down left its slot
        with _admin(primary) as conn:
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                         " WHERE slot_name = %s AND NOT active", (STANDBY_NAME,))
    else:
        _ensure_standby(s, emit)


def _set_replica(s: Settings, replica: str | None) -> None:
    if replica is None:
        return
    if replica not in ("async", "sync"):
        raise StackError(f"replica={replica!r}: choose async or sync")
    s.replica_marker.write_text(f"{replica}\n")


def up(*, report: Report | None = None, secure: bool = False, airflow: bool = False,
       airflow_env: dict[str, str] | None = None, executor: str | None = None,
       workers: int | None = None,
       faults: bool = False, brokers: int | None = None,
       registry: bool = False, replica: str | None = None) -> dict[str, str]:
    """Start whatever is not running, wait until each part answers, return ``env()``.

    Idempotent: when everything runs it only checks health (well under a second). The
    jar download and the broker's boot run while Postgres starts and Airflow migrates, so
    a cold start costs the slower of the two rather than their sum. ``report`` receives
    one line per part.

    ``secure`` (sticky: later ``up`` calls keep it) adds a SASL_SSL listener to Kafka and
    TLS to Postgres, with a CA, a server certificate and SCRAM users made in the state
    directory; a running broker is restarted to take the listener.

    ``faults`` (sticky too) adds Toxiproxy in front of each Kafka node and of Postgres,
    and a listener behind it to each broker (restarted to take it); the returned
    environment then points through the proxies. ``brokers`` (sticky: the size of the
    cluster in this state dir, 1 unless said) runs that many KRaft nodes.

    ``airflow`` also starts Airflow's api-server, scheduler, dag-processor and triggerer
    (:mod:`kafka_ingest_dev.airflow_services`), with this process's environment less
    the user's libpq variables (every process the stack starts gets that:
    :func:`~kafka_ingest_dev.procs.child_env`), the stack's, and ``airflow_env`` (e.g.
    another pipelines file or connection) on top;
    ``executor`` ``"local"`` or ``"celery"`` (with ``workers`` Celery workers and Redis),
    None keeping the running one. Another executor than the running one restarts them.

    ``replica`` (``"async"`` or ``"sync"``; sticky) adds a streaming standby of Postgres
    (``pg_basebackup`` through a replication slot, on ``127.0.0.1:15434``): ``"sync"``
    makes the primary acknowledge a commit only once the standby applied it
    (``synchronous_standby_names``, ``synchronous_commit = remote_apply``). The returned
    environment then names both nodes (``env(replica=True)``), and so does Airflow's, so
    :func:`failover` moves every client to the new primary.

    ``registry`` also starts the schema registry (:mod:`kafka_ingest_dev.apicurio`: empty,
    compatibility BACKWARD) unless it runs; not sticky: a later ``up`` leaves it as it is,
    running or not. It boots beside Postgres, and is up before Airflow's services start,
    so they get its connection.
    """
    emit = report or log.info
    s = settings()
    with _locked(s), ThreadPoolExecutor(max_workers=1) as pool:
        if secure and not s.secure:
            tls.ensure(s.tls_dir)
            s.secure_marker.write_text("SASL_SSL listener and Postgres TLS on\n")
        elif s.secure:
            tls.ensure(s.tls_dir)
        if brokers is not None:
            _set_brokers(s, brokers)
        if faults and not s.faults:
            s.faults_marker.write_text("Toxiproxy in front of Kafka and Postgres\n")
        _set_replica(s, replica)
        kafka_since = time.monotonic()
        launch = _begin_kafka(s, pool)
        registry_since = time.monotonic()
        registry_launch = _begin_registry(s, pool, emit) if registry else None
        _start_pg_nodes(s, emit)
        _bootstrap_postgres(s)
        emit(_ensure_airflow_db(s))
        for node, kafka_pid, kafka_started in launch.result():
            _await_kafka(s, kafka_pid, node)
            emit(_started(_node_name(s, node), node.bootstrap, kafka_pid, kafka_started,
                          kafka_since))
        _await_cluster(s, fresh=any(started for _, _, started in launch.result()))
        if s.faults:
            emit(_ensure_toxiproxy(s))
        _install_kafka_tools(s, binary("java", "a Java 17+ runtime"), _fetch_kafka_jars(s))
        if s.secure:
            _create_scram_user(s)
            emit(f"secure: Kafka SASL_SSL (SCRAM-SHA-512) on {s.secure_bootstrap}, Postgres "
                 f"TLS for {PG_APP_ROLE}; `kafka-ingest stack env --secure` points at them")
        if registry_launch is not None:
            emit(_await_registry(s, registry_launch, registry_since))
        if airflow:
            s.airflow.start(child_env(env(replica=s.replica is not None), airflow_env),
                            emit, executor=executor, workers=workers)
    return env(secure=s.secure and secure, faults=faults, replica=s.replica is not None)


def down(*, report: Report | None = None) -> None:
    """Stop the broker and Postgres this stack started (by pid file); keep their data."""
    emit = report or log.info
    s = settings()
    with _locked(s):
        for line in s.airflow.stop():
            emit(line)
        if s.faults or s.toxiproxy.pid() is not None:
            emit(fault_proxy.stop_server(s.toxiproxy))
        if s.registry.pidfile.is_file():
            emit(apicurio.stop(s.registry))
        emit(_stop_kafka(s))
        primary = primary_node(s)
        emit(_stop_postgres(s, primary))
        standby = _other_node(s, primary)
        if _postmaster_pid(s, standby) is not None:
            emit(_stop_postgres(s, standby))


def start_registry(*, report: Report | None = None) -> str:
    """Start only the schema registry, unless it runs, and wait until it answers; return
    its URL. What ``up(registry=True)`` does for it, without Kafka or Postgres: the
    registry's own tests run it on a state dir (and ports) of their own this way."""
    emit = report or log.info
    s = settings()
    with _locked(s), ThreadPoolExecutor(max_workers=1) as pool:
        since = time.monotonic()
        emit(_await_registry(s, _begin_registry(s, pool, emit), since))
    return s.registry.url


def stop_registry(*, report: Report | None = None) -> None:
    """Stop only the schema registry (its schemas go with it: they live in its memory)."""
    emit = report or log.info
    s = settings()
    with _locked(s):
        emit(apicurio.stop(s.registry))


def stop_airflow(*, report: Report | None = None) -> None:
    """Stop only Airflow's services (``stack up --airflow`` starts them again)."""
    emit = report or log.info
    s = settings()
    with _locked(s):
        for line in s.airflow.stop():
            emit(line)


def restart_kafka() -> None:
    """Stop the broker(s) cleanly and start them again on the same data (durability tests)."""
    s = settings()
    with _locked(s):
        _stop_kafka(s)
        java = _kafka_preflight(s)
        for node, pid in [(n, _launch_kafka(s, java, n)) for n in s.nodes]:
            _await_kafka(s, pid, node)


def _cluster_node(s: Settings, node_id: int) -> KafkaNode:
    if not 1 <= node_id <= s.brokers:
        raise StackError(f"no Kafka node {node_id}: this stack has {s.brokers}")
    return s.node(node_id)


def broker_pid(node_id: int) -> int | None:
    """The pid of Kafka node ``node_id`` (its ``node.id``), if it runs."""
    s = settings()
    return _kafka_pid(s, _cluster_node(s, node_id))


def postmaster_pid() -> int | None:
    """The pid of this stack's Postgres server, if it runs."""
    return _postmaster_pid(settings())


def stop_broker(node_id: int) -> None:
    """Stop Kafka node ``node_id`` cleanly (SIGTERM: a controlled shutdown that hands its
    partitions' leadership over first); the other nodes keep running."""
    s = settings()
    with _locked(s):
        _stop_node(s, _cluster_node(s, node_id))


def kill_broker(node_id: int) -> int | None:
    """SIGKILL Kafka node ``node_id``, like a machine lost: no controlled shutdown, the
    controller notices when its heartbeats stop. Returns the pid killed (None: not
    running). Not under the stack's lock, so it lands exactly when called."""
    s = settings()
    node = _cluster_node(s, node_id)
    pid = _kafka_pid(s, node)
    if pid is None:
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if not wait_gone(pid, _KAFKA_STOP_TIMEOUT_S):
        raise StackError(f"Kafka node {node_id} (pid {pid}) survived SIGKILL")
    node.pidfile.unlink(missing_ok=True)
    return pid


def start_broker(node_id: int) -> int:
    """Start Kafka node ``node_id`` again on its data (a no-op if it runs) and wait until
    it answers and the cluster lists it as a live broker; return its pid."""
    s = settings()
    with _locked(s):
        node = _cluster_node(s, node_id)
        pid = _kafka_pid(s, node)
        if pid is None:
            pid = _launch_kafka(s, _kafka_preflight(s, [node]), node)
        _await_kafka(s, pid, node)
        if s.brokers > 1:
            _await_brokers(s, [node_id])
        return pid


def restart_postgres(*, immediate: bool = False, down_s: float = 0.0) -> None:
    """Stop the primary (fast mode: connections are cut; ``immediate``: no shutdown
    checkpoint, crash recovery at the start, as after a power loss), wait ``down_s``, and
    start it on the same data (a standby reconnects by itself)."""
    s = settings()
    with _locked(s):
        _stop_postgres(s, mode="immediate" if immediate else "fast")
        time.sleep(down_s)
        _start_postgres(s)
        _bootstrap_postgres(s)


def status() -> list[PartStatus]:
    """Each part with its address and whether it answers right now."""
    s = settings()
    registry = apicurio.status(s.registry)
    return [*_kafka_status(s), *_postgres_status(s), _airflow_status(s), *s.airflow.status(),
            *([_toxiproxy_status(s)] if s.faults else []),
            *([registry] if registry is not None else [])]


def _print_env(*, secure: bool = False, faults: bool = False, replica: bool = False) -> None:
    for name, value in env(secure=secure, faults=faults, replica=replica).items():
        print(f"export {name}={shlex.quote(value)}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kafka-ingest stack",
        description="Run the real local stack: Kafka (KRaft), PostgreSQL, Airflow metadata.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up_cmd = commands.add_parser("up", help="start what is not running and wait until it answers")
    up_cmd.add_argument("--secure", action="store_true",
                        help="also a Kafka SASL_SSL listener and Postgres TLS (kept from then on)")
    up_cmd.add_argument("--airflow", action="store_true",
                        help="also Airflow's api-server (UI, REST API), scheduler, dag-processor "
                             "and triggerer on 127.0.0.1:18080")
    up_cmd.add_argument("--executor", choices=("local", "celery"),
                        help="Airflow's executor (implies --airflow): local (the default), or "
                             "celery with Redis on 127.0.0.1:16379 and --workers workers; "
                             "kept while the services run, another one restarts them")
    up_cmd.add_argument("--workers", type=int, metavar="N",
                        help="Celery workers (default 2), named worker-<i>@<host>")
    up_cmd.add_argument("--faults", action="store_true",
                        help="also Toxiproxy (API 127.0.0.1:18474) in front of Kafka and "
                             "Postgres, for fault tests (kept from then on)")
    up_cmd.add_argument("--brokers", type=int, metavar="N",
                        help="Kafka nodes (KRaft broker+controller each; 3: a 3-voter quorum); "
                             "only on a state dir whose Kafka holds no data yet")
    up_cmd.add_argument("--registry", action="store_true",
                        help="also a schema registry (Apicurio Registry, in memory, "
                             "compatibility BACKWARD): Confluent's API on "
                             "http://127.0.0.1:18081/apis/ccompat/v7")
    up_cmd.add_argument("--replica", action="store_true",
                        help="also a streaming standby of Postgres on 127.0.0.1:15434 "
                             "(asynchronous; kept from then on): `stack failover` promotes it")
    up_cmd.add_argument("--sync", action="store_true",
                        help="with --replica: synchronous replication (a commit returns once "
                             "the standby applied it: remote_apply)")
    down_cmd = commands.add_parser("down", help="stop what `up` started; data is kept")
    only = down_cmd.add_mutually_exclusive_group()
    only.add_argument("--airflow", action="store_true", help="stop only Airflow's services")
    only.add_argument("--registry", action="store_true",
                      help="stop only the schema registry (its schemas go with it)")
    only.add_argument("--replica", action="store_true",
                      help="stop the Postgres standby, delete it and forget --replica")
    failover_cmd = commands.add_parser(
        "failover", help="SIGKILL the Postgres primary, promote the standby, and make the "
                         "dead primary's place its new standby")
    failover_cmd.add_argument("--no-rebuild", action="store_true",
                              help="leave the old primary down (no standby until `stack up`)")
    commands.add_parser("status", help="show each part; exit 1 if any is down")
    env_cmd = commands.add_parser("env",
                                  help='print `export` lines: eval "$(kafka-ingest stack env)"')
    env_cmd.add_argument("--secure", action="store_true",
                         help="point at the SASL_SSL listener and TLS Postgres (runtime role)")
    env_cmd.add_argument("--faults", action="store_true",
                         help="point Kafka and Postgres clients through Toxiproxy's proxies "
                              "and print TOXIPROXY_URL")
    env_cmd.add_argument("--replica", action="store_true",
                         help="name both Postgres nodes (target_session_attrs=read-write), "
                              "so clients follow a failover")
    return parser


def main(argv: list[str]) -> int:
    """``kafka-ingest stack up|down|status|env|failover``; exit 2 with one line on a StackError."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "up":
            up(report=print, secure=args.secure,
               airflow=args.airflow or args.executor is not None or args.workers is not None,
               executor=args.executor, workers=args.workers,
               faults=args.faults, brokers=args.brokers, registry=args.registry,
               replica=("sync" if args.sync else "async") if args.replica or args.sync
               else None)
        elif args.command == "down":
            stop = (stop_registry if args.registry else stop_airflow if args.airflow
                    else remove_replica if args.replica else down)
            stop(report=print)
        elif args.command == "failover":
            failover(rebuild=not args.no_rebuild, report=print)
        elif args.command == "status":
            parts = status()
            for part in parts:
                print(part.line())
            return 0 if all(part.up for part in parts) else 1
        else:
            _print_env(secure=args.secure, faults=args.faults, replica=args.replica)
    except StackError as exc:
        print(f"kafka-ingest stack {args.command}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover - `python -m kafka_ingest_dev.stack up`
    sys.exit(main(sys.argv[1:]))
