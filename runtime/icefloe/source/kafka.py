"""Reading Kafka: client settings, planning offset ranges on the driver, reading one range in an executor.

Planning asks the broker (ListOffsets) for each partition's log start and its *last stable offset* (LSO, the end a
`read_committed` reader can reach): records of an open transaction wait for the next run instead of stalling this
one. Offset gaps (transaction markers, aborted records, compaction) are normal: readers stop at the planned end or
at a partition-EOF event at or past it, never counting records.

What the table has not read yet but the broker no longer has is data loss: it is detected at planning (the table's
next offset is below the log start, or a partition added since the last run no longer starts at 0) and handled by
the table's `onDataLoss`: `fail` stops with the topic, partition and lost range named; `warn` goes on and the lost
ranges are reported and recorded with the commit. A topic deleted and recreated under the same name is told apart by
its topic id (recorded with every commit) and refused. A log truncated below the table's position (unclean leader
election) is data loss too, found by the leader epoch recorded with every commit (`truncated_below`); where the
broker reports no topic id (before Kafka 2.8) a recreated topic starts again at the same epoch, so a record the table
read (its offset and timestamp, `known_records`) is recorded too and looked up again (`rewritten`).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from icefloe.credentials import resolve_credentials, resolve_tls
from icefloe.errors import ConfigError, DataLossError, SourceAuthError, SourceError
from icefloe.source.msk_iam import MskIamToken
from icefloe.spec import MSK_IAM, SourceCluster

log = logging.getLogger(__name__)
METADATA_TIMEOUT_S = 15.0
PLAN_TIMEOUT_S = 30.0
# librdkafka consumers must name a group; icefloe's never join it or commit to it (offsets live in the table), but
# librdkafka still looks up its coordinator (MSK IAM: kafka-cluster:DescribeGroup on this group only).
CONSUMER_GROUP = "icefloe"
READ_STALL_TIMEOUT_S = 60.0


class RefusedConnection:
    """librdkafka's `error_cb`: an authentication or TLS failure raises `SourceAuthError` naming the cluster.

    librdkafka retries these for ever and tells only this callback why (its calls just time out with a generic
    transport error), so the callback turns them into a failure, classified by error code: `_AUTHENTICATION` (a
    wrong password or user) and `_SSL` (the server's certificate does not verify). A broker that refuses the client's
    certificate ends the handshake with a TLS alert, which librdkafka reports as `_TRANSPORT` (as any broken
    connection) but quotes: a certificate alert received (`REFUSED_CERTIFICATE_ALERTS`) is that refusal; any other
    transport error (an outage) is kept as `last_transport_error`, quoted when the call then fails, and retried.
    Picklable (a plain class): executors' clients get their own."""

    def __init__(self, cluster: str):
        self.cluster = cluster
        self.last_transport_error: str | None = None

    def __call__(self, error: KafkaError) -> None:
        code = error.code()
        if code == KafkaError._AUTHENTICATION:
            raise SourceAuthError(f"sourceCluster {self.cluster}: authentication failed: {error.str()}")
        if code == KafkaError._SSL:
            raise SourceAuthError(f"sourceCluster {self.cluster}: TLS handshake failed: {error.str()}")
        if code == KafkaError._TRANSPORT:
            alert = _ALERT.search(error.str())
            if alert is not None and int(alert.group(1)) in REFUSED_CERTIFICATE_ALERTS:
                raise SourceAuthError(
                    f"sourceCluster {self.cluster}: the broker refused the client certificate (tls.clientCertificate: "
                    f"signed by a CA the broker trusts? still valid?): {error.str()}"
                )
            self.last_transport_error = error.str()


# TLS alerts (RFC 8446 6.2) a server sends when it does not accept the client's certificate: bad_certificate,
# unsupported_certificate, certificate_revoked, certificate_expired, certificate_unknown, unknown_ca, access_denied,
# certificate_required. OpenSSL's text for a received one ends "SSL alert number N" (librdkafka quotes it).
REFUSED_CERTIFICATE_ALERTS = {42, 43, 44, 45, 46, 48, 49, 116}
_ALERT = re.compile(r"SSL alert number (\d+)")


def client_config(cluster: SourceCluster) -> dict:
    """librdkafka settings for a source cluster (credentials and TLS material resolved in memory, never logged).

    MSK IAM is OAUTHBEARER for librdkafka, with a token callback that signs with the process's AWS credentials
    (`msk_iam.MskIamToken`, picklable, so executors sign their own). `tls` gives the CA, client certificate and key
    as inline PEM (`ssl.*.pem`); an encrypted key's password as `ssl.key.password` (librdkafka reads PBES1 and PBES2)."""
    conf: dict[str, Any] = {
        "bootstrap.servers": cluster.bootstrap_servers,
        "security.protocol": cluster.security_protocol,
        "client.id": "icefloe",
        "error_cb": RefusedConnection(cluster.name),
    }
    if cluster.tls is not None:
        conf |= resolve_tls(cluster.tls, f"sourceCluster {cluster.name}")
        conf["ssl.endpoint.identification.algorithm"] = "https" if cluster.tls.endpoint_identification else "none"
    if cluster.sasl_mechanism == MSK_IAM:
        conf |= {"sasl.mechanism": "OAUTHBEARER", "oauth_cb": MskIamToken(cluster.msk_region)}  # type: ignore[arg-type]  # clusterArn is required for MSK IAM (SourceCluster)
    elif cluster.sasl_mechanism:
        user, password = resolve_credentials(cluster.credentials_secret, f"sourceCluster {cluster.name}")  # type: ignore[arg-type]  # SASL requires credentialsSecret (SourceCluster)
        conf |= {"sasl.mechanism": cluster.sasl_mechanism, "sasl.username": user, "sasl.password": password}
    return conf


def _client(kind: type, conf: dict) -> Any:
    """A librdkafka client; a setting it refuses (a PEM it cannot parse, a wrong key password) is a ConfigError naming
    the cluster. librdkafka's text names the setting, never its value."""
    try:
        return kind(conf)
    except KafkaException as error:
        callback = conf.get("error_cb")
        cluster = callback.cluster if isinstance(callback, RefusedConnection) else conf["bootstrap.servers"]
        raise ConfigError(
            f"sourceCluster {cluster}: the Kafka client refused its settings: {error.args[0].str()}"
        ) from None


def _consumer(conf: dict[str, str], **extra: str | int | bool) -> Consumer:
    return _client(
        Consumer,
        {
            **conf,
            # Offsets live in the Iceberg snapshot, not in Kafka: no group membership, no commits.
            "group.id": CONSUMER_GROUP,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            **extra,
        },
    )


@dataclass(frozen=True)
class OffsetRange:
    """Records [start, end) of one partition: one executor task."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def count(self) -> int:
        return self.end - self.start


DELETED = "deleted"  # deleted (retention, delete-records) before icefloe read them
TRUNCATED = "truncated"  # read into the table, then gone from the log, whose new records take their offsets


@dataclass(frozen=True)
class LostRange:
    """Offsets [start, end) of one partition lost to the table: DELETED before it read them, or TRUNCATED (it read
    them, the log no longer has them)."""

    partition: int
    start: int
    end: int
    kind: str = DELETED

    def describe(self, topic: str) -> str:
        return f"{topic}[{self.partition}] offsets {self.start}..{self.end - 1} ({self.end - self.start} records)"


@dataclass(frozen=True)
class Plan:
    """What one batch reads, and what the table records once it is committed."""

    ranges: list[OffsetRange]
    next_offsets: dict[int, int]  # every partition's next offset, including partitions with nothing to read
    lost: list[LostRange]
    topic_id: str | None
    leader_epochs: dict[int, int] = field(default_factory=dict)  # the leader epoch each listed end was read in
    # Where the broker reports no topic id: per partition, (offset, timestamp ms) of a record the table has read.
    known_records: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def truncated(self) -> list[LostRange]:
        return [r for r in self.lost if r.kind == TRUNCATED]


def _unreachable(conf: dict[str, str], error: KafkaException) -> SourceError:
    # The cached admin client's callback (made with an earlier, equal config) or this config's own (consumers).
    callbacks = [_ADMIN_CALLBACKS.get(_admin_key(conf)), conf.get("error_cb")]
    _forget_admin(conf)  # a client of an unreachable cluster would go on reconnecting (and logging) for ever
    seen = [c.last_transport_error for c in callbacks if isinstance(c, RefusedConnection) and c.last_transport_error]
    last = seen[0] if seen else None
    # librdkafka's last word on the connection says why (refused, reset, a TLS alert that is not a refusal).
    cause = f" (last connection error: {last})" if last else ""
    return SourceError(f"cannot reach Kafka at {conf['bootstrap.servers']}: {error.args[0].str()}{cause}")


def _metadata(conf: dict, topic: str) -> Any:
    """The topic's metadata. Asked in short steps, serving the error callback in between: an authentication or TLS
    failure fails at once (`RefusedConnection`) instead of after the whole timeout."""
    admin = _admin(conf)
    deadline = time.monotonic() + METADATA_TIMEOUT_S
    while True:
        try:
            return admin.list_topics(topic=topic, timeout=min(1.0, max(0.1, deadline - time.monotonic())))
        except KafkaException as error:
            try:
                admin.poll(0)  # serves error_cb
            except SourceAuthError:
                _forget_admin(conf)
                del admin  # a traceback keeps this frame: a client kept alive would reconnect (and log) for ever
                raise
            if time.monotonic() >= deadline:
                del admin
                raise _unreachable(conf, error) from None


# One long-lived AdminClient per cluster config in a process: planning runs every second in continuous mode with
# `commitRecords`, and each new client is a new connection and authentication (MSK IAM throttles new connections).
_ADMINS: dict[tuple, AdminClient] = {}
_ADMIN_CALLBACKS: dict[tuple, Any] = {}  # the error callback each cached client was made with
_ADMINS_LOCK = threading.Lock()


def _admin_key(conf: dict) -> tuple:
    return tuple(sorted((k, v if isinstance(v, (str, int, bool)) else type(v).__qualname__) for k, v in conf.items()))


def _admin(conf: dict) -> AdminClient:
    key = _admin_key(conf)
    with _ADMINS_LOCK:
        if key not in _ADMINS:
            _ADMINS[key] = _client(AdminClient, conf)
            _ADMIN_CALLBACKS[key] = conf.get("error_cb")
        return _ADMINS[key]


def _forget_admin(conf: dict) -> None:
    with _ADMINS_LOCK:
        _ADMINS.pop(_admin_key(conf), None)
        _ADMIN_CALLBACKS.pop(_admin_key(conf), None)


def close_admin_clients() -> None:
    """Let go of every cached client (librdkafka destroys a handle nobody holds): before its brokers go away on
    purpose (the demo's and the tests' local broker), so no client keeps reconnecting and logging refusals."""
    with _ADMINS_LOCK:
        _ADMINS.clear()
        _ADMIN_CALLBACKS.clear()


def list_partitions(conf: dict[str, str], topic: str) -> list[int]:
    metadata = _metadata(conf, topic)
    info = metadata.topics.get(topic)
    if info is None or info.error is not None:
        reason = info.error.str() if info is not None and info.error else "unknown topic"
        raise SourceError(f"topic {topic!r} on {conf['bootstrap.servers']}: {reason}")
    return sorted(info.partitions)


def topic_id(conf: dict[str, str], topic: str) -> str | None:
    """The broker's id for this incarnation of the topic (None if the broker does not report one)."""
    admin = _admin(conf)  # kept for the process: a collected client cancels its pending futures
    future = admin.describe_topics(TopicCollection([topic]), request_timeout=METADATA_TIMEOUT_S)[topic]
    try:
        found = future.result(METADATA_TIMEOUT_S).topic_id
    except KafkaException as error:
        raise SourceError(f"topic {topic!r} on {conf['bootstrap.servers']}: {error.args[0].str()}") from None
    text = str(found) if found is not None else ""
    return None if text in ("", "AAAAAAAAAAAAAAAAAAAAAA") else text


def log_bounds(conf: dict[str, str], topic: str, partitions: list[int]) -> dict[int, tuple[int, int, int | None]]:
    """(log start, last stable offset, leader epoch) per partition, as the broker lists them for a read_committed
    reader (the epoch is None where the broker reports none)."""
    admin = _admin(conf)

    def listed(spec: OffsetSpec) -> dict[int, tuple[int, int | None]]:
        request = {TopicPartition(topic, p): spec for p in partitions}
        futures = admin.list_offsets(
            request, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=METADATA_TIMEOUT_S
        )
        try:
            results = {tp.partition: future.result(PLAN_TIMEOUT_S) for tp, future in futures.items()}
        except KafkaException as error:
            raise _unreachable(conf, error) from None
        return {
            p: (r.offset, r.leader_epoch if r.leader_epoch is not None and r.leader_epoch >= 0 else None)
            for p, r in results.items()
        }

    starts, ends = listed(OffsetSpec.earliest()), listed(OffsetSpec.latest())
    return {p: (starts[p][0], *ends[p]) for p in partitions}


def _first_message_each(consumer: Consumer, topic: str, partitions: Iterable[int]) -> Iterator[Message]:
    """The first message (a record, a partition's end or an error) of each of the assigned `partitions`, as they
    answer within PLAN_TIMEOUT_S; a partition that answered is unassigned. Partitions that do not answer are left
    out."""
    pending, deadline = set(partitions), time.monotonic() + PLAN_TIMEOUT_S
    while pending and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None or msg.partition() not in pending:
            continue
        pending.discard(msg.partition())
        consumer.incremental_unassign([TopicPartition(topic, msg.partition())])  # type: ignore[arg-type]  # set on a consumed message
        yield msg


def truncated_below(conf: dict[str, str], topic: str, positions: dict[int, tuple[int, int]]) -> dict[int, int]:
    """Partitions whose log was truncated below the table's position (unclean leader election, a lost disk): for
    each partition's (next offset, leader epoch it was listed in), the broker checks that epoch's log still reaches
    the offset (KIP-320, OffsetForLeaderEpoch, asked by a consumer assigned with the epoch). Returns, per truncated
    partition, the offset the log now diverges at (where new records of the new leader start)."""
    if not positions:
        return {}
    consumer = _consumer(conf, **{"auto.offset.reset": "error"})
    found: dict[int, int] = {}
    try:
        consumer.assign(
            [TopicPartition(topic, p, offset, leader_epoch=epoch) for p, (offset, epoch) in positions.items()]
        )
        for msg in _first_message_each(consumer, topic, positions):
            error = msg.error()
            if error is not None and error.code() in (KafkaError._LOG_TRUNCATION, KafkaError._AUTO_OFFSET_RESET):
                # With auto.offset.reset=error librdkafka reports a detected truncation as _AUTO_OFFSET_RESET: "Partition
                # log truncation detected at offset 10 (leader epoch 0): broker end offset is 5 ...". Without that text
                # the position is below the log start: retention, which planning handles on its own.
                end = re.search(r"broker end offset is (\d+)", error.str())
                if "truncation" in error.str():
                    found[msg.partition()] = int(end.group(1)) if end else 0  # type: ignore[index]  # set on a consumed message
            elif error is not None and error.code() != KafkaError._PARTITION_EOF:
                raise SourceError(f"{topic}[{msg.partition()}] at offset {msg.offset()}: {error.str()}")
            # else a record or the end at the position: the log still reaches it
    except KafkaException as error:
        raise _unreachable(conf, error) from None
    finally:
        consumer.close()
    return found


def rewritten(conf: dict[str, str], topic: str, records: dict[int, tuple[int, int]]) -> set[int]:
    """Partitions whose log holds another record at the offset of a record the table read (`records`: per
    partition, its offset and timestamp): the log was replaced under the same leader epoch (a topic deleted and
    recreated, on a broker reporting no topic id). A record gone (retention, compaction) proves nothing."""
    found = first_records(conf, topic, {p: (offset, offset + 1) for p, (offset, _) in records.items()})
    return {p for p, (offset, stamp) in found.items() if offset == records[p][0] and stamp != records[p][1]}


def with_known_records(conf: dict[str, str], plan: Plan) -> Plan:
    """`plan` recording, per partition it reads, its first record (offset, timestamp): what `rewritten` looks up."""
    if not plan.ranges:
        return plan
    found = first_records(conf, plan.ranges[0].topic, {r.partition: (r.start, r.end) for r in plan.ranges})
    return replace(plan, known_records={**plan.known_records, **found})


def share_budget(pending: dict[int, int], budget: int | None) -> dict[int, int]:
    """How many records each partition may read under `budget`: an even share each, what a short partition leaves
    going to the others, so no partition starves behind a long one (`maxRecordsPerRun`)."""
    if budget is None:
        return dict(pending)
    granted: dict[int, int] = {}
    left = budget
    waiting = sorted(pending, key=lambda p: (pending[p], p))
    for index, partition in enumerate(waiting):
        share = left // (len(waiting) - index)
        granted[partition] = min(pending[partition], share)
        left -= granted[partition]
    # Integer division can leave a few records unassigned: hand them out one by one.
    for partition in sorted(pending):
        extra = min(left, pending[partition] - granted[partition])
        granted[partition] += extra
        left -= extra
    return granted


def plan_ranges(
    conf: dict[str, str],
    topic: str,
    committed: dict[int, int],
    starting: str,
    max_records: int | None,
    on_data_loss: str = "fail",
    known_topic_id: str | None = None,
    known_epochs: dict[int, int] | None = None,
    quiet: bool = False,
    known_records: dict[int, tuple[int, int]] | None = None,
) -> Plan:
    """Ranges to read now, and the next offset of every partition once they are committed.

    `committed` holds the next offset per partition from the table's snapshot. On the table's first run each
    partition starts at its log start, or at its current end when `starting` is "latest"; that position is recorded
    even when nothing is read, so records produced before the next run are not skipped. A partition added to the
    topic after the first run starts at offset 0: everything in it is new to the table.

    A partition whose log was truncated below `committed` (unclean leader election, a lost disk: the table holds
    records the partition no longer has, and new records take their offsets) is data loss for `on_data_loss`: `fail`
    refuses, `warn` reads on from where the log now diverges. It is seen when the log ends below the position, or,
    once new records have passed it, when the partition's leader epoch differs from `known_epochs` (recorded with the
    position) and the broker says that epoch's log no longer reaches the position. Where the topic id cannot vouch
    for the log (the broker or the table has none), a record the table read (`known_records`) found replaced at its
    offset is a truncation too, from the log's start (where the logs diverge is unknown). Truncated ranges are part
    of the plan's `lost` (kind TRUNCATED), recorded with the commit like the deleted ones.

    `quiet`: a plan only looked at (lag, the continuous loop's `commitRecords` poll) logs no warnings: the batch that
    commits the plan does.
    """
    partitions = list_partitions(conf, topic)
    current_id = topic_id(conf, topic)
    if known_topic_id and current_id and current_id != known_topic_id:
        raise SourceError(
            f"topic {topic!r} was deleted and recreated (topic id {current_id}, the table was written from "
            f"{known_topic_id}): its offsets start over, so the table's offsets no longer apply. Materialize the new "
            "topic into a new table (set `table:`), or drop the table to start it again"
        )
    bounds = log_bounds(conf, topic, partitions)
    first_run = not committed
    starts: dict[int, int] = {}
    lost: list[LostRange] = []
    recorded_epochs = known_epochs or {}
    # A new leader epoch (or a log ending below the position): ask the broker where the recorded epoch's log ends.
    moved = {
        p: (committed[p], recorded_epochs[p])
        for p in partitions
        if p in recorded_epochs
        and committed.get(p)
        and (bounds[p][2] not in (None, recorded_epochs[p]) or committed[p] > bounds[p][1])
    }
    diverged = truncated_below(conf, topic, moved)
    if not (known_topic_id and current_id):  # the same id vouches that this is the log the table read
        checked = {
            p: record
            for p, record in (known_records or {}).items()
            if p in bounds and bounds[p][0] <= record[0] < bounds[p][1]
        }
        for partition in rewritten(conf, topic, checked):
            diverged[partition] = min(diverged.get(partition, bounds[partition][0]), bounds[partition][0])
    truncated: list[LostRange] = []
    for partition in partitions:
        low, end, _ = bounds[partition]
        start = committed.get(partition)
        if start is None:
            start = end if first_run and starting == "latest" else (low if first_run else 0)
        now = min(end, diverged.get(partition, end))
        if now < start:
            # Records at [now, start) were read into the table and are gone from the log; new ones take their offsets.
            truncated.append(LostRange(partition, now, start, TRUNCATED))
            start = now
        if start < low:
            lost.append(LostRange(partition, start, low))
            start = low
        starts[partition] = start
    if truncated and on_data_loss == "fail":
        ranges_text = "; ".join(r.describe(topic) for r in truncated)
        same = "" if current_id else " (or the topic was deleted and recreated: the broker reports no topic id)"
        raise DataLossError(
            f"log truncation: {ranges_text} were read into the table but the partition's log no longer has them "
            f"(an unclean leader election or a lost disk{same}); new records take those offsets. Nothing was "
            "committed. Set `onDataLoss: warn` on the table to go on reading from where the log now diverges (the "
            "table keeps the rows it read there)"
        )
    for cut in [] if quiet else truncated:
        log.warning(
            "%s: log truncation: %s were read but the log no longer has them: reading on from offset %d",
            topic,
            cut.describe(topic),
            cut.start,
        )
    if lost and on_data_loss == "fail":
        ranges_text = "; ".join(r.describe(topic) for r in lost)
        raise DataLossError(
            f"data loss: {ranges_text} were deleted from the topic (retention or delete-records) before icefloe "
            "read them. Nothing was committed. Set `onDataLoss: warn` on the table to go on without them "
            "(the lost ranges are then recorded with the commit), or restore the records"
        )
    for gone in [] if quiet else lost:
        log.warning("%s: data loss: %s were deleted before icefloe read them", topic, gone.describe(topic))
    allowed = share_budget({p: bounds[p][1] - starts[p] for p in partitions}, max_records)
    ranges, next_offsets = [], {}
    epochs = {p: epoch for p in partitions if (epoch := bounds[p][2]) is not None}
    for partition in partitions:
        start = starts[partition]
        end = start + allowed[partition]
        next_offsets[partition] = end
        if end > start:
            ranges.append(OffsetRange(topic, partition, start, end))
    # Metadata propagates asynchronously: a broker may not list yet a partition the table has read. Its position is
    # carried, or the commit would forget it and the next run read it again from 0.
    unlisted = sorted(set(committed) - set(partitions))
    for partition in unlisted:
        next_offsets[partition] = committed[partition]
        if partition in recorded_epochs:
            epochs[partition] = recorded_epochs[partition]
    if unlisted and not quiet:
        log.warning("%s: partitions %s missing from the broker's metadata: their offsets are kept", topic, unlisted)
    replaced = {r.partition for r in truncated}  # a record the table read there is no longer the log's
    known = {p: r for p, r in (known_records or {}).items() if p not in replaced} if not current_id else {}
    return Plan(ranges, next_offsets, truncated + lost, current_id, epochs, known)


def read_range(conf: dict[str, str], task: OffsetRange, poll_batch: int = 5000) -> Iterator[Message]:
    """Every record of the range in offset order (gaps from compaction or transaction markers are skipped)."""
    consumer = _consumer(conf, **{"auto.offset.reset": "error"})
    try:
        consumer.assign([TopicPartition(task.topic, task.partition, task.start)])
        last_progress = time.monotonic()
        while True:
            messages = consumer.consume(num_messages=poll_batch, timeout=1.0)
            if messages:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > READ_STALL_TIMEOUT_S:
                raise SourceError(
                    f"{task.topic}[{task.partition}]: no records for {READ_STALL_TIMEOUT_S:.0f}s "
                    f"while reading offsets {task.start}..{task.end - 1}"
                )
            for msg in messages:
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        if msg.offset() >= task.end:  # type: ignore[operator]  # set on a consumed message
                            return
                        continue
                    raise SourceError(f"{task.topic}[{task.partition}] at offset {msg.offset()}: {error.str()}")
                if msg.offset() >= task.end:  # type: ignore[operator]  # set on a consumed message
                    return
                yield msg
                if msg.offset() >= task.end - 1:  # type: ignore[operator]  # set on a consumed message
                    return
    finally:
        consumer.close()


def first_record_timestamps(conf: dict[str, str], topic: str, ranges: dict[int, tuple[int, int]]) -> dict[int, float]:
    """The Kafka timestamp (epoch seconds) of the first readable record in [start, end) per partition: the oldest
    record a table has not read yet. Partitions with nothing readable in their range, or that do not answer within
    the planning timeout, are left out."""
    return {p: millis / 1000 for p, (_, millis) in first_records(conf, topic, ranges).items()}


def first_records(conf: dict[str, str], topic: str, ranges: dict[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """(offset, Kafka timestamp in ms) of the first readable record in [start, end) per partition. Partitions with
    nothing readable in their range, a record without timestamp, or no answer within the planning timeout are left
    out."""
    wanted = {p: bounds for p, bounds in ranges.items() if bounds[0] < bounds[1]}
    if not wanted:
        return {}
    consumer = _consumer(conf)  # read_committed: the first record a run would actually read
    found: dict[int, tuple[int, int]] = {}
    try:
        consumer.assign([TopicPartition(topic, p, start) for p, (start, _) in wanted.items()])
        for msg in _first_message_each(consumer, topic, wanted):
            error = msg.error()
            if error is not None and error.code() != KafkaError._PARTITION_EOF:
                raise SourceError(f"{topic}[{msg.partition()}] at offset {msg.offset()}: {error.str()}")
            if error is None and msg.offset() < wanted[msg.partition()][1]:  # type: ignore[index, operator]  # set on a consumed message
                _, millis = msg.timestamp()
                if millis >= 0:  # -1: the record carries no timestamp
                    found[msg.partition()] = (msg.offset(), millis)  # type: ignore[index, assignment]  # set on a consumed message
    except KafkaException as error:
        raise _unreachable(conf, error) from None
    finally:
        consumer.close()
    return found


def sample_record_bytes(
    conf: dict[str, str], topic: str, ranges: list[OffsetRange], per_partition: int = 20, timeout_s: float = 10.0
) -> float | None:
    """The mean size (key and value bytes) of up to `per_partition` records at the start of each range: what a
    batch's records weigh, to size it. None when none could be read in time (the caller then keeps its estimate)."""
    wanted = {r.partition: min(r.end, r.start + per_partition) for r in ranges if r.count}
    if not wanted:
        return None
    consumer = _consumer(conf, **{"fetch.max.bytes": 4 * 1024 * 1024, "max.partition.fetch.bytes": 256 * 1024})
    sizes: list[int] = []
    try:
        consumer.assign([TopicPartition(topic, r.partition, r.start) for r in ranges if r.partition in wanted])
        deadline = time.monotonic() + timeout_s
        while wanted and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.partition() not in wanted:
                continue
            if msg.error() is None and msg.offset() < wanted[msg.partition()]:  # type: ignore[index, operator]  # set on a consumed message
                sizes.append(len(msg.key() or b"") + len(msg.value() or b""))
            if msg.error() is not None or msg.offset() >= wanted[msg.partition()] - 1:  # type: ignore[index, operator]  # set on a consumed message
                del wanted[msg.partition()]  # type: ignore[arg-type]  # set on a consumed message
                consumer.incremental_unassign([TopicPartition(topic, msg.partition())])  # type: ignore[arg-type]  # set on a consumed message
    except KafkaException as error:  # a sample only: the batch's own read reports what is wrong
        log.debug("%s: record sizes not sampled: %s", topic, error)
    finally:
        consumer.close()
    return sum(sizes) / len(sizes) if sizes else None
