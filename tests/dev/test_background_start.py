"""The session's background work (``tests/support/background.py``, used by the soak's
test): a selected module's ``background_command`` is started as the session begins (by the
controller with xdist), its test takes it over (after the unit tests; with xdist first, on a
worker of its own), ``-k`` that deselects it
starts nothing, and what still runs when the session ends is stopped, also on Ctrl-C. Each
case is a pytest of its own with the harness's hooks, over a module whose background work
is a sleeping process; and a background process's end, or overrun, as its test sees it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support import ROOT, background

#: A module whose background work is a sleeping process; its test records that it ran
#: and the process's pid; with HANG, it waits to be interrupted.
BACKGROUND = '''
import os, sys, time
from pathlib import Path

from tests.support import background

OUT = Path(os.environ["OUT"])


def background_command(directory):
    return [sys.executable, "-c", "import time; time.sleep(600)"]


def test_background_work():
    run = background.taken_over(__file__)
    (OUT / "pid").write_text(str(run.pid))
    with (OUT / "order").open("a") as f:
        f.write(f"background {os.environ.get('PYTEST_XDIST_WORKER', '-')}\\n")
    if os.environ.get("HANG"):
        time.sleep(120)
'''
#: Tests that record their worker and whether the background work was started before them
#: (a module without background work, though its text names the function in a string).
FIRST = '''
import os
from pathlib import Path

TEMPLATE = """
def background_command(directory):
    return []
"""


def test_first():
    started = Path(os.environ["KAFKA_INGEST_TEST_BACKGROUND_DIR"], "test_background").is_dir()
    with (Path(os.environ["OUT"]) / "order").open("a") as f:
        f.write(f"unit {os.environ.get('PYTEST_XDIST_WORKER', '-')} {started}\\n")


def test_second():
    test_first()
'''


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as tests/dev/test_cpu_burner.py says


def _session(tmp_path: Path, *args: str, hang: bool = False, slow: bool = False,
             env_extra: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``slow``: the background work's test is a slow fault test (marked ``faults_full``,
    under the chaos tests' conftest), as the soak's is."""
    (tmp_path / "chaos").mkdir()
    (tmp_path / "unit").mkdir()
    (tmp_path / "chaos" / "test_background.py").write_text(
        ("import pytest\npytestmark = pytest.mark.faults_full\n" if slow else "") + BACKGROUND)
    if slow:
        (tmp_path / "chaos" / "conftest.py").write_text(
            "from tests.chaos.conftest import pytest_collection_modifyitems  # noqa: F401\n")
    (tmp_path / "unit" / "test_first.py").write_text(FIRST)
    (tmp_path / "unit" / "test_more.py").write_text(FIRST)  # with -n 2: three units of work
    # the inner session's own: not this session's burner, lock or xdist worker
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")
           and k not in ("KAFKA_INGEST_TEST_BURN_CPU", "KAFKA_INGEST_TEST_LOCK_DIR",
                         "KAFKA_INGEST_FAULTS_FULL", background.ROOT_ENV)}
    env.update(OUT=str(tmp_path), HANG="1" if hang else "", **(env_extra or {}))
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


def _lines(tmp_path: Path) -> list[list[str]]:
    return [line.split() for line in (tmp_path / "order").read_text().splitlines()]


def test_started_at_collection_taken_over_after_the_unit_tests_and_stopped_at_the_end(
        tmp_path: Path) -> None:
    inner = _session(tmp_path)
    out = inner.communicate(timeout=120)[0].decode()
    assert inner.returncode == 0, out
    # collected first (chaos/ before unit/), started before them, its test after them
    assert _lines(tmp_path) == [["unit", "-", "True"]] * 4 + [["background", "-"]]
    assert _gone(int((tmp_path / "pid").read_text()))


def test_deselected_by_k_nothing_starts(tmp_path: Path) -> None:
    inner = _session(tmp_path, "-k", "not background")
    out = inner.communicate(timeout=120)[0].decode()
    assert inner.returncode == 0, out
    assert _lines(tmp_path) == [["unit", "-", "False"]] * 4
    assert not (tmp_path / "pid").exists()


@pytest.mark.parametrize("workers", [(), ("-n", "2", "--dist", "loadscope")],
                         ids=["one process", "two workers"])
def test_a_slow_fault_test_s_work_starts_only_when_slow_fault_tests_are_asked_for(
        tmp_path: Path, workers: tuple[str, ...]) -> None:
    """The soak's test is a slow fault test: not asked for, it is deselected, so its work
    (minutes of a stack of its own) never starts; asked for, it runs as before."""
    inner = _session(tmp_path, *workers, slow=True)
    out = inner.communicate(timeout=180)[0].decode()
    assert inner.returncode == 0, out
    ran = _lines(tmp_path)
    assert len(ran) == 4 and all(line[0] == "unit" and line[2] == "False" for line in ran)
    assert not (tmp_path / "pid").exists()

    asked = tmp_path / "asked"
    asked.mkdir()
    inner = _session(asked, *workers, slow=True, env_extra={"KAFKA_INGEST_FAULTS_FULL": "1"})
    out = inner.communicate(timeout=180)[0].decode()
    assert inner.returncode == 0, out
    assert [line[0] for line in _lines(asked)].count("background") == 1
    assert _gone(int((asked / "pid").read_text()))


def test_with_two_workers_the_controller_starts_it_and_its_test_comes_first(
        tmp_path: Path) -> None:
    # tests/support/workers.py: the background work's test first, on a worker it holds
    # meanwhile, the unit tests' modules after it; the process started before any test
    inner = _session(tmp_path, "-n", "2", "--dist", "loadscope", "--no-loadscope-reorder")
    out = inner.communicate(timeout=180)[0].decode()
    assert inner.returncode == 0, out
    ran = _lines(tmp_path)
    assert len(ran) == 5
    assert all(line[2] == "True" for line in ran if line[0] == "unit")
    (worker,) = [line[1] for line in ran if line[0] == "background"]
    assert next(line[0] for line in ran if line[1] == worker) == "background"
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
        assert _gone(pid)
    finally:
        if inner.poll() is None:
            inner.kill()
            inner.wait(10)


def test_its_test_gets_the_exit_status_or_stops_it_past_the_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(background.ROOT_ENV, str(tmp_path))
    ends = background.start(Path("test_ends.py"), [
        sys.executable, "-c", "import sys; print('out'); sys.exit(3)"])
    hangs = background.start(Path("test_hangs.py"), [
        sys.executable, "-c", "import time; time.sleep(600)"])
    assert background.taken_over("tests/test_ends.py").finish(60, interval_s=0.05) == 3
    assert ends.output() == ("out\n", "")
    assert background.taken_over("test_hangs.py").finish(0.5, interval_s=0.05) is None
    assert hangs.returncode() == -signal.SIGTERM and _gone(hangs.pid)
    with pytest.raises(RuntimeError, match=r"test_never\.py's background work was not started"):
        background.taken_over("test_never.py")
