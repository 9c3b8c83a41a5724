"""The tests' ``airflow`` runs forked from a server that imported Airflow once
(:mod:`tests.support.dag_runs`): each gets its own environment, output and exit status, and
a server serves only the Airflow settings it imported Airflow with."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import dag_runs


@pytest.mark.integration
def test_a_run_from_the_server_is_a_process_of_its_own_and_settings_pick_the_server(
        tmp_path: Path) -> None:
    home = {"AIRFLOW_HOME": str(tmp_path / "a"), "_AIRFLOW__AS_LIBRARY": ""}
    dags = tmp_path / "dags"

    version = dag_runs.run_airflow(["version"], {**home, "KAFKA_INGEST_MARK": "one"})
    first = dag_runs._server
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip()[:1].isdigit(), version.stdout  # e.g. "3.3.2"

    wrong = dag_runs.run_airflow(["no-such-command"], {**home, "KAFKA_INGEST_MARK": "two"})
    assert wrong.returncode == 2  # argparse's exit status, as from the script
    assert "no-such-command" in wrong.stderr
    assert "Traceback" not in wrong.stderr
    assert dag_runs._server is first  # another non-Airflow variable: the same server

    other = dag_runs.run_airflow(["config", "get-value", "core", "dags_folder"],
                                 {"AIRFLOW_HOME": str(tmp_path / "b"),
                                  "AIRFLOW__CORE__DAGS_FOLDER": str(dags)})
    assert other.returncode == 0, other.stderr
    assert other.stdout.strip() == str(dags)  # read at import: a server of its own
    assert dag_runs._server is not first
    assert first is not None and first.proc.poll() is not None  # the old one stopped
