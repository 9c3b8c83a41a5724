"""The alert rules' one table (:mod:`kafka_ingest.ops.rules`) and what is made from it.

Without services: the table covers exactly the limits of the ``alerts`` block; the rules
file, the metrics' ``alert_limit``/``alert_breached`` and the pipelines page's colours
name its rules and nothing else; the docs hold its runbook block as generated.

Then (``integration``: promtool, built once with Go and cached) the monitor's judgement
and the Prometheus rules are run on the same figures and must agree: for each scenario (a
pipeline's state at successive monitor checks, 5 minutes apart) Python judges the last
check with :func:`kafka_ingest.ops.monitor.evaluate`, and promtool evaluates each rule's
expression from the generated rules file over the series the exporter
(:func:`kafka_ingest.ops.metrics.families`) serves for the same states. The scenarios put
every rule just at and just above its limit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from kafka_ingest.config import Alerts, Pipeline, parse_pipelines
from kafka_ingest.ops import rules as table
from kafka_ingest.ops.alert_rules import render, rules_document
from kafka_ingest.ops.lag import LagRow, total_lag
from kafka_ingest.ops.metrics import families
from kafka_ingest.ops.monitor import CheckResult, Figures, evaluate
from kafka_ingest.ops.observe import PipelineView, Snapshot
from kafka_ingest.ops.page import overview
from kafka_ingest.ops.rules import DOCS_BEGIN, DOCS_END, RULES, runbook

ROOT = Path(__file__).resolve().parents[3]
BODY: dict[str, Any] = {
    "topic": "t-in",
    "contract": {"event_type": "metric_event", "version": 2},
    "table": "t_rows",
    "dlq_topic": "t-in-dlq",
}
#: Limits unlike the defaults, so a default written in place of the pipeline's shows.
LIMITS = {"max_lag": 100, "lag_growth_checks": 2, "max_dlq_rate": 0.1, "freshness_minutes": 10,
          "max_parked": 5}
#: The monitor DAG's schedule: one check (and one sample) every 5 minutes.
STEP_S = 300


def pipeline(name: str = "p1", **alerts: Any) -> Pipeline:
    return parse_pipelines({"pipelines": {name: {**BODY, "alerts": {**LIMITS, **alerts}}}})[name]


# --------------------------------------------------------------------------- the table


def test_the_table_has_one_rule_per_limit_of_the_alerts_block() -> None:
    limits = set(Alerts.model_fields) - {"window_minutes", "notifiers"}
    assert [r.name for r in RULES] == list(table.BY_NAME)
    assert set(table.BY_NAME) == limits
    assert len({r.alert for r in RULES}) == len(RULES)


def test_the_rules_file_has_each_rule_of_the_table_with_its_name_severity_and_hold() -> None:
    doc = rules_document([pipeline()], hold="7m")
    (group,) = [g for g in doc["groups"] if g["name"] == "kafka-ingest-p1"]
    assert [(r["alert"], r["labels"]["rule"], r["labels"]["severity"], r["for"])
            for r in group["rules"]] == [
        (r.alert, r.name, r.severity, "7m" if r.held else "0s") for r in RULES]


def test_the_metrics_export_each_rules_limit_and_judge_the_rules_the_lag_allows() -> None:
    p = pipeline()
    now = datetime(2026, 3, 1, tzinfo=UTC)
    for lag_known in (True, False):
        f = Figures(pipeline="p1", now=now, total_lag=5 if lag_known else None)
        v = PipelineView(pipeline=p, result=CheckResult(f, tuple(evaluate(p.alerts, f))))
        found = {m.name: m for m in families(Snapshot((v,), {}, 0.0, 0.0), now=0.0)}
        limits = {s.labels["rule"]: s.value for s in found["kafka_ingest_alert_limit"].samples}
        breached = {s.labels["rule"] for s in found["kafka_ingest_alert_breached"].samples}
        assert limits == {r.name: float(r.limit(p.alerts)) for r in RULES}
        assert breached == {r.name for r in RULES if lag_known or not r.needs_lag}


def test_the_pages_figures_are_coloured_by_the_rules_that_name_them() -> None:
    p = pipeline()
    f = Figures(pipeline="p1", now=datetime(2026, 3, 1, tzinfo=UTC), total_lag=500, parked=0)
    v = PipelineView(pipeline=p, result=CheckResult(f, tuple(evaluate(p.alerts, f))))
    html = overview(Snapshot((v,), {}, 0.0, 0.0), {}, airflow="/a", here="/h", now=0.0)
    shown = {figure: state for state, figure
             in re.findall(r'<td class="(\w+)" data-figure="(\w+)"', html)}
    assert set(shown) == {f for r in RULES for f in r.page_figures}
    # max_lag (500 > 100) colours the lag; the other figures' rules are not breached
    assert shown == {**dict.fromkeys(shown, "ok"), "lag": "bad"}


def test_the_docs_hold_the_runbook_block_as_generated() -> None:
    """The rules' runbook sections are generated from the table (:func:`runbook`); the
    block lives in one page of docs/."""
    holders = [p for p in sorted((ROOT / "docs").rglob("*.md")) if DOCS_BEGIN in p.read_text()]
    assert len(holders) == 1, holders
    text = holders[0].read_text()
    start = text.index(DOCS_BEGIN)
    block = text[start:text.index(DOCS_END, start) + len(DOCS_END)] + "\n"
    assert block == runbook(), (
        f"{holders[0]} is stale: replace its block with the output of python -c 'from "
        "kafka_ingest.ops.rules import runbook; print(runbook(), end=\"\")'")


def test_the_runbook_names_each_rule_its_alert_and_default_limit() -> None:
    text = runbook()
    defaults = Alerts()
    for r in RULES:
        assert f'<a id="{r.name}"></a>\n## `{r.name}`: {r.title}' in text
        assert f"`{r.alert}` ({r.severity})" in text
        assert f"**Breached** above `{r.name}` (default {r.limit(defaults)})" in text


# --------------------------------------------------------------------------- agreement


@dataclass(frozen=True)
class State:
    """A pipeline at one monitor check."""

    #: The lag of each partition (negative: the stored offset past the high watermark);
    #: None: Kafka could not tell it.
    lags: tuple[int, ...] | None
    #: Read and dead-lettered by the live chunks of the window.
    read: int = 0
    dead: int = 0
    #: Seconds since the newest live chunk (None: none was ever committed).
    commit_age_s: int | None = 60
    parked: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Scenario:
    name: str
    states: Sequence[State]  # one per check, 5 minutes apart, oldest first


SCENARIOS = [
    Scenario("calm", [State((5, 0), read=1000, dead=10, parked={"undecodable": 1})]),
    # every figure exactly at its limit: a limit is strict, nothing breaches
    Scenario("at_every_limit", [
        State((50, 40, 0)), State((40, 40, 10)),
        State((60, 40, -7), read=100, dead=10, commit_age_s=600,
              parked={"undecodable": 3, "bad_key": 2})]),
    # every figure just above its limit
    Scenario("above_every_limit", [
        State((59, 40, 0)), State((60, 40, 0)),
        State((61, 40, -7), read=1000, dead=101, commit_age_s=601,
              parked={"undecodable": 4, "bad_key": 2})]),
    # no live chunk ever: counted from the monitor's first check (Python) and from the
    # oldest unread message (PromQL); here both are the first check
    Scenario("never_committed_at_the_limit", [State((30,), commit_age_s=None)] * 3),
    Scenario("never_committed_stale", [State((30,), commit_age_s=None)] * 4),
    # long without a live chunk, but nothing waits
    Scenario("caught_up_and_idle", [State((0, -3), commit_age_s=7200)]),
    # the lag grew, then held, then grew: not at each of the last 2 checks
    Scenario("growth_interrupted", [State((10,)), State((20,)), State((20,)), State((30,))]),
    Scenario("growing", [State((10,)), State((20,)), State((21,)), State((22,))]),
    # Kafka out of reach: the lag rules are not judged, the others are
    Scenario("lag_unknown", [State((5,)), State(None, read=10, dead=5, commit_age_s=7200,
                                                parked={"undecodable": 9})]),
]


def _rows(lags: tuple[int, ...]) -> tuple[LagRow, ...]:
    return tuple(LagRow(pipeline="p1", topic="t-in", partition=p, stored_offset=1000,
                        group_offset=None, low=0, high=1000 + lag) for p, lag in enumerate(lags))


def _figures(p: Pipeline, states: Sequence[State], i: int) -> Figures:
    """The monitor's figures at check ``i`` (time ``i * 5 min``), as :func:`gather` reads
    them: the recorded totals of the earlier checks, the first check as watched-since."""
    s, now = states[i], i * STEP_S
    rows = None if s.lags is None else _rows(s.lags)
    history = tuple(total_lag(_rows(x.lags)) for x in states[:i + 1] if x.lags is not None)
    return Figures(
        pipeline=p.name, now=datetime.fromtimestamp(now, UTC),
        total_lag=None if rows is None else total_lag(rows), partitions=len(rows or ()),
        partition_lags={r.partition: max(0, r.lag) for r in rows or ()},
        lag_history=history[-(p.alerts.lag_growth_checks + 1):],
        window_minutes=p.alerts.window_minutes, read=s.read, dead_lettered=s.dead,
        last_live_commit=(None if s.commit_age_s is None
                          else datetime.fromtimestamp(now - s.commit_age_s, UTC)),
        watched_since=datetime.fromtimestamp(0, UTC), parked=sum(s.parked.values()))


def _samples(p: Pipeline, states: Sequence[State], i: int) -> dict[str, float]:
    """What the exporter serves at check ``i``: series -> value."""
    s, now = states[i], float(i * STEP_S)
    f = _figures(p, states, i)
    rows = None if s.lags is None else _rows(s.lags)
    view = PipelineView(
        pipeline=p, lag_rows=rows, result=CheckResult(f, tuple(evaluate(p.alerts, f))),
        # the oldest unread message of a lagging partition: there since the first check
        oldest_unread={r.partition: 0.0 for r in rows or () if r.lag > 0},
        parked_by_reason=dict(s.parked))
    out = {}
    for family in families(Snapshot((view,), {}, now, 0.0), now=now):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def test_the_scenarios_put_each_rule_on_both_sides_of_its_limit() -> None:
    breached = {s.name: {b.rule for b in evaluate(pipeline().alerts,
                                                  _figures(pipeline(), s.states,
                                                           len(s.states) - 1))}
                for s in SCENARIOS}
    for r in RULES:
        assert any(r.name in found for found in breached.values()), r.name
        assert any(r.name not in found for found in breached.values()), r.name
    assert breached["at_every_limit"] == set()
    assert breached["above_every_limit"] == {r.name for r in RULES}


def _values(name: str, samples: Sequence[Mapping[str, float]]) -> str:
    """One series' values at the checks, in promtool's notation: a series a scrape no
    longer has is stale from then on (as Prometheus marks it), none yet is missing."""
    seen, out = False, []
    for s in samples:
        seen = seen or name in s
        out.append(repr(s[name]) if name in s else "stale" if seen else "_")
    return " ".join(out)


@pytest.fixture(scope="module")
def promtool_binary() -> Path:
    from kafka_ingest_dev.prometheus import install

    return install().promtool


@pytest.mark.integration
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_the_monitor_and_the_prometheus_rules_agree(scenario: Scenario, promtool_binary: Path,
                                                    tmp_path: Path) -> None:
    from kafka_ingest_dev.prometheus import run_rule_tests

    p, states = pipeline(), scenario.states
    last = len(states) - 1
    python = {b.rule for b in evaluate(p.alerts, _figures(p, states, last))}

    rules_file = tmp_path / "rules.yml"
    rules_file.write_text(render([p], hold="0s"))
    (group,) = [g for g in yaml.safe_load(rules_file.read_text())["groups"]
                if g["name"] == "kafka-ingest-p1"]
    samples = [_samples(p, states, i) for i in range(len(states))]
    series = sorted({name for s in samples for name in s})
    tests = {"rule_files": [str(rules_file)], "evaluation_interval": "1m", "tests": [{
        "interval": f"{STEP_S}s",
        "input_series": [{"series": name, "values": _values(name, samples)}
                         for name in series],
        # each rule's alert expression as the file has it: breached (1) or not (0) now
        "promql_expr_test": [
            {"expr": f"count({r['expr']}) or vector(0)", "eval_time": f"{last * STEP_S}s",
             "exp_samples": [{"labels": "{}",
                              "value": int(r["labels"]["rule"] in python)}]}
            for r in group["rules"]],
    }]}
    test_file = tmp_path / "agree.test.yml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False, width=1000))

    report = run_rule_tests(test_file, binary=promtool_binary)

    assert "SUCCESS" in report, report
