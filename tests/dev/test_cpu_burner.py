"""The test harness's CPU burner (``KAFKA_INGEST_TEST_BURN_CPU``, ``make test-busy``), in a
pytest of its own: it burns while the session runs and no burner outlives the session,
whether it ends, is interrupted (Ctrl-C) or is SIGKILLed (the kernel's parent-death signal).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support import ROOT

#: Records the session's burners (its children running the burner): how much CPU each has
#: used and its state, once each has used some and is seen running (polled, with a
#: deadline; past it, as they are); with HANG set, then waits to be interrupted or killed.
INNER = '''
import os, time
from pathlib import Path

import psutil


def test_records_the_burners():
    burners = [c for c in psutil.Process().children()
               if "PR_SET_PDEATHSIG" in " ".join(c.cmdline())]
    before = {c.pid: sum(c.cpu_times()[:2]) for c in burners}
    deadline = time.monotonic() + 60
    while True:
        used = {c.pid: sum(c.cpu_times()[:2]) - before[c.pid] for c in burners}
        states = {c.pid: c.status() for c in burners}
        burning = all(u > 0 and states[p] == psutil.STATUS_RUNNING for p, u in used.items())
        if burning or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    Path(os.environ["BURNERS_FILE"]).write_text(
        " ".join(f"{pid}:{u:.2f}:{states[pid]}" for pid, u in used.items()) + "\\n")
    if os.environ.get("HANG"):
        time.sleep(120)
'''


def _wait(what: str, check: Callable[[], Any], timeout_s: float = 30) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.1)
    return value


def _session(tmp_path: Path, burn: str, *, hang: bool = False) -> tuple[subprocess.Popen[bytes],
                                                                         Path]:
    """A pytest running INNER with the harness's hooks (``-p tests.conftest``)."""
    (tmp_path / "test_inner.py").write_text(INNER)
    # the inner session's own: not this session's burner, lock or xdist worker
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")
           and k not in ("KAFKA_INGEST_TEST_BURN_CPU", "KAFKA_INGEST_TEST_LOCK_DIR")}
    env.update(KAFKA_INGEST_TEST_BURN_CPU=burn, BURNERS_FILE=str(tmp_path / "burners"),
               HANG="1" if hang else "")
    inner = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        preexec_fn=_interruptible)  # noqa: PLW1509 - only a signal disposition, no lock
    return inner, tmp_path / "burners"


def _interruptible() -> None:
    """SIGINT as a terminal's foreground job has it: this suite may run as a background
    job (``make test &``, CI), which starts with SIGINT ignored, and a child inherits that;
    Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _recorded(path: Path) -> dict[int, tuple[float, str]]:
    """The inner session's burners: pid -> (CPU seconds used, process state)."""
    text = path.read_text() if path.is_file() else ""
    if not text.endswith("\n"):
        return {}
    return {int(pid): (float(used), state)
            for pid, used, state in (w.split(":") for w in text.split())}


def _is_burner(process: psutil.Process) -> bool:
    return "PR_SET_PDEATHSIG" in " ".join(process.cmdline())


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("end", [
    "finished",  # the session ends: pytest_unconfigure kills the burner
    "ctrl-c",    # interrupted: pytest still unconfigures
    "sigkill",   # pytest killed outright: only the kernel's parent-death signal is left
])
def test_the_burner_burns_and_never_outlives_the_session(tmp_path: Path, end: str) -> None:
    inner, path = _session(tmp_path, "1", hang=end != "finished")
    burners: dict[int, tuple[float, str]] = {}
    try:
        burners = _wait("the inner session's report", lambda: _recorded(path), 90)
        assert len(burners) == 1
        # it burns: it used CPU, and a busy loop is always running (or runnable), never
        # sleeping
        assert all(used > 0 and state == psutil.STATUS_RUNNING
                   for used, state in burners.values()), burners
        if end == "ctrl-c":
            inner.send_signal(signal.SIGINT)
        elif end == "sigkill":
            inner.kill()
        inner.wait(30)
        if end == "finished":
            assert inner.returncode == 0, inner.stdout.read() if inner.stdout else ""
        for pid in burners:
            _wait(f"burner {pid} to end", lambda p=pid: _gone(p), 10)
    finally:  # a failed check leaves no process behind either
        if inner.poll() is None:
            inner.kill()
            inner.wait(10)
        for pid in burners:
            with contextlib.suppress(psutil.NoSuchProcess):
                burner = psutil.Process(pid)
                if _is_burner(burner):  # still ours, not a reused pid
                    burner.kill()


def test_no_burner_unless_asked(tmp_path: Path) -> None:
    inner, path = _session(tmp_path, "")
    assert inner.wait(60) == 0, inner.stdout.read() if inner.stdout else ""
    assert path.read_text() == "\n"
