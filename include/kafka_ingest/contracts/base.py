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
from operator import attrgetter
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from pydantic_core import CoreConfig, SchemaValidator

# Postgres' text type cannot hold NUL; the pattern runs in pydantic-core, not Python.
NO_NUL = r"^[^\x00]*$"

BIGINT_MIN = -(2**63)
BIGINT_MAX = 2**63 - 1
# 10000-01-01T00:00:00Z in Unix seconds: an epoch is below it, so its time is at most
# 9999-12-31T23:59:59.999999Z, the last instant every client library can turn into a date
# (Python's datetime among them). The end of the last second, not its start: an epoch
# bounded by 253_402_300_799 refused the 999 milliseconds that follow it.
EPOCH_END = 253_402_300_800

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
    #: e.g. an epoch in seconds -> ``timestamptz``
    #: (:func:`~kafka_ingest.contracts.columns.seconds_to_pg`). The row's values are read
    #: with it applied (:func:`values_code`), so the row can go straight into the table.
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
    """A model instance -> its sink values in ``SINK_COLUMNS`` order, each ``STAGED``
    column's value converted: one C call (``attrgetter``; a contract has at least two
    columns, so it returns a tuple), or with a converted column a function made from
    :func:`values_code`."""
    getter = _GETTERS.get(model)
    if getter is None:
        if model.STAGED:
            code, scope = values_code(model, "s", by_key=False)
            getter = compiled("values", "s", f"return {code}", scope)
        else:
            getter = attrgetter(*(name for name, _ in model.SINK_COLUMNS))
        _GETTERS[model] = getter
    return getter


def values_code(model: type[Contract], subject: str, *,
                by_key: bool) -> tuple[str, dict[str, Any]]:
    """Python source of the sink values of a validated event named ``subject`` (a fields
    dict with ``by_key``, else a model instance), in ``SINK_COLUMNS`` order, each
    ``STAGED`` column's value converted (``None`` stays ``None``), as the elements of a
    tuple display (``a, b, c,``); and the names the source uses.

    The hot path builds each row in one frame made from this source
    (:func:`kafka_ingest.decode.validate.row_builder`): a loop over the columns, or a
    tuple subclass around a C getter's tuple, cost a frame or an object more a message.
    """
    read = f"{subject}[{{!r}}]" if by_key else f"getattr({subject}, {{!r}})"
    scope: dict[str, Any] = {}
    parts = []
    for i, (name, _) in enumerate(model.SINK_COLUMNS):
        if name in model.STAGED:
            scope[f"convert_{i}"] = model.STAGED[name][1]
            parts.append(f"(None if (v{i} := {read.format(name)}) is None"
                         f" else convert_{i}(v{i}))")
        else:
            parts.append(read.format(name))
    return "".join(f"{part}, " for part in parts), scope


def compiled(name: str, arguments: str, body: str, scope: dict[str, Any]) -> Any:
    """The function ``def name(arguments): body`` made in ``scope`` (which the source
    made by the caller names; nothing in it comes from a message)."""
    lines = "".join(f"    {line}\n" for line in body.splitlines())
    exec(f"def {name}({arguments}):\n{lines}", scope)  # noqa: S102
    return scope[name]


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
    #: Whether the result is ``(fields dict, extra, fields set)`` (read ``result[0]`` by
    #: key), or a model instance (read its attributes).
    by_key: bool


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
        return Validation(model.__pydantic_validator__, by_key=False)
    # Of the strings JSON parsing makes, only the object keys repeat from one message to
    # the next: caching the values too (pydantic's default) costs a lookup each, for
    # nothing (0.1 µs a message).
    config: CoreConfig = {**(schema.get("config") or {}), "cache_strings": "keys"}
    return Validation(SchemaValidator(inner, config), by_key=True)
