"""The tests' topic cleanup (tests/support/topics.py) never fails the test cleaning up."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from tests.support.topics import delete_topics


class _Answer(Future[Any]):
    """A deletion's answer that records how long it was waited for."""

    def __init__(self, waits: list[float | None]) -> None:
        super().__init__()
        self.waits = waits

    def result(self, timeout: float | None = None) -> Any:
        self.waits.append(timeout)
        return super().result(timeout)


class _Admin:
    def __init__(self, outcome: BaseException | None) -> None:
        self.outcome = outcome
        self.asked: list[tuple[list[str], float]] = []
        self.waits: list[float | None] = []

    def delete_topics(self, names: list[str], operation_timeout: float) -> dict[str, Future[Any]]:
        self.asked.append((names, operation_timeout))
        futures: dict[str, Future[Any]] = {}
        for name in names:
            future: Future[Any] = _Answer(self.waits)
            if self.outcome is not None:
                future.set_exception(self.outcome)
            futures[name] = future  # no outcome: never answered
        return futures


class _Clients:
    def __init__(self, admin: _Admin) -> None:
        self._admin = admin

    def admin(self) -> _Admin:
        return self._admin


def test_a_deletion_the_broker_answers_late_or_refuses_is_left_behind() -> None:
    # A shared Airflow's teardown waited 30 s for a busy broker's answer and raised
    # TimeoutError: the last DAG test of a clean-clone run ended in an error. The answers
    # are waited for once in all, not once per topic.
    late = _Admin(None)
    delete_topics(_Clients(late), iter(["a", "b", "c", "d"]), timeout_s=0.2)
    assert late.asked == [(["a", "b", "c", "d"], 0)]  # not waiting on the spread
    first, *rest = late.waits
    assert first is not None and 0 < first <= 0.2
    assert len(rest) == 3 and all(w is not None and w < 0.05 for w in rest)  # spent
    refused = _Admin(RuntimeError("UNKNOWN_TOPIC_OR_PART"))
    delete_topics(_Clients(refused), ["a"])
    assert refused.asked == [(["a"], 0)]


def test_no_topics_ask_the_broker_nothing() -> None:
    admin = _Admin(None)
    delete_topics(_Clients(admin), [])
    assert admin.asked == []
