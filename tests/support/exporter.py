"""``kafka-ingest exporter`` run as a user runs it, for a test."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from kafka_ingest_dev.procs import free_ports


@contextlib.contextmanager
def running_exporter(env: dict[str, str], log_path: Path, *, cache_s: float = 0.5,
                     timeout_s: float = 2.0) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``kafka-ingest exporter`` on a free loopback port with ``env`` on top of this
    process's: its ``/metrics`` URL (once it answers) and the process, stopped after."""
    import httpx

    port = free_ports(1)[0]
    with log_path.open("w") as log:
        proc = subprocess.Popen(  # the console script's module: no PATH needed
            [sys.executable, "-m", "kafka_ingest.cli", "exporter", "--port", str(port),
             "--cache", str(cache_s), "--timeout", str(timeout_s)],
            env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, text=True)
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            deadline = time.monotonic() + 60  # an interpreter start and one look
            while True:
                try:
                    httpx.get(url, timeout=10).raise_for_status()
                    break
                except httpx.HTTPError:
                    assert proc.poll() is None, log_path.read_text()
                    assert time.monotonic() < deadline, "the exporter did not answer in 60 s"
                    time.sleep(0.2)
            yield url, proc
        finally:
            proc.terminate()
            proc.wait(timeout=30)
