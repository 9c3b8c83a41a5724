"""Typed run requests, and the forms they are parsed from: the one place a request's rules live.

A run reads one of three kinds of range (:data:`RangeRequest`):

- :class:`LiveRun`: from the stored cursor (the scheduled micro-batch);
- :class:`OffsetWindow`: ``{partition: (start, end)}`` offsets, half-open;
- :class:`TimeWindow`: ``[from, to)`` in epoch milliseconds, mapped to offsets by time.

A replay adds ``dry_run`` and :class:`ReplayFilters` (:class:`ReplayRequest`)
(:mod:`~kafka_ingest.requests.runs`).

The trigger forms, the CLI and the planner all go through :class:`IngestForm` and
:class:`ReplayForm` (:func:`ingest_request`, :func:`replay_request`); the DAGs' ``Param``s
are generated from the same models (:func:`form_fields`)
(:mod:`~kafka_ingest.requests.forms`). A bad request raises one
:class:`~kafka_ingest.errors.TriggerParamsError` naming the field and what to fix.
"""

from kafka_ingest.requests.forms import (
    IngestForm,
    ReplayForm,
    form_fields,
    ingest_request,
    replay_request,
)
from kafka_ingest.requests.runs import (
    LiveRun,
    OffsetWindow,
    RangeRequest,
    ReplayFilters,
    ReplayRequest,
    TimeWindow,
    ValueReader,
    canonical_identity,
    letter_identity,
    request_key,
)

__all__ = [
    "IngestForm",
    "LiveRun",
    "OffsetWindow",
    "RangeRequest",
    "ReplayFilters",
    "ReplayForm",
    "ReplayRequest",
    "TimeWindow",
    "ValueReader",
    "canonical_identity",
    "form_fields",
    "ingest_request",
    "letter_identity",
    "replay_request",
    "request_key",
]
