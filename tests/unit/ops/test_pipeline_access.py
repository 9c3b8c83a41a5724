"""Who sees which pipeline on the pipelines page and in the metrics, without services:
the decision (:func:`kafka_ingest_ui.readable`) over a fake auth manager that records what
it was asked, :meth:`Snapshot.only` and the metrics of some pipelines, and the plugin's
routes in-process (httpx over ASGI) with a signed-in user stood in for Airflow's
authentication and a hand-made snapshot for the look at Kafka and Postgres.

Alice may read pipeline ``a``'s ingest DAG and ``b``'s DLQ-replay DAG; Bob only ``b``'s
ingest DAG. Alice must see ``a`` only, however she words the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import pytest
from fastapi import HTTPException, Request
from prometheus_client.parser import text_string_to_metric_families

import kafka_ingest_ui as ui
from kafka_ingest.config import Pipeline, parse_pipelines
from kafka_ingest.ops.metrics import exposition, registry_of
from kafka_ingest.ops.observe import PipelineView, Snapshot, SnapshotCache

BODY: dict[str, Any] = {"contract": {"event_type": "metric_event", "version": 2}}
TOKEN = "the-operators-scrape-token"


def pipelines() -> dict[str, Pipeline]:
    """``a`` and ``b`` on connections of their own, ``c`` on ``a``'s."""
    return parse_pipelines({"pipelines": {
        "a": {**BODY, "topic": "alpha-in", "dlq_topic": "alpha-dlq", "table": "alpha_rows",
              "kafka_conn_id": "kafka_alpha", "postgres_conn_id": "pg_alpha"},
        "b": {**BODY, "topic": "bravo-in", "dlq_topic": "bravo-dlq", "table": "bravo_rows",
              "kafka_conn_id": "kafka_bravo", "postgres_conn_id": "pg_bravo"},
        "c": {**BODY, "topic": "charlie-in", "dlq_topic": "charlie-dlq",
              "table": "charlie_rows", "kafka_conn_id": "kafka_alpha",
              "postgres_conn_id": "pg_alpha"},
    }})


def snapshot() -> Snapshot:
    views = tuple(PipelineView(pipeline=p) for p in pipelines().values())
    up = {("kafka", "kafka_alpha"): True, ("postgres", "pg_alpha"): True,
          ("kafka", "kafka_bravo"): False, ("postgres", "pg_bravo"): True}
    return Snapshot(views, up, 1_772_000_000.0, 0.25)


class User:
    """Stands in for Airflow's ``BaseUser``: the auth manager below knows it by name."""

    def __init__(self, name: str) -> None:
        self.name = name

    def get_id(self) -> str:
        return self.name

    def get_name(self) -> str:
        return self.name


class FakeAuthManager:
    """Answers ``filter_authorized_dag_ids`` from a table of DAG ids each user may read
    (``"*"``: every DAG), and records every question; ``is_authorized_dag`` as the FAB
    auth manager answers it (without a DAG id: whether the user may read any DAG)."""

    def __init__(self, grants: Mapping[str, set[str]]) -> None:
        self.grants = grants
        self.asked: list[dict[str, Any]] = []

    def filter_authorized_dag_ids(self, *, dag_ids: set[str], user: Any, method: Any = "GET",
                                  team_name: str | None = None) -> set[str]:
        self.asked.append({"dag_ids": set(dag_ids), "user": user.name, "method": method,
                           "team_name": team_name})
        allowed = self.grants.get(user.name, set())
        return set(dag_ids) if "*" in allowed else set(dag_ids) & allowed

    def is_authorized_dag(self, *, method: Any, user: Any, access_entity: Any = None,
                          details: Any = None) -> bool:
        allowed = self.grants.get(user.name, set())
        if details is None or not details.id:
            return bool(allowed)
        return "*" in allowed or details.id in allowed


GRANTS = {"alice": {"a_ingest", "b_dlq_replay"}, "bob": {"b_ingest"}, "root": {"*"}}


def no_teams(dag_ids: list[str]) -> dict[str, str | None]:
    return {}


# --------------------------------------------------------------------------- the decision


@pytest.mark.parametrize(("user", "expected"), [
    ("alice", {"a"}),  # b's replay DAG alone does not grant b
    ("bob", {"b"}),
    ("root", {"a", "b", "c"}),  # may read every DAG
    ("mallory", set()),  # may read no DAG
])
def test_a_user_reads_the_pipelines_whose_ingest_dag_they_may_read(
        user: str, expected: set[str]) -> None:
    auth = FakeAuthManager(GRANTS)
    assert ui.readable(pipelines().values(), User(user), auth, no_teams) == expected


def test_every_ingest_dag_is_asked_by_its_own_id_in_one_batch_for_reading() -> None:
    auth = FakeAuthManager(GRANTS)
    ui.readable(pipelines().values(), User("alice"), auth, no_teams)
    assert auth.asked == [{"dag_ids": {"a_ingest", "b_ingest", "c_ingest"}, "user": "alice",
                           "method": "GET", "team_name": None}]


def test_the_dags_of_a_team_are_asked_with_their_team() -> None:
    auth = FakeAuthManager(GRANTS)
    asked_for: list[list[str]] = []

    def teams(dag_ids: list[str]) -> dict[str, str | None]:
        asked_for.append(dag_ids)
        return {"a_ingest": "red", "c_ingest": "red", "b_ingest": "blue"}

    ui.readable(pipelines().values(), User("bob"), auth, teams)
    assert asked_for == [["a_ingest", "b_ingest", "c_ingest"]]
    assert sorted((q["team_name"], sorted(q["dag_ids"])) for q in auth.asked) == [
        ("blue", ["b_ingest"]), ("red", ["a_ingest", "c_ingest"])]


def test_an_answer_beyond_the_question_grants_nothing() -> None:
    class Generous(FakeAuthManager):
        def filter_authorized_dag_ids(self, **kwargs: Any) -> set[str]:
            return {"b_ingest", "elsewhere_ingest"}

    only_a = [pipelines()["a"]]
    assert ui.readable(only_a, User("alice"), Generous({}), no_teams) == frozenset()


def test_no_pipeline_no_question() -> None:
    auth = FakeAuthManager(GRANTS)
    assert ui.readable([], User("alice"), auth, no_teams) == frozenset()
    assert auth.asked == []


# --------------------------------------------------------------------------- what is shown


def test_only_keeps_the_views_named_and_the_connections_they_use() -> None:
    seen = snapshot().only({"b"})
    assert [v.name for v in seen.views] == ["b"]
    assert seen.up == {("kafka", "kafka_bravo"): False, ("postgres", "pg_bravo"): True}
    assert (seen.taken_at, seen.seconds) == (1_772_000_000.0, 0.25)
    assert snapshot().only(set()).views == ()
    assert snapshot().only(set()).up == {}


def series(text: str) -> set[tuple[str, str]]:
    """(metric, pipeline or connection) of every sample of an exposition."""
    return {(s.name, s.labels.get("pipeline") or s.labels.get("connection") or "")
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_the_metrics_of_some_pipelines_carry_only_theirs() -> None:
    cache = SnapshotCache(snapshot)
    text = exposition(registry_of(cache, pipelines={"a"})).decode()
    assert ("kafka_ingest_pipeline_info", "a") in series(text)
    names = {label for _, label in series(text)}
    assert names == {"", "a", "kafka_alpha", "pg_alpha"}, names
    assert "bravo" not in text and "charlie" not in text
    every = exposition(registry_of(cache)).decode()
    assert {"a", "b", "c", "kafka_bravo"} <= {label for _, label in series(every)}


# --------------------------------------------------------------------------- the routes


class Client:
    """Requests to the plugin's app, in-process."""

    def get(self, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
        async def request() -> httpx.Response:
            transport = httpx.ASGITransport(app=ui.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://airflow") as c:
                return await c.get(path, headers=headers)

        return asyncio.run(request())


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    """The plugin's app with Airflow's authentication stood in for: ``X-Test-User`` names
    the signed-in user (none: 401, as Airflow answers), the fake auth manager decides."""
    from airflow.api_fastapi.core_api import security

    # module-level names in the annotations: FastAPI resolves them in the module
    async def signed_in(request: Request) -> User:
        name = request.headers.get("x-test-user")
        if not name:
            raise HTTPException(401, "Not authenticated")
        return User(name)

    async def get_user(request: Request, _oauth: Any, _bearer: Any) -> User:
        return await signed_in(request)

    monkeypatch.setattr(ui, "get_user", get_user)
    for module in (ui, security):  # the plugin's and what Airflow's own checks ask
        monkeypatch.setattr(module, "get_auth_manager", lambda: FakeAuthManager(GRANTS))
    monkeypatch.setattr(ui, "_teams", no_teams)
    monkeypatch.setattr(ui.LOOKS, "_cache", SnapshotCache(snapshot))

    def no_database(pipeline: Pipeline) -> Any:
        raise ConnectionError("no database in a unit test")

    monkeypatch.setattr(ui.LOOKS, "database", no_database)
    monkeypatch.setenv(ui.TOKEN_ENV, TOKEN)
    ui.app.dependency_overrides[security.get_user] = signed_in
    try:
        yield Client()
    finally:
        ui.app.dependency_overrides.clear()


def as_user(name: str) -> dict[str, str]:
    return {"X-Test-User": name}


def test_the_overview_lists_only_the_callers_pipelines(client: Client) -> None:
    for query in ("", "?dag_id=b_ingest", "?dag_id=a_ingest"):
        alice = client.get(f"/pipelines{query}", headers=as_user("alice"))
        assert alice.status_code == 200, (query, alice.text)
        assert 'data-pipeline="a"' in alice.text
        assert "bravo" not in alice.text and "charlie" not in alice.text, query
        assert "kafka_bravo" not in alice.text  # another pipeline's connection, even down
    bob = client.get("/pipelines", headers=as_user("bob"))
    assert 'data-pipeline="b"' in bob.text and "alpha" not in bob.text
    nobody = client.get("/pipelines", headers=as_user("mallory"))
    assert nobody.status_code == 200 and "data-pipeline" not in nobody.text
    assert client.get("/pipelines").status_code == 401


@pytest.mark.parametrize("query", ["", "?dag_id=a_ingest", "?dag_id=b_dlq_replay"])
def test_anothers_pipeline_is_not_found_as_an_unknown_one_is(
        client: Client, query: str) -> None:
    theirs = client.get(f"/pipelines/b{query}", headers=as_user("alice"))
    unknown = client.get(f"/pipelines/zz{query}", headers=as_user("alice"))
    assert (theirs.status_code, unknown.status_code) == (404, 404)
    assert theirs.json()["detail"].replace("'b'", "'zz'") == unknown.json()["detail"]
    assert "bravo" not in theirs.text
    own = client.get(f"/pipelines/a{query}", headers=as_user("alice"))
    assert own.status_code == 200 and "alpha-in" in own.text


def test_a_users_scrape_carries_their_pipelines_and_the_tokens_every_one(
        client: Client) -> None:
    alice = client.get("/metrics?dag_id=b_ingest", headers=as_user("alice"))
    assert alice.status_code == 200, alice.text
    assert {label for _, label in series(alice.text)} == {"", "a", "kafka_alpha", "pg_alpha"}
    token = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert {"a", "b", "c"} <= {label for _, label in series(token.text)}
    assert client.get("/metrics").status_code == 401
