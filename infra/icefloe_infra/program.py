"""The Pulumi program: read and validate `icefloe:*` stack config, then declare the stack and export its outputs."""

from __future__ import annotations

import pulumi

from .deployment import load_stack_config, read_pulumi_config
from .stack import BundleBuilder, IcefloeStack, IcefloeStackArgs


def run(build: BundleBuilder | None = None) -> dict:
    raw = read_pulumi_config(pulumi.Config("icefloe"))
    spec, deployment = load_stack_config(raw, source=f"Pulumi.{pulumi.get_stack()}.yaml")
    args = IcefloeStackArgs(spec, deployment, pulumi.get_stack())
    if build is not None:
        args.build = build
    stack = IcefloeStack("icefloe", args)
    for key, value in stack.outputs.items():
        pulumi.export(key, value)
    return stack.outputs
