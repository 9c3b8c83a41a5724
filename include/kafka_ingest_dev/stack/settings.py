"""Where the local stack lives and which loopback ports it uses: :class:`Settings`.

Read from the environment at each :func:`settings` call (tests change ports and state
directories at will): ``KAFKA_INGEST_STATE_DIR``, one ``KAFKA_INGEST_<PART>_PORT`` per
port (:data:`PORT_VARIABLES`) and ``KAFKA_INGEST_AIRFLOW_INSTANCE``
(:data:`INSTANCE_VARIABLE`). The markers ``up`` leaves in the state directory make its
options stick (``--secure``, ``--faults``, ``--brokers``, ``--replica``); :func:`locked`
serialises the commands that change the stack.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kafka_ingest_dev import apicurio, kafka_connect
from kafka_ingest_dev import faults as fault_proxy
from kafka_ingest_dev.airflow_services import REDIS_PORT, AirflowServices
from kafka_ingest_dev.procs import StackError, free_ports, read_or_none
from kafka_ingest_dev.stack.kafka import BROKER_DIR, BROKER_JVMS, KAFKA_VERSION, KafkaNode
from kafka_ingest_dev.stack.postgres import AIRFLOW_DATABASE, PgNode

#: Where ``up``, ``down`` and the others send their lines (``print``, or a logger's).
Report = Callable[[str], None]

#: Every environment variable that names a port of the stack; Kafka nodes 2..n take
#: ``<name>_<n>`` for each of :data:`NODE_PORT_VARIABLES`.
PORT_VARIABLES = (
    "KAFKA_INGEST_KAFKA_PORT", "KAFKA_INGEST_CONTROLLER_PORT", "KAFKA_INGEST_KAFKA_SECURE_PORT",
    "KAFKA_INGEST_PG_PORT", "KAFKA_INGEST_PG_STANDBY_PORT", "KAFKA_INGEST_AIRFLOW_PORT",
    "KAFKA_INGEST_REDIS_PORT", "KAFKA_INGEST_TOXIPROXY_PORT", "KAFKA_INGEST_KAFKA_PROXY_PORT",
    "KAFKA_INGEST_KAFKA_FAULTS_PORT", "KAFKA_INGEST_PG_PROXY_PORT",
    "KAFKA_INGEST_REGISTRY_PORT", "KAFKA_INGEST_REGISTRY_MANAGEMENT_PORT",
    "KAFKA_INGEST_CONNECT_PORT",
)
#: Names another Airflow of the same stack (letters, digits, ``_``): its home
#: ``<state>/airflow-<name>``, its metadata database ``airflow_<name>`` (a copy of the
#: stack's ``airflow`` database), its own ports (``KAFKA_INGEST_AIRFLOW_PORT`` and
#: ``KAFKA_INGEST_REDIS_PORT`` beside it). Each pytest-xdist worker runs its DAG tests on one
#: of its own (tests/support/workers.py). Unset or empty: the stack's own Airflow.
INSTANCE_VARIABLE = "KAFKA_INGEST_AIRFLOW_INSTANCE"
#: The Kafka nodes' JVM (:data:`~kafka_ingest_dev.stack.kafka.BROKER_JVMS`): ``server`` (the
#: default: the shared stack's, which the benchmarks run against) or ``lean`` (a stack of
#: its own for minutes: :func:`isolated_env` sets it).
BROKER_JVM_VARIABLE = "KAFKA_INGEST_KAFKA_JVM"
NODE_PORT_VARIABLES = ("KAFKA_INGEST_KAFKA_PORT", "KAFKA_INGEST_CONTROLLER_PORT",
                       "KAFKA_INGEST_KAFKA_PROXY_PORT", "KAFKA_INGEST_KAFKA_FAULTS_PORT")


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
    #: ``--connect``: the Kafka Connect worker's REST API.
    connect_port: int = kafka_connect.DEFAULT_PORT
    #: :data:`INSTANCE_VARIABLE`: "" is the stack's own Airflow.
    airflow_instance: str = ""
    #: :data:`BROKER_JVM_VARIABLE`.
    broker_jvm: str = "server"

    # ----------------------------------------------------------------------- kafka

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    @property
    def kafka_dir(self) -> Path:
        return self.state / "kafka"

    @property
    def secure_bootstrap(self) -> str:
        return f"127.0.0.1:{self.secure_port}"

    @property
    def bin_dir(self) -> Path:
        """Kafka's command-line tools, as wrapper scripts ``stack env`` puts on PATH."""
        return self.state / "bin"

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
        ``_KAFKA_PROXY_``, ``_KAFKA_FAULTS_``) or node 1's plus 100 * (n - 1). Named
        ``kafka`` in a one-node stack, ``kafka-<n>`` in a cluster."""
        name = "kafka" if self.brokers == 1 else f"kafka-{node_id}"
        if node_id == 1:
            return KafkaNode(name, 1, self.kafka_port, self.controller_port,
                             self.kafka_faults_port, self.kafka_proxy_port, self.kafka_dir)
        step = 100 * (node_id - 1)
        return KafkaNode(
            name, node_id,
            port(f"KAFKA_INGEST_KAFKA_PORT_{node_id}", self.kafka_port + step),
            port(f"KAFKA_INGEST_CONTROLLER_PORT_{node_id}", self.controller_port + step),
            port(f"KAFKA_INGEST_KAFKA_FAULTS_PORT_{node_id}", self.kafka_faults_port + step),
            port(f"KAFKA_INGEST_KAFKA_PROXY_PORT_{node_id}", self.kafka_proxy_port + step),
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

    # ----------------------------------------------------------------------- postgres

    @property
    def pg_nodes(self) -> tuple[PgNode, PgNode]:
        """The stack's Postgres server and the place of its standby (``up --replica``);
        either may be the primary: ``stack failover`` swaps them."""
        return (PgNode("postgres", self.pg_home, self.pg_port),
                PgNode("postgres-standby", self.pg_home.with_name("postgres-standby"),
                       self.pg_standby_port))

    @property
    def primary_marker(self) -> Path:
        """Names the node that takes writes once ``stack failover`` moved it."""
        return self.state / "postgres-primary"

    @property
    def replica_marker(self) -> Path:
        """Present once ``up --replica`` ran; holds ``async`` or ``sync``."""
        return self.state / "postgres-replica"

    @property
    def replica(self) -> str | None:
        """The standby's replication mode (``async``/``sync``), None without one."""
        text = read_or_none(self.replica_marker)
        return text.strip() if text else None

    # ----------------------------------------------------------------------- the others

    @property
    def airflow_home(self) -> Path:
        return self.state / (f"airflow-{self.airflow_instance}" if self.airflow_instance
                             else "airflow")

    @property
    def airflow_database(self) -> str:
        """Airflow's metadata database in the stack's Postgres (its instance's)."""
        return (f"{AIRFLOW_DATABASE}_{self.airflow_instance}" if self.airflow_instance
                else AIRFLOW_DATABASE)

    @property
    def airflow(self) -> AirflowServices:
        return AirflowServices(self.airflow_home, self.airflow_port,
                               port("KAFKA_INGEST_REDIS_PORT", REDIS_PORT))

    @property
    def registry(self) -> apicurio.Server:
        return apicurio.Server(self.registry_port, self.registry_management_port,
                               self.state / "registry")

    @property
    def connect(self) -> kafka_connect.Worker:
        return kafka_connect.Worker(self.connect_port, self.bootstrap_servers,
                                    self.state / "connect")

    @property
    def toxiproxy(self) -> fault_proxy.Server:
        return fault_proxy.Server(self.toxiproxy_port, self.state / "toxiproxy")

    @property
    def tls_dir(self) -> Path:
        return self.state / "tls"

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


def repo_root() -> Path | None:
    """The checkout this package sits in (``include/kafka_ingest_dev/stack`` -> repo)."""
    root = Path(__file__).resolve().parents[3]
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
    pom = hashlib.sha256((BROKER_DIR / "pom.xml").read_bytes()).hexdigest()[:12]
    return Path(xdg) / "kafka-ingest" / f"kafka-{KAFKA_VERSION}-{pom}"


def port(name: str, default: int) -> int:
    """The port the environment variable ``name`` gives, else ``default``."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise StackError(f"{name}={raw!r} is not a port number") from None


def isolated_env(state: Path, *, brokers: int = 1) -> dict[str, str]:
    """The environment of a stack of its own beside the shared one: its state dir and a
    free loopback port for every port it may open (the fault tests', the soak's), its
    own Airflow (no :data:`INSTANCE_VARIABLE`), and lean Kafka nodes (it lives minutes, and
    its nodes' start is most of their CPU)."""
    names = [*PORT_VARIABLES,
             *(f"{n}_{i}" for i in range(2, brokers + 1) for n in NODE_PORT_VARIABLES)]
    return {"KAFKA_INGEST_STATE_DIR": str(state), INSTANCE_VARIABLE: "",
            BROKER_JVM_VARIABLE: "lean",
            **dict(zip(names, map(str, free_ports(len(names))), strict=True))}


def settings() -> Settings:
    """Read the environment once per call: tests change ports and state dirs at will."""
    state = state_dir()
    return Settings(
        state=state,
        cache=_cache_dir(),
        repo=repo_root(),
        kafka_port=port("KAFKA_INGEST_KAFKA_PORT", 19092),
        controller_port=port("KAFKA_INGEST_CONTROLLER_PORT", 19093),
        secure_port=port("KAFKA_INGEST_KAFKA_SECURE_PORT", 19094),
        airflow_port=port("KAFKA_INGEST_AIRFLOW_PORT", 18080),
        pg_port=port("KAFKA_INGEST_PG_PORT", 15432),
        pg_home=_pg_home(state),
        toxiproxy_port=port("KAFKA_INGEST_TOXIPROXY_PORT", fault_proxy.DEFAULT_API_PORT),
        kafka_proxy_port=port("KAFKA_INGEST_KAFKA_PROXY_PORT", 19095),
        kafka_faults_port=port("KAFKA_INGEST_KAFKA_FAULTS_PORT", 19096),
        pg_proxy_port=port("KAFKA_INGEST_PG_PROXY_PORT", 15433),
        pg_standby_port=port("KAFKA_INGEST_PG_STANDBY_PORT", 15434),
        registry_port=port("KAFKA_INGEST_REGISTRY_PORT", apicurio.DEFAULT_PORT),
        registry_management_port=port("KAFKA_INGEST_REGISTRY_MANAGEMENT_PORT",
                                      apicurio.DEFAULT_MANAGEMENT_PORT),
        connect_port=port("KAFKA_INGEST_CONNECT_PORT", kafka_connect.DEFAULT_PORT),
        airflow_instance=airflow_instance(),
        broker_jvm=broker_jvm(),
    )


def broker_jvm() -> str:
    """:data:`BROKER_JVM_VARIABLE`, checked."""
    name = os.environ.get(BROKER_JVM_VARIABLE, "") or "server"
    if name not in BROKER_JVMS:
        raise StackError(f"{BROKER_JVM_VARIABLE}={name!r}: one of {', '.join(BROKER_JVMS)}")
    return name


def airflow_instance() -> str:
    """:data:`INSTANCE_VARIABLE`, checked: it names a directory and a database."""
    name = os.environ.get(INSTANCE_VARIABLE, "").strip()
    if name and not re.fullmatch(r"[a-z0-9_]+", name):
        raise StackError(f"{INSTANCE_VARIABLE}={name!r}: lower-case letters, digits and _ only")
    return name


@contextlib.contextmanager
def locked(s: Settings) -> Iterator[None]:
    """Serialise ``up``/``down`` across processes (pytest-xdist workers, two shells)."""
    s.state.mkdir(parents=True, exist_ok=True)
    with (s.state / ".stack.lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
