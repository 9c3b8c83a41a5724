#!/usr/bin/env bash
# The whole test suite, from a clean clone: install, start the local stack (with its schema
# registry), then the tests (unit, integration, DAG and chaos, against the real Kafka and
# Postgres) with lint, type-check, the import graph and the bench smoke beside them. Each
# check's output is kept in test-artifacts/checks/ and shown at the end; any failure fails
# the run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
echo "== installed in ${SECONDS} s"
. .venv/bin/activate
kafka-ingest stack up --secure --registry
eval "$(kafka-ingest stack env)"
# Prometheus and promtool for the metrics tests, built from their Go module into the user
# cache once (minutes on a cold machine, then a marker check), before any test's time-out.
echo "== prometheus"; python -c "from kafka_ingest_dev import prometheus; print(prometheus.install())"

checks=test-artifacts/checks
rm -rf "$checks"; mkdir -p "$checks"
# The shared stack's lock (tests/support/workers.py): a test that restarts the stack's Kafka
# or Postgres waits for the bench smoke, which holds it shared, and the other way round.
export KAFKA_INGEST_TEST_LOCK_DIR="$PWD/$checks/lock"
mkdir -p "$KAFKA_INGEST_TEST_LOCK_DIR"
# Beside the tests, one after another (two cores: the tests take both, these the gaps).
# The bench smoke runs the benchmark harness on a tiny sample: every contender (Kafka
# Connect + Debezium, the Airflow provider's operator, ...) starts, finishes and loads the
# right rows. Figures come from `make bench`, never from tests.
checks() {
  local rc=0 check started status child
  trap 'kill "$child" 2>/dev/null; exit 143' TERM
  for check in ruff mypy imports "bench smoke"; do
    case "$check" in
      ruff) cmd=(ruff check .) ;;
      mypy) cmd=(mypy) ;;
      imports) cmd=(python scripts/check_imports.py) ;;
      "bench smoke") cmd=(flock --shared "$KAFKA_INGEST_TEST_LOCK_DIR/stack"
                          python benchmarks/bench_ingest.py --events 3000 --repeat 1 --peers
                          --smoke --skip spark_fresh,spark_warm,connect_fresh,mirror_connect_fresh) ;;
                          # Spark, and Kafka Connect's fresh JVMs (the warm workers run the
                          # same connectors): make bench-smoke
    esac
    started=$(date +%s)
    if [ "${cmd[0]}" = flock ]; then  # behind a restart that waits for the stack
      flock --shared "$KAFKA_INGEST_TEST_LOCK_DIR/turnstile" true
    fi
    "${cmd[@]}" > "$checks/${check// /-}.log" 2>&1 &
    child=$!
    if wait "$child"; then status=ok; else status=FAILED; rc=1; fi
    echo "$check: $status in $(( $(date +%s) - started )) s" >> "$checks/summary"
  done
  return "$rc"
}
checks &
checks_pid=$!
trap 'kill "$checks_pid" 2>/dev/null || true' EXIT  # interrupted: the checks go too

# Three workers on the two cores: the tests wait on Airflow, Kafka and Postgres much of the
# time (two workers left the cores 19% idle; three, 10%, and took 1,083 s against 1,438);
# which tests share a worker, in which order, and which have the stack alone:
# tests/support/workers.py.
echo "== pytest (ruff, mypy, imports and the bench smoke run beside it: $checks/), at ${SECONDS} s"
# The machine's CPU over the tests (/proc/stat: user, nice, system, idle, iowait, ...): how
# busy the cores were says whether more workers could help (idle) or not (busy).
cpu() { head -1 /proc/stat 2>/dev/null || true; }
cpu_before=$(cpu)
set +e
python -m pytest -n 3 --dist loadscope --no-loadscope-reorder -q --durations=25 \
    --junitxml=test-artifacts/junit.xml "$@"  # every test's time, for where the time goes
rc=$?
wait "$checks_pid"
checks_rc=$?
trap - EXIT  # nothing left to stop
set -e
for log in "$checks"/*.log; do
  echo "== $(basename "$log" .log)"; cat "$log"
done
echo "== checks"; cat "$checks/summary"
if [ -n "$cpu_before" ]; then
  printf '%s\n%s\n' "$cpu_before" "$(cpu)" | awk '
    { busy[NR] = $2 + $3 + $4 + $7 + $8 + $9; idle[NR] = $5 + $6 }
    END { b = busy[2] - busy[1]; i = idle[2] - idle[1]
          if (b + i > 0) printf "== the cores during the tests: %.0f%% busy, %.0f%% idle\n",
                                100 * b / (b + i), 100 * i / (b + i) }'
fi
echo "== make test: ${SECONDS} s in all"
if [ "$rc" -eq 5 ]; then echo "pytest collected no test" >&2; exit 1; fi
if [ "$checks_rc" -ne 0 ]; then echo "a check beside the tests failed (see above)" >&2; exit 1; fi
exit "$rc"
