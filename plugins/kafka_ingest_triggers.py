"""The lag trigger: ``schedule: on_data`` pipelines start a run as soon as there is enough
new data, and cost nothing while their topic is quiet.

:class:`LagTrigger` is an Airflow ``BaseEventTrigger`` watching an Asset the ingest DAG
is scheduled on (``AssetWatcher``), run by the triggerer. It never consumes a message
and never commits anything: it compares each partition's high watermark with the offset
stored in Postgres (what ``kafka-ingest lag`` shows) and decides with
:class:`kafka_ingest.ops.watch.LagWatch` (the rules: ``min_batch``, ``max_wait_seconds``,
quiet until the run it caused moved the stored offsets).

Every lag trigger of one Kafka and one Postgres connection shares one poll loop in the
triggerer (Airflow's shared streams, keyed by the two connections): one
:class:`kafka_ingest.ops.lag.LagReader`, so one consumer, one admin client and one
Postgres connection, read every ``on_data`` pipeline of the pipelines file on those
connections each ``poll_seconds`` (the smallest of theirs). Each read is bounded by
:data:`READ_TIMEOUT_S` per request and runs in a worker thread, never on the
triggerer's event loop. A broker or database out of reach is logged and retried with
backoff (up to :data:`MAX_BACKOFF_S`); the loop never ends on its own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Hashable
from dataclasses import dataclass, field
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from kafka_ingest import Pipeline, load_pipelines
from kafka_ingest.config import OnData
from kafka_ingest.errors import IngestError
from kafka_ingest.ops.lag import LagReader, LagRow
from kafka_ingest.ops.watch import LagWatch

log = logging.getLogger(__name__)

CLASSPATH = "kafka_ingest_triggers.LagTrigger"
#: The bound of each request of a lag reading (Kafka metadata, watermarks, group offsets,
#: the stored offsets' query), and of connecting to Postgres.
READ_TIMEOUT_S = 10.0
MAX_BACKOFF_S = 60.0


@dataclass(frozen=True)
class LagReading:
    """One read of every watched pipeline: rows per pipeline (or why not), when."""

    at: float  # monotonic seconds
    rows: dict[str, list[LagRow] | IngestError] = field(default_factory=dict)
    error: str | None = None


def watched(kafka_conn_id: str, postgres_conn_id: str) -> list[Pipeline]:
    """The ``on_data`` pipelines of the pipelines file on these two connections."""
    return [p for p in load_pipelines().values() if p.event_driven
            and p.kafka_conn_id == kafka_conn_id and p.postgres_conn_id == postgres_conn_id]


def _reader(pipeline: Pipeline) -> LagReader:
    from kafka_ingest_hook import KafkaIngestHook, postgres_database

    return LagReader(KafkaIngestHook(pipeline.kafka_conn_id).clients,
                     postgres_database(pipeline.postgres_conn_id).bounded(READ_TIMEOUT_S),
                     timeout_s=READ_TIMEOUT_S)


class LagTrigger(BaseEventTrigger):
    """Fires when one ``on_data`` pipeline has enough new data (see the module's text).

    :param pipeline: the pipeline's name.
    :param kafka_conn_id: its Kafka connection; :param postgres_conn_id: its Postgres one.
    :param on_data: its ``on_data`` settings (:class:`kafka_ingest.config.OnData`), as a dict.
    """

    def __init__(self, pipeline: str, kafka_conn_id: str, postgres_conn_id: str,
                 on_data: dict[str, Any], max_records: int = 2**62) -> None:
        super().__init__()
        self.pipeline = pipeline
        self.kafka_conn_id = kafka_conn_id
        self.postgres_conn_id = postgres_conn_id
        self.on_data = dict(on_data)
        self.max_records = max_records

    @classmethod
    def of(cls, pipeline: Pipeline) -> LagTrigger:
        return cls(pipeline.name, pipeline.kafka_conn_id, pipeline.postgres_conn_id,
                   pipeline.on_data.model_dump(mode="json"),
                   pipeline.max_records_per_partition)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return CLASSPATH, {"pipeline": self.pipeline, "kafka_conn_id": self.kafka_conn_id,
                           "postgres_conn_id": self.postgres_conn_id,
                           "on_data": self.on_data, "max_records": self.max_records}

    def shared_stream_key(self) -> Hashable:
        return ("kafka_ingest.lag", self.kafka_conn_id, self.postgres_conn_id)

    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[LagReading]:
        """Read the lag of every watched pipeline of the two connections, forever."""
        kafka_id, pg_id = kwargs["kafka_conn_id"], kwargs["postgres_conn_id"]
        reader: LagReader | None = None
        failures = 0
        try:
            while True:
                pipelines: list[Pipeline] = []
                try:
                    pipelines = await asyncio.to_thread(watched, kafka_id, pg_id)
                    if pipelines:
                        if reader is None:
                            reader = await asyncio.to_thread(_reader, pipelines[0])
                        rows = await asyncio.to_thread(reader.read, pipelines, group=False)
                        yield LagReading(time.monotonic(), rows)
                    failures = 0
                except Exception as exc:  # out of reach, refused, a bad pipelines file
                    failures += 1
                    if reader is not None:  # the next read re-reads the Airflow connections
                        stale, reader = reader, None
                        await asyncio.to_thread(stale.close)
                    log.warning("lag of the on_data pipelines on %s and %s not read (%d in a "
                                "row): %s", kafka_id, pg_id, failures, exc)
                    yield LagReading(time.monotonic(), error=str(exc))
                poll = min((p.on_data.poll_seconds for p in pipelines),
                           default=OnData().poll_seconds)
                await asyncio.sleep(min(MAX_BACKOFF_S, poll * 2 ** min(failures, 10)))
        finally:
            if reader is not None:  # after a read still running in its thread, if any
                try:
                    await asyncio.to_thread(reader.close)
                except Exception:  # never in place of the cancellation being handled
                    log.warning("the lag reader was not closed cleanly", exc_info=True)

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]
                                   ) -> AsyncIterator[TriggerEvent]:
        watch = LagWatch(OnData(**self.on_data), max_records=self.max_records)
        unwatched = False
        async for reading in shared_stream:
            rows = reading.rows.get(self.pipeline)
            if rows is None:
                if reading.error is None and not unwatched:  # said once, not every poll
                    unwatched = True
                    log.warning("%s: not an on_data pipeline on %s and %s in the pipelines "
                                "file any more; not watched", self.pipeline,
                                self.kafka_conn_id, self.postgres_conn_id)
                continue
            if isinstance(rows, IngestError):
                log.warning("%s: lag not known: %s", self.pipeline, rows)
                continue
            fire = watch.observe(reading.at, rows)
            if fire is not None:
                log.info("%s: new data (%s): %d messages after %.1f s", self.pipeline,
                         fire.reason, fire.total_lag, fire.waited_s)
                yield TriggerEvent({"pipeline": self.pipeline, **fire.to_dict()})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Without the triggerer's shared streams: this trigger's own loop, the same one."""
        async for event in self.filter_shared_stream(
                self.open_shared_stream(self.serialize()[1])):
            yield event
