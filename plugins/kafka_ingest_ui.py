"""The kafka_ingest pages and metrics inside Airflow: a FastAPI app on the api-server and
a nav entry of the Airflow UI.

- ``/kafka-ingest/pipelines``: every pipeline at a glance; ``/kafka-ingest/pipelines/<name>``:
  one in detail (:mod:`kafka_ingest.ops.page`). Shown inside the Airflow UI under
  *Kafka ingest* (an external view with a ``url_route``, rendered in the UI's frame).
  Behind Airflow's own authentication: the caller must be allowed to read DAGs (the UI's
  session cookie or a bearer token, as for the REST API).
- ``/kafka-ingest/metrics``: the Prometheus metrics (:mod:`kafka_ingest.ops.metrics`).
  Scrapers authenticate with ``Authorization: Bearer <token>``: the token in
  ``KAFKA_INGEST_METRICS_TOKEN`` (or the file ``KAFKA_INGEST_METRICS_TOKEN_FILE`` names)
  set on the api-server, or an Airflow JWT; without either the answer is 401.

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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow.api_fastapi.core_api.security import bearer_scheme, get_user, requires_access_dag
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.responses import HTMLResponse
from starlette.concurrency import run_in_threadpool

from kafka_ingest import Pipeline, load_pipelines
from kafka_ingest.db import Database
from kafka_ingest.kafka.clients import LIBRDKAFKA_LOG, LIBRDKAFKA_ONCE
from kafka_ingest.ops import page
from kafka_ingest.ops.metrics import CONTENT_TYPE, exposition, registry_of, token_matches
from kafka_ingest.ops.observe import RunOutcome, SnapshotCache, Sources, snapshot

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


def _outcomes(pipelines: Sequence[Pipeline]) -> Mapping[str, RunOutcome]:
    """The newest finished run of each ingest DAG, from Airflow's metadata database."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    ids = {f"{p.name}_ingest": p.name for p in pipelines}
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


async def _scraper(request: Request) -> None:
    """The metrics token, else Airflow's own authentication and the right to read DAGs,
    as for the pages (401/403 from Airflow)."""
    try:
        token = _metrics_token()
    except OSError as exc:  # the token file is gone: refuse, do not fail
        log.error("%s unreadable: %s", TOKEN_FILE_ENV, exc)
        token = None
    if token_matches(request.headers.get("authorization"), token):
        return
    user = await get_user(request, None, await bearer_scheme(request))
    await run_in_threadpool(requires_access_dag("GET"), request, user)


def _airflow_root(request: Request) -> str:
    """The Airflow UI's root path, for links: where this app is mounted, minus its prefix."""
    root = str(request.scope.get("root_path") or "")
    return root[: -len(URL_PREFIX)] if root.endswith(URL_PREFIX) else root


app = FastAPI(title="kafka-ingest", docs_url=None, redoc_url=None, openapi_url=None)
_READ_DAGS = [Depends(requires_access_dag("GET"))]


@app.get("/metrics", dependencies=[Depends(_scraper)])
def metrics() -> Response:
    return Response(exposition(registry_of(LOOKS.cache())), media_type=CONTENT_TYPE)


@app.get("/pipelines", response_class=HTMLResponse, dependencies=_READ_DAGS)
def pipelines_page(request: Request) -> HTMLResponse:
    snap = LOOKS.cache().get()
    checks: dict[str, list[page.Check]] = {}
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


@app.get("/pipelines/{name}", response_class=HTMLResponse, dependencies=_READ_DAGS)
def pipeline_page(request: Request, name: str) -> HTMLResponse:
    view = LOOKS.cache().get().view(name)
    if view is None:
        raise HTTPException(404, f"no pipeline named {name!r} in the pipelines file")
    checks: list[page.Check] = []
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
