"""The monitor DAG's alert rules as a Prometheus rules file (``kafka-ingest alert-rules``).

The same five rules as :mod:`kafka_ingest.ops.monitor`, with each pipeline's own limits
from the pipelines file written into its expressions, over the metrics of
:mod:`kafka_ingest.ops.metrics`:

- ``max_lag``: the lag summed over the partitions is above the limit;
- ``lag_growth_checks``: the summed lag grew at each of the last N check intervals (the
  monitor DAG checks every 5 minutes: the rule compares the lag now, 5, 10, ... minutes
  ago, as the monitor compares its recorded checks);
- ``max_dlq_rate``: the DLQ ratio of the live chunks in the window is above the limit;
- ``freshness_minutes``: no live chunk committed for that long while the lag is above 0
  (or, before any live chunk, the oldest unread message is that old);
- ``max_parked``: parked dead letters above the limit;

plus two of Prometheus' own: ``kafka_ingest_up == 0`` (a cluster or database the metrics
could not reach) and the ingest DAG's last run failed. Checked by ``promtool check rules``
in the tests.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import yaml

from kafka_ingest.config import Pipeline

#: The monitor DAG's schedule, the interval the lag-growth rule compares over.
CHECK_INTERVAL = "5m"
LAG_SUM = "kafka_ingest:lag_messages:sum"
#: Where the on-call reads what an alert means and what to do: the project's runbook, one
#: section per rule (its anchor is the rule's name).
RUNBOOK = "docs/runbook.md"
#: Prometheus' own duration syntax (model.ParseDuration): each unit at most once, largest first.
_DURATION = re.compile(r"^(0|(?=[0-9])([0-9]+y)?([0-9]+w)?([0-9]+d)?([0-9]+h)?([0-9]+m)?"
                       r"([0-9]+s)?([0-9]+ms)?)$")


def _duration(value: str, what: str) -> str:
    if not _DURATION.match(value):
        raise ValueError(f"{what} {value!r} is not a Prometheus duration (e.g. 30s, 5m, 1h)")
    return value


def _minutes(duration: str) -> float:
    scale = {"ms": 1 / 60_000, "s": 1 / 60, "m": 1, "h": 60, "d": 1440, "w": 10080,
             "y": 525600}
    return sum(int(n) * scale[u] for n, u in re.findall(r"([0-9]+)(ms|s|m|h|d|w|y)", duration))


#: One series per partition before summing: the same metrics scraped from both endpoints
#: (the api-server and an exporter) would otherwise count each partition twice.
_ONE_PER_PARTITION = "max by (pipeline, topic, partition)"


def _lag_sum(selector: str, minutes_ago: int = 0) -> str:
    """The summed lag, written out rather than read from the recording rule: a rule of
    another group may be evaluated before or after it, so the alert would see it one
    evaluation late, or not."""
    offset = f" offset {minutes_ago}m" if minutes_ago else ""
    return (f"sum by (pipeline) ({_ONE_PER_PARTITION} "
            f"(clamp_min(kafka_ingest_lag_messages{selector}{offset}, 0)))")


def _selector(pipeline: Pipeline) -> str:
    return '{pipeline="' + pipeline.name.replace("\\", "\\\\").replace('"', '\\"') + '"}'


def _rule(pipeline: Pipeline, rule: str, alert: str, expr: str, summary: str, *,
          hold: str, severity: str = "warning") -> dict[str, Any]:
    return {"alert": alert, "expr": expr, "for": hold,
            "labels": {"severity": severity, "pipeline": pipeline.name, "rule": rule},
            "annotations": {"summary": summary,
                            "description": f"{pipeline.name} ({pipeline.topic} -> "
                                           f"{pipeline.table}): the {rule} rule of its "
                                           "alerts block; see the runbook.",
                            "runbook": f"{RUNBOOK}#{rule}"}}


def pipeline_rules(pipeline: Pipeline, *, hold: str, interval: str) -> list[dict[str, Any]]:
    """The five monitor rules of one pipeline, its limits written in."""
    a, sel = pipeline.alerts, _selector(pipeline)
    step = int(_minutes(interval))
    lag = _lag_sum(sel)
    steps = " and ".join(f"({_lag_sum(sel, k * step)} > {_lag_sum(sel, (k + 1) * step)})"
                         for k in range(a.lag_growth_checks))
    stale_s = a.freshness_minutes * 60
    return [
        _rule(pipeline, "max_lag", "KafkaIngestLagHigh", f"{lag} > {a.max_lag}",
              f"{pipeline.name}: {{{{ $value }}}} messages not ingested, above max_lag "
              f"{a.max_lag}", hold=hold, severity="critical"),
        _rule(pipeline, "lag_growth_checks", "KafkaIngestLagGrowing", steps,
              f"{pipeline.name}: the lag grew at each of the last {a.lag_growth_checks} "
              f"checks ({interval} apart), now {{{{ $value }}}}", hold="0s"),
        _rule(pipeline, "max_dlq_rate", "KafkaIngestDlqRateHigh",
              f"kafka_ingest_dlq_ratio{sel} > {a.max_dlq_rate}",
              f"{pipeline.name}: {{{{ $value | humanizePercentage }}}} of the messages read "
              f"in the last {a.window_minutes} min were dead-lettered, above max_dlq_rate "
              f"{a.max_dlq_rate:.2%}", hold=hold),
        _rule(pipeline, "freshness_minutes", "KafkaIngestStale",
              f"(kafka_ingest_last_live_commit_age_seconds{sel} > {stale_s}"
              f" and on (pipeline) {lag} > 0)"
              f" or on (pipeline) (max by (pipeline)"
              f" (kafka_ingest_oldest_unread_age_seconds{sel}) > {stale_s}"
              f" unless on (pipeline) kafka_ingest_last_live_commit_timestamp_seconds{sel})",
              f"{pipeline.name}: no live chunk committed for {{{{ $value | humanizeDuration }}}}"
              f" while messages wait, above freshness_minutes {a.freshness_minutes}",
              hold=hold, severity="critical"),
        _rule(pipeline, "max_parked", "KafkaIngestParkedLetters",
              f"sum by (pipeline) (max by (pipeline, reason) (kafka_ingest_parked_letters{sel}))"
              f" > {a.max_parked}",
              f"{pipeline.name}: {{{{ $value }}}} dead letters parked, above max_parked "
              f"{a.max_parked}", hold=hold),
    ]


def rules_document(pipelines: Iterable[Pipeline], *, hold: str = "5m",
                   interval: str = CHECK_INTERVAL) -> dict[str, Any]:
    """The rules file as a document: a recording rule for the summed lag, the common
    rules, then one group per pipeline. ``hold``: each alert's ``for`` (how long a breach
    lasts before it fires); ``interval``: the lag-growth rule's step."""
    hold, interval = _duration(hold, "--for"), _duration(interval, "--check-interval")
    if _minutes(interval) < 1 or _minutes(interval) != int(_minutes(interval)):
        raise ValueError(f"--check-interval {interval!r} must be a whole number of minutes")
    common = {"name": "kafka-ingest", "rules": [
        {"record": LAG_SUM,
         "expr": _lag_sum("")},
        {"alert": "KafkaIngestTargetDown", "expr": "kafka_ingest_up == 0", "for": "2m",
         "labels": {"severity": "critical"},
         "annotations": {"summary": "the kafka-ingest metrics cannot reach {{ $labels."
                                    "component }} through {{ $labels.connection }}",
                         "runbook": f"{RUNBOOK}#target_down"}},
        {"alert": "KafkaIngestLastRunFailed", "expr": "kafka_ingest_last_run_success == 0",
         "for": "0s", "labels": {"severity": "warning"},
         "annotations": {"summary": "{{ $labels.pipeline }}: the ingest DAG's last run "
                                    "failed (Airflow retries it; see its task log)",
                         "runbook": f"{RUNBOOK}#last_run_failed"}},
    ]}
    groups = [common] + [{"name": f"kafka-ingest-{p.name}",
                          "rules": pipeline_rules(p, hold=hold, interval=interval)}
                         for p in sorted(pipelines, key=lambda p: p.name)]
    return {"groups": groups}


def render(pipelines: Iterable[Pipeline], *, hold: str = "5m",
           interval: str = CHECK_INTERVAL) -> str:
    """The rules file's YAML."""
    header = ("# Generated by `kafka-ingest alert-rules` from the pipelines file: edit the\n"
              "# pipelines' alerts blocks and generate again rather than editing this file.\n")
    return header + yaml.safe_dump(rules_document(pipelines, hold=hold, interval=interval),
                                   sort_keys=False, width=100)
