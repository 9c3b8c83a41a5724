"""The operator's command line, run as a user runs it (a subprocess) against the real stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kafka_ingest_dev.databases import fresh_database
from kafka_ingest_dev.samples import produce_sample
from tests.support.cli import as_a_user as cli
from tests.support.pipelines import write_pipelines_file
from tests.support.topics import delete_topics

pytestmark = pytest.mark.integration



@pytest.fixture
def cli_env(stack_env: dict[str, str], pg_dsn: str, make_pipeline: Any,
            tmp_path: Path) -> dict[str, Any]:
    pipeline = make_pipeline("orders_created", chunk_size=300)
    env = {"KAFKA_INGEST_PIPELINES": str(write_pipelines_file(tmp_path / "p.yaml", pipeline)),
           "KAFKA_INGEST_PG_DSN": pg_dsn,
           "KAFKA_BOOTSTRAP_SERVERS": stack_env["KAFKA_BOOTSTRAP_SERVERS"]}
    return {"env": env, "pipeline": pipeline}


def test_run_lag_status_and_reset_offsets(cli_env: dict[str, Any], clients: Any,
                                          pg_dsn: str) -> None:
    env, pipeline = cli_env["env"], cli_env["pipeline"]
    sample = produce_sample(clients, pipeline, count=1000, poison=1)

    run = cli(env, "run", pipeline.name)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["read"] == sample["produced"]
    assert summary["inserted"] == sample["expect"]["row"]
    assert summary["lag_after"] == 0

    lag = cli(env, "lag", pipeline.name)
    assert lag.returncode == 0, lag.stderr
    rows = [line.split() for line in lag.stdout.splitlines()[1:]]
    assert len(rows) == 3
    # stored offset == group offset == high watermark, lag 0, on every partition
    assert all(r[3] == r[4] == r[6] and r[7] == "0" for r in rows), lag.stdout

    status = cli(env, "status", pipeline.name)
    assert status.returncode == 0, status.stderr
    assert "contract_violation" in status.stdout and "parked" in status.stdout

    high = int(rows[0][6])
    dry = cli(env, "reset-offsets", pipeline.name, "--partition", "0", "--to", "earliest")
    assert dry.returncode == 1 and "add --yes" in dry.stdout
    done = cli(env, "reset-offsets", pipeline.name, "--partition", "0", "--to", "earliest",
               "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(f"{high} -> 0")
    with psycopg.connect(pg_dsn) as conn:
        stored = conn.execute("SELECT next_offset FROM ingest_offsets WHERE partition = 0"
                              " AND topic = %s", (pipeline.topic,)).fetchone()
    assert stored == (0,)
    # Re-reading partition 0 from the start adds no row: the upsert absorbs it.
    again = json.loads(cli(env, "run", pipeline.name).stdout)
    assert again["read"] == high and again["inserted"] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # an unknown pipeline names the defined ones
        (["run", "nope"], "unknown pipeline 'nope'; defined: orders_created"),
        # a partition the topic does not have
        (["reset-offsets", "orders_created", "--partition", "9", "--to", "0", "--yes"],
         "partition 9 does not exist"),
        # an offset outside the watermarks
        (["reset-offsets", "orders_created", "--partition", "0", "--to", "999999", "--yes"],
         "is outside [0, 0]"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(cli_env: dict[str, Any], args: list[str],
                                                message: str) -> None:
    result = cli(cli_env["env"], *args)
    assert result.returncode == 2
    assert result.stderr.startswith("kafka-ingest: ") and message in result.stderr


def test_a_database_without_the_schema_says_to_migrate(cli_env: dict[str, Any],
                                                       stack_env: dict[str, str]) -> None:
    admin = stack_env["KAFKA_INGEST_PG_DSN"]
    with fresh_database(admin, migrated=False) as empty:
        env = {**cli_env["env"], "KAFKA_INGEST_PG_DSN": empty}
        result = cli(env, "run", cli_env["pipeline"].name)
        assert result.returncode == 2
        assert "kafka-ingest migrate" in result.stderr
        # migrations run as the schema owner: its DSN, here the same role's
        env["KAFKA_INGEST_PG_ADMIN_DSN"] = empty
        migrated = cli(env, "migrate")
        assert migrated.returncode == 0 and "0001_core" in migrated.stdout
        assert "up to date" in cli(env, "migrate").stdout


def test_stack_env_readies_a_shell(stack_env: dict[str, str]) -> None:
    script = ('eval "$(python -m kafka_ingest.cli stack env)" && '
              'psql "$KAFKA_INGEST_PG_DSN" -Atc "select 1" && echo "$KAFKA_BOOTSTRAP_SERVERS"')
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False,
                         env={**os.environ, "PATH": f"{Path(sys.executable).parent}:"
                              f"{os.environ['PATH']}"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", stack_env["KAFKA_BOOTSTRAP_SERVERS"]]


def test_topics_create_makes_what_is_missing_with_the_pipelines_settings(
        stack_env: dict[str, str], clients: Any, tmp_path: Path) -> None:
    from confluent_kafka.admin import ConfigResource

    from kafka_ingest.config import parse_pipelines

    tag = uuid.uuid4().hex[:8]
    doc = {"pipelines": {"one": {
        "topic": f"src-{tag}", "dlq_topic": f"dlq-{tag}", "table": "telemetry_metrics",
        "contract": {"event_type": "metric_event", "version": 2}, "partitions": 4,
        "topic_config": {"retention.ms": "3600000"},
    }}}
    pipeline = parse_pipelines(doc)["one"]
    env = {"KAFKA_INGEST_PIPELINES": str(write_pipelines_file(tmp_path / "p.yaml", pipeline))}
    admin = clients.admin()
    try:
        first = cli(env, "topics", "create")
        assert first.returncode == 0, first.stderr
        assert first.stdout.splitlines() == [f"created src-{tag}", f"created dlq-{tag}"]
        again = cli(env, "topics", "create", "one")  # idempotent, and says what was there
        assert again.stdout.splitlines() == [f"already there: src-{tag}",
                                             f"already there: dlq-{tag}"]
        meta = admin.list_topics(timeout=10).topics
        assert len(meta[f"src-{tag}"].partitions) == len(meta[f"dlq-{tag}"].partitions) == 4
        resource = ConfigResource(ConfigResource.Type.TOPIC, f"src-{tag}")
        config = admin.describe_configs([resource])[resource].result(30)
        assert config["retention.ms"].value == "3600000"
        bad = cli(env, "topics", "create", "nope")
        assert bad.returncode == 2 and "unknown pipeline(s) nope" in bad.stderr
    finally:
        delete_topics(clients, [f"src-{tag}", f"dlq-{tag}"])
