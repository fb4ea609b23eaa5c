"""Inline-schema JSON on the JVM read path (`formats.json_jvm`): `from_json`, each record proven by its re-encoding
to decode as the Python decoder would, every other record decoded by Python. The Python path is the reference: for
every record, valid or not, the JVM path's row (value, Kafka columns, status and error) must be the Python path's."""

from __future__ import annotations

import datetime as dt
import json
import random

import pytest
from pyspark.sql.types import StructType

from icefloe.formats.inline import inline_value_fields
from icefloe.formats.json_jvm import codec_for, inline_schema_str
from icefloe.formats.registry import decoder_spec, format_of
from icefloe.materialize.read_paths import PYTHON, choose_read_path
from icefloe.spec import InlineSchema
from support import produce
from test_jvm_path import check_rows_on_both_paths, run_on_the_jvm_path

pytestmark = [pytest.mark.spark, pytest.mark.broker]

SCHEMA = {
    "fields": [
        {"name": "id", "type": "long", "optional": False},
        {"name": "name", "type": "string"},
        {"name": "count", "type": "int"},
        {"name": "price", "type": "double"},
        {"name": "active", "type": "boolean"},
        {"name": "at", "type": "timestamptz"},
        {"name": "local", "type": "timestamp"},
        {"name": "day", "type": "date"},
        {"name": "ref", "type": "uuid"},
        {"name": "clock", "type": "time"},
        {
            "name": "owner",
            "type": "struct",
            "fields": [
                {"name": "key", "type": "string", "optional": False},
                {"name": "since", "type": "timestamptz"},
            ],
        },
        {"name": "tags", "type": "list", "element": {"type": "string"}},
        {
            "name": "lines",
            "type": "list",
            "element": {
                "type": "struct",
                "fields": [
                    {"name": "qty", "type": "long"},
                    {"name": "seen", "type": "list", "element": {"type": "date"}},
                ],
            },
        },
    ]
}
TEXTS = ["plain", "é and ü", 'quote " and backslash \\\\', "line\nbreak\ttab", "emoji 🧊", "slash /", "", "\u2028"]


def when(rng: random.Random) -> dt.datetime:
    return dt.datetime(2000, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=rng.randrange(10**15))


def stamp(moment: dt.datetime, rng: random.Random, zone: bool = True) -> str:
    digits = rng.choice(["seconds", "milliseconds", "microseconds"])
    text = moment.replace(tzinfo=None).isoformat(timespec=digits)
    return text + rng.choice(["Z", "+00:00"]) if zone else text


def record(i: int, rng: random.Random) -> dict:
    """A valid record with every field (nulls included), in the schema's order: as a Jackson-based producer writes."""
    maybe = lambda value: value if rng.random() > 0.15 else None  # noqa: E731
    return {
        "id": i,
        "name": maybe(rng.choice(TEXTS)),
        "count": maybe(rng.randint(-(2**31), 2**31 - 1)),
        "price": maybe(round(rng.uniform(-1000, 1000), 2)),
        "active": maybe(rng.random() < 0.5),
        "at": maybe(stamp(when(rng), rng)),
        "local": maybe(stamp(when(rng), rng, zone=False)),
        "day": maybe(when(rng).date().isoformat()),
        "ref": maybe("0b5f4c8e-1d2a-4f3b-9c6d-7e8f9a0b1c2d"),
        "clock": maybe(rng.randrange(86_400_000_000)),
        "owner": maybe({"key": f"o{i}", "since": maybe(stamp(when(rng), rng))}),
        "tags": maybe([rng.choice(TEXTS), None][: rng.randint(0, 2)]),
        "lines": maybe([{"qty": maybe(rng.randint(0, 10**12)), "seen": maybe([when(rng).date().isoformat(), None])}]),
    }


def canonical(value: dict) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def written(value: dict, **changes) -> bytes:
    return canonical({**value, **changes})


def cases(rng: random.Random) -> tuple[list[bytes], list[bytes]]:
    """(records the JVM decodes: compact, ordered, complete; records for Python: valid ones written otherwise,
    and bad ones)."""
    exact = [canonical(record(i, rng)) for i in range(150)]
    exact += [json.dumps(record(i, rng), ensure_ascii=False).encode() for i in range(150, 180)]  # Python's spaces
    exact.append(b" \n\t" + canonical(record(180, rng)).replace(b",", b" ,\r\n") + b"\n")  # whitespace anywhere
    exact.append(written(record(900, rng), owner=None))  # a required field inside a null struct: not checked
    for i in range(181, 191):  # null fields left out, as Jackson's NON_NULL writes them
        nested = {"owner": {"key": "k"}, "lines": [{"qty": 1, "seen": ["2026-01-01", None]}]}  # list nulls stay
        exact.append(canonical({k: v for k, v in {**record(i, rng), **nested}.items() if v is not None}))
    base = record(1000, rng)
    for_python = [
        # valid, written otherwise
        json.dumps({**base, "name": "é"}).encode(),  # Python's defaults: spaces, and é escaped
        canonical(dict(reversed(list(base.items())))),  # another key order
        canonical({k: v for k, v in {**base, "count": None}.items() if k != "name"}),  # one null left out, one not
        written(base, name="é").replace("é".encode(), b"\\u00e9"),  # an escaped letter
        written(base, count=7.0),  # an int written as 7.0: Python takes it
        written(base, at=1_700_000_000_123),  # epoch milliseconds
        written(base, at="2026-01-01T10:00:00.123+02:00"),  # another offset
        written(base, at="2026-01-01T10:00:00.12345Z"),  # five fraction digits
        written(base, local="2026-01-01T10:00:00Z"),  # a zone on a timestamp without one: Python takes it
        written(base, price=5.0).replace(b'"price":5.0', b'"price":5E0'),  # an exponent
        canonical({**base, "extra": 1}),  # a field outside the schema: Python ignores it
        written(base, name="a/b").replace(b"a/b", b"a\\/b"),  # an escaped slash
        written(base, name="\x1f"),  # a control character: Python writes \\u001f, Jackson \\u001F
        # bad
        written(base, count="7"),
        written(base, name=7),
        written(base, price="NaN"),
        written(base, price=float("nan")),  # NaN, not JSON
        written(base, price=float("inf")),
        written(base, count=2**31),
        written(base, id=2**63),
        written(base, day="2026-02-30"),
        written(base, day="2026-01-01\n"),  # a final line break: Java's `$` matches before it, Python refuses it
        written(base, at="2026-01-01T10:00:00Z\n"),
        written(base, local="2026-01-01T10:00:00\n"),
        written(base, day="0000-01-01"),
        written(base, at="0000-01-01T00:00:00Z"),
        written(base, id=None),  # a required field null
        written(base, owner={"key": None, "since": None}),  # a required field null inside its struct
        canonical({k: v for k, v in base.items() if k != "id"}),  # a required field missing
        written(base, name="x").replace(b'"x"', b'"\\ud800"'),  # a lone surrogate
        written(base, name="x").replace(b'"x"', b'"\xff"'),  # not UTF-8
        written(base, name="x").replace(b'"x"', b'"a\tb"'),  # a raw control character
        b"\xef\xbb\xbf" + canonical(base),  # a byte order mark
        canonical(base) + b" x",  # trailing bytes
        canonical(base) + b"{}",
        canonical(base).replace(b'{"id":', b'{"id":1,"id":'),  # a duplicate key
        written(base, count=5).replace(b'"count":5', b'"count":05'),  # a leading zero
        canonical(base).replace(b'"name"', b"'name'"),  # single quotes
        written(base, price=1.0).replace(b'"price":1.0', b'"price":1e400'),  # beyond a double
        written(base, tags=[1]),  # a number in a list of strings
        written(base, lines=[{"qty": 1, "seen": ["2026-13-01"]}]),  # a month 13 in a list inside a list
        canonical([base]),  # not an object
        canonical(base)[:40],  # cut short
        b"",
    ]
    return exact, for_python


def test_every_json_row_of_the_jvm_path_is_the_python_paths_row(spark, broker, topic, make_config):
    broker.create_topic(topic, 2)
    exact, for_python = cases(random.Random(11))
    values = [*exact, *for_python, None]
    random.Random(12).shuffle(values)
    produce(
        broker.bootstrap_servers,
        topic,
        [{"key": b"k%d" % i, "value": v, "partition": i % 2} for i, v in enumerate(values)],
    )
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA, "errors": "skip"})
    table = config.tables[0]
    decoder = decoder_spec(table, config.cluster(table.source_cluster))
    json_format = format_of(decoder)
    fields = json_format.value_fields(decoder, table, "t")

    rules = json_format.rules(decoder, table)
    check_rows_on_both_paths(spark, config, fields, rules, records=len(values), failed=25, for_python=len(for_python))


@pytest.mark.parametrize(
    "field, reason",
    [
        ({"name": "x", "type": "float"}, "x (float)"),
        ({"name": "x", "type": "decimal(9,2)"}, "x (decimal(9,2))"),
        ({"name": "x", "type": "binary"}, "x (binary)"),
        ({"name": "x", "type": "map", "key": {"type": "string"}, "value": {"type": "long"}}, "x (map<string,bigint>)"),
        (
            {"name": "x", "type": "list", "element": {"type": "struct", "fields": [{"name": "y", "type": "fixed[4]"}]}},
            "x[].y (binary)",
        ),
    ],
)
def test_types_the_jvm_reads_otherwise_keep_the_table_on_python(field, reason):
    columns = inline_value_fields(InlineSchema.model_validate({"fields": [{"name": "id", "type": "long"}, field]}))
    found = codec_for(inline_schema_str(StructType(columns), frozenset()))
    assert isinstance(found, str) and found.endswith(f"does not read {reason}"), found


def test_the_read_path_is_reported_and_the_table_holds_what_python_would_give(
    spark, broker, state_dir, topic, make_config
):
    broker.create_topic(topic, 1)
    rng = random.Random(3)
    records = [record(i, rng) for i in range(40)]
    produce(
        broker.bootstrap_servers,
        topic,
        [{"value": canonical(r) if i % 10 else json.dumps(r).encode()} for i, r in enumerate(records)],
    )
    config = make_config({"topic": topic, "format": "json", "schema": SCHEMA})
    _, rows = run_on_the_jvm_path(spark, config, state_dir, len(records))
    for row, sent in zip(rows, records, strict=True):
        assert row["name"] == sent["name"] and row["price"] == sent["price"] and row["tags"] == sent["tags"]
        at = sent["at"] and dt.datetime.fromisoformat(sent["at"].replace("Z", "+00:00"))
        assert row["at"] == at
        assert row["day"] == (sent["day"] and dt.date.fromisoformat(sent["day"]))


def test_schemaless_json_is_not_read_before_its_columns_are_inferred(spark, topic, make_config):
    config = make_config({"topic": topic, "format": "json"})
    path = choose_read_path(spark, decoder_spec(config.tables[0], config.cluster("local")))
    assert path.name == PYTHON and "not inferred yet" in path.reason  # `for_batch` gives them (test_json_schemaless)
