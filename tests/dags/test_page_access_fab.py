"""Who sees which pipeline on the pipelines page and in its metrics, under the FAB auth
manager (``apache-airflow-providers-fab``) with real users on a real api-server.

One api-server (alone: nothing runs a DAG here) with the ``kafka_ingest_ui`` plugin and the
FAB auth manager, on a metadata database of its own (``airflow db migrate`` makes the FAB
tables; dropped after); two pipelines A and B on real topics; two FAB users made as an
admin makes them, a role each with ``can_read`` on DAG resources:

- ``reader_a`` may read A's ingest DAG, and B's DLQ-replay DAG (which grants nothing on
  the page: its content is the ingest DAG's);
- ``reader_b`` may read B's ingest DAG only.

Each signs in with ``POST /auth/token`` and must get: the overview with their pipeline
only, whatever ``?dag_id=`` says; their pipeline's page; on the other's page, even with
``?dag_id=<their own ingest DAG>``, the 404 a pipeline that does not exist gets; metrics
with their pipeline's series only. The operator's metrics token gets both pipelines.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg.conninfo import conninfo_to_dict

from kafka_ingest.config import Pipeline, parse_pipelines
from kafka_ingest_dev.databases import fresh_database
from kafka_ingest_dev.procs import free_ports
from tests.support import ROOT
from tests.support.airflow_api import poll
from tests.support.pipelines import dag_env

pytestmark = pytest.mark.integration

FAB_AUTH_MANAGER = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"
#: As long as the stack gives its own Airflow services to start
#: (``kafka_ingest_dev.airflow_services``).
START_S = 180.0
#: ``airflow db migrate`` of an empty database, and the users' script: seconds here.
SETUP_S = 300.0

#: Makes each user of the JSON list on stdin, with a role of its own name that may read the
#: DAGs it lists (FAB's ``can_read`` on ``DAG:<dag_id>``), as ``airflow users create`` and
#: ``airflow roles add-perms`` would, in one process.
_MAKE_USERS = """
import json, sys
from airflow.providers.fab.auth_manager.cli_commands.utils import get_application_builder
with get_application_builder() as appbuilder:
    sm = appbuilder.sm
    for user in json.load(sys.stdin):
        role = sm.add_role(user["username"])
        for dag_id in user["dags"]:
            sm.add_permission_to_role(role, sm.create_permission("can_read", "DAG:" + dag_id))
        sm.add_user(user["username"], user["username"], "Reader",
                    user["username"] + "@example.invalid", role, user["password"])
"""


@dataclass(frozen=True)
class Reader:
    username: str
    password: str
    dags: tuple[str, ...]


def _pipelines(topics: Callable[..., str]) -> tuple[Pipeline, Pipeline]:
    tag = uuid.uuid4().hex[:8]
    body = {"table": "telemetry_metrics", "contract": {"event_type": "metric_event",
                                                      "version": 2}, "schedule": None}
    doc = {"pipelines": {f"acl_{side}_{tag}": {**body, "topic": topics(1, f"acl-{side}"),
                                               "dlq_topic": topics(1, f"acl-{side}-dlq")}
                         for side in ("a", "b")}}
    a, b = parse_pipelines(doc).values()
    return a, b


def _metadata_url(stack_env: dict[str, str], dsn: str) -> str:
    """The stack's metadata database URL, pointed at the database ``dsn`` names."""
    from sqlalchemy.engine import make_url

    url = make_url(stack_env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    return url.set(database=str(conninfo_to_dict(dsn)["dbname"])).render_as_string(
        hide_password=False)


def _tail(path: Path, lines: int = 5) -> str:
    return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])


def _setup(command: list[str], env: dict[str, str], log: Path, stdin: str = "") -> None:
    with log.open("a") as out:
        done = subprocess.run(command, env=env, input=stdin, stdout=out,
                              stderr=subprocess.STDOUT, text=True, timeout=SETUP_S,
                              check=False)
    assert done.returncode == 0, f"{' '.join(command[:4])} failed: {_tail(log)}"


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/api/v2/monitor/health", timeout=3).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def _api_server(env: dict[str, str], log: Path) -> Iterator[str]:
    """``airflow api-server`` alone on a free port; stopped (its process group) on exit."""
    port = free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    with log.open("ab") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "airflow", "api-server", "--host", "127.0.0.1",
             "--port", str(port)],
            env={**env, "AIRFLOW__API__BASE_URL": url, "AIRFLOW__API__WORKERS": "1"},
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)

    def up() -> bool:
        assert server.poll() is None, f"the api-server exited: {_tail(log)}"
        return _answers(url)

    try:
        poll("the FAB api-server to answer", up, START_S, interval_s=0.5)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)


@pytest.fixture
def fab(stack_env: dict[str, str], topics: Callable[..., str], pg_dsn: str,
        tmp_path: Path) -> Iterator[tuple[str, Pipeline, Pipeline, dict[str, Reader], str]]:
    """(api-server URL, A, B, readers by name, the metrics token)."""
    assert importlib.util.find_spec("airflow.providers.fab") is not None, (
        "apache-airflow-providers-fab is not installed (requirements.txt pins it; "
        "scripts/bootstrap.sh installs it)")
    a, b = _pipelines(topics)
    readers = {
        "reader_a": Reader("reader_a", secrets.token_urlsafe(12),
                           (f"{a.name}_ingest", f"{b.name}_dlq_replay")),
        "reader_b": Reader("reader_b", secrets.token_urlsafe(12), (f"{b.name}_ingest",)),
    }
    token = secrets.token_urlsafe(24)
    home = tmp_path / "airflow"
    home.mkdir()
    with fresh_database(stack_env["KAFKA_INGEST_PG_ADMIN_DSN"], prefix="airflow_fab",
                        migrated=False) as metadata:
        env = {**os.environ, **stack_env, **dag_env(tmp_path, pg_dsn, a, b),
               "AIRFLOW_HOME": str(home),
               "AIRFLOW__CORE__AUTH_MANAGER": FAB_AUTH_MANAGER,
               "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": _metadata_url(stack_env, metadata),
               "AIRFLOW__FAB__CONFIG_FILE": str(home / "webserver_config.py"),
               "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
               "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
               "KAFKA_INGEST_METRICS_TOKEN": token, "KAFKA_INGEST_METRICS_CACHE_S": "1"}
        setup_log = tmp_path / "setup.log"
        _setup([sys.executable, "-m", "airflow", "db", "migrate"], env, setup_log)
        _setup([sys.executable, "-c", _MAKE_USERS], env, setup_log, stdin=json.dumps(
            [{"username": r.username, "password": r.password, "dags": list(r.dags)}
             for r in readers.values()]))
        with _api_server(env, tmp_path / "api-server.log") as url:
            yield url, a, b, readers, token


def _signed_in(url: str, reader: Reader) -> httpx.Client:
    answer = httpx.post(f"{url}/auth/token", json={"username": reader.username,
                                                   "password": reader.password}, timeout=30)
    assert answer.status_code in (200, 201), answer.text
    return httpx.Client(base_url=url, timeout=60, headers={
        "Authorization": f"Bearer {answer.json()['access_token']}"})


def _pipeline_labels(exposition: str) -> set[str]:
    return {s.labels["pipeline"] for family in text_string_to_metric_families(exposition)
            for s in family.samples if "pipeline" in s.labels}


def _sees_only(client: httpx.Client, own: Pipeline, other: Pipeline) -> None:
    """``client``'s user sees ``own`` and nothing of ``other``, whatever the query says."""
    own_dag, other_dag = f"{own.name}_ingest", f"{other.name}_ingest"
    for query in ("", f"?dag_id={own_dag}", f"?dag_id={other_dag}"):
        overview = client.get(f"/kafka-ingest/pipelines{query}")
        assert overview.status_code == 200, (query, overview.status_code, overview.text)
        assert f'data-pipeline="{own.name}"' in overview.text, query
        assert other.name not in overview.text and other.topic not in overview.text, query

        mine = client.get(f"/kafka-ingest/pipelines/{own.name}{query}")
        assert mine.status_code == 200 and own.topic in mine.text, (query, mine.status_code)

        theirs = client.get(f"/kafka-ingest/pipelines/{other.name}{query}")
        unknown = client.get(f"/kafka-ingest/pipelines/no_such_{own.name}{query}")
        assert (theirs.status_code, unknown.status_code) == (404, 404), (query, theirs.text)
        assert (theirs.json()["detail"].replace(other.name, "?")
                == unknown.json()["detail"].replace(f"no_such_{own.name}", "?")), query
        assert other.topic not in theirs.text

        scrape = client.get(f"/kafka-ingest/metrics{query}")
        assert scrape.status_code == 200, (query, scrape.status_code)
        assert _pipeline_labels(scrape.text) == {own.name}, query
        assert other.topic not in scrape.text


def test_fab_users_see_only_the_pipelines_whose_ingest_dag_they_may_read(
        fab: tuple[str, Pipeline, Pipeline, dict[str, Reader], str]) -> None:
    url, a, b, readers, token = fab
    with _signed_in(url, readers["reader_a"]) as alice, \
            _signed_in(url, readers["reader_b"]) as bob:
        # the users are what the test says: Airflow's own API refuses the other's DAG
        assert alice.get(f"/api/v2/dags/{b.name}_ingest").status_code == 403
        assert bob.get(f"/api/v2/dags/{a.name}_ingest").status_code == 403
        _sees_only(alice, a, b)  # though she may read B's replay DAG
        _sees_only(bob, b, a)
    scrape = httpx.get(f"{url}/kafka-ingest/metrics", timeout=60,
                       headers={"Authorization": f"Bearer {token}"})
    assert scrape.status_code == 200
    assert _pipeline_labels(scrape.text) == {a.name, b.name}
    anonymous: dict[str, Any] = {"timeout": 60}
    assert httpx.get(f"{url}/kafka-ingest/pipelines", **anonymous).status_code == 401
    assert httpx.get(f"{url}/kafka-ingest/metrics", **anonymous).status_code == 401
