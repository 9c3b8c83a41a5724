"""What a run reads, typed: from the stored cursor (:class:`LiveRun`), by offsets
(:class:`OffsetWindow`) or by time (:class:`TimeWindow`); a replay's filters and dry run
(:class:`ReplayRequest`); and the key a run's plan is pinned under (:func:`request_key`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
)

from kafka_ingest.config import IdentitySource, KeyFormat, Pipeline, RecordKey
from kafka_ingest.errors import DataError, TriggerParamsError
from kafka_ingest.kafka.dlq import DeadLetter

#: A payload in a registry's wire format -> its Python value (dict for a record), as the
#: pipeline's decoder reads it; a :class:`~kafka_ingest.errors.DataError` for one it
#: cannot read.
ValueReader = Callable[[bytes], Any]


class _Request(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LiveRun(_Request):
    """Read from the stored cursor to the high watermark (capped per partition)."""

    kind: Literal["live"] = "live"


class OffsetWindow(_Request):
    """Read exactly these offsets, ``{partition: (start, end)}``, half-open."""

    kind: Literal["offsets"] = "offsets"
    partitions: dict[int, tuple[int, int]]


class TimeWindow(_Request):
    """Read what was written in ``[from_ms, to_ms)``, mapped to offsets per partition."""

    kind: Literal["time"] = "time"
    from_ms: int
    to_ms: int

    @classmethod
    def between(cls, start: datetime, end: datetime, *, now: datetime) -> TimeWindow:
        """A window checked: aware, ordered, already ended."""
        if start.tzinfo is None or end.tzinfo is None:
            raise TriggerParamsError("from and to need a UTC offset, e.g. 2026-01-01T00:00:00Z")
        if end <= start:
            raise TriggerParamsError(f"'to' ({end.isoformat()}) must be after 'from' "
                                     f"({start.isoformat()})")
        if end > now:
            raise TriggerParamsError(f"'to' ({end.isoformat()}) is in the future; the window "
                                     "must have ended")
        return cls(from_ms=int(start.timestamp() * 1000), to_ms=int(end.timestamp() * 1000))


RangeRequest = LiveRun | OffsetWindow | TimeWindow


def request_key(request: RangeRequest, **extra: Any) -> str:
    """A stable name for a plan request: ``live`` or canonical JSON of what was asked.

    Plans are pinned per (run, request): a retry of the same request finishes the same
    slice, while the same run id asked for something else (Airflow's backfill re-running
    a cleared scheduled run) plans anew. ``extra`` (a replay's ``dry_run``) is part of it.
    """
    body: dict[str, Any] = {}
    if isinstance(request, OffsetWindow):
        body["partitions"] = {str(p): list(v) for p, v in sorted(request.partitions.items())}
    elif isinstance(request, TimeWindow):
        body.update(from_ms=request.from_ms, to_ms=request.to_ms)
    body.update(extra)
    if not body:
        return "live"
    return json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)


@dataclass(frozen=True)
class ReplayFilters:
    """Which dead letters a replay considers; the others are counted ``filtered_out``.

    ``identity``: the letters of this identity of the pipeline's (see
    :func:`letter_identity` for how each is written); ``event_id``: the letters whose
    payload's ``event_id`` is this (the filter's first spelling, for any pipeline).

    A letter's payload is read as JSON, or by ``read`` (:data:`ValueReader`: a registry
    format's decoder) when the pipeline's values are in a registry's wire format; a
    payload it cannot read matches neither filter."""

    error_classes: frozenset[str] = frozenset()
    source_partition: int | None = None
    event_id: str | None = None
    identity: str | None = None

    @property
    def active(self) -> bool:
        return bool(self.error_classes or self.source_partition is not None
                    or self.event_id is not None or self.identity is not None)

    def matches(self, letter: DeadLetter,
                identity_of: Callable[[DeadLetter], str | None] | None = None,
                read: ValueReader | None = None) -> bool:
        """Whether the replay considers ``letter``; ``identity_of``: the pipeline's
        :func:`letter_identity` (without it, no letter matches an ``identity`` filter)."""
        if self.error_classes and letter.error_class not in self.error_classes:
            return False
        if self.source_partition is not None and letter.source_partition != self.source_partition:
            return False
        if self.identity is not None and (
                identity_of is None or identity_of(letter) != canonical_identity(self.identity)):
            return False
        return self.event_id is None or _text(_peek(letter.value, ("event_id",), read=read)[0]) \
            == self.event_id

    def to_dict(self) -> dict[str, Any]:
        return {"error_classes": sorted(self.error_classes),
                "source_partition": self.source_partition, "event_id": self.event_id,
                "identity": self.identity}


def letter_identity(pipeline: Pipeline, read: ValueReader | None = None
                    ) -> Callable[[DeadLetter], str | None]:
    """A dead letter -> its record's identity as a replay's ``identity`` filter writes it
    (None: it has none to read, and matches no filter):

    - one payload field: its value as text (``o-17``, ``42``), read from the payload (by
      its name, or its dotted path into nested objects): JSON, or what ``read`` decodes
      (a registry format's payload);
    - several: their values as a JSON array (``["eu", 42]``, compared canonically);
    - the record key: the key as text (``json``: the key's ``field`` when it has one; a
      ``registry`` key decoded by ``read``);
    - the source position: ``<partition>:<offset>``.
    """
    source = pipeline.identity_source
    if source is IdentitySource.SOURCE_POSITION:
        return lambda letter: f"{letter.source_partition}:{letter.source_offset}"
    if source is IdentitySource.RECORD_KEY:
        record_key = pipeline.record_key
        return lambda letter: _key_text(record_key, letter.key, read)
    paths = tuple(tuple(path.split(".")) if "." in path else (path,)
                  for path in pipeline.identity_fields)
    if pipeline.composite_key:  # a change event's primary key: its record key's fields
        return lambda letter: _identity_text(_peek(_key_payload(letter.key), *paths))
    if len(paths) == 1:
        return lambda letter: _text(_peek(letter.value, paths[0], read=read)[0])
    return lambda letter: _canonical(_peek(letter.value, *paths, read=read))


def canonical_identity(value: str) -> str:
    """A composite identity as the filter compares it: a JSON array without spaces (the
    value as it is when it is none)."""
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return _canonical(parsed) or value if isinstance(parsed, list) else value


def _canonical(values: Any) -> str | None:
    if any(v is None for v in values):
        return None
    return json.dumps(list(values), separators=(",", ":"), ensure_ascii=False)


def _peek(value: bytes | None, *paths: tuple[str, ...], read: ValueReader | None = None
          ) -> list[Any]:
    """A peek at the values of ``paths`` (a whole key, else nested keys) in the payload,
    JSON or decoded by ``read``; anything unreadable or missing is None (a registry that
    cannot be reached still raises: that is no answer about the letter)."""
    doc: Any = None
    if value is not None:
        try:
            doc = json.loads(value) if read is None else read(value)
        except (ValueError, RecursionError, DataError):
            doc = None
    return [_at(doc, path) for path in paths]


def _at(doc: Any, path: tuple[str, ...]) -> Any:
    if isinstance(doc, dict) and ".".join(path) in doc:
        return doc[".".join(path)]
    for name in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(name)
    return doc


def _key_payload(key: bytes | None) -> bytes | None:
    """A JSON record key as its producer meant it (JsonConverter's ``payload`` unwrapped)."""
    try:
        doc = json.loads(key) if key is not None else None
    except (ValueError, RecursionError):
        return None
    if isinstance(doc, dict) and doc.keys() == {"schema", "payload"}:
        return json.dumps(doc["payload"]).encode()
    return key


def _identity_text(values: list[Any]) -> str | None:
    """One value as text, several as their JSON array (see :func:`letter_identity`)."""
    return _text(values[0]) if len(values) == 1 else _canonical(values)


def _text(found: Any) -> str | None:
    """A scalar identity value as text (a string as it is, an integer in decimal)."""
    if isinstance(found, str):
        return found
    if isinstance(found, int) and not isinstance(found, bool):
        return str(found)
    return None


def _key_text(record_key: RecordKey | None, key: bytes | None, read: ValueReader | None
              ) -> str | None:
    if key is None or record_key is None:
        return None
    try:
        if record_key.format is KeyFormat.REGISTRY:
            if read is None:
                return None
            doc = read(key)
        elif record_key.format is KeyFormat.STRING:
            return key.decode("utf-8")
        else:
            doc = record_key.unwrapped(json.loads(key.decode("utf-8")))
    except (UnicodeDecodeError, ValueError, RecursionError, DataError):
        return None
    return _text(_at(doc, (record_key.field,)) if record_key.field else doc)


@dataclass(frozen=True)
class ReplayRequest:
    """A DLQ replay: which DLQ range, whether it writes, which dead letters."""

    range: RangeRequest
    dry_run: bool = False
    filters: ReplayFilters = ReplayFilters()

    @property
    def key(self) -> str:
        return request_key(self.range, dry_run=self.dry_run)


__all__ = ["LiveRun", "OffsetWindow", "RangeRequest", "ReplayFilters", "ReplayRequest",
           "TimeWindow", "ValueReader", "canonical_identity", "letter_identity", "request_key"]
