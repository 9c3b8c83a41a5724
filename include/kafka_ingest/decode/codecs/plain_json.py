"""Plain JSON: the record's value is the contract's JSON as it is, with no schema
registry; the contract validates the bytes straight away (no decoding step)."""

from __future__ import annotations

from typing import ClassVar

from kafka_ingest.config import Format
from kafka_ingest.decode.codecs.base import Codec


class JsonCodec(Codec):
    """``format: json`` (the default)."""

    format: ClassVar[Format] = Format.JSON

    def schema_id(self, value: bytes | None) -> int | None:
        return None  # no wire header: a value starting with 0x00 is not a schema id


__all__ = ["JsonCodec"]
