"""How long a soak's faults come (:class:`kafka_ingest_dev.soak.Settings`): ``minutes``,
and with ``every_kind`` on until every kind has come once, never past the bound."""

from __future__ import annotations

from kafka_ingest_dev.soak import FAULTS, Settings


def test_faults_end_at_minutes_without_every_kind() -> None:
    settings = Settings(minutes=2, min_gap_s=6, max_gap_s=12)
    assert settings.fault_bound_s() == 120
    assert settings.faults_go_on(119, saw_every_kind=False)
    assert not settings.faults_go_on(120, saw_every_kind=False)


def test_every_kind_goes_on_until_each_has_come_and_no_longer_than_one_more_round() -> None:
    settings = Settings(minutes=2, min_gap_s=6, max_gap_s=12, every_kind=True)
    # one more round: each kind after its longest gap, bounded by two minutes of steps
    assert settings.fault_bound_s() == 120 + len(FAULTS) * (12 + 120)
    assert settings.faults_go_on(119, saw_every_kind=True)  # minutes are not cut short
    assert not settings.faults_go_on(120, saw_every_kind=True)
    assert settings.faults_go_on(300, saw_every_kind=False)
    assert not settings.faults_go_on(settings.fault_bound_s(), saw_every_kind=False)
