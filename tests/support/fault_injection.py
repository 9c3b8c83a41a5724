"""Faults at a precise step of a chunk: the slice engine's ``CHUNK_HOOK`` stages, and three
steps inside a chunk's transaction (half way through the COPY, just before COMMIT, just
before a chunk's dead letters are produced). Used in-process by the fault tests and, through
``tests/chaos/dag_faults/sitecustomize.py``, inside an ``airflow dags test`` process; imports
only the runtime package.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kafka_ingest.db import TableWriter, UnitOfWork
from kafka_ingest.engine import ingest, slices
from kafka_ingest.records import CopyPayload

#: The slice engine's own marks (:data:`kafka_ingest.engine.slices.CHUNK_HOOK`).
HOOK_STAGES = ("validated", "upserted", "dlq_produced", "db_committed", "kafka_committed")
STEPS = (*HOOK_STAGES,
         "copy",         # half way through the COPY into the staging table
         "commit",       # just before the chunk's COMMIT is sent
         "dlq_produce")  # just before a chunk's dead letters are produced (chunks with some)

Patch = Callable[[Any, str, Any], None]


@dataclass
class Injector:
    """Runs ``action`` once, the ``nth`` time a chunk reaches ``step`` (see :data:`STEPS`);
    records when (``fired_at``, monotonic) and, at ``commit``, which chunk (``chunk``:
    partition, start, end)."""

    step: str
    action: Callable[[], Any]
    nth: int = 1
    seen: int = 0
    fired_at: float | None = None
    result: Any = None
    chunk: dict[str, int] = field(default_factory=dict)

    def _tick(self, **chunk: int) -> None:
        self.seen += 1
        if self.seen == self.nth and self.fired_at is None:
            self.chunk = chunk
            self.fired_at = time.monotonic()
            self.result = self.action()

    def install(self, setattr_: Patch) -> Injector:
        """Patch the code with ``setattr_`` (``monkeypatch.setattr``, or ``setattr`` in a
        process of its own)."""
        installers = {"copy": self._at_copy, "commit": self._at_commit,
                      "dlq_produce": self._at_dlq_produce}
        if self.step in HOOK_STAGES:
            self._at_stage(setattr_)
        elif self.step in installers:
            installers[self.step](setattr_)
        else:
            raise ValueError(f"unknown step {self.step!r}; one of {STEPS}")
        return self

    def _at_stage(self, setattr_: Patch) -> None:
        def hook(stage: str) -> None:
            if stage == self.step:
                self._tick()
        setattr_(slices, "CHUNK_HOOK", hook)

    def _at_copy(self, setattr_: Patch) -> None:
        real_send = TableWriter._send

        def send(repo: TableWriter, copy: Any, rows: list[Any],
                 encoded: CopyPayload | None) -> None:
            if encoded is None:
                real_send(repo, copy, _HalfWay(rows, self._tick), None)
                return
            data = encoded.data
            half = len(data) // 2  # the payload encoded ahead: its first half, then
            copy.write(data[:half])
            self._tick()
            copy.write(data[half:])
        setattr_(TableWriter, "_send", send)

    def _at_commit(self, setattr_: Patch) -> None:
        real_commit = UnitOfWork.commit

        def commit(uow: UnitOfWork, **kwargs: int) -> None:
            self._tick(**kwargs)
            real_commit(uow, **kwargs)
        setattr_(UnitOfWork, "commit", commit)

    def _at_dlq_produce(self, setattr_: Patch) -> None:
        real_produce = ingest.produce_dead_letters

        def produce(producer: Any, letters: Any, *args: Any, **kwargs: Any) -> Any:
            if letters:
                self._tick()
            return real_produce(producer, letters, *args, **kwargs)
        setattr_(ingest, "produce_dead_letters", produce)


class _HalfWay(list[Any]):
    """The rows of a COPY; ``at_half`` runs when iteration reaches the middle."""

    def __init__(self, rows: list[Any], at_half: Callable[[], None]) -> None:
        super().__init__(rows)
        self._at_half = at_half

    def __iter__(self) -> Iterator[Any]:
        half = len(self) // 2
        for i, row in enumerate(super().__iter__()):
            if i == half:
                self._at_half()
            yield row


__all__ = ["HOOK_STAGES", "STEPS", "Injector"]
