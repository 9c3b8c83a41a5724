#!/usr/bin/env bash
# The whole test suite, from a clean clone: install, start the local stack, lint, type-check,
# then unit, integration, DAG and chaos tests against the real Kafka and Postgres.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
. .venv/bin/activate
kafka-ingest stack up --secure
eval "$(kafka-ingest stack env)"
echo "== ruff"; ruff check .
echo "== mypy"; mypy
echo "== imports"; python scripts/check_imports.py
echo "== pytest"
set +e
python -m pytest -q "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "pytest collected no test" >&2; exit 1; fi
exit "$rc"
