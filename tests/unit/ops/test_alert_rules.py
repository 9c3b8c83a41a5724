"""The Prometheus rules file of ``kafka-ingest alert-rules`` without services: each
pipeline's limits in its expressions, the document's shape, escaping and the refused
durations. Then (``integration``: promtool, built once with Go and cached) promtool
checks a generated file and unit-tests the lag rules on input series."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from kafka_ingest.config import Pipeline, parse_pipelines
from kafka_ingest.ops.alert_rules import LAG_SUM, render, rules_document

BODY: dict[str, Any] = {
    "topic": "t-in",
    "contract": {"event_type": "metric_event", "version": 2},
    "table": "t_rows",
    "dlq_topic": "t-in-dlq",
}
#: Limits unlike the defaults, so a default written in place of the pipeline's shows.
CUSTOM = {"max_lag": 1234, "lag_growth_checks": 2, "max_dlq_rate": 0.125,
          "freshness_minutes": 7, "max_parked": 9}
#: A name the pipelines file refuses, built past validation to test the escaping anyway:
#: a double quote and a backslash, the two characters a PromQL string must escape.
ODD_NAME = 'we"ird\\x'


def pipelines(**alerts_by_name: dict[str, Any]) -> list[Pipeline]:
    loaded = parse_pipelines({"pipelines": {
        name: {**BODY, "alerts": alerts} for name, alerts in alerts_by_name.items()}})
    return list(loaded.values())


def odd(alerts: dict[str, Any]) -> Pipeline:
    (p,) = pipelines(p1=alerts)
    return p.model_copy(update={"name": ODD_NAME})


def rules_of(doc: dict[str, Any], group: str) -> dict[str, dict[str, Any]]:
    (found,) = [g for g in doc["groups"] if g["name"] == group]
    return {r.get("alert") or r["record"]: r for r in found["rules"]}


# --------------------------------------------------------------------------- the limits


def lag_sum(pipeline: str, offset: str = "") -> str:
    """The summed lag each alert writes out (not the recording rule of another group)."""
    return ("sum by (pipeline) (max by (pipeline, topic, partition) (clamp_min("
            f'kafka_ingest_lag_messages{{pipeline="{pipeline}"}}{offset}, 0)))')


def test_each_limit_is_written_into_its_rules_expression() -> None:
    doc = yaml.safe_load(render(pipelines(p1=CUSTOM, p2={})))
    p1 = rules_of(doc, "kafka-ingest-p1")

    assert p1["KafkaIngestLagHigh"]["expr"] == (
        f"{lag_sum('p1')} > 1234")
    assert p1["KafkaIngestDlqRateHigh"]["expr"] == 'kafka_ingest_dlq_ratio{pipeline="p1"} > 0.125'
    assert p1["KafkaIngestParkedLetters"]["expr"] == (
        'sum by (pipeline) (max by (pipeline, reason) (kafka_ingest_parked_letters'
        '{pipeline="p1"})) > 9')
    stale = p1["KafkaIngestStale"]["expr"]
    # 7 minutes, in the seconds the age metrics are in; both branches use it
    assert 'kafka_ingest_last_live_commit_age_seconds{pipeline="p1"} > 420 ' in stale
    assert ('max by (pipeline) (kafka_ingest_oldest_unread_age_seconds{pipeline="p1"}) > 420 '
            in stale)
    assert stale.count("> 420") == 2
    assert p1["KafkaIngestLagGrowing"]["expr"] == (
        f"({lag_sum('p1')} > {lag_sum('p1', ' offset 5m')})"
        f" and ({lag_sum('p1', ' offset 5m')} > {lag_sum('p1', ' offset 10m')})")

    p2 = rules_of(doc, "kafka-ingest-p2")  # the defaults: its own limits, not p1's
    assert p2["KafkaIngestLagHigh"]["expr"] == f"{lag_sum('p2')} > 100000"
    assert p2["KafkaIngestDlqRateHigh"]["expr"].endswith("} > 0.05")
    assert p2["KafkaIngestStale"]["expr"].count("> 1800") == 2
    assert p2["KafkaIngestParkedLetters"]["expr"].endswith(") > 1000")


_SUM = (r"sum by \(pipeline\) \(max by \(pipeline, topic, partition\) "
        r"\(clamp_min\(kafka_ingest_lag_messages\{pipeline=\"p1\"\}%s, 0\)\)\)")
_STEP = re.compile(r"\(" + _SUM % r"(?: offset (\d+)m)?" + " > " + _SUM % r" offset (\d+)m"
                   + r"\)")


@pytest.mark.parametrize(("checks", "interval", "steps"), [
    # one check: now against one interval ago
    (1, "5m", [(0, 5)]),
    (3, "5m", [(0, 5), (5, 10), (10, 15)]),
    # another monitor schedule: the steps follow the interval
    (3, "10m", [(0, 10), (10, 20), (20, 30)]),
    (2, "1h", [(0, 60), (60, 120)]),
])
def test_lag_growth_compares_n_steps_at_multiples_of_the_interval(
        checks: int, interval: str, steps: list[tuple[int, int]]) -> None:
    doc = rules_document(pipelines(p1={"lag_growth_checks": checks}), interval=interval)
    expr = rules_of(doc, "kafka-ingest-p1")["KafkaIngestLagGrowing"]["expr"]

    found = [(int(a or 0), int(b)) for a, b in _STEP.findall(expr)]
    assert found == steps
    assert expr.count(" and ") == checks - 1
    assert expr.count(" > ") == checks


def test_for_is_applied_to_each_pipeline_rule_but_lag_growth() -> None:
    doc = rules_document(pipelines(p1=CUSTOM), hold="7m")
    holds = {name: r.get("for") for name, r in rules_of(doc, "kafka-ingest-p1").items()}

    assert holds == {"KafkaIngestLagHigh": "7m", "KafkaIngestDlqRateHigh": "7m",
                     "KafkaIngestStale": "7m", "KafkaIngestParkedLetters": "7m",
                     # the expression already spans N intervals of the past
                     "KafkaIngestLagGrowing": "0s"}
    common = rules_of(doc, "kafka-ingest")
    assert common["KafkaIngestTargetDown"]["for"] == "2m"
    assert common["KafkaIngestLastRunFailed"]["for"] == "0s"


def test_the_yaml_parses_into_groups_with_the_recording_rule_first() -> None:
    text = render(pipelines(zeta=CUSTOM, alpha={}))

    assert text.startswith("# Generated by `kafka-ingest alert-rules`")
    doc = yaml.safe_load(text)
    assert doc == rules_document(pipelines(zeta=CUSTOM, alpha={}))
    assert [g["name"] for g in doc["groups"]] == [
        "kafka-ingest", "kafka-ingest-alpha", "kafka-ingest-zeta"]  # sorted by name
    first = doc["groups"][0]["rules"][0]
    assert first == {"record": "kafka_ingest:lag_messages:sum",
                     "expr": "sum by (pipeline) (max by (pipeline, topic, partition) "
                             "(clamp_min(kafka_ingest_lag_messages, 0)))"}
    assert first["record"] == LAG_SUM
    zeta = rules_of(doc, "kafka-ingest-zeta")
    assert list(zeta) == ["KafkaIngestLagHigh", "KafkaIngestLagGrowing",
                          "KafkaIngestDlqRateHigh", "KafkaIngestStale",
                          "KafkaIngestParkedLetters"]
    assert {r["labels"]["rule"] for r in zeta.values()} == {
        "max_lag", "lag_growth_checks", "max_dlq_rate", "freshness_minutes", "max_parked"}
    assert {r["labels"]["pipeline"] for r in zeta.values()} == {"zeta"}
    assert zeta["KafkaIngestLagHigh"]["labels"]["severity"] == "critical"
    assert zeta["KafkaIngestLagHigh"]["annotations"]["summary"] == (
        "zeta: {{ $value }} messages not ingested, above max_lag 1234")


def test_a_double_quote_in_a_pipeline_name_is_escaped_in_every_selector() -> None:
    doc = yaml.safe_load(render([odd(CUSTOM)]))
    rules = rules_of(doc, f"kafka-ingest-{ODD_NAME}")

    assert rules["KafkaIngestLagHigh"]["expr"] == (
        'sum by (pipeline) (max by (pipeline, topic, partition) (clamp_min('
        'kafka_ingest_lag_messages{pipeline="we\\"ird\\\\x"}, 0))) > 1234')
    selectors = 0
    for rule in rules.values():
        assert rule["labels"]["pipeline"] == ODD_NAME  # a label value: YAML, not PromQL
        for quoted in re.findall(r'pipeline="((?:[^"\\]|\\.)*)"', rule["expr"]):
            assert quoted.replace('\\"', '"').replace("\\\\", "\\") == ODD_NAME
            selectors += 1
    assert selectors == 1 + 4 + 1 + 4 + 1  # lag, growth (2 steps), dlq, stale, parked


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"hold": "5 minutes"}, "--for '5 minutes' is not a Prometheus duration"),
    ({"hold": ""}, "--for '' is not a Prometheus duration"),
    ({"hold": "5"}, "--for '5' is not a Prometheus duration"),  # no unit
    ({"interval": "5 minutes"}, "--check-interval '5 minutes' is not a Prometheus duration"),
    ({"interval": ""}, "--check-interval '' is not a Prometheus duration"),
    # the lag-growth steps are written in whole minutes
    ({"interval": "90s"}, "--check-interval '90s' must be a whole number of minutes"),
    ({"interval": "5m30s"}, "--check-interval '5m30s' must be a whole number of minutes"),
    ({"interval": "30s"}, "--check-interval '30s' must be a whole number of minutes"),
    ({"interval": "0"}, "--check-interval '0' must be a whole number of minutes"),
])
def test_a_bad_duration_is_a_value_error_naming_the_option(kwargs: dict[str, str],
                                                           message: str) -> None:
    with pytest.raises(ValueError) as exc:
        render(pipelines(p1={}), **kwargs)
    assert message in str(exc.value)


@pytest.mark.parametrize("hold", [
    "1s5m",  # units out of order
    "5m5m",  # a unit twice
])
def test_a_duration_prometheus_refuses_is_refused_here(hold: str) -> None:
    with pytest.raises(ValueError, match="is not a Prometheus duration"):
        render(pipelines(p1={}), hold=hold)


def test_good_durations_are_taken_as_written() -> None:
    doc = rules_document(pipelines(p1={"lag_growth_checks": 1}), hold="1h30m",
                         interval="120s")
    rules = rules_of(doc, "kafka-ingest-p1")
    assert rules["KafkaIngestLagHigh"]["for"] == "1h30m"
    assert rules["KafkaIngestLagGrowing"]["expr"].endswith(" offset 2m, 0))))")


# --------------------------------------------------------------------------- promtool


@pytest.fixture(scope="module")
def promtool_binary() -> Path:
    from kafka_ingest_dev.prometheus import install

    return install().promtool  # cached after the first build (minutes on a cold Go cache)


@pytest.mark.integration
def test_promtool_accepts_the_rules_of_several_pipelines(promtool_binary: Path,
                                                         tmp_path: Path) -> None:
    from kafka_ingest_dev.prometheus import check_rules

    several = [*pipelines(p1={}, p2=CUSTOM,
                          # a rate small enough that Python writes it as 1e-05
                          p3={"max_dlq_rate": 0.00001, "lag_growth_checks": 10}),
               odd({"lag_growth_checks": 1})]
    path = tmp_path / "kafka-ingest.rules.yml"
    path.write_text(render(several, hold="10m", interval="15m"))

    report = check_rules(path, binary=promtool_binary)

    assert "SUCCESS: 23 rules found" in report  # 3 common + 5 for each of 4 pipelines


def _lag_series(pipeline: str, partition: int, values: str) -> dict[str, str]:
    name = pipeline.replace("\\", "\\\\").replace('"', '\\"')
    return {"series": f'kafka_ingest_lag_messages{{pipeline="{name}",topic="t-in",'
                      f'partition="{partition}"}}', "values": values}


def _annotations(name: str, rule: str, summary: str) -> dict[str, str]:
    return {"summary": summary,
            "description": f"{name} (t-in -> t_rows): the {rule} rule of its alerts block; "
                           "see the runbook.",
            "runbook": f"docs/runbook.md#{rule}"}


def _lag_high(name: str, value: int) -> dict[str, Any]:
    return {"exp_labels": {"severity": "critical", "pipeline": name, "rule": "max_lag"},
            "exp_annotations": _annotations(
                name, "max_lag", f"{name}: {value} messages not ingested, above max_lag 100")}


def _growing(value: int) -> dict[str, Any]:
    return {"exp_labels": {"severity": "warning", "pipeline": "p1",
                           "rule": "lag_growth_checks"},
            "exp_annotations": _annotations(
                "p1", "lag_growth_checks", "p1: the lag grew at each of the last 3 checks "
                                           f"(5m apart), now {value}")}


@pytest.mark.integration
def test_promtool_lag_high_and_lag_growing_fire_exactly_when_they_should(
        promtool_binary: Path, tmp_path: Path) -> None:
    from kafka_ingest_dev.prometheus import run_rule_tests

    limits = {"max_lag": 100, "lag_growth_checks": 3}
    rules = tmp_path / "rules.yml"
    rules.write_text(render([*pipelines(p1=limits, p2=limits), odd(limits)], hold="2m"))
    # Prometheus evaluates rule groups independently (promtool, in a random order), so an
    # alert may see the summed lag recorded one evaluation (1m) late. Each eval_time is
    # one where that delay cannot change the outcome.
    high = {
        "interval": "1m",
        "input_series": [
            # p1 summed: 90, 100, 100, then 110 from minute 3 on. Partition 2's -30 counts
            # as 0 (the recording rule's clamp_min): without the clamp, p1 would stay at 80.
            _lag_series("p1", 0, "40x10"),
            _lag_series("p1", 1, "50 60 60 70x7"),
            _lag_series("p1", 2, "-30x10"),
            # p2: exactly at the limit for ever, never above it
            _lag_series("p2", 0, "100x10"),
            # the odd name: its selector must match its series
            _lag_series(ODD_NAME, 0, "150x10"),
        ],
        "alert_rule_test": [
            # the odd name is above from the start but pending for the 2 minutes of `for`
            {"eval_time": "1m", "alertname": "KafkaIngestLagHigh", "exp_alerts": []},
            # p1 above since minute 3 (or 4), pending; had its 100 of minutes 1-2 counted
            # as above max_lag 100, it would fire now
            {"eval_time": "4m", "alertname": "KafkaIngestLagHigh",
             "exp_alerts": [_lag_high(ODD_NAME, 150)]},
            # p1 firing too; p2 never
            {"eval_time": "6m", "alertname": "KafkaIngestLagHigh",
             "exp_alerts": [_lag_high("p1", 110), _lag_high(ODD_NAME, 150)]},
            {"eval_time": "10m", "alertname": "KafkaIngestLagHigh",
             "exp_alerts": [_lag_high("p1", 110), _lag_high(ODD_NAME, 150)]},
        ],
    }
    growing = {
        "interval": "5m",  # one sample per monitor check, at 0, 5, ... 40 min
        "input_series": [
            # p1 summed over its partitions (one stops growing while the other goes on):
            # 10, 20, 30, 40, 50, 50, 60, 70, 80
            _lag_series("p1", 0, "10 15 20 25 30 30 30 30 30"),
            _lag_series("p1", 1, "0 5 10 15 20 20 30 40 50"),
        ],
        # evaluated between samples: a check's lag is the newest sample
        "alert_rule_test": [
            # grown at 2 intervals only: the third one back is before the first sample
            {"eval_time": "12m", "alertname": "KafkaIngestLagGrowing", "exp_alerts": []},
            # 10 < 20 < 30 < 40: grown at each of the 3 intervals
            {"eval_time": "17m", "alertname": "KafkaIngestLagGrowing",
             "exp_alerts": [_growing(40)]},
            {"eval_time": "22m", "alertname": "KafkaIngestLagGrowing",
             "exp_alerts": [_growing(50)]},
            # a flat step (50 -> 50) in the last 3 intervals: no alert until it leaves them
            {"eval_time": "27m", "alertname": "KafkaIngestLagGrowing", "exp_alerts": []},
            {"eval_time": "32m", "alertname": "KafkaIngestLagGrowing", "exp_alerts": []},
            {"eval_time": "37m", "alertname": "KafkaIngestLagGrowing", "exp_alerts": []},
            {"eval_time": "42m", "alertname": "KafkaIngestLagGrowing",
             "exp_alerts": [_growing(80)]},
        ],
    }
    tests = tmp_path / "rules.test.yml"
    tests.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m",
                                     "tests": [high, growing]}, sort_keys=False))

    report = run_rule_tests(tests, binary=promtool_binary)

    assert "SUCCESS" in report
