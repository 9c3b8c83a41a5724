"""``python -m kafka_ingest.cli``: the command line, as the ``kafka-ingest`` script."""

import sys

from kafka_ingest.cli.main import main

sys.exit(main())
