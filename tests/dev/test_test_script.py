"""``make test``'s exit status (``scripts/test.sh``), with every program it runs stood in for
by a stub: the install, the stack, pytest and the checks beside it. CI trusts this status
alone, so each way it can go is run: all passing, pytest failing, a check failing."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.support import ROOT

#: A stand-in for every command test.sh runs: ``python -m pytest`` exits with
#: $PYTEST_RC, ``ruff`` with $RUFF_RC, anything else succeeds at once.
STUB = """#!/usr/bin/env bash
name=$(basename "$0")
if [ "$name" = python ] && [ "${1:-}" = -m ] && [ "${2:-}" = pytest ]; then
  exit "${PYTEST_RC:-0}"
fi
if [ "$name" = ruff ]; then exit "${RUFF_RC:-0}"; fi
exit 0
"""


def _tree(tmp_path: Path) -> Path:
    """A checkout holding the real ``scripts/test.sh`` and stubs for the rest."""
    tree = tmp_path / "checkout"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "test.sh", tree / "scripts" / "test.sh")
    (tree / "scripts" / "bootstrap.sh").write_text("exit 0\n")
    stubs = tree / ".venv" / "bin"
    stubs.mkdir(parents=True)
    for name in ("python", "kafka-ingest", "ruff", "mypy"):
        (stubs / name).write_text(STUB)
        (stubs / name).chmod(stat.S_IRWXU)
    (stubs / "activate").write_text(f'export PATH="{stubs}:$PATH"\n')
    return tree


@pytest.mark.parametrize(("pytest_rc", "ruff_rc", "expected"), [
    (0, 0, 0),  # everything passed: CI passes (it failed here once, on the script's own trap)
    (1, 0, 1),  # a test failed
    (0, 1, 1),  # a check beside the tests failed
])
def test_make_test_exits_with_what_the_tests_and_checks_say(
        tmp_path: Path, pytest_rc: int, ruff_rc: int, expected: int) -> None:
    tree = _tree(tmp_path)
    env = {**os.environ, "PYTEST_RC": str(pytest_rc), "RUFF_RC": str(ruff_rc)}
    done = subprocess.run(["bash", "scripts/test.sh"], check=False, cwd=tree, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == expected, (done.stdout, done.stderr)
    assert "== make test: " in done.stdout
    if Path("/proc/stat").exists():  # how busy the cores were during the tests
        assert re.search(r"== the cores during the tests: \d+% busy, \d+% idle\n",
                         done.stdout), done.stdout
