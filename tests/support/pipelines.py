"""Pipelines files for what runs in another process (a DAG, the CLI, the exporter): the
pipelines a test made, their declared contracts, and the database an Airflow connection
points at."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from kafka_ingest_dev.databases import airflow_postgres_conn


def declarations(*pipelines: Any) -> dict[str, Any]:
    """The ``contracts`` section declaring the declared contracts ``pipelines`` use."""
    return {p.model.EVENT_TYPE: json.loads(p.model.DECLARATION) for p in pipelines
            if p.model.DECLARATION is not None}


def write_pipelines_file(path: Path, *pipelines: Any) -> Path:
    """Write pipelines as a YAML file (for DAGs and the CLI run in a subprocess), with the
    declarations of the declared contracts they use."""
    doc: dict[str, Any] = {
        "pipelines": {p.name: p.model_dump(mode="json", exclude={"name"}) for p in pipelines}}
    declared = declarations(*pipelines)
    if declared:
        doc["contracts"] = declared
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def dag_env(tmp_path: Path, pg_dsn: str, *pipelines: Any) -> dict[str, str]:
    """Environment for a DAG run in a subprocess: these pipelines, this database."""
    return {
        "KAFKA_INGEST_PIPELINES": str(write_pipelines_file(tmp_path / "p.yaml", *pipelines)),
        "AIRFLOW_CONN_POSTGRES_DEFAULT": airflow_postgres_conn(pg_dsn),
    }
