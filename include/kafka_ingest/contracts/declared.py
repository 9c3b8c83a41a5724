"""Contracts declared in the pipelines file instead of written in Python.

A declaration becomes the same :class:`~kafka_ingest.contracts.base.Contract` subclass a
hand-written contract is, built from the same field helpers, so it is exactly as strict::

    contracts:
      account_balance:
        version: 2                   # versions 1..2 are registered
        fields:
          account_id: {type: text, max_length: 64}
          balance:    {type: numeric, precision: 14, scale: 2}
          updated_at: {type: timestamptz, encoding: epoch_millis}
          opened_on:  {type: date, required: false}
          owner:      {type: uuid, required: false}
          limits:     {type: jsonb, required: false}
          tags:       {type: array, items: {type: text, max_length: 32}, max_items: 16,
                       default: []}
          nickName:   {type: text, max_length: 64, column: nick_name, since: 2,
                       required: false}
          address:                   # a nested object: a column per field, by its path
            type: record             # (address_city, address_zip); or {type: jsonb}
            fields:                  # to keep it whole in one column
              city: {type: text, max_length: 64}
              zip:  {type: text, max_length: 16, required: false}

A declared contract has an ``event_id`` too (a text of 1 to 128 characters, the first
column): required when it identifies the pipeline's records (the default), optional (a
missing one is NULL) when the pipeline says something else does (its ``identity``: other
fields, the record key, or the source position; :func:`optional_event_id`). The column
stays either way, so a table made before keeps its rows and its shape.

Every field is required unless it says ``required: false`` (then ``null`` when missing) or
gives a ``default``. A field added by a later version (``since``) must be optional:
evolution is additive. The YAML key is the payload's field name; ``column`` renames it
for the table. Version N accepts payloads of versions 1..N, like a hand-written contract.

A ``record`` field is an object inside the payload whose fields land as columns named by
their path (``address.city`` -> ``address_city``; the record's ``column`` renames the
prefix, a nested field's its own part), nested at most :data:`NESTING_MAX` deep. Each such
column's field reads its value through the path (``validation_alias=AliasPath("address",
"city")``), so JSON, Avro and Protobuf payloads alike fill it, and a pipeline's
``identity`` names it by its dotted path (``address.city``), as it names any aliased field
(:func:`~kafka_ingest.contracts.columns.payload_paths`). A required record's required
fields are required; an optional record (``required: false``) makes each of its columns
NULL when the record is missing or null.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, time, timedelta
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from enum import StrEnum
from typing import Annotated, Any
from uuid import UUID

from pydantic import (
    AfterValidator,
    AliasPath,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    NaiveDatetime,
    TypeAdapter,
    ValidationError,
    create_model,
    model_validator,
)
from pydantic_core import to_json

from kafka_ingest.contracts.base import EPOCH_END, Contract, EventId, short_text
from kafka_ingest.contracts.columns import millis_to_pg, refuse_system_column, seconds_to_pg
from kafka_ingest.records import INGESTED_AT, PROVENANCE_COLUMNS

_NAME = r"^[a-z][a-z0-9_]{0,62}$"
_PAYLOAD_NAME = r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$"
#: How deep records nest in a declaration: ``a.b.c.d`` is a column at the limit; keep a
#: deeper object whole in a ``jsonb`` field (``schema from-registry`` does).
NESTING_MAX = 3
#: The widest ``varchar`` Postgres has.
TEXT_MAX = 10_485_760
#: The last epoch millisecond a timestamp takes: 9999-12-31T23:59:59.999Z (see
#: :data:`~kafka_ingest.contracts.base.EPOCH_END`).
EPOCH_MS_MAX = EPOCH_END * 1000 - 1
#: The field every declared contract has without declaring it (see the module doc).
IMPLICIT_ID = "event_id"
#: The names a declared contract may not use for a column: the base contract's own fields
#: and the columns every table has (the provenance, and when the row was written).
RESERVED_COLUMNS = frozenset({IMPLICIT_ID, "version", INGESTED_AT,
                              *(c.name for c in PROVENANCE_COLUMNS)})


class FieldType(StrEnum):
    TEXT = "text"
    SMALLINT = "smallint"
    INTEGER = "integer"
    BIGINT = "bigint"
    FLOAT = "float"
    NUMERIC = "numeric"
    BOOLEAN = "boolean"
    TIMESTAMPTZ = "timestamptz"
    #: A wall-clock time without a zone (Avro ``local-timestamp-*``).
    TIMESTAMP = "timestamp"
    TIME = "time"
    INTERVAL = "interval"
    DATE = "date"
    UUID = "uuid"
    JSONB = "jsonb"
    BYTEA = "bytea"
    ARRAY = "array"
    #: An object inside the payload, its fields declared under ``fields``: a column each.
    RECORD = "record"


class TimeEncoding(StrEnum):
    """How a ``timestamptz`` arrives: ISO-8601 with an offset, or a number since the epoch."""

    ISO8601 = "iso8601"
    EPOCH_SECONDS = "epoch_seconds"
    EPOCH_MILLIS = "epoch_millis"


#: Integer widths: the bounds of the column and the type the value travels in.
_INTS: dict[FieldType, tuple[int, int, str]] = {
    FieldType.SMALLINT: (-(2**15), 2**15 - 1, "int2"),
    FieldType.INTEGER: (-(2**31), 2**31 - 1, "int4"),
    FieldType.BIGINT: (-(2**63), 2**63 - 1, "int8"),
}
#: The type each scalar travels in, where it is one name.
_TRAVEL: dict[FieldType, str] = {
    FieldType.TEXT: "text", FieldType.FLOAT: "float8", FieldType.NUMERIC: "numeric",
    FieldType.BOOLEAN: "bool", FieldType.DATE: "date", FieldType.UUID: "uuid",
    FieldType.JSONB: "jsonb", FieldType.TIMESTAMPTZ: "timestamptz", FieldType.BYTEA: "bytea",
    FieldType.TIMESTAMP: "timestamp", FieldType.TIME: "time", FieldType.INTERVAL: "interval",
}
_CONVERTED_TIME: dict[TimeEncoding, tuple[str, Callable[[Any], Any]]] = {
    TimeEncoding.EPOCH_SECONDS: ("float8", seconds_to_pg),
    TimeEncoding.EPOCH_MILLIS: ("int8", millis_to_pg),
}
def _jsonb_safe(value: Any) -> Any:
    """Refuse what Postgres' jsonb cannot hold: NaN/Infinity, ``\\u0000``, and anything
    that is not a JSON value (an Avro or Protobuf record decodes nested decimals, bytes and
    timestamps as Python objects, which no JSON encoder takes). A walk in Python, only for
    jsonb fields."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError("jsonb holds no NaN or Infinity")
        if isinstance(item, str):
            if "\x00" in item:
                raise ValueError("jsonb holds no NUL (\\u0000)")
        elif isinstance(item, dict):
            if not all(isinstance(k, str) for k in item):
                raise ValueError("jsonb object keys are strings")
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            stack += item
        elif not (item is None or isinstance(item, bool | int | float)):
            raise ValueError(f"jsonb holds JSON values only, not {type(item).__name__}")
    return value


#: Types whose Pydantic type takes no parameters.
_PLAIN: dict[FieldType, Any] = {
    FieldType.BOOLEAN: bool, FieldType.DATE: date, FieldType.UUID: UUID,
    FieldType.BYTEA: bytes, FieldType.TIMESTAMP: NaiveDatetime, FieldType.TIME: time,
    FieldType.INTERVAL: timedelta,
    FieldType.JSONB: Annotated[dict[str, Any] | list[Any], AfterValidator(_jsonb_safe)],
}
#: How a payload's value is checked: a default is checked the same way, at load time.
_PAYLOAD = ConfigDict(strict=True, allow_inf_nan=False)
_ONLY: dict[str, set[FieldType]] = {
    "max_length": {FieldType.TEXT}, "min_length": {FieldType.TEXT},
    "precision": {FieldType.NUMERIC}, "scale": {FieldType.NUMERIC},
    "encoding": {FieldType.TIMESTAMPTZ}, "items": {FieldType.ARRAY},
    "max_items": {FieldType.ARRAY}, "fields": {FieldType.RECORD},
    "ge": {*_INTS, FieldType.FLOAT, FieldType.NUMERIC},
    "le": {*_INTS, FieldType.FLOAT, FieldType.NUMERIC},
}


def _bound(value: float | int | None) -> Decimal | None:
    """A finite ``ge``/``le`` as the decimal Pydantic compares with (a float by its repr);
    None for none, or an infinity on the side that leaves every value."""
    if value is None or math.isinf(value):
        return None
    return Decimal(repr(value) if isinstance(value, float) else value)


def _admits_nothing(spec: FieldSpec) -> str | None:
    """Why a field's constraints together admit no value (None: some value passes)."""
    for key, value in (("ge", spec.ge), ("le", spec.le)):
        if isinstance(value, float) and math.isnan(value):
            return f"{key} is NaN, which no value compares with"
    if spec.type is FieldType.TEXT and spec.min_length > (spec.max_length or TEXT_MAX):
        return f"min_length {spec.min_length} is over max_length {spec.max_length}"
    if spec.ge is None and spec.le is None:
        return None
    given = " and ".join(f"{k} {v}" for k, v in (("ge", spec.ge), ("le", spec.le))
                         if v is not None)
    if (spec.ge or 0) == math.inf or (spec.le or 0) == -math.inf:
        return f"{given}: a bound of infinity leaves no finite value"
    low, high = _bound(spec.ge), _bound(spec.le)
    if spec.type in _INTS:  # whole numbers inside the column's range
        first, last = spec._whole_bounds
        empty = first > last
    elif spec.type is FieldType.NUMERIC:
        empty = _numeric_empty(spec, low, high)
    else:  # float
        empty = low is not None and high is not None and low > high
    return f"{given} leave no {spec.type.value} value{_shape(spec)}" if empty else None


def _numeric_empty(spec: FieldSpec, low: Decimal | None, high: Decimal | None) -> bool:
    """Whether no multiple of 10**-scale inside numeric(precision, scale) is in [low, high]."""
    step = Decimal(1).scaleb(-spec.scale)
    top = Decimal(10) ** ((spec.precision or 0) - spec.scale) - step
    first = max(-top, -top if low is None else low)
    last = min(top, top if high is None else high)
    return (first / step).to_integral_value(rounding=ROUND_CEILING) > \
        (last / step).to_integral_value(rounding=ROUND_FLOOR)


def _shape(spec: FieldSpec) -> str:
    return f" of numeric({spec.precision},{spec.scale})" if spec.type is FieldType.NUMERIC \
        else ""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _nesting_problem(spec: FieldSpec) -> str | None:
    """Why a ``record`` or an ``array`` cannot be as declared (None: it can)."""
    if spec.type is FieldType.RECORD and not spec.fields:
        return "a record needs fields (each becomes a column); keep an object whole with type " \
            "jsonb"
    if spec.type is FieldType.RECORD and "default" in spec.model_fields_set:
        return "a record takes no default: give its fields defaults"
    if spec.type is not FieldType.ARRAY:
        return None
    if spec.items is None or spec.items.type in (FieldType.ARRAY, FieldType.JSONB,
                                                 FieldType.RECORD):
        return ("an array needs items: a scalar field type (not an array or jsonb, nor a "
                "record; keep an array of objects in a jsonb field)")
    if spec.items.type is FieldType.TIMESTAMPTZ and \
            spec.items.encoding is not TimeEncoding.ISO8601:
        return "an array of timestamps takes ISO-8601 items only"
    return None


class FieldSpec(_Strict):
    """One field of a declared contract (the YAML keys), under the payload's field name."""

    #: The column's type: ``text``, ``smallint``/``integer``/``bigint`` (bounded by the
    #: column's width), ``float``, ``numeric``, ``boolean``, ``timestamptz``, ``date``,
    #: ``uuid``, ``jsonb`` (an object or array kept whole), ``bytea`` (Avro ``bytes`` and
    #: ``fixed``, Protobuf ``bytes``), ``timestamp`` (without time zone), ``time``,
    #: ``interval``, ``array`` of a scalar; or ``record``: an object whose ``fields`` each
    #: land in a column named by its path (``address_city``). docs/formats.md says which
    #: type reads which Avro, Protobuf and JSON Schema type.
    type: FieldType
    #: ``text``: the most characters (required: the column is ``character varying(n)``).
    max_length: Annotated[int, Field(ge=1, le=TEXT_MAX)] | None = None
    #: ``text``: the fewest characters.
    min_length: Annotated[int, Field(ge=0)] = 1
    #: ``numeric``: all digits (required).
    precision: Annotated[int, Field(ge=1, le=1000)] | None = None
    #: ``numeric``: digits after the point (at most ``precision``).
    scale: Annotated[int, Field(ge=0, le=1000)] = 0
    #: ``timestamptz``: how the value arrives (ISO-8601 with an offset, or a number since
    #: the epoch).
    encoding: TimeEncoding = TimeEncoding.ISO8601
    #: ``array``: its items, a field of a scalar type (ISO-8601 timestamps only).
    items: FieldSpec | None = None
    #: ``array``: the most items.
    max_items: Annotated[int, Field(ge=0, le=100_000)] | None = None
    #: ``record``: its fields by their name in the object, declared as the payload's are
    #: (a ``record`` among them nests, at most 3 deep); each is the column
    #: ``<record's column>_<field's column>``.
    fields: dict[Annotated[str, Field(pattern=_PAYLOAD_NAME)], FieldSpec] | None = None
    #: Integers and numbers: the lowest value (narrows the column's range).
    ge: float | int | None = None
    #: Integers and numbers: the highest value.
    le: float | int | None = None
    #: False: a missing or null value is NULL (a ``record``'s: each of its columns is NULL
    #: when the record is missing or null). A field with a ``default`` is optional.
    required: bool = True
    #: The value of a missing field (checked against the field's type when the file loads).
    default: Any = None
    #: The contract version that added the field (it must then be optional: evolution is
    #: additive).
    since: Annotated[int, Field(ge=1)] = 1
    #: The column's name when it differs from the payload's field name (a ``record``'s:
    #: the prefix of its fields' columns; a field inside a record: its part after it).
    column: Annotated[str, Field(pattern=_NAME)] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> FieldSpec:
        given = self.model_fields_set
        for key, types in _ONLY.items():
            if key in given and self.type not in types:
                raise ValueError(f"{key!r} does not apply to type {self.type.value!r}")
        if self.type is FieldType.TEXT and self.max_length is None:
            raise ValueError("a text field needs max_length (Postgres' column and the "
                             "contract's bound)")
        if self.type is FieldType.NUMERIC and (self.precision is None
                                               or self.scale > self.precision):
            raise ValueError("a numeric field needs precision (all digits) and scale (digits "
                             "after the point, at most precision)")
        shape = _nesting_problem(self)
        if shape is not None:
            raise ValueError(shape)
        if "default" in given and "required" in given and self.required:
            raise ValueError("a field with a default is optional: drop 'required: true'")
        empty = _admits_nothing(self)
        if empty is not None:
            raise ValueError(f"{empty}: no value passes, so every record would be "
                             "dead-lettered")
        return self

    @property
    def optional(self) -> bool:
        return not self.required or "default" in self.model_fields_set

    @property
    def value_type(self) -> str:
        """The validated value's type (a ``CONVERTED`` one is converted before it travels)."""
        if self.type in _INTS:
            return _INTS[self.type][2]
        if self.type is FieldType.ARRAY:
            return f"{self._items.column_type}[]"
        if self.type is FieldType.TIMESTAMPTZ and self.encoding in _CONVERTED_TIME:
            return _CONVERTED_TIME[self.encoding][0]
        return _TRAVEL[self.type]

    @property
    def column_type(self) -> str:
        """The column's type name (a ``CONVERTED`` value's after its conversion)."""
        if self.type is FieldType.TIMESTAMPTZ:
            return "timestamptz"
        return self.value_type

    @property
    def _whole_bounds(self) -> tuple[int, int]:
        """An integer type's bounds: ``ge``/``le`` to the whole numbers inside them (``ge:
        1.5`` is 2, an integer validator takes no fraction) and inside the column's range
        (bounds that leave no value are refused as the field loads: :func:`_admits_nothing`)."""
        lowest, highest, _ = _INTS[self.type]
        low, high = _bound(self.ge), _bound(self.le)
        return (lowest if low is None else max(lowest, math.ceil(low)),
                highest if high is None else min(highest, math.floor(high)))

    @property
    def _items(self) -> FieldSpec:
        if self.items is None:  # refused by the validator; here for the type checker
            raise ValueError("an array needs items")
        return self.items

    def annotation(self) -> Any:
        """The Pydantic type of a present, non-null value."""
        bounds: dict[str, Any] = {k: v for k, v in (("ge", self.ge), ("le", self.le))
                                  if v is not None}
        if self.type in _PLAIN:
            return _PLAIN[self.type]
        match self.type:
            case FieldType.TEXT:
                return short_text(self.max_length or TEXT_MAX, min_length=self.min_length)
            case FieldType.SMALLINT | FieldType.INTEGER | FieldType.BIGINT:
                return Annotated[int, Field(ge=self._whole_bounds[0], le=self._whole_bounds[1])]
            case FieldType.FLOAT:
                return Annotated[float, Field(**bounds)]
            case FieldType.NUMERIC:
                return Annotated[Decimal, Field(max_digits=self.precision,
                                                decimal_places=self.scale, **bounds)]
            case FieldType.TIMESTAMPTZ:
                return self._timestamp()
        # An array: its items are scalars (checked by the validator).
        return Annotated[list[self._items.annotation()],  # type: ignore[misc]
                         Field(max_length=self.max_items)]

    def checked_default(self) -> Any:
        """The default validated as if a payload carried it (JSON mode: "1.50" is a
        numeric, "2026-01-01" a date): the same default in every process."""
        if self.default is None:
            return None
        try:
            return TypeAdapter(self.annotation(), config=_PAYLOAD).validate_json(
                to_json(self.default))
        except ValidationError as exc:
            raise ValueError(f"default {self.default!r}: {exc.errors()[0]['msg']}") from None

    def _timestamp(self) -> Any:
        if self.encoding is TimeEncoding.EPOCH_SECONDS:
            return Annotated[float, Field(ge=0, lt=EPOCH_END)]
        if self.encoding is TimeEncoding.EPOCH_MILLIS:
            return Annotated[int, Field(ge=0, le=EPOCH_MS_MAX)]
        return AwareDatetime


@dataclass(frozen=True)
class Leaf:
    """One column of a declaration: a field of a scalar type, where the payload holds it
    (its path: ``("address", "city")``), and whether it may be missing (its own
    ``required``, or a record around it that is optional)."""

    path: tuple[str, ...]
    column: str
    spec: FieldSpec
    optional: bool
    #: The version that added it (a nested field's, or its record's when that is later).
    since: int


def leaves(fields: dict[str, FieldSpec], path: tuple[str, ...] = (), prefix: str = "",
           optional: bool = False, since: int = 1) -> list[Leaf]:
    """Every column of ``fields`` in declaration order, a ``record`` flattened into its
    fields' columns; ValueError for a record nested deeper than :data:`NESTING_MAX`."""
    out: list[Leaf] = []
    for name, spec in fields.items():
        where, column = (*path, name), prefix + (spec.column or name)
        maybe, first = optional or spec.optional, max(since, spec.since)
        if spec.type is not FieldType.RECORD:
            out.append(Leaf(where, column, spec, maybe, first))
            continue
        if len(where) > NESTING_MAX:
            raise ValueError(f"field {'.'.join(where)!r}: records nest at most {NESTING_MAX} "
                             "deep; keep this one whole with type jsonb")
        out += leaves(spec.fields or {}, where, f"{column}_", maybe, first)
    return out


class ContractSpec(_Strict):
    """One declared contract: its newest version and its fields."""

    #: The newest version; versions 1 to this one are registered, each with the fields of
    #: its ``since``.
    version: Annotated[int, Field(ge=1, le=1000)] = 1
    #: What the contract describes (the model's docstring).
    doc: str | None = None
    #: The payload's fields by name, besides ``event_id``: implicit, a text of 1 to 128
    #: characters, required unless the pipeline's ``identity`` is something else.
    fields: dict[Annotated[str, Field(pattern=_PAYLOAD_NAME)], FieldSpec]

    @model_validator(mode="after")
    def _fields(self) -> ContractSpec:
        if not self.fields:
            raise ValueError("a contract needs at least one field besides event_id")
        seen: dict[str, str] = {}
        for leaf in leaves(self.fields):
            name = ".".join(leaf.path)
            if leaf.column in seen:
                raise ValueError(f"fields {seen[leaf.column]!r} and {name!r} both make column "
                                 f"{leaf.column!r}")
            seen[leaf.column] = name
            _check_leaf(leaf, name, self.version)
        return self


def _check_leaf(leaf: Leaf, name: str, version: int) -> None:
    """ValueError when one column of a declaration cannot be (see :class:`ContractSpec`)."""
    column, spec = leaf.column, leaf.spec
    if not re.fullmatch(_NAME, column):
        where = "the record's or the field's" if len(leaf.path) > 1 else "it one with"
        raise ValueError(f"field {name!r}: {column!r} is not a column name (lower case, "
                         f"digits, _, at most 63): give {where} 'column'")
    if column in RESERVED_COLUMNS or leaf.path in ((IMPLICIT_ID,), ("version",)):
        raise ValueError(f"field {name!r}: column {column!r} is reserved (every contract "
                         "and table has it)")
    refuse_system_column(column, f"field {name!r}", "give it another with 'column'")
    if leaf.since > version:
        raise ValueError(f"field {name!r}: since {leaf.since} is after the contract's "
                         f"version {version}")
    if leaf.since > 1 and not leaf.optional:
        raise ValueError(f"field {name!r} was added in version {leaf.since}: it must be "
                         "optional (required: false, or a default), since older payloads "
                         "do not carry it")
    try:
        spec.annotation()  # bounds that leave no value fail here, at load time
        spec.checked_default()  # and so does a default the field refuses
    except ValueError as exc:
        raise ValueError(f"field {name!r}: {exc}") from None


def _class_name(event_type: str, version: int) -> str:
    return "".join(part.title() for part in event_type.split("_")) + f"V{version}"


def _field(leaf: Leaf) -> tuple[Any, Any]:
    """A column's field: read from the payload by its name (an ``alias`` when the column
    is named otherwise), or through its path (``validation_alias=AliasPath(...)``)."""
    spec, name = leaf.spec, leaf.path[0]
    where: dict[str, Any] = (
        {"validation_alias": AliasPath(*leaf.path)} if len(leaf.path) > 1
        else {"alias": name if leaf.column != name else None})
    kind = spec.annotation()
    if not leaf.optional:
        return kind, Field(**where)
    if "default" in spec.model_fields_set and spec.default is not None:
        return kind, Field(default=spec.checked_default(), **where)
    return kind | None, Field(default=None, **where)


_BUILT: dict[tuple[str, str, bool], list[type[Contract]]] = {}


def build_versions(event_type: str, spec: ContractSpec, *,
                   id_required: bool = True) -> list[type[Contract]]:
    """The contract's models, one per version 1..``spec.version``, the implicit
    ``event_id`` required (``id_required``) or optional; the same classes for the same
    declaration within a process."""
    cache_key = (event_type, spec.model_dump_json(exclude_unset=True), id_required)
    if cache_key not in _BUILT:
        _BUILT[cache_key] = _build(event_type, spec, id_required)
    return _BUILT[cache_key]


def declared_model(event_type: str, version: int, spec_json: str, *,
                   id_required: bool = True) -> type[Contract]:
    """A declared contract's model from its declaration as JSON (see ``DECLARATION``):
    how a model reaches another process (it is made at run time, so pickle cannot find it
    by name). ``id_required``: whether the implicit ``event_id`` is required."""
    spec = ContractSpec.model_validate_json(spec_json)
    return build_versions(event_type, spec, id_required=id_required)[version - 1]


def optional_event_id(model: type[Contract]) -> type[Contract]:
    """A declared contract's model whose implicit ``event_id`` is optional (a Python
    contract as it is: its fields are its own)."""
    if model.DECLARATION is None:
        return model
    return declared_model(model.EVENT_TYPE, model.VERSION, model.DECLARATION,
                          id_required=False)


def _build(event_type: str, spec: ContractSpec, id_required: bool) -> list[type[Contract]]:
    models: list[type[Contract]] = []
    for version in range(1, spec.version + 1):
        present = [leaf for leaf in leaves(spec.fields) if leaf.since <= version]
        definitions: dict[str, Any] = {
            IMPLICIT_ID: (EventId, ...) if id_required else (EventId | None, None),
            **{leaf.column: _field(leaf) for leaf in present}}
        definitions["version"] = (int, Field(default=1, ge=1, le=version))
        model: type[Contract] = create_model(
            _class_name(event_type, version), __base__=Contract,
            __doc__=spec.doc or f"Declared contract {event_type}, version {version}.",
            __module__=__name__, **definitions)
        model.EVENT_TYPE = event_type
        model.VERSION = version
        model.SINK_COLUMNS = ((IMPLICIT_ID, "text"),
                              *((leaf.column, leaf.spec.column_type) for leaf in present))
        model.CONVERTED = {leaf.column: _CONVERTED_TIME[leaf.spec.encoding]
                           for leaf in present if leaf.spec.type is FieldType.TIMESTAMPTZ
                           and leaf.spec.encoding in _CONVERTED_TIME}
        model.DECLARATION = spec.model_dump_json(exclude_unset=True)
        models.append(model)
    return models


__all__ = ["IMPLICIT_ID", "NESTING_MAX", "ContractSpec", "FieldSpec", "FieldType", "Leaf",
           "TimeEncoding", "build_versions", "declared_model", "leaves", "optional_event_id"]

