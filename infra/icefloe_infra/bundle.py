"""The runtime bundle: icefloe and its Python dependencies, built for EMR Serverless and stored content-addressed.

`build_bundle` installs the runtime's dependencies as manylinux wheels for the application's architecture and
Python (pip's --platform/--python-version, binary wheels only), adds the `icefloe` package, and packs a
deterministic tar.gz: the same inputs give the same bytes and so the same S3 key. Spark unpacks it as `./deps` on
the driver and every executor (`spark.archives`), and the entry point puts that on `sys.path`.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

import icefloe

# EMR 7.x runs Amazon Linux 2023 (glibc 2.34): manylinux_2_28 and older wheels all load there.
PLATFORMS = {
    arch: [f"manylinux_2_28_{cpu}", f"manylinux_2_17_{cpu}", f"manylinux2014_{cpu}"]
    for arch, cpu in (("X86_64", "x86_64"), ("ARM64", "aarch64"))
}
ENTRY_POINT = (
    '"""icefloe on EMR Serverless: the job\'s entry point (icefloe and its dependencies are in ./deps)."""\n'
    "import sys\n\n"
    'sys.path.insert(0, "./deps")\n'
    "from icefloe.cli import main  # noqa: E402\n\n"
    "sys.exit(main())\n"
)
CACHE = Path.home() / ".cache" / "icefloe" / "bundles"


@dataclass(frozen=True)
class Bundle:
    archive: Path
    entry_point: Path
    digest: str  # sha256 of the archive: the S3 key's content address
    architecture: str
    python_version: str


def runtime_requirements() -> list[str]:
    """The `[project] dependencies` of pyproject.toml: what the runtime needs besides Spark."""
    pyproject = Path(icefloe.__file__).resolve().parents[2] / "pyproject.toml"
    return list(tomllib.loads(pyproject.read_text())["project"]["dependencies"])


def _add_tree(tar: tarfile.TarFile, root: Path, prefix: str) -> None:
    for path in sorted(root.rglob("*")):
        if "__pycache__" in path.parts or path.suffix == ".pyc" or not path.is_file():
            continue
        info = tar.gettarinfo(str(path), arcname=f"{prefix}/{path.relative_to(root).as_posix()}")
        info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
        info.mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
        with path.open("rb") as handle:
            tar.addfile(info, handle)


def build_bundle(
    architecture: str = "X86_64",
    python_version: str = "3.11",
    requirements: list[str] | None = None,
    out_dir: Path | None = None,
) -> Bundle:
    requirements = runtime_requirements() if requirements is None else requirements
    out_dir = out_dir or CACHE
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="icefloe-bundle-") as work:
        deps = Path(work) / "deps"
        deps.mkdir()
        if requirements:
            subprocess.run(
                [sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "--target", str(deps),
                 *(arg for tag in PLATFORMS[architecture] for arg in ("--platform", tag)), "--python-version", python_version,
                 "--implementation", "cp", "--only-binary=:all:", *requirements],
                check=True,
            )  # fmt: skip
        buffer = io.BytesIO()
        # mtime=0 in the gzip header too, so identical contents give identical archives.
        with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
            _add_tree(tar, deps, ".")
            _add_tree(tar, Path(icefloe.__file__).parent, "./icefloe")
        data = buffer.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    archive = out_dir / f"icefloe-deps-{digest[:16]}.tar.gz"
    archive.write_bytes(data)
    entry_point = out_dir / "main.py"
    entry_point.write_text(ENTRY_POINT)
    return Bundle(archive, entry_point, digest, architecture, python_version)
