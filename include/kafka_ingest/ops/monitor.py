"""Alert rules for the on-call: a pipeline's health in figures, and the rules it breaches.

Each rule is a key of the pipeline's ``alerts`` block (:class:`kafka_ingest.config.Alerts`);
a figure strictly above its limit breaches it:

- ``max_lag``: messages not yet ingested, summed over the partitions (from the stored
  offsets, the source of truth; a partition's negative lag counts as 0);
- ``lag_growth_checks``: the total lag grew at each of the last N monitor checks (the last
  N + 1 recorded totals, this check's included, are strictly increasing);
- ``max_dlq_rate``: dead letters / messages read, over the live chunks committed in the
  last ``window_minutes`` (no rate, so no breach, when nothing was read);
- ``freshness_minutes``: no live chunk committed for that long while the lag is above 0.
  When no live chunk was ever committed, the time counts from the monitor's first check
  of the pipeline, so a new pipeline is not stale before it had a chance to run;
- ``max_parked``: dead letters still parked (not recovered by a replay).

Two halves, so the decision is tested without services: :func:`gather` reads the figures
(the lag rows of :func:`kafka_ingest.ops.status.lag`, the live chunks of the window in
``ingest_runs``, the newest live chunk and the parked letters from their totals,
``ingest_totals`` and ``dead_letter_totals``, and the monitor's own past checks in
``monitor_checks``; each read bounded by the window or an index, never by the history)
and :func:`evaluate` is pure: figures in, breaches out. :func:`check` does both and
records the check, because lag growth needs memory across checks. Notifying and failing
the Airflow task are the monitor DAG's business (``plugins/kafka_ingest_hook.py``);
:func:`post_webhook` lives here because it is plain HTTP.
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import pairwise
from typing import Any
from urllib.parse import urlsplit

from psycopg.types.json import Jsonb

from kafka_ingest.config import Alerts, Pipeline


@dataclass(frozen=True, kw_only=True)
class Figures:
    """What the rules look at, for one pipeline at one moment (the database's clock)."""

    pipeline: str
    now: datetime
    #: Summed over ``partitions``; ``None`` when Kafka was not asked (then the lag rules
    #: are not evaluated).
    total_lag: int | None
    group_lag: int | None = None
    partitions: int = 0
    #: Per partition (a negative lag counts as 0); empty when the lag is not known.
    partition_lags: Mapping[int, int] = field(default_factory=dict)
    #: Recorded totals, oldest first, ending with this check's total.
    lag_history: tuple[int, ...] = ()
    window_minutes: int = 60
    #: Read and dead-lettered by the live chunks committed in the window.
    read: int = 0
    dead_lettered: int = 0
    last_live_commit: datetime | None = None
    #: The monitor's first recorded check of this pipeline (or this check's time).
    watched_since: datetime | None = None
    parked: int = 0

    @property
    def dlq_rate(self) -> float | None:
        return self.dead_lettered / self.read if self.read else None

    @property
    def stale_minutes(self) -> float | None:
        """Minutes since the newest live chunk, or, if none was ever committed, since the
        monitor first checked the pipeline; ``None`` if neither is known."""
        since = self.last_live_commit or self.watched_since
        if since is None:
            return None
        return max(0.0, (self.now - since).total_seconds() / 60)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: for XCom, webhooks and logs."""
        rate, stale = self.dlq_rate, self.stale_minutes
        return {
            "pipeline": self.pipeline, "checked_at": _iso(self.now),
            "total_lag": self.total_lag, "group_lag": self.group_lag,
            "partitions": self.partitions, "lag_history": list(self.lag_history),
            "window_minutes": self.window_minutes, "read": self.read,
            "dead_lettered": self.dead_lettered,
            "dlq_rate": None if rate is None else round(rate, 6),
            "last_live_commit": _iso(self.last_live_commit),
            "minutes_since_live_chunk": None if stale is None else round(stale, 1),
            "parked": self.parked,
        }


@dataclass(frozen=True)
class Breach:
    """One rule breached: the pipeline, the rule (its ``alerts`` key), the figures that
    breached it with the limit, and a one-line message naming all three."""

    pipeline: str
    rule: str
    figures: dict[str, Any]
    message: str

    def to_dict(self) -> dict[str, Any]:
        """The webhook's JSON body."""
        return {"pipeline": self.pipeline, "rule": self.rule, "message": self.message,
                "figures": self.figures}


@dataclass(frozen=True)
class CheckResult:
    figures: Figures
    breaches: tuple[Breach, ...] = field(default_factory=tuple)


def _iso(ts: datetime | None) -> str | None:
    return None if ts is None else ts.astimezone(UTC).isoformat()


# --------------------------------------------------------------------------- the rules


def _max_lag(alerts: Alerts, f: Figures) -> Breach | None:
    if f.total_lag is None or f.total_lag <= alerts.max_lag:
        return None
    return Breach(f.pipeline, "max_lag",
                  {"total_lag": f.total_lag, "partitions": f.partitions,
                   "max_lag": alerts.max_lag},
                  f"{f.pipeline}: max_lag: lag {f.total_lag} messages over {f.partitions} "
                  f"partitions is above max_lag {alerts.max_lag}")


def _lag_growth(alerts: Alerts, f: Figures) -> Breach | None:
    n = alerts.lag_growth_checks
    last = f.lag_history[-(n + 1):]
    if f.total_lag is None or len(last) < n + 1 or not all(a < b for a, b in pairwise(last)):
        return None
    return Breach(f.pipeline, "lag_growth_checks",
                  {"lag_history": list(last), "lag_growth_checks": n},
                  f"{f.pipeline}: lag_growth_checks: the lag grew at each of the last {n} "
                  f"checks ({' -> '.join(map(str, last))})")


def _dlq_rate(alerts: Alerts, f: Figures) -> Breach | None:
    rate = f.dlq_rate
    if rate is None or rate <= alerts.max_dlq_rate:
        return None
    return Breach(f.pipeline, "max_dlq_rate",
                  {"dead_lettered": f.dead_lettered, "read": f.read, "dlq_rate": round(rate, 6),
                   "window_minutes": f.window_minutes, "max_dlq_rate": alerts.max_dlq_rate},
                  f"{f.pipeline}: max_dlq_rate: {f.dead_lettered} of {f.read} messages read "
                  f"by live chunks in the last {f.window_minutes} min were dead-lettered "
                  f"({rate:.2%}), above max_dlq_rate {alerts.max_dlq_rate:.2%}")


def _freshness(alerts: Alerts, f: Figures) -> Breach | None:
    stale = f.stale_minutes
    if not f.total_lag or stale is None or stale <= alerts.freshness_minutes:
        return None
    since = (f"the newest at {_iso(f.last_live_commit)}" if f.last_live_commit
             else "none ever; counted from the monitor's first check")
    return Breach(f.pipeline, "freshness_minutes",
                  {"minutes_since_live_chunk": round(stale, 1),
                   "last_live_commit": _iso(f.last_live_commit), "total_lag": f.total_lag,
                   "freshness_minutes": alerts.freshness_minutes},
                  f"{f.pipeline}: freshness_minutes: no live chunk committed for {stale:.0f} "
                  f"min ({since}) while the lag is {f.total_lag}, above freshness_minutes "
                  f"{alerts.freshness_minutes}")


def _parked(alerts: Alerts, f: Figures) -> Breach | None:
    if f.parked <= alerts.max_parked:
        return None
    return Breach(f.pipeline, "max_parked", {"parked": f.parked, "max_parked": alerts.max_parked},
                  f"{f.pipeline}: max_parked: {f.parked} dead letters are parked, above "
                  f"max_parked {alerts.max_parked}")


RULES: tuple[Callable[[Alerts, Figures], Breach | None], ...] = (
    _max_lag, _lag_growth, _dlq_rate, _freshness, _parked)


def evaluate(alerts: Alerts, figures: Figures) -> list[Breach]:
    """The rules ``figures`` breach, in a fixed order (pure: no I/O, no clock)."""
    return [b for rule in RULES if (b := rule(alerts, figures)) is not None]


# --------------------------------------------------------------------------- the figures


def _lag_totals(rows: Sequence[Mapping[str, Any]]) -> tuple[int, int | None]:
    """Total lag, and the group's total lag if every partition has one."""
    total = sum(max(0, int(r["lag"])) for r in rows)
    group = [r.get("group_lag") for r in rows]
    if not rows or any(g is None for g in group):
        return total, None
    return total, sum(max(0, int(g)) for g in group if g is not None)


def _one(conn: Any, query: str, args: Sequence[Any]) -> Any:
    row = conn.execute(query, args).fetchone()
    return None if row is None else row[0]


def gather(pipeline: Pipeline, lag_rows: Sequence[Mapping[str, Any]] | None,
           conn: Any) -> Figures:
    """The figures of ``pipeline``: ``lag_rows`` from :func:`kafka_ingest.ops.status.lag`
    (``None``: not known), the rest read on ``conn``; this check's total ends the
    history. Reads only."""
    name, alerts = pipeline.name, pipeline.alerts
    now = _one(conn, "SELECT now()", ())
    total, group = _lag_totals(lag_rows) if lag_rows is not None else (None, None)
    read, dead = conn.execute(
        "SELECT coalesce(sum(read), 0), coalesce(sum(dead_lettered), 0) FROM ingest_runs"
        " WHERE pipeline = %s AND mode = 'live'"
        " AND committed_at > %s::timestamptz - %s::int * interval '1 minute'",
        (name, now, alerts.window_minutes)).fetchone()
    past = [int(r[0]) for r in conn.execute(
        "SELECT total_lag FROM monitor_checks WHERE pipeline = %s ORDER BY id DESC LIMIT %s",
        (name, alerts.lag_growth_checks)).fetchall()][::-1]
    first = _one(conn, "SELECT checked_at FROM monitor_checks WHERE pipeline = %s"
                       " ORDER BY id LIMIT 1", (name,))
    return Figures(
        pipeline=name, now=now, total_lag=total, group_lag=group,
        partitions=len(lag_rows or ()),
        partition_lags={int(r["partition"]): max(0, int(r["lag"])) for r in lag_rows or ()},
        lag_history=(*past, total) if total is not None else tuple(past),
        window_minutes=alerts.window_minutes, read=int(read), dead_lettered=int(dead),
        last_live_commit=_one(conn, "SELECT max(last_committed_at) FROM ingest_totals"
                                    " WHERE pipeline = %s AND mode = 'live'", (name,)),
        watched_since=first or (now if total is not None else None),
        parked=int(_one(conn, "SELECT coalesce(sum(letters), 0) FROM dead_letter_totals"
                              " WHERE pipeline = %s AND status = 'parked'", (name,))),
    )


def record(conn: Any, figures: Figures, breaches: Sequence[Breach]) -> None:
    """Append this check to ``monitor_checks`` (the caller commits)."""
    if figures.total_lag is None:
        raise ValueError(f"{figures.pipeline}: a check without a lag is not recorded")
    conn.execute(
        "INSERT INTO monitor_checks (pipeline, checked_at, total_lag, group_lag, dlq_rate,"
        " parked, breaches, partition_lags) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
        (figures.pipeline, figures.now, figures.total_lag, figures.group_lag,
         figures.dlq_rate, figures.parked, [b.rule for b in breaches],
         Jsonb({str(p): lag for p, lag in sorted(figures.partition_lags.items())})))


def check(pipeline: Pipeline, lag_rows: Sequence[Mapping[str, Any]] | None, conn: Any,
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
