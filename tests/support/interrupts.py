"""Airflow's ``execution_timeout`` as the tests raise it: ``AirflowTaskTimeout`` comes from a
SIGALRM handler, in the main thread, wherever that thread is at the time."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class TaskTimeout(Exception):
    """What Airflow's ``execution_timeout`` raises (``AirflowTaskTimeout``)."""


def _raise(_signum: int, _frame: Any) -> None:
    raise TaskTimeout("Timeout, PID: 1")


@contextmanager
def task_timeout_on_sigalrm() -> Iterator[None]:
    """SIGALRM raises :class:`TaskTimeout` in the main thread for the block (sent by a
    timer, or by another thread with ``signal.pthread_kill``); the old handler after."""
    previous = signal.signal(signal.SIGALRM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def task_timeout_after(seconds: float) -> Iterator[None]:
    """:class:`TaskTimeout` in the main thread ``seconds`` into the block."""
    with task_timeout_on_sigalrm():
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
