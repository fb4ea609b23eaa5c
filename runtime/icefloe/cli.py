"""The `icefloe` command line: `run`, `status` and `maintain`, plus the commands other packages plug in.

`plan` (icefloe_infra) and `demo` (icefloe_dev) register themselves in the `icefloe.commands` entry-point group
(pyproject.toml): the runtime imports neither package, and the bundle EMR jobs run holds neither, nor Pulumi.
A plugged-in command is an object with `name`, `help`, `add_arguments(parser)` and `run(args) -> int`; its module
must import nothing heavy at load time (the parser is built for every command).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from importlib.metadata import entry_points
from pathlib import Path

from icefloe.errors import IcefloeError

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
    status.add_argument("--json", action="store_true", help="one JSON object per table (see docs/operating.md)")
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

    for command in plugged_in_commands().values():
        command.add_arguments(commands.add_parser(command.name, help=command.help))
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
        return plugged_in_commands()[args.command].run(args)
    except IcefloeError as error:
        print(f"icefloe: error: {error}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from icefloe.materialize.budget import Deadline
    from icefloe.operate.runner import run_tables

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
    from icefloe.operate.status import MaxLag, collect_status, render
    from icefloe.spec import load_config

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


def plugged_in_commands() -> dict:
    """The commands installed packages register under `icefloe.commands` (none in the EMR bundle)."""
    commands = {}
    for entry in entry_points(group="icefloe.commands"):
        command = entry.load()
        commands[command.name] = command
    return commands


def _maintain(args: argparse.Namespace) -> int:
    from icefloe.operate.runner import maintain_tables

    def report(result) -> None:
        print(json.dumps(result, sort_keys=True) if args.json else str(result), flush=True)

    failures = maintain_tables(
        config_path=args.config, table_names=args.table, state_dir=Path(args.state_dir), on_result=report
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
