"""The group committer (``kafka_ingest.kafka.commits.GroupCommitter``): background, bounded,
newest-wins commits to a consumer group, never a reason to fail or to hang.

Its rules (:class:`~kafka_ingest.kafka.commits.CommitState`) are tested first, with plain
values: no thread, no client, no clock. Then the owner around them: most tests commit
through :class:`~fakes.FakeConsumer` (whose commits can fail) or :class:`_HeldConsumer`,
which behaves as librdkafka does with a silent coordinator: a synchronous commit that
does not return until released, and a ``close()`` that would wait forever while a commit
is pending (librdkafka #3740; here it records the violation instead of hanging the test).
The last tests use real librdkafka clients of a broker that does not exist.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from kafka_ingest.kafka import commits
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.commits import CommitState, GroupCommitter, Idle, Owner, Settlement
from tests.support.fakes import FakeConsumer
from tests.support.interrupts import TaskTimeout, task_timeout_after

TOPIC = "orders"
GROUP = "kafka-ingest.orders"
# Nothing listens on port 1: a client of it never reaches a broker.
NOWHERE = {"bootstrap.servers": "127.0.0.1:1", "log_level": 0}


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The committer's back-off sleeps, recorded instead of slept."""
    slept: list[float] = []
    monkeypatch.setattr(commits.time, "sleep", slept.append)
    return slept


def committer_of(consumer: Any, *, timeout_s: float = 5.0, **kwargs: Any) -> GroupCommitter:
    return GroupCommitter(lambda: consumer, GROUP, timeout_s=timeout_s, **kwargs)


# --------------------------------------------------------------------------- the rules

A, B = (TOPIC, 3), (TOPIC, 4)
RAISES = "raises"  # an expected answer: the event is refused (RuntimeError)

Step = Callable[[CommitState], Any]  # an event, or a question: what it answers


def post(position: tuple[str, int], offset: int) -> Step:
    return lambda state: state.post(position, offset)


def settle(landed: bool) -> Step:
    return lambda state: state.settle(landed=landed)


def take(state: CommitState) -> Any:
    return state.next_batch()


def retry(state: CommitState) -> bool:
    return state.retry()


def close(state: CommitState) -> None:
    state.close()


def stop(state: CommitState) -> Settlement:
    return state.stop_waiting()


def done(state: CommitState) -> bool:
    return state.done


def fail(state: CommitState) -> None:
    state.failed(ValueError("a bug"))


#: name -> [(event, the answer expected)], in order, on a new CommitState.
CASES: dict[str, list[tuple[Step, Any]]] = {
    "nothing posted: the thread waits, the owner need not": [
        (take, Idle.WAIT), (done, True)],
    "a post is the next batch, settled when it landed": [
        (post(A, 10), True), (done, False), (take, {A: 10}), (done, False),
        (settle(True), None), (done, True), (take, Idle.WAIT)],
    "newest wins: posts during a commit are coalesced into the next batch": [
        (post(A, 10), True), (take, {A: 10}), (post(A, 20), True), (post(A, 30), True),
        (post(B, 7), True), (settle(True), None), (take, {A: 30, B: 7})],
    "one batch at a time": [
        (post(A, 10), True), (take, {A: 10}), (post(A, 20), True), (take, RAISES)],
    "nothing to settle without a batch on its way": [
        (post(A, 10), True), (settle(True), RAISES)],
    "an offset tried to the end is not tried again": [
        (post(A, 10), True), (take, {A: 10}), (settle(False), None), (post(A, 10), True),
        (take, Idle.WAIT), (done, True)],
    "an answered error is retried while nothing newer came": [
        (post(A, 10), True), (take, {A: 10}), (retry, True)],
    "not once a newer offset was posted (the next batch carries it)": [
        (post(A, 10), True), (post(B, 5), True), (take, {A: 10, B: 5}), (post(A, 11), True),
        (retry, False)],
    "closed with nothing pending: the thread stops": [
        (close, None), (take, Idle.STOP), (done, True)],
    "closed with offsets pending: they are committed, then the thread stops": [
        (post(A, 10), True), (close, None), (done, False), (take, {A: 10}), (retry, True),
        (settle(True), None), (done, True), (take, Idle.STOP)],
    "nothing can be posted once closed": [
        (close, None), (post(A, 10), RAISES)],
    "the owner left: what is on its way is unanswered, never retried, tried once more": [
        (post(A, 10), True), (take, {A: 10}), (post(A, 20), True), (close, None),
        (stop, Settlement(behind={A: 20}, unanswered={A: 20})), (retry, False),
        (settle(False), None), (take, {A: 20}), (retry, False), (settle(True), None),
        (take, Idle.STOP)],
    "the owner learns what the group lacks": [
        (post(A, 10), True), (post(B, 5), True), (take, {A: 10, B: 5}),
        (settle(True), None), (post(A, 20), True), (take, {A: 20}), (settle(False), None),
        (close, None), (done, True), (stop, Settlement(behind={A: 20}, unanswered={}))],
    "a failed thread: posts dropped, nothing waited for, the thread stops": [
        (post(A, 10), True), (take, {A: 10}), (fail, None), (done, True),
        (post(A, 11), False), (take, Idle.STOP), (close, None),
        (stop, Settlement(behind={A: 10}, unanswered={}))],
    "a failed and closed committer still refuses posts": [
        (fail, None), (close, None), (post(A, 10), RAISES)],
}


@pytest.mark.parametrize("steps", list(CASES.values()), ids=list(CASES))
def test_the_committers_rules(steps: list[tuple[Step, Any]]) -> None:
    state = CommitState()
    for i, (step, expected) in enumerate(steps):
        if expected == RAISES:
            with pytest.raises(RuntimeError):
                step(state)
        else:
            assert step(state) == expected, f"step {i}"


def test_the_owner_is_posting_then_waiting_then_gone() -> None:
    state = CommitState()
    assert state.owner is Owner.POSTING
    state.close()
    assert state.owner is Owner.WAITING
    state.stop_waiting()
    assert state.owner is Owner.LEFT
    state.close()  # a second close (leaving the block after close()) changes nothing
    assert state.owner is Owner.LEFT


def test_landed_offsets_are_the_acknowledged_ones_only() -> None:
    state = CommitState()
    state.post(A, 10)
    state.next_batch()
    state.settle(landed=True)
    state.post(A, 20)
    state.next_batch()
    state.settle(landed=False)
    assert state.landed() == {A: 10}
    assert state.pending() == {} and state.behind() == {A: 20}


# --------------------------------------------------------------------------- the owner


class _HeldConsumer:
    """A commit consumer whose commits return only when ``release`` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.pending = 0
        self.committed: list[list[tuple[str, int, int]]] = []
        self.closed_while_pending = False
        self.closed = threading.Event()

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
        assert asynchronous is False
        self.pending += 1
        self.started.set()
        self.release.wait()
        self.pending -= 1
        self.committed.append([(tp.topic, tp.partition, tp.offset) for tp in offsets])

    def poll(self, timeout: float = -1) -> None:
        pass

    def close(self) -> None:
        self.closed_while_pending = self.pending > 0
        self.closed.set()


def test_a_posted_offset_is_committed_synchronously_by_the_committers_own_consumer(
        sleeps: list[float]) -> None:
    consumer = FakeConsumer([])
    marks: list[str] = []
    group = committer_of(consumer, on_commit=lambda: marks.append("committed"))
    group.post(TOPIC, 3, 42)
    assert group.close() is True
    assert consumer.commits == [([(TOPIC, 3, 42)], False)]
    assert group.landed() == {(TOPIC, 3): 42}
    assert marks == ["committed"]
    assert consumer.closed  # by the committer's thread, with nothing pending
    assert sleeps == []


def test_nothing_posted_makes_no_consumer_and_closes_at_once() -> None:
    made: list[Any] = []
    group = GroupCommitter(lambda: made.append(1), GROUP, timeout_s=5.0)
    started = time.monotonic()
    assert group.close() is True
    assert time.monotonic() - started < 1.0
    assert made == []


def test_an_answered_error_is_retried_with_a_growing_back_off(sleeps: list[float]) -> None:
    # A transient broker hiccup must not cost the commit.
    consumer = FakeConsumer([], commit_failures=1)
    group = committer_of(consumer)
    group.post(TOPIC, 3, 42)
    assert group.close() is True
    assert consumer.commits == [([(TOPIC, 3, 42)], False)] * 2
    assert sleeps == pytest.approx([0.2])


def test_a_commit_that_keeps_failing_gives_up_after_three_tries_without_raising(
        sleeps: list[float]) -> None:
    # Postgres is the source of truth: a lost group commit must never fail the ingest.
    consumer = FakeConsumer([], commit_failures=5)
    group = committer_of(consumer)
    group.post(TOPIC, 3, 42)
    assert group.close() is False
    assert len(consumer.commits) == 3
    assert sleeps == pytest.approx([0.2, 0.4])
    assert group.landed() == {}


class _TimingOutConsumer(FakeConsumer):
    """Every commit ends in librdkafka's local time-out (the coordinator did not answer)."""

    def commit(self, offsets: list[TopicPartition] | None = None,
               asynchronous: bool = True) -> None:
        self.commits.append(([(tp.topic, tp.partition, tp.offset) for tp in offsets or []],
                             asynchronous))
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "not answered"))


def test_a_commit_the_coordinator_left_unanswered_is_not_retried(sleeps: list[float]) -> None:
    # Retrying would cost three time-outs while the coordinator is silent; the next post,
    # or the next live run's re-sync, catches up instead.
    consumer = _TimingOutConsumer([])
    group = committer_of(consumer)
    group.post(TOPIC, 3, 42)
    assert group.close() is False
    assert len(consumer.commits) == 1
    assert sleeps == []


def test_offsets_posted_during_a_commit_are_coalesced_and_never_land_out_of_order() -> None:
    # While offset 10 is on its way, 20 and 30 are posted: the next commit carries 30 only,
    # so the group never goes back from a newer offset to an older one.
    consumer = _HeldConsumer()
    group = committer_of(consumer)
    group.post(TOPIC, 3, 10)
    assert consumer.started.wait(5)
    group.post(TOPIC, 3, 20)
    group.post(TOPIC, 3, 30)
    group.post(TOPIC, 4, 7)
    consumer.release.set()
    assert group.close() is True
    assert consumer.committed == [[(TOPIC, 3, 10)], [(TOPIC, 3, 30), (TOPIC, 4, 7)]]
    assert group.landed() == {(TOPIC, 3): 30, (TOPIC, 4): 7}


def test_posting_never_waits_for_a_commit_in_flight() -> None:
    consumer = _HeldConsumer()
    group = committer_of(consumer)
    group.post(TOPIC, 3, 10)
    assert consumer.started.wait(5)
    started = time.monotonic()
    for offset in range(11, 1000):
        group.post(TOPIC, 3, offset)
    assert time.monotonic() - started < 1.0
    consumer.release.set()
    assert group.close() is True
    assert consumer.committed[-1] == [(TOPIC, 3, 999)]


def test_close_waits_at_most_its_timeout_and_never_closes_a_consumer_with_a_commit_pending(
        ) -> None:
    # A silent coordinator: the commit does not return. close() gives up after its
    # time-out; the consumer is left to the committer's thread, which closes it only once
    # librdkafka returns (closing it earlier would hang: librdkafka #3740).
    consumer = _HeldConsumer()
    group = committer_of(consumer, timeout_s=0.3)
    group.post(TOPIC, 3, 10)
    assert consumer.started.wait(5)
    started = time.monotonic()
    assert group.close() is False
    waited = time.monotonic() - started
    assert 0.25 < waited < 2.0
    assert not consumer.closed.is_set()
    consumer.release.set()  # librdkafka returns at last
    assert consumer.closed.wait(5)
    assert consumer.closed_while_pending is False
    assert consumer.committed == [[(TOPIC, 3, 10)]]


def test_leaving_the_block_on_an_error_waits_no_longer_than_the_timeout() -> None:
    # The owner is failing anyway (a database error): the group commit adds at most its
    # time-out to the failure, and its consumer is not closed under its thread.
    consumer = _HeldConsumer()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="the slice failed"), \
            committer_of(consumer, timeout_s=0.3) as group:
        group.post(TOPIC, 3, 10)
        assert consumer.started.wait(5)
        raise RuntimeError("the slice failed")
    assert time.monotonic() - started < 2.0
    consumer.release.set()
    assert consumer.closed.wait(5)
    assert consumer.closed_while_pending is False
    with pytest.raises(RuntimeError, match="closed"):
        group.post(TOPIC, 3, 11)


def test_an_interrupt_during_the_wait_leaves_the_commit_to_its_thread() -> None:
    # Airflow's execution_timeout raises from a SIGALRM handler in the main thread, in the
    # middle of whatever waits there. Interrupted in close(), the owner goes on failing at
    # once; the consumer with the commit pending is closed by the thread, after librdkafka
    # returns, never under it (which would hang: librdkafka #3740).
    consumer = _HeldConsumer()
    group = committer_of(consumer, timeout_s=30.0)
    group.post(TOPIC, 3, 10)
    assert consumer.started.wait(5)
    started = time.monotonic()
    with task_timeout_after(0.3), pytest.raises(TaskTimeout):
        group.close()
    assert time.monotonic() - started < 3.0
    assert not consumer.closed.is_set()
    consumer.release.set()
    assert consumer.closed.wait(5)
    assert consumer.closed_while_pending is False




def test_a_commit_waiting_for_a_coordinator_is_not_retried(sleeps: list[float]) -> None:
    # librdkafka's "waiting for coordinator" (_WAIT_COORD) after session.timeout.ms: a
    # retry would only wait as long again.
    class NoCoordinator(FakeConsumer):
        def commit(self, offsets: list[TopicPartition] | None = None,
                   asynchronous: bool = True) -> None:
            self.commits.append(([], asynchronous))
            raise KafkaException(KafkaError(KafkaError._WAIT_COORD, "Waiting for coordinator"))

    consumer = NoCoordinator([])
    group = committer_of(consumer)
    group.post(TOPIC, 3, 42)
    assert group.close() is False
    assert len(consumer.commits) == 1 and sleeps == []


def test_close_returns_after_the_commit_is_marked_and_the_consumer_closed() -> None:
    # The owner's return means the committer is done: its mark (the crash tests kill at
    # it) was made and its consumer closed, nothing of it left running.
    consumer = FakeConsumer([])
    marks: list[bool] = []

    def slow_mark() -> None:
        time.sleep(0.2)
        marks.append(consumer.closed)

    group = committer_of(consumer, on_commit=slow_mark)
    group.post(TOPIC, 3, 42)
    assert group.close() is True
    assert marks == [False] and consumer.closed
    assert not any(t.name == f"group-commit-{GROUP}" for t in threading.enumerate())


def test_a_committer_whose_thread_died_says_so_and_costs_no_wait(
        caplog: pytest.LogCaptureFixture) -> None:
    # A bug in the thread (here the mark raising) must not turn every later close() into
    # a full time-out with a false "not answered", nor hang a post.
    consumer = FakeConsumer([])

    def broken_mark() -> None:
        raise RuntimeError("a bug")

    group = committer_of(consumer, timeout_s=30.0, on_commit=broken_mark)
    group.post(TOPIC, 3, 42)
    deadline = time.monotonic() + 10
    while "the committer stopped" not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.01)
    group.post(TOPIC, 3, 43)  # dropped, not waited for
    started = time.monotonic()
    assert group.close() is False
    assert time.monotonic() - started < 2.0
    assert "not answered" not in caplog.text
    assert consumer.closed


def test_a_consumer_that_cannot_be_made_is_logged_not_raised(
        caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> Any:
        raise ValueError("bad config")

    group = GroupCommitter(broken, GROUP, timeout_s=5.0)
    group.post(TOPIC, 3, 10)
    assert group.close() is False
    assert "the committer stopped" in caplog.text


# --------------------------------------------------------------------------- real librdkafka


def test_a_group_nobody_answers_costs_the_owner_socket_timeout_and_no_hang() -> None:
    # librdkafka's synchronous commit with no coordinator waits session.timeout.ms (45 s by
    # default), and a consumer with it pending waits as long in close(). The owner waits
    # at most socket.timeout.ms and its reading consumer closes at once; the commit's
    # thread gives up when librdkafka does (_WAIT_COORD: not retried) and then ends.
    clients = KafkaClients({**NOWHERE, "socket.timeout.ms": 500, "session.timeout.ms": 1500})
    reading = clients.consumer(GROUP)
    group = clients.committer(GROUP)
    assert group.timeout_s == 0.5
    started = time.monotonic()
    group.post(TOPIC, 0, 5)
    assert group.close() is False
    assert 0.4 < time.monotonic() - started < 3.0
    started = time.monotonic()
    reading.close()
    assert time.monotonic() - started < 2.0
    (thread,) = [t for t in threading.enumerate() if t.name == f"group-commit-{GROUP}"]
    thread.join(30)  # session.timeout.ms and a margin: one try, no retry
    assert not thread.is_alive()


def _consumer_in_a_spawned_worker(clients: KafkaClients) -> str:
    consumer = clients.consumer("kafka-ingest.test")
    try:
        return str(clients.config["bootstrap.servers"])
    finally:
        consumer.close()


def test_clients_cross_to_a_spawned_worker_and_work_there() -> None:
    # `kafka-ingest run --workers N` ingests partitions in spawned processes: the clients
    # are pickled to them and must make working consumers there.
    clients = KafkaClients(dict(NOWHERE))
    spawn = multiprocessing.get_context("spawn")
    with spawn.Pool(1) as pool:
        assert pool.apply(_consumer_in_a_spawned_worker, (clients,), ) == "127.0.0.1:1"
