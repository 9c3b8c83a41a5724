#!/usr/bin/env bash
# The main job end to end: install, start Kafka + Postgres + Airflow's metadata DB, produce
# sample events with poison pills, run the ingest DAG for real, print a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh --demo  # not the tests' browser nor the Celery broker
exec .venv/bin/kafka-ingest demo "$@"
