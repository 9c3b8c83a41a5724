"""The session's background start (``tests/conftest.py``, used by the soak's test): a
selected module's ``start_in_background()`` is called when the session is collected, its
tests run after the unit and integration tests, ``-k`` that deselects them starts nothing,
and ``stop_background()`` runs when the session ends, also on Ctrl-C. Each case is a pytest
of its own with the harness's hooks, over a module whose background work is a sleeping
process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.support import ROOT

#: A module that starts a sleeping process in the background and writes its pid down;
#: its test records that it ran; with HANG, it waits to be interrupted.
BACKGROUND = '''
import os, subprocess, sys, time
from pathlib import Path

OUT = Path(os.environ["OUT"])
_procs = []


def start_in_background():
    _procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]))
    (OUT / "pid").write_text(str(_procs[-1].pid))


def stop_background():
    while _procs:
        proc = _procs.pop()
        proc.kill()
        proc.wait(10)
    (OUT / "stopped").write_text("1")


def test_background_work():
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:  # with xdist, the test starts it, as the soak's does
        assert not _procs, "nothing started at collection"
        start_in_background()
    assert _procs, "started before this test"
    with (OUT / "order").open("a") as f:
        f.write(f"background {worker or ''}\\n")
    if os.environ.get("HANG"):
        time.sleep(120)
'''
FIRST = '''
import os
from pathlib import Path


def test_first():
    with (Path(os.environ["OUT"]) / "order").open("a") as f:
        f.write(f"unit {os.environ.get('PYTEST_XDIST_WORKER', '')}\\n")


def test_second():
    test_first()
'''


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as tests/dev/test_cpu_burner.py says


def _session(tmp_path: Path, *args: str, hang: bool = False) -> subprocess.Popen[bytes]:
    (tmp_path / "chaos").mkdir()
    (tmp_path / "unit").mkdir()
    (tmp_path / "chaos" / "test_background.py").write_text(BACKGROUND)
    (tmp_path / "unit" / "test_first.py").write_text(FIRST)
    (tmp_path / "unit" / "test_more.py").write_text(FIRST)  # with -n 2: three units of work
    # the inner session's own: not this session's burner, lock or xdist worker
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")
           and k not in ("KAFKA_INGEST_TEST_BURN_CPU", "KAFKA_INGEST_TEST_LOCK_DIR")}
    env.update(OUT=str(tmp_path), HANG="1" if hang else "")
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "--rootdir", str(tmp_path), "--import-mode=importlib", *args,
         str(tmp_path / "chaos"), str(tmp_path / "unit")],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        preexec_fn=_interruptible)  # noqa: PLW1509 - only a signal disposition, no lock


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_started_at_collection_run_after_the_unit_tests_and_stopped_at_the_end(
        tmp_path: Path) -> None:
    inner = _session(tmp_path)
    out = inner.communicate(timeout=120)[0].decode()
    assert inner.returncode == 0, out
    # collected first (chaos/ before unit/), run after the unit tests
    assert (tmp_path / "order").read_text().split() == ["unit"] * 4 + ["background"]
    assert (tmp_path / "stopped").read_text() == "1"
    assert _gone(int((tmp_path / "pid").read_text()))


def test_deselected_by_k_nothing_starts(tmp_path: Path) -> None:
    inner = _session(tmp_path, "-k", "not background")
    out = inner.communicate(timeout=120)[0].decode()
    assert inner.returncode == 0, out
    assert (tmp_path / "order").read_text().split() == ["unit"] * 4
    assert not (tmp_path / "pid").exists()


def test_with_two_workers_it_runs_first_in_the_foreground_on_a_worker_of_its_own(
        tmp_path: Path) -> None:
    # tests/support/workers.py: the soak's group first, the unit tests' modules after it
    inner = _session(tmp_path, "-n", "2", "--dist", "loadscope", "--no-loadscope-reorder")
    out = inner.communicate(timeout=180)[0].decode()
    assert inner.returncode == 0, out
    ran = [line.split() for line in (tmp_path / "order").read_text().splitlines()]
    (background,) = [worker for name, worker in ran if name == "background"]
    assert next(name for name, worker in ran if worker == background) == "background"
    assert (tmp_path / "stopped").read_text() == "1"
    assert _gone(int((tmp_path / "pid").read_text()))


def test_interrupted_the_background_work_is_stopped(tmp_path: Path) -> None:
    inner = _session(tmp_path, hang=True)
    try:
        deadline = time.monotonic() + 60
        while "background" not in ((tmp_path / "order").read_text()
                                   if (tmp_path / "order").exists() else ""):
            assert time.monotonic() < deadline, "the background test never ran"
            time.sleep(0.1)
        pid = int((tmp_path / "pid").read_text())
        assert not _gone(pid)  # still running while its test runs
        inner.send_signal(signal.SIGINT)
        inner.communicate(timeout=60)
        assert (tmp_path / "stopped").read_text() == "1"
        assert _gone(pid)
    finally:
        if inner.poll() is None:
            inner.kill()
            inner.wait(10)
