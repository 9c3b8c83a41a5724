"""Removing the topics a test made."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any


def delete_topics(clients: Any, names: Iterable[str], *, timeout_s: float = 30.0) -> None:
    """Delete ``names`` after the tests that made them: best effort, as cleanup is (a topic
    left behind is harmless: each test names its own), so neither the broker's refusal nor
    an answer later than ``timeout_s`` fails the test that was cleaning up."""
    names = list(names)
    if not names:
        return
    for future in clients.admin().delete_topics(names, operation_timeout=timeout_s).values():
        with contextlib.suppress(Exception):  # TimeoutError included
            future.result(timeout_s)
