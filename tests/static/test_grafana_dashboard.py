"""deploy/grafana/kafka-ingest.json, checked statically (no Grafana, no Prometheus here): it
loads, imports anywhere through its ``${DS_PROMETHEUS}`` input, and every PromQL expression
names only metrics that :mod:`kafka_ingest.ops.metrics` serves (or the summed-lag recording
rule of :mod:`kafka_ingest.ops.alert_rules`), so renaming a metric breaks this test rather
than the dashboard; every expression over a per-pipeline metric follows the ``pipeline``
variable."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from kafka_ingest.ops import alert_rules, metrics, rules
from tests.support import ROOT

DASHBOARD = ROOT / "deploy" / "grafana" / "kafka-ingest.json"
DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
FILTER = 'pipeline=~"$pipeline"'
#: A metric name of ours and the selector right after it, if any.
NAME = re.compile(r"(kafka_ingest[_:a-zA-Z0-9]*)(\{[^}]*\})?")


def _dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside (collapsed) rows included."""
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in _panels(dashboard["panels"])
            for target in panel.get("targets", [])]


def _known() -> dict[str, bool]:
    """Full metric name -> whether it carries the ``pipeline`` label."""
    known = {m["name"]: "pipeline" in m["labels"].split(",") for m in metrics.describe()}
    known[alert_rules.LAG_SUM] = True
    return known


def _problems(exprs: list[tuple[str, str]], known: dict[str, bool]) -> list[str]:
    """What is wrong with the expressions: unknown names, per-pipeline metrics unfiltered."""
    found = []
    for title, expr in exprs:
        names = NAME.findall(expr)
        if not names:
            found.append(f"{title}: no kafka_ingest metric in {expr!r}")
        for name, selector in names:
            if name not in known:
                found.append(f"{title}: unknown metric {name}")
            elif known[name] and FILTER not in selector:
                found.append(f"{title}: {name} not filtered on {FILTER}")
    return found


def test_the_dashboard_loads_with_its_identity_and_input() -> None:
    dashboard = _dashboard()
    assert dashboard["uid"] == "kafka-ingest"
    assert dashboard["title"] == "Kafka ingest"
    assert dashboard["schemaVersion"] == 39
    assert dashboard["id"] is None
    inputs = {i["name"]: i for i in dashboard["__inputs"]}
    assert inputs["DS_PROMETHEUS"]["type"] == "datasource"
    assert inputs["DS_PROMETHEUS"]["pluginId"] == "prometheus"


def test_every_expression_names_only_served_metrics_filtered_by_pipeline() -> None:
    exprs = _exprs(_dashboard())
    assert len(exprs) >= 15
    assert _problems(exprs, _known()) == []


def test_the_check_catches_a_metric_renamed_in_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    renamed = dict(metrics.METRICS)
    renamed["lag_messages_now"] = renamed.pop("lag_messages")
    monkeypatch.setattr(metrics, "METRICS", renamed)
    problems = _problems(_exprs(_dashboard()), _known())
    assert any("unknown metric kafka_ingest_lag_messages" in p for p in problems), problems


def test_the_check_catches_a_bucket_and_an_unfiltered_selector() -> None:
    known = _known()
    assert _problems([("h", "rate(kafka_ingest_lag_messages_bucket[5m])")], known)
    assert _problems([("u", "sum(kafka_ingest_dlq_ratio)")], known)
    assert _problems([("u", 'kafka_ingest_dlq_ratio{pipeline="a"}')], known)
    assert not _problems([("k", "kafka_ingest_up == 0")], known)


def test_the_dashboard_covers_every_metric_it_was_built_for() -> None:
    used = {name for _, expr in _exprs(_dashboard()) for name, _ in NAME.findall(expr)}
    wanted = {alert_rules.LAG_SUM} | {
        metrics.PREFIX + n for n in (
            "up", "lag_messages", "group_lag_messages", "oldest_unread_age_seconds",
            "rows_inserted_total", "messages_read_total", "dead_letters_total", "dlq_ratio",
            "alert_limit", "parked_letters", "last_live_commit_age_seconds",
            "alert_breached", "last_run_success")}
    assert wanted <= used, wanted - used


def test_every_panel_has_a_unique_id_and_the_input_datasource() -> None:
    panels = list(_panels(_dashboard()["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), ids
    for panel in panels:
        if panel["type"] == "row":
            assert not panel.get("targets"), panel["title"]
            continue
        assert panel["datasource"] == DS, panel["title"]
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DS, panel["title"]


def test_the_pipeline_variable_lists_the_pipelines_all_or_several() -> None:
    (var,) = [v for v in _dashboard()["templating"]["list"] if v["name"] == "pipeline"]
    query = "label_values(kafka_ingest_pipeline_info, pipeline)"
    assert var["type"] == "query"
    assert var["datasource"] == DS
    assert var["definition"] == query
    assert var["query"]["query"] == query
    assert var["multi"] is True and var["includeAll"] is True
    assert "kafka_ingest_pipeline_info" in _known()


def _by_title() -> dict[str, dict[str, Any]]:
    return {p["title"]: p for p in _panels(_dashboard()["panels"]) if p["type"] != "row"}


def test_the_panels_carry_the_units_of_their_figures() -> None:
    panels = _by_title()
    for panel in panels.values():
        assert panel["fieldConfig"]["defaults"]["unit"] in {"short", "s", "percentunit"}
    assert panels["DLQ ratio vs limit"]["fieldConfig"]["defaults"]["unit"] == "percentunit"
    assert panels["Oldest unread message age"]["fieldConfig"]["defaults"]["unit"] == "s"
    freshness = panels["Since the last live commit vs freshness limit"]
    assert freshness["fieldConfig"]["defaults"]["unit"] == "s"
    assert any('rule="freshness_minutes"' in t["expr"] and t["expr"].endswith("* 60")
               for t in freshness["targets"])
    assert any('rule="max_dlq_rate"' in t["expr"]
               for t in panels["DLQ ratio vs limit"]["targets"])
    assert panels["Up"]["type"] == "stat"
    assert panels["Breached rules"]["type"] == "table"
    assert any(t["expr"].endswith("== 1") for t in panels["Breached rules"]["targets"])


def _limit_panels(dashboard: dict[str, Any]) -> dict[str, tuple[str, set[str]]]:
    """rule -> (the expression of its limit, the metrics its panel draws), for each panel
    that draws a rule's limit."""
    found: dict[str, tuple[str, set[str]]] = {}
    for panel in _panels(dashboard["panels"]):
        exprs = [t["expr"] for t in panel.get("targets", [])]
        for expr in exprs:
            for rule in re.findall(r'rule="([^"]+)"', expr):
                drawn = {n for e in exprs for n, _ in NAME.findall(e)}
                found[rule] = (expr, drawn)
    return found


def test_each_limit_drawn_is_a_rule_of_the_table_over_its_metric_and_in_its_unit() -> None:
    drawn = _limit_panels(_dashboard())
    assert drawn, "no panel draws a rule's limit"
    for name, (expr, metrics_drawn) in drawn.items():
        assert name in rules.BY_NAME, f"the dashboard names a rule the table has not: {name}"
        rule = rules.BY_NAME[name]
        assert metrics.PREFIX + rule.metric in metrics_drawn, (name, metrics_drawn)
        scaled = f" * {rule.scale}" if rule.scale != 1 else ""
        assert expr == (f'kafka_ingest_alert_limit{{{FILTER}, rule="{name}"}}{scaled}'), expr
