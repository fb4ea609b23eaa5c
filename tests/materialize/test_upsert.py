"""Upsert tables: the newest value per key wins, tombstones delete, reruns and crashes change nothing."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import zlib

import pytest
import yaml

from icefloe.operate.runner import run_table
from support import ANY_CATALOG, WatchedRun, crash_point, crash_seed, crash_trials, produce, read_duckdb, read_pyiceberg

pytestmark = [pytest.mark.spark, pytest.mark.broker]
SCHEMA = {
    "fields": [
        {"name": "account", "type": "string"},
        {"name": "balance", "type": "long"},
        {"name": "seq", "type": "long"},
    ]
}


def changes(rng: random.Random, keys: int, count: int, start_seq: int = 0) -> list[dict]:
    """Random upserts and tombstones over `keys` keys; a key always goes to the same partition, like Kafka's."""
    out = []
    for seq in range(start_seq, start_seq + count):
        key = f"acct-{rng.randrange(keys)}"
        value = (
            None
            if rng.random() < 0.15
            else json.dumps({"account": key, "balance": rng.randrange(10**6), "seq": seq}).encode()
        )
        out.append({"key": key.encode(), "value": value, "partition": zlib.crc32(key.encode()) % 3})
    return out


def expected_state(records: list[dict]) -> dict[bytes, dict | None]:
    """What the topic implies: the last value per key (None after a tombstone)."""
    state: dict[bytes, dict | None] = {}
    for record in records:
        state[record["key"]] = None if record["value"] is None else json.loads(record["value"])
    return {k: v for k, v in state.items() if v is not None}


def table_state(rows: list[dict]) -> dict[bytes, dict]:
    keyed = {}
    for row in rows:
        assert row["kafka_key"] not in keyed, f"two rows for key {row['kafka_key']!r}"
        keyed[row["kafka_key"]] = {"account": row["account"], "balance": row["balance"], "seq": row["seq"]}
    return keyed


@ANY_CATALOG
def test_last_value_per_key_wins_and_tombstones_delete(catalog, spark, broker, state_dir, topic, make_config):
    broker.create_topic(topic, 3)
    rng = random.Random(11)
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA, "mode": "upsert"})
    sent: list[dict] = []
    for batch in range(3):  # several batches: later ones update and delete rows earlier ones wrote
        records = changes(rng, keys=40, count=150, start_seq=batch * 150)
        produce(broker.bootstrap_servers, topic, records)
        sent += records
        result = run_table(spark, config, config.tables[0], state_dir)
        assert result.status == "committed"
        assert table_state(read_pyiceberg(state_dir, result.identifier)) == expected_state(sent)
    assert table_state(read_duckdb(result.metadata_location)) == expected_state(sent)
    assert run_table(spark, config, config.tables[0], state_dir).status == "up-to-date"


def test_a_long_lived_session_compiles_a_batchs_generated_code_once(spark, broker, state_dir, topic, make_config):
    """A long-lived process (continuous mode, here two tables) runs the same queries every batch: once batches of
    each shape have run, the next compiles no generated class again (session.CODEGEN_CACHE). With Spark's default
    cache of 100 classes, two upsert tables' batches, about 90 classes each, evicted each other's and every batch
    compiled all of its own again (a change-data batch's 100 or more did it alone)."""
    topics = [topic, f"{topic}_b"]
    for name in topics:
        broker.create_topic(name, 3)
    config = make_config(*[{"topic": name, "format": "json", "schema": SCHEMA, "mode": "upsert"} for name in topics])
    compiled = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    rng, counts, sent = random.Random(5), [], {name: [] for name in topics}
    for batch in range(3):  # the first creates the tables (other queries), the second and third merge into them
        before = compiled.getCount()
        for table in config.tables:
            records = changes(rng, keys=40, count=150, start_seq=batch * 150)
            produce(broker.bootstrap_servers, table.topic, records)
            sent[table.topic] += records
            assert run_table(spark, config, table, state_dir).status == "committed"
        counts.append(compiled.getCount() - before)
    assert counts[1] > 0, counts  # what the merges compile the first time
    assert counts[2] == 0, counts
    for table in config.tables:
        rows = read_pyiceberg(state_dir, config.identifier(table))
        assert table_state(rows) == expected_state(sent[table.topic])


def test_key_fields_with_json_key_tombstones(spark, broker, state_dir, topic, make_config):
    """`key: [account]`: rows are matched on the value field; a tombstone's JSON key names the row to delete."""
    broker.create_topic(topic, 1)
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA, "mode": "upsert", "key": ["account"]})

    def upsert(account, balance, seq):
        return {
            "key": json.dumps({"account": account}).encode(),
            "value": json.dumps({"account": account, "balance": balance, "seq": seq}).encode(),
        }

    produce(
        broker.bootstrap_servers,
        topic,
        [
            upsert("a", 1, 0),
            upsert("b", 2, 1),
            upsert("a", 3, 2),
            {"key": json.dumps({"account": "b"}).encode(), "value": None},
        ],
    )
    result = run_table(spark, config, config.tables[0], state_dir)
    rows = read_pyiceberg(state_dir, result.identifier)
    assert [(r["account"], r["balance"]) for r in rows] == [("a", 3)]


def test_a_key_spanning_partitions_takes_the_newest_record_timestamp(spark, broker, state_dir, topic, make_config):
    """`key: [account]` records of one key in two partitions: Kafka orders them only by their timestamps."""
    broker.create_topic(topic, 2)
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA, "mode": "upsert", "key": ["account"]})
    now = int(time.time() * 1000)

    def upsert(balance, partition, timestamp):
        value = json.dumps({"account": "a", "balance": balance, "seq": balance}).encode()
        return {"key": b"a", "value": value, "partition": partition, "timestamp": timestamp}

    # The newer record sits in the lower partition: a tie-break by partition would keep the older one.
    produce(broker.bootstrap_servers, topic, [upsert(2, 0, now), upsert(1, 1, now - 10_000)])
    result = run_table(spark, config, config.tables[0], state_dir)
    assert [r["balance"] for r in read_pyiceberg(state_dir, result.identifier)] == [2]


def stack_file(path, bootstrap, table: dict):
    path.write_text(
        yaml.safe_dump(
            {
                "config": {
                    "icefloe:sourceClusters": [{"name": "local", "bootstrapServers": bootstrap}],
                    "icefloe:tables": [{"sourceCluster": "local", **table}],
                }
            }
        )
    )
    return path


def test_sigkill_at_random_points_then_rerun_gives_the_last_value_per_key(
    broker, spark, state_dir, topic, tmp_path, run_in_worker
):
    """SIGKILL trials (ICEFLOE_CRASH_TRIALS, one by default; a run that finished before its kill is tried again),
    each on the table the previous one left, then reruns to the end (each a process of its own, as after a crash,
    until one has committed up to the topic's end; then one more, a batch in the worker's Spark, finds nothing new).
    The topic holds one batch more than the trials, so some batch always resumes from a committed checkpoint."""
    broker.create_topic(topic, 3)
    trials, seed = crash_trials(), crash_seed()
    rng = random.Random(seed)
    batch = 15_000
    sent = changes(rng, keys=5000, count=batch * (trials + 1))
    produce(broker.bootstrap_servers, topic, sent)
    path = stack_file(
        tmp_path / "Pulumi.upsert.yaml",
        broker.bootstrap_servers,
        {"topic": topic, "format": "json", "schema": SCHEMA, "mode": "upsert", "maxRecordsPerRun": batch},
    )
    env = {**os.environ, "ICEFLOE_SPARK_MASTER": "local[2]"}
    command = [
        sys.executable,
        "-m",
        "icefloe.cli",
        "run",
        "--config",
        str(path),
        "--once",
        "--json",
        "--state-dir",
        str(state_dir),
    ]
    kills = 0
    for _ in range(trials + 1):
        if kills == trials:
            break
        run, point = WatchedRun(command, env), crash_point(rng, test=2, trial=kills)
        print(f"seed {seed}: killing at {point}")  # somewhere in reading, merging or publishing
        assert run.logged("records from", 120)
        kills += run.kill_at(point)
        run.process.wait(60)
    assert kills == trials, f"seed {seed}: {kills} of {trials} runs killed mid-way: the test did not test a crash"
    for _ in range(trials + 3):
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        if sum(json.loads(done.stdout.strip().splitlines()[-1]).get("offsets", {}).values()) == len(sent):
            break
    assert [r.status for r in run_in_worker(path, state_dir)] == ["up-to-date"]
    assert table_state(read_pyiceberg(state_dir, f"local.{topic}")) == expected_state(sent)


def avro_bytes(registry_url: str, topic: str, schema: str, value, field: str):
    """`value` in Confluent wire format, registered under `<topic>-<field>` (field: key or value)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    serializer = AvroSerializer(SchemaRegistryClient({"url": registry_url}), schema)
    return serializer(value, SerializationContext(topic, MessageField.KEY if field == "key" else MessageField.VALUE))


REQUIRED = {
    "fields": [{"name": "id", "type": "long", "optional": False}, {"name": "name", "type": "string", "optional": False}]
}
ACCOUNT = json.dumps(
    {
        "type": "record",
        "name": "Account",
        "fields": [{"name": "id", "type": "string"}, {"name": "name", "type": "string"}],
    }
)


@pytest.mark.parametrize(
    "case", ["json key, optional: false fields", "string key of a long field", "avro primitive key"]
)
def test_tombstones_of_key_field_tables_delete(spark, broker, registry, state_dir, topic, make_config, case):
    """A tombstone carries only the key: `optional: false` value fields must not refuse it, and a key given as a
    string or as a primitive Avro key names the row as well as a JSON object would."""
    broker.create_topic(topic, 1)
    if case == "avro primitive key":
        spec = {"topic": topic, "format": "avro", "mode": "upsert", "key": ["id"], "keyFormat": "avro"}

        def upsert(ident, name):
            return {
                "key": avro_bytes(registry.url, topic, '"string"', str(ident), "key"),
                "value": avro_bytes(registry.url, topic, ACCOUNT, {"id": str(ident), "name": name}, "value"),
            }

        tombstone = {"key": avro_bytes(registry.url, topic, '"string"', "2", "key"), "value": None}
    else:
        string_key = case == "string key of a long field"
        spec = {
            "topic": topic,
            "format": "json",
            "schema": REQUIRED,
            "mode": "upsert",
            "key": ["id"],
            **({"keyFormat": "string"} if string_key else {}),
        }

        def upsert(ident, name):
            key = str(ident).encode() if string_key else json.dumps({"id": ident}).encode()
            return {"key": key, "value": json.dumps({"id": ident, "name": name}).encode()}

        tombstone = {"key": b"2" if string_key else json.dumps({"id": 2}).encode(), "value": None}
    produce(broker.bootstrap_servers, topic, [upsert(1, "one"), upsert(2, "two"), tombstone, upsert(3, "three")])
    config = make_config(spec)
    result = run_table(spark, config, config.tables[0], state_dir)
    assert result.status == "committed" and result.records_failed == 0
    rows = read_pyiceberg(state_dir, result.identifier)
    assert sorted((str(r["id"]), r["name"]) for r in rows) == [("1", "one"), ("3", "three")]


def balances(state_dir, identifier: str) -> dict[str, int]:
    rows = read_pyiceberg(state_dir, identifier)
    assert len({r["account"] for r in rows}) == len(rows), f"two rows for one key in {identifier}"
    return {r["account"]: r["balance"] for r in rows}


def account_change(account: str, balance: int | None, partition: int, timestamp: int, json_key: bool = False) -> dict:
    """A change of `account` (None: a tombstone) at an explicit Kafka timestamp."""
    value = None if balance is None else json.dumps({"account": account, "balance": balance, "seq": balance}).encode()
    key = json.dumps({"account": account}).encode() if json_key else account.encode()
    return {"key": key, "value": value, "partition": partition, "timestamp": timestamp}


def run_until_up_to_date(spark, config, table, state_dir, runs: int = 40):
    for _ in range(runs):
        result = run_table(spark, config, table, state_dir)
        if result.status == "up-to-date":
            return result
    raise AssertionError(f"{table.topic}: not up to date after {runs} runs")


def test_one_partition_applies_its_records_in_offset_order_whatever_their_timestamps(
    spark, broker, state_dir, topic, make_config
):
    """Review F2 scenario A: the second producer's clock is 5 s behind; Kafka (and compaction) say the later offset wins."""
    broker.create_topic(topic, 1)
    now = int(time.time() * 1000)
    produce(broker.bootstrap_servers, topic, [account_change("a", 1, 0, now), account_change("a", 2, 0, now - 5000)])
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA, "mode": "upsert"})
    result = run_table(spark, config, config.tables[0], state_dir)
    assert balances(state_dir, result.identifier) == {"a": 2}


def test_batch_boundaries_do_not_change_the_table(spark, broker, state_dir, topic, make_config):
    """Review F2 scenario B: the same two records in one batch and in two batches (maxRecordsPerRun: 1)."""
    broker.create_topic(topic, 1)
    now = int(time.time() * 1000)
    produce(broker.bootstrap_servers, topic, [account_change("a", 1, 0, now), account_change("a", 2, 0, now - 5000)])
    spec = {"topic": topic, "format": "json", "schema": SCHEMA, "mode": "upsert"}
    config = make_config(
        {**spec, "table": f"{topic}_one_batch"},
        {**spec, "table": f"{topic}_one_record_per_batch", "maxRecordsPerRun": 1},
    )
    whole = run_table(spark, config, config.tables[0], state_dir)
    split = run_until_up_to_date(spark, config, config.tables[1], state_dir)
    assert balances(state_dir, whole.identifier) == balances(state_dir, split.identifier)


def test_an_older_change_read_later_from_a_lagging_partition_neither_overwrites_nor_resurrects(
    spark, broker, state_dir, topic, make_config
):
    """`key: [account]` spans partitions. Partition 1 is read first: `a` = 2 at T, `b` deleted at T. Partition 0's
    older changes (T - 10 s) arrive in a later batch: they must not overwrite `a` nor bring `b` back. A second table
    reading everything in one batch ends the same."""
    broker.create_topic(topic, 2)
    now = int(time.time() * 1000)
    spec = {"topic": topic, "format": "json", "schema": SCHEMA, "mode": "upsert", "key": ["account"]}
    config = make_config({**spec, "table": f"{topic}_in_batches"}, {**spec, "table": f"{topic}_in_one_batch"})
    produce(
        broker.bootstrap_servers,
        topic,
        [
            account_change("a", 2, 1, now, json_key=True),
            account_change("b", 5, 1, now - 30_000, json_key=True),
            account_change("b", None, 1, now, json_key=True),
        ],
    )
    first = run_table(spark, config, config.tables[0], state_dir)
    assert balances(state_dir, first.identifier) == {"a": 2}
    produce(
        broker.bootstrap_servers,
        topic,
        [
            account_change("a", 1, 0, now - 10_000, json_key=True),
            account_change("b", 4, 0, now - 10_000, json_key=True),
        ],
    )
    second = run_table(spark, config, config.tables[0], state_dir)
    assert second.status == "committed"
    assert balances(state_dir, first.identifier) == {"a": 2}
    whole = run_table(spark, config, config.tables[1], state_dir)
    assert balances(state_dir, whole.identifier) == {"a": 2}


def positions_model(sent: list[dict], positions: list[tuple[int, int]]) -> dict[str, int]:
    """What the upsert rule implies: each partition's clock is the running max of its timestamps; the change with
    the greatest (clock, partition, offset) per key wins."""
    clock: dict[int, int] = {}
    ranked = []
    for record, (partition, offset) in sorted(zip(sent, positions), key=lambda item: item[1]):
        clock[partition] = max(clock.get(partition, record["timestamp"]), record["timestamp"])
        ranked.append(((clock[partition], partition, offset), record))
    state: dict[str, int | None] = {}
    for _, record in sorted(ranked, key=lambda item: item[0]):
        account = json.loads(record["key"])["account"]
        state[account] = None if record["value"] is None else json.loads(record["value"])["balance"]
    return {k: v for k, v in state.items() if v is not None}


def test_the_same_records_in_one_batch_or_many_give_the_same_table(spark, broker, state_dir, topic, make_config):
    """Keys spanning three partitions, timestamps that go back inside partitions and differ across them, tombstones;
    read in one batch, and in batches of 7 records (the budget is shared by partitions, so they advance unevenly)."""
    broker.create_topic(topic, 3)
    rng = random.Random(5)
    now = int(time.time() * 1000)
    sent = [
        account_change(
            f"k{rng.randrange(6)}",
            None if rng.random() < 0.2 else n,
            rng.randrange(3),
            now + rng.randrange(-20_000, 20_000),
            json_key=True,
        )
        for n in range(60)
    ]
    positions = produce(broker.bootstrap_servers, topic, sent)
    spec = {"topic": topic, "format": "json", "schema": SCHEMA, "mode": "upsert", "key": ["account"]}
    config = make_config(
        {**spec, "table": f"{topic}_one_batch"}, {**spec, "table": f"{topic}_batches_of_7", "maxRecordsPerRun": 7}
    )
    whole = run_table(spark, config, config.tables[0], state_dir)
    split = run_until_up_to_date(spark, config, config.tables[1], state_dir)
    expected = positions_model(sent, positions)
    assert balances(state_dir, whole.identifier) == expected
    assert balances(state_dir, split.identifier) == expected


def test_maintenance_expires_delete_markers_older_than_their_retention(spark, broker, state_dir, topic, make_config):
    """Deletes keep markers in `<table>_deletes`; maintenance drops those whose clock is older than
    `deleteMarkerRetention` and keeps the rest."""
    from icefloe.operate.maintenance import maintain
    from icefloe.table.iceberg import IcebergTable

    broker.create_topic(topic, 1)
    now = int(time.time() * 1000)
    three_days_ago = now - 3 * 86_400_000
    produce(
        broker.bootstrap_servers,
        topic,
        [
            account_change("old", 1, 0, three_days_ago, json_key=True),
            account_change("old", None, 0, three_days_ago, json_key=True),
            account_change("new", 2, 0, now, json_key=True),
            account_change("new", None, 0, now, json_key=True),
        ],
    )
    config = make_config(
        {
            "topic": topic,
            "format": "json",
            "schema": SCHEMA,
            "mode": "upsert",
            "key": ["account"],
            "deleteMarkerRetention": "1d",
            "maintenance": {"enabled": False},
        }
    )
    result = run_table(spark, config, config.tables[0], state_dir)
    assert balances(state_dir, result.identifier) == {}
    markers = f"{result.identifier}_deletes"
    assert sorted(r["account"] for r in read_pyiceberg(state_dir, markers)) == ["new", "old"]
    maintained = maintain(IcebergTable(spark, result.identifier), config.tables[0])
    assert sorted(r["account"] for r in read_pyiceberg(state_dir, markers)) == ["new"]
    assert maintained.delete_markers is not None and maintained.delete_markers.rows_expired_by_ttl == 1


def test_deletes_are_one_deletion_vector_per_data_file_and_every_reader_reads_them(
    spark, broker, state_dir, topic, make_config
):
    """Issue 30: with `formatVersion: 3`, an upsert table's (and its markers') deletes are deletion vectors, at most one per data file
    whatever the number of batches (v2's position-delete files piled up, one set per batch, until compaction); Spark,
    pyiceberg and DuckDB read the table as the topic implies."""
    broker.create_topic(topic, 3)
    rng = random.Random(30)
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA, "mode": "upsert", "formatVersion": 3})
    sent: list[dict] = []
    for batch in range(4):
        records = changes(rng, keys=40, count=150, start_seq=batch * 150)
        produce(broker.bootstrap_servers, topic, records)
        sent += records
        result = run_table(spark, config, config.tables[0], state_dir)
    for table in (result.identifier, f"{result.identifier}_deletes"):
        name = f"icefloe.{table}"
        assert spark.sql(f"SHOW TBLPROPERTIES {name} ('format-version')").first().value == "3", table
        deletes = spark.sql(f"SELECT file_format, referenced_data_file FROM {name}.delete_files").collect()
        assert deletes and {r.file_format for r in deletes} == {"PUFFIN"}, (table, deletes)
        assert len({r.referenced_data_file for r in deletes}) == len(deletes), (
            f"{table}: two deletion vectors for one file"
        )
    expected = expected_state(sent)
    assert table_state(read_pyiceberg(state_dir, result.identifier)) == expected
    assert table_state(read_duckdb(result.metadata_location)) == expected
    spark_rows = [
        {**r.asDict(), "kafka_key": bytes(r.kafka_key)} for r in spark.table(f"icefloe.{result.identifier}").collect()
    ]
    assert table_state(spark_rows) == expected


def catalog_version(metadata_location: str) -> int:
    """The catalog's version of a table: a metadata file `<version>-<uuid>.metadata.json` per commit."""
    return int(metadata_location.rsplit("/", 1)[-1].split("-", 1)[0])


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned-threads", "unpinned-threads"])
def test_a_batch_publishes_its_merge_with_the_offsets_and_merges_its_markers_in_one_commit(
    spark, broker, state_dir, topic, make_config, monkeypatch, pinned
):
    """Issue 30: the merge's own snapshot carries the batch's offsets (no empty append after it), and the delete
    markers are one MERGE on their main carrying their checkpoint (no branch of their own). A batch commits 4 times
    to the table (the run's branch, the merge, the fast-forward, the branch dropped) and once to its markers, where it
    committed 5 and 5 times. Where a SQL write cannot carry them (a gateway that does not pin Python threads to JVM
    threads), an empty append after each merge carries them: 5 and 2 commits."""
    from icefloe.commit.checkpoint import OFFSETS_KEY, RUN_ID_KEY
    from icefloe.materialize.batch import materialize_once
    from icefloe.table import iceberg as iceberg_module
    from icefloe.table.iceberg import IcebergTable

    if not pinned:
        monkeypatch.setattr(iceberg_module, "_commit_properties", lambda spark: None)

    broker.create_topic(topic, 3)
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA, "mode": "upsert"})
    table_spec = config.tables[0]
    rng = random.Random(41)
    sent = changes(rng, keys=20, count=60)
    produce(broker.bootstrap_servers, topic, sent)
    first = materialize_once(spark, config, table_spec)  # creates the table and its markers
    table, markers = IcebergTable(spark, first.identifier), IcebergTable(spark, f"{first.identifier}_deletes")
    before = catalog_version(table.metadata_location()), catalog_version(markers.metadata_location())

    later = changes(rng, keys=20, count=60, start_seq=60)
    produce(broker.bootstrap_servers, topic, later)
    second = materialize_once(spark, config, table_spec)
    after = catalog_version(table.metadata_location()), catalog_version(markers.metadata_location())
    assert (after[0] - before[0], after[1] - before[1]) == ((4, 1) if pinned else (5, 2)), (before, after)

    for written, kind in ((table, "the table"), (markers, "the markers")):
        head = written.java().currentSnapshot()
        summary = dict(head.summary())
        merged = int(summary.get("added-records") or 0) > 0
        assert merged == pinned, f"{kind}: its head is {'not ' if pinned else ''}its merge: {summary}"
        assert summary[RUN_ID_KEY] == second.run_id, (kind, summary)
        assert json.loads(summary[OFFSETS_KEY]) == {str(p): o for p, o in second.offsets.items()}, (kind, summary)
    assert table_state(read_pyiceberg(state_dir, second.identifier)) == expected_state(sent + later)
    assert materialize_once(spark, config, table_spec).status == "up-to-date"


def test_a_plain_upsert_table_never_looks_for_a_truncate_marker(
    spark, broker, state_dir, topic, make_config, monkeypatch
):
    """Only change data truncates (a marker of null keys in `<table>_deletes`). A plain upsert table's records always
    have a key (a record without one is bad: `python_tasks._value`), so its markers never hold a truncate's: its
    markers say so (`TRUNCATES_PROPERTY`), and its batches run no query for the latest truncate (a Spark job per
    batch, where it found none)."""
    from icefloe.materialize import upsert
    from icefloe.table.iceberg import IcebergTable

    looked_up = []
    latest_position = upsert._latest_position

    def spied(frame, sourced, *extra):
        looked_up.append(frame)
        return latest_position(frame, sourced, *extra)

    monkeypatch.setattr(upsert, "_latest_position", spied)
    broker.create_topic(topic, 3)
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA, "mode": "upsert"})
    rng, sent = random.Random(43), []
    for batch in range(2):  # the second batch meets the markers the first one created
        records = changes(rng, keys=20, count=60, start_seq=batch * 60)
        produce(broker.bootstrap_servers, topic, records)
        sent += records
        result = run_table(spark, config, config.tables[0], state_dir)
        assert result.status == "committed"
    assert looked_up == [], "a plain upsert batch looked for a truncate's marker"
    markers = IcebergTable(spark, upsert.delete_markers_identifier(result.identifier))
    assert markers.table_property(upsert.TRUNCATES_PROPERTY) == "none"
    assert table_state(read_pyiceberg(state_dir, result.identifier)) == expected_state(sent)


def test_two_runs_merging_their_delete_markers_at_once_never_both_commit(spark, tmp_path):
    """The markers are merged straight on their main: run A's merge reads the markers, run B's merge commits new
    markers of the same keys, then A commits. Iceberg's validation refuses A's commit (`CommitConflict`: nothing
    committed, A's batch re-plans), where committing it beside B's would give a key two markers, on which every later
    merge of the table fails. A's rerun then moves each marker forward to the later position of the two."""
    import threading
    from pathlib import Path

    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from icefloe.batch_columns import TOMBSTONE
    from icefloe.commit.branch import Branch
    from icefloe.commit.checkpoint import Checkpoint
    from icefloe.errors import CommitConflict
    from icefloe.formats.columns import table_struct
    from icefloe.materialize.upsert import _commit_delete_markers
    from icefloe.table.iceberg import IcebergTable
    from icefloe.table.refs import branch_name, new_run_id

    struct = table_struct([T.StructField("n", T.LongType())], True)
    table = IcebergTable(spark, "local.two_marker_merges")
    table.ensure(struct, (), 128, Checkpoint("markers").to_summary())
    started, release = tmp_path / "started", tmp_path / "release"

    def deletes(offsets: dict[bytes, int], block: bool = False):
        frame = spark.createDataFrame(
            [(key, 0, offset, True) for key, offset in offsets.items()],
            f"kafka_key binary, kafka_partition int, kafka_offset long, {TOMBSTONE} boolean",
        ).coalesce(1)
        if block:  # A's merge has read the markers and waits in its job until B committed

            @F.udf(T.LongType())
            def wait_for_b(offset):
                Path(started).touch()
                for _ in range(1200):
                    if Path(release).exists():
                        break
                    time.sleep(0.1)
                return offset

            frame = frame.withColumn("kafka_offset", wait_for_b("kafka_offset"))
        return frame.withColumn("kafka_clock", F.timestamp_millis(F.lit(1_000)))

    def commit(offsets: dict[bytes, int], block: bool = False) -> None:
        checkpoint = Checkpoint("markers", {0: max(offsets.values()) + 1}, new_run_id())
        branch = Branch(table, branch_name(checkpoint.run_id), checkpoint)
        _commit_delete_markers(deletes(offsets, block), branch, struct, ["kafka_key"], 3600.0)

    commit({b"base": 1})  # the markers table exists before the two runs
    run_a = {b"k1": 10, b"k2": 30}
    failures: list[BaseException] = []

    def run_a_commits() -> None:
        try:
            commit(run_a, block=True)
        except BaseException as error:
            failures.append(error)

    thread = threading.Thread(target=run_a_commits)
    thread.start()
    try:
        for _ in range(1200):
            if started.exists() or not thread.is_alive():
                break
            time.sleep(0.1)
        assert started.exists(), failures
        commit({b"k1": 20, b"k3": 5})  # run B
    finally:
        release.touch()
        thread.join(300)
    assert len(failures) == 1 and isinstance(failures[0], CommitConflict), failures

    def recorded() -> list[tuple[bytes, int]]:
        rows = spark.table("icefloe.local.two_marker_merges_deletes").collect()
        return sorted((bytes(r.kafka_key), r.kafka_offset) for r in rows)

    assert recorded() == [(b"base", 1), (b"k1", 20), (b"k3", 5)], "B's markers only"
    commit(run_a)  # A's batch again, re-planned
    assert recorded() == [(b"base", 1), (b"k1", 20), (b"k2", 30), (b"k3", 5)]


def sql_executions(spark) -> list:
    """The SQL queries the session ran that its status store still keeps (without the UI too; the last
    `spark.sql.ui.retainedExecutions`)."""
    executions = spark._jsparkSession.sharedState().statusStore().executionsList()
    return [executions.apply(index) for index in range(executions.size())]


def merge_plans(spark, after: int) -> dict[str, str]:
    """The physical plans of the row-level writes (`WriteDelta`: MERGE, UPDATE, DELETE) the session ran after its
    query `after` (an execution id), by the table each wrote: its first scan."""
    plans = {}
    for execution in sql_executions(spark):
        plan = execution.physicalPlanDescription()
        scans = [line.split()[-2] for line in plan.splitlines() if line.lstrip("+- :").startswith("BatchScan ")]
        if execution.executionId() > after and "WriteDelta" in plan and scans:
            plans[scans[0]] = plan
    return plans


def test_a_merge_joins_only_the_rows_whose_key_the_batch_may_hold(spark, broker, state_dir, topic, make_config):
    """Issue 30: the table's side of the MERGE is filtered by a Bloom filter of the batch's keys (Spark's runtime
    filter) before it is shuffled: a batch that changes a few keys of a large table joins about those rows, not every
    row of the table with its file path. Here with the delete markers joined into the batch's side, as every batch
    after the first delete has them. So is the markers' side of their own MERGE (they grow with the deletes of their
    retention). The table ends as the records say."""
    from icefloe.materialize.upsert import delete_markers_identifier

    broker.create_topic(topic, 3)
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA, "mode": "upsert"})
    rng = random.Random(47)
    sent = changes(rng, keys=2_000, count=3_000)  # a table of ~1,700 keys, and markers of its deletes
    produce(broker.bootstrap_servers, topic, sent)
    first = run_table(spark, config, config.tables[0], state_dir)
    assert first.status == "committed"
    later = changes(rng, keys=20, count=40, start_seq=3_000)  # 20 of its keys change
    produce(broker.bootstrap_servers, topic, later)
    before = max((execution.executionId() for execution in sql_executions(spark)), default=-1)
    second = run_table(spark, config, config.tables[0], state_dir)
    assert second.status == "committed"
    plans = merge_plans(spark, before)
    table = next(name for name in plans if name.endswith(second.identifier))
    markers = next(name for name in plans if name.endswith(delete_markers_identifier(second.identifier)))
    assert "might_contain" in plans[table], f"the table's MERGE scans and shuffles every row:\n{plans[table]}"
    assert "might_contain" in plans[markers], f"the markers' MERGE scans and shuffles every row:\n{plans[markers]}"
    assert table_state(read_pyiceberg(state_dir, second.identifier)) == expected_state(sent + later)
