"""What the tests share: fakes at the core's ports, helpers for runs, DAGs, Airflow's API and
faults, deadlines, the session's scheduling on xdist workers. Imported as
``tests.support.<module>``, from every test directory alike."""

from pathlib import Path

#: The repository's root.
ROOT = Path(__file__).resolve().parents[2]
