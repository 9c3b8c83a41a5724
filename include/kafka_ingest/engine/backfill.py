"""Backfills: re-read a source range by offsets or by time, safely, at any time.

A backfill is an ingest run over an :class:`~kafka_ingest.requests.OffsetWindow` or a
:class:`~kafka_ingest.requests.TimeWindow` (from a trigger form, the CLI, or Airflow's
own backfill over data intervals). Its ranges are planned in mode ``backfill`` and never
move the live stored offset or the consumer group, so they take no lock: a backfill runs
beside the scheduled runs without waiting for the live slice that holds the partition (at
most a row-level wait for the one live chunk writing the same rows) and without holding
it up. The idempotent upsert makes re-reading harmless: rows already loaded count as
duplicates.
"""

from __future__ import annotations

from typing import Any

from kafka_ingest.config import Pipeline
from kafka_ingest.db import Database
from kafka_ingest.engine.ingest import run_ingest
from kafka_ingest.errors import TriggerParamsError
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.requests import LiveRun, RangeRequest


def require_window(request: RangeRequest) -> RangeRequest:
    """A backfill reads a window; a request without one would be a live run."""
    if isinstance(request, LiveRun):
        raise TriggerParamsError("a backfill needs a range: partitions with [start, end) "
                                 "offsets, or from/to times")
    return request


def run_backfill(pipeline: Pipeline, request: RangeRequest, clients: KafkaClients,
                 db: Database, *, run_id: str) -> dict[str, Any]:
    """Plan and run one backfill with the ingest DAG's code path, partitions in turn."""
    return run_ingest(pipeline, clients, db, run_id=run_id, request=require_window(request))
