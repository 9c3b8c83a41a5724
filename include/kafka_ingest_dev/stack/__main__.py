"""``python -m kafka_ingest_dev.stack up``: the same as ``kafka-ingest stack up``."""

import sys

from kafka_ingest_dev.stack.cli import main

sys.exit(main(sys.argv[1:]))
