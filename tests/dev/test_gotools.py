"""``go_install``: a program built once into the user cache, again when its flags change."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kafka_ingest_dev.gotools import go_install


@pytest.mark.integration
def test_a_build_is_kept_until_its_flags_change(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    module = tmp_path / "src"
    (module / "hello").mkdir(parents=True)
    (module / "go.mod").write_text("module example.com/hello\n\ngo 1.21\n")
    (module / "hello" / "main.go").write_text(
        'package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("hello") }\n')
    # a workspace makes the module's package buildable from the cache directory go_install
    # builds in (as a module@version is, from the proxy)
    (tmp_path / "go.work").write_text(f"go 1.21\n\nuse {module}\n")
    monkeypatch.setenv("GOWORK", str(tmp_path / "go.work"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("GOFLAGS", "")

    def build(*flags: str) -> tuple[Path, int]:
        target = go_install("hello", "1", ["example.com/hello/hello"], ["hello"],
                            timeout_s=300, needs="a test program", flags=flags)
        binary = target / "hello"
        assert subprocess.run([str(binary)], capture_output=True, text=True, check=True,
                              timeout=30).stdout == "hello\n"
        return target, binary.stat().st_mtime_ns

    target, first = build()
    assert (target / ".complete").read_text() == "1\n"
    assert build()[1] == first  # kept: the marker says these flags

    _, stripped = build("-ldflags=-s -w")
    assert stripped != first  # other flags: built again
    assert (target / ".complete").read_text() == "1 -ldflags=-s -w\n"
    assert build("-ldflags=-s -w")[1] == stripped
