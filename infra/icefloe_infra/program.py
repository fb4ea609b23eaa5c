"""The Pulumi program: read and validate `icefloe:*` stack config, then declare the stack and export its outputs."""

from __future__ import annotations

from pathlib import Path

import pulumi
from pulumi.runtime import config as runtime_config

from .deployment import load_stack_config, read_pulumi_config
from .stack import BundleBuilder, IcefloeStack, IcefloeStackArgs


def _all_config_keys() -> set[str]:
    # The engine hands config over in PULUMI_CONFIG; tests (and mocks) set it in-process. Both count.
    return set(runtime_config.CONFIG.get()) | set(runtime_config.get_config_env())


def run(build: BundleBuilder | None = None, jar_dir: Path | None = None) -> dict:
    """Declare the stack; `build` and `jar_dir` replace the real bundle builder and jvm/lib/spark (dry runs, tests)."""
    raw = read_pulumi_config(pulumi.Config("icefloe"), _all_config_keys())
    spec, deployment = load_stack_config(raw, source=f"Pulumi.{pulumi.get_stack()}.yaml")
    args = IcefloeStackArgs(spec, deployment, pulumi.get_stack())
    if build is not None:
        args.build = build
    if jar_dir is not None:
        args.jar_dir = jar_dir
    stack = IcefloeStack("icefloe", args)
    for key, value in stack.outputs.items():
        pulumi.export(key, value)
    return stack.outputs
