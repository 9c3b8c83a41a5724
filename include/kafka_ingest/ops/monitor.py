"""The monitor's check: a pipeline's health in figures, and the rules it breaches.

The rules themselves (what each looks at, its limit in the ``alerts`` block, its message)
are the table of :mod:`kafka_ingest.ops.rules`. Here, two halves, so the decision is
tested without services: :func:`gather` reads the figures (the lag rows of
:func:`kafka_ingest.ops.lag.lag`, and through :mod:`kafka_ingest.db.observations` the live
chunks of the window in ``ingest_runs``, the newest live chunk and the parked letters from
their totals, ``ingest_totals`` and ``dead_letter_totals``, and the monitor's own past
checks in ``monitor_checks``; each read bounded by the window or an index, never by the
history) and :func:`evaluate` is pure: figures in, breaches out. :func:`check` does both
and records the check, because lag growth needs memory across checks. Notifying and
failing the Airflow task are the monitor DAG's business (``plugins/kafka_ingest_alerts.py``);
:func:`post_webhook` lives here because it is plain HTTP.
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from kafka_ingest.config import Alerts, Pipeline
from kafka_ingest.db.observations import (
    LedgerLooks,
    LetterLooks,
    MonitorChecksRepository,
    database_now,
)
from kafka_ingest.ops.lag import LagRow, total_group_lag, total_lag
from kafka_ingest.ops.rules import RULES, Breach, Figures


@dataclass(frozen=True)
class CheckResult:
    figures: Figures
    breaches: tuple[Breach, ...] = field(default_factory=tuple)


def evaluate(alerts: Alerts, figures: Figures) -> list[Breach]:
    """The rules ``figures`` breach, in the order of :data:`~kafka_ingest.ops.rules.RULES`
    (pure: no I/O, no clock)."""
    return [b for rule in RULES if (b := rule.judge(figures, rule.limit(alerts))) is not None]


def gather(pipeline: Pipeline, lag_rows: Sequence[LagRow] | None, conn: Any) -> Figures:
    """The figures of ``pipeline``: ``lag_rows`` from :func:`kafka_ingest.ops.lag.lag`
    (``None``: not known), the rest read on ``conn``; this check's total ends the
    history. Reads only."""
    name, alerts = pipeline.name, pipeline.alerts
    ledger, checks = LedgerLooks(conn), MonitorChecksRepository(conn)
    now = database_now(conn)
    total = None if lag_rows is None else total_lag(lag_rows)
    read, dead = ledger.live_window(name, now, alerts.window_minutes)
    past = checks.newest_totals(name, alerts.lag_growth_checks)
    return Figures(
        pipeline=name, now=now, total_lag=total,
        group_lag=None if lag_rows is None else total_group_lag(lag_rows),
        partitions=len(lag_rows or ()),
        partition_lags={r.partition: max(0, r.lag) for r in lag_rows or ()},
        lag_history=(*past, total) if total is not None else tuple(past),
        window_minutes=alerts.window_minutes, read=read, dead_lettered=dead,
        last_live_commit=ledger.last_live_commit(name),
        watched_since=checks.first_checked_at(name) or (now if total is not None else None),
        parked=LetterLooks(conn).parked(name),
    )


def record(conn: Any, figures: Figures, breaches: Sequence[Breach]) -> None:
    """Append this check to ``monitor_checks`` (the caller commits)."""
    if figures.total_lag is None:
        raise ValueError(f"{figures.pipeline}: a check without a lag is not recorded")
    MonitorChecksRepository(conn).record(
        figures.pipeline, at=figures.now, total_lag=figures.total_lag,
        group_lag=figures.group_lag, dlq_rate=figures.dlq_rate, parked=figures.parked,
        breaches=[b.rule for b in breaches], partition_lags=figures.partition_lags)


def check(pipeline: Pipeline, lag_rows: Sequence[LagRow] | None, conn: Any,
          *, record_check: bool = True) -> CheckResult:
    """Figures and breaches of ``pipeline``; with ``record_check`` (the monitor DAG) the
    check is also appended to ``monitor_checks``, uncommitted. ``kafka-ingest status``
    passes ``record_check=False``: its lag growth is judged on the recorded checks plus
    now, and leaves no trace."""
    figures = gather(pipeline, lag_rows, conn)
    breaches = evaluate(pipeline.alerts, figures)
    if record_check:
        record(conn, figures, breaches)
    return CheckResult(figures, tuple(breaches))


# --------------------------------------------------------------------------- the DAG's tasks


def monitor_groups(pipelines: Iterable[Pipeline]) -> dict[str, list[Pipeline]]:
    """The monitor DAG's tasks, by task id: one per owner, retries and pair of connections,
    checking all its pipelines with one look at the cluster and the database (a task per
    pipeline costs a task process per pipeline every 5 minutes, which hundreds of
    pipelines cannot afford). The owner and retries are its pipelines' own."""
    groups: dict[str, list[Pipeline]] = {}
    for p in sorted(pipelines, key=lambda p: p.name):
        raw = f"check_{p.owner}__{p.kafka_conn_id}__{p.postgres_conn_id}__r{p.retries}"
        key = re.sub(r"[^A-Za-z0-9_.-]", "_", raw)
        if key != raw:  # two owners that differ only where a task id cannot say it
            key += "_" + hashlib.sha1(raw.encode(), usedforsecurity=False).hexdigest()[:6]
        groups.setdefault(key, []).append(p)
    return groups


# --------------------------------------------------------------------------- webhooks


def redact_url(url: str) -> str:
    """``scheme://host[:port]/…``: webhook URLs often carry their secret in the path or the
    query (Slack, Teams), so logs and errors show only where they point."""
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname}{port}/…"


def post_webhook(url: str, breach: Breach, *, timeout_s: float = 10.0) -> int:
    """POST ``breach`` as JSON ``{pipeline, rule, message, figures}``; return the HTTP
    status. A refused connection, a time-out or a status of 400 or more raises (``OSError``
    or ``urllib.error.HTTPError``); the caller logs it and goes on."""
    if urlsplit(url).scheme not in ("http", "https"):
        raise ValueError(f"not an http(s) webhook URL: {redact_url(url)}")
    request = urllib.request.Request(  # noqa: S310 (the scheme is checked above)
        url, data=json.dumps(breach.to_dict(), default=str).encode(), method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "kafka-ingest-monitor"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
        return int(response.status)
