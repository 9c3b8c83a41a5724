"""The trigger forms (:class:`IngestForm`, :class:`ReplayForm`) that the DAGs, the CLI and the
planner parse requests from (:func:`ingest_request`, :func:`replay_request`), and the
DAGs' ``Param``s generated from the same models (:func:`form_fields`). A bad request raises
one :class:`~kafka_ingest.errors.TriggerParamsError` naming the field and what to fix."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from kafka_ingest.errors import KNOWN_ERROR_CLASSES, TriggerParamsError
from kafka_ingest.requests.runs import (
    LiveRun,
    OffsetWindow,
    RangeRequest,
    ReplayFilters,
    ReplayRequest,
    TimeWindow,
)

# --------------------------------------------------------------------------- form fields


def _whole_number(value: Any) -> int | None:
    """An int, or a string of digits (JSON object keys); not a bool, not a fraction."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:  # "zero", "²" (a digit to str.isdigit, not to int)
            return None
    return None


def _offset_pair(bounds: Any) -> bool:
    return (isinstance(bounds, list | tuple) and len(bounds) == 2
            and all(isinstance(b, int) and not isinstance(b, bool) for b in bounds))


def _offsets(value: Any) -> dict[int, tuple[int, int]] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError('partitions must be an object like {"0": [0, 100]}')
    out: dict[int, tuple[int, int]] = {}
    for p, bounds in value.items():
        part = _whole_number(p)
        if part is not None and part < 0:
            raise ValueError(f"partition {part} does not exist: partitions are numbered from 0")
        if part is None or not _offset_pair(bounds):
            raise ValueError(f'partitions[{p!r}] must be [start, end] offsets (whole numbers), '
                             f'e.g. {{"0": [0, 100]}}; got {bounds!r}')
        lo, hi = bounds
        if hi < lo:
            raise ValueError(f"partition {part}: end {hi} is before start {lo}")
        out[part] = (lo, hi)
    return out


def _instant(value: Any) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        parsed = value
    else:
        try:
            parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{value!r} is not an ISO-8601 time (e.g. "
                             "2026-01-01T00:00:00Z)") from None
    if parsed.tzinfo is None:
        raise ValueError("from and to need a UTC offset, e.g. 2026-01-01T00:00:00Z")
    return parsed


def _error_classes(value: Any) -> frozenset[str]:
    classes = [value] if isinstance(value, str) else list(value or [])
    unknown = sorted(set(map(str, classes)) - set(KNOWN_ERROR_CLASSES))
    if unknown:
        raise ValueError(f"unknown error class(es) {', '.join(unknown)}; known: "
                         f"{', '.join(KNOWN_ERROR_CLASSES)}")
    return frozenset(classes)


def _partition_filter(value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 0):
        raise ValueError(f"source_partition must be an integer >= 0, not {value!r}")
    return value


def _event_id(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"event_id must be a non-empty string, not {value!r}")
    return value


def _identity(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"identity must be a non-empty string, not {value!r}")
    return value


_OFFSETS_SCHEMA: dict[str, Any] = {"type": "object", "additionalProperties": {
    "type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 2, "maxItems": 2}}
_ERROR_CLASSES_SCHEMA: dict[str, Any] = {"type": "array", "uniqueItems": True, "items": {
    "type": "string", "enum": list(KNOWN_ERROR_CLASSES)}}

Offsets = Annotated[dict[int, tuple[int, int]] | None, BeforeValidator(_offsets)]
Instant = Annotated[datetime | None, BeforeValidator(_instant)]


def _offsets_field(title: str, description: str) -> Any:
    return Field(None, title=title, description=description,
                 json_schema_extra={"x-schema": _OFFSETS_SCHEMA})


# --------------------------------------------------------------------------- forms


class _Form(BaseModel):
    """A trigger form: fields a person fills in, all optional, checked in one place."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    partitions: Offsets
    start: Instant = Field(None, alias="from")
    end: Instant = Field(None, alias="to")

    @model_validator(mode="after")
    def _one_kind_of_range(self) -> _Form:
        if self.partitions and (self.start or self.end):
            raise ValueError("give either 'partitions' (offsets) or 'from'/'to' (time), "
                             "not both")
        if (self.start is None) != (self.end is None):
            raise ValueError("a time backfill needs both 'from' and 'to'")
        return self

    def range_request(self, *, now: datetime,
                      interval: tuple[datetime, datetime] | None = None) -> RangeRequest:
        """The range asked for; without one, ``interval`` (an Airflow backfill run's data
        interval) by time, else a live run."""
        if self.partitions:
            return OffsetWindow(partitions=self.partitions)
        if self.start is not None and self.end is not None:
            return TimeWindow.between(self.start, self.end, now=now)
        if interval is not None:
            return TimeWindow.between(*interval, now=now)
        return LiveRun()


class IngestForm(_Form):
    """The ingest DAG's trigger form: empty for a normal run, or a backfill range."""

    partitions: Offsets = _offsets_field(
        "Backfill by offsets",
        'Offsets to re-read per partition, half-open [start, end): {"0": [0, 1000]}. '
        "Leave empty for a normal run.")
    start: Instant = Field(None, alias="from", title="Backfill from",
                           description="Backfill by time: first instant (ISO-8601 with "
                                       "offset), inclusive.")
    end: Instant = Field(None, alias="to", title="Backfill to",
                         description="Backfill by time: end instant, exclusive; not in the "
                                     "future.")


class ReplayForm(_Form):
    """The DLQ-replay DAG's trigger form."""

    dry_run: bool = Field(False, title="Dry run",
                          description="Validate and report the counts; write nothing (no "
                                      "rows, no dead_letters change, cursor unchanged).")
    partitions: Offsets = _offsets_field(
        "DLQ offsets",
        'Offsets of the DLQ topic to replay per partition, half-open [start, end): '
        '{"0": [0, 500]}. Leave empty to continue from the replay cursor.')
    start: Instant = Field(None, alias="from", title="From",
                           description="Replay DLQ records with timestamps (the original "
                                       "messages' timestamps) from this instant, inclusive "
                                       "(ISO-8601).")
    end: Instant = Field(None, alias="to", title="To",
                         description="End instant, exclusive; not in the future.")
    error_classes: Annotated[frozenset[str], BeforeValidator(_error_classes)] = Field(
        frozenset(), title="Error classes",
        description="Only dead letters of these classes; empty means all.",
        json_schema_extra={"x-schema": _ERROR_CLASSES_SCHEMA})
    source_partition: Annotated[int | None, BeforeValidator(_partition_filter)] = Field(
        None, title="Source partition", ge=0,
        description="Only dead letters from this source partition.")
    event_id: Annotated[str | None, BeforeValidator(_event_id)] = Field(
        None, title="Event id", min_length=1, max_length=128,
        description="Only the dead letter with this event_id.")
    identity: Annotated[str | None, BeforeValidator(_identity)] = Field(
        None, title="Identity", min_length=1, max_length=1024,
        description="Only the dead letters of this identity (the pipeline's): a field's "
                    "value (o-17), several as a JSON array ([\"eu\", 42]), the record key, "
                    "or partition:offset (a source position).")

    def filters(self) -> ReplayFilters:
        return ReplayFilters(self.error_classes, self.source_partition, self.event_id,
                             self.identity)


# --------------------------------------------------------------------------- parsing


_F = TypeVar("_F", bound=_Form)


def _parse(form: type[_F], params: Mapping[str, Any]) -> _F:
    """Validate a form; every problem becomes one TriggerParamsError naming its field."""
    try:
        return form.model_validate(dict(params))
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            msg = str(err["msg"]).removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown field (check its spelling)"
            where = ".".join(str(p) for p in err["loc"])
            problems.append(f"{where}: {msg}" if where and not msg.startswith(where) else msg)
        raise TriggerParamsError("; ".join(problems)) from None


def ingest_request(params: Mapping[str, Any], *, now: datetime, run_type: str = "manual",
                   interval: tuple[datetime, datetime] | None = None) -> RangeRequest:
    """The range an ingest run reads, from its trigger params (or the CLI's).

    ``partitions`` or ``from``/``to`` make a backfill; neither, a live run. Airflow's own
    backfill runs (``run_type == "backfill"``) map their data interval to offsets by time.
    """
    form = _parse(IngestForm, params)
    return form.range_request(now=now, interval=interval if run_type == "backfill" else None)


def replay_request(params: Mapping[str, Any], *, now: datetime) -> ReplayRequest:
    """A replay's range, dry-run flag and filters, from its trigger params (or the CLI's)."""
    form = _parse(ReplayForm, params)
    return ReplayRequest(form.range_request(now=now), form.dry_run, form.filters())


def form_fields(form: type[_Form]) -> dict[str, tuple[Any, dict[str, Any]]]:
    """``{name: (default, JSON Schema)}`` of a form's fields, for the DAGs' ``Param``s.

    Optional fields are nullable (``"type": [..., "null"]``), so a form left empty, or an
    editor cleared, is never marked required.
    """
    props = form.model_json_schema(by_alias=True, mode="serialization")["properties"]
    out: dict[str, tuple[Any, dict[str, Any]]] = {}
    for name, field in form.model_fields.items():
        key = field.alias or name
        raw = dict(props[key])
        schema = {k: raw[k] for k in ("title", "description") if k in raw}
        kind = raw.pop("x-schema", None) or _plain_type(raw)
        default = field.get_default()
        if isinstance(default, frozenset):
            default = sorted(default)
        nullable = default is None or kind.get("type") in ("array", "object")
        types = kind.get("type")
        if nullable and isinstance(types, str):
            kind = {**kind, "type": [types, "null"]}
        out[key] = (default, {**kind, **schema})
    return out


def _plain_type(raw: dict[str, Any]) -> dict[str, Any]:
    """``anyOf: [X, {"type": "null"}]`` as X, with what Airflow's form needs of it."""
    variants = [v for v in raw.get("anyOf", [raw]) if v.get("type") != "null"]
    keep = ("type", "format", "minimum", "minLength", "maxLength")
    return {k: v for k, v in variants[0].items() if k in keep}


__all__ = ["IngestForm", "ReplayForm", "form_fields", "ingest_request", "replay_request"]
