"""When an ``on_data`` pipeline should run: the lag trigger's decision, without Airflow.

The trigger (``plugins/kafka_ingest_triggers.py``) reads every watched pipeline's lag
with one :class:`kafka_ingest.ops.lag.LagReader` per cluster and database, and hands
each reading to the pipeline's :class:`LagWatch`, which says whether to start a run:

- **armed**: fire when the lag reaches ``min_batch`` messages, or when it has stayed
  above zero for ``max_wait_seconds`` (counted from the first reading that saw it);
- **fired**: quiet until the run it caused has brought the stored offset of every
  partition that lagged when it fired to where that run ends: the high watermark seen
  then, or ``max_records`` (the pipeline's ``max_records_per_partition``) past the stored
  offset (the stored offsets are the run's own commits: Postgres is the source of truth;
  a run commits chunk by chunk, and its first commit is not its end). Then armed again at
  once, so data that arrived during the run starts exactly one follow-up run. A run that
  fails, or a paused DAG, moves nothing: after ``rearm_seconds`` the watch is armed again
  and fires at once if the lag is still there (it has waited since the fire), so no lag
  is ever forgotten.

Nothing is consumed and nothing is committed: the watch only compares numbers that
``kafka-ingest lag`` shows. Time is passed in (monotonic seconds), so the decision is
tested without a clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kafka_ingest.config import OnData
from kafka_ingest.ops.lag import LagRow


@dataclass(frozen=True)
class Fire:
    """Start a run: why, and the lag that made it (the asset event's extra)."""

    reason: str  # "min_batch" or "max_wait"
    total_lag: int
    partitions: Mapping[int, int]
    waited_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "total_lag": self.total_lag,
                "partitions": {str(p): lag for p, lag in sorted(self.partitions.items())},
                "waited_seconds": round(self.waited_s, 3)}


@dataclass
class LagWatch:
    """One pipeline's trigger state (see the module's text)."""

    settings: OnData
    #: How far one run reads per partition (the pipeline's ``max_records_per_partition``).
    max_records: int = 2**62
    #: When the lag was first seen above zero while armed (None: not lagging).
    lag_since: float | None = None
    #: While fired: when, and where the run it caused ends, per partition that lagged.
    fired_at: float | None = None
    run_ends: dict[int, int] = field(default_factory=dict)

    @property
    def armed(self) -> bool:
        return self.fired_at is None

    def observe(self, now: float, rows: Sequence[LagRow]) -> Fire | None:
        """One reading of the pipeline's lag rows (:func:`kafka_ingest.ops.lag.lag`'s);
        a :class:`Fire` when a run should start now."""
        if not self.armed and not self._rearm(now, rows):
            return None
        lagging = {r.partition: r.lag for r in rows if r.lag > 0}
        total = sum(lagging.values())
        if not total:
            self.lag_since = None
            return None
        if self.lag_since is None:
            self.lag_since = now
        waited = now - self.lag_since
        if total >= self.settings.min_batch:
            reason = "min_batch"
        elif waited >= self.settings.max_wait_seconds:
            reason = "max_wait"
        else:
            return None
        self.fired_at, self.lag_since = now, None
        self.run_ends = {r.partition: min(r.high, r.high - r.lag + self.max_records)
                         for r in rows if r.partition in lagging}
        return Fire(reason, total, lagging, waited)

    def _rearm(self, now: float, rows: Sequence[LagRow]) -> bool:
        """Whether the fired watch is armed again: the run reached its end on every
        partition that lagged when it fired, or ``rearm_seconds`` passed without."""
        assert self.fired_at is not None  # noqa: S101 (only called while fired)
        stored = {r.partition: r.stored_offset for r in rows}
        moved = all((s := stored.get(p)) is not None and s >= end
                    for p, end in self.run_ends.items())
        if moved:
            self.fired_at, self.run_ends = None, {}
            return True
        if now - self.fired_at >= self.settings.rearm_seconds:
            # a lag still there has waited since the fire: max_wait is long past
            self.lag_since, self.fired_at, self.run_ends = self.fired_at, None, {}
            return True
        return False
