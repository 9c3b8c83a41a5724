"""The session's own fixtures (``tests/conftest.py``), where what they give is a choice
a test could trip on."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka.admin import ConfigResource

pytestmark = pytest.mark.integration


def test_the_test_topics_keep_records_stamped_long_ago(topics: Any, clients: Any) -> None:
    """Tests produce records stamped at fixed past times: a test topic has no retention by
    time (the broker's default of 7 days, checked every 5 minutes, deleted such records
    between a test's produce and its read: a test failed with ``OffsetGapError``)."""
    topic = topics(1, "old")
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    admin = clients.admin()  # kept while its answer comes
    [future] = admin.describe_configs([resource]).values()
    assert future.result(30)["retention.ms"].value == "-1"
