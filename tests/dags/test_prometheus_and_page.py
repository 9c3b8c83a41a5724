"""The metrics and the pipelines page as operators meet them, on the stack's own Airflow
services (``stack up --airflow``) with the ``kafka_ingest_ui`` plugin loaded.

- A real Prometheus (``kafka_ingest_dev.prometheus``: the Go module, built into the user
  cache) scrapes both endpoints, the api-server's ``/kafka-ingest/metrics`` (with the
  scrape token) and ``kafka-ingest exporter``, and loads the rules ``kafka-ingest
  alert-rules`` wrote (checked by ``promtool check rules``). The lag it stored equals the
  lag the CLI reports, before and after a run triggered through the REST API; the lag alert
  fires while the lag is above the pipeline's limit and stops after the run.
- Chromium (Debian's, driven by Playwright) opens the page inside the Airflow UI: it shows
  the pipeline of a real run, its breach in red, the lag per partition recorded by the
  monitor's checks as a chart, its dead letters by reason; its links land on the ingest
  DAG's runs and on the replay DAG, whose trigger form opens. Screenshots are kept in
  ``test-artifacts/ui/``, the Prometheus answers in ``test-artifacts/prometheus/``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kafka_ingest.config import Pipeline, parse_pipelines
from kafka_ingest.db import Database
from kafka_ingest.ops.lag import lag
from kafka_ingest.ops.status import check_pipeline
from kafka_ingest_dev import prometheus
from kafka_ingest_dev.procs import free_ports
from kafka_ingest_dev.samples import produce_sample
from tests.support import ROOT
from tests.support.airflow_api import AirflowApi, SharedAirflow, chromium, poll
from tests.support.deadlines import run_deadline_s
from tests.support.exporter import running_exporter
from tests.support.pipelines import dag_env

pytestmark = pytest.mark.integration

PARTITIONS = 2
MAX_LAG = 50
ARTIFACTS = Path(os.environ.get("KAFKA_INGEST_TEST_ARTIFACTS") or ROOT / "test-artifacts")
#: Prometheus scrapes and evaluates every second here; a figure must reach it within a
#: few scrapes, each bounded by the metrics' own request time-out (3 s) and cache (1 s).
SCRAPE_S = 60.0


@pytest.fixture
def pipeline(topics: Callable[..., str]) -> Pipeline:
    """A manual-only pipeline with a unique name, a lag limit a sample passes, and no
    parked letter allowed (so dead letters are a breach the page must show)."""
    name = f"obs_{uuid.uuid4().hex[:8]}"
    doc = {"pipelines": {name: {
        "topic": topics(PARTITIONS, "src"), "dlq_topic": topics(PARTITIONS, "dlq"),
        "table": "telemetry_metrics", "contract": {"event_type": "metric_event", "version": 2},
        "schedule": None, "retries": 0, "task_timeout_minutes": 1,
        "alerts": {"max_lag": MAX_LAG, "max_parked": 0},
    }}}
    return parse_pipelines(doc)[name]


@pytest.fixture
def token(shared_airflow: SharedAirflow) -> str:
    """The bearer token the api-server's /kafka-ingest/metrics accepts."""
    return shared_airflow.metrics_token


@pytest.fixture
def env(pipeline: Pipeline, pg_dsn: str, tmp_path: Path) -> dict[str, str]:
    return dag_env(tmp_path, pg_dsn, pipeline)


@pytest.fixture
def api(shared_airflow: SharedAirflow, pipeline: Pipeline, pg_dsn: str
        ) -> Iterator[AirflowApi]:
    """The shared services (their metrics' cache 1 s) serving this test's pipeline."""
    with shared_airflow.serving([pipeline], pg_dsn) as a:
        yield a


def _run_ingest(api: AirflowApi, pipeline: Pipeline) -> str:
    dag_id = f"{pipeline.name}_ingest"
    api.unpause(dag_id)
    run_id = api.trigger(dag_id, {})
    state = api.wait_for_run(dag_id, run_id,
                             run_deadline_s(pipeline, api.settings, slices=PARTITIONS))
    assert state == "success", api.task_states(dag_id, run_id)
    return run_id


def _total_lag(pipeline: Pipeline, clients: Any, db: Database) -> int:
    """The lag ``kafka-ingest lag`` prints, summed over the partitions."""
    return sum(r.lag for r in lag(pipeline, clients, db))


def _stored(api: prometheus.PrometheusAPI, expr: str, want: float) -> float:
    found = api.wait_for_query(expr, timeout_s=SCRAPE_S,
                               accept=lambda rows: bool(rows) and float(rows[0]["value"][1])
                               == want)
    return float(found[0]["value"][1])


def _firing(api: prometheus.PrometheusAPI, alert: str, pipeline: str) -> list[dict[str, Any]]:
    return [a for a in api.alerts() if a["labels"].get("alertname") == alert
            and a["labels"].get("pipeline") == pipeline and a["state"] == "firing"]


def test_prometheus_stores_the_cli_lag_from_both_endpoints_and_fires_the_lag_alert(
        api: AirflowApi, pipeline: Pipeline, env: dict[str, str], token: str,
        clients: Any, db: Database, stack_env: dict[str, str], pg_dsn: str,
        tmp_path: Path) -> None:
    out = ARTIFACTS / "prometheus"
    out.mkdir(parents=True, exist_ok=True)
    rules = tmp_path / "rules.yml"
    subprocess.run([sys.executable, "-m", "kafka_ingest.cli", "alert-rules", "--for", "0s",
                    "-o", str(rules)], env={**os.environ, **env}, check=True,
                   capture_output=True, text=True, timeout=120)
    assert "SUCCESS" in prometheus.check_rules(rules)
    sample = produce_sample(clients, pipeline, count=300, poison=3, partitions=PARTITIONS)
    before = _total_lag(pipeline, clients, db)
    assert before == sample["produced"] > MAX_LAG

    airflow = httpx.URL(api.url)
    # behind authentication: no token, a wrong one, and the page without a session
    for headers in ({}, {"Authorization": "Bearer not-the-token"}):
        refused = httpx.get(f"{api.url}/kafka-ingest/metrics", headers=headers, timeout=30)
        assert refused.status_code in (401, 403), refused.status_code
    assert httpx.get(f"{api.url}/kafka-ingest/pipelines", timeout=30).status_code == 401
    jwt = api.client.headers["Authorization"]  # an Airflow token is accepted too
    assert httpx.get(f"{api.url}/kafka-ingest/metrics", headers={"Authorization": jwt},
                     timeout=30).status_code == 200
    exporter_env = {**stack_env, **env, "KAFKA_INGEST_PG_DSN": pg_dsn}
    with running_exporter(exporter_env, tmp_path / "exporter.log") as (exporter_url, _):
        targets = [
            prometheus.Target("airflow", f"{airflow.host}:{airflow.port}",
                              metrics_path="/kafka-ingest/metrics", bearer_token=token),
            prometheus.Target("exporter", httpx.URL(exporter_url).netloc.decode()),
        ]
        server = prometheus.PrometheusServer(free_ports(1)[0], tmp_path / "prometheus",
                                             targets=targets, rule_files=[rules])
        with server:
            prom = server.api
            up = prom.wait_for_targets_up(timeout_s=SCRAPE_S)
            assert {t["labels"]["job"] for t in up} == {"airflow", "exporter"}
            answers: dict[str, Any] = {"cli_lag_before": before}
            for job in ("airflow", "exporter"):
                expr = f'sum(kafka_ingest_lag_messages{{pipeline="{pipeline.name}",job="{job}"}})'
                answers[f"{job}_before"] = _stored(prom, expr, before)
            alert = prom.wait_for_alert("KafkaIngestLagHigh", timeout_s=SCRAPE_S)
            assert _firing(prom, "KafkaIngestLagHigh", pipeline.name), prom.alerts()
            # both endpoints scraped: each partition still counted once
            assert float(alert["value"]) == before, alert
            answers["alert_while_lagging"] = alert

            run_id = _run_ingest(api, pipeline)
            after = _total_lag(pipeline, clients, db)
            assert after == 0
            answers["cli_lag_after"] = after
            for job in ("airflow", "exporter"):
                expr = f'sum(kafka_ingest_lag_messages{{pipeline="{pipeline.name}",job="{job}"}})'
                answers[f"{job}_after"] = _stored(prom, expr, after)
            # the plugin knows the DAG run's outcome; the ledger's counters reached both
            _stored(prom, f'kafka_ingest_last_run_success{{pipeline="{pipeline.name}"}}', 1)
            inserted = f'kafka_ingest_rows_inserted_total{{pipeline="{pipeline.name}",mode="live"}}'
            rows = sample["expect"]["row"]
            answers["rows_inserted_total"] = _stored(prom, f'max({inserted})', rows)
            poll("the lag alert to stop firing",
                 lambda: not _firing(prom, "KafkaIngestLagHigh", pipeline.name), SCRAPE_S)
            answers["run_id"] = run_id
    (out / "lag-before-and-after.json").write_text(json.dumps(answers, indent=2, default=str))


def test_the_pipelines_page_shows_a_real_run_its_breach_and_links_to_airflow(
        api: AirflowApi, pipeline: Pipeline, clients: Any, db: Database) -> None:
    from playwright.sync_api import expect, sync_playwright

    shots = ARTIFACTS / "ui"
    shots.mkdir(parents=True, exist_ok=True)
    produce_sample(clients, pipeline, count=200, poison=4, partitions=PARTITIONS)
    check_pipeline(pipeline, clients, db)  # the monitor's checks: the chart's history
    produce_sample(clients, pipeline, count=100, poison=0, partitions=PARTITIONS)
    check_pipeline(pipeline, clients, db)
    _run_ingest(api, pipeline)
    check_pipeline(pipeline, clients, db)
    name, ingest, replay = pipeline.name, f"{pipeline.name}_ingest", f"{pipeline.name}_dlq_replay"
    with db.session() as conn:
        parked = conn.execute("SELECT count(*) FROM dead_letters WHERE pipeline = %s"
                              " AND status = 'parked'", (name,)).fetchone()
    assert parked is not None and parked[0] > 0

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=[
            "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--disable-background-networking", "--disable-component-update"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{api.url}/", wait_until="networkidle")
            page.fill("input[name=username]", api.user)
            page.fill("input[name=password]", api.password)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(f"{api.url}/", timeout=30_000)

            # the nav entry the plugin adds, under Browse
            page.get_by_role("button", name="Browse").click()
            page.get_by_role("menuitem", name="Kafka ingest").click()
            page.wait_for_url(f"{api.url}/plugin/kafka-ingest", timeout=30_000)
            frame = page.frame_locator("iframe")
            row = frame.locator(f'tr[data-pipeline="{name}"]')
            expect(row).to_be_visible(timeout=30_000)
            expect(row.locator("[data-state]")).to_have_attribute("data-state", "bad")
            expect(row.locator('td[data-figure="parked"]')).to_have_class("bad")
            expect(row.locator('td[data-figure="lag"]')).to_have_class("ok")
            expect(row.locator('td[data-figure="lag"]')).to_have_text("0")
            expect(row.get_by_text("success")).to_be_visible()  # the DAG run's outcome
            page.screenshot(path=str(shots / "4-pipelines-page.png"), full_page=True)

            row.get_by_role("link", name=name).click()
            detail = frame.locator("h1", has_text=name)
            expect(detail).to_be_visible(timeout=30_000)
            expect(frame.locator('[data-rule="max_parked"]')).to_be_visible()
            expect(frame.locator("#lag-chart polyline")).to_have_count(PARTITIONS)
            expect(frame.locator("#letters tr[data-reason]").first).to_be_visible()
            expect(frame.locator("#partitions tr")).to_have_count(PARTITIONS + 1)
            page.screenshot(path=str(shots / "5-pipeline-detail.png"), full_page=True)
            text = frame.locator("body").inner_text()
            assert "password" not in text.lower() and api.password not in text

            frame.locator("#ingest-runs").click()  # target=_top: the whole window
            page.wait_for_url(f"{api.url}/dags/{ingest}/runs", timeout=30_000)
            page.get_by_text("success").first.wait_for(timeout=30_000)
            page.screenshot(path=str(shots / "6-linked-ingest-runs.png"))

            page.go_back()
            frame = page.frame_locator("iframe")
            link = frame.locator("a.replay").first
            expect(link).to_be_visible(timeout=30_000)
            link.click()
            page.wait_for_url(f"{api.url}/dags/{replay}", timeout=30_000)
            page.get_by_role("button", name="Trigger").first.click()
            page.get_by_role("dialog").get_by_text("Error classes").first.wait_for(
                timeout=30_000)
            page.screenshot(path=str(shots / "7-linked-replay-trigger-form.png"))
        finally:
            browser.close()
    for shot in ("4-pipelines-page.png", "5-pipeline-detail.png", "6-linked-ingest-runs.png",
                 "7-linked-replay-trigger-form.png"):
        assert (shots / shot).stat().st_size > 10_000, shot
