"""Every DAG file imports cleanly, and every DAG has what operating it needs.

Parsing DAG files needs no service (nothing at module level touches a connection, a
Variable or the network): the DagBag is loaded with Airflow pointed at an empty home.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import ROOT


@functools.cache
def dag_bag() -> Any:
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(ROOT / "dags"))


@pytest.fixture(scope="module")
def bag(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    home = tmp_path_factory.mktemp("airflow-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRFLOW_HOME", str(home))
        patch.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
        patch.setenv("AIRFLOW__CORE__PLUGINS_FOLDER", str(ROOT / "plugins"))
        yield dag_bag()


def test_no_import_errors(bag: Any) -> None:
    assert bag.import_errors == {}


def test_one_ingest_dag_per_pipeline(bag: Any) -> None:
    from kafka_ingest.config import load_pipelines

    for name in load_pipelines():
        assert f"{name}_ingest" in bag.dags


@pytest.mark.parametrize("attr", ["tags", "owner", "retries", "execution_timeout"])
def test_dags_are_operable(bag: Any, attr: str) -> None:
    for dag_id, dag in bag.dags.items():
        if attr == "tags":
            assert "kafka-ingest" in dag.tags, dag_id
        for t in dag.tasks:
            if attr == "owner":
                assert t.owner and t.owner != "airflow", (dag_id, t.task_id)
            if attr == "retries":
                assert t.retries >= 1, (dag_id, t.task_id)
                assert t.retry_exponential_backoff, (dag_id, t.task_id)
            if attr == "execution_timeout":
                assert t.execution_timeout is not None, (dag_id, t.task_id)


def test_ingest_dags_run_one_at_a_time_with_a_trigger_form(bag: Any) -> None:
    on_data = 0
    for dag_id, dag in bag.dags.items():
        if not dag_id.endswith("_ingest"):
            continue
        # on_data: the next run starts while the last one's report runs (its slices done)
        event_driven = type(dag.timetable).__name__ == "AssetOrTimeSchedule"
        on_data += event_driven
        assert dag.max_active_runs == (2 if event_driven else 1), dag_id
        assert dag.catchup is False
        params = dag.params.dump()
        assert {"partitions", "from", "to"} <= set(params)
        for name in ("partitions", "from", "to"):
            param = dag.params.get_param(name)
            assert param.description and param.schema.get("title"), (dag_id, name)
        assert not dag.get_task("report").outlets
        outlets = [o.uri for o in dag.get_task("table_updated").outlets]
        assert outlets and outlets[0].startswith("postgres://")
    assert on_data, "no shipped pipeline runs on_data"


def test_trigger_forms_mark_nothing_required(bag: Any) -> None:
    """Every field of the generated forms may be left empty (a cleared editor included):
    optional fields are nullable, the one flag has a default, and empty is valid."""
    for dag_id, dag in bag.dags.items():
        for name in dag.params:
            param = dag.params.get_param(name)
            types = param.schema.get("type")
            if types == "boolean":
                assert param.value is False, (dag_id, name)
                continue
            assert isinstance(types, list) and "null" in types, (dag_id, name, types)
            assert param.resolve(None) is None, (dag_id, name)  # a cleared field is valid
            assert param.schema.get("title") and param.description, (dag_id, name)


def test_slices_take_the_pipelines_pool_and_parallelism(bag: Any) -> None:
    """The mapped slices (ingest, replay) run in the pipeline's pool, at most
    ``max_parallel_partitions`` of one run at once; nothing else is bounded by them."""
    from kafka_ingest.config import load_pipelines

    for name, pipeline in load_pipelines().items():
        for dag_id, task_id in ((f"{name}_ingest", "ingest"), (f"{name}_dlq_replay", "replay")):
            dag = bag.dags[dag_id]
            slices = dag.get_task(task_id)
            assert slices.pool == (pipeline.pool or "default_pool"), dag_id
            assert slices.max_active_tis_per_dagrun == pipeline.max_parallel_partitions, dag_id
            others = [t for t in dag.tasks if t.task_id != task_id]
            assert all(t.max_active_tis_per_dagrun is None for t in others), dag_id
