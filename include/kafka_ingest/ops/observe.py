"""One look at every pipeline, for the Prometheus metrics and the pipelines page.

:func:`snapshot` reads, for each pipeline: the lag per partition (:func:`kafka_ingest.ops.
lag.lags`: Kafka's watermarks against the stored offsets, and the consumer group's
offsets), the age of the oldest unread message (the timestamp of the message at the stored
offset), the monitor's figures and the rules they breach now (:func:`kafka_ingest.ops.
monitor.check`, nothing recorded), the ledger's totals by mode (``ingest_totals``: counters
kept as chunks commit, which survive restarts and the ledger's retention and never go
backwards), the parked dead letters by reason, and, where the caller can tell (the
Airflow plugin), the outcome of the ingest DAG's last run. Each of these reads costs
the same however long the history: summaries and indexes, never a scan of the ledger or
of the recovered dead letters (``tests/integration/test_look_cost.py``).

Pipelines are grouped by their Kafka and Postgres connections; each group's cluster and
database are asked once for all its pipelines, every request bounded by ``timeout_s``. A
cluster or database out of reach is not an error here: the snapshot says which is down
(:attr:`Snapshot.up`) and shows what the other one could tell.

:class:`SnapshotCache` keeps the last snapshot for a few seconds, so scrapes from several
Prometheus servers and page views cost one look, and a slow broker is asked once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from kafka_ingest.config import Pipeline
from kafka_ingest.db import Database
from kafka_ingest.db.observations import LedgerLooks, LetterLooks
from kafka_ingest.errors import IngestError, KafkaRefused, KafkaUnavailable, SettingsError
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.metadata import first_timestamps
from kafka_ingest.ops.lag import LagRow, lags
from kafka_ingest.ops.monitor import CheckResult, check
from kafka_ingest.records import ChunkCounts

log = logging.getLogger(__name__)

#: How long one request of a snapshot may wait, unless the caller says otherwise: under
#: Prometheus' default scrape time-out (10 s) with room for the rest of the scrape.
DEFAULT_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class RunOutcome:
    """How the ingest DAG's newest finished run ended (known to the Airflow plugin)."""

    state: str
    run_id: str
    ended_at: float  # seconds since the epoch

    @property
    def succeeded(self) -> bool:
        return self.state == "success"


@dataclass(frozen=True, kw_only=True)
class PipelineView:
    """What one snapshot knows of one pipeline; ``None``: could not be known."""

    pipeline: Pipeline
    #: Rows of :func:`kafka_ingest.ops.lag.lag`; ``None`` with ``lag_error`` saying why.
    lag_rows: tuple[LagRow, ...] | None = None
    lag_error: str | None = None
    #: Per partition, the timestamp (epoch seconds) of the oldest message not ingested.
    oldest_unread: Mapping[int, float] = field(default_factory=dict)
    #: The monitor's figures and the rules breached now; ``None``: the database was down.
    result: CheckResult | None = None
    #: mode (``live``, ``backfill``, ``replay``) -> the ledger's counters over every chunk.
    totals: Mapping[str, ChunkCounts] = field(default_factory=dict)
    parked_by_reason: Mapping[str, int] = field(default_factory=dict)
    outcome: RunOutcome | None = None

    @property
    def name(self) -> str:
        return self.pipeline.name

    @property
    def total_lag(self) -> int | None:
        return None if self.result is None else self.result.figures.total_lag

    @property
    def breached(self) -> frozenset[str]:
        """The rules (``alerts`` keys) breached now."""
        return frozenset(() if self.result is None else (b.rule for b in self.result.breaches))


@dataclass(frozen=True)
class Snapshot:
    views: tuple[PipelineView, ...]
    #: ``(component, connection) -> reachable``, component ``kafka`` or ``postgres``.
    up: Mapping[tuple[str, str], bool]
    taken_at: float  # seconds since the epoch
    seconds: float  # how long the look took

    def view(self, name: str) -> PipelineView | None:
        return next((v for v in self.views if v.name == name), None)

    def only(self, names: Collection[str]) -> Snapshot:
        """This snapshot as a caller who may see only the pipelines ``names`` sees it:
        their views, and the reachability of the connections they use (the ids of the
        others' connections are none of theirs). The look's time is everyone's."""
        views = tuple(v for v in self.views if v.name in names)
        used = {key for v in views for key in (("kafka", v.pipeline.kafka_conn_id),
                                               ("postgres", v.pipeline.postgres_conn_id))}
        return replace(self, views=views, up={k: ok for k, ok in self.up.items() if k in used})


@dataclass(frozen=True)
class Sources:
    """How to reach a pipeline's cluster and database: from Airflow's connections in the
    plugin, from the environment in the CLI's exporter. ``outcomes``: the ingest DAGs'
    last runs by pipeline name, where the caller can tell."""

    clients: Callable[[Pipeline], KafkaClients]
    database: Callable[[Pipeline], Database]
    outcomes: Callable[[Sequence[Pipeline]], Mapping[str, RunOutcome]] | None = None


def snapshot(pipelines: Sequence[Pipeline], sources: Sources, *,
             timeout_s: float = DEFAULT_TIMEOUT_S) -> Snapshot:
    """Every pipeline, as one snapshot (see the module's text)."""
    started = time.monotonic()
    groups: dict[tuple[str, str], list[Pipeline]] = {}
    for p in pipelines:
        groups.setdefault((p.kafka_conn_id, p.postgres_conn_id), []).append(p)
    up: dict[tuple[str, str], bool] = {}
    views: dict[str, PipelineView] = {}
    for (kafka_id, pg_id), members in groups.items():
        kafka_ok, pg_ok, found = _look(members, sources, timeout_s)
        up[("kafka", kafka_id)] = up.get(("kafka", kafka_id), True) and kafka_ok
        up[("postgres", pg_id)] = up.get(("postgres", pg_id), True) and pg_ok
        views.update(found)
    outcomes: Mapping[str, RunOutcome] = {}
    if sources.outcomes is not None:
        try:
            outcomes = sources.outcomes(pipelines)
        except Exception:  # the page and the metrics go on without the last runs
            log.exception("the ingest DAGs' last runs could not be read")
    ordered = tuple(_with_outcome(views[p.name], outcomes.get(p.name)) for p in pipelines)
    return Snapshot(ordered, up, time.time(), time.monotonic() - started)


def _with_outcome(view: PipelineView, outcome: RunOutcome | None) -> PipelineView:
    if outcome is None:
        return view
    return replace(view, outcome=outcome)


def _look(members: Sequence[Pipeline], sources: Sources, timeout_s: float
          ) -> tuple[bool, bool, dict[str, PipelineView]]:
    """One group's cluster and database: (kafka up, postgres up, views)."""
    kafka_ok = pg_ok = True
    errors: dict[str, str] = {}
    rows: dict[str, list[LagRow]] = {}
    oldest: dict[tuple[str, int], float] = {}
    try:
        db = sources.database(members[0])
    except Exception as exc:  # no such Airflow connection, a DSN libpq refuses
        log.warning("pipelines %s: no database: %s", ", ".join(p.name for p in members), exc)
        return True, False, {p.name: PipelineView(pipeline=p, lag_error=f"lag not known: {exc}")
                             for p in members}
    try:
        clients = sources.clients(members[0])
        for name, found in lags(members, clients, db, timeout_s=timeout_s).items():
            if isinstance(found, IngestError):
                errors[name] = str(found)
            else:
                rows[name] = found
        oldest = _oldest_unread(clients, [r for rs in rows.values() for r in rs], timeout_s)
    except (KafkaUnavailable, KafkaRefused, SettingsError, ValueError) as exc:
        kafka_ok = False  # the cluster out of reach, refused, or not configured
        errors = dict.fromkeys((p.name for p in members), f"lag not known: {exc}")
        rows = {}
    except IngestError as exc:  # Kafka answered; the stored offsets did not
        pg_ok = False
        errors = dict.fromkeys((p.name for p in members), f"lag not known: {exc}")
        rows = {}
    except Exception as exc:  # e.g. the Kafka connection is missing in Airflow
        log.exception("pipelines %s: lag not read", ", ".join(p.name for p in members))
        kafka_ok = False
        errors = dict.fromkeys((p.name for p in members), f"lag not known: {exc}")
        rows = {}
    views: dict[str, PipelineView] = {}
    try:
        with db.session() as conn:
            for p in members:
                lag_rows = rows.get(p.name)
                views[p.name] = PipelineView(
                    pipeline=p, lag_rows=None if lag_rows is None else tuple(lag_rows),
                    lag_error=errors.get(p.name),
                    oldest_unread={part: ts for (t, part), ts in oldest.items()
                                   if t == p.topic and lag_rows is not None},
                    result=check(p, lag_rows, conn, record_check=False),
                    totals=LedgerLooks(conn).totals(p.name),
                    parked_by_reason=LetterLooks(conn).parked_by_reason(p.name))
                conn.rollback()  # read only: end each pipeline's snapshot of the database
    except Exception as exc:  # IngestError, or a psycopg error the mapping left alone
        pg_ok = False
        log.warning("pipelines %s: the database is out of reach: %s",
                    ", ".join(p.name for p in members), exc)
        views = {p.name: PipelineView(pipeline=p, lag_error=errors.get(
            p.name, f"lag not known: {exc}")) for p in members}
    return kafka_ok, pg_ok, views


def _oldest_unread(clients: KafkaClients, rows: Sequence[LagRow],
                   timeout_s: float) -> dict[tuple[str, int], float]:
    """The timestamp of the first message not ingested, per lagging partition."""
    positions = {(r.topic, r.partition): r.next_unread for r in rows if r.lag > 0}
    if not positions:
        return {}
    consumer = clients.consumer("kafka-ingest.metrics")
    try:
        return first_timestamps(consumer, positions, timeout_s=timeout_s)
    finally:
        consumer.close()


class SnapshotCache:
    """The newest snapshot, taken again when older than ``max_age_s``. One look at a
    time: while one is under way, a caller gets the previous snapshot at once (the very
    first look is waited for), so scrapes and page views never queue behind a slow
    broker in the api-server's thread pool; a look that failed is remembered for
    ``max_age_s`` too, so a failing source is asked once per period, not once per caller."""

    def __init__(self, take: Callable[[], Snapshot], *, max_age_s: float = 10.0) -> None:
        self._take = take
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._last: Snapshot | None = None
        self._at = 0.0
        self._error: tuple[float, Exception] | None = None

    def get(self) -> Snapshot:
        last = self._last
        if not self._lock.acquire(blocking=last is None):
            assert last is not None  # noqa: S101 (a non-blocking acquire only with one)
            return last  # a look is under way: the previous one meanwhile
        try:
            now = time.monotonic()
            if self._last is not None and now - self._at <= self.max_age_s:
                return self._last
            if self._error is not None and now - self._error[0] <= self.max_age_s:
                raise self._error[1]
            try:
                self._last, self._at, self._error = self._take(), time.monotonic(), None
            except Exception as exc:
                self._error = (time.monotonic(), exc)
                raise
            return self._last
        finally:
            self._lock.release()

    def clear(self) -> None:
        with self._lock:
            self._last, self._error = None, None
