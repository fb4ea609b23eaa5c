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


class DataLossError(IcefloeError):
    """Records the table had not read were deleted from the topic (and the table's onDataLoss is `fail`). Not
    transient: retrying finds the same gap until the user decides (`onDataLoss: warn`) or restores the records."""


class CheckpointLost(IcefloeError):
    """A table holds data but no checkpoint can be found in main's history (a snapshot between main's head and the
    last checkpoint was expired): where to resume is unknown, so nothing is read rather than re-read or skipped."""


class CommitConflict(IcefloeError):
    """Another writer changed the table while this batch was being written; the batch was not committed."""


# Words in a JVM or client error that mark a passing environment failure (network, throttling, a service briefly
# away), as opposed to a bug or bad data. Matched case-insensitively against the error's text.
_TRANSIENT_MARKS = (
    "connection refused", "connect timed out", "connection reset", "unable to execute http request",
    "sdkclientexception", "serviceunavailable", "service unavailable", "throttl", "slowdown", "slow down",
    "requesttimeout", "timed out", "timeout", "temporarily", "too many requests", "broker transport failure",
    "all brokers are down", "unknownhost", "no route to host",
    "sqlite_busy", "database is locked",  # the local catalog held by another run: re-plan once it is free
    # A catalog commit that lost a race and was not retried by Iceberg (a schema change: Iceberg re-applies it to the
    # metadata it first read, and Glue refuses that every time). Nothing was committed; the next attempt re-reads.
    "commitfailedexception",
)


def is_transient(error: BaseException) -> bool:
    """True for failures worth retrying: the source, registry or catalog was unreachable or asked us to slow down.
    Record errors and configuration errors never are: retrying would give the same answer."""
    if isinstance(error, (RecordError, ConfigError)):
        return False
    if isinstance(error, (SourceError, CommitConflict)):
        return True
    text = f"{type(error).__name__}: {error}".lower()
    return any(mark in text for mark in _TRANSIENT_MARKS)
