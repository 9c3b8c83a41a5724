"""The error tree and the one place library errors are mapped onto it: nothing unmapped."""

from __future__ import annotations

import inspect

import psycopg
import pytest
from confluent_kafka import KafkaError, KafkaException

from kafka_ingest import errors
from kafka_ingest.errors import (
    DATA_ERROR_CLASSES,
    DatabaseUnavailable,
    DataError,
    DeliveryFailed,
    FencedError,
    IngestError,
    KafkaUnavailable,
    OffsetGapError,
    RejectedByDatabase,
    SchemaMissing,
    TransientError,
    TriggerParamsError,
    map_kafka_error,
    map_psycopg_error,
)

# --------------------------------------------------------------------------- psycopg

PSYCOPG_CLASSES = sorted(
    (cls for cls in vars(psycopg.errors).values()
     if inspect.isclass(cls) and issubclass(cls, psycopg.Error)),
    key=lambda cls: cls.__name__,
)
# SQLSTATEs 25P03/25P04: the server ended the session; psycopg files them under InternalError.
SESSION_ENDED = (psycopg.errors.IdleInTransactionSessionTimeout,
                 psycopg.errors.TransactionTimeout)


def intended(cls: type[psycopg.Error]) -> type[IngestError] | None:
    """The family rule the mapping must follow (STYLE 17), stated independently of it."""
    if issubclass(cls, psycopg.errors.UndefinedTable):
        return SchemaMissing  # the migrations never ran: say so, do not retry
    if issubclass(cls, psycopg.errors.LockNotAvailable | psycopg.errors.QueryCanceled):
        return DatabaseUnavailable  # lock or statement timeout: retry later
    if issubclass(cls, SESSION_ENDED):
        return DatabaseUnavailable
    if issubclass(cls, psycopg.DataError | psycopg.IntegrityError):
        return RejectedByDatabase  # this row: isolate it and dead-letter it
    if issubclass(cls, psycopg.OperationalError | psycopg.InterfaceError):
        return DatabaseUnavailable  # connection lost, server restarting, out of resources
    return None  # programming, internal, unsupported: our bug, let it propagate


@pytest.mark.parametrize("cls", PSYCOPG_CLASSES, ids=lambda c: c.__name__)
def test_every_psycopg_error_class_is_mapped_as_intended(cls: type[psycopg.Error]) -> None:
    mapped = map_psycopg_error("upsert", cls("server said no\n"))
    expected = intended(cls)
    if expected is None:
        assert mapped is None
        return
    assert type(mapped) is expected
    if expected is SchemaMissing:
        assert "kafka-ingest migrate" in str(mapped)
        return
    assert cls.__name__ in str(mapped)
    if expected is DatabaseUnavailable:
        assert isinstance(mapped, DatabaseUnavailable)
        assert mapped.operation == "upsert"
        assert str(mapped).startswith("Postgres upsert failed: ")
    else:
        assert isinstance(mapped, RejectedByDatabase)
        assert mapped.detail == f"{cls.__name__}: server said no"  # stripped


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        (psycopg.OperationalError, DatabaseUnavailable),  # connection refused, lost
        (psycopg.errors.AdminShutdown, DatabaseUnavailable),  # server restarted
        (psycopg.errors.LockNotAvailable, DatabaseUnavailable),  # lock_timeout
        (psycopg.errors.QueryCanceled, DatabaseUnavailable),  # statement_timeout
        (psycopg.errors.IdleInTransactionSessionTimeout, DatabaseUnavailable),  # 25P03
        (psycopg.InterfaceError, DatabaseUnavailable),  # the connection is closed
        (psycopg.DataError, RejectedByDatabase),  # a value Postgres refuses
        (psycopg.errors.NumericValueOutOfRange, RejectedByDatabase),  # out-of-range number
        (psycopg.errors.UntranslatableCharacter, RejectedByDatabase),  # bad text
        (psycopg.IntegrityError, RejectedByDatabase),  # a constraint on the row
        (psycopg.errors.CheckViolation, RejectedByDatabase),  # a CHECK on the row
        (psycopg.ProgrammingError, type(None)),  # our SQL is wrong: not data, not transient
        (psycopg.errors.UndefinedTable, SchemaMissing),  # migration missing: say what to run
        (psycopg.errors.InFailedSqlTransaction, type(None)),  # a bug in our error handling
    ],
)
def test_named_psycopg_cases(cls: type[psycopg.Error], expected: type) -> None:
    assert type(map_psycopg_error("op", cls("x"))) is expected


def test_the_families_cover_both_outcomes() -> None:
    # Guard against a psycopg upgrade that moves everything into one family silently.
    outcomes = {intended(cls) for cls in PSYCOPG_CLASSES}
    assert outcomes == {DatabaseUnavailable, RejectedByDatabase, SchemaMissing, None}
    assert len(PSYCOPG_CLASSES) > 200


# --------------------------------------------------------------------------- Kafka

KAFKA_CODES = sorted(
    {v for k, v in vars(KafkaError).items() if isinstance(v, int) and not k.startswith("__")}
)


@pytest.mark.parametrize("code", KAFKA_CODES)
def test_every_kafka_error_code_is_kafka_unavailable(code: int) -> None:
    err = KafkaError(code)
    mapped = map_kafka_error("read t[0]", err)
    assert type(mapped) is KafkaUnavailable
    assert isinstance(mapped, TransientError)
    assert mapped.operation == "read t[0]"
    assert str(mapped).startswith("Kafka read t[0] failed: ")
    assert err.str() in str(mapped)
    wrapped = map_kafka_error("read t[0]", KafkaException(err))
    assert (type(wrapped), str(wrapped)) == (KafkaUnavailable, str(mapped))


def test_kafka_error_kind_is_in_the_message() -> None:
    fatal = map_kafka_error("produce", KafkaError(KafkaError._FATAL, "fenced", fatal=True))
    retriable = map_kafka_error("produce", KafkaError(KafkaError._TRANSPORT, "down",
                                                      retriable=True))
    assert "_FATAL [fatal]: fenced" in str(fatal)
    assert "_TRANSPORT [retriable]: down" in str(retriable)


@pytest.mark.parametrize("code", [KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET])
def test_offset_out_of_range_says_retention(code: int) -> None:
    mapped = map_kafka_error("read t[0]", KafkaError(code))
    assert "retention may have deleted the planned range" in str(mapped)


def test_anything_else_from_kafka_is_still_transient() -> None:
    mapped = map_kafka_error("metadata", TimeoutError("no answer"))
    assert type(mapped) is KafkaUnavailable
    assert "TimeoutError('no answer')" in str(mapped)


# --------------------------------------------------------------------------- the tree


def _all_subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_all_subclasses(sub)]
    return out


def test_every_data_error_has_a_distinct_class_and_is_listed() -> None:
    subclasses = [c for c in _all_subclasses(DataError) if c.__module__ == errors.__name__]
    assert set(subclasses) == set(DATA_ERROR_CLASSES)
    assert len(DATA_ERROR_CLASSES) == len(set(DATA_ERROR_CLASSES))
    names = [c.error_class for c in DATA_ERROR_CLASSES]
    assert len(set(names)) == len(names)
    assert DataError.error_class not in names  # the generic class (tombstones) stays apart
    for cls in DATA_ERROR_CLASSES:
        assert cls.error_class == cls.error_class.lower().replace(" ", "_")
        assert cls("why").detail == "why"


def test_the_tree() -> None:
    for cls in (KafkaUnavailable, DeliveryFailed, DatabaseUnavailable,
                errors.CommitOutcomeUnknown):
        assert issubclass(cls, TransientError)
    for cls in (FencedError, OffsetGapError, errors.ReconciliationError, TriggerParamsError,
                DataError):
        assert issubclass(cls, IngestError)
        assert not issubclass(cls, TransientError)
    assert not issubclass(DataError, TransientError)


def test_errors_carry_fields_and_build_their_message() -> None:
    fenced = FencedError("p", "t", 2, expected=10, found=15)
    assert (fenced.partition, fenced.expected, fenced.found) == (2, 10, 15)
    assert "stored offset is 15, expected 10" in str(fenced)
    unknown = errors.CommitOutcomeUnknown("p", 1, 5, 9)
    assert "[5, 9)" in str(unknown)
    failed = DeliveryFailed("dlq", ["a", "b", "c", "d"], 10)
    assert "4 of 10 dead letters were not delivered to 'dlq' (first: a; b; c)" in str(failed)
