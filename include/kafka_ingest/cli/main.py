"""The parser (each command module adds its commands, installed extensions theirs through
the ``kafka_ingest.commands`` entry point) and ``main``: an expected failure is one
``kafka-ingest: ...`` line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from kafka_ingest.cli import observe, runs, schema
from kafka_ingest.errors import IngestError
from kafka_ingest.kafka.clients import LIBRDKAFKA_LOG, LIBRDKAFKA_ONCE

#: Libraries whose INFO lines are for ``-v`` only.
QUIET_UNLESS_VERBOSE = ("httpx", "httpx2", "httpcore", "httpcore2")

#: How a command's log lines look on stderr.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: The first line of ``kafka-ingest --help``.
DESCRIPTION = "kafka-ingest: the operator's command line."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kafka-ingest", description=DESCRIPTION)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for commands in (schema, runs, observe):
        commands.add_commands(sub)
    for extension in entry_points(group="kafka_ingest.commands"):
        extension.load()(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format=LOG_FORMAT)
    if args.verbose:  # -v shows every repeat
        LIBRDKAFKA_LOG.removeFilter(LIBRDKAFKA_ONCE)
    else:
        LIBRDKAFKA_LOG.addFilter(LIBRDKAFKA_ONCE)
        # the registry client's HTTP library logs each request (its URL) at INFO
        for name in QUIET_UNLESS_VERBOSE:
            logging.getLogger(name).setLevel(logging.WARNING)
    try:
        return int(args.func(args))
    except (IngestError, ValueError) as exc:
        # One line, whatever the message: a server's or a parser's may span several.
        text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        print(f"kafka-ingest: {text}", file=sys.stderr)
        return 2
