"""How the session runs on pytest-xdist workers.

The tests wait (on Kafka, Postgres, Airflow, subprocesses) much of the time, so three run
at once on the two cores (``make test``: ``-n 3 --dist loadscope``, the scheduling below).
What must not overlap is kept apart here, by four means:

- **An Airflow of each worker's own** (:func:`configure_worker`): the DAG tests start and
  stop Airflow's services and run DAGs against a metadata database, with the same DAG ids
  (``telemetry_metrics_ingest``) on every worker. So each worker has an Airflow instance of
  the stack's of its own (``KAFKA_INGEST_AIRFLOW_INSTANCE=<worker id>``,
  :mod:`kafka_ingest_dev.stack.settings`): its ``AIRFLOW_HOME`` (logs, pid files), its
  metadata database (``airflow_gw0``: a copy of the stack's migrated ``airflow`` database,
  made once) and its ports for the api-server and Redis. The services a worker starts are
  stopped when it ends (:func:`unconfigure`). Within a worker, the DAG tests on the shared
  services and the others take turns (``tests/dags/conftest.py``).
- **Units of work** (:func:`scope`, a scheduler of our own): the tests of one unit run on
  one worker, one after another. Every module is a unit of its own, so its module-scoped
  fixtures (a stack of its own, a database, topics, Airflow's services) are made once, on
  one worker (and the workers ask for work once a module, not once a test: a unit of work
  costs a round trip to the controller).
- **Order**: the groups that take longest go first (the soak's test, then the DAG tests
  and the fault tests with stacks of their own, then the integration modules), the unit
  tests' modules last: each worker takes the next unit of work when it is nearly done, so
  the short ones fill in at the end. The soak's work is started by the controller at the
  session's start (:mod:`tests.support.background`), and its test, first, holds a worker
  while it runs (``make soak-short``: the soak is not in ``make test``, whose cores were
  busy beside it). Among the DAG tests, those on the shared Airflow services
  come first, then the others, each the longest first (:data:`DAG_MODULE_SECONDS`): a
  worker that takes them one after another starts the shared services once.
  ``--no-loadscope-reorder`` keeps this order.
- **A lock on the shared stack**: a test marked ``exclusive`` (it restarts the stack's
  Kafka or Postgres) runs while no other test that uses the stack (``stack_env``) runs,
  nor the bench smoke ``scripts/test.sh`` runs beside the tests; the others wait. A
  readers-writer lock over two files (``flock``): the writer first closes a turnstile, so
  readers arriving meanwhile wait behind it.

Without xdist (``pytest tests/...``) none of this applies: one process runs the tests in
the order :func:`place` gives them, on the stack's own Airflow.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.background import COMMAND

#: The key that carries the lock's directory from the controller to its workers.
LOCK_DIR = "kafka_ingest_lock_dir"
#: The lock's directory, when something beside pytest uses the shared stack too.
LOCK_ENV = "KAFKA_INGEST_TEST_LOCK_DIR"
_LOCK_DIR = pytest.StashKey[str]()
_OWN_LOCK_DIR = pytest.StashKey[bool]()

#: What a test is (:func:`kind`); with -n also where it goes: the earlier, the longer its
#: unit of work (the soak's test, its work started at the session's start, first). Without
#: -n the order is the one the suite had: unit and integration tests first, then the soak's
#: test, then the DAG and fault tests.
BACKGROUND, AIRFLOW, OWN_STACKS, INTEGRATION, UNIT = range(5)


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def distributed(config: pytest.Config) -> bool:
    """The session runs on xdist workers (this process being one of them or the controller)."""
    return is_worker(config) or bool(getattr(config.option, "numprocesses", None))


def kind(item: pytest.Item) -> int:
    """Which of :data:`BACKGROUND` ... :data:`UNIT` the test is, by its module (one with
    :data:`~tests.support.background.COMMAND`), its directory and whether it uses the
    shared stack."""
    if getattr(getattr(item, "module", None), COMMAND, None):
        return BACKGROUND
    try:
        dirs = item.path.relative_to(item.config.rootpath).parts[:-1]
    except ValueError:  # a test outside the root directory
        dirs = item.path.parts[:-1]
    if "dags" in dirs:
        return AIRFLOW
    if "chaos" in dirs:
        return OWN_STACKS
    if "integration" in dirs or "stack_env" in getattr(item, "fixturenames", ()):
        return INTEGRATION
    return UNIT


def scope(nodeid: str) -> str:
    """The unit of work of a test (by its node id, as the controller sees it): its
    module."""
    return nodeid.split("::", 1)[0]


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``pytest_xdist_make_scheduler``: xdist's load-by-scope scheduling (a worker takes a
    whole unit of work, the next one when it is nearly done, in the session's order) over
    the units of :func:`scope`."""
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope(nodeid)

    return Scheduling(config, log)


#: How long each DAG test module takes on two busy cores (seconds, ``--durations``), for
#: the longest to go first; a module not named here goes after those that are.
DAG_MODULE_SECONDS = {
    "test_on_data_trigger.py": 146, "test_celery_executor.py": 128,
    "test_prometheus_and_page.py": 78, "test_ingest_dag.py": 75,
    "test_airflow_rest_and_ui.py": 67, "test_airflow_backfill.py": 61,
    "test_monitor_dag.py": 55, "test_dlq_replay_dag.py": 55, "test_page_access_fab.py": 39,
    "test_lineage_dag.py": 60, "test_complete_windows_dag.py": 60, "test_formats_dag.py": 38,
    "test_metrics.py": 30,
}


def order(items: list[pytest.Item], config: pytest.Config) -> None:
    """Sort the session in place (stably: each module keeps its own order). A module goes
    where its earliest test would (a module is one unit of work; split, its module-scoped
    fixtures would be made twice). Among the DAG tests, the modules on the shared Airflow
    services form one block (with xdist the first, the longest first: see the module's
    docstring; without, the last, as the suite always ran them)."""
    rank: dict[Any, tuple[int, int, float]] = {}
    for item in items:
        where = place(item, config)
        shared = int(kind(item) == AIRFLOW and "shared_airflow" in getattr(
            item, "fixturenames", ()))
        if distributed(config) and where == AIRFLOW:
            key = (where, 1 - shared, -DAG_MODULE_SECONDS.get(item.path.name, 0))
        else:
            key = (where, shared, 0)
        rank[item.path] = min(rank.get(item.path, key), key)
    items.sort(key=lambda item: rank[item.path])


def place(item: pytest.Item, config: pytest.Config) -> int:
    """The test's rank: with xdist, its :func:`kind`; without, the order the suite had (the
    unit and integration tests, the soak's test, the DAG and fault tests)."""
    where = kind(item)
    if distributed(config):
        return where
    return {UNIT: 0, INTEGRATION: 0, BACKGROUND: 1}.get(where, 2)


# --------------------------------------------------------------------------- Airflow

#: A worker's ports: the stack's (or those the environment gives) plus this, plus the
#: worker's number: outside the range of the ephemeral ports that ``free_ports`` hands out.
PORT_OFFSET = 100


def configure_worker(config: pytest.Config) -> None:
    """A worker (not the controller, nor the one process without xdist) uses an Airflow
    instance of its own, named after it (``gw0``), on ports of its own."""
    if not is_worker(config):
        return
    from kafka_ingest_dev import stack

    worker = str(config.workerinput["workerid"])  # type: ignore[attr-defined]
    number = int(worker.removeprefix("gw") or 0)
    own = stack.settings()
    os.environ.update({
        stack.INSTANCE_VARIABLE: worker,
        "KAFKA_INGEST_AIRFLOW_PORT": str(own.airflow_port + PORT_OFFSET + number),
        "KAFKA_INGEST_REDIS_PORT": str(own.airflow.redis_port + PORT_OFFSET + number)})


def stop_worker_airflow(config: pytest.Config) -> None:
    """The worker ends: its Airflow's services, if a test left them running, stop too
    (those this process started: a session of a test's own, on workers of the same names,
    leaves the outer worker's alone)."""
    if not is_worker(config):
        return
    from kafka_ingest_dev import stack
    from kafka_ingest_dev.procs import CHILDREN

    if any(pid in CHILDREN for pid in stack.settings().airflow.pids().values()):
        stack.stop_airflow(report=print)


# --------------------------------------------------------------------------- the lock


def configure_controller(config: pytest.Config) -> None:
    """The controller (or the one process, without xdist) finds the lock's directory:
    ``$KAFKA_INGEST_TEST_LOCK_DIR`` (``scripts/test.sh`` makes it, and the bench smoke
    beside the tests holds the lock shared too), else, with xdist, one of its own (removed
    by :func:`unconfigure`). Without either, a single process needs no lock."""
    if is_worker(config):
        return
    given = os.environ.get(LOCK_ENV)
    if given:
        config.stash[_LOCK_DIR] = given
    elif distributed(config):
        config.stash[_LOCK_DIR] = tempfile.mkdtemp(prefix="kafka-ingest-tests-")
        config.stash[_OWN_LOCK_DIR] = True


def configure_node(node: Any) -> None:
    """``pytest_configure_node``: each worker learns where the lock is."""
    node.workerinput[LOCK_DIR] = node.config.stash.get(_LOCK_DIR, None)


def unconfigure(config: pytest.Config) -> None:
    if config.stash.get(_OWN_LOCK_DIR, False):
        shutil.rmtree(config.stash[_LOCK_DIR], ignore_errors=True)


def _lock_dir(config: pytest.Config) -> str | None:
    if is_worker(config):
        found = config.workerinput.get(LOCK_DIR)  # type: ignore[attr-defined]
        return str(found) if found else None
    return config.stash.get(_LOCK_DIR, None)


def _flock(path: Path, operation: int) -> Any:
    fh = path.open("a")
    fcntl.flock(fh, operation)
    return fh


@contextlib.contextmanager
def holding_the_stack(item: pytest.Item) -> Iterator[None]:
    """For the test's whole run (its fixtures' set-up and tear-down too): the stack alone if
    it is ``exclusive``, else shared with whatever else uses it; nothing for a test that
    does not use the shared stack (``stack_env``), or where there is no lock."""
    directory = _lock_dir(item.config)
    exclusive = item.get_closest_marker("exclusive") is not None
    if directory is None or not (exclusive or "stack_env" in getattr(item, "fixturenames", ())):
        yield
        return
    turnstile, lock = Path(directory, "turnstile"), Path(directory, "stack")
    if exclusive:
        with _flock(turnstile, fcntl.LOCK_EX), _flock(lock, fcntl.LOCK_EX):
            yield
        return
    with _flock(turnstile, fcntl.LOCK_SH):  # waits while an exclusive test is waiting
        pass
    with _flock(lock, fcntl.LOCK_SH):
        yield
