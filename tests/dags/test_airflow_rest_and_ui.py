"""Driven as users drive it: Airflow's REST API and its UI in a real browser, against the
stack's own Airflow services (``kafka-ingest stack up --airflow``).

- REST: a live run, a backfill by offsets and a dry-run replay, each triggered with
  ``POST /api/v2/dags/{dag_id}/dagRuns``, waited for, and checked in the table.
- UI: Playwright drives Debian's Chromium (no browser download): log in, open the ingest
  DAG's trigger form, fill in an offset range, trigger, see the run succeed. Screenshots
  are kept in ``test-artifacts/ui/`` (or ``$KAFKA_INGEST_TEST_ARTIFACTS``).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kafka_ingest.config import Pipeline, parse_pipelines
from kafka_ingest_dev.samples import produce_sample
from tests.support import ROOT
from tests.support.airflow_api import AirflowApi, SharedAirflow, chromium, poll
from tests.support.deadlines import run_deadline_s

pytestmark = pytest.mark.integration

COUNT, POISON = 400, 1
PARTITIONS = 2
ARTIFACTS = Path(os.environ.get("KAFKA_INGEST_TEST_ARTIFACTS") or ROOT / "test-artifacts")


def _one(dsn: str, query: str, *args: Any) -> Any:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(query, args).fetchone()
    assert row is not None
    return row[0]


@pytest.fixture
def pipeline(topics: Callable[..., str]) -> Pipeline:
    """A manual-only pipeline with a unique name, so its DAGs are this test's alone."""
    name = f"ops_{uuid.uuid4().hex[:8]}"
    doc = {"pipelines": {name: {
        "topic": topics(PARTITIONS, "src"), "dlq_topic": topics(PARTITIONS, "dlq"),
        "table": "telemetry_metrics", "contract": {"event_type": "metric_event", "version": 2},
        "schedule": None, "retries": 0,
        "task_timeout_minutes": 1,  # bounds each wait (tests.support.deadlines)
    }}}
    return parse_pipelines(doc)[name]


@pytest.fixture
def api(shared_airflow: SharedAirflow, pipeline: Pipeline, pg_dsn: str
        ) -> Iterator[AirflowApi]:
    with shared_airflow.serving([pipeline], pg_dsn) as a:
        yield a


def _finished(api: AirflowApi, pipeline: Pipeline, dag_id: str, run_id: str) -> str:
    return api.wait_for_run(dag_id, run_id,
                            run_deadline_s(pipeline, api.settings, slices=PARTITIONS))


def _run(api: AirflowApi, pipeline: Pipeline, dag_id: str, conf: dict[str, Any]) -> str:
    run_id = api.trigger(dag_id, conf)
    state = _finished(api, pipeline, dag_id, run_id)
    assert state == "success", api.task_states(dag_id, run_id)
    return run_id


def test_rest_api_live_run_backfill_by_offsets_and_dry_run_replay(
        api: AirflowApi, pipeline: Pipeline, clients: Any, pg_dsn: str) -> None:
    sample = produce_sample(clients, pipeline, count=COUNT, poison=POISON,
                            partitions=PARTITIONS)
    ingest, replay = f"{pipeline.name}_ingest", f"{pipeline.name}_dlq_replay"
    api.unpause(ingest)
    api.unpause(replay)

    live = _run(api, pipeline, ingest, {})
    rows = sample["expect"]["row"]
    assert _one(pg_dsn, "SELECT count(*) FROM telemetry_metrics") == rows
    assert api.xcom(ingest, live, "report")["inserted"] == rows
    dead = _one(pg_dsn, "SELECT count(*) FROM dead_letters")
    assert dead > 0
    offsets = _one(pg_dsn, "SELECT json_object_agg(partition, next_offset) FROM ingest_offsets")

    # Lose partition 1's first 50 offsets' rows; a backfill by offsets brings exactly them back.
    deleted = _one(pg_dsn, "WITH d AS (DELETE FROM telemetry_metrics WHERE source_partition = 1"
                           " AND source_offset < 50 RETURNING 1) SELECT count(*) FROM d")
    assert deleted > 0
    backfill = _run(api, pipeline, ingest, {"partitions": {"1": [0, 50]}})
    summary = api.xcom(ingest, backfill, "report")
    assert (summary["read"], summary["inserted"]) == (50, deleted)
    assert _one(pg_dsn, "SELECT count(*) FROM telemetry_metrics") == rows
    # a backfill never moves the live stored offsets
    assert _one(pg_dsn, "SELECT json_object_agg(partition, next_offset) FROM ingest_offsets"
                ) == offsets

    dry = _run(api, pipeline, replay, {"dry_run": True})
    report = api.xcom(replay, dry, "report")
    assert report["dry_run"] is True
    assert report["outcomes"]["still_parked"] == dead  # the contract did not change
    assert report["outcomes"]["recovered"] == 0
    # a dry run writes nothing: no row, no dead-letter change, no replay cursor
    assert _one(pg_dsn, "SELECT count(*) FROM telemetry_metrics") == rows
    assert _one(pg_dsn, "SELECT max(attempts) FROM dead_letters") == 1
    assert _one(pg_dsn, "SELECT count(*) FROM ingest_offsets WHERE topic = %s",
                pipeline.dlq_topic) == 0


def test_ui_trigger_form_runs_a_backfill_by_offsets(
        api: AirflowApi, pipeline: Pipeline, clients: Any, pg_dsn: str) -> None:
    from playwright.sync_api import sync_playwright

    shots = ARTIFACTS / "ui"
    shots.mkdir(parents=True, exist_ok=True)
    sample = produce_sample(clients, pipeline, count=COUNT, poison=0, partitions=PARTITIONS)
    ingest = f"{pipeline.name}_ingest"
    with psycopg.connect(pg_dsn) as conn:  # the partition's high watermark, read back
        assert conn.execute("SELECT count(*) FROM telemetry_metrics").fetchone() == (0,)
    end = 60
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(),
                                    args=["--no-sandbox", "--disable-gpu",
                                          "--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{api.url}/", wait_until="networkidle")
            page.get_by_role("button", name="Sign in").wait_for()  # rendered, not blank
            page.screenshot(path=str(shots / "1-login.png"))
            page.fill("input[name=username]", api.user)
            page.fill("input[name=password]", api.password)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(f"{api.url}/", timeout=30_000)

            page.goto(f"{api.url}/dags/{ingest}", wait_until="networkidle")
            page.get_by_role("button", name="Trigger").first.click()
            dialog = page.get_by_role("dialog")
            dialog.get_by_text("Backfill by offsets").wait_for()
            editor = dialog.locator(".monaco-editor").first
            editor.click()
            page.keyboard.press("Control+A")
            page.keyboard.press("Delete")
            page.keyboard.insert_text(json.dumps({"0": [0, end]}))
            page.screenshot(path=str(shots / "2-trigger-form.png"))
            before = {r["dag_run_id"] for r in api.get(f"/dags/{ingest}/dagRuns")["dag_runs"]}
            dialog.get_by_role("button", name="Trigger").last.click()

            def new_run() -> str | None:
                runs = api.get(f"/dags/{ingest}/dagRuns")["dag_runs"]
                fresh = [r["dag_run_id"] for r in runs if r["dag_run_id"] not in before]
                return fresh[0] if fresh else None

            run_id = poll("the run the form triggered", new_run, 60)
            assert _finished(api, pipeline, ingest, run_id) == "success"
            assert api.get(f"/dags/{ingest}/dagRuns/{run_id}")["conf"]["partitions"] == {
                "0": [0, end]}
            page.goto(f"{api.url}/dags/{ingest}/runs/{run_id}", wait_until="networkidle")
            page.get_by_text("success").first.wait_for(timeout=30_000)
            time.sleep(1)  # let the grid settle for the picture
            page.screenshot(path=str(shots / "3-run-succeeded.png"), full_page=True)
        finally:
            browser.close()
    # The form's offsets, and only those, were read: partition 0's first `end` messages.
    assert _one(pg_dsn, "SELECT count(*) FROM ingest_runs WHERE mode = 'backfill'") >= 1
    assert _one(pg_dsn, "SELECT sum(read) FROM ingest_runs") == end
    assert _one(pg_dsn, "SELECT count(*) FROM telemetry_metrics WHERE source_partition <> 0"
                ) == 0
    assert sample["produced"] > end
    for name in ("1-login.png", "2-trigger-form.png", "3-run-succeeded.png"):
        assert (shots / name).stat().st_size > 10_000, name
