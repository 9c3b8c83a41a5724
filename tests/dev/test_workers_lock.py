"""The shared stack's lock of the test session (``tests/support/workers.py``): an
``exclusive`` test (one that restarts the stack's Kafka or Postgres) runs while no other
test using the stack runs, a test arriving while it waits queues behind it, and tests that
share the stack run together. Threads stand in for the two workers (each ``flock`` is on
an open file of its own, so they exclude each other as processes do)."""

from __future__ import annotations

import fcntl
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support import workers

#: A bound for what happens at once (a thread taking or waiting for a lock), a loaded
#: machine's scheduling included.
WAIT_S = 60.0


def _item(lock_dir: Path, *, exclusive: bool = False, stack: bool = True) -> Any:
    """What holding_the_stack reads of a test on a worker."""
    config = SimpleNamespace(workerinput={workers.LOCK_DIR: str(lock_dir)})
    marker = pytest.mark.exclusive.mark if exclusive else None
    return SimpleNamespace(config=config, fixturenames=["stack_env"] if stack else [],
                           get_closest_marker=lambda name: marker)


class Runner:
    """A test run in a thread: it takes the lock, says so, then holds it until released."""

    def __init__(self, item: Any, log: list[str], name: str) -> None:
        self.holding, self.release = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, args=(item, log, name), daemon=True)
        self.thread.start()

    def _run(self, item: Any, log: list[str], name: str) -> None:
        with workers.holding_the_stack(item):
            log.append(name)
            self.holding.set()
            assert self.release.wait(WAIT_S)

    def done(self) -> None:
        self.release.set()
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive()


def _waiting_on(runner: Runner, lock: str) -> bool:
    """The runner's thread is in flock on the lock file ``lock`` (``turnstile`` or
    ``stack``), not holding it yet: for ``stack``, it holds what it took before it (an
    exclusive test, the turnstile). Being anywhere in flock is not enough: an exclusive
    test still taking the turnstile lets a later test through it first (which a loaded
    machine made happen)."""
    frame = sys._current_frames().get(runner.thread.ident)  # type: ignore[arg-type]
    while frame is not None:
        if frame.f_code.co_name == "_flock" and Path(frame.f_locals["path"]).name == lock:
            return True
        frame = frame.f_back
    return False


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_tests_sharing_the_stack_run_together(tmp_path: Path) -> None:
    log: list[str] = []
    first, second = Runner(_item(tmp_path), log, "a"), Runner(_item(tmp_path), log, "b")
    assert first.holding.wait(WAIT_S) and second.holding.wait(WAIT_S)
    first.done()
    second.done()


@pytest.mark.parametrize("slow_turnstile", [False, True])
def test_an_exclusive_test_waits_for_the_running_one_and_the_next_waits_for_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow_turnstile: bool) -> None:
    """``slow_turnstile``: the exclusive test is slow to take the turnstile (a loaded
    machine), and the later test must still arrive only once it holds it."""
    if slow_turnstile:
        real = workers._flock

        def _flock(path: Path, operation: int) -> Any:  # the name the frames are read by
            if path.name == "turnstile" and operation == fcntl.LOCK_EX:
                time.sleep(0.5)
            return real(path, operation)

        monkeypatch.setattr(workers, "_flock", _flock)
    log: list[str] = []
    running = Runner(_item(tmp_path), log, "running")
    assert running.holding.wait(WAIT_S)
    exclusive = Runner(_item(tmp_path, exclusive=True), log, "exclusive")
    _until(lambda: _waiting_on(exclusive, "stack"),
           "the exclusive test to hold the turnstile and wait for the stack")
    later = Runner(_item(tmp_path), log, "later")  # arrives while the exclusive one waits
    _until(lambda: _waiting_on(later, "turnstile"), "the later test to wait behind it")
    assert log == ["running"]
    running.done()
    assert exclusive.holding.wait(WAIT_S)
    assert log == ["running", "exclusive"]  # the later one still waits
    assert _waiting_on(later, "turnstile")
    exclusive.done()
    assert later.holding.wait(WAIT_S)
    later.done()
    assert log == ["running", "exclusive", "later"]


def test_a_test_that_does_not_use_the_stack_never_waits(tmp_path: Path) -> None:
    log: list[str] = []
    exclusive = Runner(_item(tmp_path, exclusive=True), log, "exclusive")
    assert exclusive.holding.wait(WAIT_S)
    unit = Runner(_item(tmp_path, stack=False), log, "unit")
    assert unit.holding.wait(WAIT_S)
    unit.done()
    exclusive.done()


def test_without_a_lock_directory_nothing_is_locked() -> None:
    item = SimpleNamespace(config=SimpleNamespace(workerinput={}, stash={}),
                           fixturenames=["stack_env"],
                           get_closest_marker=lambda name: pytest.mark.exclusive.mark)
    with workers.holding_the_stack(item):  # type: ignore[arg-type]
        pass
