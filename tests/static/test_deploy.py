"""The deployment files against the project they deploy (no Kubernetes, no Docker here).

Each setting of ``deploy/Dockerfile``, ``deploy/helm/values.yaml`` and
``docker-compose.yml`` that names something of the project names what the project has: the
Airflow and package versions pinned in ``requirements.txt``, the folders and the pipelines
file the code is found in, the connections the pipelines use by default, the CLI command
the scheduler runs, the registry's API and the versions the local stack runs. A change on
one side that the other misses fails here.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlsplit

import yaml

from kafka_ingest.cli import build_parser
from kafka_ingest.config import DEFAULT_PIPELINES_FILE, Pipeline, SchemaRegistry
from kafka_ingest_dev import apicurio, stack
from tests.support import ROOT

VALUES = ROOT / "deploy" / "helm" / "values.yaml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"
REQUIREMENTS = ROOT / "requirements.txt"


def _values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(VALUES.read_text())
    return values


def _compose() -> dict[str, Any]:
    compose: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return compose


def _normal(name: str) -> str:
    """A package's name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins() -> dict[str, str]:
    """``requirements.txt``: package -> pinned version."""
    return {_normal(name): version for name, version in
            re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+)$", REQUIREMENTS.read_text(), re.M)}


def _instructions(name: str) -> list[str]:
    """The Dockerfile's instructions ``name`` (continuation lines joined)."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    return [line.split(None, 1)[1] for line in text.splitlines()
            if line.split(None, 1)[:1] == [name]]


def _image_env() -> dict[str, str]:
    return dict(pair.split("=", 1) for env in _instructions("ENV") for pair in env.split())


def _copies() -> dict[str, str]:
    """The Dockerfile's COPY instructions: source -> destination."""
    return {c.split()[-2]: c.split()[-1] for c in _instructions("COPY")}


def test_every_deployment_runs_the_pinned_airflow() -> None:
    airflow = _pins()["apache-airflow"]
    assert _instructions("FROM") == [f"apache/airflow:{airflow}"]
    assert _values()["airflowVersion"] == airflow
    images = {s["image"] for s in _compose()["services"].values()
              if s["image"].startswith("apache/airflow:")}
    assert images == {f"apache/airflow:{airflow}"}


def test_the_image_installs_the_pins_and_finds_the_dags_plugins_and_package() -> None:
    copies, env = _copies(), _image_env()
    assert copies["requirements.txt"].endswith("/requirements.txt")
    assert any("pip install" in r and copies["requirements.txt"] in r
               for r in _instructions("RUN"))
    # Airflow's folders and the package's: each copy's source holds what Airflow imports
    assert {"dags/", "plugins/", "include/"} <= copies.keys()
    assert list((ROOT / "dags").glob("*_dags.py")) and list((ROOT / "plugins").glob("*.py"))
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == copies["dags/"].rstrip("/")
    assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] == copies["plugins/"].rstrip("/")
    assert env["PYTHONPATH"] == copies["include/"].rstrip("/")
    assert (ROOT / "include" / "kafka_ingest" / "__init__.py").is_file()
    # the shipped pipelines file, where the include/ copy puts it
    shipped = DEFAULT_PIPELINES_FILE.relative_to(ROOT / "include").as_posix()
    assert env["KAFKA_INGEST_PIPELINES"] == f"{copies['include/'].rstrip('/')}/{shipped}"


def test_compose_installs_the_same_pins_into_the_official_image() -> None:
    # the compose file runs the official image with the project's runtime pins on top:
    # each must be the version requirements.txt pins
    extra = _compose()["x-airflow-common"]["environment"]["_PIP_ADDITIONAL_REQUIREMENTS"]
    pins = _pins()
    listed = dict(line.split("==") for line in extra.split())
    assert listed and all(pins.get(_normal(name)) == version
                          for name, version in listed.items()), (listed, pins)


def test_the_connections_are_the_pipelines_default_ones_from_secrets() -> None:
    used = {Pipeline.model_fields["kafka_conn_id"].default,
            Pipeline.model_fields["postgres_conn_id"].default}
    values = _values()
    by_env = {s["envName"]: s for s in values["secret"]}
    assert set(by_env) == {f"AIRFLOW_CONN_{conn_id.upper()}" for conn_id in used}
    assert all(s["secretName"] and s["secretKey"] for s in by_env.values())
    # the pipelines' own connections (a conn_id of their own) come from a secret too
    assert yaml.safe_load(values["extraEnvFrom"])[0]["secretRef"]["name"]
    # and no credential is in the values themselves
    assert not any(e["name"].startswith("AIRFLOW_CONN_") for e in values.get("env", []))
    compose_env = _compose()["x-airflow-common"]["environment"]
    assert {f"AIRFLOW_CONN_{conn_id.upper()}" for conn_id in used} <= compose_env.keys()


def test_the_registry_connection_names_the_api_the_local_stack_serves() -> None:
    compose = _compose()
    env = compose["x-airflow-common"]["environment"]
    conn_id = SchemaRegistry.model_fields["conn_id"].default
    connection = json.loads(env[f"AIRFLOW_CONN_{conn_id.upper()}"])
    assert connection["host"] in compose["services"]
    assert connection["extra"]["path"] == apicurio.CCOMPAT_PATH
    assert urlsplit(env["KAFKA_INGEST_SCHEMA_REGISTRY_URL"]).path == apicurio.CCOMPAT_PATH
    # the versions the local stack runs
    assert compose["services"]["registry"]["image"] == (
        f"apicurio/apicurio-registry:{apicurio.RELEASE.version}")
    kafka = {s["image"] for s in compose["services"].values()
             if s["image"].startswith("apache/kafka:")}
    assert kafka == {f"apache/kafka:{stack.KAFKA_VERSION}"}


def test_the_scheduler_imports_the_pools_the_cli_prints_then_runs() -> None:
    script = _values()["scheduler"]["args"][2]
    printed = re.search(r"python -m kafka_ingest\.cli (\w+) > (\S+)", script)
    assert printed is not None, script
    command, path = printed.groups()
    assert build_parser().parse_args([command]).command == command  # a real CLI command
    assert f"airflow pools import {path}" in script
    assert script.rstrip().endswith("exec airflow scheduler")


def test_the_celery_profile_adds_the_broker_the_workers_use() -> None:
    services = _compose()["services"]
    celery = {name for name, s in services.items() if "celery" in s.get("profiles", [])}
    assert celery == {"redis", "airflow-worker"}
    worker = services["airflow-worker"]
    assert "airflow celery worker" in worker["command"][-1]
    broker = urlsplit(worker["environment"]["AIRFLOW__CELERY__BROKER_URL"])
    assert (broker.scheme, broker.hostname, broker.port) == ("redis", "redis", 6379)
    assert "redis" in worker["depends_on"]
    backend = urlsplit(worker["environment"]["AIRFLOW__CELERY__RESULT_BACKEND"])
    assert backend.scheme == "db+postgresql" and backend.hostname in services
    # without the profile, the default stack is what it was
    assert {n for n, s in services.items() if not s.get("profiles")} >= {
        "kafka", "postgres", "airflow-scheduler", "airflow-apiserver"}


def test_every_image_has_a_pinned_tag() -> None:
    for name, service in _compose()["services"].items():
        assert re.fullmatch(r"[a-z0-9./_-]+:\d[\w.-]*", service["image"]), (name, service)
