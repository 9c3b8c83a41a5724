"""Columns read from the record itself: its key and its headers.

A pipeline may take a column from the record key (Kafka Connect's ``pk.mode=record_key``)
and columns from headers (``trace-id`` -> ``trace_id``). Each is checked as strictly as a
contract field (UTF-8, no NUL, a bound on its length, a bigint in range); a record whose
key or header cannot fill its column is dead-lettered (:class:`BadKey`,
:class:`BadHeader`), never a crash. Pipelines without such columns never call this.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kafka_ingest.config import HeaderColumn, KeyFormat, KeyType, Pipeline, RecordKey
from kafka_ingest.contracts.base import BIGINT_MAX, BIGINT_MIN
from kafka_ingest.decode.decoder import RegistryDecoder
from kafka_ingest.errors import BadHeader, BadKey, DataError
from kafka_ingest.records import MessageLike

#: A message -> the values of the pipeline's key and header columns, in their order.
ColumnReader = Callable[[MessageLike], tuple[Any, ...]]


def _text(raw: bytes, max_length: int, what: str, error: type[BadKey | BadHeader]) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise error(f"{what} is not UTF-8: byte 0x{raw[err.start]:02x} at position "
                    f"{err.start}") from None
    if text and len(text) <= max_length and "\x00" not in text:
        return text  # the usual key, checked inline (UTF-8 decodes to no lone surrogate)
    return _checked(text, max_length, what, error)


def _checked(text: str, max_length: int, what: str, error: type[BadKey | BadHeader]) -> str:
    if not text:
        raise error(f"{what} is empty")
    if len(text) > max_length:
        raise error(f"{what} is {len(text)} characters, over its column's {max_length}")
    if "\x00" in text:
        raise error(f"{what} contains NUL, which Postgres text cannot hold")
    try:  # a JSON key may spell a lone surrogate ("\\ud800"), which no encoding takes
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise error(f"{what} is not valid Unicode (a lone surrogate)") from None
    return text


def _structured(spec: RecordKey, raw: bytes, decoder: RegistryDecoder | None) -> Any:
    """A JSON or registry-encoded key, decoded."""
    if spec.format is KeyFormat.JSON:
        try:
            return spec.unwrapped(json.loads(raw))
        except (ValueError, RecursionError):
            raise BadKey("record key is not JSON") from None
    if decoder is None:  # refused when the pipeline loads; here for the type checker
        raise BadKey("record key: the pipeline has no registry format to read it with")
    try:
        return decoder.read_python(raw)
    except DataError as exc:  # not the wire format, an unknown schema, undecodable
        raise BadKey(f"record key: {exc.detail}") from None


def key_value(spec: RecordKey, raw: bytes | None,
              decoder: RegistryDecoder | None = None) -> str | int:
    """The record key's column value; :class:`BadKey` when it cannot be one."""
    if raw is None:
        raise BadKey("the record has no key, and the pipeline reads a column from it")
    if spec.format is KeyFormat.STRING:
        return _text(raw, spec.max_length, "record key", BadKey)
    value = _structured(spec, raw, decoder)
    what = "record key"
    shape = "JSON " if spec.format is KeyFormat.JSON else ""
    if spec.field is not None:
        if not isinstance(value, dict) or spec.field not in value:
            raise BadKey(f"record key is not a {shape}object with the field {spec.field!r}")
        value, what = value[spec.field], f"record key field {spec.field!r}"
    if spec.type is KeyType.BIGINT:
        if type(value) is not int or not BIGINT_MIN <= value <= BIGINT_MAX:
            raise BadKey(f"{what} is not an integer a bigint holds")
        return value
    if not isinstance(value, str):
        raise BadKey(f"{what} is not a {shape}string")
    return _checked(value, spec.max_length, what, BadKey)


def _header(name: str, spec: HeaderColumn, headers: list[tuple[str, bytes | None]]) -> str | None:
    raw = next((v for k, v in reversed(headers) if k == name), None)  # the last one wins
    if raw is None:
        if spec.required:
            raise BadHeader(f"header {name!r} is missing (its column {spec.column!r} is "
                            "required)")
        return None
    return _text(raw, spec.max_length, f"header {name!r}", BadHeader)


def column_reader(pipeline: Pipeline,
                  decoder: RegistryDecoder | None = None) -> ColumnReader | None:
    """What fills the pipeline's key and header columns, or None when it has none."""
    key, headers = pipeline.key_column, tuple(pipeline.headers.items())
    if key is None and not headers:
        return None

    def read(msg: MessageLike) -> tuple[Any, ...]:
        values: list[Any] = [key_value(key, msg.key(), decoder)] if key is not None else []
        if headers:
            present = msg.headers() or []
            values += [_header(name, spec, present) for name, spec in headers]
        return tuple(values)

    if key is not None and not headers:  # the key alone: one tuple, no list first
        def read_key(msg: MessageLike) -> tuple[Any, ...]:
            return (key_value(key, msg.key(), decoder),)

        return read_key
    return read


__all__ = ["ColumnReader", "column_reader", "key_value"]
