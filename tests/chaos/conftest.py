"""The fault tests' two sets: the quick one runs in the normal suite (marker ``faults``);
the slow one (marker ``faults_full``: 2 s latency, the default time-outs waited out,
more places and more brokers) only when asked for, with ``KAFKA_INGEST_FAULTS_FULL=1``
or a ``-m`` expression that names ``faults_full``."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    asked = (os.environ.get("KAFKA_INGEST_FAULTS_FULL") == "1"
             or "faults_full" in (config.getoption("markexpr", default="") or ""))
    if asked:
        return
    skip = pytest.mark.skip(reason="slow fault test: KAFKA_INGEST_FAULTS_FULL=1 or "
                                   "-m faults_full runs it")
    for item in items:
        if item.get_closest_marker("faults_full") is not None:
            item.add_marker(skip)
