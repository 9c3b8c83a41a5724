"""The Prometheus harness: the configuration it writes (fast, no server), then one real
Prometheus and promtool (``integration``: built once with Go, then cached) that check a
rules file, scrape the server itself and fire an alert."""

from __future__ import annotations

import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from kafka_ingest_dev.procs import free_ports
from kafka_ingest_dev.prometheus import (
    PrometheusServer,
    PromtoolError,
    Target,
    check_rules,
    install,
    render_config,
    wait_for,
)

TOKEN = "s3cret-token-never-in-the-config"


def _server(home: Path, *targets: Target, rules: tuple[Path, ...] = ()) -> PrometheusServer:
    return PrometheusServer(19999, home, targets=targets, rule_files=rules,
                            scrape_interval="2s", evaluation_interval="3s")


def test_the_configuration_lists_each_target_with_its_path_scheme_and_intervals(
        tmp_path: Path) -> None:
    server = _server(tmp_path,
                     Target("app", "127.0.0.1:8000"),
                     Target("exporter", "localhost:9400", metrics_path="/x/metrics",
                            scheme="https", ca_file=Path("/ca.pem")))
    doc = yaml.safe_load(server.write_config().read_text())

    assert doc["global"] == {"scrape_interval": "2s", "evaluation_interval": "3s"}
    assert doc["scrape_configs"] == [
        {"job_name": "app", "metrics_path": "/metrics", "scheme": "http",
         "static_configs": [{"targets": ["127.0.0.1:8000"]}]},
        {"job_name": "exporter", "metrics_path": "/x/metrics", "scheme": "https",
         "static_configs": [{"targets": ["localhost:9400"]}],
         "tls_config": {"ca_file": "/ca.pem"}},
    ]
    assert doc["rule_files"] == []
    assert not server.secrets_dir.exists()  # no token, no secrets directory


def test_a_bearer_token_lives_in_a_0600_file_the_configuration_names(tmp_path: Path) -> None:
    server = _server(tmp_path, Target("api", "127.0.0.1:8080", bearer_token=TOKEN))
    text = server.write_config().read_text()

    token_file = server.token_file("api")
    assert yaml.safe_load(text)["scrape_configs"][0]["authorization"] == {
        "type": "Bearer", "credentials_file": str(token_file)}
    assert token_file.read_text() == TOKEN
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(server.secrets_dir.stat().st_mode) == 0o700
    assert TOKEN not in text
    assert TOKEN not in repr(server)  # a logged server or target does not show it


def test_a_token_file_left_readable_by_others_is_tightened_on_the_next_write(
        tmp_path: Path) -> None:
    server = _server(tmp_path, Target("api", "127.0.0.1:8080", bearer_token=TOKEN))
    server.write_config()
    server.token_file("api").chmod(0o644)

    server.write_config()

    assert stat.S_IMODE(server.token_file("api").stat().st_mode) == 0o600


def test_rule_files_are_named_by_absolute_path(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # Prometheus resolves relative ones from the config's dir
    doc = yaml.safe_load(render_config([], token_files={},
                                       rule_files=[Path("alerts.yml")]))
    assert doc["rule_files"] == [str(tmp_path / "alerts.yml")]


def test_two_targets_of_one_job_are_refused_before_prometheus_sees_them() -> None:
    with pytest.raises(ValueError, match=r"unique.*app"):
        render_config([Target("app", "127.0.0.1:1"), Target("app", "127.0.0.1:2")],
                      token_files={})


@pytest.mark.parametrize(("fields", "message"), [
    ({"address": "127.0.0.1"}, "not host:port"),  # no port
    ({"scheme": "tcp"}, "not http or https"),
    ({"metrics_path": "metrics"}, "must start with /"),
])
def test_a_malformed_target_is_a_value_error(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Target(**{"job": "app", "address": "127.0.0.1:1", **fields})


def test_wait_for_gives_up_at_its_deadline_naming_what_it_waited_for() -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="the answer: not within 0 s"):
        wait_for(lambda: None, timeout_s=0.3, what="the answer", interval_s=0.05)
    assert 0.3 <= time.monotonic() - started < 5.0


# --------------------------------------------------------------------------- a real one

RULES = """\
groups:
  - name: harness
    rules:
      - alert: PrometheusScrapesItself
        expr: up{job="self"} == 1
        labels: {severity: info}
        annotations: {summary: "the harness' Prometheus scrapes its own /metrics"}
"""
BROKEN_RULES = RULES.replace('up{job="self"} == 1', 'up{job="self"} ==')
#: Generous: the machine may be busy (two cores, other suites running).
START_S = 120.0
WAIT_S = 90.0


@pytest.mark.integration
def test_a_real_prometheus_checks_rules_scrapes_itself_and_fires_an_alert(
        tmp_path: Path) -> None:
    started = time.monotonic()
    binaries = install()  # cached after the first build (minutes on a cold Go cache)
    print(f"install: {time.monotonic() - started:.1f} s")
    rules = tmp_path / "rules.yml"
    rules.write_text(RULES)
    broken = tmp_path / "broken.yml"
    broken.write_text(BROKEN_RULES)

    assert "SUCCESS" in check_rules(rules)
    with pytest.raises(PromtoolError, match=r"broken\.yml") as refused:
        check_rules(broken)
    assert refused.value.returncode == 1
    assert "parse" in refused.value.output.lower()

    (port,) = free_ports(1)
    # A token on the self-scrape: Prometheus' /metrics ignores it, but the scrape fails
    # unless Prometheus can read the credentials file it is given.
    server = PrometheusServer(port, tmp_path / "prom", rule_files=(rules,),
                              targets=(Target("self", f"127.0.0.1:{port}",
                                              bearer_token=TOKEN),),
                              start_timeout_s=START_S)
    started = time.monotonic()
    with server:
        print(f"start (until /-/ready): {time.monotonic() - started:.1f} s")
        api = server.api
        assert binaries.prometheus.is_file()

        (target,) = api.wait_for_targets_up(timeout_s=WAIT_S)
        assert target["labels"]["job"] == "self", target
        (up,) = api.wait_for_query('up{job="self"}', timeout_s=WAIT_S)
        assert up["value"][1] == "1", up
        alert = api.wait_for_alert("PrometheusScrapesItself", timeout_s=WAIT_S)
        assert alert["labels"]["severity"] == "info", alert
        print(f"alert firing after: {time.monotonic() - started:.1f} s")

        api.reload()  # --web.enable-lifecycle: the tests may rewrite rules and reload
        assert api.ready()
        assert TOKEN not in api.config()
        pid = server.pid()
        assert pid is not None

    assert server.pid() is None
    assert not server.pidfile.exists()
    assert TOKEN not in server.logfile.read_text()


@pytest.mark.integration
def test_the_build_reads_static_targets_and_no_cloud_discovery(tmp_path: Path) -> None:
    """Built with ``remove_all_sd`` (half the cold build's time and CPU): a static target is
    a valid configuration, a cloud service discovery is an unknown field."""
    promtool = str(install().promtool)
    static = tmp_path / "static.yml"
    static.write_text(yaml.safe_dump({"scrape_configs": [
        {"job_name": "s", "static_configs": [{"targets": ["127.0.0.1:1"]}]}]}))
    cloud = tmp_path / "cloud.yml"
    cloud.write_text(yaml.safe_dump({"scrape_configs": [
        {"job_name": "c", "ec2_sd_configs": [{"region": "us-east-1"}]}]}))

    valid = subprocess.run([promtool, "check", "config", str(static)], capture_output=True,
                           text=True, check=False, timeout=60)
    unknown = subprocess.run([promtool, "check", "config", str(cloud)], capture_output=True,
                             text=True, check=False, timeout=60)

    assert valid.returncode == 0, valid.stdout + valid.stderr
    assert unknown.returncode == 1
    assert "field ec2_sd_configs not found" in unknown.stdout + unknown.stderr
