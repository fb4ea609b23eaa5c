"""Protobuf on the JVM read path (`formats.protobuf.jvm`, jvm/src/icefloe/jvm/ProtobufRows.java): records framed for
the table's message type with the table's schema id decoded by icefloe's Java function, every record it is not
certain of decoded by Python. The Python path is the reference: for every record, valid or not, the JVM path's row
(value, Kafka columns, status and error) must be the Python path's."""

from __future__ import annotations

import random

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from pyspark.sql import functions as F

from icefloe.formats.base import CONFLUENT, GLUE, DecoderSpec
from icefloe.formats.protobuf.format import PROTOBUF
from icefloe.formats.protobuf.jvm import _indexes, codec_for
from icefloe.formats.protobuf.messages import parse_frame
from icefloe.formats.protobuf.schemas import message_at, serialize_file
from icefloe.formats.registry import decoder_spec
from support import compile_protos, message_class, produce, read_duckdb
from test_jvm_path import check_rows_on_both_paths, run_on_the_jvm_path

pytestmark = [pytest.mark.spark, pytest.mark.broker]

ORDER = """syntax = "proto3";
package {ns};
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/wrappers.proto";

enum Side {{ SIDE_UNSPECIFIED = 0; BUY = 1; SELL = 2; }}
message Other {{ string note = 1; }}
message Order {{
  message Line {{ string sku = 1; int64 qty = 2; Side side = 3; }}
  int64 id = 1;
  int32 i32 = 2; sint32 s32 = 3; sfixed32 sf32 = 4; uint32 u32 = 5; fixed32 f32 = 6;
  int64 i64 = 7; sint64 s64 = 8; sfixed64 sf64 = 9; uint64 u64 = 10; fixed64 f64 = 11;
  double d = 12; float f = 13; bool flag = 14; string name = 15; bytes raw = 16; Side side = 17;
  Line line = 18;
  repeated int32 nums = 19; repeated string tags = 20; repeated Line lines = 21; repeated Side sides = 22;
  repeated double ds = 23;
  map<string, int64> counts = 24; map<int32, Line> by_rank = 25; map<bool, Side> flags = 26;
  map<uint64, bytes> blobs = 27;
  oneof payment {{ string card = 28; Line cash = 29; }}
  google.protobuf.Timestamp at = 30; google.protobuf.Duration took = 31;
  google.protobuf.Int64Value w_i64 = 32; google.protobuf.StringValue w_str = 33;
  google.protobuf.UInt64Value w_u64 = 34; google.protobuf.BoolValue w_bool = 35;
  google.protobuf.DoubleValue w_d = 36; google.protobuf.FloatValue w_f = 37;
  google.protobuf.Int32Value w_i32 = 38; google.protobuf.UInt32Value w_u32 = 39;
  google.protobuf.BytesValue w_bytes = 40;
  optional int32 opt = 41; optional string opt_s = 42;
  repeated google.protobuf.Timestamp moments = 43;{extra}
}}
"""
TEXTS = ["plain", "é and ü", "emoji 🧊", "", "line\nbreak", "\u2028", "nul \x00 inside"]
ORDER_INDEXES = b"\x02\x02"  # message indexes [1]: Order is the file's second message
I32, I64, U32, U64 = (-(2**31), 2**31 - 1), (-(2**63), 2**63 - 1), (0, 2**32 - 1), (0, 2**64 - 1)


def compiled(tmp_path, ns: str):
    return message_class(compile_protos({f"{ns}/order.proto": ORDER.format(ns=ns, extra="")}, tmp_path), f"{ns}.Order")


def edge(rng: random.Random, low: int, high: int) -> int:
    return rng.choice([low, high, 0, -1 if low < 0 else 1, rng.randint(low, high)])


def order(Order, i: int, rng: random.Random):
    """A message with every kind of field, each set or left out at random (extremes among the values)."""
    o = Order(id=i)
    some = lambda: rng.random() < 0.6  # noqa: E731
    if some():
        o.i32, o.s32, o.sf32 = (edge(rng, *I32) for _ in range(3))
        o.u32, o.f32 = edge(rng, *U32), edge(rng, *U32)
        o.i64, o.s64, o.sf64 = (edge(rng, *I64) for _ in range(3))
        o.u64, o.f64 = edge(rng, *U64), edge(rng, *U64)
    if some():
        o.d = rng.choice([1.5, -0.0, float("inf"), -1e308, 5e-324, rng.uniform(-1e9, 1e9)])
        o.f = rng.choice([1.5, float("-inf"), 3.4e38, 1e-45, rng.uniform(-1e3, 1e3)])
        o.flag, o.name, o.raw = rng.random() < 0.5, rng.choice(TEXTS), bytes(rng.randrange(256) for _ in range(3))
        o.side = rng.choice([0, 1, 2])
    if some():
        o.line.sku, o.line.qty, o.line.side = rng.choice(TEXTS), edge(rng, *I64), rng.choice([0, 1, 2])
    if some():
        o.nums.extend(edge(rng, *I32) for _ in range(rng.randint(0, 3)))
        o.tags.extend(rng.choice(TEXTS) for _ in range(rng.randint(0, 3)))
        o.lines.add(sku=f"s{i}", qty=i)
        o.sides.extend(rng.choice([0, 1, 2]) for _ in range(rng.randint(0, 2)))
        o.ds.extend([rng.uniform(-1, 1), 2.0])
    if some():
        o.counts.update({rng.choice(TEXTS): edge(rng, *I64) for _ in range(rng.randint(0, 2))})
        o.by_rank[edge(rng, *I32)].sku = f"r{i}"
        o.flags.update({True: rng.choice([0, 1, 2])})
        o.blobs[edge(rng, *U64)] = b"\x00\xff"
    choice = rng.random()
    if choice < 0.3:
        o.card = rng.choice(TEXTS)
    elif choice < 0.6:
        o.cash.sku, o.cash.qty = f"c{i}", i
    if some():
        o.at.seconds = rng.choice([0, -1, rng.randrange(-(10**9), 10**9)])  # years 1 and 9999: see edge_bodies
        o.at.nanos = rng.choice([0, 999_999_999, rng.randrange(10**9)])
        o.took.seconds, o.took.nanos = rng.choice([(0, 0), (-5, -500_000), (10**9, 999_999_999), (3, 1_999)])
        o.moments.add(seconds=rng.randrange(10**9), nanos=rng.randrange(10**9))
    if some():
        o.w_i64.value, o.w_str.value, o.w_u64.value = edge(rng, *I64), rng.choice(TEXTS), edge(rng, *U64)
        o.w_bool.value, o.w_d.value, o.w_f.value = rng.random() < 0.5, rng.uniform(-1, 1), 0.25
        o.w_i32.value, o.w_u32.value, o.w_bytes.value = edge(rng, *I32), edge(rng, *U32), b"w"
    if some():
        o.opt = rng.choice([0, 7])
        o.opt_s = rng.choice(TEXTS)
    return o


def tag(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def varint(n: int) -> bytes:
    n &= 2**64 - 1
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes([*out, n])


def delimited(number: int, body: bytes) -> bytes:
    return tag(number, 2) + varint(len(body)) + body


def edge_bodies(Order) -> tuple[list[bytes], list[bytes]]:
    """Hand-built bodies: (ones the JVM must decode as Python does, ones it must leave to Python)."""
    s = lambda **fields: Order(id=9000, **fields).SerializeToString()  # noqa: E731
    Line = Order.Line
    exact = [
        b"",  # every field at its default
        s(card="first") + s(cash=Line(sku="second")),  # the oneof member set last wins
        s(cash=Line(sku="first")) + s(card="second"),
        s(name="first") + s(name="last"),  # a scalar sent twice: the last
        s(counts={"k": 1, "j": 2}) + s(counts={"k": 3}),  # a map key sent twice: the last value
        delimited(24, tag(2, 0) + varint(7)),  # a map entry without its key: the default key
        delimited(24, tag(1, 2) + b"\x01k"),  # ... without its value: the default value
        tag(19, 0) + varint(5) + tag(19, 0) + varint(-3) + delimited(19, varint(1) + varint(2**31 - 1)),  # unpacked
        tag(22, 0) + varint(1) + delimited(22, varint(9) + varint(-1)),  # open enum: unknown numbers as digits
        tag(14, 0) + varint(2),  # a bool of 2: true
        tag(17, 0) + varint(7) + tag(2, 0) + varint(2**40 + 5),  # an unknown enum number; an int32 cut to 32 bits
        tag(5, 0) + varint(2**33 + 1),  # a uint32 cut to 32 bits
        s(at={"seconds": 10, "nanos": -1500}),  # negative nanos: floor to microseconds
        s(took={"seconds": -1, "nanos": -500_000}),  # ...: toward zero for a duration
    ]
    for_python = [
        s(name="x") + tag(99, 0) + varint(5),  # a field the type does not declare
        s(line=Line(sku="a")) + s(line=Line(qty=2)),  # a message sent twice: merged
        s(w_str={"value": "a"}) + s(w_str={"value": "b"}),  # a wrapper sent twice: merged
        tag(2, 5) + b"\x01\x00\x00\x00",  # another wire type: an unknown field to Python
        tag(19, 1) + b"\x01" * 8,  # ... in a repeated field
        delimited(30, tag(1, 0) + varint(5) + tag(3, 0) + varint(1)),  # a Timestamp with an unknown field
        delimited(15, b"\xff\xfe"),  # a string that is not UTF-8
        delimited(24, delimited(1, b"\xc3")),  # ... as a map key
        delimited(25, tag(1, 0) + varint(3)),  # a map entry without its message value
        s(name="cut here")[:-2],  # truncated
        tag(7, 0) + b"\xff" * 10 + b"\x01",  # a varint of 11 bytes
        s(at={"seconds": 253402300800}),  # year 10000
        s(at={"seconds": -62135596801}),  # before year 1
        tag(50, 3) + tag(50, 4),  # an empty group (unknown)
        tag(0, 0) + varint(1),  # field number 0
    ]
    return exact, for_python


@pytest.fixture
def protobuf_topic(registry, topic, tmp_path):
    """(topic, the table's Order class, the older version's, a framer for each): both versions registered as text
    (as Java producers do; Apicurio 3.0.9 adds no version to a subject of serialized descriptors), the older first,
    so the table reads the latest."""
    ns = topic[-40:].strip("_")
    client, subject, extra = SchemaRegistryClient({"url": registry.url}), f"{topic}-value", "\n  string added = 44;"
    framers = []
    for version, text in enumerate((ORDER.format(ns=ns, extra=""), ORDER.format(ns=ns, extra=extra))):
        schema_id = client.register_schema(subject, Schema(text, "PROTOBUF"))
        Order = message_class(compile_protos({f"{ns}/order.proto": text}, tmp_path / f"v{version}"), f"{ns}.Order")
        frame = b"\x00" + schema_id.to_bytes(4, "big") + ORDER_INDEXES
        framers.append((Order, lambda message, frame=frame: frame + message.SerializeToString()))
    (Older, serialize_older), (Order, serialize) = framers
    return topic, Order, Older, serialize, serialize_older


def test_every_protobuf_row_of_the_jvm_path_is_the_python_paths_row(spark, broker, protobuf_topic, make_config):
    topic, Order, Older, serialize, serialize_older = protobuf_topic
    broker.create_topic(topic, 2)
    rng = random.Random(41)
    valid = [serialize(order(Order, i, rng)) for i in range(160)]
    frame = valid[0][:7]
    assert frame[5:] == ORDER_INDEXES, frame
    exact, for_python = edge_bodies(Order)
    framed_python = [frame + body for body in for_python]
    other_id = serialize_older(order(Older, 5000, rng))
    not_jvm = [
        other_id,  # the older schema id: Python decodes it with its writer schema
        frame[:5] + b"\x00" + valid[1][7:],  # message indexes [0]: an Other, which the table does not read
        frame[:5] + b"\x04\x02\x00" + valid[2][7:],  # indexes [1, 0]: the nested Line
        valid[3][7:],  # unframed
        b"\x00\x00",
    ]
    values = [*valid, *(frame + body for body in exact), *framed_python, *not_jvm, None]
    random.Random(42).shuffle(values)
    produce(
        broker.bootstrap_servers,
        topic,
        [{"key": b"k%d" % i, "value": v, "partition": i % 2} for i, v in enumerate(values)],
    )
    config = make_config({"topic": topic, "format": "protobuf", "messageType": "Order", "errors": "skip"})
    table = config.tables[0]
    decoder = decoder_spec(table, config.cluster(table.source_cluster))
    fields = PROTOBUF.value_fields(decoder, table, "t")
    check_rows_on_both_paths(
        spark,
        config,
        fields,
        PROTOBUF.rules(decoder, table),
        records=len(values),
        failed=11,
        for_python=len(framed_python) + len(not_jvm),
    )


def test_a_protobuf_table_reads_on_the_jvm_and_independent_readers_see_its_rows(
    spark, broker, protobuf_topic, make_config, state_dir
):
    topic, Order, _, serialize, _ = protobuf_topic
    broker.create_topic(topic, 2)
    rng = random.Random(43)
    orders = [order(Order, i, rng) for i in range(40)]
    produce(broker.bootstrap_servers, topic, [{"value": serialize(o)} for o in orders])
    config = make_config({"topic": topic, "format": "protobuf", "messageType": "Order"})
    result, rows = run_on_the_jvm_path(spark, config, state_dir, len(orders))
    for row, sent in zip(rows, orders, strict=True):
        assert (row["name"], row["u64"], list(row["tags"])) == (sent.name, sent.u64, list(sent.tags))
        assert row["payment"] == sent.WhichOneof("payment")
        assert row["at"] == (sent.at.ToDatetime(tzinfo=row["at"].tzinfo) if sent.HasField("at") else None)
    duckdb_rows = {r["id"]: r for r in read_duckdb(result.metadata_location, "id, side, opt, line")}
    for sent in orders:
        got = duckdb_rows[sent.id]
        assert got["side"] == _side_name(Order, sent.side)
        assert got["opt"] == (sent.opt if sent.HasField("opt") else None)
        line = sent.line
        expected = {"sku": line.sku, "qty": line.qty, "side": _side_name(Order, line.side)}
        assert got["line"] == (expected if sent.HasField("line") else None)


def _side_enum(Order):
    return Order.DESCRIPTOR.fields_by_name["side"].enum_type


def _side_name(Order, number: int) -> str:
    return _side_enum(Order).values_by_number[number].name


def test_the_message_index_path_of_a_nested_type_frames_as_confluents_serializer_does(tmp_path):
    Order = compiled(tmp_path, "indexes")
    file = Order.DESCRIPTOR.file
    for descriptor, expected in ((Order.DESCRIPTOR, [1]), (Order.Line.DESCRIPTOR, [1, 0])):
        indexes = _indexes(file, descriptor)
        _, parsed, _ = parse_frame(b"\x00\x00\x00\x00\x01" + indexes)
        assert parsed == expected and message_at(file, parsed).full_name == descriptor.full_name
    assert _indexes(file, file.message_types_by_name["Other"]) == b"\x00"


@pytest.mark.parametrize(
    ("declaration", "reason"),
    [
        ("google.protobuf.Struct attrs = 1;", "JSON text"),
        ("Status status = 1; enum Status { option allow_alias = true; A = 0; B = 1; C = 1; }", "aliases"),
    ],
)
def test_a_message_type_outside_the_decoder_keeps_the_table_on_python(spark, tmp_path, declaration, reason):
    text = f"""syntax = "proto3"; package covered; import "google/protobuf/struct.proto";
message M {{ int64 id = 2; {declaration} }}"""
    why = codec_for(spark, spec_of(compile_protos({"covered/m.proto": text}, tmp_path), "covered.M"))
    assert isinstance(why, str) and reason in why, why


def test_proto2_required_fields_and_groups_keep_the_table_on_python(spark, tmp_path):
    for declaration, reason in (
        ("required int64 id = 1;", "required"),
        ("optional group G = 1 { optional int32 x = 2; }", "group"),
    ):
        text = f'syntax = "proto2"; package p2; message M {{ {declaration} }}'
        pool = compile_protos({"p2/m.proto": text}, tmp_path / reason)
        why = codec_for(spark, spec_of(pool, "p2.M"))
        assert isinstance(why, str) and reason in why, why


def test_a_proto2_closed_enum_reads_on_the_jvm_and_glue_stays_on_python(spark, tmp_path):
    text = 'syntax = "proto2"; package p2c; enum E { A = 1; B = 2; } message M { optional E e = 1; }'
    spec = spec_of(compile_protos({"p2c/m.proto": text}, tmp_path), "p2c.M")
    codec = codec_for(spark, spec)
    assert not isinstance(codec, str), codec
    frame = b"\x00" + (7).to_bytes(4, "big") + b"\x00"
    rows = spark.createDataFrame(
        [(frame + tag(1, 0) + varint(2),), (frame + tag(1, 0) + varint(3),), (frame,)], "value binary"
    ).select(codec.decoded(F.col("value")).alias("v"))
    assert [r["v"] and r["v"].asDict() for r in rows.collect()] == [{"e": "B"}, None, {"e": None}]
    glue = DecoderSpec("protobuf", GLUE, "t", "{}", {}, message_type="p2c.M")
    assert "Glue" in codec_for(spark, glue)


def spec_of(pool, message_type: str) -> DecoderSpec:
    """A Confluent-registry spec (schema id 7) of `message_type`'s file, as `Protobuf.resolve` builds one."""
    schema = serialize_file(pool.FindMessageTypeByName(message_type).file)
    return DecoderSpec("protobuf", CONFLUENT, "t", schema, {}, message_type=message_type, schema_id=7)


def test_without_icefloes_jar_the_table_reads_on_python_and_says_why(spark, tmp_path, monkeypatch):
    import icefloe.formats.protobuf.jvm as protobuf_jvm

    text = 'syntax = "proto3"; package nojar; message M { int64 id = 1; }'
    spec = spec_of(compile_protos({"nojar/m.proto": text}, tmp_path), "nojar.M")
    assert not isinstance(codec_for(spark, spec), str)
    monkeypatch.setattr(protobuf_jvm, "JAVA_CLASS", "icefloe.jvm.NotBuilt")  # as if the jar were missing
    why = codec_for(spark, spec)
    assert isinstance(why, str) and "icefloe-jvm.jar is not on Spark's class path (run scripts/setup.sh)" in why, why
