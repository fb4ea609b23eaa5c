"""Spark's Kafka source failures told apart by the Java exception's class where the JVM gives it (the driver's own
client, or a task's exception deserialized), by its text where only the text arrives (no Spark: Py4J stand-ins)."""

from __future__ import annotations

from icefloe.errors import SourceAuthError, SourceError
from icefloe.source.spark_kafka import kafka_timestamp_overflow, source_failure
from java_fakes import FakeFrame, FakeThrowable, thrown_by_jvm

SASL = "org.apache.kafka.common.errors.SaslAuthenticationException"


def test_a_refused_login_is_an_auth_error_by_its_class():
    refused = FakeThrowable(
        [SASL, "org.apache.kafka.common.errors.AuthenticationException"], toString=f"{SASL}: invalid credentials"
    )
    failure = source_failure(thrown_by_jvm(FakeThrowable(["org.apache.spark.SparkException"], refused)), "t", "main")
    assert isinstance(failure, SourceAuthError)
    assert str(failure) == f"sourceCluster main: authentication failed (topic t): {SASL}: invalid credentials"


def test_records_deleted_while_read_are_named_by_their_class():
    gone = FakeThrowable(["org.apache.kafka.clients.consumer.OffsetOutOfRangeException"], toString="out of range")
    failure = source_failure(thrown_by_jvm(gone), "t")
    assert type(failure) is SourceError and "records of the planned ranges were deleted" in str(failure)


def test_the_text_decides_where_no_java_exception_arrives():
    text = f"Job aborted due to stage failure: ...\nCaused by: {SASL}: invalid credentials\n\tat ..."
    assert isinstance(source_failure(RuntimeError(text), "t", "main"), SourceAuthError)
    assert source_failure(RuntimeError("NullPointerException in the writer"), "t") is None


def test_a_timestamp_overflow_in_the_kafka_converter_is_told_by_type_and_frame():
    def overflow(frame: str) -> Exception:
        arithmetic = FakeThrowable(
            ["java.lang.ArithmeticException", "java.lang.RuntimeException"], getStackTrace=[FakeFrame(frame)]
        )
        return thrown_by_jvm(FakeThrowable(["org.apache.spark.SparkException"], arithmetic))

    assert kafka_timestamp_overflow(overflow("org.apache.spark.sql.kafka010.KafkaRecordToRowConverter"))
    assert not kafka_timestamp_overflow(overflow("org.apache.spark.sql.catalyst.expressions.Add"))
    assert kafka_timestamp_overflow(
        RuntimeError("java.lang.ArithmeticException: long overflow\n\tat org.apache...KafkaRecordToRowConverter")
    )
