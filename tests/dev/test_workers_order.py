"""The session's order and units of work on xdist workers (``tests/support/workers.py``):
every module a unit of its own; the soak's test first (its work started at the session's
start), then the DAG test modules, those on the shared Airflow services as one block first,
each block the longest first, then the rest; without xdist, the order the suite always had
(the DAG tests on the shared services last).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.support import workers

ROOT = Path("/repo")


def _item(path: str, config: Any, *, shared: bool = False, stack: bool = False,
          soak: bool = False) -> Any:
    """What ``order`` reads of a collected test."""
    fixtures = ["shared_airflow"] * shared + ["stack_env"] * (stack or shared)
    return SimpleNamespace(path=ROOT / path, config=config, fixturenames=fixtures,
                           module=SimpleNamespace(background_command=soak or None))


def _session(config: Any) -> list[Any]:
    return [
        _item("tests/unit/test_config.py", config),
        _item("tests/dags/test_lineage_dag.py", config, stack=True),
        _item("tests/dags/test_airflow_backfill.py", config, shared=True),
        _item("tests/integration/test_load.py", config, stack=True),
        _item("tests/dags/test_celery_executor.py", config, stack=True),
        _item("tests/dags/test_new_and_unmeasured.py", config, stack=True),
        _item("tests/dags/test_on_data_trigger.py", config, shared=True),
        _item("tests/chaos/test_soak.py", config, soak=True),
        _item("tests/chaos/test_failover.py", config, stack=True),
        _item("tests/dags/test_prometheus_and_page.py", config, shared=True),
    ]


def _names(items: list[Any]) -> list[str]:
    return [item.path.name for item in items]


def test_with_xdist_the_soak_first_then_the_shared_services_dag_modules_longest_first() -> None:
    config = SimpleNamespace(rootpath=ROOT, option=SimpleNamespace(numprocesses=2))
    items = _session(config)
    workers.order(items, config)
    assert _names(items) == [
        "test_soak.py",
        "test_on_data_trigger.py", "test_prometheus_and_page.py", "test_airflow_backfill.py",
        "test_celery_executor.py", "test_lineage_dag.py", "test_new_and_unmeasured.py",
        "test_failover.py", "test_load.py", "test_config.py"]


def test_without_xdist_the_dag_tests_on_the_shared_services_run_last() -> None:
    config = SimpleNamespace(rootpath=ROOT, option=SimpleNamespace(numprocesses=None))
    items = _session(config)
    workers.order(items, config)
    assert _names(items) == [
        "test_config.py", "test_load.py", "test_soak.py",
        "test_lineage_dag.py", "test_celery_executor.py", "test_new_and_unmeasured.py",
        "test_failover.py",
        "test_airflow_backfill.py", "test_on_data_trigger.py", "test_prometheus_and_page.py"]


def test_each_module_is_a_unit_of_work_of_its_own() -> None:
    assert workers.scope("tests/dags/test_ingest_dag.py::test_a[x]") == \
        "tests/dags/test_ingest_dag.py"
    assert workers.scope("tests/dags/test_metrics.py::test_b") == "tests/dags/test_metrics.py"
    assert workers.scope("tests/unit/test_config.py::T::test_c") == "tests/unit/test_config.py"
