"""The soak: the pipelines under Airflow's real scheduler, triggerer and Celery workers for
a long time, while a producer writes a steady stream with poison pills and a nemesis
breaks things at random, bounded intervals; then everything is checked exactly.

    python -m kafka_ingest_dev.soak --minutes 60      # make soak
    python -m kafka_ingest_dev.soak --minutes 2 --every-kind   # the test command's variant

On a stack of its own (a fresh state dir under /tmp, free loopback ports; the shared
stack is not touched): three Kafka nodes behind Toxiproxy, Postgres with an
asynchronous streaming standby, Airflow with the Celery executor and two workers. The
pipelines run on a one-minute schedule; their Kafka connection goes through the fault
proxies, their Postgres connection (and Airflow's metadata database) names both servers
(``target_session_attrs=read-write``).

The nemesis, one fault at a time, each healed before the next:

- ``worker_kill``: SIGKILL a Celery worker and its task processes (a lost machine);
- ``broker_restart``: SIGKILL a Kafka node, start it again after a while;
- ``kafka_latency`` / ``kafka_reset``: latency, or connections reset, on a node's proxy;
- ``pg_stop``: stop the Postgres primary in immediate mode (no checkpoint: crash
  recovery), start it again after a while;
- ``pg_failover``: SIGKILL the primary, promote the standby, rebuild the old primary as
  the new standby (``kafka-ingest stack failover``).

A supervisor starts again any Airflow service that died (as systemd or Kubernetes would)
and counts it. At the end the producer and the nemesis stop, the pipelines drain, and
the table, ``dead_letters``, the stored and group offsets and the DLQ topic are checked
against what the producer's delivery reports say reached the topic: every valid event
once, every poison pill once in ``dead_letters``, offsets at the high watermarks.

Prints the report and writes it as JSON (``--report``); exit status 0 only when nothing
was lost or duplicated and every invariant holds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("kafka_ingest_dev.soak")

FAULTS = ("worker_kill", "broker_restart", "kafka_latency", "kafka_reset", "pg_stop",
          "pg_failover")
BROKERS = 3
WORKERS = 2
PARTITIONS = 3
#: Airflow notices a lost worker's task by its silence: sooner than the default 5 min.
SCHEDULER = {
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
    "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "120",
}
@dataclass
class Settings:
    minutes: float = 60.0
    rate: int = 200
    min_gap_s: float = 20.0
    max_gap_s: float = 60.0
    drain_timeout_s: float = 900.0
    seed: int = 0
    report: Path | None = None
    keep: bool = False
    #: Faults go on past ``minutes`` until every kind has come once (a short soak that
    #: still sees them all), at most one more round of them.
    every_kind: bool = False

    def fault_bound_s(self) -> float:
        """The longest the faults come: ``minutes``, and with ``every_kind`` one round of
        every kind more, each after its longest gap and bounded by its own steps (a
        failover, the longest, rebuilds a standby: two minutes is ample)."""
        extra = len(FAULTS) * (self.max_gap_s + 120) if self.every_kind else 0.0
        return self.minutes * 60 + extra

    def faults_go_on(self, elapsed_s: float, saw_every_kind: bool) -> bool:
        """Whether faults keep coming ``elapsed_s`` after the first could."""
        if elapsed_s >= self.fault_bound_s():
            return False
        return elapsed_s < self.minutes * 60 or (self.every_kind and not saw_every_kind)


@dataclass
class Expected:
    """What the producer's delivery reports say reached the source topic."""

    ids: set[str] = field(default_factory=set)
    poison: dict[tuple[int, int], str] = field(default_factory=dict)  # position -> kind
    valid: int = 0
    duplicates: int = 0
    tombstones: int = 0
    undelivered: int = 0


# --------------------------------------------------------------------------- the stack


@contextlib.contextmanager
def own_stack(state: Path) -> Iterator[None]:
    """This process's environment pointed at a stack of its own on free ports."""
    from kafka_ingest_dev import stack

    saved = dict(os.environ)
    os.environ.update(stack.isolated_env(state, brokers=BROKERS))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _pipelines_doc(tag: str) -> dict[str, Any]:
    return {"pipelines": {f"soak_{tag}": {
        "topic": f"soak-{tag}", "dlq_topic": f"soak-{tag}-dlq", "table": "telemetry_metrics",
        "contract": {"event_type": "metric_event", "version": 2},
        "schedule": "* * * * *", "partitions": PARTITIONS, "replication_factor": BROKERS,
        "topic_config": {"min.insync.replicas": "2"}, "chunk_size": 2000, "retries": 6,
        "task_timeout_minutes": 10,
    }}}


# --------------------------------------------------------------------------- producer


class Producer(threading.Thread):
    """A steady stream of the sample's events (duplicates and poison pills among them)
    at ``rate`` events/s; what was delivered is recorded from the delivery reports."""

    def __init__(self, pipeline: Any, clients: Any, rate: int, tag: str) -> None:
        super().__init__(name="soak-producer", daemon=True)
        self.pipeline, self.clients, self.rate, self.tag = pipeline, clients, rate, tag
        self.expected = Expected()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self._lock = threading.Lock()

    def _delivered(self, sample: Any) -> Callable[[Any, Any], None]:
        def report(err: Any, msg: Any) -> None:
            with self._lock:
                if err is not None:
                    self.expected.undelivered += 1
                elif sample.expect in ("row", "duplicate"):
                    self.expected.ids.add(json.loads(sample.value)["event_id"])
                    self.expected.valid += sample.expect == "row"
                    self.expected.duplicates += sample.expect == "duplicate"
                elif sample.expect == "tombstone":  # skipped by the pipeline (on_tombstone)
                    self.expected.tombstones += 1
                else:
                    self.expected.poison[(msg.partition(), msg.offset())] = sample.kind
        return report

    def run(self) -> None:
        from kafka_ingest_dev.samples import sample_stream

        try:
            producer = self.clients.producer()
            batch, started, sent = 0, time.monotonic(), 0
            while not self.stop.is_set():
                tag = f"{self.tag}-{batch}"
                for sample in sample_stream(self.pipeline, 10_000, 1, tag=tag,
                                            partitions=PARTITIONS, seed=batch):
                    if self.stop.is_set():
                        break
                    while True:
                        try:
                            producer.produce(self.pipeline.topic, key=sample.key,
                                             value=sample.value,
                                             partition=-1 if sample.partition is None
                                             else sample.partition,
                                             on_delivery=self._delivered(sample))
                            break
                        except BufferError:
                            producer.poll(0.5)
                    sent += 1
                    producer.poll(0)
                    ahead = sent / self.rate - (time.monotonic() - started)
                    if ahead > 0:
                        time.sleep(ahead)
                batch += 1
            left = producer.flush(120)
            if left:
                raise RuntimeError(f"{left} records still undelivered after 120 s")
        except BaseException as exc:
            self.error = exc


# --------------------------------------------------------------------------- nemesis


class Nemesis(threading.Thread):
    """One fault at a time, healed before the next, at random intervals; each kind
    comes once in turn (shuffled) so a short soak sees them all."""

    def __init__(self, settings: Settings, rng: random.Random) -> None:
        super().__init__(name="soak-nemesis", daemon=True)
        self.settings, self.rng = settings, rng
        self.stop = threading.Event()
        self.done: list[dict[str, Any]] = []
        self.error: BaseException | None = None

    def _wait(self, seconds: float) -> bool:
        return not self.stop.wait(seconds)

    def saw_every_kind(self) -> bool:
        """Whether every kind of fault has come (and been healed) at least once."""
        return {f["kind"] for f in list(self.done)} >= set(FAULTS)

    def run(self) -> None:
        kinds: list[str] = []
        try:
            while self._wait(self.rng.uniform(self.settings.min_gap_s,
                                              self.settings.max_gap_s)):
                if not kinds:
                    kinds = list(FAULTS)
                    self.rng.shuffle(kinds)
                kind = kinds.pop()
                started = time.monotonic()
                try:
                    detail = getattr(self, f"_{kind}")()
                except Exception as exc:  # the tooling, not the pipeline: heal, go on
                    log.exception("nemesis: %s did not go as planned; healing", kind)
                    detail = f"error: {exc}"[:300]
                    self.heal()
                self.done.append({"kind": kind, "at": time.strftime("%H:%M:%S"),
                                  "seconds": round(time.monotonic() - started, 1),
                                  "detail": detail})
                log.info("nemesis: %s (%s) in %.1f s", kind, detail,
                         time.monotonic() - started)
        except BaseException as exc:
            self.error = exc
            log.exception("nemesis failed")

    def heal(self) -> None:
        """Undo whatever a fault that failed half way left: every broker running, no toxic,
        the Postgres primary running (a standby is rebuilt by the next failover); each
        step tried again until it works or ``stop`` is set."""
        from kafka_ingest_dev import stack

        steps: list[Callable[[], Any]] = [
            *(lambda n=n: stack.broker_pid(n) or stack.start_broker(n)
              for n in range(1, BROKERS + 1)),
            lambda: stack.toxiproxy().reset(),
            self._postgres_running,
        ]
        for step in steps:
            while True:
                try:
                    step()
                    break
                except Exception:
                    log.exception("nemesis: healing step failed; again in 10 s")
                    if self.stop.wait(10):
                        return

    @staticmethod
    def _postgres_running() -> None:
        from kafka_ingest_dev import stack

        if stack.postmaster_pid() is None:
            stack.restart_postgres()

    def _worker_kill(self) -> str:
        import psutil

        from kafka_ingest_dev import stack

        services = stack.settings().airflow
        running = sorted(n for n, pid in services.pids().items()
                         if n.startswith("worker-") and pid is not None)
        if not running:  # the supervisor is still starting the last one killed
            return "skipped: no worker runs"
        name = self.rng.choice(running)
        try:
            killed = services.kill_worker(name)
        except (stack.StackError, psutil.NoSuchProcess):
            return f"{name}: gone before the kill"
        return f"{name}: {len(killed)} processes"  # the supervisor starts it again

    def _broker_restart(self) -> str:
        from kafka_ingest_dev import stack

        node = self.rng.randint(1, BROKERS)
        stack.kill_broker(node)
        self.stop.wait(self.rng.uniform(5, 20))
        stack.start_broker(node)
        return f"node {node}"

    def _toxic(self, add: Callable[[Any, str], list[str]], hold_s: float) -> str:
        from kafka_ingest_dev import stack

        node = self.rng.randint(1, BROKERS)
        proxy = stack.settings().node(node).proxy_name
        proxies = stack.toxiproxy()
        names = add(proxies, proxy)
        try:
            self.stop.wait(hold_s)
        finally:
            proxies.remove(proxy, names)
        return f"{proxy} for {hold_s:.0f} s"

    def _kafka_latency(self) -> str:
        return self._toxic(lambda t, p: t.latency(p, 800, jitter=400),
                           self.rng.uniform(10, 30))

    def _kafka_reset(self) -> str:
        return self._toxic(lambda t, p: t.reset_peer(p, timeout_ms=0), self.rng.uniform(2, 6))

    def _pg_stop(self) -> str:
        from kafka_ingest_dev import stack

        down = self.rng.uniform(3, 15)
        stack.restart_postgres(immediate=True, down_s=down)
        return f"primary down {down:.0f} s"

    def _pg_failover(self) -> str:
        from kafka_ingest_dev import stack

        return stack.failover().line()


# --------------------------------------------------------------------------- supervisor


class Supervisor(threading.Thread):
    """Starts again any Airflow service that died; counts each; records the largest lag
    seen (from the stored offsets: the truth) every few seconds."""

    def __init__(self, airflow_env: dict[str, str], pipelines: list[Any], clients: Any,
                 db: Any) -> None:
        super().__init__(name="soak-supervisor", daemon=True)
        self.airflow_env, self.pipelines, self.clients, self.db = (airflow_env, pipelines,
                                                                   clients, db)
        self.stop = threading.Event()
        self.restarts: Counter[str] = Counter()
        self.max_lag = 0
        self.lag_errors = 0

    def lag(self) -> int | None:
        from kafka_ingest.ops.lag import lags

        try:
            found = lags(self.pipelines, self.clients, self.db, timeout_s=10)
        except Exception:  # a fault under way: counted, read again later
            self.lag_errors += 1
            return None
        if any(isinstance(rows, Exception) for rows in found.values()):
            self.lag_errors += 1
            return None
        return sum(r.lag for rows in found.values() if isinstance(rows, list)
                   for r in rows)

    def run(self) -> None:
        from kafka_ingest_dev import stack

        while not self.stop.wait(5):
            services = stack.settings().airflow
            dead = [name for name, pid in services.pids().items() if pid is None]
            if dead:
                try:
                    services.start(self.airflow_env, log.info, executor="celery",
                                   workers=WORKERS)
                    self.restarts.update(dead)
                except Exception:
                    log.exception("supervisor: Airflow services did not start; again later")
            lag = self.lag()
            if lag is not None:
                self.max_lag = max(self.max_lag, lag)


# --------------------------------------------------------------------------- checks


Record = tuple[bytes | None, dict[str, bytes]]


def _read_positions(clients: Any, topic: str) -> dict[tuple[int, int], Record]:
    """Every record of ``topic`` by (partition, offset): its value and headers."""
    from confluent_kafka import TopicPartition

    from kafka_ingest.kafka.metadata import watermarks

    consumer = clients.consumer(f"soak-check-{uuid.uuid4().hex[:6]}")
    try:
        marks = watermarks(consumer, topic, list(range(PARTITIONS)))
        consumer.assign([TopicPartition(topic, p, low) for p, (low, _) in marks.items()])
        want = sum(high - low for low, high in marks.values())
        out: dict[tuple[int, int], Record] = {}
        deadline = time.monotonic() + 300
        while len(out) < want and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 1.0):
                if msg.error() is None:
                    out[(msg.partition(), msg.offset())] = (
                        msg.value(), {k: v for k, v in msg.headers() or [] if v is not None})
        return out
    finally:
        consumer.close()


def check(pipeline: Any, clients: Any, dsn: str, expected: Expected) -> dict[str, Any]:
    """The invariants, exactly; each difference counted."""
    import psycopg

    from kafka_ingest.kafka.metadata import watermarks

    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT event_id, source_partition, source_offset FROM "
                            "telemetry_metrics WHERE source_topic = %s",
                            (pipeline.topic,)).fetchall()
        letters = conn.execute("SELECT source_partition, source_offset FROM dead_letters "
                               "WHERE pipeline = %s AND source_topic = %s",
                               (pipeline.name, pipeline.topic)).fetchall()
        stored: dict[int, int] = dict(conn.execute(
            "SELECT partition, next_offset FROM ingest_offsets WHERE pipeline = %s AND"
            " topic = %s", (pipeline.name, pipeline.topic)).fetchall())
    consumer = clients.consumer(pipeline.group_id)
    try:
        highs = {p: h for p, (_, h) in watermarks(consumer, pipeline.topic,
                                                  list(range(PARTITIONS))).items()}
        from confluent_kafka import TopicPartition

        group = {tp.partition: tp.offset for tp in consumer.committed(
            [TopicPartition(pipeline.topic, p) for p in range(PARTITIONS)], timeout=30)}
    finally:
        consumer.close()
    source = _read_positions(clients, pipeline.topic)
    ids = Counter(r[0] for r in rows)
    wrong_source = 0
    for event_id, partition, offset in rows:
        value = source.get((int(partition), int(offset)), (None, {}))[0]
        try:
            ok = value is not None and json.loads(value).get("event_id") == event_id
        except (ValueError, AttributeError):  # a row loaded from a poison pill
            ok = False
        wrong_source += not ok
    dead = Counter((int(p), int(o)) for p, o in letters)
    dlq: Counter[tuple[int, int]] = Counter()
    for _, headers in _read_positions(clients, pipeline.dlq_topic).values():
        with contextlib.suppress(ValueError, KeyError):
            dlq[(int(headers["kafka-ingest.partition"]),
                 int(headers["kafka-ingest.offset"]))] += 1
    result = {
        "rows": len(rows),
        "lost_events": len(expected.ids - set(ids)),
        "unexpected_rows": len(set(ids) - expected.ids),
        "duplicated_rows": sum(n - 1 for n in ids.values() if n > 1),
        "rows_from_the_wrong_message": wrong_source,
        "dead_letters": len(letters),
        "poison_missing_from_dead_letters": len(set(expected.poison) - set(dead)),
        "dead_letters_not_poison": len(set(dead) - set(expected.poison)),
        "dead_letters_duplicated": sum(n - 1 for n in dead.values() if n > 1),
        "poison_missing_from_dlq_topic": len(set(expected.poison) - set(dlq)),
        "dlq_topic_extra_copies": sum(n - 1 for n in dlq.values() if n > 1),
        "dlq_topic_not_poison": len(set(dlq) - set(expected.poison)),
        "stored_offsets_at_high_watermarks": stored == highs,
        "group_offsets_at_high_watermarks": group == highs,
        "high_watermarks": highs,
    }
    result["exact"] = (not any(result[k] for k in (
        "lost_events", "unexpected_rows", "duplicated_rows", "rows_from_the_wrong_message",
        "poison_missing_from_dead_letters", "dead_letters_not_poison",
        "dead_letters_duplicated", "poison_missing_from_dlq_topic", "dlq_topic_not_poison"))
        and result["stored_offsets_at_high_watermarks"]
        and result["group_offsets_at_high_watermarks"])
    return result


# --------------------------------------------------------------------------- main


def _airflow_figures(api: Any, dag_id: str) -> dict[str, Any]:
    runs = api.runs(dag_id)
    tis = api.task_instances(dag_id)
    return {"runs": dict(Counter(r["state"] for r in runs)),
            "task_instances": len(tis),
            "task_retries": sum(max(0, int(t.get("try_number") or 1) - 1) for t in tis)}


def _wait(what: str, check_: Callable[[], bool], timeout_s: float, interval_s: float = 2.0,
          ) -> float:
    started = time.monotonic()
    while not check_():
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"soak: {what} did not happen within {timeout_s:.0f} s")
        time.sleep(interval_s)
    return time.monotonic() - started


def _stopped(*threads: Producer | Nemesis) -> None:
    for thread in threads:
        if thread.is_alive():
            raise RuntimeError(f"{thread.name} did not stop in time")
        if thread.error is not None:
            raise RuntimeError(f"{thread.name} failed") from thread.error


def _tear_down(threads: list[Producer | Nemesis | Supervisor], state: Path, *,
               keep: bool) -> None:
    """No thread may act on the stack once it is down (or, with the environment restored,
    on the shared one): stop them all, then the stack; keep the state dir (its pid files,
    its logs) when either did not stop."""
    from kafka_ingest_dev import stack

    for thread in threads:
        thread.stop.set()
    for thread in threads:
        thread.join(600)
        if thread.is_alive():
            log.error("soak: %s still runs; keeping %s", thread.name, state)
            keep = True
    try:
        stack.down(report=log.info)
    except Exception:
        log.exception("soak: stack down failed; keeping %s (its pid files)", state)
        keep = True
    if not keep:
        shutil.rmtree(state, ignore_errors=True)


def soak(settings: Settings) -> dict[str, Any]:
    from kafka_ingest.config import parse_pipelines
    from kafka_ingest.db import Database
    from kafka_ingest.kafka.clients import KafkaClients
    from kafka_ingest.kafka.topics import create_pipeline_topics
    from kafka_ingest_dev import stack
    from kafka_ingest_dev.airflow_services import RestApi
    from kafka_ingest_dev.databases import airflow_postgres_conn, create_database
    from kafka_ingest_dev.procs import child_env

    rng = random.Random(settings.seed)  # noqa: S311 - fault timing, not secrets
    tag = uuid.uuid4().hex[:6]
    threads: list[Producer | Nemesis | Supervisor] = []
    state = Path(tempfile.mkdtemp(prefix="kafka-ingest-soak-", dir="/tmp"))
    with own_stack(state):
        try:
            started = time.monotonic()
            stack.up(report=log.info, brokers=BROKERS, faults=True, replica="async")
            replica = stack.env(replica=True, faults=True)  # Kafka proxied, Postgres both
            proxied = json.loads(replica["KAFKA_INGEST_KAFKA_CONFIG"])
            direct = KafkaClients({"bootstrap.servers": stack.env()["KAFKA_BOOTSTRAP_SERVERS"]})
            doc = _pipelines_doc(tag)
            pipelines = list(parse_pipelines(doc).values())
            pipeline = pipelines[0]
            create_pipeline_topics(direct, pipelines)
            pipelines_file = state / "pipelines.yaml"
            pipelines_file.write_text(json.dumps(doc))
            os.environ["KAFKA_INGEST_PIPELINES"] = str(pipelines_file)
            dsn = create_database(replica["KAFKA_INGEST_PG_ADMIN_DSN"], prefix="soak")
            airflow_env = child_env(replica, SCHEDULER, {
                "KAFKA_INGEST_PIPELINES": str(pipelines_file),
                "AIRFLOW_CONN_POSTGRES_DEFAULT": airflow_postgres_conn(dsn),
                "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({"conn_type": "kafka", "extra": {
                    **proxied, "group.id": stack.KAFKA_GROUP_ID}}),
            })
            stack.up(report=log.info, airflow=True, airflow_env=airflow_env,
                     executor="celery", workers=WORKERS)
            api = RestApi(stack.env(replica=True))
            dag_id = f"{pipeline.name}_ingest"
            _wait(f"{dag_id} to be parsed",
                  lambda: api.client.get(f"/dags/{dag_id}").status_code == 200, 300)
            setup_s = time.monotonic() - started
            db = Database(dsn)
            supervisor = Supervisor(airflow_env, pipelines, direct, db)
            producer = Producer(pipeline, direct, settings.rate, tag)
            nemesis = Nemesis(settings, rng)
            threads += [nemesis, producer, supervisor]
            api.pause(dag_id, False)
            for thread in (supervisor, producer, nemesis):
                thread.start()
            soak_started = time.monotonic()
            while (nemesis.is_alive() and producer.is_alive() and settings.faults_go_on(
                    time.monotonic() - soak_started, nemesis.saw_every_kind())):
                time.sleep(1)
            nemesis.stop.set()
            nemesis.join(600)  # the fault under way is healed first: bounded by its steps
            producer.stop.set()
            producer.join(300)
            soaked_s = time.monotonic() - soak_started
            _stopped(producer, nemesis)
            drain_s = _wait("the pipeline to drain", lambda: supervisor.lag() == 0,
                            settings.drain_timeout_s)
            # Not paused first: a paused DAG's running run never finishes. A run that
            # starts during the check has nothing to read and changes nothing it checks.
            _wait("the last run to end", lambda: not any(
                r["state"] in ("queued", "running") for r in api.runs(dag_id)), 600)
            supervisor.stop.set()
            supervisor.join(60)
            exp = producer.expected
            result = check(pipeline, direct, dsn, exp)
            api.pause(dag_id, True)
            figures = _airflow_figures(api, dag_id)
            return {
                "minutes": settings.minutes, "soaked_s": round(soaked_s), "rate": settings.rate,
                "setup_s": round(setup_s, 1),
                "messages": {"valid": exp.valid, "duplicates": exp.duplicates,
                             "poison": len(exp.poison), "tombstones": exp.tombstones,
                             "undelivered": exp.undelivered,
                             "distinct_events": len(exp.ids)},
                "faults": dict(Counter(f["kind"] for f in nemesis.done)),
                "fault_log": nemesis.done,
                "service_restarts": dict(supervisor.restarts),
                **figures,
                "max_lag_messages": supervisor.max_lag,
                "lag_reads_failed": supervisor.lag_errors,
                "drain_s": round(drain_s, 1),
                "check": result,
            }
        finally:
            _tear_down(threads, state, keep=settings.keep)


def _print(report: dict[str, Any]) -> None:
    check_ = report["check"]
    lines = [
        f"soak: {report['soaked_s']} s of faults at {report['rate']} events/s "
        f"(set-up {report['setup_s']} s)",
        f"messages: {report['messages']}",
        f"faults: {report['faults']}",
        f"Airflow service restarts: {report['service_restarts']}",
        f"runs: {report['runs']}, task instances {report['task_instances']}, "
        f"task retries {report['task_retries']}",
        f"max lag {report['max_lag_messages']} messages; drained {report['drain_s']} s "
        "after the producer and the nemesis stopped",
        f"lost events {check_['lost_events']}, duplicated rows {check_['duplicated_rows']}, "
        f"unexpected rows {check_['unexpected_rows']}, rows from the wrong message "
        f"{check_['rows_from_the_wrong_message']}",
        f"dead letters {check_['dead_letters']} (poison missing "
        f"{check_['poison_missing_from_dead_letters']}, duplicated "
        f"{check_['dead_letters_duplicated']}, not poison {check_['dead_letters_not_poison']})"
        f"; DLQ topic: missing {check_['poison_missing_from_dlq_topic']}, extra copies "
        f"{check_['dlq_topic_extra_copies']}",
        f"stored offsets at the high watermarks: "
        f"{check_['stored_offsets_at_high_watermarks']}; group offsets: "
        f"{check_['group_offsets_at_high_watermarks']}",
        f"exact: {check_['exact']}",
    ]
    print("\n".join(lines), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="how long faults come")
    parser.add_argument("--rate", type=int, default=200, help="events/s produced")
    parser.add_argument("--min-gap", type=float, default=20.0, help="seconds between faults, "
                        "at least")
    parser.add_argument("--max-gap", type=float, default=60.0, help="... and at most")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--report", type=Path, help="write the report here as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the state dir (logs)")
    parser.add_argument("--every-kind", action="store_true", help="go on past --minutes "
                        "until every kind of fault has come once")
    args = parser.parse_args(argv)
    # SIGTERM (a time-out, `kill`) ends the soak through its clean-up: the stack goes down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    settings = Settings(minutes=args.minutes, rate=args.rate, min_gap_s=args.min_gap,
                        max_gap_s=args.max_gap, seed=args.seed, report=args.report,
                        keep=args.keep, every_kind=args.every_kind)
    print(f"soak: seed {settings.seed}", flush=True)
    try:
        report = soak(settings)
    except Exception as exc:  # the report says why, for the test and for CI's log
        log.exception("soak: did not finish")
        if settings.report is not None:
            settings.report.write_text(json.dumps(
                {"error": f"{type(exc).__name__}: {exc}",
                 "traceback": traceback.format_exc()[-6000:]}, indent=2) + "\n")
        return 2
    _print(report)
    if settings.report is not None:
        settings.report.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0 if report["check"]["exact"] else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
