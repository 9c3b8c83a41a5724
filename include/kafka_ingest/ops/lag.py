"""How far behind a pipeline is, per partition: :class:`LagRow`, and the reader that makes
them (:class:`LagReader`, :func:`lag`, :func:`lags`).

One typed row per partition, read by everything that shows or judges the lag:
``kafka-ingest lag``, ``kafka-ingest status``, the monitor's rules
(:mod:`kafka_ingest.ops.monitor`), the Prometheus metrics and the pipelines page (through
:mod:`kafka_ingest.ops.observe`), and the lag trigger of ``on_data`` pipelines
(:mod:`kafka_ingest.ops.watch`, ``plugins/kafka_ingest_triggers.py``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kafka_ingest.config import Pipeline
from kafka_ingest.db import Database, OffsetsRepository, translate_errors
from kafka_ingest.errors import IngestError, KafkaRefused, KafkaUnavailable, TopicMissing
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.metadata import group_offsets, topic_partitions, watermarks

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class LagRow:
    """One partition of a pipeline's source topic: where the pipeline stands and where
    Kafka is.

    :attr:`lag` is the truth, from the stored offset (Postgres is the source of truth): the
    high watermark minus the stored offset, or minus the low watermark when nothing is
    stored yet. :attr:`group_lag` is what lag tools (``kafka-consumer-groups``, Burrow) see,
    from the consumer group's committed offset (``None`` when the group has none). They
    differ after a kill between the database commit and the Kafka commit, until the next
    live run re-syncs the group to the stored offset. Either is negative when the stored
    (committed) offset is past the high watermark; the totals count that as 0."""

    pipeline: str
    topic: str
    partition: int
    #: The next offset to ingest, as stored in Postgres (None: nothing stored yet).
    stored_offset: int | None
    #: The consumer group's committed offset (None: none, or not asked).
    group_offset: int | None
    low: int
    high: int

    @property
    def lag(self) -> int:
        return self.high - (self.stored_offset if self.stored_offset is not None else self.low)

    @property
    def group_lag(self) -> int | None:
        return None if self.group_offset is None else self.high - self.group_offset

    @property
    def next_unread(self) -> int:
        """The offset of the first message not ingested (the low watermark when the stored
        offset is below it, or nothing is stored)."""
        return max(self.low, self.stored_offset if self.stored_offset is not None else 0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, both lags included (``kafka-ingest lag``'s table)."""
        return {**asdict(self), "lag": self.lag, "group_lag": self.group_lag}


def total_lag(rows: Iterable[LagRow]) -> int:
    """The lag summed over the partitions, a negative one counted as 0."""
    return sum(max(0, r.lag) for r in rows)


def total_group_lag(rows: Sequence[LagRow]) -> int | None:
    """The group's lag summed the same way; None unless every partition has one."""
    lags = [r.group_lag for r in rows]
    if not rows or any(g is None for g in lags):
        return None
    return sum(max(0, g) for g in lags if g is not None)


def lag(pipeline: Pipeline, clients: KafkaClients, db: Database) -> list[LagRow]:
    """Per partition of ``pipeline``'s topic, its :class:`LagRow`; a missing topic raises
    :class:`~kafka_ingest.errors.TopicMissing`."""
    found = lags([pipeline], clients, db)[pipeline.name]
    if isinstance(found, IngestError):
        raise found
    return found


def lags(pipelines: Sequence[Pipeline], clients: KafkaClients, db: Database, *,
         timeout_s: float | None = None) -> dict[str, list[LagRow] | IngestError]:
    """:func:`lag` of several pipelines of one cluster and database (see
    :class:`LagReader`), with clients and a connection of their own, closed after."""
    with LagReader(clients, db, timeout_s=timeout_s) as reader:
        return reader.read(pipelines)


class LagReader:
    """Reads the lag of many pipelines of one cluster and one database, again and again
    (the lag trigger's loop), over one consumer, one admin client and one Postgres
    connection kept between reads: per read, one metadata request, the watermarks, one
    admin request per consumer group and one query.

    :meth:`read` gives, per pipeline, its rows (as :func:`lag`'s) or the error that kept
    them from being known (a missing topic), so one pipeline's trouble does not hide the
    others'; a cluster or database out of reach raises, and the clients and connection are
    made anew at the next read. Every request waits ``timeout_s`` at most (default: the
    config's ``socket.timeout.ms``).
    """

    def __init__(self, clients: KafkaClients, db: Database, *,
                 timeout_s: float | None = None) -> None:
        self.clients, self.db = clients, db
        self.timeout_s = timeout_s or clients.request_timeout_s
        self._consumer: Any = None
        self._admin: Any = None
        self._conn: Any = None
        #: A read and a close never overlap (the trigger closes from another thread).
        self._lock = threading.Lock()

    def __enter__(self) -> LagReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        consumer, conn = self._consumer, self._conn
        self._consumer = self._admin = self._conn = None
        if consumer is not None:
            consumer.close()
        if conn is not None:
            conn.close()

    def read(self, pipelines: Sequence[Pipeline], *, group: bool = True
             ) -> dict[str, list[LagRow] | IngestError]:
        """``group=False``: leave the consumer groups' offsets out (``group_offset`` and
        ``group_lag`` None), one admin request per pipeline fewer (the lag trigger's
        reads, which judge by the stored offsets only)."""
        with self._lock:
            try:
                return self._read(pipelines, group)
            except BaseException:
                self._close()  # whatever broke, the next read starts afresh
                raise

    def _read(self, pipelines: Sequence[Pipeline], group: bool
              ) -> dict[str, list[LagRow] | IngestError]:
        wait_s = self.timeout_s
        if self._consumer is None:
            self._consumer = self.clients.consumer("kafka-ingest.lag")
            self._admin = self.clients.admin()
        self._consumer.poll(0)  # serve its queued events (it is kept between reads)
        out: dict[str, list[LagRow] | IngestError] = {}
        marks: dict[str, dict[int, tuple[int, int]]] = {}
        topics = topic_partitions(self._consumer, timeout_s=wait_s)
        for p in pipelines:
            if p.topic not in topics:
                out[p.name] = TopicMissing(p.topic)
                continue
            marks[p.name] = watermarks(self._consumer, p.topic, topics[p.topic],
                                       timeout_s=wait_s)
        live = [p for p in pipelines if p.name in marks]
        try:
            groups = group_offsets(self._admin, [(p.group_id, p.topic, list(marks[p.name]))
                                                 for p in live if group], timeout_s=wait_s)
        except (KafkaRefused, KafkaUnavailable) as exc:  # group lag unknown, lag still known
            log.warning("consumer group offsets not read: %s", exc)
            groups = {}
        if self._conn is None:
            self._conn = self.db.connect(autocommit=True)
        with translate_errors("stored offsets"):
            stored = OffsetsRepository(self._conn).of_pipelines([(p.name, p.topic)
                                                                 for p in live])
        for p in live:
            committed = groups.get((p.group_id, p.topic), {})
            out[p.name] = [
                LagRow(pipeline=p.name, topic=p.topic, partition=part,
                       stored_offset=stored.get((p.name, p.topic, part)),
                       group_offset=committed.get(part), low=low, high=high)
                for part, (low, high) in sorted(marks[p.name].items())]
        return out
