"""Run a DAG scheduled on an Asset against given Asset events, as ``airflow dags test``
runs a DAG: ``python -m tests.support.asset_run <dag_id> <asset event id>...`` (the
stack's Airflow environment; the DAGs folder the environment names).

``dag.test()`` makes a manual run, which consumed no Asset event. The scheduler links the
events an Asset-triggered run consumes to it (``DagRun.consumed_asset_events``), and a task
sees them as ``triggering_asset_events``; here the run ``dag.test()`` creates gets them the
same way, before its first task runs, so the DAG's tasks run as they would for those
events, without a scheduler (the stack's would run every unpaused DAG of the metadata
database with the main checkout's code).
"""

from __future__ import annotations

import os
import sys
from typing import Any
from unittest import mock


def main(dag_id: str, event_ids: list[int]) -> int:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models import dagrun
    from airflow.models.asset import AssetEvent
    from sqlalchemy import select

    create = dagrun.get_or_create_dagrun

    def with_events(**kwargs: Any) -> Any:
        run = create(**kwargs)
        session = kwargs["session"]
        events = session.scalars(select(AssetEvent).where(AssetEvent.id.in_(event_ids))).all()
        if len(events) != len(event_ids):
            raise SystemExit(f"asset events {event_ids}: found {[e.id for e in events]}")
        run.consumed_asset_events.extend(events)
        session.commit()
        return run

    dag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"]).get_dag(dag_id)
    if dag is None:
        raise SystemExit(f"no DAG {dag_id}")
    with mock.patch.object(dagrun, "get_or_create_dagrun", with_events):
        run = dag.test()
    print(f"DAG run {run.run_id}: {run.state}")
    return 0 if str(run.state) == "success" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], [int(a) for a in sys.argv[2:]]))
