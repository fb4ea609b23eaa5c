"""Which failures a run retries (runner.run_table backs off and re-plans) and which it reports at once."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from confluent_kafka import KafkaError, KafkaException

from icefloe.errors import ClockSkew, ConfigError, RecordError, clock_skew, is_transient
from java_fakes import FakeThrowable, thrown_by_jvm

# What the local JDBC catalog raises when another run holds SQLite's write lock (seen with two overlapping writers).
SQLITE_BUSY = (
    "py4j.protocol.Py4JJavaError: An error occurred while calling o123.commit.\n"
    ": org.apache.iceberg.jdbc.UncheckedSQLException: Failed to execute: ...\n"
    "Caused by: org.sqlite.SQLiteException: [SQLITE_BUSY] The database file is locked (database is locked)"
)


# What a schema change that lost a Glue commit race raises (tests/table/test_glue_catalog.py races two for real).
LOST_COMMIT = ": org.apache.iceberg.exceptions.CommitFailedException: Table metadata refresh is required"


@pytest.mark.parametrize(
    "text",
    [SQLITE_BUSY, LOST_COMMIT, "Connection refused: localhost/127.0.0.1:9092", "ThrottlingException: Rate exceeded"],
)
def test_a_busy_or_unreachable_catalog_or_source_is_retried(text):
    assert is_transient(RuntimeError(text))


def test_bad_records_bad_config_and_plain_failures_are_not_retried():
    assert not is_transient(RecordError(0, 5, "value is not valid UTF-8", "InvalidValue"))
    assert not is_transient(ConfigError("table x: unknown setting 'formt'"))
    assert not is_transient(RuntimeError("NullPointerException in the writer"))


def java_failure(spark, java_class: str, message: str):
    """An error as a Py4J call that threw `java_class` (caused by a RuntimeError saying `message`) raises it."""
    from py4j.protocol import Py4JJavaError

    jvm = spark._jvm
    cause = jvm.java.lang.RuntimeException(message)
    thrown = getattr(jvm, java_class)(cause) if java_class != "java.lang.RuntimeException" else cause
    return Py4JJavaError("An error occurred while calling o42.commit.\n", thrown)


# What Glue answering UpdateTable with a 5xx gives: Iceberg cannot tell whether the commit happened.
GLUE_5XX = "Internal Service Exception (Service: Glue, Status Code: 500, Request ID: 1f2e)"


@pytest.mark.spark
def test_a_commit_whose_outcome_is_unknown_is_retried_by_its_type(spark):
    """A re-plan is safe whatever the commit did: the offsets live in main. Decided by the Java exception's class
    (its text names no timeout), not by words in it; the same text in another class is not retried."""
    unknown = java_failure(spark, "org.apache.iceberg.exceptions.CommitStateUnknownException", GLUE_5XX)
    assert is_transient(unknown)
    assert not is_transient(java_failure(spark, "java.lang.RuntimeException", GLUE_5XX))


@pytest.mark.parametrize("entry", ["last snapshot log entry at", "the latest metadata log entry timestamp"])
def test_a_clock_behind_the_tables_last_commit_is_named_and_not_retried(entry):
    """Iceberg refuses metadata updated more than a minute before the last snapshot (or metadata) log entry: another
    writer's clock is ahead of this host's. Retrying within the run would meet the same refusal."""
    text = f"java.lang.IllegalArgumentException: Invalid update timestamp 1700000000000: before {entry} 1700000090000"
    skew = clock_skew(RuntimeError(text), "local.orders")
    assert isinstance(skew, ClockSkew) and not is_transient(skew)
    assert "local.orders" in str(skew) and "90s" in str(skew) and "clock" in str(skew)
    assert clock_skew(RuntimeError("Invalid partition spec"), "local.orders") is None


@pytest.mark.spark
@pytest.mark.broker
def test_a_run_reports_clock_skew_by_name_and_does_not_retry_it(spark, state_dir, make_config, monkeypatch):
    from icefloe.operate import runner

    config = make_config({"topic": "skewed", "format": "json", "schema": {"fields": [{"name": "n", "type": "long"}]}})
    calls = []

    def refused(*args):
        calls.append(1)
        raise RuntimeError(
            "IllegalArgumentException: Invalid update timestamp 1700000000000: before last snapshot "
            "log entry at 1700000125000"
        )

    monkeypatch.setattr(runner, "materialize_once", refused)
    with pytest.raises(ClockSkew, match="125s behind"):
        runner.run_table(spark, config, config.tables[0], state_dir)
    assert len(calls) == 1


SDK_SERVICE = [
    "software.amazon.awssdk.awscore.exception.AwsServiceException",
    "software.amazon.awssdk.core.exception.SdkServiceException",
    "java.lang.RuntimeException",
]
# A REST catalog's 400: one type for every refused request
BAD_REQUEST = "org.apache.iceberg.exceptions.BadRequestException"


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(KafkaException(KafkaError(KafkaError._RESOLVE)), id="kafka-local-code"),
        pytest.param(KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE, retriable=True)), id="kafka-retriable"),
        pytest.param(
            thrown_by_jvm(FakeThrowable(["org.sqlite.SQLiteException", "java.sql.SQLException"], getErrorCode=5)),
            id="sqlite-busy",
        ),
        pytest.param(
            thrown_by_jvm(
                FakeThrowable(
                    ["org.apache.iceberg.jdbc.UncheckedSQLException"],
                    FakeThrowable(["org.sqlite.SQLiteException"], getErrorCode=517),
                )
            ),
            id="sqlite-busy-snapshot-as-cause",
        ),
        pytest.param(
            thrown_by_jvm(
                FakeThrowable(
                    ["software.amazon.awssdk.services.glue.model.GlueException", *SDK_SERVICE],
                    isThrottlingException=True,
                    statusCode=400,
                )
            ),
            id="aws-java-throttled",
        ),
        pytest.param(
            thrown_by_jvm(
                FakeThrowable(
                    ["software.amazon.awssdk.services.glue.model.GlueException", *SDK_SERVICE],
                    isThrottlingException=False,
                    statusCode=503,
                )
            ),
            id="aws-java-503",
        ),
        pytest.param(
            thrown_by_jvm(
                FakeThrowable(
                    [BAD_REQUEST, "org.apache.iceberg.exceptions.RESTException", "java.lang.RuntimeException"],
                    getMessage="Malformed request: Cannot add snapshot with sequence number 3 older than last "
                    "sequence number 3",
                )
            ),
            id="rest-sequence-number-race",
        ),
        pytest.param(
            ClientError(
                {"Error": {"Code": "RequestLimitExceeded", "Message": "Request limit exceeded."}}, "GetSecretValue"
            ),
            id="botocore-code",
        ),
        pytest.param(
            ClientError({"Error": {"Code": "InternalError"}, "ResponseMetadata": {"HTTPStatusCode": 503}}, "GetTable"),
            id="botocore-503",
        ),
        pytest.param(
            EndpointConnectionError(endpoint_url="https://glue.eu-west-1.amazonaws.com"), id="botocore-endpoint"
        ),
    ],
)
def test_passing_failures_are_retried_by_their_type_not_their_words(error):
    """The typed signals (a KafkaError's code or retriable flag, a Java exception's class and its SQLite or AWS
    code through Py4J, botocore's codes and types) decide, whatever the text says (none of these texts holds a
    transient word)."""
    assert is_transient(error)


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)), id="kafka-authorization"),
        pytest.param(
            thrown_by_jvm(FakeThrowable(["org.sqlite.SQLiteException", "java.sql.SQLException"], getErrorCode=1)),
            id="sqlite-error",
        ),
        pytest.param(
            thrown_by_jvm(
                FakeThrowable(
                    ["software.amazon.awssdk.services.glue.model.EntityNotFoundException", *SDK_SERVICE],
                    isThrottlingException=False,
                    statusCode=400,
                )
            ),
            id="aws-java-not-found",
        ),
        pytest.param(
            thrown_by_jvm(
                FakeThrowable(
                    [BAD_REQUEST, "org.apache.iceberg.exceptions.RESTException", "java.lang.RuntimeException"],
                    getMessage="Malformed request: Cannot set current schema to unknown schema: 7",
                )
            ),
            id="rest-bad-request",
        ),
        pytest.param(
            ClientError(
                {"Error": {"Code": "AccessDeniedException"}, "ResponseMetadata": {"HTTPStatusCode": 400}}, "GetTable"
            ),
            id="botocore-denied",
        ),
    ],
)
def test_lasting_failures_of_the_same_types_are_not_retried(error):
    assert not is_transient(error)
