"""The base of every event contract: strict Pydantic v2 models that Postgres will accept.

Pydantic's lax defaults let through values that Postgres then rejects (NaN, a 400-digit
integer, ``"2"`` for an int, NUL inside a string, a naive timestamp), and one such value
aborts a whole chunk. Contracts are therefore strict: ``strict=True``, no inf/NaN, integer
bounds that fit the column, a ``max_length`` on every string, no NUL, aware datetimes and
bounded decimals.

Unknown keys are **ignored**, not rejected: producers may add fields before the contract
learns them (additive evolution), and a rejected extra key would dead-letter good data.

What identifies a record is the pipeline's (its ``identity``), not the contract's: a
contract of payloads that carry an ``event_id`` is an :class:`EventContract`.

Each model names its ``EVENT_TYPE`` and ``VERSION``. A payload may carry ``"version"``;
when it is absent the payload is taken as version 1. Version N of a contract accepts
payload versions 1..N (evolution is additive: new optional fields only); a higher version
is a data error (:class:`~kafka_ingest.errors.UnknownVersion`), never a crash.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from operator import attrgetter, itemgetter
from typing import Annotated, Any, ClassVar, NotRequired

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, with_config
from pydantic_core import CoreConfig, SchemaValidator
from typing_extensions import TypedDict  # pydantic reads a TypedDict of it before 3.12

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
    #: with it applied (:func:`sink_getter`), so the row can go straight into the table.
    CONVERTED: ClassVar[dict[str, tuple[str, Callable[[Any], Any]]]] = {}
    #: A contract built from a declaration in the pipelines file
    #: (:mod:`~kafka_ingest.contracts.declared`): the declaration, as JSON; None for one
    #: written in Python.
    DECLARATION: ClassVar[str | None] = None

    version: int = Field(default=1, ge=1)

    def sink_values(self) -> tuple[Any, ...]:
        """The row's values as they travel to Postgres, in ``SINK_COLUMNS`` order (a
        ``CONVERTED`` column's value converted)."""
        return sink_getter(type(self))(self)

    @classmethod
    def key(cls) -> str:
        """Registry key: ``<event_type>.v<version>``."""
        return f"{cls.EVENT_TYPE}.v{cls.VERSION}"


class EventContract(Contract):
    """A contract of payloads identified by an ``event_id`` (a pipeline's identity unless
    it says otherwise)."""

    event_id: EventId


#: A validated event -> its sink values, in ``SINK_COLUMNS`` order.
SinkGetter = Callable[[Any], tuple[Any, ...]]
_GETTERS: dict[tuple[type[Contract], bool], SinkGetter] = {}


def sink_getter(model: type[Contract], *, by_key: bool = False) -> SinkGetter:
    """A validated event -> its sink values in ``SINK_COLUMNS`` order, each ``CONVERTED``
    column's value converted (``None`` stays ``None``).

    The event is a model instance (read by attribute), or with ``by_key`` the fields dict
    of :func:`hot_validation`'s validator (read by key; a ``CONVERTED`` value is converted in
    the dict itself, which is the hot path's own, made for this one message). Without a
    conversion it is one C call (``itemgetter``/``attrgetter``).
    """
    found = _GETTERS.get((model, by_key))
    if found is None:
        found = _GETTERS[(model, by_key)] = _sink_getter(model, by_key)
    return found


def _sink_getter(model: type[Contract], by_key: bool) -> SinkGetter:
    names = [name for name, _ in model.SINK_COLUMNS]
    read = itemgetter(*names) if by_key else attrgetter(*names)
    get: SinkGetter = read if len(names) > 1 else lambda event: (read(event),)
    if not model.CONVERTED:
        return get
    if by_key:
        by_name = tuple((name, model.CONVERTED[name][1]) for name in names
                        if name in model.CONVERTED)

        def converted_in_place(fields: dict[str, Any]) -> tuple[Any, ...]:
            for name, convert in by_name:
                if (value := fields[name]) is not None:
                    fields[name] = convert(value)
            return get(fields)

        return converted_in_place
    by_index = tuple((i, model.CONVERTED[name][1]) for i, name in enumerate(names)
                     if name in model.CONVERTED)

    def converted(event: Contract) -> tuple[Any, ...]:
        values = list(get(event))
        for i, convert in by_index:
            if (value := values[i]) is not None:
                values[i] = convert(value)
        return tuple(values)

    return converted


@dataclass(frozen=True)
class Validation:
    """How the hot path validates a contract and reads its sink values from the result.

    ``validator`` is the model's own, or, for a plain model, the validator of its fields
    alone: the same fields, constraints, defaults and configuration, so the same verdict
    and the same errors (but for a value that is no object at all: ``dict_type`` where
    the model says ``model_type``, both :class:`~kafka_ingest.errors.NotAnObject`), and
    its result is the fields dict instead of a model instance, which the hot path never
    needs (building one costs about a quarter of what ``validate_chunk`` spends on a
    message).
    """

    #: A ``SchemaValidator`` (the model's may be pydantic's pluggable wrapper of one).
    validator: Any
    #: Whether the result is the fields dict (read by key), or a model instance (read its
    #: attributes).
    by_key: bool


_VALIDATIONS: dict[type[Contract], Validation] = {}
#: Decorators that shape what a model dumps, not what it accepts: a model with no other
#: kind (validators, model validators, and any kind a later pydantic adds) is plain.
_OUTPUT_ONLY = frozenset({"field_serializers", "model_serializers", "computed_fields"})


def hot_validation(model: type[Contract]) -> Validation:
    """The contract's :class:`Validation`: its fields' validator when the model adds
    nothing to them (no validator of any kind, ``model_post_init`` or private attribute,
    custom ``__init__`` or root model, and every sink column a field), else the model's
    own."""
    found = _VALIDATIONS.get(model)
    if found is None:
        found = _VALIDATIONS[model] = _validation(model)
    return found


def _adds_to_its_fields(model: type[Contract]) -> bool:
    decorators = model.__pydantic_decorators__
    return bool(model.__pydantic_custom_init__ or model.__pydantic_post_init__
                or model.__pydantic_root_model__
                or any(getattr(decorators, kind.name) for kind in fields(decorators)
                       if kind.name not in _OUTPUT_ONLY))


def _validation(model: type[Contract]) -> Validation:
    """The fields' validator is a ``TypedDict`` of the model's fields (each its own
    ``FieldInfo``: type, constraints, alias, default) with the model's configuration,
    through public pydantic API only."""
    if _adds_to_its_fields(model) or not {n for n, _ in model.SINK_COLUMNS} <= set(
            model.model_fields):
        return Validation(model.__pydantic_validator__, by_key=False)
    annotations = {name: Annotated[info.annotation, info] if info.is_required()
                   else NotRequired[Annotated[info.annotation, info]]
                   for name, info in model.model_fields.items()}
    typed = with_config(ConfigDict(**model.model_config))(
        TypedDict(f"{model.__name__}Fields", annotations))  # type: ignore[operator]
    # Of the strings JSON parsing makes, only the object keys repeat from one message to
    # the next: caching the values too (pydantic's default) costs a lookup each, for
    # nothing (0.1 µs a message). (A validator-wide setting: a TypeAdapter of a TypedDict
    # takes none, so its schema gets a validator of its own.)
    schema = TypeAdapter(typed).core_schema
    return Validation(SchemaValidator(schema, CoreConfig(cache_strings="keys")), by_key=True)
