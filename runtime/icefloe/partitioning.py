"""Partition transforms a user may declare in `partitionBy`, and their Spark DDL."""

from __future__ import annotations

import re
from dataclasses import dataclass

_TRANSFORM = re.compile(r"^\s*(hour|day|month|year|identity)\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$")
_BUCKET = re.compile(r"^\s*(bucket|truncate)\(\s*(\d+)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$")
_BARE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*$")
# Iceberg's Spark DDL spells the time transforms in the plural.
_SPARK_NAME = {"hour": "hours", "day": "days", "month": "months", "year": "years"}


@dataclass(frozen=True)
class PartitionField:
    text: str
    transform: str  # hour | day | month | year | identity | bucket | truncate
    source: str
    width: int | None = None

    def spark_ddl(self) -> str:
        source = "`" + self.source.replace("`", "``") + "`"  # iceberg_table.quoted (which imports this module)
        if self.transform == "identity":
            return source
        if self.width is not None:
            return f"{self.transform}({self.width}, {source})"
        return f"{_SPARK_NAME[self.transform]}({source})"


def parse_partition_field(text: str) -> PartitionField:
    if match := _TRANSFORM.match(text):
        return PartitionField(text, match.group(1), match.group(2))
    if match := _BUCKET.match(text):
        width = int(match.group(2))
        if width < 1:
            raise ValueError(f"partitionBy {text!r}: width must be at least 1")
        return PartitionField(text, match.group(1), match.group(3), width)
    if match := _BARE.match(text):
        return PartitionField(text, "identity", match.group(1))
    raise ValueError(
        f"partitionBy {text!r} is not understood; use hour(col), day(col), month(col), year(col), "
        "bucket(N, col), truncate(N, col) or a column name"
    )
