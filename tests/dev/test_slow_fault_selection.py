"""Which ``-m`` expressions run the slow fault tests (tests/chaos/conftest.py)."""

from __future__ import annotations

import pytest

from tests.support.faults import FULL_ENV, slow_tests_asked


@pytest.mark.parametrize(("markexpr", "asked"), [
    ("", False),
    ("faults", False),
    ("faults_full", True),
    ("faults or faults_full", True),
    ("soak", True),  # `pytest -m soak` collected nothing: the soak was deselected
    ("chaos and soak", True),
    ("faults and not soak", False),
    ("not faults_full", False),
    ("soaking", False),
])
def test_a_mark_expression_that_names_a_slow_marker_runs_the_slow_tests(
        markexpr: str, asked: bool) -> None:
    assert slow_tests_asked(markexpr, {}) is asked


def test_the_environment_runs_them_whatever_the_expression() -> None:
    assert slow_tests_asked("", {FULL_ENV: "1"})
    assert not slow_tests_asked("", {FULL_ENV: "0"})
