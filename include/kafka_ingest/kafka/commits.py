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
from types import TracebackType
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

log = logging.getLogger(__name__)

#: Tries per offset when the cluster answers with an error (not when it is silent).
ATTEMPTS = 3
BACKOFF_S = 0.2
#: How often the idle thread looks whether its owner closed it without telling it (an
#: interrupt inside :meth:`GroupCommitter.close`).
IDLE_CHECK_S = 1.0
#: librdkafka's codes for "the client gave up waiting": retrying only waits again.
_UNANSWERED = frozenset({KafkaError._TIMED_OUT, KafkaError._WAIT_COORD,
                         KafkaError._TIMED_OUT_QUEUE, KafkaError._TRANSPORT})

Position = tuple[str, int]


class GroupCommitter:
    """Commits offsets to one consumer group from a thread and a consumer of its own.

    Used as a context manager by the one function that owns it (a slice, a plan, the
    hook): ``post`` offsets, then ``close`` (or leave the block, also on an error) to wait
    for them, at most ``timeout_s``.
    """

    def __init__(self, make_consumer: Callable[[], Any], group_id: str, *, timeout_s: float,
                 on_commit: Callable[[], None] | None = None,
                 attempts: int = ATTEMPTS) -> None:
        self._make_consumer = make_consumer
        self.group_id = group_id
        self.timeout_s = timeout_s
        self._on_commit = on_commit
        self._attempts = attempts
        self._changed = threading.Condition()
        self._wanted: dict[Position, int] = {}  # guarded by _changed, like the fields below
        self._settled: dict[Position, int] = {}  # the last offset tried to the end
        self._landed: dict[Position, int] = {}  # the last offset the group acknowledged
        self._closing = False  # set without the lock too (see close): a plain flag
        self._abandoned = False  # the owner stopped waiting: no more retries
        self._failed: BaseException | None = None  # the thread died of it
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the owner's side

    def post(self, topic: str, partition: int, next_offset: int) -> None:
        """Have ``next_offset`` committed for ``topic[partition]``; returns at once."""
        with self._changed:
            if self._closing:
                raise RuntimeError(f"the committer of group {self.group_id} is closed")
            if self._failed is not None:
                return  # logged when it died; the next live run re-syncs the group
            self._wanted[(topic, partition)] = next_offset
            if self._thread is None:
                thread = threading.Thread(target=self._run, daemon=True,
                                          name=f"group-commit-{self.group_id}")
                thread.start()
                self._thread = thread
            self._changed.notify_all()

    def close(self, timeout_s: float | None = None) -> bool:
        """Wait at most ``timeout_s`` (default: the committer's) for every posted offset to
        be tried and for the thread to end; return whether the group has them all."""
        self._closing = True  # first, so that an interrupt below still lets the thread go
        wait_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + wait_s
        with self._changed:
            self._changed.notify_all()
            while (self._pending() and self._failed is None
                   and self._changed.wait(max(0.0, deadline - time.monotonic()))):
                pass
            behind = {p: o for p, o in self._wanted.items() if self._landed.get(p) != o}
            unanswered = self._pending() if self._failed is None else {}
            self._abandoned = bool(unanswered)
            thread = self._thread
        if unanswered:
            log.warning("group %s: commit of %s not answered within %.3g s; left to its "
                        "thread (the stored offsets are the truth; the next live run "
                        "re-syncs the group)", self.group_id, _describe(unanswered), wait_s)
        else:
            if thread is not None:  # nothing pending: it closes its consumer and ends
                thread.join(max(0.0, deadline - time.monotonic()))
            if behind:
                log.warning("group %s: %s not committed (see the warnings above); the next "
                            "live run re-syncs the group", self.group_id, _describe(behind))
        return not behind

    def landed(self) -> dict[Position, int]:
        """The offsets the group has acknowledged, by (topic, partition)."""
        with self._changed:
            return dict(self._landed)

    def __enter__(self) -> GroupCommitter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # ------------------------------------------------------------------ the thread's side

    def _pending(self) -> dict[Position, int]:
        return {p: o for p, o in self._wanted.items() if self._settled.get(p) != o}

    def _next(self) -> dict[Position, int] | None:
        """What to commit next; ``None`` once closing with nothing left."""
        with self._changed:
            while not (pending := self._pending()):
                if self._closing:
                    return None
                self._changed.wait(IDLE_CHECK_S)
            return pending

    def _run(self) -> None:
        consumer: Any = None
        try:
            while (batch := self._next()) is not None:
                if consumer is None:
                    consumer = self._make_consumer()
                landed = self._commit(consumer, batch)
                consumer.poll(0)  # serves librdkafka's logs; it is assigned nothing
                if landed and self._on_commit is not None:
                    self._on_commit()  # before the owner can see it settled
                with self._changed:
                    self._settled.update(batch)
                    if landed:
                        self._landed.update(batch)
                    self._changed.notify_all()
        except Exception as exc:  # a bug here must not pass silently, nor fail a slice
            log.exception("group %s: the committer stopped; the next live run re-syncs the "
                          "group", self.group_id)
            with self._changed:
                self._failed = exc
                self._changed.notify_all()
        finally:
            if consumer is not None:
                consumer.close()  # nothing of it is pending any more: immediate

    def _give_up(self, batch: dict[Position, int]) -> bool:
        """Whether to stop retrying ``batch``: a newer offset came, or the owner left."""
        with self._changed:
            return self._abandoned or any(self._wanted.get(p) != o for p, o in batch.items())

    def _commit(self, consumer: Any, batch: dict[Position, int]) -> bool:
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
                if silent or self._give_up(batch):
                    return False
                if attempt < self._attempts:
                    time.sleep(BACKOFF_S * attempt)
        return False


def _describe(offsets: dict[Position, int]) -> str:
    return ", ".join(f"{t}[{p}]={o}" for (t, p), o in sorted(offsets.items()))


def _not_answered(exc: KafkaException) -> bool:
    """Whether the client gave up waiting (no answer, no coordinator), as opposed to an
    error the cluster answered with."""
    err = exc.args[0] if exc.args else None
    return isinstance(err, KafkaError) and err.code() in _UNANSWERED


__all__ = ["ATTEMPTS", "GroupCommitter"]
