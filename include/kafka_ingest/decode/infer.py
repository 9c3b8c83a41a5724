"""A declaration guessed from what a topic holds: the fields of sampled schemaless JSON
records (:func:`infer_fields`), what identifies them (:func:`sample_identity`,
:func:`id_candidates`), and the pipelines-file document both go into
(:func:`declaration`), for ``kafka-ingest schema from-topic`` and ``schema from-registry``.

Guesses, said as such: each comes with why, for the comments the commands print. What is
guessed is loadable as printed (the commands check the document against the records or
the schema it was made from before printing it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

from kafka_ingest.contracts.declared import IMPLICIT_ID, RESERVED_COLUMNS

#: A payload field name a declared contract takes (:class:`ContractSpec`'s keys).
FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")
#: The widest text bound a guess gives (a wider value is left to the user's judgement).
TEXT_GUESS_MAX = 10_000
#: Field names that say they hold a time (``ordertime``, ``created_at``, ``updatedAt``,
#: ``ts``, ``timestamp``).
_TIME_NAME = re.compile(r"(time|timestamp|_at|At|^ts|_ts|Ts|date|Date)$")
#: Epoch numbers of 2001-09-09 .. 2286-11-20 in seconds, and the same in milliseconds.
_EPOCH_S = (10**9, 10**10)
_EPOCH_MS = (10**12, 10**13)
_ISO_DATETIME = re.compile(
    r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})$")
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def column_name(name: str) -> str:
    """``updatedAt`` -> ``updated_at``, ``trace-id`` -> ``trace_id``."""
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()
    return re.sub(r"[^a-z0-9_]", "_", snake)[:63]


def text_bound(longest: int) -> int:
    """A generous ``max_length`` for text whose longest sampled value is ``longest``
    characters: twice that, rounded up to a power of two, at least 16."""
    return min(TEXT_GUESS_MAX, max(16, 1 << max(0, 2 * longest - 1).bit_length()))


# --------------------------------------------------------------------------- identity


@dataclass(frozen=True)
class ProposedIdentity:
    """A proposed ``identity``: a payload field's name, ``record_key`` (with the
    ``record_key`` section it needs) or ``source_position``; ``None``: the default
    (``event_id``). ``why``: one line for the comment."""

    value: str | None
    why: str
    record_key: dict[str, Any] | None = None


def _entities(topic: str, record: str | None) -> set[str]:
    """What the records are, by the last word of the topic's name and of the record's
    (``shop.orders.v1`` and ``OrderPlaced``: orders, placed) and their singulars: the
    words an own id is named after (``orderid``). The last word only: ``user-events``
    holds events, not users, and its ``userid`` is not its records' id."""
    words = [w for w in re.split(r"[-_.]", topic.lower()) if w.isalpha() and len(w) > 2][-1:]
    if record:
        camel = re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])", record.rsplit(".", 1)[-1])
        words += [w.lower() for w in camel if len(w) > 2][-1:]
    return {w for word in words for w in (word, word.removesuffix("s"))}


def id_candidates(names: Iterable[str], *, topic: str,
                  record: str | None = None) -> list[tuple[str, str]]:
    """The fields whose names say they identify a record, best first, each with why:
    the topic's or record's own id (``orderid``, ``transaction_id`` in ``orders``,
    ``transactions``), then ``id``, then one ``*_id``/``*Id`` field. Several ``*_id``
    fields and none named after the topic say nothing: each may be another entity's
    (``user_id`` in a topic of page views)."""
    entities = _entities(topic, record)
    named_by = f"topic {topic!r}" + (f", record {record!r}" if record else "")
    own, plain, suffixed = [], [], []
    for name in names:
        bare = re.sub(r"[^a-z0-9]", "", name.lower())
        if bare.endswith("id") and bare[:-2] in entities:
            own.append((name, f"{name!r} is named as the records' own id ({bare[:-2]}; "
                              f"{named_by})"))
        elif bare == "id":
            plain.append((name, f"{name!r} is the record's id by its name"))
        elif re.search(r"(_id|Id|_ID)$", name):
            suffixed.append((name, f"{name!r} is the only field named like an id"))
    return own + plain + (suffixed if len(suffixed) == 1 else [])


# --------------------------------------------------------------------------- the fields


@dataclass
class _Seen:
    """What the sample held for one field."""

    kinds: set[str] = field(default_factory=set)
    values: list[Any] = field(default_factory=list)
    present: int = 0
    nulls: int = 0


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    return "json"  # an object or an array


def _epoch(name: str, values: Sequence[int]) -> str | None:
    if not _TIME_NAME.search(name) or not values:
        return None
    for encoding, (low, high) in (("epoch_millis", _EPOCH_MS), ("epoch_seconds", _EPOCH_S)):
        if all(low <= v < high for v in values):
            return encoding
    return None


def _is_datetime(text: str) -> bool:
    if not _ISO_DATETIME.match(text):
        return False
    try:
        datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def _is_date(text: str) -> bool:
    if not _ISO_DATE.match(text):
        return False
    try:
        date.fromisoformat(text)
    except ValueError:
        return False
    return True


def _spec(name: str, seen: _Seen) -> tuple[dict[str, Any] | None, str]:
    """The declared field of what the sample held, or None, and what was guessed."""
    kinds, values = seen.kinds, seen.values
    if not kinds:
        return None, "always null in the sample: no type to guess"
    if kinds == {"bool"}:
        return {"type": "boolean"}, "boolean"
    if kinds == {"int"}:
        return _int_spec(name, values)
    if kinds <= {"int", "float"}:
        if not all(math.isfinite(v) for v in values):
            return None, "NaN or infinite in the sample"
        return {"type": "float"}, "float (numbers with a fraction)"
    if kinds == {"str"}:
        return _str_spec(values)
    if kinds == {"json"}:
        return {"type": "jsonb"}, "jsonb: an object or array kept whole"
    return None, f"mixed types in the sample ({', '.join(sorted(kinds))})"


def _int_spec(name: str, values: Sequence[int]) -> tuple[dict[str, Any] | None, str]:
    encoding = _epoch(name, values)
    if encoding:
        return ({"type": "timestamptz", "encoding": encoding},
                f"timestamptz: named like a time, its numbers are {encoding}")
    if not all(-2**63 <= v < 2**63 for v in values):
        return None, "integers wider than a bigint"
    return {"type": "bigint"}, "bigint"


def _str_spec(values: Sequence[str]) -> tuple[dict[str, Any] | None, str]:
    if all(_is_datetime(v) for v in values):
        return {"type": "timestamptz"}, "timestamptz: ISO-8601 with an offset"
    if all(_is_date(v) for v in values):
        return {"type": "date"}, "date: ISO-8601"
    longest = max(len(v) for v in values)
    bound = text_bound(longest)
    if longest > bound:
        return None, f"text of {longest} characters, over the {TEXT_GUESS_MAX} a guess gives"
    spec: dict[str, Any] = {"type": "text", "max_length": bound}
    if "" in values:
        spec["min_length"] = 0
    return spec, f"text: the longest is {longest} characters, bound {bound}"


@dataclass(frozen=True)
class Inferred:
    """The declared fields guessed from a sample, what was guessed of each, and the fields
    left out with why; ``unique``: the required fields whose values no two sampled records
    share (identity candidates)."""

    fields: dict[str, dict[str, Any]]
    guesses: list[str]
    left_out: list[str]
    unique: set[str]


def infer_fields(records: Sequence[Mapping[str, Any]]) -> Inferred:
    """Each top-level field of ``records`` (decoded JSON objects) as a declared field:
    its type from its values; optional when any record lacks it or holds null."""
    seen: dict[str, _Seen] = {}
    for record in records:
        for name, value in record.items():
            s = seen.setdefault(name, _Seen())
            s.present += 1
            if value is None:
                s.nulls += 1
            else:
                s.kinds.add(_kind(value))
                s.values.append(value)
    fields: dict[str, dict[str, Any]] = {}
    guesses, left_out, unique = [], [], set()
    for name, s in seen.items():
        reason = _reserved(name)
        spec, guess = (None, reason) if reason else _spec(name, s)
        if spec is None:
            left_out.append(f"{name}: {guess}")
            continue
        required = s.present == len(records) and not s.nulls
        if not required:
            spec["required"] = False
            guess += (f"; optional: missing or null in {len(records) - s.present + s.nulls}"
                      f" of {len(records)} records")
        column = column_name(name)
        if column != name:
            spec["column"] = column
        fields[name] = spec
        guesses.append(f"{name}: {guess}")
        if (required and spec["type"] in ("bigint", "text")
                and len(set(map(str, s.values))) == len(records)):
            unique.add(name)
    return Inferred(fields, guesses, left_out, unique)


def _reserved(name: str) -> str | None:
    if name == IMPLICIT_ID:
        return None
    if name == "version":
        return ("the payload's 'version' is the contract version it was written with: "
                "a value over 1 is dead-lettered (unknown_version)")
    if not FIELD_NAME.match(name):
        return "not a name a contract field may have"
    if column_name(name) in RESERVED_COLUMNS:
        return f"its column {column_name(name)!r} is one every table has; rename it (column:)"
    return None


def sample_identity(inferred: Inferred, keys: Sequence[bytes | None], *,
                    topic: str) -> ProposedIdentity:
    """What identifies the sampled records: a field named as an id whose values the
    sample never repeats; else the record key when every record has one and no two share
    it; else the place in the log."""
    n = len(keys)
    if IMPLICIT_ID in inferred.unique:
        inferred.fields.pop(IMPLICIT_ID, None)
        return ProposedIdentity(None, f"'event_id' (the default): present and distinct in "
                                      f"all {n} sampled records")
    inferred.fields.pop(IMPLICIT_ID, None)
    for name, why in id_candidates(inferred.unique, topic=topic):
        return ProposedIdentity(name, f"{why}; present, non-null and distinct in all {n} "
                                      "sampled records")
    texts = [_utf8(k) for k in keys]
    if n and all(t for t in texts) and len(set(texts)) == n:
        longest = max(len(t or "") for t in texts)
        section = {"column": key_column(inferred.fields), "max_length": text_bound(longest)}
        return ProposedIdentity("record_key", f"no field names itself an id; every one of "
                                              f"the {n} sampled records has a distinct record "
                                              "key", section)
    return ProposedIdentity("source_position", f"no field names itself an id and is "
                                               f"distinct in the {n} sampled records, nor is "
                                               "the record key: each record is identified by "
                                               "its place in the log")


def _utf8(key: bytes | None) -> str | None:
    if not key:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return None


def key_column(fields: Mapping[str, Mapping[str, Any]]) -> str:
    """The record key's column: ``record_key``, unless a field's column is named so."""
    taken = {spec.get("column", name) for name, spec in fields.items()}
    return "record_key" if "record_key" not in taken else "kafka_record_key"


# --------------------------------------------------------------------------- the document


def declaration(*, event_type: str, contract: dict[str, Any], pipeline: str, topic: str,
                identity: ProposedIdentity, extra: Mapping[str, Any] = {}) -> dict[str, Any]:
    """The pipelines-file document: the contract, and a pipeline reading ``topic`` with
    it, identified by ``identity`` (``extra``: the format's keys)."""
    body: dict[str, Any] = {
        "topic": topic, "dlq_topic": f"{topic}-dlq", "table": column_name(pipeline),
        "contract": {"event_type": event_type, "version": contract["version"]}, **extra}
    if identity.record_key is not None:
        body["record_key"] = identity.record_key
    if identity.value is not None:
        body["identity"] = identity.value
    return {"contracts": {event_type: contract}, "pipelines": {pipeline: body}}


__all__ = ["Inferred", "ProposedIdentity", "column_name", "declaration", "id_candidates",
           "infer_fields", "key_column", "sample_identity", "text_bound"]
