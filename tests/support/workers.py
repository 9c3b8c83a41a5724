"""How the session runs on two pytest-xdist workers.

The tests mostly wait (on Kafka, Postgres, Airflow, subprocesses), so two run at once
(``make test``: ``-n 2 --dist loadscope``, the scheduling below). What must not overlap is
kept apart here, by three means:

- **Units of work** (:func:`scope`, a scheduler of our own): the tests of one unit run on
  one worker, one after another. The DAG tests are one unit: they start and stop the
  stack's Airflow services and run DAGs against its one metadata database (a DAG id such
  as ``telemetry_metrics_ingest`` is the same in each). Every other module is a unit of
  its own, so its module-scoped fixtures (a stack of its own, a database, topics) are made
  once, on one worker (and the workers ask for work once a module, not once a test: a
  unit of work costs a round trip to the controller).
- **Order**: the groups that take longest go first (the soak, then the DAG tests and the
  fault tests with stacks of their own, then the integration modules), the unit tests'
  modules last: each worker takes the next unit of work when it is nearly done, so the
  short ones fill in at the end. ``--no-loadscope-reorder`` keeps this order.
- **A lock on the shared stack**: a test marked ``exclusive`` (it restarts the stack's
  Kafka or Postgres) runs while no other test that uses the stack (``stack_env``) runs,
  nor the bench smoke ``scripts/test.sh`` runs beside the tests; the others wait. A
  readers-writer lock over two files (``flock``): the writer first closes a turnstile, so
  readers arriving meanwhile wait behind it.

Without xdist (``pytest tests/...``) none of this applies: one process runs the tests in
the order :func:`place` gives them.
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

#: The key that carries the lock's directory from the controller to its workers.
LOCK_DIR = "kafka_ingest_lock_dir"
#: The lock's directory, when something beside pytest uses the shared stack too.
LOCK_ENV = "KAFKA_INGEST_TEST_LOCK_DIR"
_LOCK_DIR = pytest.StashKey[str]()
_OWN_LOCK_DIR = pytest.StashKey[bool]()

#: Where a test goes: the earlier, the longer its unit of work (with -n: one worker takes
#: a whole group). Without -n the order is the one the suite had: unit and integration
#: tests first, then the soak's test (which takes over the soak started beside them), then
#: the DAG and fault tests.
SOAK, AIRFLOW, OWN_STACKS, INTEGRATION, UNIT = range(5)


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def distributed(config: pytest.Config) -> bool:
    """The session runs on xdist workers (this process being one of them or the controller)."""
    return is_worker(config) or bool(getattr(config.option, "numprocesses", None))


def kind(item: pytest.Item) -> int:
    """Which of :data:`SOAK` ... :data:`UNIT` the test is, by its directory and whether it
    uses the shared stack."""
    if getattr(getattr(item, "module", None), "start_in_background", None):
        return SOAK
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
    """The unit of work of a test (by its node id, as the controller sees it): the DAG
    tests' one, else its module."""
    path = nodeid.split("::", 1)[0]
    return "tests/dags" if path.startswith("tests/dags/") else path


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``pytest_xdist_make_scheduler``: xdist's load-by-scope scheduling (a worker takes a
    whole unit of work, the next one when it is nearly done, in the session's order) over
    the units of :func:`scope`."""
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope(nodeid)

    return Scheduling(config, log)


def order(items: list[pytest.Item], config: pytest.Config) -> None:
    """Sort the session in place (stably: each module keeps its own order). A module goes
    where its earliest test would (a module is one unit of work; split, its module-scoped
    fixtures would be made twice). Among the DAG tests, those on the shared Airflow
    services come last: the others run DAGs with ``airflow dags test`` against the same
    metadata database, or start services of their own, and do so before the shared ones
    start (``tests/dags/conftest.py``)."""
    rank: dict[Any, int] = {}
    for item in items:
        rank[item.path] = min(rank.get(item.path, UNIT), place(item, config))
    items.sort(key=lambda item: (rank[item.path], int(
        kind(item) == AIRFLOW and "shared_airflow" in getattr(item, "fixturenames", ()))))


def place(item: pytest.Item, config: pytest.Config) -> int:
    """The test's rank: with xdist, its :func:`kind`; without, the order the suite had (the
    unit and integration tests, the soak's test, the DAG and fault tests)."""
    where = kind(item)
    if distributed(config):
        return where
    return {UNIT: 0, INTEGRATION: 0, SOAK: 1}.get(where, 2)


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
