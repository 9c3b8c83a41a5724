"""A worker the crash-safety tests run as a subprocess: one ``kafka-ingest run``, then SIGKILL.

It runs ``kafka_ingest.engine.ingest.run_ingest`` (the code path of ``kafka-ingest run`` and the
DAG) for the pipeline named on the command line; the pipeline comes from the YAML file in
``KAFKA_INGEST_PIPELINES``, Kafka from ``KAFKA_BOOTSTRAP_SERVERS``, Postgres from
``KAFKA_INGEST_PG_DSN``. It kills itself with SIGKILL (no cleanup, no ``finally``, like
the OOM killer or a lost node) at the ``CHAOS_KILL_NTH``-th time it reaches
``CHAOS_KILL_STAGE``:

- a stage of :data:`kafka_ingest.engine.slices.CHUNK_HOOK` ("validated", "upserted",
  "dlq_produced", "db_committed", "kafka_committed");
- ``copy``: in the middle of the chunk's COPY (into the staging table, or into the table itself
  when an append chunk tries its keys as new), half the rows sent.

With ``CHAOS_KILL_WITH_DEAD=1`` only chunks that had dead letters count, so a kill at
"dlq_produced" lands after records really reached the DLQ topic.

Usage: ``python ingest_worker.py <pipeline> <run_id>``; exit 0 means it was never killed.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from kafka_ingest.cli import database, kafka_clients
from kafka_ingest.config import get_pipeline
from kafka_ingest.db import TableWriter
from kafka_ingest.engine import ingest, slices
from kafka_ingest.records import CopyPayload

STAGE = os.environ["CHAOS_KILL_STAGE"]
NTH = int(os.environ.get("CHAOS_KILL_NTH", "1"))
WITH_DEAD = os.environ.get("CHAOS_KILL_WITH_DEAD") == "1"
_state = {"seen": 0, "dead": 0}


def _die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _count_and_maybe_die() -> None:
    _state["seen"] += 1
    if _state["seen"] == NTH:
        _die()


def _hook(stage: str) -> None:
    if stage != STAGE or (WITH_DEAD and not _state["dead"]):
        return
    _count_and_maybe_die()


def _counting_produce(producer: Any, letters: Any, *args: Any, **kwargs: Any) -> Any:
    _state["dead"] = len(letters)
    return _real_produce(producer, letters, *args, **kwargs)


def _send_then_die(self: TableWriter, copy: Any, rows: list[Any],
                   encoded: CopyPayload | None) -> None:
    """``TableWriter._send``, killed half way through the nth COPY's data."""
    _state["seen"] += 1
    if _state["seen"] != NTH:
        _real_send(self, copy, rows, encoded)
        return
    if encoded is not None:  # the payload encoded ahead of the transaction
        copy.write(encoded.data[: len(encoded.data) // 2])
    else:
        _real_send(self, copy, rows[: len(rows) // 2], None)
    _die()


_real_produce = ingest.produce_dead_letters
_real_send = TableWriter._send


def main(pipeline_name: str, run_id: str) -> int:
    if STAGE == "copy":
        TableWriter._send = _send_then_die  # type: ignore[method-assign]
    else:
        ingest.produce_dead_letters = _counting_produce  # type: ignore[assignment]
        slices.CHUNK_HOOK = _hook
    summary = ingest.run_ingest(get_pipeline(pipeline_name), kafka_clients(), database(),
                                run_id=run_id)
    print(f"never killed: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
