"""Kafka in the local stack: one KRaft node, or a cluster of them (``up --brokers 3``).

The official ``org.apache.kafka`` jars from Maven Central (fetched once by Maven into
``${XDG_CACHE_HOME:-~/.cache}/kafka-ingest/kafka-<version>-<pom>/libs``), each node a JVM
acting as broker and controller with a static quorum. One node keeps one replica of
everything; three form a 3-voter quorum with internal topics of three replicas, two in
sync. A node's ``server.properties`` is written on every start; a running node whose
configuration changed (``--secure``, ``--faults``) is restarted by ``up``.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import shlex
import shutil
import subprocess
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kafka_ingest_dev import tls
from kafka_ingest_dev.procs import (
    PartStatus,
    StackError,
    accepts,
    binary,
    child_env,
    read_or_none,
    require_free,
)
from kafka_ingest_dev.service import LocalService

if TYPE_CHECKING:
    from kafka_ingest_dev.stack.settings import Settings

log = logging.getLogger(__name__)

KAFKA_VERSION = "4.1.1"
#: The pom that lists the jars, the brokers' and the tools' log4j2 settings.
BROKER_DIR = Path(__file__).resolve().parents[1] / "broker"
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
_POLL_S = 0.1

#: The Kafka tools ``stack env`` puts on PATH, with their main classes (kafka-tools 4.x).
KAFKA_TOOLS = {
    "kafka-topics": "org.apache.kafka.tools.TopicCommand",
    "kafka-consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "kafka-console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "kafka-console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "kafka-get-offsets": "org.apache.kafka.tools.GetOffsetShell",
}

#: Where the stack proves its coordinators work, then leaves no trace but this topic.
READY_TOPIC = "kafka-ingest-stack-ready"
#: librdkafka's lines while the coordinators load: the retries the wait expects, not shown
#: (a wait that fails says why in its StackError).
_READY_LOG = logging.getLogger(f"{__name__}.ready")
_READY_LOG.addHandler(logging.NullHandler())
_READY_LOG.propagate = False


@dataclass(frozen=True)
class KafkaNode(LocalService):
    """One KRaft node of the local cluster: broker and controller in one JVM."""

    name: str
    node_id: int
    port: int
    controller_port: int
    #: The broker's ``FAULTS`` listener (behind Toxiproxy) and the proxy's own port.
    faults_port: int
    proxy_port: int
    home: Path
    start_timeout_s = START_TIMEOUT_S
    stop_timeout_s = STOP_TIMEOUT_S

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        return self.bootstrap

    @property
    def pidfile(self) -> Path:
        return self.home / "kafka.pid"

    @property
    def props(self) -> Path:
        return self.home / "server.properties"

    @property
    def logfile(self) -> Path:
        return self.home / "broker.log"

    @property
    def formatted(self) -> bool:
        """Its log dir was formatted (it holds a cluster's data from then on)."""
        return (self.home / "data" / "meta.properties").is_file()

    @property
    def proxy_name(self) -> str:
        """Its proxy in Toxiproxy: ``kafka``, then ``kafka-2``, ``kafka-3``."""
        return "kafka" if self.node_id == 1 else f"kafka-{self.node_id}"

    def markers(self) -> tuple[str, ...]:
        return (str(self.props),)

    def answers(self, timeout_s: float = 3.0) -> bool:
        """Health: the node answers a metadata request (AdminClient.list_topics)."""
        if not accepts(self.port):
            return False
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        # librdkafka logs through ours, not to stderr, while the broker is still booting.
        config: dict[str, Any] = {"bootstrap.servers": self.bootstrap, "logger": log}
        admin = AdminClient(config)
        try:
            admin.list_topics(timeout=timeout_s)
        except KafkaException:
            return False
        return True


# --------------------------------------------------------------------------- the jars


def fetch_jars(s: Settings) -> Path:
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
        mvn, "-q", "-B", "-f", str(BROKER_DIR / "pom.xml"), "dependency:copy-dependencies",
        f"-DoutputDirectory={libs}", "-Dmdep.includeScope=runtime",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=child_env())
    if done.returncode != 0:
        detail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
        raise StackError(f"mvn could not fetch Kafka {KAFKA_VERSION} jars: {detail[0]}")
    marker.write_text(f"{KAFKA_VERSION}\n")
    return libs


def install_tools(s: Settings, java: str, libs: Path) -> None:
    """Small wrapper scripts in ``<state>/bin`` that run Kafka's own tools from the jars."""
    s.bin_dir.mkdir(parents=True, exist_ok=True)
    log_config = BROKER_DIR / "tools-log4j2.yaml"
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


# --------------------------------------------------------------------------- configuration


def properties(s: Settings, node: KafkaNode | None = None) -> str:
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
    # The header is compared with the running node's file: a change restarts the node.
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


def create_scram_user(s: Settings) -> None:
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


def client_config(s: Settings, *, secure: bool, faults: bool = False) -> dict[str, Any]:
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


def set_brokers(s: Settings, brokers: int) -> None:
    """Record the cluster's size; a formatted cluster cannot change it (its quorum was
    written into the nodes' storage when they were formatted)."""
    if not 1 <= brokers <= 9:
        raise StackError(f"--brokers {brokers}: choose 1 to 9 Kafka nodes")
    if brokers == s.brokers:
        return
    if brokers > 1 and s.secure:
        raise StackError("--brokers with --secure is not supported: the SASL_SSL listener is "
                         "node 1's; use another KAFKA_INGEST_STATE_DIR for the cluster")
    formatted = [n for n in s.nodes if n.formatted]
    if formatted:
        raise StackError(
            f"this state dir holds a {s.brokers}-node Kafka cluster ({formatted[0].home}); "
            f"a {brokers}-node one needs its own: set KAFKA_INGEST_STATE_DIR to a fresh "
            "directory (and free ports), or remove the kafka* directories of this one")
    s.brokers_file.write_text(f"{brokers}\n")


def cluster_node(s: Settings, node_id: int) -> KafkaNode:
    """Node ``node_id`` of this stack's cluster, or a StackError naming its size."""
    if not 1 <= node_id <= s.brokers:
        raise StackError(f"no Kafka node {node_id}: this stack has {s.brokers}")
    return s.node(node_id)


# --------------------------------------------------------------------------- start


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


def _format_storage(s: Settings, java: str, libs: Path, node: KafkaNode) -> None:
    """Format the log dir on first start only: formatting again would lose the data."""
    if node.formatted:
        return
    # `--cluster-id=<id>`, not `-t <id>`: a random id may start with "-".
    cmd = [java, "-cp", f"{libs}/*", "kafka.tools.StorageTool", "format",
           f"--cluster-id={_cluster_id(s)}", "-c", str(node.props)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=child_env())
    if done.returncode != 0:
        detail = (done.stdout + done.stderr).strip().replace("\n", " | ")
        raise StackError(f"formatting Kafka storage failed: {detail[-300:]}")


def preflight(s: Settings, nodes: list[KafkaNode] | None = None) -> str:
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


#: A node's JVM by :attr:`Settings.broker_jvm`: ``server``, the shared stack's (G1 and the
#: optimising compiler: the broker the benchmarks run against); ``lean``, a stack's of its
#: own for a fault test or the soak, minutes long (the serial collector and the client
#: compiler: three nodes took 15 against 26 CPU seconds to start and idled at 30% less).
BROKER_JVMS: dict[str, tuple[str, ...]] = {
    "server": ("-Xmx512m", "-Xms256m", "-XX:+UseG1GC"),
    "lean": ("-Xmx512m", "-Xms64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"),
}


def launch(s: Settings, java: str, node: KafkaNode) -> int:
    """Fetch the jars if needed, format on first start, spawn the node; do not wait."""
    libs = fetch_jars(s)
    node.home.mkdir(parents=True, exist_ok=True)
    node.props.write_text(properties(s, node))
    _format_storage(s, java, libs, node)
    jvm = [*BROKER_JVMS[s.broker_jvm], "-XX:+ExitOnOutOfMemoryError",
           "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={BROKER_DIR / 'log4j2.yaml'}"]
    return node.spawn([java, *jvm, "-cp", f"{libs}/*", "kafka.Kafka", str(node.props)])


#: (node, pid, started now) of each node of the cluster.
Launched = list[tuple[KafkaNode, int, bool]]


def begin(s: Settings, pool: ThreadPoolExecutor) -> Future[Launched]:
    """(node, pid, started) of each Kafka node, launching in ``pool`` those not running.

    The first start downloads the jars: that runs beside Postgres and Airflow. The
    preflight (java, mvn, ports) stays in the caller so its errors come at once. A node
    whose configuration changed (``--secure``, ``--faults``) makes every node restart.
    """
    nodes = s.nodes
    running = {n.node_id: n.pid() for n in nodes}
    if any(pid is not None and read_or_none(n.props) != properties(s, n)
           for n, pid in zip(nodes, running.values(), strict=True)):
        log.info("kafka: its configuration changed (e.g. --secure, --faults); restarting it")
        stop(s)
        running = dict.fromkeys(running)
    missing = [n for n in nodes if running[n.node_id] is None]
    java = preflight(s, missing) if missing else ""

    def launch_missing() -> Launched:
        started = {n.node_id: launch(s, java, n) for n in missing}
        return [(n, started.get(n.node_id) or running[n.node_id] or 0, n.node_id in started)
                for n in nodes]

    if missing:
        return pool.submit(launch_missing)
    done: Future[Launched] = Future()
    done.set_result(launch_missing())
    return done


def await_cluster(s: Settings, *, fresh: bool) -> None:
    """Every node listed as a live broker; on a node just started, its coordinators."""
    if s.brokers > 1:
        await_brokers(s, [n.node_id for n in s.nodes])
    if fresh:
        _await_coordinators(s)


def _await_coordinators(s: Settings) -> None:
    """Poll until a new broker's coordinators serve clients: an idempotent producer gets
    its producer id (delivers a record) and a group commit lands. Until then librdkafka
    logs "Coordinator load in progress: retrying" for every client a newcomer starts."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    common: dict[str, Any] = {"bootstrap.servers": s.bootstrap_servers, "logger": _READY_LOG}
    deadline = time.monotonic() + START_TIMEOUT_S
    admin = AdminClient(common)  # kept: a destroyed client fails its futures
    created = admin.create_topics([NewTopic(READY_TOPIC, 1, 1)])
    try:
        created[READY_TOPIC].result(START_TIMEOUT_S)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise StackError(f"could not create {READY_TOPIC} on {s.bootstrap_servers}: "
                             f"{exc}") from exc
    producer = Producer({**common, "enable.idempotence": True, "acks": "all",
                         "message.timeout.ms": int(START_TIMEOUT_S * 1000)})
    delivered: list[Any] = []
    producer.produce(READY_TOPIC, b"ready", on_delivery=lambda err, _m: delivered.append(err))
    while not delivered and time.monotonic() < deadline:
        producer.poll(_POLL_S)
    if delivered != [None]:
        raise StackError(f"Kafka on {s.bootstrap_servers} did not take an idempotent "
                         f"producer's record within {START_TIMEOUT_S:.0f} s: "
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
                                     f"{START_TIMEOUT_S:.0f} s: {exc}") from exc
                time.sleep(_POLL_S)
    finally:
        consumer.close()


def await_brokers(s: Settings, node_ids: list[int]) -> None:
    """Poll until the cluster's metadata lists every one of ``node_ids`` as a live broker."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    config: dict[str, Any] = {"bootstrap.servers": s.bootstrap_servers, "logger": log}
    admin = AdminClient(config)
    deadline = time.monotonic() + START_TIMEOUT_S
    seen: set[int] = set()
    while time.monotonic() < deadline:
        with contextlib.suppress(KafkaException):
            seen = set(admin.list_topics(timeout=2.0).brokers)
            if seen >= set(node_ids):
                return
        time.sleep(_POLL_S)
    raise StackError(f"the Kafka cluster lists brokers {sorted(seen)}, not yet "
                     f"{sorted(set(node_ids) - seen)}, after {START_TIMEOUT_S:.0f} s; "
                     "see the nodes' broker.log")


# --------------------------------------------------------------------------- stop, status


def stop(s: Settings) -> str:
    """Stop every node at once (one by one, the last ones would wait for a quorum)."""
    nodes = s.nodes
    if len(nodes) == 1:
        return nodes[0].stop()
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        return "\n".join(pool.map(lambda n: n.stop(), nodes))


def status(s: Settings) -> list[PartStatus]:
    return [node.status() for node in s.nodes]
