"""Spark's Kafka source reading exactly the planned offset ranges, records as rows with icefloe's Kafka columns.

The JVM data plane's first step: `spark.read.format("kafka")` with `assign` and `startingOffsets`/`endingOffsets`
JSON for the planned ranges (ends at the last stable offset, so `read_committed` never waits), `failOnDataLoss`
on (a record deleted between planning and reading fails the read instead of silently vanishing), headers included.
The cluster's librdkafka settings (`kafka_source.client_config`) are mapped to the Java client's `kafka.*` options;
SASL credentials become a JAAS line, which Spark redacts in plans and logs (its value contains `password`), and
which icefloe never logs; MSK IAM becomes aws-msk-iam-auth's login module, which signs with the job's credentials.

TLS material goes inline, as PEM text in the Java client's own options (`kafka.ssl.truststore.certificates`,
`kafka.ssl.keystore.certificate.chain`, `kafka.ssl.keystore.key`): nothing is written to any disk, S3 or the table.
Java 17 refuses a PBES2-encrypted key (what openssl 3 writes by default: `PBES2 SecretKeyFactory not available`), so
an encrypted key is decrypted here, in memory, into an unencrypted PKCS#8 PEM, and given without a password.
Spark 3.5's (V1) Kafka relation prints no options in plans; `session.spark_session` also extends Spark's redaction
pattern to these options, for plans that list them (a V2 scan).
"""

from __future__ import annotations

import json

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from icefloe.batch_columns import KAFKA_COLUMNS
from icefloe.errors import ConfigError, SourceAuthError, SourceError, class_names, java_chain
from icefloe.source.kafka import OffsetRange
from icefloe.source.msk_iam import JVM_OPTIONS as MSK_IAM_OPTIONS
from icefloe.source.msk_iam import MskIamToken

# The Java client's defaults tuned for reading a bounded range that already exists:
#  - larger fetches (default 1 MiB per partition, 64 KiB socket buffer): fewer round trips;
#  - fetch.max.wait.ms 10 (default 500): once a task's records are in, the client has already asked for the offset
#    after its range's end, where nothing is to come; the broker held that fetch 500 ms, and the task's next request
#    on the connection waited behind it (measured: a 1M-record count took 1.5 s, 0.5 s with 10 ms);
#  - max.poll.records 10000 (default 500): Spark asks the broker for the partition's earliest and latest offsets
#    after every poll (two ListOffsets round trips per 500 records at the default).
FETCH_TUNING = {
    "kafka.max.partition.fetch.bytes": str(8 * 1024 * 1024),
    "kafka.fetch.max.bytes": str(64 * 1024 * 1024),
    "kafka.receive.buffer.bytes": str(1024 * 1024),
    "kafka.fetch.max.wait.ms": "10",
    "kafka.max.poll.records": "10000",
}
_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
# librdkafka keys `client_config` produces, as the Java client names them (credentials handled apart). `client.id`
# is left to Spark: the Java client registers each consumer under its id, and one id for all of them clashes.
_SAME_NAME = ("bootstrap.servers", "security.protocol", "sasl.mechanism")
_IGNORED = ("client.id", "sasl.username", "sasl.password", "error_cb")
_TLS = ("ssl.ca.pem", "ssl.certificate.pem", "ssl.key.pem", "ssl.key.password", "ssl.endpoint.identification.algorithm")
# Options holding TLS material, redacted by Spark (session.spark_session adds them to spark.redaction.regex).
TLS_OPTIONS = ("kafka.ssl.truststore.certificates", "kafka.ssl.keystore.certificate.chain", "kafka.ssl.keystore.key")
_TIMESTAMP_TYPES = {0: "CreateTime", 1: "LogAppendTime"}  # Java's TimestampType ids; -1 is "no timestamp"


def kafka_options(conf: dict) -> dict[str, str]:
    """The Kafka source's `kafka.*` options for a librdkafka client config (holds credentials: never log it)."""
    options = {f"kafka.{key}": conf[key] for key in _SAME_NAME if key in conf}
    unmapped = sorted(set(conf) - set(_SAME_NAME) - set(_IGNORED) - set(_TLS) - {"oauth_cb"})
    if unmapped:
        raise ConfigError(f"Kafka settings {unmapped} have no mapping to Spark's Kafka source")
    if isinstance(conf.get("oauth_cb"), MskIamToken):
        # MSK IAM: the Java client signs with aws-msk-iam-auth and the job's own credentials (msk_iam.py).
        options |= MSK_IAM_OPTIONS
    elif "oauth_cb" in conf:
        raise ConfigError("an OAUTHBEARER token callback other than MSK IAM has no JVM equivalent")
    elif "sasl.mechanism" in conf:
        module = _JAAS_MODULES.get(conf["sasl.mechanism"])
        if module is None:
            raise ConfigError(f"SASL mechanism {conf['sasl.mechanism']!r} is not supported by the JVM read path")
        user, password = _jaas_quoted(conf["sasl.username"]), _jaas_quoted(conf["sasl.password"])
        options["kafka.sasl.jaas.config"] = f'{module} required username="{user}" password="{password}";'
    return options | tls_options(conf) | FETCH_TUNING | {"kafka.isolation.level": "read_committed"}


def tls_options(conf: dict) -> dict[str, str]:
    """The Java client's PEM options for librdkafka's inline `ssl.*.pem` settings (hold key material: never log)."""
    options: dict[str, str] = {}
    if "ssl.endpoint.identification.algorithm" in conf:
        algorithm = conf["ssl.endpoint.identification.algorithm"]
        options["kafka.ssl.endpoint.identification.algorithm"] = "" if algorithm == "none" else algorithm
    if "ssl.ca.pem" in conf:
        options |= {"kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.certificates": conf["ssl.ca.pem"]}
    if "ssl.key.pem" in conf:
        options |= {
            "kafka.ssl.keystore.type": "PEM",
            "kafka.ssl.keystore.certificate.chain": conf["ssl.certificate.pem"],
            "kafka.ssl.keystore.key": unencrypted_key(conf["ssl.key.pem"], conf.get("ssl.key.password")),
        }
    return options


def unencrypted_key(pem: str, password: str | None) -> str:
    """The private key as unencrypted PKCS#8 PEM (what the Java client reads without `ssl.key.password`): an
    encrypted key (PBES2, which Java 17 refuses, or PBES1) is decrypted in memory; nothing is written anywhere."""
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_private_key(pem.encode(), password.encode() if password else None)
    except (ValueError, TypeError) as error:
        # The library's text says what is wrong (bad password, not a key, a password missing), never the key.
        raise ConfigError(f"tls.clientKey cannot be read: {error}") from None
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def _jaas_quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def read_ranges(spark: SparkSession, conf: dict[str, str], ranges: list[OffsetRange], tasks: int = 0) -> DataFrame:
    """The records of `ranges` as rows: icefloe's Kafka columns plus `value` (the raw value bytes). Spark splits
    the ranges into `tasks` tasks when that is more than one per partition."""
    if not ranges:
        raise ValueError("read_ranges needs at least one range")
    topic = ranges[0].topic
    starts = {str(r.partition): r.start for r in ranges}
    ends = {str(r.partition): r.end for r in ranges}
    reader = spark.read.format("kafka")
    for key, value in kafka_options(conf).items():
        reader = reader.option(key, value)
    raw = (
        reader.option("assign", json.dumps({topic: sorted(r.partition for r in ranges)}))
        .option("startingOffsets", json.dumps({topic: starts}))
        .option("endingOffsets", json.dumps({topic: ends}))
        .option("failOnDataLoss", "true")
        .option("includeHeaders", "true")
        .option("minPartitions", str(max(tasks, len(ranges))))
        .load()
    )
    return raw.select(*kafka_columns(), F.col("value"))


def kafka_columns() -> list[Column]:
    """icefloe's Kafka columns from the source's own (`topic`, `partition`, ..., `headers`)."""
    kind = F.col("timestampType")
    sources = {
        "kafka_topic": F.col("topic"),
        "kafka_partition": F.col("partition"),
        "kafka_offset": F.col("offset"),
        "kafka_timestamp": F.when(kind.isin(*_TIMESTAMP_TYPES), F.col("timestamp")),
        "kafka_timestamp_type": F.when(kind == 0, _TIMESTAMP_TYPES[0]).when(kind == 1, _TIMESTAMP_TYPES[1]),
        "kafka_key": F.col("key"),
        "kafka_headers": F.col("headers"),
    }
    return [sources[name].alias(name) for name in KAFKA_COLUMNS]


def kafka_timestamp_overflow(error: Exception) -> bool:
    """Whether the Kafka source failed on a record timestamp it cannot turn into microseconds (a producer that set
    nanoseconds where Kafka wants milliseconds): Spark fails the task, it has no per-record way out. By type where
    the JVM gives the exception (an ArithmeticException thrown in the converter's frame); else by text: a task's
    failure can reach the driver as a SparkException whose cause is the executor's stack trace as text, and its
    frame (the converter) is what tells it."""
    for thrown in java_chain(error):
        if "java.lang.ArithmeticException" in class_names(thrown) and any(
            "KafkaRecordToRowConverter" in frame.getClassName() for frame in thrown.getStackTrace()
        ):
            return True
    text = str(error)
    return "ArithmeticException: long overflow" in text and "KafkaRecordToRowConverter" in text


# The Java client's exceptions for a refused login or a failed TLS handshake (a certificate not trusted, or refused).
_AUTH_EXCEPTIONS = {
    "org.apache.kafka.common.errors.SaslAuthenticationException": "authentication failed",
    "org.apache.kafka.common.errors.SslAuthenticationException": "TLS handshake failed",
}
_OFFSET_OUT_OF_RANGE = "org.apache.kafka.clients.consumer.OffsetOutOfRangeException"


def source_failure(error: Exception, topic: str, cluster: str | None = None) -> SourceError | None:
    """A Kafka source failure as a short `SourceError` (Spark's own text is a page of stack trace), else None. An
    authentication or TLS failure is a `SourceAuthError` naming the cluster (not retried). By the Java exception's
    class where the JVM gives it (the driver's own Kafka client: Spark lists offsets there); by text for a task's
    failure that reaches the driver as the executor's stack trace in text, and for Spark's data-loss check, an
    IllegalStateException told apart only by its message."""
    where = f"sourceCluster {cluster}" if cluster else topic
    for thrown in java_chain(error):
        names = class_names(thrown)
        for name, what in _AUTH_EXCEPTIONS.items():
            if name in names:
                return SourceAuthError(f"{where}: {what} (topic {topic}): {str(thrown.toString()).strip()[:400]}")
        if _OFFSET_OUT_OF_RANGE in names:
            return _records_deleted(topic)
    text = str(error)
    for line in text.splitlines():
        for name, what in _AUTH_EXCEPTIONS.items():
            if line.strip().startswith(name) or f"Caused by: {name}" in line:
                return SourceAuthError(f"{where}: {what} (topic {topic}): {line.strip()[:400]}")
    if "Some data may have been lost" in text or "OffsetOutOfRangeException" in text:
        return _records_deleted(topic)
    for line in text.splitlines():
        if "org.apache.kafka" in line and ("Exception" in line or "Error" in line):
            return SourceError(f"{topic}: Kafka read failed: {line.strip()[:300]}")
    return None


def _records_deleted(topic: str) -> SourceError:
    return SourceError(
        f"{topic}: records of the planned ranges were deleted (retention or delete-records) while the batch was "
        "read; nothing was committed, the next run re-plans and reports the loss"
    )
