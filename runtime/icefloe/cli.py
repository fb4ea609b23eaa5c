"""The `icefloe` command line: `run`, `status`, `maintain`, `plan` and `demo`.

`plan` and `demo` import their packages (icefloe_infra, icefloe_dev) only when chosen: the runtime bundle that
EMR jobs run holds neither, nor Pulumi.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from .errors import IcefloeError

DEFAULT_STATE_DIR = ".icefloe"
STARTED = time.time()  # the job's time limit (--deadline-minutes) counts from about here
# Committed, but records were deleted from the topic before they were read (a table with `onDataLoss: warn`).
EXIT_DATA_LOSS = 3
# `icefloe status --max-lag`: a table is further behind than allowed.
EXIT_BEHIND = 4


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="icefloe", description="Materialize Kafka topics into Apache Iceberg tables.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="materialize the declared tables")
    run.add_argument("--config", required=True, help="Pulumi.<stack>.yaml (local path or s3:// URI)")
    run.add_argument("--table", action="append", default=[], metavar="NAME", help="only this table (repeatable)")
    when = run.add_mutually_exclusive_group(required=True)
    when.add_argument("--once", action="store_true", help="one batch per table, then exit")
    when.add_argument("--continuous", action="store_true", help="micro-batches until SIGTERM")
    run.add_argument("--json", action="store_true", help="print one JSON summary per table")
    run.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help="local catalog and warehouse (local catalog only)")
    run.add_argument(
        "--metrics", choices=["emf"], help="emf: a CloudWatch embedded-metric line per table and batch on stdout"
    )
    run.add_argument(
        "--deadline-minutes",
        type=float,
        metavar="N",
        help="the job is stopped after N minutes (the deployed jobs pass their timeout): batches are sized "
        "to publish well before, and a continuous run ends before it",
    )

    status = commands.add_parser("status", help="freshness per table: last commit, lag, rows, DLQ, data loss")
    status.add_argument("--config", required=True)
    status.add_argument("--table", action="append", default=[], metavar="NAME")
    status.add_argument("--json", action="store_true", help="one JSON object per table (see README)")
    status.add_argument(
        "--max-lag",
        action="append",
        default=[],
        metavar="N|DURATION",
        help=f"exit {EXIT_BEHIND} if a table lags more records (10000) or longer (5m) than this",
    )
    status.add_argument("--state-dir", default=DEFAULT_STATE_DIR)

    maintain = commands.add_parser("maintain", help="compact, expire snapshots, remove orphan files")
    maintain.add_argument("--config", required=True)
    maintain.add_argument("--table", action="append", default=[], metavar="NAME")
    maintain.add_argument("--json", action="store_true")
    maintain.add_argument("--state-dir", default=DEFAULT_STATE_DIR)

    plan = commands.add_parser("plan", help="what `pulumi up` would create, checked by the policy pack (no AWS needed)")
    plan.add_argument("--config", required=True, help="Pulumi.<stack>.yaml")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")

    demo = commands.add_parser("demo", help="the local end-to-end demo: broker, registry, 100k trades, a table")
    demo.add_argument("--records", type=int, default=100_000)
    demo.add_argument("--partitions", type=int, default=3)
    demo.add_argument("--state-dir", default=DEFAULT_STATE_DIR)
    demo.add_argument(
        "--format",
        choices=["avro", "protobuf", "json-schema"],
        default="avro",
        help="how the trades are serialized (through the registry)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("py4j", "urllib3", "botocore", "httpx", "httpx2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "maintain":
            return _maintain(args)
        if args.command == "status":
            return _status(args)
        if args.command == "plan":
            return _plan(args)
        from icefloe_dev.demo import run_demo

        return run_demo(
            records=args.records, partitions=args.partitions, state_dir=Path(args.state_dir), format=args.format
        )
    except IcefloeError as error:
        print(f"icefloe: error: {error}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from .budget import Deadline
    from .runner import run_tables

    lost = []

    def report(result) -> None:
        lost.extend(result.data_lost)
        if args.json:
            print(json.dumps(result.as_dict(), sort_keys=True), flush=True)
        else:
            print(result.describe(), flush=True)

    failures = run_tables(
        config_path=args.config,
        table_names=args.table,
        state_dir=Path(args.state_dir),
        continuous=args.continuous,
        on_result=report,
        metrics=args.metrics == "emf",
        deadline=Deadline.after_minutes(args.deadline_minutes, STARTED) if args.deadline_minutes else None,
    )
    if failures:
        return 1
    return EXIT_DATA_LOSS if lost else 0


def _status(args: argparse.Namespace) -> int:
    from .spec import load_config
    from .status import MaxLag, collect_status, render

    max_lag = MaxLag.parse(args.max_lag)
    statuses = collect_status(load_config(args.config), args.table, Path(args.state_dir), max_lag)
    if args.json:
        for status in statuses:
            print(json.dumps(status.as_dict(), sort_keys=True), flush=True)
    else:
        print(render(statuses), flush=True)
    if any(s.problems for s in statuses):
        return 1
    return EXIT_BEHIND if any(s.behind_max_lag for s in statuses) else 0


def _plan(args: argparse.Namespace) -> int:
    try:
        from icefloe_infra.plan import main as plan
    except ImportError as error:
        raise IcefloeError(
            f"plan needs the Pulumi program's dependencies ({error.name} is missing): pip install 'icefloe[infra]'"
        ) from None
    return plan(args.config, as_json=args.json)


def _maintain(args: argparse.Namespace) -> int:
    from .runner import maintain_tables

    def report(result) -> None:
        print(json.dumps(result, sort_keys=True) if args.json else str(result), flush=True)

    failures = maintain_tables(
        config_path=args.config, table_names=args.table, state_dir=Path(args.state_dir), on_result=report
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
