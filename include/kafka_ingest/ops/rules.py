"""The alert rules, one typed table (:data:`RULES`): what each looks at, when it is
breached, its Prometheus rule and what the on-call does about it.

Each rule is a key of the pipeline's ``alerts`` block (:class:`kafka_ingest.config.Alerts`),
the field holding its limit; a figure strictly above its limit breaches it. Everything
else is made from the table, so a rule is written once:

- the monitor's check (:func:`kafka_ingest.ops.monitor.evaluate`: each rule's
  :attr:`AlertRule.judge`, over :class:`Figures`);
- the Prometheus rules file (:mod:`kafka_ingest.ops.alert_rules`: each rule's
  :attr:`AlertRule.expr` and summary, its alert name, severity and hold);
- the metrics' ``alert_limit`` and ``alert_breached`` (:mod:`kafka_ingest.ops.metrics`);
- the pipelines page's colours (:attr:`AlertRule.page_figures`, :mod:`kafka_ingest.ops.page`);
- the runbook's sections (:func:`runbook`), checked against the docs by a test.

``tests/unit/ops/test_rules.py`` runs the Python judges and the PromQL expressions (through
promtool, over the metrics the exporter serves for the same figures) and asserts they
agree, rule by rule, on either side of each limit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import pairwise
from typing import Any

from kafka_ingest.config import Alerts

#: Where the on-call reads what an alert means and what to do: one section per rule,
#: anchored by the rule's name (:func:`runbook` makes them).
RUNBOOK = "docs/runbook.md"


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
            "pipeline": self.pipeline, "checked_at": iso(self.now),
            "total_lag": self.total_lag, "group_lag": self.group_lag,
            "partitions": self.partitions, "lag_history": list(self.lag_history),
            "window_minutes": self.window_minutes, "read": self.read,
            "dead_lettered": self.dead_lettered,
            "dlq_rate": None if rate is None else round(rate, 6),
            "last_live_commit": iso(self.last_live_commit),
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


def iso(ts: datetime | None) -> str | None:
    return None if ts is None else ts.astimezone(UTC).isoformat()


# --------------------------------------------------------------------------- PromQL

#: One series per partition before summing: the same metrics scraped from both endpoints
#: (the api-server and an exporter) would otherwise count each partition twice.
_ONE_PER_PARTITION = "max by (pipeline, topic, partition)"


def lag_sum(selector: str, minutes_ago: int = 0) -> str:
    """The summed lag (a negative one counted as 0), written out rather than read from
    the recording rule: a rule of another group may be evaluated before or after it, so
    the alert would see it one evaluation late, or not."""
    offset = f" offset {minutes_ago}m" if minutes_ago else ""
    return (f"sum by (pipeline) ({_ONE_PER_PARTITION} "
            f"(clamp_min(kafka_ingest_lag_messages{selector}{offset}, 0)))")


@dataclass(frozen=True)
class Limits:
    """What a rule's PromQL expression and summary are written with: the pipeline's
    selector and name, its ``alerts`` block, and the monitor's check interval."""

    selector: str
    name: str
    alerts: Alerts
    #: The monitor DAG's schedule in whole minutes, and as written (``5m``).
    step_minutes: int
    interval: str


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True, kw_only=True)
class AlertRule:
    """One alert rule: a key of the ``alerts`` block and everything made from it."""

    #: The key of the ``alerts`` block, the :class:`~kafka_ingest.config.Alerts` field
    #: holding its limit (the ``rule`` label of its alert and metrics).
    name: str
    #: A few words, the heading of its runbook section.
    title: str
    #: What it looks at, and when it is breached, in words (its limit is named after).
    looks_at: str
    #: The Prometheus alert.
    alert: str
    severity: str = "warning"
    #: The alert's ``for`` applies (``False``: the expression already spans the past).
    held: bool = True
    #: It needs the lag: not judged when Kafka could not tell it.
    needs_lag: bool = False
    #: The pipelines page's figures it colours (``data-figure`` of the overview's cells).
    page_figures: tuple[str, ...] = ()
    #: The metric its expression compares with the limit, and the limit's scale into the
    #: metric's unit (minutes into seconds: 60); the dashboard draws the one over the other.
    metric: str
    scale: int = 1
    #: The monitor's judgement: figures and limit in, a breach (with its message) or None.
    judge: Callable[[Figures, Any], Breach | None]
    #: The PromQL expression (true while breached), given the limit in the metric's unit
    #: (the limit times :attr:`scale`), and the alert's summary.
    expr: Callable[[Limits, Any], str]
    summary: Callable[[Limits], str]
    #: What it means and what to do (Markdown: the runbook section's body).
    runbook: str

    def limit(self, alerts: Alerts) -> Any:
        """The pipeline's limit of this rule."""
        return getattr(alerts, self.name)

    def promql(self, limits: Limits) -> str:
        """The expression with the pipeline's limit written in."""
        return self.expr(limits, self.limit(limits.alerts) * self.scale)


def _max_lag(f: Figures, limit: int) -> Breach | None:
    if f.total_lag is None or f.total_lag <= limit:
        return None
    return Breach(f.pipeline, "max_lag",
                  {"total_lag": f.total_lag, "partitions": f.partitions, "max_lag": limit},
                  f"{f.pipeline}: max_lag: lag {f.total_lag} messages over {f.partitions} "
                  f"partitions is above max_lag {limit}")


def _lag_growth(f: Figures, n: int) -> Breach | None:
    last = f.lag_history[-(n + 1):]
    if f.total_lag is None or len(last) < n + 1 or not all(a < b for a, b in pairwise(last)):
        return None
    return Breach(f.pipeline, "lag_growth_checks",
                  {"lag_history": list(last), "lag_growth_checks": n},
                  f"{f.pipeline}: lag_growth_checks: the lag grew at each of the last {n} "
                  f"checks ({' -> '.join(map(str, last))})")


def _dlq_rate(f: Figures, limit: float) -> Breach | None:
    rate = f.dlq_rate
    if rate is None or rate <= limit:
        return None
    return Breach(f.pipeline, "max_dlq_rate",
                  {"dead_lettered": f.dead_lettered, "read": f.read, "dlq_rate": round(rate, 6),
                   "window_minutes": f.window_minutes, "max_dlq_rate": limit},
                  f"{f.pipeline}: max_dlq_rate: {f.dead_lettered} of {f.read} messages read "
                  f"by live chunks in the last {f.window_minutes} min were dead-lettered "
                  f"({rate:.2%}), above max_dlq_rate {limit:.2%}")


def _freshness(f: Figures, limit: int) -> Breach | None:
    stale = f.stale_minutes
    if not f.total_lag or stale is None or stale <= limit:
        return None
    since = (f"the newest at {iso(f.last_live_commit)}" if f.last_live_commit
             else "none ever; counted from the monitor's first check")
    return Breach(f.pipeline, "freshness_minutes",
                  {"minutes_since_live_chunk": round(stale, 1),
                   "last_live_commit": iso(f.last_live_commit), "total_lag": f.total_lag,
                   "freshness_minutes": limit},
                  f"{f.pipeline}: freshness_minutes: no live chunk committed for {stale:.0f} "
                  f"min ({since}) while the lag is {f.total_lag}, above freshness_minutes "
                  f"{limit}")


def _parked(f: Figures, limit: int) -> Breach | None:
    if f.parked <= limit:
        return None
    return Breach(f.pipeline, "max_parked", {"parked": f.parked, "max_parked": limit},
                  f"{f.pipeline}: max_parked: {f.parked} dead letters are parked, above "
                  f"max_parked {limit}")


def _growth_expr(x: Limits, checks: int) -> str:
    s, sel = x.step_minutes, x.selector
    return " and ".join(f"({lag_sum(sel, k * s)} > {lag_sum(sel, (k + 1) * s)})"
                        for k in range(checks))


def _stale_expr(x: Limits, stale_s: int) -> str:
    sel = x.selector
    return (f"(kafka_ingest_last_live_commit_age_seconds{sel} > {stale_s}"
            f" and on (pipeline) {lag_sum(sel)} > 0)"
            f" or on (pipeline) (max by (pipeline)"
            f" (kafka_ingest_oldest_unread_age_seconds{sel}) > {stale_s}"
            f" unless on (pipeline) kafka_ingest_last_live_commit_timestamp_seconds{sel})")


_MAX_LAG_RUNBOOK = """\
Messages wait in Kafka that are not in Postgres yet: the ingest DAG is not running,
failing, or slower than the producers.
1. `kafka-ingest lag <pipeline>`: which partitions? One partition far behind is a hot key;
   all of them is the whole pipeline.
2. Is `<pipeline>_ingest` running? Paused (`airflow dags unpause <pipeline>_ingest`),
   failed runs ([a run that failed permanently](runbook.md#last_run_failed)), or runs queued behind
   a long manual backfill (`max_active_runs` is 1, 2 for `on_data`)?
3. Runs succeed but do not keep up: each run reads at most `max_records_per_partition` per
   partition; raise it, or schedule more often. Slow chunks show in the `seconds` column of
   `kafka-ingest status`; a slow Postgres shows there first.
4. Only if the backlog may be dropped (never by default): `kafka-ingest reset-offsets
   <pipeline> --partition N --to latest --yes`, then, if needed later, `kafka-ingest
   backfill <pipeline> --from ... --to ...` reloads the skipped window.
`group_lag` differing from `lag` is harmless (a Kafka commit lost after the database
commit); the next live run re-syncs it, and the alerts use the stored offsets."""

_LAG_GROWTH_RUNBOOK = """\
The lag rose at each of the last N checks (15 minutes with the defaults): the pipeline
falls behind even if it is still below `max_lag`.
Same steps as `max_lag`; it is the early warning. A burst from producers that the next
runs absorb stops it by itself; a lag that grows for hours does not."""

_DLQ_RATE_RUNBOOK = """\
A share of what live chunks read in the window was dead-lettered: producers send what
the contract rejects.
1. `kafka-ingest status <pipeline>`: the dead letters by `error_class`. The details:
   `SELECT error_class, error_detail, count(*) FROM dead_letters WHERE pipeline = '<pipeline>' AND last_failed_at > now() - interval '1 hour' GROUP BY 1, 2 ORDER BY 3 DESC LIMIT 20;`
2. `unknown_version`: producers ship a newer contract version. Add it (a new `Contract`
   version), move the pipeline's `contract.version`, deploy, then
   `kafka-ingest replay-dlq <pipeline> --error-class unknown_version --dry-run`, and the
   same without `--dry-run` (or trigger `<pipeline>_dlq_replay`).
3. `contract_violation`, `undecodable`, `not_an_object`: a producer bug; tell its owners.
   If the contract was too strict, relax it and replay as above (`--dry-run` first).
4. `too_large`: raise `max_message_bytes` if the size is legitimate, then replay.
   `rejected_by_database`: the table's limits (column sizes, ranges, a missing partition
   of a `partition_by` table); a migration, then replay.
5. `not_wire_format`, `unknown_schema`: a registry format's producer wrote without the
   wire header, or with a schema id the registry does not know ([formats.md](formats.md)).
   `schema_unreadable`: a writer schema the reader cannot build (the reason names the
   reference or the import); fix it, then replay with `--error-class schema_unreadable`.
   `bad_key`, `bad_header`: the record key or a header cannot fill its column.
   `unorderable` (log-order pipelines): a key arrived from another partition or topic than
   its stored version ([guarantees.md](guarantees.md#places-in-the-log-partitions-and-topics-created-again)).
   `unavailable_value` (mirrors): an update left a TOASTed column out for a row the mirror
   does not hold; replay the row's insert (its own letter) first, then
   `--error-class unavailable_value` ([mirror.md](mirror.md#what-each-change-event-does)).
The ingest itself goes on: dead letters never stop a run."""  # noqa: E501

_FRESHNESS_RUNBOOK = """\
Messages wait and no live chunk was committed for that long: the ingest DAG is not
running or every run fails.
1. Airflow UI, `<pipeline>_ingest`: paused? no runs at all (is the scheduler up)? runs
   failing (open the failed task's log)? runs stuck in `plan` or `ingest` (a partition lock
   held by a long backfill: it waits for at most one backfill chunk, then retries)?
2. `kafka-ingest run <pipeline>` runs one micro-batch through the same code, in your
   shell, and shows the error directly.
3. A pipeline that never committed a live chunk counts from the monitor's first check of
   it: a new pipeline whose first run fails alerts after `freshness_minutes`."""

_PARKED_RUNBOOK = """\
Dead letters stay parked until a replay recovers them.
1. `kafka-ingest status <pipeline>`: parked by `error_class`, newest first.
2. Recoverable (the contract or the table changed): `kafka-ingest replay-dlq <pipeline>
   --dry-run` says how many would load now; then run it without `--dry-run`.
3. Garbage that no contract should accept stays parked (the runtime role cannot delete):
   once you have looked, raise `max_parked` above today's count, so the alert means "new
   dead letters" again."""

#: The rules, in the order the monitor judges and reports them.
RULES: tuple[AlertRule, ...] = (
    AlertRule(
        name="max_lag", title="lag above max",
        looks_at="the lag (messages not yet ingested, from the stored offsets) summed over "
                 "the partitions, a negative one counted as 0",
        alert="KafkaIngestLagHigh", severity="critical", needs_lag=True,
        page_figures=("lag",), metric="lag_messages", judge=_max_lag,
        expr=lambda x, limit: f"{lag_sum(x.selector)} > {limit}",
        summary=lambda x: (f"{x.name}: {{{{ $value }}}} messages not ingested, above max_lag "
                           f"{x.alerts.max_lag}"),
        runbook=_MAX_LAG_RUNBOOK),
    AlertRule(
        name="lag_growth_checks", title="lag growing",
        looks_at="the number of consecutive monitor checks (5 minutes apart) at which the "
                 "summed lag grew strictly",
        alert="KafkaIngestLagGrowing", held=False, needs_lag=True,
        page_figures=("lag", "trend"), metric="lag_messages", judge=_lag_growth,
        expr=_growth_expr,
        summary=lambda x: (f"{x.name}: the lag grew at each of the last "
                           f"{x.alerts.lag_growth_checks} checks ({x.interval} apart), now "
                           "{{ $value }}"),
        runbook=_LAG_GROWTH_RUNBOOK),
    AlertRule(
        name="max_dlq_rate", title="DLQ rate spike",
        looks_at="dead letters / messages read, over the live chunks committed in the last "
                 "`window_minutes`",
        alert="KafkaIngestDlqRateHigh", page_figures=("dlq",), metric="dlq_ratio",
        judge=_dlq_rate,
        expr=lambda x, limit: f"kafka_ingest_dlq_ratio{x.selector} > {limit}",
        summary=lambda x: (f"{x.name}: {{{{ $value | humanizePercentage }}}} of the messages "
                           f"read in the last {x.alerts.window_minutes} min were dead-lettered,"
                           f" above max_dlq_rate {x.alerts.max_dlq_rate:.2%}"),
        runbook=_DLQ_RATE_RUNBOOK),
    AlertRule(
        name="freshness_minutes", title="no fresh chunk while behind",
        looks_at="minutes since the newest live chunk was committed while the lag is above "
                 "0 (before any, since the monitor's first check)",
        alert="KafkaIngestStale", severity="critical", needs_lag=True,
        page_figures=("freshness",), metric="last_live_commit_age_seconds", scale=60,
        judge=_freshness, expr=_stale_expr,
        summary=lambda x: (f"{x.name}: no live chunk committed for "
                           "{{ $value | humanizeDuration }} while messages wait, above "
                           f"freshness_minutes {x.alerts.freshness_minutes}"),
        runbook=_FRESHNESS_RUNBOOK),
    AlertRule(
        name="max_parked", title="parked letters piling up",
        looks_at="dead letters still parked (not recovered by a replay)",
        alert="KafkaIngestParkedLetters", page_figures=("parked",), metric="parked_letters",
        judge=_parked,
        expr=lambda x, limit: (f"sum by (pipeline) (max by (pipeline, reason) "
                               f"(kafka_ingest_parked_letters{x.selector})) > {limit}"),
        summary=lambda x: (f"{x.name}: {{{{ $value }}}} dead letters parked, above max_parked "
                           f"{x.alerts.max_parked}"),
        runbook=_PARKED_RUNBOOK),
)
#: The rules by name.
BY_NAME: dict[str, AlertRule] = {r.name: r for r in RULES}


def judged(*, lag_known: bool) -> tuple[AlertRule, ...]:
    """The rules that can be judged: all of them, or, when the lag is not known, those
    that do not need it."""
    return tuple(r for r in RULES if lag_known or not r.needs_lag)


def colouring(figure: str) -> tuple[str, ...]:
    """The rules that judge one figure of the pipelines page."""
    return tuple(r.name for r in RULES if figure in r.page_figures)


# --------------------------------------------------------------------------- the docs

#: The generated block's markers in the docs (``tests/unit/ops/test_rules.py``).
DOCS_BEGIN = "<!-- generated from kafka_ingest.ops.rules.RULES: do not edit by hand -->"
DOCS_END = "<!-- end of the generated alert rules -->"


def runbook() -> str:
    """The runbook's sections of the rules, as Markdown: a table of the rules, then one
    section per rule (anchored by its name) saying what fires it and what to do."""
    defaults = Alerts()
    head = ["| rule (`alerts` key) | default | breached when it is above the limit | "
            "Prometheus alert | page |", "|---|---|---|---|---|"]
    head += [f"| [`{r.name}`](#{r.name}) | {r.limit(defaults)} | {r.looks_at} | "
             f"`{r.alert}` ({r.severity}) | {', '.join(r.page_figures)} |" for r in RULES]
    sections = [
        f'<a id="{r.name}"></a>\n## `{r.name}`: {r.title}\n\n'
        f"**Breached** above `{r.name}` (default {r.limit(defaults)}): {r.looks_at}."
        f"{' Not judged while the lag is not known.' if r.needs_lag else ''} In the "
        f"Prometheus rules: `{r.alert}` ({r.severity})"
        f"{'' if r.held else ', fired at once: its expression spans the checks already'}."
        f"\n\n{r.runbook}"
        for r in RULES]
    return "\n\n".join([DOCS_BEGIN, "\n".join(head), *sections, DOCS_END]) + "\n"
