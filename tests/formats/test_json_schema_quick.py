"""The quick acceptance check of JSON Schema validation, against jsonschema itself: it may accept only what
jsonschema accepts (the rest is left to jsonschema, which words the error), and it accepts the common valid records."""

from __future__ import annotations

import itertools
import random

import pytest

from icefloe.formats.json_schema import record_validator, validator_for_bundle
from icefloe.formats.json_schema_quick import quick_check

TRADE = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "StockTrade",
    "type": "object",
    "properties": {
        "side": {"enum": ["BUY", "SELL"]},
        "quantity": {"type": "integer"},
        "price": {"type": "number"},
        "symbol": {"type": "string", "connect.type": "annotation jsonschema ignores"},
        "event_time": {"type": "string", "format": "date-time"},
        "id": {"type": "string", "format": "uuid"},
        "flag": {"type": ["boolean", "null"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "meta": {"type": "object", "additionalProperties": {"type": "integer"}},
        "inner": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    },
    "required": ["side", "quantity", "event_time"],
    "additionalProperties": False,
}
OPEN = {**TRADE, "$schema": "https://json-schema.org/draft/2020-12/schema", "additionalProperties": True}
DRAFT4 = {**TRADE, "$schema": "http://json-schema.org/draft-04/schema#"}
VALID = {
    "side": "BUY",
    "quantity": 3,
    "price": 1.5,
    "symbol": "ACME",
    "event_time": "2026-01-01T00:00:00.123Z",
    "id": "8c4a2a8e-8f7e-4c3e-9e6f-1f2d3c4b5a69",
    "flag": None,
    "tags": ["a", "b"],
    "meta": {"x": 1},
    "inner": {"a": 1},
}
# Values of every JSON kind, with the ones jsonschema's rules tell apart narrowly (a bool is no integer, 1.0 is an
# integer from draft 6 on, a date-time needs its offset, an enum compares strings exactly).
ODD = [
    None, True, False, 0, 1, -(2**70), 1.0, 1.5, "", "BUY", "buy", "SELL ", "ACME", "2026-01-01T00:00:00Z",
    "2026-01-01T00:00:00", "2026-02-30T00:00:00Z", "2026-01-01 00:00:00+01:00", "8c4a2a8e-8f7e-4c3e-9e6f-1f2d3c4b5a69",
    "not-a-uuid", [], [1], ["a", None], {}, {"a": 1}, {"a": "1"}, {"x": 1.0}, {"x": True}, {"b": 1},
]  # fmt: skip


def mutations(seed: int, count: int):
    """Records near VALID: fields replaced by odd values, removed, or added."""
    rng = random.Random(seed)
    for _ in range(count):
        value = dict(VALID)
        for _ in range(rng.randint(1, 3)):
            action, name = rng.random(), rng.choice([*VALID, "extra"])
            if action < 0.7:
                value[name] = rng.choice(ODD)
            else:
                value.pop(name, None)
        yield value


@pytest.mark.parametrize("schema", [TRADE, OPEN, DRAFT4], ids=["draft7", "draft2020", "draft4"])
def test_the_quick_check_accepts_only_what_jsonschema_accepts(schema):
    validator = validator_for_bundle({"schema": schema, "references": {}})
    quick = quick_check(schema, type(validator), validator.format_checker)
    assert quick is not None and quick(VALID) and validator.is_valid(VALID)
    values = list(itertools.chain(mutations(1, 3000), ODD))
    verdicts = [(quick(v), validator.is_valid(v)) for v in values]
    assert [v for v, (fast, valid) in zip(values, verdicts) if fast and not valid] == []
    assert sum(fast for fast, _ in verdicts) > 100, "the quick check should accept most valid records"
    assert sum(not valid for _, valid in verdicts) > 1000, "the records should be mostly invalid"


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"$ref": "#/definitions/a"}}, "definitions": {"a": {}}},
        {"type": "object", "properties": {"a": {"type": "string", "pattern": "^x"}}},
        {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}},
        {"type": "object", "properties": {"a": {"oneOf": [{"type": "string"}, {"type": "null"}]}}},
        {"type": "object", "patternProperties": {"^a": {}}, "additionalProperties": False},
        {"type": "object", "properties": {"a": {"enum": [1, "1"]}}},
        {"type": "object", "properties": {"a": {"type": "array", "items": [{"type": "string"}]}}},
        {"type": "object", "properties": {"a": False}},
        {"$schema": "http://json-schema.org/draft-03/schema#", "properties": {"a": {"required": True}}},
    ],
)
def test_schemas_with_other_keywords_get_no_quick_check(schema):
    validator = validator_for_bundle({"schema": schema, "references": {}})
    assert quick_check(schema, type(validator), validator.format_checker) is None


def test_a_record_the_quick_check_does_not_accept_gets_jsonschemas_first_failure():
    validator = record_validator({"schema": TRADE, "references": {}})
    assert validator.quick is not None
    assert validator.first_failure(VALID) is None
    assert validator.first_failure({**VALID, "quantity": 1.0}) is None  # an integer to draft 7: jsonschema decides
    failure = validator.first_failure({**VALID, "quantity": True, "side": "buy"})
    assert (list(failure.absolute_path), failure.validator) == (["quantity"], "type")


def test_values_are_shaped_for_the_table_at_every_depth():
    from icefloe.formats.json_schema import _Shapes, shaper

    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "free": {},
            "items": {"type": "array", "items": {"type": "object", "properties": {"x": {}}}},
            "m": {"type": "object", "additionalProperties": {"type": "array", "items": {}}},
            "s": {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": True},
        },
    }
    shape = shaper(_Shapes({"schema": schema, "references": {}}).shape(schema, schema, "value"))
    value = {
        "n": 1,
        "free": {"b": [1, 2], "a": None},
        "items": [{"x": {"k": 1}}, None, {"y": 1}],
        "m": {"k": [1, "a", None], "j": None},
        "s": {"a": "x", "z": 1, "y": [True]},
        "undeclared": 1,
    }
    assert shape(value) == {
        "n": 1,
        "free": '{"a":null,"b":[1,2]}',
        "items": [{"x": '{"k":1}'}, None, {"x": None}],
        "m": {"k": ["1", '"a"', None], "j": None},
        "s": {"a": "x", "additional_properties": '{"y":[true],"z":1}'},
    }
    assert shape({"s": None, "items": "not a list"}) == {
        "n": None, "free": None, "items": "not a list", "m": None, "s": None
    }  # fmt: skip


def test_the_quick_date_time_check_accepts_only_what_the_format_checker_accepts():
    from icefloe.formats.json_schema_quick import _plain_date_time

    checker = validator_for_bundle({"schema": TRADE, "references": {}}).format_checker
    plain = _plain_date_time(checker)
    assert plain is not None, "jsonschema's date-time checker over rfc3339_validator is installed"
    rng = random.Random(3)
    parts = [  # (usual, odd) choices for each part of a date-time
        (["0001", "2026", "9999"], ["0000", "202", "20261"]), (["-"], ["/"]), (["01", "02", "12"], ["00", "13"]),
        (["-"], [""]), (["01", "28", "29", "30", "31"], ["00", "32", "1"]), (["T"], ["t", " "]), (["00", "23"], ["24"]),
        ([":"], ["."]), (["00", "59"], ["60"]), ([":"], [""]), (["00", "59"], ["60", "5"]),
        (["", ".1", ".123456789"], ["."]), (["Z", "+00:00", "-23:59"], ["z", "+24:00", "+01", ""]), ([""], ["\n", " "]),
    ]  # fmt: skip
    values = ["".join(rng.choice(usual if rng.random() < 0.9 else odd) for usual, odd in parts) for _ in range(20000)]
    accepted = [v for v in values if plain(v)]
    assert [v for v in accepted if not checker.conforms(v, "date-time")] == []
    assert 1000 < len(accepted) < len([v for v in values if checker.conforms(v, "date-time")])
    assert plain("2026-01-01T00:00:00.123Z") and not plain("2026-02-29T00:00:00Z")  # a leap day: the checker decides
