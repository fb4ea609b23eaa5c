"""Strict UTF-8 and JSON, once for every format that reads JSON text (inline JSON, schemaless JSON, JSON Schema)
and for string values and keys: invalid UTF-8, invalid JSON and the non-standard constants `NaN`/`Infinity` that
Python's parser accepts are bad records (`BadRecord`), named by position, never by quoting the bytes."""

from __future__ import annotations

import json
from typing import Any

from icefloe.errors import BadRecord


def utf8(data: bytes, what: str = "value", offset: int = 0) -> str:
    """`data` as text; `offset`: where `data` starts in the record's value (a framed payload), for the message."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise BadRecord(f"{what} is not valid UTF-8 ({error.reason} at byte {error.start + offset})") from None


def reject_constant(name: str) -> Any:
    raise BadRecord(f"{name} is not valid JSON")


# One decoder for every record: `json.loads` with an argument builds a new one per call (a third of a small
# record's parse).
_DECODER = json.JSONDecoder(parse_constant=reject_constant)


def parse_json(data: bytes, offset: int = 0) -> Any:
    """Any JSON value, strictly (no NaN or Infinity)."""
    text = utf8(data, offset=offset)
    try:
        if text.startswith("\ufeff"):  # `json.loads`' own refusal, before its decoder's
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        return _DECODER.decode(text)
    except json.JSONDecodeError as error:
        raise BadRecord(f"value is not valid JSON: {error.msg} at position {error.pos}") from None


def json_object(data: bytes) -> dict:
    """A JSON object, strictly."""
    value = parse_json(data)
    if not isinstance(value, dict):
        raise BadRecord(f"JSON value must be an object, got {type(value).__name__}")
    return value
