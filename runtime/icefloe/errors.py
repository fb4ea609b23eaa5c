"""Errors icefloe reports to users. Each message names what is wrong and where."""


class IcefloeError(Exception):
    """Base class: a failure the CLI reports as one clear line and a non-zero exit."""


class ConfigError(IcefloeError):
    """The stack config (or a command-line choice) is invalid."""


class SourceError(IcefloeError):
    """The Kafka cluster or Schema Registry could not be reached or answered wrongly (an environment failure)."""


class RecordError(IcefloeError):
    """One Kafka record could not be decoded or converted (bad input, not an environment failure)."""

    def __init__(self, partition: int, offset: int, cause: str, kind: str = "DecodeError"):
        self.partition = partition
        self.offset = offset
        self.cause = cause
        self.kind = kind
        super().__init__(f"partition {partition} offset {offset}: {kind}: {cause}")


class CommitConflict(IcefloeError):
    """Another writer changed the table while this batch was being written; the batch was not committed."""
