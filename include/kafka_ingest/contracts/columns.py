"""A contract's columns: the one place a field's Postgres column is decided.

Hand-written and declared contracts alike say, per sink column, the type its value travels
in (``SINK_COLUMNS``, and ``CONVERTED`` when it is converted to travel); the column's DDL type and
whether it may be NULL follow from the field itself: a ``max_length`` makes
``character varying(n)``, a ``Decimal`` with digits and places makes ``numeric(p,s)``, an
annotation that admits ``None`` makes a nullable column. Types are spelled as Postgres'
``format_type()`` prints them, so the table planner compares them with the catalog as they
are.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import AliasPath
from pydantic.fields import FieldInfo

#: The type a value travels in -> the column type, as ``format_type()`` prints it.
DDL_TYPES: dict[str, str] = {
    "text": "text",
    "int2": "smallint",
    "int4": "integer",
    "int8": "bigint",
    "float8": "double precision",
    "numeric": "numeric",
    "bool": "boolean",
    "timestamptz": "timestamp with time zone",
    "date": "date",
    "uuid": "uuid",
    "jsonb": "jsonb",
    "bytea": "bytea",
    "timestamp": "timestamp without time zone",
    "time": "time without time zone",
    "interval": "interval",
}


#: The system columns every Postgres table has: ``CREATE TABLE`` refuses a column of one
#: of these names (42701, "column name ... conflicts with a system column name"). ``oid``
#: was one until Postgres 12 (tables lost their hidden oids then) and is a name like any
#: other on every release still supported, so it is not refused.
SYSTEM_COLUMNS = frozenset({"tableoid", "xmin", "cmin", "xmax", "cmax", "ctid"})


def refuse_system_column(column: str, what: str, fix: str) -> None:
    """A ``ValueError`` at load time when ``column`` is a system column's name."""
    if column in SYSTEM_COLUMNS:
        raise ValueError(f"{what}: column {column!r} is the name of a Postgres system column "
                         f"(every table has {', '.join(sorted(SYSTEM_COLUMNS))}; CREATE TABLE "
                         f"refuses another): {fix}")


#: Postgres' epoch (2000-01-01) in Unix seconds and milliseconds.
PG_EPOCH_S = 946_684_800
PG_EPOCH_MS = PG_EPOCH_S * 1000


def seconds_to_pg(seconds: float) -> int:
    """A Unix time in seconds as binary ``COPY`` sends a ``timestamptz``: microseconds
    since Postgres' epoch in an int8. Rounded as Postgres' ``to_timestamp(float8)`` rounds
    (``rint``: to the microsecond, half to even), so the value is the one the server
    would compute."""
    return round((seconds - PG_EPOCH_S) * 1e6)


def millis_to_pg(ms: int) -> int:
    """A Unix time in milliseconds as a binary ``timestamptz`` (see :func:`seconds_to_pg`):
    exact."""
    return (ms - PG_EPOCH_MS) * 1000


@dataclass(frozen=True)
class Column:
    """One column of a target table, and how a row's value reaches it."""

    name: str
    #: The column's type as ``format_type()`` prints it (``character varying(128)``).
    ddl: str
    #: The type of the validated value (what a registry schema's field must give). Three
    #: type names meet here: ``value_type`` (the validated value), ``ddl`` (the column) and
    #: :attr:`copy_type` (what binary ``COPY`` sends).
    value_type: str
    nullable: bool
    #: What turns the validated value into the column's binary ``COPY`` form before it
    #: travels (an epoch into a ``timestamptz``: :func:`seconds_to_pg`);
    #: None when the value travels as it is.
    convert: Callable[[Any], Any] | None = None

    @property
    def copy_type(self) -> str:
        """The type binary ``COPY`` sends the value as: a converted epoch goes as the int8
        that a binary ``timestamptz`` is."""
        return "int8" if self.convert is not None else self.value_type


def _metadata(annotation: Any) -> list[Any]:
    """The constraint objects of an annotation, looking inside ``X | None`` and lists."""
    found: list[Any] = []
    if get_origin(annotation) is Annotated:
        base, *extra = get_args(annotation)
        for item in extra:  # a Field(...) inside Annotated keeps its constraints as metadata
            found += [item, *item.metadata] if isinstance(item, FieldInfo) else [item]
        found += _metadata(base)
    elif get_origin(annotation) in (Union, types.UnionType):
        for arg in get_args(annotation):
            found += _metadata(arg)
    return found


def _constraint(field: FieldInfo, name: str) -> Any:
    for item in (*field.metadata, *_metadata(field.annotation)):
        value = getattr(item, name, None)
        if value is not None:
            return value
    return None


def admits_none(annotation: Any) -> bool:
    if annotation is None or annotation is type(None):
        return True
    if get_origin(annotation) is Annotated:
        return admits_none(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return any(admits_none(arg) for arg in get_args(annotation))
    return annotation is Any


def ddl_type(value_type: str, field: FieldInfo | None) -> str:
    """The column type for a value of ``value_type`` held by ``field``."""
    if value_type.endswith("[]"):
        return ddl_type(value_type[:-2], None) + "[]"
    base = DDL_TYPES.get(value_type)
    if base is None:
        raise ValueError(f"no column type for values of type {value_type!r}; "
                         f"known: {', '.join(DDL_TYPES)}")
    if field is None:
        return base
    if value_type == "text" and (n := _constraint(field, "max_length")) is not None:
        return f"character varying({n})"
    if value_type == "numeric":
        digits, places = _constraint(field, "max_digits"), _constraint(field, "decimal_places")
        if digits is not None:
            return f"numeric({digits},{places or 0})"
    return base


def contract_columns(model: Any) -> tuple[Column, ...]:
    """The columns of a contract's ``SINK_COLUMNS``, in row order."""
    columns = []
    for name, column_type in model.SINK_COLUMNS:
        field = _sink_field(model, name)
        value_type, convert = model.CONVERTED.get(name, (column_type, None))
        columns.append(Column(name=name, ddl=ddl_type(column_type, field), value_type=value_type,
                              nullable=admits_none(field.annotation), convert=convert))
    return tuple(columns)


def _sink_field(model: Any, name: str) -> FieldInfo:
    """The field of sink column ``name``; ValueError (at load time) when there is none."""
    field = model.model_fields.get(name)
    if field is None:
        hint = (" (the base Contract has no event_id: a contract of payloads identified by "
                "one subclasses EventContract)") if name == "event_id" else ""
        raise ValueError(f"contract {model.key()}: sink column {name!r} is not a field of "
                         f"the contract{hint}")
    return field


def payload_paths(model: Any) -> dict[str, str]:
    """Each sink column's field by where the payload holds it -> the column: its name in
    the payload (an alias, or the field's own name), or the dotted path a field read from
    inside an object says (``order.id``: ``validation_alias=AliasPath("order", "id")``).
    What a pipeline's ``identity`` names a field by."""
    paths: dict[str, str] = {}
    for name, _ in model.SINK_COLUMNS:
        field = _sink_field(model, name)
        where = field.validation_alias or field.alias or name
        if isinstance(where, AliasPath):
            where = ".".join(map(str, where.path))
        elif not isinstance(where, str):  # AliasChoices: each of them names the field
            for choice in where.choices:
                paths[choice if isinstance(choice, str)
                      else ".".join(map(str, choice.path))] = name
            continue
        paths[where] = name
    return paths


__all__ = ["DDL_TYPES", "PG_EPOCH_MS", "PG_EPOCH_S", "SYSTEM_COLUMNS", "Column", "admits_none",
           "contract_columns", "ddl_type", "millis_to_pg", "payload_paths",
           "refuse_system_column", "seconds_to_pg"]
