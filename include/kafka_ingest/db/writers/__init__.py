"""The target table's writers, one per upsert mode, chosen once per slice
(:func:`writer_for`): :class:`AppendWriter` (every event once), :class:`LatestWriter` (the
newest version per key), :class:`DeletingWriter` (latest, and tombstones delete)."""

from __future__ import annotations

from typing import Any

import psycopg

from kafka_ingest.config import Pipeline, UpsertMode
from kafka_ingest.db.tables import TargetShape
from kafka_ingest.db.writers.append import AppendWriter, NewKeys
from kafka_ingest.db.writers.base import DeleteResult, TableWriter, UpsertResult
from kafka_ingest.db.writers.deleting import DeletingWriter
from kafka_ingest.db.writers.latest import LatestWriter


def writer_for(conn: psycopg.Connection[Any], pipeline: Pipeline, *,
               shape: TargetShape | None = None, lock_timeout_s: float = 30.0,
               new_keys: NewKeys | None = None) -> TableWriter:
    """The writer of the pipeline's upsert mode, on ``conn``, for one slice."""
    if pipeline.upsert.mode is UpsertMode.APPEND:
        return AppendWriter(conn, pipeline, shape=shape, lock_timeout_s=lock_timeout_s,
                            new_keys=new_keys)
    kind = DeletingWriter if pipeline.deletes else LatestWriter
    return kind(conn, pipeline, shape=shape, lock_timeout_s=lock_timeout_s)


__all__ = ["AppendWriter", "DeleteResult", "DeletingWriter", "LatestWriter", "NewKeys",
           "TableWriter", "UpsertResult", "writer_for"]
