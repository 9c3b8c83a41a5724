#!/usr/bin/env bash
# The whole test suite, from a clean clone: install, start the local stack (with its schema
# registry), lint, type-check, then unit, integration, DAG and chaos tests against the real
# Kafka and Postgres.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
. .venv/bin/activate
kafka-ingest stack up --secure --registry
eval "$(kafka-ingest stack env)"
echo "== ruff"; ruff check .
echo "== mypy"; mypy
echo "== imports"; python scripts/check_imports.py
# The benchmark harness on a tiny sample: every contender (Kafka Connect + Debezium, the
# Airflow provider's operator, ...) starts, finishes and loads the right rows. Figures
# come from `make bench`, never from tests.
echo "== bench smoke"; python benchmarks/bench_ingest.py --events 3000 --repeat 1 --peers --smoke --skip spark_fresh,spark_warm  # Spark: make bench-smoke
# Prometheus and promtool for the metrics tests, built from their Go module into the user
# cache once (minutes on a cold machine, then a marker check), before any test's time-out.
echo "== prometheus"; python -c "from kafka_ingest_dev import prometheus; print(prometheus.install())"
echo "== pytest"
set +e
python -m pytest -q --durations=25 "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "pytest collected no test" >&2; exit 1; fi
exit "$rc"
