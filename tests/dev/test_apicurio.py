"""The schema registry's choices, without starting it: which release runs on which Java,
how ``java -version`` is read, the configuration it is given, and the CLI's flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafka_ingest_dev import apicurio
from kafka_ingest_dev.apicurio import Java, Server, choose, find_javas, java_major
from kafka_ingest_dev.procs import StackError
from kafka_ingest_dev.stack.cli import parser

J17 = Java("/usr/lib/jvm/java-17-openjdk-amd64/bin/java", 17)
J21 = Java("/opt/jdk-21/bin/java", 21)
J25 = Java("/usr/lib/jvm/temurin-25-jdk-amd64/bin/java", 25)


@pytest.mark.parametrize(("output", "major"), [
    # Debian's OpenJDK 17
    ('openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment', 17),
    # Temurin 25, an LTS
    ('openjdk version "25.0.3" 2026-04-21 LTS\nOpenJDK Runtime Environment Temurin', 25),
    # a first release has no minor: "21", not "21.0.0"
    ('openjdk version "21" 2023-09-19', 21),
    # Java 8 still numbers itself 1.8
    ('java version "1.8.0_392"\nJava(TM) SE Runtime Environment', 8),
    # not a Java at all
    ("bash: java: command not found", None),
])
def test_java_version_output_is_read_as_its_feature_release(output: str,
                                                            major: int | None) -> None:
    assert java_major(output) == major


@pytest.mark.parametrize(("javas", "version", "java"), [
    ([J17, J25], "3.3.3", J25),  # a Java 21+ anywhere runs 3.x
    ([J21], "3.3.3", J21),  # 21 is enough
    ([J25, J21], "3.3.3", J25),  # the first candidate that can ($JAVA_HOME comes first)
    ([J17], "2.6.13.Final", J17),  # only 17: the 2.x fallback
])
def test_the_newest_release_some_java_runs_is_chosen(javas: list[Java], version: str,
                                                     java: Java) -> None:
    release, chosen = choose(javas)
    assert (release.version, chosen) == (version, java)


@pytest.mark.parametrize("javas", [[], [Java("/usr/lib/jvm/java-11/bin/java", 11)]])
def test_no_java_17_is_a_stack_error_naming_what_was_found(javas: list[Java]) -> None:
    with pytest.raises(StackError, match="needs Java 17"):
        choose(javas)


def _fake_java(path: Path, stderr: str, code: int = 0) -> str:
    path.write_text(f"#!/bin/sh\necho '{stderr}' >&2\nexit {code}\n")
    path.chmod(0o755)
    return str(path)


def test_find_javas_asks_each_candidate_and_skips_the_broken(tmp_path: Path) -> None:
    ok = _fake_java(tmp_path / "java21", 'openjdk version "21.0.2" 2024-01-16')
    failing = _fake_java(tmp_path / "broken", 'openjdk version "25"', code=1)
    silent = _fake_java(tmp_path / "silent", "no version here")
    assert find_javas([str(tmp_path / "missing"), failing, silent, ok]) == [Java(ok, 21)]


def test_both_interfaces_are_told_loopback_and_storage_is_h2_in_memory(
        tmp_path: Path) -> None:
    lines = apicurio.properties(Server(18081, 18082, tmp_path)).splitlines()
    assert {"quarkus.http.host=127.0.0.1", "quarkus.http.port=18081",
            "quarkus.management.host=127.0.0.1", "quarkus.management.port=18082",
            "apicurio.storage.kind=sql", "apicurio.storage.sql.kind=h2",
            "apicurio.datasource.url=jdbc:h2:mem:registry",
            "quarkus.http.access-log.enabled=false"} <= set(lines)


def test_the_jvm_heap_is_bounded() -> None:
    assert "-Xmx256m" in apicurio.JVM_OPTIONS


def test_the_cli_starts_and_stops_the_registry() -> None:
    assert parser().parse_args(["up", "--registry"]).registry is True
    assert parser().parse_args(["up"]).registry is False
    assert parser().parse_args(["down", "--registry"]).registry is True
    with pytest.raises(SystemExit):  # one of them: only Airflow, or only the registry
        parser().parse_args(["down", "--registry", "--airflow"])
