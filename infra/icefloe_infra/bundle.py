"""The runtime bundle: icefloe and its Python dependencies, built for EMR Serverless and stored content-addressed.

`build_bundle` installs the runtime's dependencies as binary wheels for the application's architecture and Python
(pip's --platform/--python-version/--only-binary, so it works from any machine), adds the `icefloe` package, and
packs a deterministic tar.gz: the same inputs give the same bytes and so the same S3 key. Spark unpacks it as
`./deps` beside the driver and every executor (`spark.archives`), and the entry point puts that on `sys.path`.

Builds are cached by their inputs (requirements, platform, Python, the runtime's source), so `pulumi preview`
after the first one costs nothing; pip's own cache keeps the wheels.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
import tomllib
from dataclasses import dataclass
from pathlib import Path

import icefloe

# Bump when the archive layout changes, so cached bundles are rebuilt.
LAYOUT_VERSION = 2
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
# Not gzip's default 9: on the runtime's ~390 MB of wheels, 9 took 32 CPU-s and 6 took 10 for a 0.6% larger archive
# (a first `pulumi preview` waits for it).
GZIP_LEVEL = 6
# Console scripts pip writes for the build machine's interpreter; nothing on EMR runs them.
_SKIP_TOP = {"bin"}


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


def _files(root: Path) -> list[Path]:
    return [
        path
        for path in sorted(root.rglob("*"))
        if path.is_file()
        and "__pycache__" not in path.parts
        and path.suffix != ".pyc"
        and path.relative_to(root).parts[0] not in _SKIP_TOP
    ]


def _source_digest(package: Path) -> str:
    digest = hashlib.sha256()
    for path in _files(package):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _add_tree(tar: tarfile.TarFile, root: Path, prefix: str) -> None:
    for path in _files(root):
        info = tar.gettarinfo(str(path), arcname=f"{prefix}/{path.relative_to(root).as_posix()}")
        info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
        info.mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
        with path.open("rb") as handle:
            tar.addfile(info, handle)


def _pip_install(requirements: list[str], architecture: str, python_version: str, target: Path) -> None:
    platforms = [arg for tag in PLATFORMS[architecture] for arg in ("--platform", tag)]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-warn-conflicts",
            "--no-compile",
            "--target",
            str(target),
            *platforms,
            "--python-version",
            python_version,
            "--implementation",
            "cp",
            "--only-binary=:all:",
            *requirements,
        ],
        check=True,
    )


def build_bundle(
    architecture: str = "X86_64",
    python_version: str = "3.11",
    requirements: list[str] | None = None,
    out_dir: Path | None = None,
) -> Bundle:
    if architecture not in PLATFORMS:
        raise ValueError(f"architecture must be one of {sorted(PLATFORMS)}, got {architecture!r}")
    requirements = runtime_requirements() if requirements is None else list(requirements)
    out_dir = out_dir or CACHE
    out_dir.mkdir(parents=True, exist_ok=True)
    package = Path(icefloe.__file__).parent
    inputs = {
        "layout": LAYOUT_VERSION,
        "requirements": requirements,
        "architecture": architecture,
        "python": python_version,
        "platforms": PLATFORMS[architecture],
        "source": _source_digest(package),
    }
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:24]
    entry_point = out_dir / "main.py"
    _write_atomically(entry_point, ENTRY_POINT.encode())
    index = out_dir / f"inputs-{key}.json"
    if index.exists():
        cached = json.loads(index.read_text())
        archive = out_dir / cached["archive"]
        if archive.exists() and hashlib.sha256(archive.read_bytes()).hexdigest() == cached["digest"]:
            return Bundle(archive, entry_point, cached["digest"], architecture, python_version)

    with tempfile.TemporaryDirectory(prefix="icefloe-bundle-") as work:
        deps = Path(work) / "deps"
        deps.mkdir()
        if requirements:
            _pip_install(requirements, architecture, python_version, deps)
        buffer = io.BytesIO()
        # mtime=0 in the gzip header too, so identical contents give identical archives.
        with (
            gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, compresslevel=GZIP_LEVEL) as gz,
            tarfile.open(fileobj=gz, mode="w") as tar,
        ):
            _add_tree(tar, deps, ".")
            _add_tree(tar, package, "./icefloe")
        data = buffer.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    archive = out_dir / f"icefloe-deps-{digest[:16]}.tar.gz"
    _write_atomically(archive, data)
    _write_atomically(
        index, json.dumps({"archive": archive.name, "digest": digest, "inputs": inputs}, indent=1).encode()
    )
    return Bundle(archive, entry_point, digest, architecture, python_version)


def _write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` whole: builds of the same inputs at once (two previews, parallel test workers) share the cache,
    and a reader must never see a file half written."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")  # the umask's mode, as before
    temp.write_bytes(data)
    temp.replace(path)
