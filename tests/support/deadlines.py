"""How long a DAG test may wait for Airflow: the deadline of each wait derived from what
Airflow is configured to do (the settings the stack's services run with, the DAG's
``default_args``), plus a margin for the work itself, instead of a fixed guess.

Measured on 2 cores, idle or with one kept busy by a CPU burner (``make test-busy``): a
Celery worker SIGKILLed mid-slice costs 37-46 s from the kill to the run's end, nearly all
of it Airflow's own timers: 20-22 s until the scheduler fails the silent try (heartbeat
time-out plus its detection interval), 10-19 s of retry delay, under 0.1 s to hand the
retry to the other worker, 1-4 s for the retried slice, 2-7 s for ``report`` and
``table_updated``. A deadline below what the timers add up to fails a healthy run; one
above it only makes a real hang slower to report.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from kafka_ingest.config import Pipeline, airflow_pools

#: What a run needs beyond Airflow's timers: the scheduler's loops, the Celery hand-off,
#: each task's start (fork, DAG file parse), the supervisor noticing a task's exit (up to
#: ``[workers] min_heartbeat_interval``, 5 s, holding the worker's slot meanwhile), the
#: run's small tasks (``plan``, ``report``, ``table_updated``: a second each) and the REST
#: polls. About 10 s per run with one core busy; six times that.
MARGIN_S = 60.0

#: The tasks of an ingest or replay run besides its slices, one after another on the run's
#: path: ``plan`` before them, ``report`` and ``table_updated`` after them.
AROUND = 3


def setting(settings: Mapping[str, str], section: str, key: str) -> float:
    """A numeric Airflow setting as the services run with it: their environment
    (``AIRFLOW__SECTION__KEY``), else Airflow's own configuration (airflow.cfg, defaults)."""
    raw = settings.get(f"AIRFLOW__{section.upper()}__{key.upper()}")
    if raw is not None:
        return float(raw)
    from airflow.configuration import conf

    return conf.getfloat(section, key)


def retry_delay_s(default_args: Mapping[str, Any], retry: int) -> float:
    """The longest Airflow waits before retry number ``retry`` (1: after the first try).

    With an exponential back-off Airflow waits ``retry_delay x backoff^(retry-1)`` plus a
    jitter of up to as much again (a hash of the try), never more than ``max_retry_delay``
    (``TaskInstance.next_retry_datetime``); without one, ``retry_delay``.
    """
    delay = default_args["retry_delay"].total_seconds()
    backoff = float(default_args.get("retry_exponential_backoff") or 1.0)
    if backoff > 0 and backoff != 1.0:
        delay = 2 * math.ceil(delay * backoff ** (retry - 1))
    cap = default_args.get("max_retry_delay")
    return min(delay, cap.total_seconds()) if cap else delay


def run_deadline_s(pipeline: Pipeline, settings: Mapping[str, str], *, slices: int,
                   runs: int = 1, from_kill: bool = False) -> float:
    """How long ``runs`` runs (one after another) of one of ``pipeline``'s DAGs with
    ``slices`` partition slices may take, by what Airflow is configured to do; with
    ``from_kill``, counted from the SIGKILL of the slices' first tries.

    ::

        deadline = runs x (first + (waves - 1) x slice + AROUND x slice + MARGIN_S)
        slice    = execution_timeout                    a try ends by then, whatever it does
                 + sum for n = 1..retries of            each retry Airflow allows
                     (retry_delay_n + execution_timeout)  waits out its delay, then ends too
        first    = slice; from_kill: the longer of
                   - slice with the first execution_timeout replaced by heartbeat_timeout
                     + detection_interval (a killed try goes silent and the scheduler fails
                     it that long after its last heartbeat, at the latest), and
                   - task_queued_timeout + its check interval + slice (a slice whose Celery
                     message the killed worker had reserved, not started: it stays queued
                     until the scheduler requeues it)
        retry_delay_n = min(max_retry_delay, 2 x retry_delay x backoff^(n-1))
        waves    = ceil(slices / min(max_active_tis_per_dagrun, pool size, parallelism))
        AROUND   = 3                                    plan before the slices, report and
                                                        table_updated after them: each has
                                                        the same default_args (time-out,
                                                        retries) as a slice

    ``execution_timeout`` and the retries come from the DAG's ``default_args``
    (:func:`kafka_ingest_tasks.dag_default_args`), so DAG tests give their pipelines a
    short ``task_timeout_minutes``. The Celery test's kill (20 s heartbeat time-out checked
    every 2 s, retries 2, 10 s delay doubling, 1 min time-out, a queued task requeued after
    30 s checked every 5): max(22 + (20 + 60) + (40 + 60), 30 + 5 + 60 + (20 + 60) +
    (40 + 60)) + 3 x (60 + (20 + 60) + (40 + 60)) + 60 = 1,055 s. Only a broken run waits
    that long; a healthy one ends when it ends.
    """
    from kafka_ingest_tasks import dag_default_args, slice_task_args

    args = dag_default_args(pipeline)
    timeout = args["execution_timeout"].total_seconds()
    retries = sum(retry_delay_s(args, n) + timeout for n in range(1, args["retries"] + 1))
    slice_s = timeout + retries
    first = slice_s
    if from_kill:
        silent = retries + setting(settings, "scheduler", "task_instance_heartbeat_timeout") \
            + setting(settings, "scheduler", "task_instance_heartbeat_timeout_detection_interval")
        lost = setting(settings, "scheduler", "task_queued_timeout") \
            + setting(settings, "scheduler", "task_queued_timeout_check_interval") + slice_s
        first = max(silent, lost)
    task = slice_task_args(pipeline)
    at_once = min(task["max_active_tis_per_dagrun"],
                  airflow_pools({pipeline.name: pipeline}).get(task["pool"], slices),
                  setting(settings, "core", "parallelism"))
    waves = math.ceil(slices / at_once)
    return runs * (first + (waves - 1) * slice_s + AROUND * slice_s + MARGIN_S)


def parse_deadline_s(settings: Mapping[str, str]) -> float:
    """How long the dag-processor may take to show the DAGs of a DAG file that is there
    when it starts (or appears later)::

        deadline = refresh_interval            the bundle is listed again this often
                 + dag_file_processor_timeout  a parse ends by then, done or killed
                 + MARGIN_S
    """
    return (setting(settings, "dag_processor", "refresh_interval")
            + setting(settings, "dag_processor", "dag_file_processor_timeout") + MARGIN_S)
