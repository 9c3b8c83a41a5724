# The two commands a newcomer needs: `make demo` and `make test`.
.PHONY: demo test bootstrap lint stack-up stack-down bench lock

demo:            ## install, start the local stack, run the ingest DAG on sample data
	bash scripts/demo.sh

test:            ## install, start the local stack, lint, type-check and run every test
	bash scripts/test.sh

bootstrap:
	bash scripts/bootstrap.sh

lint: bootstrap  ## ruff, mypy, and the import graph (no cycles, runtime never imports dev tooling)
	.venv/bin/ruff check . && .venv/bin/mypy && .venv/bin/python scripts/check_imports.py

stack-up: bootstrap
	.venv/bin/kafka-ingest stack up

stack-down:
	.venv/bin/kafka-ingest stack down

bench: bootstrap  ## ingest benchmark (200k events); figures in benchmarks/results/latest.json
	.venv/bin/kafka-ingest stack up && .venv/bin/python benchmarks/bench_ingest.py --events 200000 --chunk-size 20000 --partitions 3

lock:            ## re-resolve and pin requirements.txt (review the diff)
	{ sed -n '1,3p' requirements.txt; .venv/bin/pip freeze --exclude-editable | grep -viE '^(pytest|pytest-timeout|ruff|mypy|mypy_extensions|types-PyYAML|iniconfig|librt|ast-serialize)=='; } > requirements.txt.new && mv requirements.txt.new requirements.txt
