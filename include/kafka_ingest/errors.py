"""The errors of kafka_ingest, and the one place where library errors are mapped onto them.

The tree decides what happens to a failure::

    IngestError
    ├── TransientError            raise; nothing is committed; Airflow retries with backoff
    │   ├── KafkaUnavailable      broker unreachable, metadata or fetch timed out
    │   ├── DeliveryFailed        a dead letter was not acknowledged by the DLQ topic
    │   ├── DatabaseUnavailable   Postgres down, restarted, connection lost, lock timeout
    │   └── CommitOutcomeUnknown  the reply to COMMIT was lost; re-read the stored offset
    ├── FencedError               the stored offset moved under us (zombie or overlapping run)
    ├── OffsetGapError            the range starts below the low watermark (retention)
    ├── ReconciliationError       read != inserted + duplicates + stale + dead + skipped
    ├── TriggerParamsError        a trigger form / CLI range that cannot be honoured
    ├── SchemaMissing             the pipelines' tables are not there: run the migrations
    ├── TopicMissing              a source or dead-letter topic does not exist
    └── DataError                 dead-letter the message, the batch goes on
        ├── Undecodable           not UTF-8, not JSON, nested too deep, empty
        ├── NotAnObject           JSON that is an array, a number, a string or null
        ├── ContractViolation     fails the Pydantic contract
        ├── UnknownVersion        a contract version this pipeline does not accept
        ├── TooLarge              over the pipeline's max_message_bytes
        └── RejectedByDatabase    passed the contract, Postgres still refused it

Bad configuration is not an IngestError: it raises ``ValueError`` when it is loaded.
"""

from __future__ import annotations

from typing import Any


class IngestError(Exception):
    """Base of every error this package raises on purpose."""


class TransientError(IngestError):
    """Infrastructure failed; nothing was committed. Retrying later is the cure."""


class KafkaUnavailable(TransientError):
    """The broker did not answer or answered with a retriable error."""

    def __init__(self, operation: str, reason: str) -> None:
        self.operation = operation
        self.reason = reason
        super().__init__(f"Kafka {operation} failed: {reason}")


class DeliveryFailed(TransientError):
    """At least one dead letter was not acknowledged by the DLQ topic."""

    def __init__(self, topic: str, failures: list[str], total: int) -> None:
        self.topic = topic
        self.failures = failures
        self.total = total
        shown = "; ".join(failures[:3])
        super().__init__(
            f"{len(failures)} of {total} dead letters were not delivered to {topic!r} "
            f"(first: {shown}); nothing was committed"
        )


class DatabaseUnavailable(TransientError):
    """Postgres is down, restarted, or a lock could not be taken in time."""

    def __init__(self, operation: str, reason: str) -> None:
        self.operation = operation
        self.reason = reason
        super().__init__(f"Postgres {operation} failed: {reason}")


class CommitOutcomeUnknown(TransientError):
    """The COMMIT was sent but its reply was lost: it may or may not have happened."""

    def __init__(self, pipeline: str, partition: int, start: int, end: int) -> None:
        self.pipeline = pipeline
        self.partition = partition
        self.start = start
        self.end = end
        super().__init__(
            f"{pipeline}[{partition}]: the reply to COMMIT of [{start}, {end}) was lost; "
            "the stored offset must be re-read before anything else is done"
        )


class FencedError(IngestError):
    """The stored offset is not where this run expected it: another run owns the slice."""

    def __init__(self, pipeline: str, topic: str, partition: int, expected: int, found: int | None):
        self.pipeline = pipeline
        self.topic = topic
        self.partition = partition
        self.expected = expected
        self.found = found
        super().__init__(
            f"{pipeline} {topic}[{partition}]: stored offset is {found}, expected {expected}; "
            "another run advanced it, this chunk was rolled back"
        )


class OffsetGapError(IngestError):
    """The planned start is below the low watermark: retention deleted unread data."""

    def __init__(self, topic: str, partition: int, start: int, low: int) -> None:
        self.topic = topic
        self.partition = partition
        self.start = start
        self.low = low
        super().__init__(
            f"{topic}[{partition}]: offsets [{start}, {low}) were deleted by retention before "
            f"they were ingested ({low - start} messages lost to this pipeline). Set "
            "on_offset_gap: skip to record the gap and go on, or restore the data."
        )


class ReconciliationError(IngestError):
    """The counts of a slice do not add up, or valid rows are not in the table after the
    upsert: something was lost or counted twice."""

    def __init__(self, partition: int, read: int, accounted: dict[str, int],
                 *, missing: int = 0) -> None:
        self.partition = partition
        self.read = read
        self.accounted = accounted
        self.missing = missing
        parts = " + ".join(f"{k} {v}" for k, v in accounted.items())
        lost = f"; {missing} valid rows are not in the table after the upsert" if missing else ""
        super().__init__(
            f"partition {partition}: read {read} but {parts} = {sum(accounted.values())}{lost}"
        )


class SchemaMissing(IngestError):
    """A table the pipelines need does not exist in the database."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"{detail}; create the schema with `kafka-ingest migrate`")


class TopicMissing(IngestError, ValueError):
    """A topic the pipeline reads or writes does not exist (topics are not auto-created)."""

    def __init__(self, topic: str, role: str = "topic") -> None:
        self.topic = topic
        super().__init__(f"{role} {topic!r} does not exist on the cluster; create it "
                         "(kafka-topics.sh --create ...) or fix the pipeline's config")


class TriggerParamsError(IngestError, ValueError):
    """A manual run's parameters cannot be honoured; the message says what to fix."""


class DataError(IngestError):
    """A message that cannot be loaded. It is dead-lettered; the batch goes on."""

    error_class = "data_error"

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


class Undecodable(DataError):
    error_class = "undecodable"


class NotAnObject(DataError):
    error_class = "not_an_object"


class ContractViolation(DataError):
    error_class = "contract_violation"


class UnknownVersion(DataError):
    error_class = "unknown_version"


class TooLarge(DataError):
    error_class = "too_large"


class RejectedByDatabase(DataError):
    error_class = "rejected_by_database"


#: Errors a retry cannot cure: the task should fail at once and say why.
PERMANENT_ERRORS: tuple[type[IngestError], ...] = (
    OffsetGapError,
    SchemaMissing,
    TopicMissing,
    ReconciliationError,
    TriggerParamsError,
)

DATA_ERROR_CLASSES: tuple[type[DataError], ...] = (
    Undecodable,
    NotAnObject,
    ContractViolation,
    UnknownVersion,
    TooLarge,
    RejectedByDatabase,
)


def map_kafka_error(operation: str, err: Any) -> IngestError:
    """Map a confluent-kafka ``KafkaError`` (or ``KafkaException``) onto the tree.

    Every broker-side failure we meet while reading or producing is infrastructure: it is
    raised for Airflow to retry, never dead-lettered. ``OFFSET_OUT_OF_RANGE`` is the one
    exception: with ``auto.offset.reset=error`` it means retention deleted the range.
    """
    from confluent_kafka import KafkaError, KafkaException

    if isinstance(err, KafkaException):
        err = err.args[0] if err.args else err
    if isinstance(err, KafkaError):
        code = err.code()
        if code in (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET):
            return KafkaUnavailable(operation, f"offset out of range ({err.str()}); "
                                    "retention may have deleted the planned range")
        kind = "fatal" if err.fatal() else ("retriable" if err.retriable() else "error")
        return KafkaUnavailable(operation, f"{err.name()} [{kind}]: {err.str()}")
    return KafkaUnavailable(operation, repr(err))


def map_psycopg_error(operation: str, exc: BaseException) -> IngestError | None:
    """Map a psycopg error onto the tree; ``None`` means "not ours, let it propagate".

    ``psycopg.DataError`` and integrity errors on a row are data errors (the sink isolates
    the row by bisection); connection and server-state errors are transient.
    """
    import psycopg

    if isinstance(exc, psycopg.errors.UndefinedTable):
        return SchemaMissing(str(exc).strip().splitlines()[0])
    # Lock and statement timeouts, and the server ending an idle or too long transaction's
    # session (SQLSTATE 25P03, 25P04: psycopg files those under InternalError).
    server_gave_up = (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled,
                      psycopg.errors.IdleInTransactionSessionTimeout,
                      psycopg.errors.TransactionTimeout)
    if isinstance(exc, server_gave_up):
        return DatabaseUnavailable(operation, f"{type(exc).__name__}: {exc}")
    if isinstance(exc, psycopg.DataError | psycopg.IntegrityError):
        return RejectedByDatabase(f"{type(exc).__name__}: {str(exc).strip()}")
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return DatabaseUnavailable(operation, f"{type(exc).__name__}: {str(exc).strip()}")
    return None
