"""How a slice's stages overlap (``kafka_ingest.engine.stages.run_stages``), with plain stages.

Each rule of the module's docstring gets a test here, run with stage functions that record
what happens in one ``events`` list (appends are atomic: it is a true order). Where a rule
is about two threads meeting, the stages wait for each other on ``threading.Event``s with
a deadline, never on a sleep: a rule broken shows as a wait that timed out.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import pytest

from kafka_ingest.engine import stages
from kafka_ingest.engine.stages import run_stages
from tests.support.interrupts import TaskTimeout

WAIT_S = 10.0  # a deadline for what must happen at once; a wait this long is a failure


class Chunk:
    """A chunk: a number, and weakly referable (to see when the engine lets it go)."""

    def __init__(self, k: int) -> None:
        self.k = k


def chunks(n: int) -> Iterator[Chunk]:
    """Chunks 1..n, made as they are read (the test keeps none of them)."""
    for k in range(1, n + 1):
        yield Chunk(k)


@dataclass
class Recorder:
    """Stages that record ``(stage, k, "begin" | "end")``; ``on_prepare`` and
    ``on_transact`` run inside a stage, before it ends (``k`` given)."""

    events: list[tuple[str, int, str]] = field(default_factory=list)
    on_prepare: Callable[[int], None] = lambda k: None
    on_transact: Callable[[int], None] = lambda k: None
    alive: dict[int, weakref.ref[Chunk]] = field(default_factory=dict)

    def prepare(self, chunk: Chunk) -> Chunk:
        self.events.append(("prepare", chunk.k, "begin"))
        self.alive[chunk.k] = weakref.ref(chunk)
        self.on_prepare(chunk.k)
        self.events.append(("prepare", chunk.k, "end"))
        return chunk

    def transact(self, prepared: Chunk) -> Chunk:
        self.events.append(("transact", prepared.k, "begin"))
        self.on_transact(prepared.k)
        self.events.append(("transact", prepared.k, "end"))
        return prepared

    def post(self, done: Chunk) -> None:
        self.events.append(("post", done.k, "end"))

    def describe(self, prepared: Chunk) -> str:
        return f"chunk {prepared.k}"

    def at(self, stage: str, k: int, edge: str) -> int:
        return self.events.index((stage, k, edge))

    def of(self, stage: str) -> list[int]:
        return [k for s, k, edge in self.events if s == stage and edge == "end"]


def no_transaction_thread_left() -> bool:
    return not any(t.name.startswith("transaction-") for t in threading.enumerate())


def test_every_chunk_goes_through_every_stage_in_chunk_order() -> None:
    r = Recorder()
    run_stages(chunks(5), r, name="transaction-test")
    assert r.of("prepare") == r.of("transact") == r.of("post") == [1, 2, 3, 4, 5]
    assert no_transaction_thread_left()


def test_one_transaction_at_a_time() -> None:
    # Each transaction begins only once the one before it ended. Transaction k lasts until
    # chunk k+1 is prepared and then gives a second transaction a moment to begin beside
    # it (a wrong engine would start one; a right one cannot, so that moment just passes).
    prepared = {k: threading.Event() for k in range(1, 6)}
    began = {k: threading.Event() for k in range(1, 6)}
    beside: dict[int, bool] = {}

    def transact(k: int) -> None:
        began[k].set()
        if k + 1 in prepared:
            assert prepared[k + 1].wait(WAIT_S)
            beside[k] = began[k + 1].wait(0.05)

    r = Recorder(on_prepare=lambda k: prepared[k].set(), on_transact=transact)
    run_stages(chunks(5), r, name="transaction-test")
    assert beside == dict.fromkeys(range(1, 5), False)
    spans = [(r.at("transact", k, "begin"), r.at("transact", k, "end")) for k in range(1, 6)]
    assert all(end < next_begin for (_, end), (next_begin, _) in pairwise(spans))


def test_preparing_the_next_chunk_overlaps_the_transaction() -> None:
    # Transaction k waits for chunk k+1 to be prepared: possible only if the two overlap.
    prepared = {k: threading.Event() for k in range(1, 5)}
    overlapped: dict[int, bool] = {}

    def transact(k: int) -> None:
        if k + 1 in prepared:
            overlapped[k] = prepared[k + 1].wait(WAIT_S)

    r = Recorder(on_prepare=lambda k: prepared[k].set(), on_transact=transact)
    run_stages(chunks(4), r, name="transaction-test")
    assert overlapped == {1: True, 2: True, 3: True}


def test_at_most_two_chunks_are_held() -> None:
    # While chunk k+2 is prepared, chunk k (transacted and posted) is let go: only k+1 (in
    # its transaction) and k+2 are held.
    held: dict[int, list[int]] = {}

    def prepare(k: int) -> None:
        held[k] = sorted(j for j, ref in r.alive.items() if ref() is not None)

    r = Recorder(on_prepare=prepare)
    run_stages(chunks(6), r, name="transaction-test")
    assert held == {1: [1], 2: [1, 2], 3: [2, 3], 4: [3, 4], 5: [4, 5], 6: [5, 6]}


def test_a_chunk_is_posted_only_after_its_transaction_ended() -> None:
    r = Recorder()
    run_stages(chunks(4), r, name="transaction-test")
    for k in range(1, 5):
        assert r.at("transact", k, "end") < r.at("post", k, "end")
    # ... and once chunk k+1 was handed off: posting never holds up the next transaction
    for k in range(1, 4):
        assert r.at("prepare", k + 1, "end") < r.at("post", k, "end")


def test_a_failed_transaction_is_raised_at_the_next_hand_off_and_nothing_after_it_runs(
        ) -> None:
    def transact(k: int) -> None:
        if k == 2:
            raise RuntimeError("transaction 2 failed")

    r = Recorder(on_transact=transact)
    with pytest.raises(RuntimeError, match="transaction 2 failed"):
        run_stages(chunks(5), r, name="transaction-test")
    assert r.of("transact") == [1]  # 2 began, never ended
    assert r.of("post") == [1]
    assert r.of("prepare") == [1, 2, 3]  # 3 was being handed off when 2's failure came
    assert no_transaction_thread_left()


class _Waits:
    """``stages.wait`` as the engine calls it, watched: ``leaving`` is set when the slice's
    thread first waits for a transaction after it began to leave (``begun``), ``again``
    when it waits once more; ``interrupt`` raises in the first of those waits (Airflow's
    time-out arriving while the slice waits)."""

    def __init__(self, begun: threading.Event, *, interrupt: bool) -> None:
        self.real = stages.wait
        self.begun = begun
        self.interrupt = interrupt
        self.leaving = threading.Event()
        self.again = threading.Event()

    def __call__(self, futures: Any, timeout: float | None = None) -> Any:
        if self.begun.is_set():
            if self.leaving.is_set():
                self.again.set()
            else:
                self.leaving.set()
                if self.interrupt:
                    raise TaskTimeout("Timeout, PID: 1")
        return self.real(futures, timeout=timeout)


def test_an_error_while_preparing_waits_for_the_transaction_in_flight(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Preparing chunk 3 fails while chunk 2's transaction runs: the error is raised only
    # once that transaction ended, never under it (the slice's lock and connection are
    # released right after).
    failing = threading.Event()
    waits = _Waits(failing, interrupt=False)
    monkeypatch.setattr(stages, "wait", waits)
    seen: dict[str, bool] = {}

    def transact(k: int) -> None:
        if k == 2:
            seen["slice waited for it"] = waits.leaving.wait(WAIT_S)

    def prepare(k: int) -> None:
        if k == 3:
            failing.set()
            raise RuntimeError("prepare failed")

    r = Recorder(on_prepare=prepare, on_transact=transact)
    with pytest.raises(RuntimeError, match="prepare failed"):
        run_stages(chunks(5), r, name="transaction-test")
    assert seen == {"slice waited for it": True}
    assert r.of("transact") == [1, 2]
    assert no_transaction_thread_left()


def test_an_interrupt_while_leaving_is_raised_once_the_transaction_in_flight_ended(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # As above, and Airflow's time-out arrives while the slice waits for chunk 2's
    # transaction: the slice waits on (the transaction ends first), then raises the
    # interrupt, which wins over the prepare's error.
    failing = threading.Event()
    waits = _Waits(failing, interrupt=True)
    monkeypatch.setattr(stages, "wait", waits)
    seen: dict[str, bool] = {}

    def transact(k: int) -> None:
        if k == 2:
            seen["waited on after the interrupt"] = waits.again.wait(WAIT_S)

    def prepare(k: int) -> None:
        if k == 3:
            failing.set()
            raise RuntimeError("prepare failed")

    r = Recorder(on_prepare=prepare, on_transact=transact)
    with pytest.raises(TaskTimeout):
        run_stages(chunks(5), r, name="transaction-test")
    assert seen == {"waited on after the interrupt": True}
    assert r.of("transact") == [1, 2]
    assert r.of("post") == [1]
    assert no_transaction_thread_left()


def test_a_long_wait_for_a_transaction_names_its_chunk(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # Every NAG_S of waiting, the slice says which chunk's transaction it waits for.
    monkeypatch.setattr(stages.TransactionThread, "NAG_S", 0.01)
    nag = "chunk 1: still waiting for its transaction"

    def transact(k: int) -> None:  # chunk 1's transaction lasts until the slice said so
        deadline = time.monotonic() + WAIT_S
        while k == 1 and nag not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.01)

    with caplog.at_level("WARNING", logger="kafka_ingest.engine.stages"):
        run_stages(chunks(2), Recorder(on_transact=transact), name="transaction-test")
    assert nag in caplog.text


def test_an_interrupt_inside_the_hand_off_still_waits_for_the_transaction_it_started(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Airflow's time-out lands inside the hand-off, after the thread was given the
    # transaction (it runs) but before the hand-off returned, and again while the slice
    # leaves (in the pool's shutdown, which joins the thread). Leaving must wait for that
    # transaction all the same: the slice's lock and connection go right after.
    started, release, ended = threading.Event(), threading.Event(), []

    def job() -> str:
        started.set()
        release.wait(WAIT_S)
        ended.append("chunk 1")
        return "done"

    transactions: stages.TransactionThread[str] = stages.TransactionThread("transaction-test")
    pool = transactions._pool
    real_submit, real_shutdown = pool.submit, pool.shutdown

    def submit_then_interrupt(*args: Any, **kwargs: Any) -> Any:
        real_submit(*args, **kwargs)
        assert started.wait(WAIT_S)
        threading.Timer(0.3, release.set).start()  # the transaction ends a moment later
        raise TaskTimeout("Timeout, PID: 1")

    def shutdown_interrupted(*args: Any, **kwargs: Any) -> None:
        raise TaskTimeout("Timeout, PID: 1")  # the second interrupt cuts the join short

    monkeypatch.setattr(pool, "submit", submit_then_interrupt)
    monkeypatch.setattr(pool, "shutdown", shutdown_interrupted)
    try:
        with pytest.raises(TaskTimeout), transactions:
            transactions.hand_off(job, "chunk 1")
        assert ended == ["chunk 1"], "the slice left while its transaction ran"
    finally:
        release.set()
        real_shutdown(wait=True)
    assert no_transaction_thread_left()


def test_an_interrupt_before_the_thread_took_the_transaction_cancels_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The time-out lands in the hand-off before the thread was given the transaction: the
    # way out neither waits for a transaction that will never start (a hang) nor lets it
    # start later.
    ran: list[str] = []
    transactions: stages.TransactionThread[None] = stages.TransactionThread("transaction-test")

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise TaskTimeout("Timeout, PID: 1")

    monkeypatch.setattr(transactions._pool, "submit", interrupted)
    with pytest.raises(TaskTimeout), transactions:
        transactions.hand_off(lambda: ran.append("chunk 1"), "chunk 1")
    assert ran == []
    assert no_transaction_thread_left()
