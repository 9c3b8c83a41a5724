"""The ``kafka-ingest`` command line as the tests run it: a subprocess of this Python with
the given environment over this process's."""

from __future__ import annotations

import os
import subprocess
import sys


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``kafka-ingest *args`` with ``env`` over this process's environment: its output
    captured, its exit status not checked."""
    return subprocess.run([sys.executable, "-m", "kafka_ingest.cli", *args],
                          env={**os.environ, **env}, capture_output=True, text=True,
                          check=False, timeout=300)
