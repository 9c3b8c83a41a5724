#!/usr/bin/env bash
# An interleaved A/B of the project's benchmark paths between a base revision and this
# tree, on the running local stack: the base is checked out into a temporary worktree and
# the two trees' runs alternate (drift hits both alike). Each run is one
# `benchmarks/bench_ingest.py --repeat 1` with the tree's own code first on PYTHONPATH.
#   bash scripts/bench_ab.sh BASE_REV [ROUNDS] [EVENTS] [PATHS] [PARTITIONS]
#   bash scripts/bench_ab.sh e1b1d5d 3 1000000 project,validate,avro_stages
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?a base revision}; rounds=${2:-3}; events=${3:-1000000}
paths=${4:-project,validate,avro_stages}; partitions=${5:-1}
here=$PWD
tree=$(mktemp -d /tmp/kafka-ingest-ab.XXXXXX)
git worktree add --detach -q "$tree" "$base"
trap 'git -C "$here" worktree remove --force "$tree"' EXIT
eval "$(.venv/bin/kafka-ingest stack env)"
for round in $(seq 1 "$rounds"); do
  for side in "$tree" "$here"; do
    echo "=== round $round: $( [ "$side" = "$here" ] && echo "this tree" || echo "$base") ($(date +%T))"
    (cd "$side" && PYTHONPATH="$side/include:$side/plugins" "$here/.venv/bin/python" \
      benchmarks/bench_ingest.py --events "$events" --partitions "$partitions" --repeat 1 \
      --only "$paths")
  done
done
