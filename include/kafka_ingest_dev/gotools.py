"""Programs the local stack and the tests build from their Go modules (Toxiproxy,
Prometheus and promtool), with ``go install`` into the user cache, once.

``${XDG_CACHE_HOME:-~/.cache}/kafka-ingest/<name>-<version>/`` holds the binaries, shared
by every checkout and state directory (like the Kafka jars). A marker file says the build
finished, and with which flags (a build with others is made again); a file lock makes a
second process wait for the first's build instead of building beside it. The build's
output goes to ``install.log`` there; a build that overruns its time-out is killed with its
compilers (the whole process group).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from kafka_ingest_dev.procs import StackError, child_env, tail, terminate

log = logging.getLogger(__name__)

_STOP_TIMEOUT_S = 15.0


def cache_dir(name: str, version: str) -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/kafka-ingest/<name>-<version>``."""
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "kafka-ingest" / f"{name}-{version}"


def go(needs: str) -> str:
    """The ``go`` command; ``needs``: what is built and the Go it needs, for the error."""
    found = shutil.which("go") or next(
        (str(p) for p in (Path("/usr/local/go/bin/go"),) if p.is_file()), None)
    if found is None:
        raise StackError(f"go not found on PATH: {needs} (https://go.dev/dl/; Debian "
                         "bookworm's golang-go 1.19 is too old)")
    return found


def go_install(name: str, version: str, packages: Sequence[str], binaries: Sequence[str], *,
               timeout_s: float, needs: str, timeout_hint: str = "",
               flags: Sequence[str] = ()) -> Path:
    """The directory holding ``binaries``, built by ``go install flags packages`` the first
    time (later calls only check the marker). Safe to call from several processes."""
    target = cache_dir(name, version)
    marker = target / ".complete"
    built = " ".join([version, *flags]) + "\n"  # the marker's text

    def complete() -> bool:
        return marker.is_file() and marker.read_text() == built and \
            all((target / b).is_file() for b in binaries)

    if complete():
        return target
    target.mkdir(parents=True, exist_ok=True)
    with (target / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if complete():  # another process built it meanwhile
            return target
        started = time.monotonic()
        _build(target, [go(needs), "install", *flags, *packages], timeout_s,
               f"{name} {version}", timeout_hint)
        missing = [b for b in binaries if not (target / b).is_file()]
        if missing:
            raise StackError(f"`go install {' '.join(packages)}` built no {', '.join(missing)}"
                             f"; see {target / 'install.log'}")
        marker.write_text(built)
        log.info("%s %s built into %s in %.1f s", name, version, target,
                 time.monotonic() - started)
    return target


def _build(target: Path, cmd: list[str], timeout_s: float, what: str, hint: str) -> None:
    """Run ``cmd`` with ``GOBIN=target``; cwd: the target, so a ``go.mod`` in the caller's
    directory never takes part."""
    logfile = target / "install.log"
    with logfile.open("wb") as out:
        child = subprocess.Popen(cmd, env=child_env({"GOBIN": str(target)}),
                                 stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, cwd=target,
                                 start_new_session=True)
    try:
        code = child.wait(timeout_s)
    except subprocess.TimeoutExpired:
        terminate(child.pid, _STOP_TIMEOUT_S, group=True)
        child.wait(_STOP_TIMEOUT_S)
        raise StackError(f"`go install` of {what} did not finish within {timeout_s:.0f} s"
                         f"{f' ({hint})' if hint else ''}; see {logfile}") from None
    if code != 0:
        raise StackError(f"`{' '.join(cmd[1:])}` failed (exit {code}): "
                         f"{tail(logfile, 3) or 'no output'}; see {logfile}")
