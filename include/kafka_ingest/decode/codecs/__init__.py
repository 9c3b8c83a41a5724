"""One codec per value format, behind one interface (:class:`~.base.Codec`), looked up
once per pipeline with :func:`codec_for`; nothing outside this package asks which format
a pipeline reads.

=================  =====================================  ==============================
``format``         the record's value                     module
=================  =====================================  ==============================
``json``           the contract's JSON, no registry       :mod:`.plain_json`
``avro``           wire header + Avro binary              :mod:`.avro`
``protobuf``       wire header + message indexes + msg    :mod:`.protobuf`
``json_schema``    wire header + JSON                     :mod:`.json_schema`
=================  =====================================  ==============================

The wire header (:mod:`.wire`) is ``0x00`` and the writer schema's id; the schema is
fetched once per id by the slice's :class:`~kafka_ingest.decode.decoder.RegistryDecoder`.
A new format is a module here with a :class:`~.base.Codec` subclass, added to
:data:`CODECS`, and a member of :class:`~kafka_ingest.config.Format`.
"""

from __future__ import annotations

from kafka_ingest.config import Format
from kafka_ingest.decode.codecs.avro import AvroCodec
from kafka_ingest.decode.codecs.base import (
    Codec,
    Fields,
    NoSuchRecord,
    PayloadReader,
    WriterField,
)
from kafka_ingest.decode.codecs.json_schema import JsonSchemaCodec
from kafka_ingest.decode.codecs.plain_json import JsonCodec
from kafka_ingest.decode.codecs.protobuf import ProtobufCodec

#: Every format's codec (stateless: one instance serves every pipeline).
CODECS: dict[Format, Codec] = {
    codec.format: codec
    for codec in (JsonCodec(), AvroCodec(), ProtobufCodec(), JsonSchemaCodec())}


def codec_for(fmt: Format | str) -> Codec:
    """The codec of a ``format`` (a pipeline's ``pipeline.format``, or its name)."""
    try:
        return CODECS[fmt]  # type: ignore[index]  # a name finds its member: a StrEnum
    except KeyError:
        raise ValueError(f"no codec reads format {fmt!r}: the formats are "
                         f"{', '.join(CODECS)}") from None


__all__ = ["CODECS", "Codec", "Fields", "NoSuchRecord", "PayloadReader", "WriterField",
           "codec_for"]
