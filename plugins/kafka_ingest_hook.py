"""Airflow's side of Kafka and Postgres for kafka_ingest: a hook, a DSN helper, and the
monitor's alerting (notifiers, failing the task).

``KafkaIngestHook`` subclasses the Kafka provider's ``KafkaBaseHook`` and overrides only
``_get_client``: the connection's extra (the librdkafka dict) becomes a
:class:`kafka_ingest.kafka.reader.KafkaClients`, which forces ``enable.auto.commit=false``,
``enable.auto.offset.store=false`` and ``auto.offset.reset=error`` whatever the connection
says. It never uses ``KafkaConsumerHook.get_consumer()``: that subscribes; we assign.

No side effects at import time (the plugin manager imports every file here).
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from airflow.providers.apache.kafka.hooks.base import KafkaBaseHook
from airflow.sdk import BaseHook, BaseNotifier, Param
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from kafka_ingest.config import NotifierClass
from kafka_ingest.db import Database, libpq_dsn
from kafka_ingest.engine.ingest import rows_changed
from kafka_ingest.errors import PermanentError
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.reader import offsets_for_time, read_range, watermarks
from kafka_ingest.kafka.registry import RegistrySettings, registry_settings_from
from kafka_ingest.ops.monitor import Breach, post_webhook, redact_url
from kafka_ingest.requests import form_fields

log = logging.getLogger(__name__)


class KafkaIngestHook(KafkaBaseHook):
    """Kafka clients for bounded reads, DLQ produce and offset commits.

    :param kafka_config_id: the Kafka connection (its extra is the librdkafka config).
    """

    hook_name = "Apache Kafka (kafka-ingest)"

    def __init__(self, kafka_config_id: str = KafkaBaseHook.default_conn_name) -> None:
        super().__init__(kafka_config_id=kafka_config_id)

    def _get_client(self, config: dict[str, Any]) -> KafkaClients:
        self.log.info("Kafka clients for %s: auto commit and auto offset reset are off; "
                      "offsets are committed after the database commit", self.kafka_config_id)
        return KafkaClients(config)

    @property
    def clients(self) -> KafkaClients:
        client: KafkaClients = self.get_conn
        return client

    def read_range(self, group_id: str, topic: str, partition: int, start: int, end: int,
                   *, chunk_size: int) -> Any:
        """Yield chunks of ``[start, end)`` (assign + seek, never subscribe)."""
        consumer = self.clients.consumer(group_id)
        try:
            yield from read_range(consumer, topic, partition, start, end, chunk_size=chunk_size)
        finally:
            consumer.close()

    def watermarks(self, topic: str, partitions: list[int]) -> dict[int, tuple[int, int]]:
        consumer = self.clients.consumer("kafka-ingest.watermarks")
        try:
            return watermarks(consumer, topic, partitions)
        finally:
            consumer.close()

    def offsets_for_time(self, topic: str, partitions: list[int], when_ms: int) -> dict[int, int]:
        """Per partition, the first offset at or after ``when_ms`` (the high watermark if
        none), so windows built from two calls are half-open."""
        consumer = self.clients.consumer("kafka-ingest.offsets-for-times")
        try:
            return offsets_for_time(consumer, topic, partitions, when_ms)
        finally:
            consumer.close()

    def commit_offsets(self, group_id: str, topic: str, offsets: dict[int, int]) -> bool:
        """Commit ``offsets`` to ``group_id``; whether the group has them (waits at most
        ``socket.timeout.ms``; see :mod:`kafka_ingest.kafka.commits`)."""
        group = self.clients.committer(group_id)
        try:
            for partition, offset in offsets.items():
                group.post(topic, partition, offset)
        finally:
            complete = group.close()
        return complete


def pipeline_clients(pipeline: Any) -> KafkaClients:
    """The Kafka clients of a pipeline's Kafka connection, with its schema registry (from
    ``schema_registry.conn_id``) when its format reads one."""
    clients = KafkaIngestHook(pipeline.kafka_conn_id).clients
    registry = pipeline.schema_registry  # set whenever the format is not JSON (config)
    if not pipeline.format.registry or registry is None:
        return clients
    return clients.with_registry(registry_settings(registry.conn_id))


def registry_settings(conn_id: str) -> RegistrySettings:
    """The schema registry of an Airflow ``http`` connection (see
    :func:`kafka_ingest.kafka.registry.registry_settings_from`)."""
    conn = BaseHook.get_connection(conn_id)
    return registry_settings_from(source=f"Airflow connection {conn_id!r}", host=conn.host,
                                  port=conn.port, scheme=conn.schema, login=conn.login,
                                  password=conn.password, extra=conn.extra_dejson)


def postgres_database(conn_id: str) -> Database:
    """A :class:`Database` for an Airflow Postgres connection: host, port, login, password,
    database (the connection's schema), and every libpq keyword of its extra (``sslmode``,
    ``sslrootcert``, ``sslcert``, ``sslkey``, ``options``, ...). No host or no database is
    a permanent error naming the connection.

    Writes go through psycopg 3 in one transaction per chunk, never through
    ``DbApiHook.insert_rows`` (it commits per batch on its own connection).
    """
    conn = BaseHook.get_connection(conn_id)
    return Database(libpq_dsn(source=f"Airflow connection {conn_id!r}", host=conn.host,
                              port=conn.port, user=conn.login, password=conn.password,
                              dbname=conn.schema, extra=conn.extra_dejson))


@contextmanager
def fail_without_retry() -> Iterator[None]:
    """Fail the task at once (no retry) for a :class:`~kafka_ingest.errors.PermanentError`:
    a retention gap, counts that do not reconcile, a trigger form that cannot be honoured,
    credentials the cluster refuses. Every other error propagates unchanged, so Airflow
    retries it with backoff."""
    try:
        yield
    except PermanentError as exc:
        raise AirflowFailException(f"{type(exc).__name__}: {exc}") from exc


def form_params(form: Any) -> dict[str, Param]:
    """A DAG's ``params`` generated from a trigger-form model of :mod:`kafka_ingest.requests`
    (titles, descriptions, limits; optional fields nullable), so the form, the CLI and the
    checks share one definition."""
    return {name: Param(default, **schema) for name, (default, schema) in
            form_fields(form).items()}


METRICS = ("read", "inserted", "duplicates", "stale", "dead_lettered", "known_dead", "tombstones",
           "bytes",
           "lag_after", "dlq_rate", "recovered", "still_parked", "total_lag", "group_lag",
           "parked")


def emit_metrics(kind: str, pipeline: str, summary: dict[str, Any]) -> None:
    """Send a run's sums to Airflow's metrics (StatsD or OpenTelemetry, as configured).

    Each figure goes out twice, as Airflow's own metrics do: ``kafka_ingest.<kind>.<name>``
    tagged with the pipeline (OpenTelemetry, DogStatsD), and
    ``kafka_ingest.<kind>.<pipeline>.<name>`` for plain StatsD, which drops tags (without
    the name, two pipelines would overwrite each other's gauge).
    """
    from airflow.sdk.observability.stats import Stats

    for name in METRICS:
        value = summary.get(name)
        if isinstance(value, int | float):
            Stats.gauge(f"kafka_ingest.{kind}.{name}", value, tags={"pipeline": pipeline})
            Stats.gauge(f"kafka_ingest.{kind}.{pipeline}.{name}", value)


def dag_default_args(pipeline: Any) -> dict[str, Any]:
    """Task defaults of every DAG of a pipeline: its owner, and retries that back off
    exponentially from 10 s to 10 min (infrastructure errors heal; see errors.py)."""
    return {
        "owner": pipeline.owner,
        "retries": pipeline.retries,
        "retry_delay": timedelta(seconds=10),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(minutes=10),
        "execution_timeout": timedelta(minutes=pipeline.task_timeout_minutes),
    }


def slice_task_args(pipeline: Any) -> dict[str, Any]:
    """Arguments of the mapped slice tasks (ingest, replay): the pipeline's Airflow pool
    (``default_pool`` when it names none) and how many of one run's slices may run at once,
    so a topic with many partitions does not open as many Postgres writers together."""
    return {"pool": pipeline.pool or "default_pool",
            "max_active_tis_per_dagrun": pipeline.max_parallel_partitions}


def table_updated_task(pipeline: Any) -> Any:
    """A task that updates the target table's Airflow Asset, only when rows changed
    (inserted, updated or deleted: :func:`~kafka_ingest.engine.ingest.rows_changed`).

    Asset-scheduled downstream DAGs then run on new data, not on every empty
    micro-batch; with nothing changed the task is skipped and no Asset event is sent.
    """
    from airflow.sdk import Asset, task

    @task(task_id="table_updated", outlets=[Asset(pipeline.asset_uri)])
    def table_updated(summary: dict[str, Any]) -> int:
        if summary.get("dry_run"):
            raise AirflowSkipException("a dry run wrote nothing: the table's Asset is not updated")
        changed = rows_changed(summary)
        if not changed:
            raise AirflowSkipException("no row was inserted, updated or deleted: the table's "
                                       "Asset is not updated")
        return changed

    return table_updated


# --------------------------------------------------------------------------- alerting


def _build_notifier(ref: NotifierClass) -> Any:
    """Import ``ref``'s class by its dotted path and build it with its kwargs."""
    module, _, name = ref.class_path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    notifier = cls(**ref.kwargs)
    if not callable(getattr(notifier, "notify", None)):
        raise TypeError(f"{ref.class_path} is not a notifier (it has no notify(context))")
    return notifier


def notify_breaches(pipeline: Any, breaches: Sequence[Breach],
                    context: Mapping[str, Any]) -> list[str]:
    """Tell every notifier of ``pipeline.alerts.notifiers`` about ``breaches``; return the
    notifiers that failed (each is logged; none stops the others or hides the breach).

    A webhook URL gets one POST per breach, JSON ``{pipeline, rule, message, figures}``
    with a 10 s time-out. An Airflow notifier class is built with its kwargs and called
    once with the task's context plus ``pipeline``, ``breaches`` (their dicts) and
    ``message`` (one line per breach): a ``BaseNotifier`` through its ``__call__``, which
    renders its templated fields first (``{{ message }}`` works), anything else through
    ``notify(context)``. Webhook URLs are logged without their path (it may hold a secret).
    """
    if not breaches:
        return []
    extra = {"pipeline": pipeline.name, "breaches": [b.to_dict() for b in breaches],
             "message": "\n".join(b.message for b in breaches)}
    failed = []
    for ref in pipeline.alerts.notifiers:
        target = redact_url(ref) if isinstance(ref, str) else ref.class_path
        try:
            if isinstance(ref, str):
                for breach in breaches:
                    post_webhook(ref, breach)
            else:
                notifier = _build_notifier(ref)
                call = notifier if isinstance(notifier, BaseNotifier) else notifier.notify
                call({**context, **extra})
        except Exception as exc:  # any notifier's failure is logged; the breach still fails
            log.error("%s: notifier %s failed: %s: %s", pipeline.name, target,
                      type(exc).__name__, exc)
            failed.append(target)
        else:
            log.info("%s: notifier %s told of %d breach(es)", pipeline.name, target,
                     len(breaches))
    return failed


def alert_on_breaches(pipeline: Any, breaches: Sequence[Breach],
                      context: Mapping[str, Any]) -> None:
    """:func:`alert_on_checks` of one pipeline."""
    alert_on_checks([(pipeline, breaches)], context)


def alert_on_checks(found: Sequence[tuple[Any, Sequence[Breach]]],
                    context: Mapping[str, Any], *, unknown: Sequence[str] = ()) -> None:
    """On any breach: call each breaching pipeline's notifiers, then fail the task without
    retry (the next scheduled check judges again) with a message naming each pipeline,
    rule and figures, and each pipeline whose lag was ``unknown`` (a missing topic), so
    Airflow's own failure alerting fires too."""
    lines, failed = [], []
    for pipeline, breaches in found:
        failed += notify_breaches(pipeline, breaches, context)
        lines += [f"{b.message} (figures: {json.dumps(b.figures, default=str)})"
                  for b in breaches]
    if not lines and not unknown:
        return
    note = f"; notifiers that failed: {', '.join(failed)}" if failed else ""
    text = f"{len(lines)} alert rule(s) breached: " + " | ".join(lines) if lines else ""
    if unknown:
        text += ("; " if text else "") + "lag not known: " + " | ".join(unknown)
    raise AirflowFailException(text + note)
