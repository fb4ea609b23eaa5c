"""Errors icefloe reports to users. Each message names what is wrong and where."""

import re
from collections.abc import Iterator
from typing import Any


class IcefloeError(Exception):
    """Base class: a failure the CLI reports as one clear line and a non-zero exit."""


class ConfigError(IcefloeError):
    """The stack config (or a command-line choice) is invalid."""


class SourceError(IcefloeError):
    """The Kafka cluster or Schema Registry could not be reached or answered wrongly (an environment failure)."""


class SourceAuthError(SourceError):
    """The Kafka cluster (or registry) refused icefloe's credentials or certificate, or its certificate could not be
    verified. Not transient: retrying gives the same refusal (librdkafka itself would retry it for ever)."""


class RecordError(IcefloeError):
    """One Kafka record could not be decoded or converted (bad input, not an environment failure)."""

    def __init__(self, partition: int, offset: int, cause: str, kind: str = "DecodeError"):
        self.partition = partition
        self.offset = offset
        self.cause = cause
        self.kind = kind
        super().__init__(f"partition {partition} offset {offset}: {kind}: {cause}")


class BadRecord(ValueError):
    """What a decoder declares about one record's bytes: they cannot be read as the table's format (a bad record,
    routed by the table's error mode). Any other exception raised while decoding is a bug (`DecoderFailure`).
    `kind` is the record's error class in the dead-letter table and the logs."""

    kind = "DecodeError"


class DecoderFailure(IcefloeError):
    """A decoder raised something it does not declare (not a `BadRecord`): a bug, never a bad record. The batch
    fails and nothing is committed; the message names the record's position and the exception's type and code
    line, never its text (it may quote the value)."""


class DataLossError(IcefloeError):
    """Records the table had not read were deleted from the topic (and the table's onDataLoss is `fail`). Not
    transient: retrying finds the same gap until the user decides (`onDataLoss: warn`) or restores the records."""


class CheckpointLost(IcefloeError):
    """A table holds data but no checkpoint can be found in main's history (a snapshot between main's head and the
    last checkpoint was expired): where to resume is unknown, so nothing is read rather than re-read or skipped."""


class CommitConflict(IcefloeError):
    """Another writer changed the table while this batch was being written; the batch was not committed."""


class RunTimedOut(CommitConflict):
    """The batch took longer than `runTimeout` and was not published (its branch may have been dropped): a retry
    plans a smaller batch than its `records`."""

    def __init__(self, message: str, records: int = 0):
        super().__init__(message)
        self.records = records


class ClockSkew(IcefloeError):
    """Iceberg refused a commit because this host's clock is more than a minute behind the table's last commit
    (another writer's clock). Not transient: a run's retries come seconds apart and would meet the same refusal; a
    continuous job waits and retries with backoff (a table error, not a bad record or config) until the clocks agree."""


# Iceberg's TableMetadata refuses metadata stamped more than a minute before its last snapshot (or metadata) log entry.
_SKEW = re.compile(
    r"Invalid update timestamp (\d+): before (?:last snapshot log entry at|the latest metadata log entry timestamp) (\d+)"
)


def clock_skew(error: BaseException, identifier: str) -> ClockSkew | None:
    """`error` as a `ClockSkew` naming the table and how far behind this host's clock is, if it is Iceberg's
    refusal of an update timestamp; else None."""
    match = _SKEW.search(str(error))
    if match is None:
        return None
    behind = (int(match.group(2)) - int(match.group(1))) / 1000
    return ClockSkew(
        f"table {identifier}: Iceberg refused the commit: this host's clock is {behind:.0f}s behind the table's last "
        "commit (another writer's clock), more than the minute Iceberg allows; nothing was committed. Synchronize "
        "the clocks (NTP) of the hosts writing this table"
    )


# Words in an error's text that mark a passing environment failure (network, throttling, a service briefly away), as
# opposed to a bug or bad data: the fallback for what reaches the driver as text only, after the typed checks
# (`_transient_by_type`: Java classes and their codes through Py4J, the Kafka client's KafkaError codes, botocore's
# error codes and types). Text only: a failure inside a Spark task (an executor's Kafka client, a Python worker's
# KafkaException or registry call, the JDBC catalog's lock in a task) arrives as its stack trace in the driver's
# error text, and an error a library wraps in its own generic type keeps the cause as words.
_TRANSIENT_MARKS = (
    "connection refused",
    "connect timed out",
    "connection reset",
    "unable to execute http request",
    "sdkclientexception",
    "serviceunavailable",
    "service unavailable",
    "throttl",
    "slowdown",
    "slow down",
    "requesttimeout",
    "timed out",
    "timeout",
    "temporarily",
    "too many requests",
    "broker transport failure",
    "all brokers are down",
    "unknownhost",
    "no route to host",
    "sqlite_busy",
    "database is locked",  # the local catalog held by another run: re-plan once it is free
    # A catalog commit that lost a race and was not retried by Iceberg (a schema change: Iceberg re-applies it to the
    # metadata it first read, and Glue refuses that every time). Nothing was committed; the next attempt re-reads.
    "commitfailedexception",
)


# Iceberg's exception for a commit that lost a race with another writer's (nothing was committed), and for a commit
# its validation refused (a rewrite whose files another commit replaced or deleted meanwhile).
COMMIT_FAILED = "org.apache.iceberg.exceptions.CommitFailedException"
VALIDATION_FAILED = "org.apache.iceberg.exceptions.ValidationException"


# Java exceptions (or their superclasses) anywhere in a JVM error's cause chain that mark a failure worth retrying.
_TRANSIENT_JAVA = {
    # A catalog commit that lost a race and was not retried by Iceberg: nothing was committed (as the text mark).
    "org.apache.iceberg.exceptions.CommitFailedException",
    # The catalog failed during the commit (a Glue 5xx in UpdateTable): the commit may or may not have happened. A
    # re-plan is safe either way, because the offsets live in main: it resumes from whatever main holds.
    "org.apache.iceberg.exceptions.CommitStateUnknownException",
    "org.apache.iceberg.exceptions.ServiceUnavailableException",  # a REST catalog's 503 (S3 Tables)
    "software.amazon.awssdk.core.exception.SdkClientException",  # no answer from AWS (network, timeouts)
    "java.net.SocketTimeoutException",
    "java.net.ConnectException",
    "java.net.UnknownHostException",
}


def java_chain(error: BaseException) -> Iterator[Any]:
    """The Java exception a Py4J call threw and its causes (Py4J objects, outermost first); none for an error that
    did not come from the JVM."""
    thrown = getattr(error, "java_exception", None) or getattr(error, "_origin", None)  # Py4J's, PySpark's capture
    try:
        for _ in range(20):  # a cause chain can loop
            if thrown is None:
                return
            yield thrown
            cause = thrown.getCause()
            thrown = None if cause is None or cause.equals(thrown) else cause
    except Exception:  # the gateway is gone, or not a Java object: the text decides
        return


def class_names(thrown: Any) -> set[str]:
    """A Java exception's class and its superclasses, by name."""
    names: set[str] = set()
    try:
        cls = thrown.getClass()
        while cls is not None:
            names.add(cls.getName())
            cls = cls.getSuperclass()
    except Exception:  # the gateway is gone
        pass
    return names


def java_classes(error: BaseException) -> set[str]:
    """The Java classes, with their superclasses, of the exception a Py4J call threw and of its causes; empty for
    an error that did not come from the JVM."""
    return {name for thrown in java_chain(error) for name in class_names(thrown)}


# A REST catalog server without apache/iceberg#15126 (Iceberg's own before 1.11) answers a snapshot commit built on
# metadata that another branch's commit has since moved past (both took the same sequence number) with 400, where
# it means 409: a race lost, nothing committed. 400's type names every refused request: its message tells this one.
_BAD_REQUEST = "org.apache.iceberg.exceptions.BadRequestException"
_SEQUENCE_RACE = "older than last sequence number"

# The Python Kafka client's (librdkafka's) codes for a passing failure, beside those it marks retriable itself.
_TRANSIENT_KAFKA_CODES = ("_TRANSPORT", "_ALL_BROKERS_DOWN", "_TIMED_OUT", "_MSG_TIMED_OUT", "_RESOLVE")
# AWS error codes (botocore's ClientError, the Java SDK's AwsServiceException) and HTTP statuses for throttling or a
# service briefly away.
_TRANSIENT_AWS_CODES = {
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "TooManyRequestsException",
    "RequestLimitExceeded",
    "SlowDown",
    "ServiceUnavailable",
    "ServiceUnavailableException",
    "InternalFailure",
    "RequestTimeout",
    "RequestTimeoutException",
}
_TRANSIENT_HTTP = {429, 500, 502, 503, 504}
_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6  # SQLite's primary result codes (an extended code keeps them in its low byte)


def _transient_by_type(error: BaseException) -> bool:
    """The typed signals of a passing failure: a Java exception's class (and an AWS or SQLite exception's code), a
    KafkaError's code, a botocore error's code or type."""
    if java_classes(error) & _TRANSIENT_JAVA:
        return True
    for thrown in java_chain(error):
        names = class_names(thrown)
        try:
            if _BAD_REQUEST in names and _SEQUENCE_RACE in str(thrown.getMessage()):
                return True
            if "software.amazon.awssdk.core.exception.SdkServiceException" in names and (
                thrown.isThrottlingException() or thrown.statusCode() in _TRANSIENT_HTTP
            ):
                return True
            if "org.sqlite.SQLiteException" in names and thrown.getErrorCode() & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED):
                return True  # the local catalog held by another run: re-plan once it is free
        except Exception:  # the gateway is gone
            return False
    kind = type(error)
    if kind.__module__.startswith("cimpl") or kind.__module__.startswith("confluent_kafka"):
        from confluent_kafka import KafkaError, KafkaException

        found = error.args[0] if isinstance(error, KafkaException) and error.args else None
        if isinstance(found, KafkaError):
            return found.retriable() or found.code() in {getattr(KafkaError, code) for code in _TRANSIENT_KAFKA_CODES}
    if kind.__module__.startswith("botocore"):
        from botocore.exceptions import (
            ClientError,
            ConnectionClosedError,
            ConnectTimeoutError,
            EndpointConnectionError,
            ReadTimeoutError,
        )

        if isinstance(error, (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError)):
            return True
        if isinstance(error, ClientError):
            response = error.response or {}
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return response.get("Error", {}).get("Code") in _TRANSIENT_AWS_CODES or status in _TRANSIENT_HTTP
    return False


def is_transient(error: BaseException) -> bool:
    """True for failures worth retrying: the source, registry or catalog was unreachable or asked us to slow down,
    or a catalog commit lost a race or ended with its outcome unknown. Record errors and configuration errors never
    are: retrying would give the same answer. Judged by type first (`_transient_by_type`), then by the words of an
    error that arrives as text only (`_TRANSIENT_MARKS`)."""
    if isinstance(error, (RecordError, ConfigError, ClockSkew, SourceAuthError, DecoderFailure)):  # same answer again
        return False
    if isinstance(error, (SourceError, CommitConflict)):
        return True
    if _transient_by_type(error):
        return True
    text = f"{type(error).__name__}: {error}".lower()
    return any(mark in text for mark in _TRANSIENT_MARKS)


class InvalidChange(BadRecord):
    """A change event that decodes but cannot be applied (no or an unknown op, a key that does not match its row):
    a bad record (`InvalidChange`) under the table's error mode."""

    kind = "InvalidChange"
