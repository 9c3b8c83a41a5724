"""The local stack's Airflow settings per executor, without starting anything: what each
executor's services are told, how the machine's slots are shared out, what each Celery
worker reports as its hostname, and the CLI's executor flags."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kafka_ingest_dev import airflow_services
from kafka_ingest_dev.airflow_services import (
    HOSTNAME_CALLABLE,
    AirflowServices,
    Executor,
    worker_hostname,
)
from kafka_ingest_dev.procs import StackError
from kafka_ingest_dev.stack.cli import parser

DB = "postgresql+psycopg2://kafka_ingest:pw@127.0.0.1:15432/airflow"


@pytest.fixture
def two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(airflow_services.os, "cpu_count", lambda: 2)


@pytest.mark.parametrize(("workers", "concurrency", "parallelism"), [
    (1, 4, 4),  # one worker takes the machine's four slots (two per core)
    (2, 2, 4),  # two share them
    (3, 1, 3),  # never fewer than one slot per worker
    (8, 1, 8),
])
def test_celery_workers_share_the_machines_slots(two_cores: None, workers: int,
                                                 concurrency: int, parallelism: int) -> None:
    executor = Executor("celery", workers)
    assert (executor.concurrency, executor.parallelism) == (concurrency, parallelism)


def test_the_local_executor_keeps_two_slots_per_core(two_cores: None) -> None:
    assert Executor().parallelism == 4


@pytest.mark.parametrize(("name", "workers", "message"), [
    ("celery", 0, "at least one worker"),
    ("kubernetes", 0, "unknown executor 'kubernetes'"),
])
def test_impossible_executors_are_refused(name: str, workers: int, message: str) -> None:
    with pytest.raises(StackError, match=message):
        Executor(name, workers)


def test_celery_settings_point_at_redis_and_the_metadata_database(
        tmp_path: Path, two_cores: None) -> None:
    services = AirflowServices(tmp_path, 18080, 16400)
    settings = services.settings(Executor("celery", 2), sql_alchemy_conn=DB)
    assert settings["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert settings["AIRFLOW__CELERY__BROKER_URL"] == "redis://127.0.0.1:16400/0"
    assert settings["AIRFLOW__CELERY__RESULT_BACKEND"] == (
        "db+postgresql://kafka_ingest:pw@127.0.0.1:15432/airflow")
    assert settings["AIRFLOW__CELERY__WORKER_CONCURRENCY"] == "2"
    assert settings["AIRFLOW__CORE__PARALLELISM"] == "4"
    # the hostname callable is each worker's own setting, never every service's
    assert "AIRFLOW__CORE__HOSTNAME_CALLABLE" not in settings
    local = services.settings(sql_alchemy_conn=DB)
    assert local["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert not any(k.startswith("AIRFLOW__CELERY__") for k in local)


def test_each_worker_reports_its_own_name(monkeypatch: pytest.MonkeyPatch) -> None:
    module, _, function = HOSTNAME_CALLABLE.rpartition(".")
    assert (module, function) == ("kafka_ingest_dev.airflow_services", "worker_hostname")
    monkeypatch.setenv("KAFKA_INGEST_WORKER_NAME", "worker-2@box")
    assert worker_hostname() == "worker-2@box"
    monkeypatch.delenv("KAFKA_INGEST_WORKER_NAME")
    assert worker_hostname()  # elsewhere, the machine's name as Airflow's default
    names = Executor("celery", 2).worker_names()
    assert [n.split("@")[0] for n in names] == ["worker-1", "worker-2"]
    assert len({n.split("@")[1] for n in names}) == 1


def test_nothing_running_means_the_local_executor_unless_asked(tmp_path: Path) -> None:
    services = AirflowServices(tmp_path, 18080)
    assert services.executor() is None
    assert services._wanted(None, None) == Executor("local")
    assert services._wanted("celery", None) == Executor("celery", 2)
    assert services._wanted("celery", 3) == Executor("celery", 3)
    with pytest.raises(StackError, match="--workers needs --executor celery"):
        services._wanted(None, 2)


def test_stack_up_takes_the_executor_and_workers() -> None:
    args = parser().parse_args(["up", "--executor", "celery", "--workers", "3"])
    assert (args.executor, args.workers, args.airflow) == ("celery", 3, False)
    assert parser().parse_args(["up", "--airflow"]).executor is None
    with pytest.raises(SystemExit):
        parser().parse_args(["up", "--executor", "sequential"])


def test_tasks_wait_for_a_slow_execution_api_as_the_setting_says(tmp_path: Path) -> None:
    """The task SDK's client reads the stack's execution API time-out (a misspelt setting
    would leave Airflow's 5 s, after which a retried start of a try the server took fails
    the try, as on CI's loaded machine)."""
    settings = AirflowServices(tmp_path, 18080, 16400).settings(sql_alchemy_conn=DB)
    env = {**os.environ, **settings, "AIRFLOW_HOME": str(tmp_path / "home")}
    read = subprocess.run(
        [sys.executable, "-c", "from airflow.sdk.api import client; print(client.API_TIMEOUT)"],
        env=env, capture_output=True, text=True, check=True, timeout=120)
    assert float(read.stdout.split()[-1]) == airflow_services.EXECUTION_API_TIMEOUT_S > 5.0
