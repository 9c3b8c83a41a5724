"""The kafka_ingest pages and metrics inside Airflow: a FastAPI app on the api-server and
a nav entry of the Airflow UI.

- ``/kafka-ingest/pipelines``: the pipelines at a glance; ``/kafka-ingest/pipelines/<name>``:
  one in detail (:mod:`kafka_ingest.ops.page`). Shown inside the Airflow UI under
  *Kafka ingest* (an external view with a ``url_route``, rendered in the UI's frame).
  Behind Airflow's own authentication (the UI's session cookie or a bearer token, as for
  the REST API; 401 without).
- ``/kafka-ingest/metrics``: the Prometheus metrics (:mod:`kafka_ingest.ops.metrics`).
  Scrapers authenticate with ``Authorization: Bearer <token>``: the token in
  ``KAFKA_INGEST_METRICS_TOKEN`` (or the file ``KAFKA_INGEST_METRICS_TOKEN_FILE`` names)
  set on the api-server, or an Airflow JWT; without either the answer is 401.

Who sees which pipeline (:func:`readable`): a user sees a pipeline, on the pages and in
the metrics alike, when Airflow's auth manager lets them read its ingest DAG
(``<name>_ingest``), asked for every pipeline's DAG by its own id in one batch
(``filter_authorized_dag_ids``, per team in a multi-team deployment); nothing from the
request (no path or query parameter) names the DAG asked about. The ingest DAG is the
grant because what the page shows is the ingest DAG's: its runs and their outcome, the
offsets it stored, the lag it has to catch up, the dead letters its runs parked, which its
readers see in its task logs and XComs anyway. Reading only the DLQ-replay DAG
(``<name>_dlq_replay``) grants nothing here: its readers see the DLQ and the letters it
re-validated, not the source topic's lag or the ingest runs. The overview lists only the
pipelines the caller may read; a pipeline's page answers 404, the same answer as for a
name the pipelines file does not have, when they may not read it (a 403 would tell that
the pipeline exists). The metrics token is an operator's credential: its scrapes carry
every pipeline. A JWT's scrape carries only the series of the pipelines its user may read
(a team can scrape its own pipelines), with ``kafka_ingest_up`` only for the connections
those use; the look's own timing series are the same for everyone.

Kafka and Postgres are reached through each pipeline's Airflow connections, every request
bounded (a slow broker cannot hang a page or a scrape), and one look at the pipelines is
served for ``KAFKA_INGEST_METRICS_CACHE_S`` seconds (default 10).

No side effects at import time beyond building the (empty) FastAPI app: the plugin
manager imports every file here, in every Airflow process.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Protocol

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.api_fastapi.core_api.security import GetUserDep, bearer_scheme, get_user
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.responses import HTMLResponse

from kafka_ingest import Pipeline, load_pipelines
from kafka_ingest.db import Database, RecordedCheck
from kafka_ingest.kafka.clients import LIBRDKAFKA_LOG, LIBRDKAFKA_ONCE
from kafka_ingest.ops import page
from kafka_ingest.ops.metrics import CONTENT_TYPE, exposition, registry_of, token_matches
from kafka_ingest.ops.observe import RunOutcome, Snapshot, SnapshotCache, Sources, snapshot

log = logging.getLogger(__name__)

URL_PREFIX = "/kafka-ingest"
TOKEN_ENV, TOKEN_FILE_ENV = "KAFKA_INGEST_METRICS_TOKEN", "KAFKA_INGEST_METRICS_TOKEN_FILE"
CACHE_ENV, TIMEOUT_ENV = "KAFKA_INGEST_METRICS_CACHE_S", "KAFKA_INGEST_METRICS_TIMEOUT_S"


def _seconds(name: str, default: float) -> float:
    raw = (os.environ.get(name) or "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise ValueError(f"{name}={raw!r} must be above 0")
    return value


def ingest_dag_id(pipeline: Pipeline) -> str:
    """The id of the pipeline's ingest DAG (``dags/ingest_dags.py``)."""
    return f"{pipeline.name}_ingest"


class DagAuthorizer(Protocol):
    """The part of Airflow's auth manager that says which DAGs a user may read."""

    def filter_authorized_dag_ids(self, *, dag_ids: set[str], user: Any, method: Any = "GET",
                                  team_name: str | None = None) -> set[str]: ...


def readable(pipelines: Iterable[Pipeline], user: BaseUser, auth: DagAuthorizer,
             teams: Callable[[list[str]], Mapping[str, str | None]]) -> frozenset[str]:
    """The names of the pipelines ``user`` may read: those whose ingest DAG ``auth`` lets
    them read (``GET``), each DAG asked by its own id, the DAGs of one team together
    (``teams``: DAG id -> team, for the DAGs that have one). See the module's text."""
    by_dag = {ingest_dag_id(p): p.name for p in pipelines}
    if not by_dag:
        return frozenset()
    team_of = teams(sorted(by_dag))
    by_team: dict[str | None, set[str]] = {}
    for dag_id in by_dag:
        by_team.setdefault(team_of.get(dag_id), set()).add(dag_id)
    allowed: set[str] = set()
    for team, dag_ids in by_team.items():
        allowed |= auth.filter_authorized_dag_ids(dag_ids=dag_ids, user=user, method="GET",
                                                  team_name=team) & dag_ids
    return frozenset(by_dag[d] for d in allowed)


def _teams(dag_ids: list[str]) -> Mapping[str, str | None]:
    from airflow.models.dag import DagModel

    return DagModel.get_dag_id_to_team_name_mapping(dag_ids)


class Reader:
    """Who asks: a user of Airflow's, or (``user`` None) a scraper with the metrics token,
    which may read every pipeline."""

    def __init__(self, user: BaseUser | None) -> None:
        self.user = user

    def names(self, snap: Snapshot) -> frozenset[str] | None:
        """The names of the snapshot's pipelines this reader may see; None: every one."""
        if self.user is None:
            return None
        return readable((v.pipeline for v in snap.views), self.user, get_auth_manager(),
                        _teams)

    def sees(self, snap: Snapshot) -> Snapshot:
        names = self.names(snap)
        return snap if names is None else snap.only(names)


def _outcomes(pipelines: Sequence[Pipeline]) -> Mapping[str, RunOutcome]:
    """The newest finished run of each ingest DAG, from Airflow's metadata database."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    ids = {ingest_dag_id(p): p.name for p in pipelines}
    newest = select(DagRun.dag_id, DagRun.run_id, DagRun.state, DagRun.end_date,
                    func.row_number().over(partition_by=DagRun.dag_id,
                                           order_by=DagRun.end_date.desc()).label("n")
                    ).where(DagRun.dag_id.in_(list(ids)),
                            DagRun.state.in_(["success", "failed"]),
                            DagRun.end_date.is_not(None)).subquery()
    with create_session() as session:
        rows = session.execute(select(newest).where(newest.c.n == 1)).all()
    return {ids[r.dag_id]: RunOutcome(str(r.state), r.run_id, r.end_date.timestamp())
            for r in rows}


class _Looks:
    """The plugin's one :class:`SnapshotCache`, made on first use (not at import)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: SnapshotCache | None = None

    @property
    def timeout_s(self) -> float:
        return _seconds(TIMEOUT_ENV, 3.0)

    def cache(self) -> SnapshotCache:
        with self._lock:
            if self._cache is None:
                # a cluster out of reach is asked at every look: log each failure once
                LIBRDKAFKA_LOG.addFilter(LIBRDKAFKA_ONCE)
                self._cache = SnapshotCache(self._take, max_age_s=_seconds(CACHE_ENV, 10.0))
            return self._cache

    def _take(self) -> Any:
        from kafka_ingest_hook import pipeline_clients, postgres_database

        timeout_s = self.timeout_s
        sources = Sources(
            clients=pipeline_clients,
            database=lambda p: postgres_database(p.postgres_conn_id).bounded(timeout_s),
            outcomes=_outcomes)
        return snapshot(list(load_pipelines().values()), sources, timeout_s=timeout_s)

    def database(self, pipeline: Pipeline) -> Database:
        from kafka_ingest_hook import postgres_database

        return postgres_database(pipeline.postgres_conn_id).bounded(self.timeout_s)


LOOKS = _Looks()


def _metrics_token() -> str | None:
    token = os.environ.get(TOKEN_ENV)
    path = os.environ.get(TOKEN_FILE_ENV)
    if not token and path:
        token = Path(path).read_text(encoding="utf-8").strip()
    return token or None


async def _scraper(request: Request) -> Reader:
    """The metrics token (every pipeline), else Airflow's own authentication (401/403 from
    Airflow) and the pipelines the user may read."""
    try:
        token = _metrics_token()
    except OSError as exc:  # the token file is gone: refuse, do not fail
        log.error("%s unreadable: %s", TOKEN_FILE_ENV, exc)
        token = None
    if token_matches(request.headers.get("authorization"), token):
        return Reader(None)
    return Reader(await get_user(request, None, await bearer_scheme(request)))


def _user(user: GetUserDep) -> Reader:
    """A user of Airflow's (401/403 from Airflow without one): never the metrics token."""
    return Reader(user)


def _airflow_root(request: Request) -> str:
    """The Airflow UI's root path, for links: where this app is mounted, minus its prefix."""
    root = str(request.scope.get("root_path") or "")
    return root[: -len(URL_PREFIX)] if root.endswith(URL_PREFIX) else root


app = FastAPI(title="kafka-ingest", docs_url=None, redoc_url=None, openapi_url=None)
Scraper = Annotated[Reader, Depends(_scraper)]
User = Annotated[Reader, Depends(_user)]


@app.get("/metrics")
def metrics(reader: Scraper) -> Response:
    names = reader.names(LOOKS.cache().get())
    return Response(exposition(registry_of(LOOKS.cache(), pipelines=names)),
                    media_type=CONTENT_TYPE)


@app.get("/pipelines", response_class=HTMLResponse)
def pipelines_page(request: Request, reader: User) -> HTMLResponse:
    snap = reader.sees(LOOKS.cache().get())
    checks: dict[str, list[RecordedCheck]] = {}
    by_db: dict[str, list[Pipeline]] = {}
    for v in snap.views:
        by_db.setdefault(v.pipeline.postgres_conn_id, []).append(v.pipeline)
    for members in by_db.values():
        try:
            with LOOKS.database(members[0]).session() as conn:
                checks.update(page.history(conn, [p.name for p in members]))
        except Exception as exc:  # the page shows what it has; the snapshot says who is down
            log.warning("lag history not read: %s", exc)
    root = _airflow_root(request)
    return HTMLResponse(page.overview(snap, checks, airflow=root, here=f"{root}{URL_PREFIX}"
                                      "/pipelines", now=time.time()))


@app.get("/pipelines/{name}", response_class=HTMLResponse)
def pipeline_page(request: Request, name: str, reader: User) -> HTMLResponse:
    view = reader.sees(LOOKS.cache().get()).view(name)
    if view is None:  # unknown or not the caller's: one answer, which names nothing
        raise HTTPException(404, f"no pipeline named {name!r} that you may read")
    checks: list[RecordedCheck] = []
    dead: list[dict[str, Any]] = []
    try:
        with LOOKS.database(view.pipeline).session() as conn:
            checks = page.history(conn, [name])[name]
            dead = page.letters(conn, name)
    except Exception as exc:  # the page shows what the snapshot has; it says who is down
        log.warning("%s: history and dead letters not read: %s", name, exc)
    root = _airflow_root(request)
    return HTMLResponse(page.detail(view, checks, dead, airflow=root,
                                    back=f"{root}{URL_PREFIX}/pipelines", now=time.time()))


class KafkaIngestUiPlugin(AirflowPlugin):
    name = "kafka_ingest_ui"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "kafka-ingest"}]
    external_views = [{
        "name": "Kafka ingest",
        "href": f"{URL_PREFIX}/pipelines",
        "url_route": "kafka-ingest",
        "destination": "nav",
        "category": "browse",
    }]
