"""The alert rules without services: the ``alerts`` block of the pipelines file, the pure
decision (figures -> breaches) with every expected value written out, and the webhook
POST against an HTTP server on loopback."""

from __future__ import annotations

import urllib.error
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kafka_ingest.config import Alerts, NotifierClass, Pipeline, parse_pipelines
from kafka_ingest.ops.monitor import Breach, Figures, evaluate, post_webhook, redact_url

BODY: dict[str, Any] = {
    "topic": "t-in",
    "contract": {"event_type": "metric_event", "version": 2},
    "table": "t_rows",
    "dlq_topic": "t-in-dlq",
}
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def pipelines(alerts: Any = None, defaults: Any = None) -> dict[str, Pipeline]:
    body = dict(BODY) if alerts is None else {**BODY, "alerts": alerts}
    doc: dict[str, Any] = {"pipelines": {"p1": body, "p2": dict(BODY)}}
    if defaults is not None:
        doc["defaults"] = {"alerts": defaults}
    return parse_pipelines(doc)


# --------------------------------------------------------------------------- config


def test_alerts_have_documented_defaults() -> None:
    alerts = pipelines()["p1"].alerts
    assert (alerts.max_lag, alerts.lag_growth_checks, alerts.max_dlq_rate,
            alerts.window_minutes, alerts.freshness_minutes, alerts.max_parked,
            alerts.notifiers) == (100_000, 3, 0.05, 60, 30, 1000, ())


def test_a_pipeline_overrides_the_defaults_alerts_key_by_key() -> None:
    shared = {"max_lag": 10, "notifiers": ["https://hooks.example.com/T/1",
                                           {"class": "pkg.mod.Notifier", "kwargs": {"to": "x"}}]}
    loaded = pipelines(alerts={"max_lag": 5}, defaults=shared)
    p1, p2 = loaded["p1"].alerts, loaded["p2"].alerts
    assert (p1.max_lag, p2.max_lag) == (5, 10)
    # p1 changed one limit and kept the shared notifiers
    notifier = NotifierClass.model_validate({"class": "pkg.mod.Notifier", "kwargs": {"to": "x"}})
    assert p1.notifiers == p2.notifiers == ("https://hooks.example.com/T/1", notifier)
    assert p1.max_parked == 1000  # untouched keys keep the built-in defaults


def test_alerts_survive_a_round_trip_through_the_file_format() -> None:
    """Tests and tools write pipelines back as YAML (model_dump): the notifier's key is
    ``class`` again, not the attribute's name."""
    p1 = pipelines(alerts={"notifiers": [{"class": "a.B", "kwargs": {"k": 1}}]})["p1"]
    dumped = p1.model_dump(mode="json", exclude={"name"})
    assert dumped["alerts"]["notifiers"] == [{"class": "a.B", "kwargs": {"k": 1}}]
    assert parse_pipelines({"pipelines": {"p1": dumped}})["p1"] == p1


@pytest.mark.parametrize(("alerts", "message"), [
    # a typo in a key
    ({"max_lagg": 5}, "pipelines.p1.alerts.max_lagg: unknown key"),
    # a negative limit
    ({"max_lag": -1}, "pipelines.p1.alerts.max_lag: Input should be greater than or equal to 0"),
    # a rate is a fraction, not a percentage
    ({"max_dlq_rate": 5}, "pipelines.p1.alerts.max_dlq_rate: Input should be less than or "
                          "equal to 1"),
    # growth over zero checks means nothing
    ({"lag_growth_checks": 0}, "pipelines.p1.alerts.lag_growth_checks: Input should be "
                               "greater than or equal to 1"),
    ({"window_minutes": "an hour"}, "pipelines.p1.alerts.window_minutes: Input should be a "
                                    "valid integer"),
    # one URL instead of a list of them
    ({"notifiers": "https://h/x"}, "pipelines.p1.alerts.notifiers: Value error, must be a "
                                   "list of webhook URLs"),
    # a webhook that is not http(s)
    ({"notifiers": ["ftp://h/x"]}, "pipelines.p1.alerts.notifiers: Value error, entry 0 is "
                                   "not an http(s) URL with a host"),
    # a notifier class without a module
    ({"notifiers": ["https://h/x", {"class": "SmtpNotifier"}]},
     "pipelines.p1.alerts.notifiers: Value error, entry 1.class: Value error, 'SmtpNotifier' "
     "is not a dotted path to a class"),
    # kwargs misspelt
    ({"notifiers": [{"class": "a.B", "kwarg": {}}]},
     "pipelines.p1.alerts.notifiers: Value error, entry 0.kwarg: unknown key"),
    ({"notifiers": [42]}, "entry 0 must be a webhook URL or {class: <dotted path>, kwargs: "
                          "{...}}, not int"),
])
def test_a_bad_alerts_value_names_its_key(alerts: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=r"pipelines\.p1\.alerts") as exc:
        pipelines(alerts=alerts)
    assert message in str(exc.value)


def test_a_bad_alerts_value_under_defaults_names_the_pipeline() -> None:
    with pytest.raises(ValueError, match=r"pipelines\.p1\.alerts\.max_parked"):
        pipelines(defaults={"max_parked": -5})


# --------------------------------------------------------------------------- the rules


def figures(**overrides: Any) -> Figures:
    """A healthy pipeline: 3 partitions, 10 behind, a live chunk 2 min ago, 1 % dead."""
    base: dict[str, Any] = {
        "pipeline": "p1", "now": NOW, "total_lag": 10, "group_lag": 10, "partitions": 3,
        "lag_history": (10,), "window_minutes": 60, "read": 1000, "dead_lettered": 10,
        "last_live_commit": NOW - timedelta(minutes=2), "watched_since": NOW, "parked": 10,
    }
    return Figures(**{**base, **overrides})


def rules(breaches: list[Breach]) -> list[str]:
    return [b.rule for b in breaches]


def test_a_healthy_pipeline_breaches_nothing() -> None:
    assert evaluate(Alerts(), figures()) == []


@pytest.mark.parametrize(("total", "breached"), [
    (6, True),    # one above
    (5, False),   # exactly the limit is not above it
    (0, False),
])
def test_max_lag_is_a_strict_limit(total: int, breached: bool) -> None:
    found = evaluate(Alerts(max_lag=5), figures(total_lag=total, lag_history=(total,)))
    assert rules(found) == (["max_lag"] if breached else [])


def test_lag_above_max_lag() -> None:
    [breach] = evaluate(Alerts(max_lag=5), figures(total_lag=50, lag_history=(50,)))
    assert breach == Breach(
        "p1", "max_lag", {"total_lag": 50, "partitions": 3, "max_lag": 5},
        "p1: max_lag: lag 50 messages over 3 partitions is above max_lag 5")
    assert breach.to_dict() == {
        "pipeline": "p1", "rule": "max_lag",
        "message": "p1: max_lag: lag 50 messages over 3 partitions is above max_lag 5",
        "figures": {"total_lag": 50, "partitions": 3, "max_lag": 5}}


@pytest.mark.parametrize(("history", "breached"), [
    # grew at each of the last 3 checks
    ((10, 20, 30, 40), True),
    # only the last 4 totals count: an earlier fall does not matter
    ((90, 10, 20, 30, 40), True),
    # flat once: not strictly growing
    ((10, 20, 20, 40), False),
    # fell once
    ((10, 30, 20, 40), False),
    # too few checks recorded yet to judge
    ((20, 30, 40), False),
])
def test_lag_growth_over_the_last_checks(history: tuple[int, ...], breached: bool) -> None:
    found = evaluate(Alerts(lag_growth_checks=3),
                     figures(total_lag=history[-1], lag_history=history))
    assert rules(found) == (["lag_growth_checks"] if breached else [])


def test_lag_growth_message_and_figures() -> None:
    [breach] = evaluate(Alerts(lag_growth_checks=2), figures(lag_history=(3, 5, 8, 9)))
    assert breach.figures == {"lag_history": [5, 8, 9], "lag_growth_checks": 2}
    assert breach.message == ("p1: lag_growth_checks: the lag grew at each of the last 2 "
                              "checks (5 -> 8 -> 9)")


@pytest.mark.parametrize(("read", "dead", "breached"), [
    ((100, 6, True)),   # 6 %
    ((100, 5, False)),  # exactly the limit is not above it
    ((0, 0, False)),    # nothing read: no rate
])
def test_dlq_rate_in_the_window(read: int, dead: int, breached: bool) -> None:
    found = evaluate(Alerts(max_dlq_rate=0.05), figures(read=read, dead_lettered=dead))
    assert rules(found) == (["max_dlq_rate"] if breached else [])


def test_dlq_rate_message_and_figures() -> None:
    [breach] = evaluate(Alerts(), figures(read=200, dead_lettered=15, window_minutes=60))
    assert breach.figures == {"dead_lettered": 15, "read": 200, "dlq_rate": 0.075,
                              "window_minutes": 60, "max_dlq_rate": 0.05}
    assert breach.message == ("p1: max_dlq_rate: 15 of 200 messages read by live chunks in "
                              "the last 60 min were dead-lettered (7.50%), above max_dlq_rate "
                              "5.00%")


@pytest.mark.parametrize(("overrides", "breached"), [
    # the newest live chunk is 31 min old and messages wait
    ({"last_live_commit": NOW - timedelta(minutes=31)}, True),
    # exactly 30 min: not above the limit
    ({"last_live_commit": NOW - timedelta(minutes=30)}, False),
    # old, but nothing waits: an idle topic is not stale
    ({"last_live_commit": NOW - timedelta(hours=5), "total_lag": 0, "lag_history": (0,)},
     False),
    # never committed: counted from the monitor's first check, 45 min ago
    ({"last_live_commit": None, "watched_since": NOW - timedelta(minutes=45)}, True),
    # never committed, first check now: a new pipeline gets its chance
    ({"last_live_commit": None, "watched_since": NOW}, False),
    # lag not known (status without Kafka settings): not judged
    ({"last_live_commit": NOW - timedelta(hours=5), "total_lag": None, "lag_history": ()},
     False),
])
def test_freshness(overrides: dict[str, Any], breached: bool) -> None:
    found = evaluate(Alerts(freshness_minutes=30), figures(**overrides))
    assert rules(found) == (["freshness_minutes"] if breached else [])


def test_freshness_messages_say_since_when() -> None:
    [old] = evaluate(Alerts(), figures(last_live_commit=NOW - timedelta(minutes=42)))
    assert old.message == ("p1: freshness_minutes: no live chunk committed for 42 min (the "
                           "newest at 2026-03-01T11:18:00+00:00) while the lag is 10, above "
                           "freshness_minutes 30")
    assert old.figures == {"minutes_since_live_chunk": 42.0,
                           "last_live_commit": "2026-03-01T11:18:00+00:00", "total_lag": 10,
                           "freshness_minutes": 30}
    [never] = evaluate(Alerts(), figures(last_live_commit=None,
                                         watched_since=NOW - timedelta(minutes=45)))
    assert "(none ever; counted from the monitor's first check)" in never.message


@pytest.mark.parametrize(("parked", "breached"), [(1001, True), (1000, False)])
def test_parked_letters(parked: int, breached: bool) -> None:
    found = evaluate(Alerts(), figures(parked=parked))
    assert rules(found) == (["max_parked"] if breached else [])
    if breached:
        assert found[0].message == ("p1: max_parked: 1001 dead letters are parked, above "
                                    "max_parked 1000")


def test_every_rule_at_once_in_a_fixed_order() -> None:
    alerts = Alerts(max_lag=5, lag_growth_checks=1, max_dlq_rate=0.1, freshness_minutes=10,
                    max_parked=0)
    found = evaluate(alerts, figures(total_lag=7, lag_history=(6, 7), read=10, dead_lettered=2,
                                     last_live_commit=NOW - timedelta(minutes=11), parked=1))
    assert rules(found) == ["max_lag", "lag_growth_checks", "max_dlq_rate",
                            "freshness_minutes", "max_parked"]


def test_figures_as_json() -> None:
    f = figures(read=400, dead_lettered=1, lag_history=(4, 10))
    assert f.to_dict() == {
        "pipeline": "p1", "checked_at": "2026-03-01T12:00:00+00:00", "total_lag": 10,
        "group_lag": 10, "partitions": 3, "lag_history": [4, 10], "window_minutes": 60,
        "read": 400, "dead_lettered": 1, "dlq_rate": 0.0025,
        "last_live_commit": "2026-03-01T11:58:00+00:00", "minutes_since_live_chunk": 2.0,
        "parked": 10}


# --------------------------------------------------------------------------- webhooks


BREACH = Breach("p1", "max_lag", {"total_lag": 50, "partitions": 3, "max_lag": 5},
                "p1: max_lag: lag 50 messages over 3 partitions is above max_lag 5")


def test_a_webhook_receives_the_breach_as_json(webhook: Any) -> None:
    port = webhook.server_address[1]
    assert post_webhook(f"http://127.0.0.1:{port}/hook/secret-token", BREACH) == 204
    assert webhook.received == [("/hook/secret-token", "application/json", {
        "pipeline": "p1", "rule": "max_lag",
        "message": "p1: max_lag: lag 50 messages over 3 partitions is above max_lag 5",
        "figures": {"total_lag": 50, "partitions": 3, "max_lag": 5}})]


def test_a_webhook_answering_an_error_raises(webhook: Any) -> None:
    with pytest.raises(urllib.error.HTTPError, match="500"):
        post_webhook(f"http://127.0.0.1:{webhook.server_address[1]}/broken", BREACH)


def test_a_webhook_that_is_not_http_is_refused_before_any_request() -> None:
    with pytest.raises(ValueError, match="not an http"):
        post_webhook("file:///etc/passwd", BREACH)


@pytest.mark.parametrize(("url", "shown"), [
    # a Slack-style secret in the path
    ("https://hooks.slack.com/services/T000/B000/XXXX", "https://hooks.slack.com/…"),
    # a token in the query, a port kept
    ("http://alerts.internal:8080/in?token=s3cret", "http://alerts.internal:8080/…"),
])
def test_webhook_urls_are_shown_without_their_secret(url: str, shown: str) -> None:
    assert redact_url(url) == shown
