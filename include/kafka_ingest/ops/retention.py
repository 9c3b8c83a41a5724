"""The retention of the bookkeeping: what the monitor DAG prunes, pipeline by pipeline.

Each pipeline's ``retention`` (:class:`kafka_ingest.config.Retention`) says how many days
of ``ingest_runs``, ``run_plans``, ``monitor_checks`` and recovered ``dead_letters`` to
keep. :func:`prune` deletes what is older in batches of ``batch`` rows, each batch its own
short transaction (no long lock, no long-running transaction holding back vacuum), until
nothing older is left or ``budget_s`` has passed: a backlog (the first prune of a long
history) drains over several checks of the monitor.

What may go is decided in the database, by the functions of migration 0010 (so the
runtime role needs no DELETE): never a parked letter; never a plan with a range its
cursor has not reached (a run that may still be retried finishes exactly that slice);
never the monitor checks the rules read (the newest ``lag_growth_checks``, the first, the
newest alert); nothing younger than a day. The counters the page and the metrics show
come from ``ingest_totals`` and ``dead_letter_totals``, which are never pruned: a prune
changes none of them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from kafka_ingest.config import Pipeline
from kafka_ingest.db import Database, RetentionRepository

log = logging.getLogger(__name__)

#: Rows deleted per transaction.
DEFAULT_BATCH = 10_000
#: How long one prune may go on (the monitor's check runs every 5 minutes).
DEFAULT_BUDGET_S = 120.0


@dataclass(frozen=True)
class Pruned:
    """What one prune did to one table of one pipeline."""

    pipeline: str
    table: str
    days: int
    rows: int
    #: Whether nothing older is left (False: the budget ran out; the next prune goes on).
    done: bool


def _settings(pipeline: Pipeline) -> list[tuple[str, int | None]]:
    r = pipeline.retention
    return [("ingest_runs", r.ingest_runs_days), ("run_plans", r.run_plans_days),
            ("monitor_checks", r.monitor_checks_days),
            ("recovered_letters", r.recovered_letters_days)]


def prune(pipelines: Sequence[Pipeline], db: Database, *, batch: int = DEFAULT_BATCH,
          budget_s: float = DEFAULT_BUDGET_S) -> list[Pruned]:
    """Prune the bookkeeping of ``pipelines`` (of one database) as their ``retention``
    says; one :class:`Pruned` per pipeline and table with a retention. Tables without
    one (``null``) are left alone."""
    if batch < 1:
        raise ValueError(f"batch must be at least 1, not {batch}")
    deadline = time.monotonic() + budget_s
    out: list[Pruned] = []
    with db.session() as conn:
        repo = RetentionRepository(conn)
        for p in pipelines:
            for table, days in _settings(p):
                if days is None:
                    continue
                rows, done = 0, False
                while not done and time.monotonic() < deadline:
                    went = repo.prune(table, p.name, days, batch,
                                      keep=p.alerts.lag_growth_checks)
                    conn.commit()
                    rows += went
                    done = went < batch
                out.append(Pruned(p.name, table, days, rows, done))
                if rows:
                    log.info("%s: %s: %d rows older than %d days deleted%s", p.name, table,
                             rows, days, "" if done else " (more left for the next prune)")
    return out
