"""Removing the topics a test made."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from typing import Any


def delete_topics(clients: Any, names: Iterable[str], *, timeout_s: float = 10.0) -> None:
    """Delete ``names`` after the tests that made them: best effort, as cleanup is (a topic
    left behind is harmless: each test names its own). The deletion is asked for without
    waiting on its spread through the cluster, and the answers are waited for
    ``timeout_s`` in all, not per topic: a broker that has not answered by then fails no
    test (teardowns waited 30 s per topic for answers that did not come, twice a minute
    in one clean-clone run)."""
    names = list(names)
    if not names:
        return
    deadline = time.monotonic() + timeout_s
    for future in clients.admin().delete_topics(names, operation_timeout=0).values():
        with contextlib.suppress(Exception):  # TimeoutError included
            future.result(max(0.0, deadline - time.monotonic()))
