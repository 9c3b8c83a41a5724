"""The ``kafka-ingest`` command line as the tests run it.

:func:`cli` calls ``kafka_ingest.cli.main`` in this process, as the console script does,
with the given environment over this process's for the call, and gives what a subprocess
would: the exit status, stdout, and stderr with the command's log lines in the format and
at the level ``main`` sets for a process of its own. A test so costs the command's own
work, not an interpreter's start and imports (0.7 s of CPU each, about 200 calls a
suite). :func:`as_a_user` runs ``python -m kafka_ingest.cli`` in a subprocess, for what
only a process shows: the entry point, signals, librdkafka's logging of its own threads.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
import traceback
from collections.abc import Iterator, Mapping

from kafka_ingest.cli import main
from kafka_ingest.cli.main import LOG_FORMAT


@contextlib.contextmanager
def environment(env: Mapping[str, str | None]) -> Iterator[None]:
    """``env`` on top of this process's environment for the block; ``None`` unsets."""
    saved = {name: os.environ.get(name) for name in env}
    try:
        _put(env)
        yield
    finally:
        _put(saved)


def _put(env: Mapping[str, str | None]) -> None:
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@contextlib.contextmanager
def _command_logging(err: io.StringIO, verbose: bool) -> Iterator[None]:
    """The root logger as ``main``'s ``basicConfig`` sets it in a process of its own (which
    here, where the root already has pytest's handlers, does nothing): records at INFO
    (DEBUG with ``-v``) to stderr in the command's format; restored after."""
    root = logging.getLogger()
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    level = root.level
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def cli(env: Mapping[str, str | None], *args: str) -> subprocess.CompletedProcess[str]:
    """``kafka-ingest *args`` in this process with ``env`` over this process's environment
    (``None`` unsets a variable): its output captured, its exit status not checked. An
    uncaught exception is exit status 1 with its traceback on stderr, as in a process."""
    out, err = io.StringIO(), io.StringIO()
    verbose = bool({"-v", "--verbose"} & set(args[:1]))
    with environment(env), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err), _command_logging(err, verbose):
        try:
            returncode = main(list(args))
        except SystemExit as exc:  # argparse's way out
            returncode = exc.code if isinstance(exc.code, int) else 1
        except Exception:  # as the interpreter does with it
            traceback.print_exc(file=err)
            returncode = 1
    return subprocess.CompletedProcess(["kafka-ingest", *args], returncode, out.getvalue(),
                                       err.getvalue())


def as_a_user(env: Mapping[str, str | None], *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m kafka_ingest.cli *args`` in a subprocess with ``env`` over this process's
    environment (``None`` unsets): its output captured, its exit status not checked."""
    full = {**os.environ, **env}
    return subprocess.run([sys.executable, "-m", "kafka_ingest.cli", *args],
                          env={k: v for k, v in full.items() if v is not None},
                          capture_output=True, text=True, check=False, timeout=300)
