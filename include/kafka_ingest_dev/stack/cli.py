"""``kafka-ingest stack up|down|status|env|failover``: the stack's command line."""

from __future__ import annotations

import argparse
import shlex
import sys

from kafka_ingest_dev.procs import StackError
from kafka_ingest_dev.stack.api import (
    down,
    status,
    stop_airflow,
    stop_connect,
    stop_registry,
    up,
)
from kafka_ingest_dev.stack.environment import env
from kafka_ingest_dev.stack.standby import failover, remove_replica


def _print_env(*, secure: bool = False, faults: bool = False, replica: bool = False) -> None:
    for name, value in env(secure=secure, faults=faults, replica=replica).items():
        print(f"export {name}={shlex.quote(value)}")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="kafka-ingest stack",
        description="Run the real local stack: Kafka (KRaft), PostgreSQL, Airflow metadata.",
    )
    commands = top.add_subparsers(dest="command", required=True)
    up_cmd = commands.add_parser("up", help="start what is not running and wait until it answers")
    up_cmd.add_argument("--secure", action="store_true",
                        help="also a Kafka SASL_SSL listener and Postgres TLS (kept from then on)")
    up_cmd.add_argument("--airflow", action="store_true",
                        help="also Airflow's api-server (UI, REST API), scheduler, dag-processor "
                             "and triggerer on 127.0.0.1:18080")
    up_cmd.add_argument("--executor", choices=("local", "celery"),
                        help="Airflow's executor (implies --airflow): local (the default), or "
                             "celery with Redis on 127.0.0.1:16379 and --workers workers; "
                             "kept while the services run, another one restarts them")
    up_cmd.add_argument("--workers", type=int, metavar="N",
                        help="Celery workers (default 2), named worker-<i>@<host>")
    up_cmd.add_argument("--faults", action="store_true",
                        help="also Toxiproxy (API 127.0.0.1:18474) in front of Kafka and "
                             "Postgres, for fault tests (kept from then on)")
    up_cmd.add_argument("--brokers", type=int, metavar="N",
                        help="Kafka nodes (KRaft broker+controller each; 3: a 3-voter quorum); "
                             "only on a state dir whose Kafka holds no data yet")
    up_cmd.add_argument("--registry", action="store_true",
                        help="also a schema registry (Apicurio Registry, in memory, "
                             "compatibility BACKWARD): Confluent's API on "
                             "http://127.0.0.1:18081/apis/ccompat/v7")
    up_cmd.add_argument("--connect", action="store_true",
                        help="also a Kafka Connect worker (standalone) with Debezium's Postgres "
                             "source connector, REST API on http://127.0.0.1:18083")
    up_cmd.add_argument("--replica", action="store_true",
                        help="also a streaming standby of Postgres on 127.0.0.1:15434 "
                             "(asynchronous; kept from then on): `stack failover` promotes it")
    up_cmd.add_argument("--sync", action="store_true",
                        help="with --replica: synchronous replication (a commit returns once "
                             "the standby applied it: remote_apply)")
    down_cmd = commands.add_parser("down", help="stop what `up` started; data is kept")
    only = down_cmd.add_mutually_exclusive_group()
    only.add_argument("--airflow", action="store_true", help="stop only Airflow's services")
    only.add_argument("--registry", action="store_true",
                      help="stop only the schema registry (its schemas go with it)")
    only.add_argument("--connect", action="store_true",
                      help="stop only the Kafka Connect worker (its connectors go with it)")
    only.add_argument("--replica", action="store_true",
                      help="stop the Postgres standby, delete it and forget --replica")
    failover_cmd = commands.add_parser(
        "failover", help="SIGKILL the Postgres primary, promote the standby, and make the "
                         "dead primary's place its new standby")
    failover_cmd.add_argument("--no-rebuild", action="store_true",
                              help="leave the old primary down (no standby until `stack up`)")
    commands.add_parser("status", help="show each part; exit 1 if any is down")
    env_cmd = commands.add_parser("env",
                                  help='print `export` lines: eval "$(kafka-ingest stack env)"')
    env_cmd.add_argument("--secure", action="store_true",
                         help="point at the SASL_SSL listener and TLS Postgres (runtime role)")
    env_cmd.add_argument("--faults", action="store_true",
                         help="point Kafka and Postgres clients through Toxiproxy's proxies "
                              "and print TOXIPROXY_URL")
    env_cmd.add_argument("--replica", action="store_true",
                         help="name both Postgres nodes (target_session_attrs=read-write), "
                              "so clients follow a failover")
    return top


def main(argv: list[str]) -> int:
    """``kafka-ingest stack up|down|status|env|failover``; exit 2 with one line on a StackError."""
    args = parser().parse_args(argv)
    try:
        if args.command == "up":
            up(report=print, secure=args.secure,
               airflow=args.airflow or args.executor is not None or args.workers is not None,
               executor=args.executor, workers=args.workers,
               faults=args.faults, brokers=args.brokers, registry=args.registry,
               connect=args.connect,
               replica=("sync" if args.sync else "async") if args.replica or args.sync
               else None)
        elif args.command == "down":
            stop = (stop_registry if args.registry else stop_connect if args.connect
                    else stop_airflow if args.airflow
                    else remove_replica if args.replica else down)
            stop(report=print)
        elif args.command == "failover":
            failover(rebuild=not args.no_rebuild, report=print)
        elif args.command == "status":
            parts = status()
            for part in parts:
                print(part.line())
            return 0 if all(part.up for part in parts) else 1
        else:
            _print_env(secure=args.secure, faults=args.faults, replica=args.replica)
    except StackError as exc:
        print(f"kafka-ingest stack {args.command}: {exc}", file=sys.stderr)
        return 2
    return 0
