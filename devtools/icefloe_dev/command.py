"""`icefloe demo`, plugged into the runtime's command line (entry point `icefloe.commands`, pyproject.toml).

Light at import: the parser is built for every `icefloe` command, so the demo's modules load only when it runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

name = "demo"
help = "the local end-to-end demo: broker, registry, 100k trades, a table"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--state-dir", default=".icefloe")
    parser.add_argument(
        "--format",
        choices=["avro", "protobuf", "json-schema"],
        default="avro",
        help="how the trades are serialized (through the registry)",
    )
    parser.add_argument(
        "--cdc",
        action="store_true",
        help="change data instead: PostgreSQL -> Debezium (Kafka Connect) -> a mirror table (envelope: debezium)",
    )
    parser.add_argument("--json", action="store_true", help="with --cdc: a summary line on stdout (no row values)")


def run(args: argparse.Namespace) -> int:
    if args.cdc:
        from .cdc_demo import run_cdc_demo

        return run_cdc_demo(state_dir=Path(args.state_dir), as_json=args.json)
    from .demo import run_demo

    return run_demo(
        records=args.records, partitions=args.partitions, state_dir=Path(args.state_dir), format=args.format
    )
