"""Protobuf schemas from a Confluent-compatible registry, in either form they are stored in.

confluent-kafka's serializer registers a base64 `FileDescriptorProto`; Java producers, CLIs and registry UIs register
`.proto` text. A Confluent registry converts text on `format=serialized`; Apicurio returns what was registered. So
both forms are accepted: text is compiled with `grpc_tools.protoc` (which ships the well-known types), its imports
given to protoc as already-resolved descriptors (`--descriptor_set_in`). References (imports) are resolved through
the registry recursively; the well-known and Confluent built-in files are never registered and come from the
protobuf runtime, as confluent-kafka does it.

`ProtobufSchemas` caches a descriptor pool per schema id; it raises the registry client's own errors (the caller
tells an unknown id from an unreachable registry) and `ValueError` for a schema that does not parse.
"""

from __future__ import annotations

import base64
import binascii
import functools
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, FileDescriptor
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message import DecodeError

MAIN_FILE = "icefloe_schema_{}.proto"  # a registered schema has no file name of its own
# protoc logs warnings through absl: a preamble line, then lines like `W0000 00:00:1795.239 23992 parser.cc:686] text`.
_ABSL_PREAMBLE = "WARNING: All log messages before absl::InitializeLog()"
_ABSL_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:[\d.]+\s+\d+ \S+:\d+\] (.*)$")


@functools.cache
def builtin_files() -> dict[str, descriptor_pb2.FileDescriptorProto]:
    """The files confluent-kafka never registers (google/protobuf/*, google/type/*, confluent/*), by import name
    (the AWS Glue serde's built-ins too: the well-known types and google/type/*)."""
    from confluent_kafka.schema_registry.common.protobuf import _init_pool

    pool = DescriptorPool()
    _init_pool(pool)
    files = {}
    for name in _BUILTIN_NAMES:
        try:
            file = pool.FindFileByName(name)
        except KeyError:
            continue
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        files[name] = proto
    return files


_BUILTIN_NAMES = [
    *(
        f"google/protobuf/{n}.proto"
        for n in (
            "any",
            "source_context",
            "type",
            "api",
            "descriptor",
            "duration",
            "empty",
            "field_mask",
            "struct",
            "timestamp",
            "wrappers",
        )
    ),
    *(
        f"google/type/{n}.proto"
        for n in (
            "calendar_period",
            "color",
            "date",
            "datetime",
            "dayofweek",
            "expr",
            "fraction",
            "latlng",
            "money",
            "month",
            "postal_address",
            "quaternion",
            "timeofday",
        )
    ),
    "confluent/meta.proto",
    "confluent/types/decimal.proto",
]


def is_text(schema_str: str) -> bool:
    """`.proto` text, as opposed to a base64 descriptor (base64 has no braces)."""
    return "{" in schema_str or ";" in schema_str


def parse_file(
    name: str, schema_str: str, deps: list[descriptor_pb2.FileDescriptorProto]
) -> descriptor_pb2.FileDescriptorProto:
    """One registered schema as a `FileDescriptorProto` named `name`, its imports given as descriptors."""
    if not is_text(schema_str):
        proto = descriptor_pb2.FileDescriptorProto()
        try:
            proto.ParseFromString(base64.standard_b64decode(schema_str.encode("ascii")))
        except (DecodeError, binascii.Error, UnicodeEncodeError) as error:
            raise ValueError(f"Protobuf schema is neither .proto text nor a base64 descriptor: {error}") from None
        proto.name = name
        return proto
    return compile_text(name, schema_str, deps)


def compile_text(
    name: str, text: str, deps: list[descriptor_pb2.FileDescriptorProto]
) -> descriptor_pb2.FileDescriptorProto:
    """Compile `.proto` text with protoc; its imports resolve to `deps` (registry references and built-ins)."""
    with tempfile.TemporaryDirectory(prefix="icefloe-proto-") as tmp:
        root = Path(tmp)
        source = root / "src" / name
        source.parent.mkdir(parents=True)
        source.write_text(text)
        deps_file, out_file = root / "deps.pb", root / "out.pb"
        deps_file.write_bytes(descriptor_pb2.FileDescriptorSet(file=deps).SerializeToString())
        command = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"--proto_path={root / 'src'}",
            f"--descriptor_set_in={deps_file}",
            f"--descriptor_set_out={out_file}",
            name,
        ]
        # The child sees this process's imports (on EMR the bundle's deps are put on sys.path, not in site-packages).
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
        if result.returncode != 0:
            detail = _protoc_errors(result.stderr.replace(str(root / "src") + "/", ""))
            raise ValueError(f"Protobuf schema text does not compile: {detail[:500]}")
        compiled = descriptor_pb2.FileDescriptorSet()
        compiled.ParseFromString(out_file.read_bytes())
    return compiled.file[0]


def _protoc_errors(stderr: str) -> str:
    """protoc's errors first; absl's preamble dropped and its log lines (warnings) after them, without the prefix."""
    errors, logged = [], []
    for line in stderr.splitlines():
        if not line.strip() or line.startswith(_ABSL_PREAMBLE):
            continue
        match = _ABSL_LINE.match(line)
        if match is None:
            errors.append(line)
        else:
            logged.append(f"(protoc: {match.group(1)})")
    return "\n".join(errors + logged)


class ProtobufSchemas:
    """Registered Protobuf schemas as descriptor pools, resolved through the registry and cached per schema id."""

    def __init__(self, client):
        self.client = client
        self.builtins = builtin_files()
        self._files: dict[int, FileDescriptor | ValueError] = {}
        self._references: dict[tuple[str, int], descriptor_pb2.FileDescriptorProto] = {}

    def file(self, schema_id: int) -> FileDescriptor:
        """The file of schema `schema_id`, in a pool with everything it imports."""
        if schema_id not in self._files:
            schema = self.client.get_schema(schema_id, fmt="serialized")
            try:
                self._files[schema_id] = self.resolve(schema, MAIN_FILE.format(schema_id))
            except ValueError as error:  # kept: every record of this id fails alike, without running protoc again
                self._files[schema_id] = error
        found = self._files[schema_id]
        if isinstance(found, ValueError):
            raise ValueError(str(found))
        return found

    def resolve(self, schema, name: str) -> FileDescriptor:
        """A registered schema (`Schema` with references) as a file in its own pool."""
        files: dict[str, descriptor_pb2.FileDescriptorProto] = {}
        main = self._with_imports(schema, name, files, ())
        return in_pool(main, {**self.builtins, **files})

    def _with_imports(
        self, schema, name: str, files: dict, chain: tuple[str, ...]
    ) -> descriptor_pb2.FileDescriptorProto:
        """Resolve `schema`'s references into `files` (depth first), then parse `schema` itself with them."""
        for ref in schema.references or []:
            if ref.name in self.builtins or ref.name in files:
                continue
            if ref.name in chain:
                raise ValueError(f"Protobuf schema references form a cycle: {' -> '.join((*chain, ref.name))}")
            key = (ref.subject, ref.version)
            if key not in self._references:
                registered = self.client.get_version(ref.subject, ref.version, fmt="serialized")
                self._references[key] = self._with_imports(registered.schema, ref.name, files, (*chain, ref.name))
            files[ref.name] = self._references[key]
        deps = list(self.builtins.values()) + list(files.values())
        return parse_file(name, schema.schema_str, deps)


def in_pool(
    main: descriptor_pb2.FileDescriptorProto, files: dict[str, descriptor_pb2.FileDescriptorProto]
) -> FileDescriptor:
    """`main` in a pool of its own with what it imports (from `files`, by import name), imports added first."""
    pool = DescriptorPool()
    added: set[str] = set()

    def add(proto: descriptor_pb2.FileDescriptorProto) -> None:
        if proto.name in added:
            return
        for dependency in proto.dependency:
            if dependency not in files:
                raise ValueError(
                    f"Protobuf schema {proto.name!r} imports {dependency!r}, which is neither a registry "
                    "reference nor a well-known type"
                )
            add(files[dependency])
        pool.Add(proto)
        added.add(proto.name)

    add(main)
    return pool.FindFileByName(main.name)


def message_at(file: FileDescriptor, indexes: list[int]) -> Descriptor:
    """The message a Confluent message-index path names: a top-level message, then nested ones."""
    if not indexes:
        indexes = [0]
    found: Descriptor | None = None
    for index in indexes:
        candidates = ordered_messages(file, found)
        if not 0 <= index < len(candidates):
            where = "the schema's top level" if found is None else f"message {found.full_name}"
            raise ValueError(f"message index {indexes} does not exist: {where} has {len(candidates)} message type(s)")
        found = candidates[index]
    assert found is not None
    return found


def ordered_messages(file: FileDescriptor, parent: Descriptor | None) -> list[Descriptor]:
    """Message types in declaration order (the order message indexes count in)."""
    proto = descriptor_pb2.FileDescriptorProto()
    file.CopyToProto(proto)
    if parent is None:
        package = f"{proto.package}." if proto.package else ""
        return [file.pool.FindMessageTypeByName(package + m.name) for m in proto.message_type]
    return [parent.nested_types_by_name[m.name] for m in _proto_of(parent).nested_type]


def _proto_of(descriptor: Descriptor) -> descriptor_pb2.DescriptorProto:
    proto = descriptor_pb2.DescriptorProto()
    descriptor.CopyToProto(proto)
    return proto


def find_message(file: FileDescriptor, message_type: str | None) -> Descriptor:
    """The table's message type: the named one (full or short name), else the file's first message."""
    if message_type is None:
        return message_at(file, [0])
    try:
        return file.pool.FindMessageTypeByName(message_type)
    except KeyError:
        pass
    package = file.package + "." if file.package else ""
    try:
        return file.pool.FindMessageTypeByName(package + message_type)
    except KeyError:
        names = sorted(_all_names(file))
        raise ValueError(f"messageType {message_type!r} is not in the schema; it declares {names}") from None


def _all_names(file: FileDescriptor) -> list[str]:
    names = []

    def walk(descriptor: Descriptor) -> None:
        names.append(descriptor.full_name)
        for nested in descriptor.nested_types:
            if not nested.GetOptions().map_entry:  # a map field's entry type is no message a table could read
                walk(nested)

    for top in file.message_types_by_name.values():
        walk(top)
    return names


def serialize_file(file: FileDescriptor) -> str:
    """A file and every file it imports, as a base64 `FileDescriptorSet` in dependency order (picklable)."""
    ordered: list[descriptor_pb2.FileDescriptorProto] = []
    seen: set[str] = set()

    def visit(f: FileDescriptor) -> None:
        if f.name in seen:
            return
        seen.add(f.name)
        for dependency in f.dependencies:
            visit(dependency)
        proto = descriptor_pb2.FileDescriptorProto()
        f.CopyToProto(proto)
        ordered.append(proto)

    visit(file)
    return base64.standard_b64encode(descriptor_pb2.FileDescriptorSet(file=ordered).SerializeToString()).decode()


def deserialize_file(encoded: str) -> FileDescriptor:
    """The inverse of `serialize_file`: the last file of the set, in a pool of them all."""
    files = descriptor_pb2.FileDescriptorSet()
    files.ParseFromString(base64.standard_b64decode(encoded))
    pool = DescriptorPool()
    for proto in files.file:
        pool.Add(proto)
    return pool.FindFileByName(files.file[-1].name)
