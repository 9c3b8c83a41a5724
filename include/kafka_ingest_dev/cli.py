"""The development commands of ``kafka-ingest``: ``stack``, ``demo``, ``produce-sample``.

Registered through the ``kafka_ingest.commands`` entry point (see pyproject.toml): the
runtime command line loads them when this package is installed, and never imports it.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def _stack(args: argparse.Namespace) -> int:
    from kafka_ingest_dev import stack

    return stack.main(args.rest)


def _demo(args: argparse.Namespace) -> int:
    from kafka_ingest_dev.demo import main

    return main(args)


def _produce_sample(args: argparse.Namespace) -> int:
    from kafka_ingest.cli import kafka_clients
    from kafka_ingest.config import get_pipeline
    from kafka_ingest_dev.samples import produce_sample

    result = produce_sample(kafka_clients(), get_pipeline(args.pipeline), count=args.count,
                            poison=args.poison, partitions=args.partitions)
    print(json.dumps(result, indent=2))
    return 0


def register(sub: Any) -> None:
    """Add the development commands to the ``kafka-ingest`` parser."""
    p = sub.add_parser("stack", help="the local stack: up | down | status | env")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=_stack)

    p = sub.add_parser("demo", help="the main job end to end on the local stack")
    p.add_argument("--pipeline", default="telemetry_metrics")
    p.add_argument("--count", type=int, default=20_000)
    p.add_argument("--poison", type=int, default=1)
    p.add_argument("--cli", action="store_true", help="run with the CLI instead of Airflow")
    p.add_argument("--state-pipeline", default="account_balances",
                   help="then a declared state pipeline with deletes ('' to skip)")
    p.set_defaults(func=_demo)

    p = sub.add_parser("produce-sample", help="produce sample events and poison pills")
    p.add_argument("pipeline")
    p.add_argument("--count", type=int, default=10_000)
    p.add_argument("--poison", type=int, default=1, help="rounds of every poison-pill kind")
    p.add_argument("--partitions", type=int, default=3, help="partitions of a new topic")
    p.set_defaults(func=_produce_sample)
