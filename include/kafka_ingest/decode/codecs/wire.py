"""The Confluent wire format's header, in front of every registry format's payload:
``0x00``, then the writer schema's id as 4 big-endian bytes."""

from __future__ import annotations

import struct

from kafka_ingest.errors import NotWireFormat

MAGIC = 0
_HEADER = struct.Struct(">bI")
#: The header's length: a payload starts at this byte.
HEADER_SIZE = _HEADER.size


def wire_schema_id(value: bytes | None) -> int | None:
    """The schema id of a wire-format value, or None when it is not one."""
    if value is None or len(value) < _HEADER.size or value[0] != MAGIC:
        return None
    return int(_HEADER.unpack_from(value)[1])


def split_header(value: bytes) -> tuple[int, bytes]:
    """(schema id, payload); :class:`NotWireFormat` when the header is not there."""
    if len(value) < _HEADER.size:
        raise NotWireFormat(f"value is {len(value)} bytes: too short for the wire format's "
                            "header (magic byte 0 and a 4-byte schema id)")
    if value[0] != MAGIC:
        raise NotWireFormat(f"no magic byte: the value starts with 0x{value[0]:02x}, not "
                            "0x00 (not written by a registry serializer)")
    return int(_HEADER.unpack_from(value)[1]), value[_HEADER.size:]


__all__ = ["HEADER_SIZE", "MAGIC", "split_header", "wire_schema_id"]
