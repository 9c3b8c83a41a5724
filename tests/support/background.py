"""Work a test module starts at the session's start and its test takes over at the end (the
soak: minutes on a stack of its own, mostly spent waiting on its faults and on Airflow's
timers, while the other tests run).

A test module that defines ``background_command(directory) -> argv`` has that command run
by the session as soon as the session knows one of the module's tests is selected: without
xdist when the session is collected, with xdist by the controller when the first worker has
collected (``tests/conftest.py``; the controller outlives the workers, so it is the
process's parent to the end). The module's test (ordered by :mod:`tests.support.workers`)
takes it over on whichever worker runs it by :func:`taken_over` and waits for its end. The
process's output, exit status, pid and start time are files in its directory, so any
process of the session can wait for it or stop it; the session stops whatever still runs
when it ends, also on Ctrl-C (SIGTERM: the soak takes its stack down on the way out).
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path

#: Where the session's background work keeps its files (one directory per module, named
#: after its file): set by the session's first process, inherited by its xdist workers.
ROOT_ENV = "KAFKA_INGEST_TEST_BACKGROUND_DIR"
#: What makes a module one with background work.
COMMAND = "background_command"

_started: list[Background] = []


class Background:
    """One module's background process, through its files in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.out, self.err = directory / "out", directory / "err"
        self._pid, self._started, self._rc = (
            directory / "pid", directory / "started", directory / "returncode")

    @property
    def started(self) -> float:
        """When the process started (epoch seconds)."""
        return float(self._started.read_text())

    @property
    def pid(self) -> int:
        return int(self._pid.read_text())

    def returncode(self) -> int | None:
        """The exit status, once the process has ended (its parent writes it down)."""
        return int(self._rc.read_text()) if self._rc.exists() else None

    def finish(self, bound_s: float, *, interval_s: float = 1.0) -> int | None:
        """The exit status, once the process ends within ``bound_s`` of its start; past that
        it is stopped, and None says it overran."""
        while (code := self.returncode()) is None:
            if time.time() - self.started >= bound_s:
                self.stop()
                return None
            time.sleep(interval_s)
        return code

    def stop(self, wait_s: float = 300.0) -> None:
        """SIGTERM if it still runs, then wait up to ``wait_s`` for its end."""
        if self.returncode() is not None:
            return
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while self.returncode() is None and time.monotonic() < deadline:
            time.sleep(0.2)

    def output(self) -> tuple[str, str]:
        return (self.out.read_text(errors="replace"), self.err.read_text(errors="replace"))


def configure() -> None:
    """The session's first process (the controller, or the one process without xdist): a
    directory for the session's background work, for its workers too."""
    os.environ[ROOT_ENV] = tempfile.mkdtemp(prefix="kafka-ingest-background-")


def _directory(module_file: Path) -> Path:
    root = os.environ.get(ROOT_ENV)
    if not root:
        raise RuntimeError(f"{ROOT_ENV} is not set: the session starts background work "
                           "(tests/conftest.py)")
    return Path(root) / module_file.stem


def start(module_file: Path, argv: list[str]) -> Background:
    """Run ``argv`` in the background for the module; a thread of this process (its parent)
    writes its exit status down when it ends."""
    directory = _directory(module_file)
    directory.mkdir(parents=True)
    run = Background(directory)
    with run.out.open("w") as out, run.err.open("w") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                text=True)
    run._started.write_text(repr(time.time()))
    run._pid.write_text(str(proc.pid))

    def reap() -> None:
        code = proc.wait()
        written = run._rc.with_suffix(".tmp")
        written.write_text(str(code))
        written.replace(run._rc)  # whole, or not yet there

    threading.Thread(target=reap, name=f"reap {module_file.stem}", daemon=True).start()
    _started.append(run)
    return run


def start_modules(files: Iterable[Path]) -> None:
    """Start the background work of those of ``files`` (test modules with a selected test)
    that define :data:`COMMAND`, once (each worker reports its collection). The controller
    has not imported them: their source says which do, and only those are imported here."""
    for path in dict.fromkeys(files):
        if _directory(path).exists() or not _defines_command(path.read_text()):
            continue
        spec = importlib.util.spec_from_file_location(f"_background_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        start(path, getattr(module, COMMAND)(_directory(path)))


def _defines_command(source: str) -> bool:
    """Whether a module's source defines :data:`COMMAND` at its top level (the words in a
    string, such as a test's module template, do not count)."""
    return f"def {COMMAND}(" in source and any(
        isinstance(node, ast.FunctionDef) and node.name == COMMAND
        for node in ast.parse(source).body)


def taken_over(module_file: str | Path) -> Background:
    """The module's background work, for its test to wait for."""
    directory = _directory(Path(module_file))
    if not directory.is_dir():
        raise RuntimeError(f"{Path(module_file).name}'s background work was not started: the "
                           "session starts it when it collects the module's tests")
    return Background(directory)


def stop_all() -> None:
    """The session ends: what this process started and still runs is stopped; the
    session's directory goes if nothing was started (else it stays, to be read)."""
    while _started:
        _started.pop().stop()
    root = os.environ.get(ROOT_ENV)
    if root:
        with contextlib.suppress(OSError):  # not empty
            Path(root).rmdir()
