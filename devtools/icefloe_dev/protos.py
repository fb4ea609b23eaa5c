"""Protobuf message classes from `.proto` text at run time (demo, tests): compiled with grpc_tools.protoc into a
fresh descriptor pool, so nothing generated is written to the source tree and several versions of one message can
live side by side in one process."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path


def compile_protos(files: dict[str, str], workdir: Path | None = None):
    """A descriptor pool holding `files` (import name -> `.proto` text) and the well-known types they import."""
    from google.protobuf import descriptor_pb2
    from google.protobuf.descriptor_pool import DescriptorPool

    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="icefloe-protos-", dir=workdir) as tmp:
        source = Path(tmp) / "proto"
        for name, text in files.items():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_text(text)
        out = Path(tmp) / "descriptors.pb"
        command = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"--proto_path={source}",
            "--include_imports",
            f"--descriptor_set_out={out}",
            *files,
        ]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise ValueError(f"protoc refused {sorted(files)}: {result.stderr.strip()}")
        compiled = descriptor_pb2.FileDescriptorSet()
        compiled.ParseFromString(out.read_bytes())
    pool = DescriptorPool()
    for proto in compiled.file:  # protoc lists dependencies first
        pool.Add(proto)
    return pool


def message_class(pool, full_name: str):
    from google.protobuf.message_factory import GetMessageClass

    return GetMessageClass(pool.FindMessageTypeByName(full_name))
