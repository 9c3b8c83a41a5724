"""How a slice's stages overlap: read → prepare → transact → post, written once.

A slice's chunks go through four stages (:class:`Stages`, bound to one slice by
:mod:`kafka_ingest.engine.slices`), run by :func:`run_stages`:

==========  ===================  ====================================================
stage       thread               what it does with chunk k
==========  ===================  ====================================================
read        the slice's (main)   takes chunk k from the reader (bounded by offsets and
                                 bytes)
prepare     the slice's (main)   decodes, validates, encodes for ``COPY``: CPU only
transact    ``transaction-<p>``  one transaction, up to its COMMIT (or its rollback)
post        the slice's (main)   hands on what chunk k's committed transaction did
==========  ===================  ====================================================

joined by bounded hand-offs:

- read → prepare: the reader's iterator, one chunk at a time;
- prepare → transact: the transaction thread's one slot (:meth:`TransactionThread.hand_off`):
  chunk k+1 is handed over only once chunk k's transaction has ended, and the hand-off
  returns chunk k's outcome;
- transact → post: that outcome, posted at once (chunk k+1's transaction already runs).

For chunks 1, 2, 3 (a ``|`` is a hand-off: the transaction before has ended, the next one
starts)::

    slice        read+prepare 1 | read+prepare 2 | post 1, read+prepare 3 | post 2        | post 3
    transaction                 | txn 1 . COMMIT | txn 2 ......... COMMIT | txn 3 . COMMIT |

The rules (each tested with plain stage functions in ``tests/unit/engine/test_stages.py``):

- one transaction at a time, in chunk order;
- preparing chunk k+1 overlaps chunk k's transaction (Postgres works in its own process);
- at most two chunks are held: the one in its transaction and the one being prepared
  (chunk k is let go once posted, before chunk k+2 is read);
- a chunk is posted only after its transaction ended, in chunk order; a transaction that
  failed is raised in the slice's thread at the next hand-off, and nothing after it is
  transacted or posted;
- leaving :func:`run_stages` (done, an error, an interrupt: even twice) leaves no
  transaction running: the one in flight is waited for, bounded by its own time-outs
  (the Postgres reply time-out of each request, the DLQ's ``message.timeout.ms``), and
  the first interrupt met meanwhile is raised after it; while a wait lasts, it says so
  every :attr:`TransactionThread.NAG_S`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import partial
from types import TracebackType
from typing import Generic, Protocol, TypeVar

log = logging.getLogger(__name__)

C = TypeVar("C")  # a chunk
C_contra = TypeVar("C_contra", contravariant=True)
P = TypeVar("P")  # a prepared chunk
D = TypeVar("D")  # what a chunk's transaction did


class Stages(Protocol[C_contra, P, D]):
    """The stages of one slice; :func:`run_stages` runs them over its chunks."""

    def prepare(self, chunk: C_contra) -> P:
        """In the slice's thread, beside the transaction in flight: CPU only."""
        ...

    def transact(self, prepared: P) -> D:
        """In the transaction thread: the chunk's transaction, to its end."""
        ...

    def post(self, done: D) -> None:
        """In the slice's thread, once the chunk's transaction ended: never waits."""
        ...

    def describe(self, prepared: P) -> str:
        """The chunk a prepared chunk is, for the slow-transaction warning."""
        ...


def run_stages(chunks: Iterable[C], stages: Stages[C, P, D], *, name: str) -> None:
    """Read, prepare, transact and post every chunk of ``chunks``; the transactions run in
    a thread called ``name``, started and joined here (see the module docstring)."""
    with TransactionThread[D](name) as transactions:
        for chunk in chunks:  # read
            prepared = stages.prepare(chunk)
            _post(stages, transactions.hand_off(
                partial(stages.transact, prepared), stages.describe(prepared)))
        _post(stages, transactions.finish())


def _post(stages: Stages[C, P, D], done: D | None) -> None:
    # (a helper, not a local variable: chunk k is let go as soon as it is posted)
    if done is not None:
        stages.post(done)


class TransactionThread(Generic[D]):
    """A slice's one transaction thread: transactions one at a time, in order, each
    handed off once the one before it ended; started and joined by the block that opens
    it, which it never outlives (see the module docstring)."""

    #: How often a long wait for a transaction says that it is still waiting.
    NAG_S = 60.0

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._in_flight: tuple[Future[D], str] | None = None
        self._queued = False  # whether the hand-off of the one in flight completed

    def hand_off(self, job: Callable[[], D], what: str) -> D | None:
        """Wait for the transaction in flight to end, then start ``job`` (``what``'s
        transaction); return what the one that ended did.

        Its future is recorded before the thread is asked to run it: an interrupt landing
        inside the hand-off leaves a future the way out cancels (if the thread has not
        started it) or waits for, never a transaction that runs unknown to the slice."""
        done = self.finish()
        future: Future[D] = Future()
        self._in_flight, self._queued = (future, what), False
        self._pool.submit(_run, future, job)
        self._queued = True
        return done

    def finish(self) -> D | None:
        """Wait for the transaction in flight, if any, to end; return what it did (or
        raise what it failed with)."""
        if self._in_flight is None:
            return None
        future, what = self._in_flight
        self._wait(future, what)
        self._in_flight = None
        return future.result()

    def _wait(self, future: Future[D], what: str) -> None:
        while not wait([future], timeout=self.NAG_S).done:
            log.warning("%s: still waiting for its transaction", what)

    def _wait_through_interrupts(self) -> BaseException | None:
        """Wait for the transaction in flight, if any, to end, whatever is raised in this
        thread meanwhile (Airflow's time-out raises here, even twice); return the first
        thing raised. (It waits on the future: a thread join cut short by an exception
        marks a thread that still runs as stopped, in Python 3.11, so joining again would
        not wait.)"""
        interrupted: BaseException | None = None
        while self._in_flight is not None:
            try:
                future, what = self._in_flight
                # a hand-off cut short may have queued it or not: it runs to its end if
                # it started, else never
                if self._queued or not future.cancel():
                    self._wait(future, what)
                self._in_flight = None
            except BaseException as caught:
                interrupted = interrupted or caught
        return interrupted

    def __enter__(self) -> TransactionThread[D]:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # What is in flight is waited for, never abandoned: the slice's lock and connection
        # are released after this block, never under a transaction still running. Its
        # outcome is not raised here (an error is on its way out already); an interrupt
        # met while waiting is, once the thread, idle by then, has ended.
        interrupted = self._wait_through_interrupts()
        try:
            self._pool.shutdown(wait=True)
        finally:
            if interrupted is not None:
                raise interrupted


def _run(future: Future[D], job: Callable[[], D]) -> None:
    """Run ``job`` for ``future`` on the transaction thread, unless it was cancelled."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = job()
    except BaseException as exc:  # the slice's thread raises it from the future
        future.set_exception(exc)
    else:
        future.set_result(result)
