"""Offsets told to a consumer group, for lag tools: in the background, bounded, best effort.

The stored offset in Postgres is the truth (DESIGN §3); the group's committed offset is a
copy for ``kafka-consumer-groups``, Burrow and Kafka Exporter. So a group commit never
holds up a chunk, never fails a slice, and never outlives its owner's wait:

- :meth:`GroupCommitter.post` records the offset wanted for a partition and returns at
  once; a thread of the committer's own commits it (newest wins: offsets posted while a
  commit is on its way are coalesced into the next one, so one committer's commits reach
  the coordinator in order and an older offset never lands after a newer one);
- :meth:`GroupCommitter.close` waits at most ``timeout_s`` for what was posted to land and
  for the thread to end.

The rules live in :class:`CommitState`, a state machine without threads, clients or a
clock (post / next batch / settle; close / stop waiting): the owner's and the thread's
events go in, what to commit next and what the group lacks come out, and each rule is
tested with plain values. :class:`GroupCommitter` is the thin owner around it: one lock
over the state (never held across I/O), the thread, its consumer, the waits::

    owner   post 3   post 6   post 9 ......... close: wait <= timeout_s | stop waiting
    thread    [commit 3] [commit 9 (6 coalesced)] ..... [STOP: close consumer, end]

librdkafka's synchronous commit has no time-out of its own: with no coordinator it waits
up to ``session.timeout.ms`` (45 s by default), with one that is connected but silent
longer still, and a consumer with a commit pending makes ``close()`` wait as long (for
good, in librdkafka issue #3740). So the committer commits through a consumer of its own
(same config and group; it never joins the group), owned by its thread: only that thread
closes it, and only once no commit of it is pending. A commit still unanswered when the
owner stops waiting is left to that thread on purpose (named ``group-commit-<group>``): it
is not retried, the thread closes its consumer when librdkafka returns, or it ends with
the process. The owner's reading consumer never has a commit pending, so its own
``close()`` is immediate.

A commit the cluster answers with an error is retried (``attempts`` in all, with a short
back-off) unless a newer offset was posted meanwhile or the owner gave up waiting; one
the client gave up on (no answer, no coordinator) is not retried. Either way the next
post, or the next live run's re-sync (:mod:`kafka_ingest.engine.planning`), catches the
group up. (Two committers of one group, a slice's and a plan's re-sync, are not ordered
with each other: the next re-sync mends what one left behind.)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from types import TracebackType
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

log = logging.getLogger(__name__)

#: Tries per offset when the cluster answers with an error (not when it is silent).
ATTEMPTS = 3
BACKOFF_S = 0.2
#: The idle thread's wait for a post or a close, which both wake it at once: this only
#: bounds the wait (it then looks again).
IDLE_CHECK_S = 1.0
#: librdkafka's codes for "the client gave up waiting": retrying only waits again.
_UNANSWERED = frozenset({KafkaError._TIMED_OUT, KafkaError._WAIT_COORD,
                         KafkaError._TIMED_OUT_QUEUE, KafkaError._TRANSPORT})

Position = tuple[str, int]
#: Offsets by (topic, partition): a commit's worth.
Batch = dict[Position, int]


# --------------------------------------------------------------------------- the protocol


class Owner(Enum):
    """Where the committer's owner is."""

    #: It posts offsets.
    POSTING = "posting"
    #: It closed the committer and waits for what it posted to be tried.
    WAITING = "waiting"
    #: It stopped waiting (all tried, or its time-out, or an interrupt): what is still
    #: pending is tried once more at most, never retried.
    LEFT = "left"


class Idle(Enum):
    """:meth:`CommitState.next_batch`'s answers when there is nothing to commit."""

    #: Wait for a post (or the owner's close).
    WAIT = "wait"
    #: Nothing more will come (the owner closed, or the thread failed): end.
    STOP = "stop"


@dataclass(frozen=True)
class Settlement:
    """What the owner learns when it stops waiting."""

    #: Posted offsets the group has not acknowledged.
    behind: Batch
    #: Of them, those still on their way: left to the committer's thread.
    unanswered: Batch


class CommitState:
    """The group committer's rules, without threads, clients or a clock (sans-I/O).

    The owner's events: :meth:`post`, :meth:`close`, :meth:`stop_waiting`. The thread's:
    :meth:`next_batch`, then :meth:`settle` (or :meth:`failed`), asking :meth:`retry` after
    an error the cluster answered. The rules:

    - newest wins: a position's offset posted while another is on its way replaces it in
      the next batch, so batches go out one at a time, in order, and an older offset never
      lands after a newer one;
    - an offset already tried to the end (landed or given up) is not tried again, even if
      posted again;
    - an answered error is retried unless a newer offset was posted meanwhile (the next
      batch carries it) or the owner left;
    - nothing can be posted once the owner closed; a post after the thread failed is
      dropped (the next live run re-syncs the group), and nothing is waited for;
    - the owner's wait is over once every posted offset was tried to the end, or the
      thread failed (:attr:`done`).
    """

    def __init__(self) -> None:
        self._wanted: Batch = {}  # the newest offset posted per position
        self._settled: Batch = {}  # the last offset tried to the end
        self._landed: Batch = {}  # the last offset the group acknowledged
        self._in_flight: Batch | None = None
        self.owner = Owner.POSTING
        #: What the thread died of, if it did.
        self.failure: BaseException | None = None

    # ------------------------------------------------------------------ the owner's events

    def post(self, position: Position, offset: int) -> bool:
        """The owner wants ``offset`` committed for ``position``. Returns whether it was
        taken (False: the thread failed, and it is dropped)."""
        if self.owner is not Owner.POSTING:
            raise RuntimeError("the committer is closed: nothing can be posted after close()")
        if self.failure is not None:
            return False
        self._wanted[position] = offset
        return True

    def close(self) -> None:
        """The owner closes the committer and waits for what it posted."""
        if self.owner is Owner.POSTING:
            self.owner = Owner.WAITING

    @property
    def done(self) -> bool:
        """Whether the owner's wait is over: every posted offset tried to the end, or the
        thread failed."""
        return self.failure is not None or not self.pending()

    def stop_waiting(self) -> Settlement:
        """The owner stops waiting (done, its time-out, or an interrupt)."""
        unanswered = self.pending() if self.failure is None else {}
        self.owner = Owner.LEFT
        return Settlement(self.behind(), unanswered)

    # ------------------------------------------------------------------ the thread's events

    def next_batch(self) -> Batch | Idle:
        """What to commit next: the pending offsets, newest only; or what to do instead."""
        if self._in_flight is not None:
            raise RuntimeError(f"a batch is on its way ({self._in_flight}): settle it first")
        if self.failure is not None:
            return Idle.STOP
        pending = self.pending()
        if pending:
            self._in_flight = pending
            return dict(pending)
        return Idle.WAIT if self.owner is Owner.POSTING else Idle.STOP

    def retry(self) -> bool:
        """Whether to try the batch on its way again, after an error the cluster answered."""
        batch = self._on_its_way()
        return (self.owner is not Owner.LEFT
                and all(self._wanted.get(p) == o for p, o in batch.items()))

    def settle(self, *, landed: bool) -> None:
        """The batch on its way was tried to the end: acknowledged by the group, or not."""
        batch = self._on_its_way()
        self._settled.update(batch)
        if landed:
            self._landed.update(batch)
        self._in_flight = None

    def failed(self, exc: BaseException) -> None:
        """The thread died of ``exc``: nothing more is committed or waited for."""
        self.failure = exc
        self._in_flight = None

    # ------------------------------------------------------------------ questions

    def pending(self) -> Batch:
        """Posted offsets not yet tried to the end (the one on its way included)."""
        return {p: o for p, o in self._wanted.items() if self._settled.get(p) != o}

    def behind(self) -> Batch:
        """Posted offsets the group has not acknowledged."""
        return {p: o for p, o in self._wanted.items() if self._landed.get(p) != o}

    def landed(self) -> Batch:
        """The offsets the group acknowledged."""
        return dict(self._landed)

    def _on_its_way(self) -> Batch:
        if self._in_flight is None:
            raise RuntimeError("no batch is on its way")
        return self._in_flight


# --------------------------------------------------------------------------- the owner


class GroupCommitter:
    """Commits offsets to one consumer group from a thread and a consumer of its own.

    Used as a context manager by the one function that owns it (a slice, a plan, the
    hook): ``post`` offsets, then ``close`` (or leave the block, also on an error) to wait
    for them, at most ``timeout_s``. The rules are :class:`CommitState`'s; this class does
    the I/O: the thread (``group-commit-<group>``, started by the first post), its
    consumer (made and closed by that thread only), the commits and the waits.
    """

    def __init__(self, make_consumer: Callable[[], Any], group_id: str, *, timeout_s: float,
                 on_commit: Callable[[], None] | None = None,
                 attempts: int = ATTEMPTS) -> None:
        self._make_consumer = make_consumer
        self.group_id = group_id
        self.timeout_s = timeout_s
        self._on_commit = on_commit
        self._attempts = attempts
        #: Guards the state and the thread's handle; notified at every change. Held for
        #: bookkeeping only, never across a commit or a consumer call.
        self._guard = threading.Condition()
        self._state = CommitState()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the owner's side

    def post(self, topic: str, partition: int, next_offset: int) -> None:
        """Have ``next_offset`` committed for ``topic[partition]``; returns at once."""
        with self._guard:
            if not self._state.post((topic, partition), next_offset):
                return  # logged when it died; the next live run re-syncs the group
            if self._thread is None:
                thread = threading.Thread(target=self._run, daemon=True,
                                          name=f"group-commit-{self.group_id}")
                thread.start()
                self._thread = thread
            self._guard.notify_all()

    def close(self, timeout_s: float | None = None) -> bool:
        """Wait at most ``timeout_s`` (default: the committer's) for every posted offset to
        be tried and for the thread to end; return whether the group has them all.

        An interrupt during the wait ends it too: the owner has left, and what is still on
        its way is the thread's to finish (it is not retried)."""
        wait_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + wait_s
        with self._guard:
            self._state.close()
            self._guard.notify_all()
            try:
                while not self._state.done and self._guard.wait(
                        max(0.0, deadline - time.monotonic())):
                    pass
            finally:
                settled = self._state.stop_waiting()
            thread = self._thread
        if settled.unanswered:
            log.warning("group %s: commit of %s not answered within %.3g s; left to its "
                        "thread (the stored offsets are the truth; the next live run "
                        "re-syncs the group)", self.group_id, _describe(settled.unanswered),
                        wait_s)
            return not settled.behind
        if thread is not None:  # nothing pending: it closes its consumer and ends
            thread.join(max(0.0, deadline - time.monotonic()))
        if settled.behind:
            log.warning("group %s: %s not committed (see the warnings above); the next "
                        "live run re-syncs the group", self.group_id,
                        _describe(settled.behind))
        return not settled.behind

    def landed(self) -> Batch:
        """The offsets the group has acknowledged, by (topic, partition)."""
        with self._guard:
            return self._state.landed()

    def __enter__(self) -> GroupCommitter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # ------------------------------------------------------------------ the thread's side

    def _run(self) -> None:
        consumer: Any = None
        try:
            while (batch := self._next_batch()) is not None:
                if consumer is None:
                    consumer = self._make_consumer()
                landed = self._commit(consumer, batch)
                consumer.poll(0)  # serves librdkafka's logs; it is assigned nothing
                if landed and self._on_commit is not None:
                    self._on_commit()  # before the owner can see it settled
                with self._guard:
                    self._state.settle(landed=landed)
                    self._guard.notify_all()
        except Exception as exc:  # a bug here must not pass silently, nor fail a slice
            log.exception("group %s: the committer stopped; the next live run re-syncs the "
                          "group", self.group_id)
            with self._guard:
                self._state.failed(exc)
                self._guard.notify_all()
        finally:
            if consumer is not None:
                consumer.close()  # nothing of it is pending any more: immediate

    def _next_batch(self) -> Batch | None:
        """Wait for the next batch to commit; ``None``: end."""
        with self._guard:
            while (step := self._state.next_batch()) is Idle.WAIT:
                self._guard.wait(IDLE_CHECK_S)
            return step if isinstance(step, dict) else None

    def _retry(self) -> bool:
        with self._guard:
            return self._state.retry()

    def _commit(self, consumer: Any, batch: Batch) -> bool:
        """Commit ``batch`` synchronously, retrying answered errors; never raise."""
        offsets = [TopicPartition(t, p, o) for (t, p), o in sorted(batch.items())]
        for attempt in range(1, self._attempts + 1):
            try:
                consumer.commit(offsets=offsets, asynchronous=False)
                return True
            except KafkaException as exc:
                silent = _not_answered(exc)
                log.warning("group %s: commit of %s failed (attempt %d/%d): %s%s",
                            self.group_id, _describe(batch), attempt, self._attempts, exc,
                            "; not retried: the client gave up waiting" if silent else "")
                if silent or not self._retry():
                    return False
                if attempt < self._attempts:
                    time.sleep(BACKOFF_S * attempt)
        return False


def _describe(offsets: Batch) -> str:
    return ", ".join(f"{t}[{p}]={o}" for (t, p), o in sorted(offsets.items()))


def _not_answered(exc: KafkaException) -> bool:
    """Whether the client gave up waiting (no answer, no coordinator), as opposed to an
    error the cluster answered with."""
    err = exc.args[0] if exc.args else None
    return isinstance(err, KafkaError) and err.code() in _UNANSWERED


__all__ = ["ATTEMPTS", "CommitState", "GroupCommitter", "Idle", "Owner", "Settlement"]
