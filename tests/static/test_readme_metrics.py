"""The metric table of docs/operations.md (the metrics reference) lists every metric the
metrics serve, with its type and labels, and no metric that is not served."""

from __future__ import annotations

import re

from kafka_ingest.ops.metrics import describe
from tests.support import ROOT

OPERATIONS = ROOT / "docs" / "operations.md"


def test_the_docs_list_every_metric_with_its_type_and_labels() -> None:
    table = {m[1]: (m[2], m[3]) for m in re.finditer(
        r"^\| `(kafka_ingest_[a-z_]+)` \| (gauge|counter) \| ([^|]*) \|", OPERATIONS.read_text(),
        re.MULTILINE)}
    served = {m["name"]: (m["type"], m["labels"].replace(",", ", ") or "&ndash;")
              for m in describe()}
    assert {name: (kind, labels.strip()) for name, (kind, labels) in table.items()} == served
