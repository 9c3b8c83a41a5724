"""Airflow's services of the local stack (``stack up --airflow``; with xdist, the worker's
own Airflow instance: tests/support/workers.py) for a test, and a client of its REST API,
used as a user uses them: a token from ``/auth/token``, then ``/api/v2``.

:func:`running_airflow` starts the api-server, scheduler, dag-processor and triggerer (with
the LocalExecutor, or the CeleryExecutor with Redis and N workers) with a test's pipelines
file and database (on top of the stack's environment), waits until the test's DAGs are
parsed, and on exit stops the services and deletes the test's DAGs and the pools its
pipelines named from the metadata database, so no later test sees them or depends on
them. Every wait on Airflow has a deadline from :mod:`tests.support.deadlines`.

:class:`SharedAirflow` is one start of them (LocalExecutor) for every DAG test that needs
the services and not an executor or settings of its own: the DAG tests on one worker run
one after another, each with :meth:`SharedAirflow.serving` its pipelines, as a
deployment adds one: written into the services' pipelines file, their Postgres connection
(a connection id of their own, pointing at the test's database) created through the REST
API, the DAG files parsed again on request; on exit all of it removed again. A pipeline
of the session's own (the anchor: real, empty topics and a database) keeps a DAG in each
DAG file, so that each file can be asked to be parsed again.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
import yaml
from psycopg.conninfo import make_conninfo

from kafka_ingest.config import Pipeline, airflow_pools, parse_pipelines
from kafka_ingest_dev import stack
from kafka_ingest_dev.databases import airflow_postgres_conn
from kafka_ingest_dev.demo import _airflow_bin
from tests.support.deadlines import parse_deadline_s

TERMINAL = {"success", "failed"}
#: The states a task instance ends in (``up_for_retry`` is none: Airflow tries it again).
TASK_ENDED = {"success", "failed", "upstream_failed", "skipped", "removed"}


class AirflowApi:
    """The REST API of the stack's api-server, logged in as the stack's admin;
    ``settings``: the ``AIRFLOW__*`` environment the services run with, ``scheduler_pid``
    the scheduler they were started with."""

    def __init__(self, url: str, user: str, password: str, *,
                 settings: Mapping[str, str] | None = None,
                 scheduler_pid: int | None = None) -> None:
        self.url = url
        self.user = user
        self.password = password
        self.settings = dict(settings or {})
        self.scheduler_pid = scheduler_pid
        token = httpx.post(f"{url}/auth/token", json={"username": user, "password": password},
                           timeout=30)
        token.raise_for_status()
        self.client = httpx.Client(base_url=f"{url}/api/v2", timeout=30, headers={
            "Authorization": f"Bearer {token.json()['access_token']}"})

    #: A GET that fails on the way (the api-server of a loaded machine answering after the
    #: client's time-out, a dropped connection) is asked again, this many times in all: a
    #: hiccup of the test's own client is not what a test is about.
    GET_TRIES = 3

    def get(self, path: str) -> Any:
        for left in range(self.GET_TRIES - 1, -1, -1):
            try:
                response = self.client.get(path)
                break
            except httpx.TransportError:
                if not left:
                    raise
        response.raise_for_status()
        return response.json()

    def unpause(self, dag_id: str) -> None:
        self.client.patch(f"/dags/{dag_id}", json={"is_paused": False}).raise_for_status()

    def trigger(self, dag_id: str, conf: dict[str, Any]) -> str:
        response = self.client.post(f"/dags/{dag_id}/dagRuns",
                                    json={"logical_date": None, "conf": conf})
        response.raise_for_status()
        return str(response.json()["dag_run_id"])

    def wait_for_run(self, dag_id: str, run_id: str, timeout_s: float) -> str:
        """Wait for the run to end (success or failed); past the deadline, say where each
        of its tasks is, or that the services are no longer the ones the test started."""
        try:
            return str(poll(f"{dag_id} run {run_id} to finish",
                            lambda: self._finished(dag_id, run_id), timeout_s))
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {self._whereabouts(dag_id, run_id)}") from None

    def _whereabouts(self, dag_id: str, run_id: str) -> str:
        now = stack.settings().airflow.pids()["scheduler"]
        if now != self.scheduler_pid:
            return (f"the Airflow services were stopped or replaced meanwhile (scheduler pid "
                    f"{self.scheduler_pid}, now {now})")
        return f"tasks: {self.task_states(dag_id, run_id)}"

    def _finished(self, dag_id: str, run_id: str) -> str | None:
        state = self.get(f"/dags/{dag_id}/dagRuns/{run_id}")["state"]
        return state if state in TERMINAL else None

    def wait_for_task(self, dag_id: str, run_id: str, task_id: str, timeout_s: float) -> None:
        """Wait for every map index of ``task_id`` in the run to end, and fail at once, with
        the end of each failed try's log, if one did not succeed: a task that failed is not
        waited for up to the deadline (its retries are Airflow's: a try that is retried is
        no end)."""
        def ended() -> list[dict[str, Any]] | None:
            tis = self.task_instances(dag_id, run_id, task_id)
            return tis if tis and all(t["state"] in TASK_ENDED for t in tis) else None
        try:
            tis = poll(f"{task_id} of {dag_id} run {run_id} to end", ended, timeout_s,
                       interval_s=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {self._whereabouts(dag_id, run_id)}") from None
        failed = [t for t in tis if t["state"] != "success"]
        if failed:
            why = "; ".join(f"map index {t['map_index']} {t['state']} (try {t['try_number']}),"
                            f" its log ends: {self.log_tail(dag_id, run_id, t)}" for t in failed)
            raise AssertionError(f"{task_id} of {dag_id} run {run_id} did not succeed: {why}")

    def log_tail(self, dag_id: str, run_id: str, ti: Mapping[str, Any], lines: int = 30) -> str:
        """The last ``lines`` lines of the log of the task instance ``ti``'s current try."""
        response = self.client.get(
            f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{ti['task_id']}/logs/"
            f"{ti['try_number']}", params={"map_index": ti["map_index"], "full_content": True},
            headers={"Accept": "application/json"})
        if response.is_error:
            return f"(no log: HTTP {response.status_code})"
        content = response.json().get("content") or []
        text = [f"{e.get('level', '')} {e.get('event', '')}".strip() if isinstance(e, dict)
                else str(e) for e in content]
        return "\n".join(text[-lines:])

    def xcom(self, dag_id: str, run_id: str, task_id: str) -> Any:
        entry = self.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
                         "/xcomEntries/return_value")
        return entry["value"]

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        tis = self.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {f"{t['task_id']}[{t['map_index']}]": t["state"] for t in tis}

    def task_instances(self, dag_id: str, run_id: str, task_id: str) -> list[dict[str, Any]]:
        """The run's instances of ``task_id`` (every map index): state, hostname, pid,
        start and end dates, try number, ``rendered_map_index``."""
        tis = self.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances"
                       f"?task_id={task_id}")["task_instances"]
        return [t for t in tis if t["task_id"] == task_id]

    def tries(self, dag_id: str, run_id: str, task_id: str, map_index: int
              ) -> list[dict[str, Any]]:
        """Every try of one task instance, the current one included, oldest first."""
        tries = self.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
                         f"/{map_index}/tries")["task_instances"]
        return sorted(tries, key=lambda t: t["try_number"])


def poll(what: str, check: Callable[[], Any], timeout_s: float, *,
         interval_s: float = 1.0) -> Any:
    """Wait for ``check()`` to return something truthy, by polling with a deadline (asked
    at least once). A request of ``check()`` that fails on the way (the api-server busy
    past the client's time-out on a loaded machine, or restarting: ``httpx``'s transport
    errors) counts as "not yet": the wait's deadline decides, and names the last failure.
    An answer with an error status still fails at once."""
    deadline = time.monotonic() + timeout_s
    failed: httpx.TransportError | None = None
    while True:
        try:
            value = check()
        except httpx.TransportError as exc:
            value, failed = None, exc
        if value:
            return value
        if time.monotonic() >= deadline:
            last = f" (the last request failed: {failed!r})" if failed is not None else ""
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}{last}")
        time.sleep(interval_s)


@contextmanager
def running_airflow(env: dict[str, str], dag_ids: list[str],
                    *, extra: dict[str, str] | None = None, executor: str = "local",
                    workers: int | None = None) -> Iterator[AirflowApi]:
    """The stack's Airflow services with ``env`` (pipelines file, connections) on top; the
    DAGs ``dag_ids`` parsed and visible through the REST API. ``executor`` ``"celery"``
    runs ``workers`` Celery workers and Redis (``stack up --executor celery``)."""
    stack.stop_airflow()  # whatever ran before, with another environment
    up = stack.up(airflow=True, airflow_env={**env, **(extra or {})}, executor=executor,
                  workers=workers)
    scheduler = _scheduler()
    api = AirflowApi(up["AIRFLOW_API_URL"], up["AIRFLOW_API_USER"], up["AIRFLOW_API_PASSWORD"],
                     settings={k: v for k, v in scheduler.environ().items()
                               if k.startswith("AIRFLOW__")},
                     scheduler_pid=scheduler.pid)
    try:
        deadline = time.monotonic() + parse_deadline_s(api.settings)
        for dag_id in dag_ids:
            try:
                poll(f"the DAG {dag_id} to be parsed", lambda d=dag_id: _dag_known(api, d),
                     max(0.0, deadline - time.monotonic()))
            except AssertionError as exc:
                raise AssertionError(f"{exc}; import errors: {_import_errors(api)}") from None
        yield api
    finally:
        _delete_pools(api, env)
        stack.stop_airflow()
        _delete_dags(dag_ids, env)


#: What ``airflow dags delete`` does, for several DAGs in one process (an Airflow CLI
#: process costs seconds to start); a DAG already gone is no error.
_DELETE_DAGS = """
import contextlib, sys
from airflow.api.common.delete_dag import delete_dag
from airflow.exceptions import DagNotFound
for dag_id in sys.argv[1:]:
    with contextlib.suppress(DagNotFound):
        delete_dag(dag_id)
"""


def _delete_dags(dag_ids: list[str], env: dict[str, str]) -> None:
    """The test's DAGs out of the metadata database, their runs with them; best effort."""
    python = Path(_airflow_bin()).with_name("python")
    subprocess.run([str(python), "-c", _DELETE_DAGS, *dag_ids], env={**os.environ, **env},
                   capture_output=True, check=False)


def _delete_pools(api: AirflowApi, env: dict[str, str]) -> None:
    """The pools the test's pipelines named (the stack created them); best effort."""
    from kafka_ingest.config import airflow_pools, load_pipelines

    path = env.get("KAFKA_INGEST_PIPELINES")
    if not path:
        return
    with contextlib.suppress(ValueError, httpx.HTTPError):
        for name in airflow_pools(load_pipelines(path)):
            if name != "default_pool":
                api.client.delete(f"/pools/{name}")


def _scheduler() -> psutil.Process:
    """The stack's scheduler: its environment holds the settings every service got (the
    stack's own and the test's ``extra``), which the waits' deadlines derive from."""
    pid = stack.settings().airflow.pids()["scheduler"]
    assert pid is not None, "the stack's scheduler is not running"
    return psutil.Process(pid)


def _dag_known(api: AirflowApi, dag_id: str) -> bool:
    return api.client.get(f"/dags/{dag_id}").status_code == 200


def _import_errors(api: AirflowApi) -> list[str]:
    """What the dag-processor could not import (file and the last line of its trace)."""
    errors = api.get("/importErrors")["import_errors"]
    return [f"{e['filename']}: {''.join((e.get('stack_trace') or '').strip().splitlines()[-1:])}"
            for e in errors]


def chromium() -> str:
    """Debian's Chromium, which the UI tests drive (Playwright downloads no browser here)."""
    import shutil

    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "Debian's chromium is not installed (scripts/bootstrap.sh installs it)"
    return found


# --------------------------------------------------------------------------- shared


#: What the shared services run with beyond the stack's settings: the union of what their
#: tests need (a scheduler heartbeat each second; the metrics' cache short, so a scrape
#: sees a run's effect within seconds).
SHARED_SETTINGS = {"AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
                   "KAFKA_INGEST_METRICS_CACHE_S": "1"}
#: The DAG files a pipeline adds DAGs to, and the DAG each holds for the anchor pipeline.
_DAG_FILES = ("{name}_ingest", "{name}_dlq_replay", "kafka_ingest_monitor")


class SharedAirflow:
    """The stack's Airflow services, started once for the DAG tests (module docstring)."""

    def __init__(self, directory: Path, anchor: Pipeline, anchor_dsn: str,
                 env: Mapping[str, str]) -> None:
        self.path = directory / "pipelines.yaml"
        self.anchor = anchor
        self.metrics_token = secrets.token_urlsafe(24)
        self.env = {**env, "KAFKA_INGEST_PIPELINES": str(self.path),
                    "KAFKA_INGEST_METRICS_TOKEN": self.metrics_token, **SHARED_SETTINGS}
        self._pipelines: dict[str, dict[str, Any]] = {}
        self._contracts: dict[str, Any] = {}
        self._connections = {anchor.postgres_conn_id: anchor_dsn}
        self.api: AirflowApi | None = None
        self._write()

    # -------------------------------------------------------------- the services

    def ensure(self) -> AirflowApi:
        """The services, started if they are not the ones this object started (another
        test's own services, the Celery executor's, replaced them)."""
        if self.api is not None and \
                stack.settings().airflow.pids()["scheduler"] == self.api.scheduler_pid:
            return self.api
        stack.stop_airflow()
        self.api = _started(self.env)
        for conn_id, dsn in self._connections.items():
            self._connect(conn_id, dsn)
        self._parsed([d.format(name=self.anchor.name) for d in _DAG_FILES])
        return self.api

    def stop(self) -> None:
        if self.api is not None:
            stack.stop_airflow()
            self.api = None

    # -------------------------------------------------------------- a test's pipelines

    @contextmanager
    def serving(self, pipelines: Sequence[Pipeline], dsn: str) -> Iterator[AirflowApi]:
        """``pipelines`` in the services' pipelines file, their database ``dsn`` behind a
        Postgres connection of their own; their DAGs parsed. On exit, all of it removed."""
        api = self.ensure()
        conn_id = f"pg_{uuid.uuid4().hex[:12]}"
        served = [p.model_copy(update={"postgres_conn_id": conn_id}) for p in pipelines]
        dag_ids = [d.format(name=p.name) for p in served for d in _DAG_FILES[:2]]
        pools = [name for name in airflow_pools({p.name: p for p in served})
                 if name != "default_pool"]
        try:
            self._connections[conn_id] = dsn
            self._connect(conn_id, dsn)
            for name, slots in airflow_pools({p.name: p for p in served}).items():
                if name != "default_pool":
                    api.client.post("/pools", json={"name": name, "slots": slots}
                                    ).raise_for_status()
            for pipeline in served:
                self._pipelines[pipeline.name] = pipeline.model_dump(mode="json",
                                                                     exclude={"name"})
                if pipeline.model.DECLARATION is not None:
                    self._contracts[pipeline.model.EVENT_TYPE] = json.loads(
                        pipeline.model.DECLARATION)
            self._write()
            self._parsed(dag_ids)
            yield api
        finally:
            for pipeline in served:
                self._pipelines.pop(pipeline.name, None)
            self._write()
            self.reparse()
            for dag_id in dag_ids:
                api.client.delete(f"/dags/{dag_id}")  # its runs too; best effort
            for name in pools:
                api.client.delete(f"/pools/{name}")
            api.client.delete(f"/connections/{conn_id}")
            self._connections.pop(conn_id, None)

    # -------------------------------------------------------------- helpers

    def _write(self) -> None:
        """The pipelines file, replaced at once (a parse never reads half of it)."""
        doc: dict[str, Any] = {"pipelines": {
            self.anchor.name: self.anchor.model_dump(mode="json", exclude={"name"}),
            **self._pipelines}}
        if self._contracts:
            doc["contracts"] = self._contracts
        parse_pipelines(doc)  # what the services will read must load
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(yaml.safe_dump(doc), encoding="utf-8")
        temporary.replace(self.path)

    def _connect(self, conn_id: str, dsn: str) -> None:
        assert self.api is not None
        conn = json.loads(airflow_postgres_conn(dsn))
        body = {"connection_id": conn_id, "conn_type": conn["conn_type"],
                "host": conn.get("host"), "port": conn.get("port"),
                "login": conn.get("login"), "password": conn.get("password"),
                "schema": conn.get("schema"), "extra": json.dumps(conn.get("extra") or {})}
        self.api.client.delete(f"/connections/{conn_id}")  # after a restart: made anew
        self.api.client.post("/connections", json=body).raise_for_status()

    def reparse(self) -> None:
        """Ask the dag-processor to parse each DAG file again now."""
        assert self.api is not None
        for dag_id in (d.format(name=self.anchor.name) for d in _DAG_FILES):
            token = self.api.get(f"/dags/{dag_id}")["file_token"]
            answer = self.api.client.put(f"/parseDagFile/{token}")
            if answer.status_code != 409:  # 409: a request for the file is pending already,
                answer.raise_for_status()  # which the processor takes after this moment

    def _parsed(self, dag_ids: list[str]) -> None:
        """Wait until the DAGs are known (asking for a parse of every DAG file first)."""
        assert self.api is not None
        api = self.api
        deadline = time.monotonic() + parse_deadline_s(api.settings)
        if all(_dag_known(api, d.format(name=self.anchor.name)) for d in _DAG_FILES):
            self.reparse()
        for dag_id in dag_ids:
            try:
                poll(f"the DAG {dag_id} to be parsed", lambda d=dag_id: _dag_known(api, d),
                     max(0.0, deadline - time.monotonic()), interval_s=0.5)
            except AssertionError as exc:
                raise AssertionError(f"{exc}; import errors: {_import_errors(api)}") from None


def _started(env: Mapping[str, str]) -> AirflowApi:
    """The stack's Airflow services started with ``env`` on top (the LocalExecutor)."""
    up = stack.up(airflow=True, airflow_env=dict(env), executor="local")
    scheduler = _scheduler()
    return AirflowApi(up["AIRFLOW_API_URL"], up["AIRFLOW_API_USER"],
                      up["AIRFLOW_API_PASSWORD"],
                      settings={k: v for k, v in scheduler.environ().items()
                                if k.startswith("AIRFLOW__")},
                      scheduler_pid=scheduler.pid)


def metadata_dsn(stack_env: Mapping[str, str]) -> str:
    """Airflow's metadata database in the stack's Postgres, as a libpq DSN: the one the
    stack's environment points Airflow at (with xdist, the worker's own instance's)."""
    return make_conninfo(stack_env["KAFKA_INGEST_PG_DSN"],
                         dbname=stack.settings().airflow_database)


def last_task_state(stack_env: dict[str, str], dag_id: str, task_id: str) -> str:
    """The state of ``task_id`` in the newest run of ``dag_id`` (Airflow's metadata DB)."""
    with psycopg.connect(metadata_dsn(stack_env)) as conn:
        row = conn.execute(
            "SELECT ti.state FROM task_instance ti JOIN dag_run r"
            " ON r.dag_id = ti.dag_id AND r.run_id = ti.run_id"
            " WHERE ti.dag_id = %s AND ti.task_id = %s ORDER BY r.id DESC LIMIT 1",
            (dag_id, task_id),
        ).fetchone()
    assert row is not None, f"no {dag_id}.{task_id} task instance"
    return str(row[0])
