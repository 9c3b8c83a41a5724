"""Prometheus metrics of every pipeline, from one :class:`kafka_ingest.ops.observe.Snapshot`.

Served two ways, by this one implementation: the Airflow plugin's FastAPI app on the
api-server (``/kafka-ingest/metrics``) and ``kafka-ingest exporter --port N`` for teams that
scrape outside Airflow. Names follow Prometheus' conventions: the ``kafka_ingest_`` prefix,
base units (``_seconds``, ``_messages``), counters ending in ``_total``, labels ``pipeline``,
``topic``, ``partition`` (and ``mode``, ``reason``, ``rule``, ``component``).

Every scrape answers 200: a cluster or database out of reach shows as
``kafka_ingest_up{component,connection} 0`` and the figures that needed it are absent
(never made up, never a stale copy passed off as current). :data:`METRICS` lists each
metric with its help text; a test keeps the metric table of docs/operations.md in step
with it.
"""

from __future__ import annotations

import hmac
import logging
import signal
import threading
import time
from collections.abc import Callable, Collection, Iterator
from types import FrameType
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kafka_ingest.errors import SettingsError
from kafka_ingest.ops.lag import LagRow
from kafka_ingest.ops.observe import PipelineView, Snapshot, SnapshotCache
from kafka_ingest.ops.rules import RULES, judged
from kafka_ingest.records import COUNTERS, EXPORTED, counter

log = logging.getLogger(__name__)

PREFIX = "kafka_ingest_"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PART = ("pipeline", "topic", "partition")
#: The ledger's counters exported (:data:`~kafka_ingest.records.EXPORTED`): the field of
#: :class:`~kafka_ingest.records.ChunkCounts` -> its metric.
LEDGER_METRICS: dict[str, str] = {c: counter(c).metric for c in EXPORTED}

#: name (without the prefix; counters without ``_total``) -> (type, labels, help).
METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "up": ("gauge", ("component", "connection"),
           "1 if the last look reached the component (kafka, postgres) through the "
           "connection, 0 if not"),
    "snapshot_seconds": ("gauge", (), "How long the last look at the pipelines took"),
    "snapshot_age_seconds": ("gauge", (), "Seconds since the look these figures come from"),
    "pipeline_info": ("gauge", ("pipeline", "topic", "table", "format"),
                      "1 for each pipeline of the pipelines file"),
    "lag_known": ("gauge", ("pipeline",),
                  "1 if the lag of the pipeline could be read, 0 if not (a missing topic, "
                  "the cluster or the database out of reach)"),
    "lag_messages": ("gauge", PART,
                     "Messages not yet ingested: the high watermark minus the stored offset "
                     "(Postgres, the source of truth)"),
    "group_lag_messages": ("gauge", PART,
                           "The high watermark minus the consumer group's committed offset "
                           "(what Kafka lag tools see); absent when the group has none"),
    "stored_offset": ("gauge", PART, "The next offset to ingest, as stored in Postgres"),
    "high_watermark": ("gauge", PART, "The partition's high watermark"),
    "oldest_unread_age_seconds": ("gauge", PART,
                                  "Age of the oldest message not yet ingested (0: none)"),
    **{metric: ("counter", ("pipeline", "mode"), counter(c).metric_help)
       for c, metric in LEDGER_METRICS.items()},
    "dlq_ratio": ("gauge", ("pipeline",),
                  "Dead letters / messages read by the live chunks of the alert window"),
    "parked_letters": ("gauge", ("pipeline", "reason"),
                       "Dead letters still parked, by reason (error class)"),
    "last_live_commit_timestamp_seconds": ("gauge", ("pipeline",),
                                           "When the newest live chunk was committed"),
    "last_live_commit_age_seconds": ("gauge", ("pipeline",),
                                     "Seconds since the newest live chunk was committed"),
    "last_run_success": ("gauge", ("pipeline",),
                         "1 if the ingest DAG's newest finished run succeeded, 0 if it "
                         "failed (served by the Airflow plugin only)"),
    "last_run_end_timestamp_seconds": ("gauge", ("pipeline",),
                                       "When the ingest DAG's newest finished run ended"),
    "alert_limit": ("gauge", ("pipeline", "rule"),
                    "The limit of each alert rule, from the pipelines file"),
    "alert_breached": ("gauge", ("pipeline", "rule"),
                       "1 if the rule is breached now (judged as the monitor DAG judges)"),
}


class _Families:
    """Metric families by name, filled as the snapshot is walked."""

    def __init__(self) -> None:
        self.found: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}

    def add(self, name: str, labels: tuple[str, ...], value: float) -> None:
        family = self.found.get(name)
        if family is None:
            kind, names, text = METRICS[name]
            family = self.found[name] = (
                CounterMetricFamily(PREFIX + name, text, labels=list(names)) if kind == "counter"
                else GaugeMetricFamily(PREFIX + name, text, labels=list(names)))
        family.add_metric(list(labels), value)


def families(snap: Snapshot, *, now: float | None = None) -> list[Metric]:
    """The metrics of ``snap``, in :data:`METRICS` order."""
    now = time.time() if now is None else now
    out = _Families()
    for (component, connection), ok in sorted(snap.up.items()):
        out.add("up", (component, connection), 1.0 if ok else 0.0)
    out.add("snapshot_seconds", (), snap.seconds)
    out.add("snapshot_age_seconds", (), max(0.0, now - snap.taken_at))
    for view in snap.views:
        _pipeline(out, view, now)
    return [out.found[n] for n in METRICS if n in out.found]


def _pipeline(out: _Families, view: PipelineView, now: float) -> None:
    p, name = view.pipeline, view.name
    out.add("pipeline_info", (name, p.topic, p.table, p.format.value), 1.0)
    out.add("lag_known", (name,), 0.0 if view.lag_rows is None else 1.0)
    for row in view.lag_rows or ():
        _partition(out, view, row, now)
    for mode, counts in sorted(view.totals.items()):
        for c, metric in LEDGER_METRICS.items():
            out.add(metric, (name, mode), getattr(counts, c))
    for rule in RULES:
        out.add("alert_limit", (name, rule.name), float(rule.limit(p.alerts)))
    if view.result is not None:
        _judged(out, view, now)
    if view.outcome is not None:
        out.add("last_run_success", (name,), 1.0 if view.outcome.succeeded else 0.0)
        out.add("last_run_end_timestamp_seconds", (name,), view.outcome.ended_at)


def _partition(out: _Families, view: PipelineView, row: LagRow, now: float) -> None:
    part = (view.name, row.topic, str(row.partition))
    out.add("lag_messages", part, max(0, row.lag))
    if row.group_lag is not None:
        out.add("group_lag_messages", part, max(0, row.group_lag))
    if row.stored_offset is not None:
        out.add("stored_offset", part, row.stored_offset)
    out.add("high_watermark", part, row.high)
    since = view.oldest_unread.get(row.partition)
    if row.lag <= 0:
        out.add("oldest_unread_age_seconds", part, 0.0)
    elif since is not None:
        out.add("oldest_unread_age_seconds", part, max(0.0, now - since))


def _judged(out: _Families, view: PipelineView, now: float) -> None:
    """What needs the database: the monitor's figures and the rules judged now."""
    assert view.result is not None  # noqa: S101 (the caller checked)
    name, f = view.name, view.result.figures
    if f.dlq_rate is not None:
        out.add("dlq_ratio", (name,), f.dlq_rate)
    for reason, n in sorted(view.parked_by_reason.items()):
        out.add("parked_letters", (name, reason), n)
    if f.last_live_commit is not None:
        at = f.last_live_commit.timestamp()
        out.add("last_live_commit_timestamp_seconds", (name,), at)
        out.add("last_live_commit_age_seconds", (name,), max(0.0, now - at))
    for rule in judged(lag_known=f.total_lag is not None):
        out.add("alert_breached", (name, rule.name), 1.0 if rule.name in view.breached else 0.0)


class SnapshotCollector(Collector):
    """A ``prometheus_client`` collector over a :class:`SnapshotCache`; ``pipelines``: the
    names of the pipelines to export (:meth:`Snapshot.only`), ``None`` for every one."""

    def __init__(self, cache: SnapshotCache, *,
                 pipelines: Collection[str] | None = None) -> None:
        self.cache = cache
        self.pipelines = pipelines

    def collect(self) -> Iterator[Metric]:
        snap = self.cache.get()
        yield from families(snap if self.pipelines is None else snap.only(self.pipelines))


def registry_of(cache: SnapshotCache, *,
                pipelines: Collection[str] | None = None) -> CollectorRegistry:
    """A registry of its own (not the process-wide default one) with the collector of
    ``pipelines`` (``None``: every pipeline)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(cache, pipelines=pipelines))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """The text exposition format Prometheus scrapes."""
    return generate_latest(registry)


def token_matches(authorization: str | None, token: str | None) -> bool:
    """Whether an ``Authorization: Bearer <token>`` header carries ``token`` (compared in
    constant time); never true without a configured token."""
    if not token or not authorization:
        return False
    scheme, _, given = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(),
                                                              token.encode())


def serve(cache: SnapshotCache, *, host: str, port: int,
          stop: threading.Event | None = None,
          ready: Callable[[int], None] | None = None) -> None:
    """Serve ``/metrics`` on ``host:port`` until SIGTERM/SIGINT (or ``stop`` is set).
    ``ready`` is called with the port once listening (0 picks a free one). An address it
    cannot listen on (the port held by another process, a host that is not this
    machine's) is a :class:`SettingsError` naming it."""
    from prometheus_client.exposition import start_http_server

    stop = stop or threading.Event()
    try:
        server, thread = start_http_server(port, addr=host, registry=registry_of(cache))
    except OSError as exc:
        raise SettingsError(
            f"the exporter cannot listen on {host}:{port}: {exc.strerror or exc}; stop the "
            "process that holds the port, or choose another with --port (or another "
            "address with --host)") from exc
    bound = int(server.server_address[1])
    if threading.current_thread() is threading.main_thread():
        def _stop(signum: int, _frame: FrameType | None) -> None:
            log.info("signal %d: stopping the exporter", signum)
            stop.set()
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
    log.info("kafka-ingest exporter: http://%s:%d/metrics", host, bound)
    if ready is not None:
        ready(bound)
    try:
        stop.wait()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


#: The generated counters block's markers in the docs (``tests/unit/test_counters.py``).
COUNTERS_BEGIN = ("<!-- generated from kafka_ingest.records.ChunkCounts: do not edit by "
                  "hand -->")
COUNTERS_END = "<!-- end of the generated counters -->"


def counters_table() -> str:
    """The chunk counters as a Markdown block: each counter (a column of ``ingest_runs``,
    ``ingest_totals`` and ``kafka-ingest status``'s recent chunks, and a sum of a run's
    report), what it counts, whether it is one of the terms that sum to ``read``, whether
    a replay's report sums it, and its Prometheus counter."""
    rows = ["| counter | what it counts | one of the terms of `read` | in a replay's report "
            "| Prometheus counter |", "|---|---|---|---|---|"]
    for c in COUNTERS:
        info = counter(c)
        metric = f"`{PREFIX}{info.metric}_total`" if info.metric else "&ndash;"
        rows.append(f"| `{c}` | {info.help} | {'yes' if info.accounted else ''} | "
                    f"{'yes' if info.replayed else ''} | {metric} |")
    return "\n\n".join([COUNTERS_BEGIN, "\n".join(rows), COUNTERS_END]) + "\n"


def describe() -> list[dict[str, Any]]:
    """The metric table: name, type, labels, help (for docs/operations.md and ``--list``)."""
    return [{"name": PREFIX + n + ("_total" if kind == "counter" else ""), "type": kind,
             "labels": ",".join(labels), "help": text}
            for n, (kind, labels, text) in METRICS.items()]
