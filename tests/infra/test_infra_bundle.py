"""The runtime bundle EMR Serverless jobs run: contents, determinism, cache, platform tags, and its entry point.

EMR cannot run here, but the x86_64 bundle is built for CPython 3.11 on manylinux, which this machine is: so the
real bundle's dependencies are imported from the archive alone, with no site-packages (`python -S`).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tarfile
import time
import types
from pathlib import Path

import pytest
from packaging import tags

import icefloe
import icefloe_dev
from icefloe_dev.spark_cluster import extract_all
from icefloe_infra import bundle as bundle_module
from icefloe_infra.bundle import ENTRY_POINT, build_bundle, runtime_requirements

AL2023_GLIBC = (2, 34)  # EMR 7.x images are Amazon Linux 2023


def extract(bundle, into: Path) -> Path:
    """Lay the bundle out as EMR does: the archive as ./deps (spark.archives=...#deps) beside main.py."""
    deps = into / "deps"
    deps.mkdir(parents=True)
    with tarfile.open(bundle.archive) as tar:
        extract_all(tar, deps)
    (into / "main.py").write_text(bundle.entry_point.read_text())
    return into


def run_isolated(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    # -S: no site-packages, so only ./deps (and the standard library) can satisfy an import.
    return subprocess.run([sys.executable, "-S", *args], cwd=workdir, capture_output=True, text=True, timeout=120)


def test_bundle_is_deterministic_and_holds_the_runtime(tmp_path):
    first = build_bundle(requirements=[], out_dir=tmp_path / "a")
    second = build_bundle(requirements=[], out_dir=tmp_path / "b")
    assert first.digest == second.digest and first.archive.read_bytes() == second.archive.read_bytes()
    with tarfile.open(first.archive) as tar:
        members = tar.getmembers()
    names = {m.name for m in members}
    assert {
        "./icefloe/cli.py",
        "./icefloe/materialize/batch.py",
        "./icefloe/spec.py",
        "./icefloe/table/catalog.py",
    } <= names
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    assert {m.mtime for m in members} == {0} and {m.uid for m in members} == {0}
    assert first.entry_point.read_text() == ENTRY_POINT


def test_bundle_is_cached_by_its_inputs(tmp_path):
    first = build_bundle(requirements=[], out_dir=tmp_path)
    stamp = first.archive.stat().st_mtime_ns
    time.sleep(0.01)
    again = build_bundle(requirements=[], out_dir=tmp_path)
    assert again == first and again.archive.stat().st_mtime_ns == stamp  # not rebuilt
    first.archive.write_bytes(b"corrupted")
    rebuilt = build_bundle(requirements=[], out_dir=tmp_path)
    assert rebuilt.digest == first.digest and rebuilt.archive.read_bytes() != b"corrupted"


def test_builds_sharing_a_cache_at_once_never_show_a_half_written_file(tmp_path, monkeypatch):
    """Two builds of the same inputs at once (two previews, or two test workers sharing the dry-run cache) rewrite
    the entry point, the archive and the index: a reader in between must see each file whole."""
    import json
    import threading

    package = tmp_path / "src" / "icefloe"  # a small package, so that many builds take a second
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("# icefloe\n" * 1000)
    monkeypatch.setattr(bundle_module, "icefloe", types.SimpleNamespace(__file__=str(package / "__init__.py")))
    cache = tmp_path / "cache"
    done, failures = threading.Event(), []

    def build_again() -> None:
        try:
            for _ in range(100):
                for index in cache.glob("inputs-*.json"):
                    index.unlink(missing_ok=True)  # a cache miss: archive and index written again
                try:
                    build_bundle(requirements=[], out_dir=cache)
                except FileNotFoundError:
                    pass  # the index it found was unlinked above, by the other builder
        except Exception as error:  # a build that read the other's half-written index
            failures.append(repr(error))
        finally:
            done.set()

    first = build_bundle(requirements=[], out_dir=cache)
    builders = [threading.Thread(target=build_again) for _ in range(2)]
    for builder in builders:
        builder.start()
    seen = set()
    while not done.is_set():
        seen.add(first.entry_point.read_text() == ENTRY_POINT)
        seen.add(hashlib.sha256(first.archive.read_bytes()).hexdigest() == first.digest)
        for index in cache.glob("inputs-*.json"):
            try:
                seen.add(json.loads(index.read_text())["digest"] == first.digest)
            except FileNotFoundError:
                pass  # removed by a builder between the listing and the read
    for builder in builders:
        builder.join()
    assert seen == {True} and not failures, failures


def test_dependencies_are_installed_for_the_target_platform_without_scripts(tmp_path):
    bundle = build_bundle("ARM64", "3.11", requirements=["six==1.17.0"], out_dir=tmp_path)
    with tarfile.open(bundle.archive) as tar:
        names = set(tar.getnames())
    assert "./six.py" in names and "./six-1.17.0.dist-info/WHEEL" in names
    assert not any(n.startswith("./bin/") for n in names)
    with pytest.raises(ValueError, match="architecture must be one of"):
        build_bundle("x86", "3.11", requirements=[], out_dir=tmp_path)


def test_entry_point_runs_the_runtime_cli_from_deps(tmp_path):
    workdir = extract(build_bundle(requirements=[], out_dir=tmp_path / "out"), tmp_path / "job")
    result = run_isolated(workdir, "main.py", "run", "--help")
    assert result.returncode == 0, result.stderr
    assert "--once" in result.stdout and "--continuous" in result.stdout
    where = run_isolated(
        workdir, "-c", "import sys; sys.path.insert(0, './deps'); import icefloe; print(icefloe.__file__)"
    )
    assert Path(where.stdout.strip()).resolve() == (workdir / "deps" / "icefloe" / "__init__.py").resolve()
    bad = run_isolated(workdir, "main.py", "run", "--table", "x")  # the runtime's own parser rejects it
    assert bad.returncode == 2 and "--config" in bad.stderr


def test_the_bundle_holds_no_development_tools(tmp_path):
    with tarfile.open(build_bundle(requirements=[], out_dir=tmp_path).archive) as tar:
        names = tar.getnames()
    assert "./icefloe/cli.py" in names
    assert not any("icefloe_dev" in name or name.startswith(("./devtools/", "./icefloe_infra/")) for name in names)


def test_only_runtime_code_changes_the_bundle_digest(tmp_path, monkeypatch):
    # A copy of the source tree, so the real one is never written to: runtime/icefloe beside devtools/icefloe_dev.
    runtime = tmp_path / "tree" / "runtime" / "icefloe"
    devtools = tmp_path / "tree" / "devtools" / "icefloe_dev"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(Path(icefloe.__file__).parent, runtime, ignore=ignore)
    shutil.copytree(Path(icefloe_dev.__file__).parent, devtools, ignore=ignore)
    monkeypatch.setattr(bundle_module, "icefloe", types.SimpleNamespace(__file__=str(runtime / "__init__.py")))

    def digest(step: str) -> str:
        return build_bundle(requirements=[], out_dir=tmp_path / step).digest

    before = digest("before")
    (devtools / "demo.py").write_text((devtools / "demo.py").read_text() + "\n# a development-only edit\n")
    (devtools / "new_tool.py").write_text("print('a new development tool')\n")
    assert digest("devtools-changed") == before  # no `pulumi up` diff for development-only changes
    (runtime / "cli.py").write_text((runtime / "cli.py").read_text() + "\n# a runtime edit\n")
    assert digest("runtime-changed") != before


def test_plan_and_demo_are_not_in_the_bundle_and_it_says_so(tmp_path):
    # They plug in from icefloe_infra and icefloe_dev (entry points), which the bundle does not hold.
    workdir = extract(build_bundle(requirements=[], out_dir=tmp_path / "out"), tmp_path / "job")
    result = run_isolated(workdir, "main.py", "plan", "--config", "Pulumi.dev.yaml")
    assert result.returncode == 2
    assert "invalid choice: 'plan' (choose from 'run', 'status', 'maintain')" in result.stderr


def test_the_bundle_asks_for_the_runtime_dependencies():
    names = {re.split(r"[\[=<>]", r)[0] for r in runtime_requirements()}
    assert names == {
        "confluent-kafka",
        "pydantic",
        "pyyaml",
        "boto3",
        "pyarrow",
        "aws-msk-iam-sasl-signer-python",
        "grpcio-tools",
        "cryptography",
        "pandas",
    }


@pytest.mark.bundle
def test_real_bundle_is_manylinux_cp311_x86_64_and_self_contained(tmp_path):
    started = time.monotonic()
    bundle = build_bundle("X86_64", "3.11", out_dir=tmp_path / "out")
    with tarfile.open(bundle.archive) as tar:
        names = tar.getnames()
        wheel_tags = {
            w: {
                line.split(":", 1)[1].strip()
                for line in tar.extractfile(w).read().decode().splitlines()
                if line.startswith("Tag:")
            }
            for w in names
            if w.endswith(".dist-info/WHEEL")
        }
    extensions = [n for n in names if n.endswith(".so")]
    for package in ("confluent_kafka", "pyarrow", "pydantic_core"):
        assert any(n.startswith(f"./{package}/") for n in extensions), package
    assert not any("aarch64" in n or "darwin" in n for n in extensions)
    # Every wheel must install on CPython 3.11, x86_64, glibc <= Amazon Linux 2023's.
    platforms = [f"manylinux_{AL2023_GLIBC[0]}_{minor}_x86_64" for minor in range(AL2023_GLIBC[1], 4, -1)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    supported = set(tags.cpython_tags((3, 11), platforms=platforms))
    supported |= set(tags.compatible_tags((3, 11), interpreter="cp311", platforms=platforms))
    for wheel, declared in wheel_tags.items():
        assert any(tags.Tag(*tag.split("-")) in supported for tag in declared), (wheel, declared)
    compiled = {w.split("/")[1] for w, declared in wheel_tags.items() if any("manylinux" in t for t in declared)}
    assert {"confluent_kafka-2.16.0.dist-info", "pyarrow-26.0.1.dist-info"} <= compiled
    assert not any(n.startswith(("./pyspark/", "./py4j/", "./bin/")) for n in names), "EMR provides Spark"
    assert not any(n.startswith(("./pulumi", "./icefloe_dev/", "./icefloe_infra/")) for n in names)
    # Cached: a second build with the same inputs is immediate and identical.
    built_in = time.monotonic() - started
    again_started = time.monotonic()
    assert build_bundle("X86_64", "3.11", out_dir=tmp_path / "out") == bundle
    assert time.monotonic() - again_started < max(5.0, built_in / 4)

    workdir = extract(bundle, tmp_path / "job")
    script = (
        "import os, sys; sys.path.insert(0, './deps')\n"
        "import confluent_kafka, pyarrow, pydantic, yaml, boto3, fastavro, aws_msk_iam_sasl_signer, pandas\n"
        "from confluent_kafka.schema_registry.avro import AvroDeserializer\n"
        "from icefloe.spec import load_config\n"
        "deps = os.path.abspath('deps') + os.sep\n"
        "assert all(os.path.abspath(m.__file__).startswith(deps) for m in (confluent_kafka, pyarrow, pydantic, yaml, pandas))\n"
        "from importlib.metadata import version\n"
        "print(version('confluent-kafka'), version('pyarrow'), pyarrow.__version__)"
    )
    result = run_isolated(workdir, "-c", script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["2.16.0", "26.0.1", "26.0.1"]
