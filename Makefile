# The two commands a newcomer needs: `make demo` and `make test`.
.PHONY: demo test test-busy bootstrap lint stack-up stack-down bench bench-scale bench-smoke bench-growth bench-freshness faults-full soak soak-short lock

demo:            ## install, start the local stack, run the ingest DAG on sample data
	bash scripts/demo.sh

test:            ## install, start the local stack, lint, type-check and run every test
	bash scripts/test.sh

test-busy:       ## `make test` with one core kept busy by a CPU burner for the whole pytest session
	KAFKA_INGEST_TEST_BURN_CPU=1 bash scripts/test.sh

bootstrap:
	bash scripts/bootstrap.sh

lint: bootstrap  ## ruff, mypy, and the import graph (no cycles, runtime never imports dev tooling)
	.venv/bin/ruff check . && .venv/bin/mypy && .venv/bin/python scripts/check_imports.py

stack-up: bootstrap
	.venv/bin/kafka-ingest stack up

stack-down:
	.venv/bin/kafka-ingest stack down

# --peers (bench, bench-smoke): the Spark peer pip-installs its benchmark extra
# (benchmarks/spark/requirements.txt: pyspark, a 450 MB download) into .venv on first use;
# its jars and Kafka Connect's are fetched once by Maven into ${XDG_CACHE_HOME:-~/.cache}/kafka-ingest/.
bench: bootstrap  ## ingest benchmark and its peers (200k events, 1 partition, median of 3), and the Debezium mirror rows; benchmarks/results/latest.json
	.venv/bin/kafka-ingest stack up && .venv/bin/python benchmarks/bench_ingest.py --events 200000 --partitions 1 --repeat 3 --peers

bench-scale: bootstrap  ## the scaling rows: 0.1M, 1M, 3M events on 1 partition, then 1M on 1, 2, 3 partitions (median of 3); results/scale.json
	.venv/bin/kafka-ingest stack up && .venv/bin/python benchmarks/bench_ingest.py --scale-only --partitions 1 --events 1000000 --repeat 3

bench-growth: bootstrap  ## how the write cost grows with the table and its index: 5M rows, rising and random keys; results/table_growth.json
	.venv/bin/kafka-ingest stack up && .venv/bin/python benchmarks/bench_table_growth.py --rows 5000000 --keys seq,random --paths new,conflict

bench-freshness: bootstrap  ## freshness (p50/p95/p99, cron every minute vs on_data at 2,000 events/s for 5 min), per-run overhead, quiet pipelines' CPU, under the real scheduler; results/freshness.json
	.venv/bin/kafka-ingest stack up && .venv/bin/python benchmarks/bench_freshness.py --rate 2000 --seconds 300

faults-full: bootstrap  ## every network and cluster fault test (the quick set is in `make test`) and the soak's short variant, on stacks of their own
	.venv/bin/kafka-ingest stack up && KAFKA_INGEST_FAULTS_FULL=1 .venv/bin/pytest -m "faults or faults_full" tests/chaos

soak-short: bootstrap  ## the soak as a test: 2 minutes of faults and on until every kind has come once, then checked exactly (also in faults-full)
	.venv/bin/kafka-ingest stack up && .venv/bin/pytest -m faults_full tests/chaos/test_soak.py

soak: bootstrap  ## 60 minutes of mixed faults (workers, brokers, proxy, Postgres stop and failover) under the real scheduler and Celery, then checked exactly; results/soak.json
	.venv/bin/python -m kafka_ingest_dev.soak --minutes 60 --report benchmarks/results/soak.json

bench-smoke: bootstrap  ## every benchmark path and peer on 3,000 events: each must start, finish and load the right rows
	.venv/bin/kafka-ingest stack up && .venv/bin/python benchmarks/bench_ingest.py --events 3000 --repeat 1 --peers --smoke

lock:            ## re-resolve and pin requirements.txt (review the diff); the Spark peer's extra (pyspark, py4j) stays out
	{ sed -n '1,3p' requirements.txt; .venv/bin/pip freeze --exclude-editable | grep -viE '^(pytest|pytest-timeout|pytest-xdist|execnet|ruff|mypy|mypy_extensions|types-PyYAML|iniconfig|librt|ast-serialize|pyspark|py4j)=='; } > requirements.txt.new && mv requirements.txt.new requirements.txt
