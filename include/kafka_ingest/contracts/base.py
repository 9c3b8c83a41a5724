"""The base of every event contract: strict Pydantic v2 models that Postgres will accept.

Pydantic's lax defaults let through values that Postgres then rejects (NaN, a 400-digit
integer, ``"2"`` for an int, NUL inside a string, a naive timestamp), and one such value
aborts a whole chunk. Contracts are therefore strict: ``strict=True``, no inf/NaN, integer
bounds that fit the column, a ``max_length`` on every string, no NUL, aware datetimes and
bounded decimals.

Unknown keys are **ignored**, not rejected: producers may add fields before the contract
learns them (additive evolution), and a rejected extra key would dead-letter good data.

Each model names its ``EVENT_TYPE`` and ``VERSION``. A payload may carry ``"version"``;
when it is absent the payload is taken as version 1. Version N of a contract accepts
payload versions 1..N (evolution is additive: new optional fields only); a higher version
is a data error (:class:`~kafka_ingest.errors.UnknownVersion`), never a crash.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from pydantic_core import SchemaValidator

# Postgres' text type cannot hold NUL; the pattern runs in pydantic-core, not Python.
NO_NUL = r"^[^\x00]*$"

BIGINT_MIN = -(2**63)
BIGINT_MAX = 2**63 - 1
# 9999-12-31T23:59:59Z: the last second every client library can turn into a date.
EPOCH_MAX = 253_402_300_799.0

EventId = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=NO_NUL)]


def short_text(max_length: int, *, min_length: int = 1) -> Any:
    """A string of ``min_length`` (1: non-empty) to ``max_length`` characters, without NUL."""
    return Annotated[str, StringConstraints(min_length=min_length, max_length=max_length,
                                            pattern=NO_NUL)]


class Contract(BaseModel):
    """A versioned event contract; subclasses declare their fields and sink columns."""

    model_config = ConfigDict(
        strict=True,
        allow_inf_nan=False,
        extra="ignore",
        frozen=True,
        str_strip_whitespace=False,
    )

    EVENT_TYPE: ClassVar[str]
    VERSION: ClassVar[int]
    #: (column, Postgres type) in the order :meth:`sink_values` returns them.
    SINK_COLUMNS: ClassVar[tuple[tuple[str, str], ...]]
    #: Columns whose field's value is converted before it travels: column -> (the type
    #: of the field's value, what converts it into the column's binary ``COPY`` form),
    #: e.g. an epoch in seconds -> ``timestamptz`` (:func:`~kafka_ingest.records.seconds_to_pg`).
    #: :func:`sink_getter` applies it, so the row goes straight into the table.
    STAGED: ClassVar[dict[str, tuple[str, Callable[[Any], Any]]]] = {}
    #: A contract built from a declaration in the pipelines file
    #: (:mod:`~kafka_ingest.contracts.declared`): the declaration, as JSON; None for one
    #: written in Python.
    DECLARATION: ClassVar[str | None] = None

    event_id: EventId
    version: int = Field(default=1, ge=1)

    def sink_values(self) -> tuple[Any, ...]:
        """The row's values as they travel to Postgres, in ``SINK_COLUMNS`` order (a
        ``STAGED`` column's value converted)."""
        values: tuple[Any, ...] = sink_getter(type(self))(self)
        return values

    @classmethod
    def is_declared(cls) -> bool:
        return cls.DECLARATION is not None

    @classmethod
    def key(cls) -> str:
        """Registry key: ``<event_type>.v<version>``."""
        return f"{cls.EVENT_TYPE}.v{cls.VERSION}"


_GETTERS: dict[type[Contract], Any] = {}


def sink_getter(model: type[Contract]) -> Any:
    """A model instance -> its sink values (:func:`values_getter` of its attributes)."""
    getter = _GETTERS.get(model)
    if getter is None:
        getter = _GETTERS[model] = values_getter(model, by_key=False)
    return getter


def values_getter(model: type[Contract], *, by_key: bool) -> Any:
    """A validated event -> its sink values in ``SINK_COLUMNS`` order, each ``STAGED``
    column's value converted (``None`` stays ``None``); ``by_key``: the event is a fields
    dict, else a model instance.

    Without a converted column, one C call per message (``itemgetter``/``attrgetter``;
    a contract has at least two columns, so it returns a tuple). With one, a function made
    for the contract reads and converts every column in a single frame: 0.3 µs a message
    with one epoch column, where a loop over the columns after the C call cost 0.8.
    """
    names = [name for name, _ in model.SINK_COLUMNS]
    converts = [model.STAGED[name][1] if name in model.STAGED else None for name in names]
    if not any(converts):
        return (itemgetter if by_key else attrgetter)(*names)
    read = "s[{!r}]" if by_key else "getattr(s, {!r})"
    parts = [read.format(name) if convert is None else
             f"(None if (v{i} := {read.format(name)}) is None else c{i}(v{i}))"
             for i, (name, convert) in enumerate(zip(names, converts, strict=True))]
    scope: dict[str, Any] = {f"c{i}": c for i, c in enumerate(converts) if c is not None}
    exec(f"def values(s):\n    return ({', '.join(parts)},)", scope)  # noqa: S102
    values: Any = scope["values"]
    return values


@dataclass(frozen=True)
class Validation:
    """How the hot path validates a contract and reads its sink values from the result.

    ``validator`` is the model's own, or, for a plain model, the validator of its fields
    alone: the same fields, constraints, defaults and configuration, so the same verdict
    and the same errors, but its result is ``(fields dict, extra, fields set)`` instead
    of a model instance, which the hot path never needs (building one cost 0.6 of the 3.6
    µs ``validate_chunk`` spent a message).
    """

    #: A ``SchemaValidator`` (the model's may be pydantic's pluggable wrapper of one).
    validator: Any
    #: The sink values of a result's fields dict (``result[0]``), :func:`values_getter`;
    #: None: the result is a model instance (read it with :func:`sink_getter`).
    fields: Any


_VALIDATIONS: dict[type[Contract], Validation] = {}


def hot_validation(model: type[Contract]) -> Validation:
    """The contract's :class:`Validation`: its fields' validator when the model adds
    nothing to it (no model validator, ``model_post_init``, custom ``__init__`` or root
    model, and every sink column a field), else the model's own."""
    found = _VALIDATIONS.get(model)
    if found is None:
        found = _VALIDATIONS[model] = _validation(model)
    return found


def _validation(model: type[Contract]) -> Validation:
    schema: Any = model.__pydantic_core_schema__
    names = [name for name, _ in model.SINK_COLUMNS]
    inner: Any = schema.get("schema") if schema.get("type") == "model" else None
    plain = (inner is not None and inner.get("type") == "model-fields"
             and not schema.get("custom_init") and not schema.get("root_model")
             and "post_init" not in schema and set(names) <= set(inner["fields"]))
    if not plain:
        return Validation(model.__pydantic_validator__, None)
    return Validation(SchemaValidator(inner, schema.get("config")),
                      values_getter(model, by_key=True))
