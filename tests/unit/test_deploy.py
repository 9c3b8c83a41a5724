"""The deployment files, checked statically (no Kubernetes, no Docker here): the Helm values
parse and hold the keys the docs rely on, the image carries the project's three
folders, and docker-compose.yml stays valid with its `celery` profile."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
VALUES = ROOT / "deploy" / "helm" / "values.yaml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"


def _values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(VALUES.read_text())
    return values


def _instructions(name: str) -> list[str]:
    """The Dockerfile's instructions ``name`` (continuation lines joined)."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    return [line.split(None, 1)[1] for line in text.splitlines()
            if line.split(None, 1)[:1] == [name]]


def test_the_values_run_our_image_of_airflow_3_3_2_on_celery() -> None:
    values = _values()
    assert values["executor"] == "CeleryExecutor"
    assert values["airflowVersion"] == "3.3.2"
    assert values["defaultAirflowRepository"] and values["defaultAirflowTag"]
    assert values["workers"]["replicas"] >= 2
    assert values["config"]["celery"]["worker_concurrency"] >= 1
    for component in ("apiServer", "dagProcessor", "triggerer", "scheduler"):
        assert component in values, component
    # the KubernetesExecutor variant is there, commented out
    assert re.search(r"^# executor: KubernetesExecutor$", VALUES.read_text(), re.M)
    # the DAGs come with the image: no git-sync, no DAG volume
    assert values["dags"]["gitSync"]["enabled"] is False
    assert values["dags"]["persistence"]["enabled"] is False


def test_connections_come_from_kubernetes_secrets_not_values() -> None:
    values = _values()
    by_env = {s["envName"]: s for s in values["secret"]}
    assert set(by_env) == {"AIRFLOW_CONN_KAFKA_DEFAULT", "AIRFLOW_CONN_POSTGRES_DEFAULT"}
    assert all(s["secretName"] and s["secretKey"] for s in by_env.values())
    env_from = yaml.safe_load(values["extraEnvFrom"])  # a templated string in the chart
    assert env_from[0]["secretRef"]["name"]
    # no credential in the values themselves
    assert not any(e["name"].startswith("AIRFLOW_CONN_") for e in values.get("env", []))


def test_the_scheduler_creates_the_pipelines_pools_then_runs() -> None:
    args = _values()["scheduler"]["args"]
    assert args[:2] == ["bash", "-c"]
    script = args[2]
    assert "python -m kafka_ingest.cli pools >" in script
    assert "airflow pools import" in script
    assert script.rstrip().endswith("exec airflow scheduler")


def test_the_image_is_airflow_3_3_2_with_the_pins_and_the_three_folders() -> None:
    assert _instructions("FROM") == ["apache/airflow:3.3.2"]
    copies = {tuple(c.split()[-2:]) for c in _instructions("COPY")}
    for folder in ("dags", "plugins", "include"):
        assert (f"{folder}/", f"/opt/airflow/{folder}/") in copies, folder
    assert any("requirements.txt" in c for c in _instructions("COPY"))
    assert any("pip install" in r and "requirements.txt" in r for r in _instructions("RUN"))
    env = " ".join(_instructions("ENV"))
    assert "PYTHONPATH=/opt/airflow/include" in env


def test_compose_stays_valid_and_has_a_celery_profile() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    celery = {name for name, s in services.items() if "celery" in s.get("profiles", [])}
    assert celery == {"redis", "airflow-worker"}
    worker = services["airflow-worker"]
    assert worker["image"] == services["airflow-scheduler"]["image"] == "apache/airflow:3.3.2"
    assert "airflow celery worker" in worker["command"][-1]
    assert worker["environment"]["AIRFLOW__CELERY__BROKER_URL"] == "redis://redis:6379/0"
    assert worker["environment"]["AIRFLOW__CELERY__RESULT_BACKEND"].startswith(
        "db+postgresql://")
    assert "redis" in worker["depends_on"]
    # every service names an image with a pinned tag, from the images the file already uses,
    # the official Redis image, Apicurio's registry and curl (the registry's one-shot config)
    for name, service in services.items():
        image = service["image"]
        assert re.fullmatch(r"(apache/airflow|apache/kafka|postgres|redis|"
                            r"apicurio/apicurio-registry|curlimages/curl):\d[\w.-]*", image), \
            (name, image)
    # the registry is published on loopback only, and the pipelines' connection names it
    assert services["registry"]["ports"] == ["127.0.0.1:18081:8080"]
    connection = json.loads(services["airflow-scheduler"]["environment"][
        "AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT"])
    assert (connection["host"], connection["extra"]["path"]) == ("registry", "/apis/ccompat/v7")
    # without the profile, the default stack is what it was
    assert {n for n, s in services.items() if not s.get("profiles")} >= {
        "kafka", "postgres", "airflow-scheduler", "airflow-apiserver"}
