"""`icefloe plan`, plugged into the runtime's command line (entry point `icefloe.commands`, pyproject.toml).

Light at import: Pulumi loads only when the plan runs, and a missing `icefloe[infra]` is a clear error then.
"""

from __future__ import annotations

import argparse

from icefloe.errors import IcefloeError

name = "plan"
help = "what `pulumi up` would create, checked by the policy pack (no AWS needed)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="Pulumi.<stack>.yaml")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


def run(args: argparse.Namespace) -> int:
    try:
        from .plan import main as plan
    except ImportError as error:
        raise IcefloeError(
            f"plan needs the Pulumi program's dependencies ({error.name} is missing): pip install 'icefloe[infra]'"
        ) from None
    return plan(args.config, as_json=args.json)
