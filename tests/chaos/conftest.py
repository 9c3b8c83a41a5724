"""The fault tests' two sets: the quick one runs in the normal suite (marker ``faults``);
the slow one (marker ``faults_full``: 2 s latency, the default time-outs waited out,
more places and more brokers, and the soak's short variant) only when asked for, with
``KAFKA_INGEST_FAULTS_FULL=1`` or a ``-m`` expression that names ``faults_full`` or ``soak``
(``make faults-full``; ``make soak-short`` or ``pytest -m soak`` for the soak's alone).

A slow test is skipped, with the reason, except one whose module has background work
(:mod:`tests.support.background`: the soak): that one is deselected, since a selected
module's work starts with the session, before any test is skipped."""

from __future__ import annotations

import os

import pytest

from tests.support import background
from tests.support.faults import slow_tests_asked


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if slow_tests_asked(config.getoption("markexpr", default="") or "", os.environ):
        return
    skip = pytest.mark.skip(reason="slow fault test: KAFKA_INGEST_FAULTS_FULL=1 or "
                                   "-m faults_full runs it")
    deselected = []
    for item in items:
        if item.get_closest_marker("faults_full") is None:
            continue
        if hasattr(getattr(item, "module", None), background.COMMAND):
            deselected.append(item)
        else:
            item.add_marker(skip)
    if deselected:
        items[:] = [item for item in items if item not in deselected]
        config.hook.pytest_deselected(items=deselected)
