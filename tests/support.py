"""Test helpers: produce exact bytes to the broker, read tables back with pyiceberg and DuckDB."""

from __future__ import annotations

import datetime as dt
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from icefloe_dev.protos import compile_protos, message_class  # noqa: F401 (re-exported for tests)
from icefloe_dev.readers import duckdb_connect, pyiceberg_catalog

# Runs a test against the local JDBC catalog, Glue on the session's moto server and Iceberg's REST catalog server: the
# test takes `catalog` (its `icefloe:catalog` block, None locally); `spark`, `make_config`, `read_pyiceberg` and
# `read_duckdb` follow it (tests/conftest.py).
ANY_CATALOG = pytest.mark.parametrize(
    "catalog",
    ["local", pytest.param("glue", marks=pytest.mark.glue), pytest.param("rest", marks=pytest.mark.rest)],
    indirect=True,
)


def produce(bootstrap: str, topic: str, records: Iterable[dict[str, Any]]) -> list[tuple[int, int]]:
    """Produce records given as {key, value, headers, partition}; returns (partition, offset) of each, in order."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    positions: list[tuple[int, int] | None] = []

    def remember(index: int):
        def on_delivery(error, msg) -> None:
            assert error is None, error
            positions[index] = (msg.partition(), msg.offset())

        return on_delivery

    for index, record in enumerate(records):
        positions.append(None)
        extra = {name: record[name] for name in ("partition", "timestamp") if record.get(name) is not None}
        producer.produce(
            topic,
            key=record.get("key"),
            value=record.get("value"),
            headers=record.get("headers"),
            on_delivery=remember(index),
            **extra,
        )
        producer.poll(0)
    assert producer.flush(30) == 0
    return positions  # type: ignore[return-value]


def avro_serializer(registry_url: str, topic: str, schema: str):
    serializer = AvroSerializer(SchemaRegistryClient({"url": registry_url}), schema)
    context = SerializationContext(topic, MessageField.VALUE)
    return lambda value: serializer(value, context)


def load_pyiceberg(state_dir: Path, identifier: str):
    """The table through pyiceberg, from the test's catalog (the REST server's under `ANY_CATALOG`'s "rest")."""
    return pyiceberg_catalog(state_dir).load_table(identifier)


def read_pyiceberg(state_dir: Path, identifier: str) -> list[dict]:
    return load_pyiceberg(state_dir, identifier).scan().to_arrow().to_pylist()


def read_duckdb(metadata_location: str, columns: str = "*", con=None) -> list[dict]:
    """`con`: a DuckDB connection of your own (`readers.duckdb_over_s3_copy` for a table on a moto server)."""
    con = con or duckdb_connect()
    cursor = con.execute(f"SELECT {columns} FROM iceberg_scan('{metadata_location}')")
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


def by_position(rows: list[dict]) -> dict[tuple[int, int], dict]:
    """Rows keyed by (partition, offset); fails if any position appears twice."""
    keyed: dict[tuple[int, int], dict] = {}
    for row in rows:
        position = (row["kafka_partition"], row["kafka_offset"])
        assert position not in keyed, f"duplicate row for partition/offset {position}"
        keyed[position] = row
    return keyed


def as_utc(value: Any) -> Any:
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC)
    return value


def protobuf_serializer(registry_url: str, topic: str, message_type, key: bool = False, **conf):
    """confluent-kafka's own ProtobufSerializer for the topic's value (or key) subject (imports as references)."""
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

    serializer = ProtobufSerializer(message_type, SchemaRegistryClient({"url": registry_url}), conf)
    context = SerializationContext(topic, MessageField.KEY if key else MessageField.VALUE)
    return lambda value: serializer(value, context)


def json_schema_serializer(registry_url: str, topic: str, schema, key: bool = False, **conf):
    """confluent-kafka's own JSONSerializer for the topic's value (or key) subject (`schema`: text or a `Schema`)."""
    from confluent_kafka.schema_registry.json_schema import JSONSerializer

    serializer = JSONSerializer(schema, SchemaRegistryClient({"url": registry_url}), conf=conf)
    context = SerializationContext(topic, MessageField.KEY if key else MessageField.VALUE)
    return lambda value: serializer(value, context)


def crash_trials() -> int:
    """SIGKILL trials per crash test: one by default (a new random point on every run of the suite);
    ICEFLOE_CRASH_TRIALS=N runs N in a row, each on the table the previous one left."""
    return int(os.environ.get("ICEFLOE_CRASH_TRIALS", "1"))


# One seed for the whole suite, so the crash tests can split the phases between them (see `crash_point`).
_CRASH_SEED = int(os.environ.get("ICEFLOE_CRASH_SEED", time.time()))


def crash_seed() -> int:
    """The seed of the crash tests' random points: ICEFLOE_CRASH_SEED replays a failed run (its seed is in the failure)."""
    return _CRASH_SEED


# Where a crash test's SIGKILL lands: after a line the run logs as it enters a step (materializer.py, commit.py),
# at most some seconds later. "publish" is the window between the branch write and main's fast-forward, or right
# after the fast-forward (before the branch is dropped): a run killed there must leave main all or nothing.
CRASH_PHASES: dict[str, list[tuple[str, float]]] = {
    "read": [("records from", 1.0)],
    "write": [("writing the batch on branch", 2.0)],
    "publish": [("publishing branch", 0.3), ("published branch", 0.0)],
}


@dataclass(frozen=True)
class CrashPoint:
    phase: str
    marker: str
    delay: float


def crash_point(rng: random.Random, test: int, trial: int) -> CrashPoint:
    """Where trial `trial` of crash test number `test` kills its run. The phase cycles over tests and trials from the
    suite's seed, so the three crash tests (0, 1, 2; one trial each by default) kill in every phase on every run."""
    phase = list(CRASH_PHASES)[(crash_seed() + test + trial) % len(CRASH_PHASES)]
    marker, longest = rng.choice(CRASH_PHASES[phase])
    return CrashPoint(phase, marker, rng.uniform(0.0, longest))


class WatchedRun:
    """An `icefloe` subprocess whose log (stderr) is drained, so the run never blocks on it, and watched for markers.
    `popen` overrides Popen's arguments: e.g. `stdout=PIPE, stderr=STDOUT` watches both (spark-submit's Python driver
    logs to the JVM's stdout)."""

    def __init__(self, command: list[str], env: dict, **popen) -> None:
        options = {"stderr": subprocess.PIPE, "stdout": subprocess.DEVNULL} | popen
        self.process = subprocess.Popen(command, text=True, env=env, **options)
        self.lines: list[str] = []
        self.ended = False
        self.stopped = False  # SIGSTOPped by a test
        self._changed = threading.Condition()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.process.stderr or self.process.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self.ended = True
            self._changed.notify_all()

    def logged(self, marker: str, timeout: float) -> bool:
        """Wait until the run logs a line holding `marker`; False if it ended (or timed out) without one."""
        with self._changed:
            return self._changed.wait_for(lambda: self.seen(marker) or self.ended, timeout) and self.seen(marker)

    def seen(self, marker: str) -> bool:
        return any(marker in line for line in self.lines)

    def kill_at(self, point: CrashPoint, timeout: float = 300) -> int:
        """SIGKILL the run at `point`; 1 if it was killed, 0 if it had already ended."""
        self.logged(point.marker, timeout)
        time.sleep(point.delay)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            return 1
        print(
            f"the run ended (exit {self.process.returncode}) before {point}; its log ends:", *self.lines[-5:], sep="\n"
        )
        return 0


def stop_at(run: WatchedRun, marker: str) -> None:
    """SIGSTOP `run` as soon as it logs `marker` (its Python process: the JVM it drives waits for its next call)."""
    if run.logged(marker, 600):
        run.process.send_signal(signal.SIGSTOP)
        run.stopped = True


def race(stops: list[tuple[WatchedRun, str]], hold: Callable[[], None]) -> list[str]:
    """Runs each stopped as it logs its marker, `hold()` (the catalog's server then holds their commits and lets
    them through together), continued; returns their logs once all exited 0."""
    runs = [run for run, _ in stops]
    try:
        stoppers = [threading.Thread(target=stop_at, args=stop) for stop in stops]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            stopper.join(600)
        # A run that did not get there: the end of its log says why
        assert all(run.stopped for run in runs), [_log_end(run) for run in runs if not run.stopped]
        hold()
        for run in runs:
            run.process.send_signal(signal.SIGCONT)
        codes = [run.process.wait(timeout=600) for run in runs]
    finally:
        for run in runs:
            if run.process.poll() is None:
                run.process.send_signal(signal.SIGCONT)
                run.process.kill()
    assert codes == [0] * len(runs), [_log_end(run) for run, code in zip(runs, codes, strict=True) if code != 0]
    return ["".join(run.lines) for run in runs]


def _log_end(run: WatchedRun) -> str:
    """The last lines of a run's log, less a Java stack trace's frames: what says why it stopped."""
    return "".join([line for line in run.lines if not line.startswith("\tat ")][-40:])


def race_to_publish(commands: list[list[str]], env: dict, hold: Callable[[], None]) -> list[str]:
    """Two (or more) runs stopped as each logs "publishing branch", their commits held and let through together."""
    runs = [WatchedRun(command, env) for command in commands]

    def all_there() -> None:
        assert not any(run.seen("published branch") for run in runs), "a run published before the other got there"
        hold()

    return race([(run, "publishing branch") for run in runs], all_there)


def ancestry(table) -> set[int]:
    """The snapshot ids of a pyiceberg table's main history: its head and the head's ancestors."""
    ids, snapshot = set(), table.current_snapshot()
    while snapshot is not None:
        ids.add(snapshot.snapshot_id)
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None
    return ids
