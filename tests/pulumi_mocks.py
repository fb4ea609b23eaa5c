"""The Pulumi program under mocks, for tests: icefloe_infra.dry_run with test defaults.

    from pulumi_mocks import run_program
    run = run_program(EXAMPLE)                       # every resource the program declares, and run.outputs

Tests run without Maven having fetched jvm/lib/spark: by default the program ships small stand-in jar files named
exactly as jvm/pom.xml pins them (`fake_jar_dir`), so the upload and the job's `spark.jars` are checked all the same.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from icefloe.jvm_gateway import ICEFLOE_JAR
from icefloe_infra.dry_run import (
    ACCOUNT_ID,
    PROJECT_FILE,
    BundleBuilder,
    ProgramRun,
    RecordedResource,
    placeholder_secret,
    source_bundle,
    stack_config,
)
from icefloe_infra.dry_run import run_program as _run_program
from icefloe_infra.jars import pinned_spark_jars

REGION = "eu-west-1"  # examples/Pulumi.example.yaml's aws:region
decrypted_value = placeholder_secret  # what a `secure:` value of the example stands for
small_bundle = source_bundle  # icefloe without its dependency wheels: a run takes about a second

__all__ = [
    "ACCOUNT_ID",
    "PROJECT_FILE",
    "REGION",
    "ProgramRun",
    "RecordedResource",
    "decrypted_value",
    "fake_jar_dir",
    "run_program",
    "small_bundle",
    "stack_config",
]


def fake_jar_dir(root: Path | None = None, content: bytes = b"") -> Path:
    """A directory with one small file per jar jvm/pom.xml pins for Spark, named as Maven names them, and
    icefloe's own."""
    root = root or Path(tempfile.gettempdir()) / f"icefloe-fake-jars-{os.getuid()}"  # another user's is not ours
    root.mkdir(parents=True, exist_ok=True)
    for name in [*(jar.file_name for jar in pinned_spark_jars()), ICEFLOE_JAR]:
        path = root / name
        body = b"stand-in for " + name.encode() + b"\n" + content
        if not path.exists() or path.read_bytes() != body:
            path.write_bytes(body)
    return root


def run_program(stack_file: str | Path, build: BundleBuilder = small_bundle, jar_dir: Path | None = None) -> ProgramRun:
    return _run_program(stack_file, build, jar_dir or fake_jar_dir())
