"""``airflow dags test`` for the tests, from a process that has imported Airflow already.

Each run of :func:`kafka_ingest_dev.demo.run_dag` is a new interpreter that spends about
4.5 of its 9-13 CPU seconds importing Airflow, its command line and its in-process
execution API before it reads the DAG; the suite runs about twenty. :func:`run_dag` runs
the same command (``airflow.__main__.main`` with ``dags test ...``) in a child forked from
a server process (:func:`serve`, one per test process) that made those imports once: the
child gets the run's whole environment, its own stdout and stderr and its exit status as
a new process would; what the command does from there (parse the DAG folder, sync it to
the metadata database, run each task in-process) is unchanged.

Airflow reads its configuration when it is imported, so the server is good for the Airflow
settings it was started with (every ``AIRFLOW*`` variable and ``PYTHONPATH``, which
decides what is importable): a run with others starts a server for them. Airflow's imports
start no thread (the server checks), so the fork copies no lock held by one.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from kafka_ingest_dev.procs import child_env

#: What Airflow reads as it is imported: a server is good for these only.
_AT_IMPORT = ("AIRFLOW", "_AIRFLOW", "PYTHONPATH", "PYTHONHOME")


def _import_settings(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_AT_IMPORT)}


class _Server:
    """One server process and the Airflow settings it imported Airflow with."""

    def __init__(self, env: dict[str, str]) -> None:
        self.settings = _import_settings(env)
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.dag_runs"],
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, cwd=Path(__file__).parents[2],
                                     start_new_session=True)

    def run(self, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        try:
            return self._run(argv, env)
        except BaseException:  # interrupted (a time-out, Ctrl-C) or the server broke: the
            self.kill()  # run must not go on, nor its answer reach the next request
            raise

    def _run(self, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            self.proc.stdin.write(json.dumps({"argv": argv, "env": env, "stdout": str(out),
                                              "stderr": str(err)}) + "\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline()
            if not answer:
                raise RuntimeError(f"the dags-test server ended (exit {self.proc.wait()})")
            returncode = json.loads(answer)["returncode"]
            return subprocess.CompletedProcess(argv, returncode,
                                               out.read_text(errors="replace"),
                                               err.read_text(errors="replace"))

    def kill(self) -> None:
        """The server and the run it forked (its process group), at once."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # the server ends at the end of its input
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


_server: _Server | None = None


@atexit.register
def _stop_server() -> None:
    if _server is not None:
        _server.stop()


def run_dag(dag_id: str, env: dict[str, str], *, conf: dict[str, Any] | None = None,
            log_file: Path | None = None) -> subprocess.CompletedProcess[str]:
    """:func:`kafka_ingest_dev.demo.run_dag` (``airflow dags test``, the stack's
    environment), run from the server of this process."""
    args = ["dags", "test", dag_id]
    if conf:
        args += ["-c", json.dumps(conf)]
    proc = run_airflow(args, env)
    if log_file is not None:
        log_file.write_text(proc.stdout + proc.stderr, encoding="utf-8")
    return proc


def run_airflow(args: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """``airflow *args`` with ``env`` over this process's environment
    (:func:`~kafka_ingest_dev.procs.child_env`), in a child of the server for its Airflow
    settings (started, or replaced, as needed)."""
    global _server
    full = child_env(env)
    if _server is None or _server.proc.poll() is not None or \
            _server.settings != _import_settings(full):
        _stop_server()
        _server = _Server(full)
    return _server.run(["airflow", *args], full)


# --------------------------------------------------------------------------- the server


def _child(request: dict[str, Any]) -> int:
    """In the forked child: the request's environment, output files and argv, then the
    command as the ``airflow`` script runs it; its exit status, for the interpreter's own
    exit (:func:`serve`), which shuts down as the script's would: threads, executors'
    workers, ``atexit``, the streams' flush."""
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = list(request["argv"])
    from airflow.__main__ import main

    try:
        result = main()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception:  # as the interpreter reports an uncaught one
        traceback.print_exc()
        return 1
    return result if isinstance(result, int) else 0


def serve(requests: IO[str]) -> None:
    """Import Airflow, then run each request line (JSON: ``argv``, ``env``, ``stdout``,
    ``stderr``) in a forked child, one at a time, answering its exit status on stdout,
    until the end of ``requests``. What else is written to stdout (Airflow's log handlers
    write there) goes to stderr: the answers have the pipe to themselves."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    os.set_inheritable(answers.fileno(), False)
    # the path the ``airflow`` script's interpreter has: its own directory first, not this
    # checkout (which ``-m`` put there, making its folders importable as packages)
    sys.path[0] = str(Path(sys.executable).parent)
    import airflow.__main__
    import airflow.api_fastapi.execution_api.app
    import airflow.api_fastapi.execution_api.routes  # noqa: F401
    from airflow.cli.commands import dag_command  # noqa: F401

    if threading.active_count() != 1:
        raise RuntimeError(f"Airflow's imports started threads: {threading.enumerate()}")
    for line in requests:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            sys.exit(_child(request))  # out of the loop: the interpreter's exit
        _, status = os.waitpid(pid, 0)
        answers.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
        answers.flush()


if __name__ == "__main__":
    serve(sys.stdin)
