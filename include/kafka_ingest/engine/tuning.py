"""The interpreter's settings while a slice runs: the thread switch interval and the cyclic
garbage collector, each set for the slice and restored after it (also on an error).

Both are process-wide, so they are applied by the one function that owns a slice's
resources (:func:`kafka_ingest.engine.slices.run_slice`) through :func:`for_a_slice`, and
each is measured (the figures are in the constants' comments).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

#: The interpreter's thread switch interval while a slice runs (Python's default: 5 ms).
#: The main thread validates (CPU, holding the GIL) while the transaction thread's chunk
#: comes back from Postgres a few dozen times a chunk (each block of the COPY, each
#: statement) and needs the GIL for a moment each time: at 5 ms it waits up to that long
#: every time, and a chunk's transaction took 165 ms instead of 125 (200k events, 20k a
#: chunk, measured here); at 0.5 ms the transaction thread is back at once and validation
#: loses nothing measurable.
SWITCH_INTERVAL_S = 0.0005

#: The cyclic garbage collector's first threshold while a slice runs (Python's default:
#: 700). A chunk allocates a few objects per message (the message, the validated event,
#: its row) and keeps them until its transaction is in, so at 700 the collector ran
#: hundreds of times a chunk, each time over young objects that were all alive, and its
#: older generations over the whole heap (an Airflow task's is large). What was in the
#: heap before the slice is frozen out of the collections, and the collector runs once
#: every 100,000 allocations: per 1M events, the slice process's CPU went from 7.5 s to
#: 5.7 s, the same as with the collector off (``benchmarks/bench_ingest.py --events
#: 1000000 --only project``). Reference cycles are still collected.
GC_YOUNG_THRESHOLD = 100_000


@contextmanager
def for_a_slice() -> Iterator[None]:
    """The switch interval and the collector tuned for the block (a slice), both restored
    after it."""
    with ExitStack() as tuned:
        tuned.enter_context(switch_interval(SWITCH_INTERVAL_S))
        tuned.enter_context(young_collections(GC_YOUNG_THRESHOLD))
        yield


@contextmanager
def switch_interval(seconds: float) -> Iterator[None]:
    """``sys.setswitchinterval(seconds)`` for the block (never longer than the process's
    own), the previous one restored after."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(min(previous, seconds))
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


@contextmanager
def young_collections(threshold: int) -> Iterator[None]:
    """Freeze the heap out of the collections and raise the first collection threshold to
    ``threshold`` for the block; the previous thresholds restored and the heap unfrozen
    after. A process that froze its heap before (Airflow's LocalExecutor forks its task
    processes frozen) is left as it was: only the threshold is raised, since freezing
    more there could never be undone for the objects frozen after its own freeze."""
    previous, frozen = gc.get_threshold(), gc.get_freeze_count()
    if not frozen:
        gc.freeze()
    gc.set_threshold(max(previous[0], threshold), *previous[1:])
    try:
        yield
    finally:
        gc.set_threshold(*previous)
        if not frozen:
            gc.unfreeze()
