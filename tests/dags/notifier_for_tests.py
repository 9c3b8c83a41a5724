"""A tiny Airflow notifier for the monitor DAG's test, importable by the DAG run's
subprocess (the test puts ``tests/dags`` on its ``PYTHONPATH``): it appends the context's
``message`` to the file named by ``KAFKA_INGEST_TEST_NOTIFIER_FILE``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from airflow.sdk import BaseNotifier

FILE_VARIABLE = "KAFKA_INGEST_TEST_NOTIFIER_FILE"


class FileNotifier(BaseNotifier):
    """``prefix`` is a templated field, to show the notifier's templates are rendered."""

    template_fields = ("prefix",)

    def __init__(self, prefix: str = "") -> None:
        super().__init__()
        self.prefix = prefix

    def notify(self, context: Any) -> None:
        with Path(os.environ[FILE_VARIABLE]).open("a", encoding="utf-8") as out:
            out.write(f"{self.prefix}{context['message']}\n")
