"""A contract's columns: the one place a field's Postgres column is decided.

Hand-written and declared contracts alike say, per sink column, the type its value travels
in (``SINK_COLUMNS``, and ``STAGED`` when Postgres converts it); the column's DDL type and
whether it may be NULL follow from the field itself: a ``max_length`` makes
``character varying(n)``, a ``Decimal`` with digits and places makes ``numeric(p,s)``, an
annotation that admits ``None`` makes a nullable column. Types are spelled as Postgres'
``format_type()`` prints them, so the table planner compares them with the catalog as they
are.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Annotated, Any, Union, get_args, get_origin

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
}


@dataclass(frozen=True)
class Column:
    """One column of a target table, and how a row's value reaches it."""

    name: str
    #: The column's type as ``format_type()`` prints it (``character varying(128)``).
    ddl: str
    #: The type the value travels in (binary COPY into the staging table).
    copy_type: str
    nullable: bool
    #: SQL that turns the travelled value into the column's type, ``{}`` for the value
    #: (``to_timestamp({})``); None when it travels as the column's own type.
    convert: str | None = None


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


def ddl_type(travel_type: str, field: FieldInfo | None) -> str:
    """The column type for a value of ``travel_type`` held by ``field``."""
    if travel_type.endswith("[]"):
        return ddl_type(travel_type[:-2], None) + "[]"
    base = DDL_TYPES.get(travel_type)
    if base is None:
        raise ValueError(f"no column type for values of type {travel_type!r}; "
                         f"known: {', '.join(DDL_TYPES)}")
    if field is None:
        return base
    if travel_type == "text" and (n := _constraint(field, "max_length")) is not None:
        return f"character varying({n})"
    if travel_type == "numeric":
        digits, places = _constraint(field, "max_digits"), _constraint(field, "decimal_places")
        if digits is not None:
            return f"numeric({digits},{places or 0})"
    return base


def contract_columns(model: Any) -> tuple[Column, ...]:
    """The columns of a contract's ``SINK_COLUMNS``, in row order."""
    columns = []
    for name, final_type in model.SINK_COLUMNS:
        field = model.model_fields[name]
        travel, convert = model.STAGED.get(name, (final_type, None))
        columns.append(Column(name=name, ddl=ddl_type(final_type, field), copy_type=travel,
                              nullable=admits_none(field.annotation), convert=convert))
    return tuple(columns)


__all__ = ["DDL_TYPES", "Column", "admits_none", "contract_columns", "ddl_type"]
