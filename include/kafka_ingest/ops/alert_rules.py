"""The monitor DAG's alert rules as a Prometheus rules file (``kafka-ingest alert-rules``).

The rules of the monitor's table (:data:`kafka_ingest.ops.rules.RULES`: each one's
expression, summary, alert name, severity and hold), with each pipeline's own limits from
the pipelines file written into its expressions, over the metrics of
:mod:`kafka_ingest.ops.metrics`; the lag-growth rule compares the lag now, 5, 10, ...
minutes ago (the monitor DAG's schedule), as the monitor compares its recorded checks.
Plus two of Prometheus' own: ``kafka_ingest_up == 0`` (a cluster or database the metrics
could not reach) and the ingest DAG's last run failed. Checked by ``promtool check rules``
in the tests, and against the monitor's judgement (``tests/unit/ops/test_rules.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import yaml

from kafka_ingest.config import Pipeline
from kafka_ingest.ops.rules import RULES, RUNBOOK, AlertRule, Limits, lag_sum

#: The monitor DAG's schedule, the interval the lag-growth rule compares over.
CHECK_INTERVAL = "5m"
LAG_SUM = "kafka_ingest:lag_messages:sum"
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


def _selector(pipeline: Pipeline) -> str:
    return '{pipeline="' + pipeline.name.replace("\\", "\\\\").replace('"', '\\"') + '"}'


def _rule(pipeline: Pipeline, rule: AlertRule, limits: Limits, hold: str) -> dict[str, Any]:
    return {"alert": rule.alert, "expr": rule.promql(limits),
            "for": hold if rule.held else "0s",
            "labels": {"severity": rule.severity, "pipeline": pipeline.name,
                       "rule": rule.name},
            "annotations": {"summary": rule.summary(limits),
                            "description": f"{pipeline.name} ({pipeline.topic} -> "
                                           f"{pipeline.table}): the {rule.name} rule of its "
                                           "alerts block; see the runbook.",
                            "runbook": f"{RUNBOOK}#{rule.name}"}}


def pipeline_rules(pipeline: Pipeline, *, hold: str, interval: str) -> list[dict[str, Any]]:
    """The monitor's rules (:data:`~kafka_ingest.ops.rules.RULES`) of one pipeline, its
    limits written in."""
    limits = Limits(selector=_selector(pipeline), name=pipeline.name, alerts=pipeline.alerts,
                    step_minutes=int(_minutes(interval)), interval=interval)
    return [_rule(pipeline, rule, limits, hold) for rule in RULES]


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
         "expr": lag_sum("")},
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
