"""The real local stack: Apache Kafka (KRaft), PostgreSQL and Airflow's metadata database.

Development tooling: the runtime package ``kafka_ingest`` never imports this package; only
``kafka-ingest stack ...``, the demo and the tests know the local stack. They use the
names re-exported here; the modules hold one part each:

- :mod:`~kafka_ingest_dev.stack.settings`: the state directory, the ports, the sticky
  options (:class:`Settings`), the lock;
- :mod:`~kafka_ingest_dev.stack.kafka`: one KRaft node or a cluster of them;
- :mod:`~kafka_ingest_dev.stack.postgres`: the Postgres server (the primary);
- :mod:`~kafka_ingest_dev.stack.standby`: the streaming standby and :func:`failover`;
- :mod:`~kafka_ingest_dev.stack.airflow_db`: Airflow's metadata database;
- :mod:`~kafka_ingest_dev.stack.registry`, :mod:`~kafka_ingest_dev.stack.connect`,
  :mod:`~kafka_ingest_dev.stack.proxies`: the schema registry, the Kafka Connect worker
  and Toxiproxy, when asked for;
- :mod:`~kafka_ingest_dev.stack.environment`: :func:`env`, what points clients at it;
- :mod:`~kafka_ingest_dev.stack.api`: :func:`up`, :func:`down`, :func:`status`;
- :mod:`~kafka_ingest_dev.stack.chaos`: stopping, killing and restarting parts on purpose;
- :mod:`~kafka_ingest_dev.stack.cli`: ``kafka-ingest stack up|down|status|env|failover``.

Each process is a :class:`~kafka_ingest_dev.service.LocalService` (pid file, log, start,
stop, status written once).

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
  Another Airflow beside it (``KAFKA_INGEST_AIRFLOW_INSTANCE=<name>``, each test worker's):
  ``<state>/airflow-<name>`` and a copy of that database, ``airflow_<name>``.
- **Schema registry** (``up --registry``): Apicurio Registry
  (:mod:`kafka_ingest_dev.apicurio`) fetched once from Maven Central into the same cache,
  H2 in memory, global compatibility ``BACKWARD``; its Confluent-compatible API on
  ``http://127.0.0.1:18081/apis/ccompat/v7``, its management interface on
  ``127.0.0.1:18082`` (``KAFKA_INGEST_REGISTRY_PORT``, ``..._REGISTRY_MANAGEMENT_PORT``);
  ``<state>/registry``. Like Airflow's services it is started only when asked for, and a
  plain ``up`` leaves a running one alone; ``down`` stops it, ``down --registry`` only it.
- **Kafka Connect** (``up --connect``): a standalone worker
  (:mod:`kafka_ingest_dev.kafka_connect`, jars fetched once from Maven Central into the
  same cache) with Debezium's Postgres source connector on its plugin path, JsonConverter
  keys and values with schemas; its REST API on ``http://127.0.0.1:18083``
  (``KAFKA_INGEST_CONNECT_PORT``); ``<state>/connect``. Started only when asked for (the
  mirror's tests start it on demand: :func:`start_connect`); ``down`` stops it,
  ``down --connect`` only it.

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
only the processes whose pid files this package wrote. The processes start without the
user's libpq variables (a shell's ``PGPORT=15432,15434`` from ``stack env --replica`` is
for its psql, not for the servers), and the stack's own connections pin what those would
change (:func:`~kafka_ingest_dev.procs.child_env`,
:func:`~kafka_ingest_dev.procs.own_libpq`). Trade-off: the processes are not
supervised, so a crashed broker stays down until the next ``up`` (which is idempotent and
cheap when everything already runs).
"""

from kafka_ingest_dev.procs import PartStatus, StackError
from kafka_ingest_dev.stack.api import (
    down,
    start_connect,
    start_registry,
    status,
    stop_airflow,
    stop_connect,
    stop_registry,
    up,
)
from kafka_ingest_dev.stack.chaos import (
    broker_pid,
    kill_broker,
    postmaster_pid,
    restart_kafka,
    restart_postgres,
    start_broker,
    stop_broker,
)
from kafka_ingest_dev.stack.cli import main
from kafka_ingest_dev.stack.environment import KAFKA_GROUP_ID, env
from kafka_ingest_dev.stack.kafka import KAFKA_VERSION, KafkaNode
from kafka_ingest_dev.stack.postgres import PG_APP_ROLE, STANDBY_NAME, PgNode, primary_node
from kafka_ingest_dev.stack.proxies import toxiproxy
from kafka_ingest_dev.stack.settings import (
    INSTANCE_VARIABLE,
    Settings,
    isolated_env,
    settings,
    state_dir,
)
from kafka_ingest_dev.stack.standby import (
    Failover,
    failover,
    pause_replication,
    remove_replica,
)

__all__ = [
    "INSTANCE_VARIABLE",
    "KAFKA_GROUP_ID",
    "KAFKA_VERSION",
    "PG_APP_ROLE",
    "STANDBY_NAME",
    "Failover",
    "KafkaNode",
    "PartStatus",
    "PgNode",
    "Settings",
    "StackError",
    "broker_pid",
    "down",
    "env",
    "failover",
    "isolated_env",
    "kill_broker",
    "main",
    "pause_replication",
    "postmaster_pid",
    "primary_node",
    "remove_replica",
    "restart_kafka",
    "restart_postgres",
    "settings",
    "start_broker",
    "start_connect",
    "start_registry",
    "state_dir",
    "status",
    "stop_airflow",
    "stop_broker",
    "stop_connect",
    "stop_registry",
    "toxiproxy",
    "up",
]
