"""What the tests share: fakes at the core's ports, helpers for runs, DAGs, Airflow's API and
faults, deadlines, the session's scheduling on xdist workers. Imported as
``tests.support.<module>``, from every test directory alike."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

from kafka_ingest.contracts.columns import PG_EPOCH_S

#: The repository's root.
ROOT = Path(__file__).resolve().parents[2]


def pg_to_datetime(us: int | None) -> datetime | None:
    """A binary ``timestamptz`` value (microseconds since 2000-01-01 UTC, as
    ``kafka_ingest.contracts.columns.seconds_to_pg`` makes it) as a datetime (UTC)."""
    if us is None:
        return None
    return datetime.fromtimestamp(PG_EPOCH_S, tz=UTC) + timedelta(microseconds=us)
