"""Arrow batches the executors emit: bounded in rows and in bytes, whatever the records' size."""

from __future__ import annotations

import json

import pyarrow as pa
from pyspark.sql import types as T

from icefloe.formats.base import DecoderSpec
from icefloe.formats.columns import batch_struct, table_struct
from icefloe.materialize.python_tasks import ReadPlan, redecode_rows

MIB = 1024 * 1024


def rows_of_json(count: int, size: int) -> pa.RecordBatch:
    """Records as the JVM path hands them to Python: Kafka columns and the raw value."""
    value = json.dumps({"s": "x" * size}).encode()
    return pa.RecordBatch.from_pylist(
        [
            {
                "kafka_topic": "t",
                "kafka_partition": 0,
                "kafka_offset": n,
                "kafka_timestamp_ms": 0,
                "kafka_timestamp_type": "CreateTime",
                "kafka_key": None,
                "kafka_headers": None,
                "value": value,
            }
            for n in range(count)
        ]
    )


def plan(**limits) -> ReadPlan:
    struct = table_struct([T.StructField("s", T.StringType())])
    return ReadPlan({}, DecoderSpec("json", "inline", "t"), batch_struct(struct).json(), ("s",), strict=True, **limits)


def test_large_records_are_flushed_by_bytes_not_only_by_rows():
    sizes = [batch.num_rows for batch in redecode_rows(plan(), iter([rows_of_json(70, MIB)]))]
    assert sizes == [64, 6], "64 MiB of 1 MiB records make a batch (default batch_bytes), not 20,000 of them"


def test_batches_flush_at_rows_or_bytes_whichever_first():
    by_bytes = [b.num_rows for b in redecode_rows(plan(batch_bytes=MIB), iter([rows_of_json(40, 64 * 1024)]))]
    assert by_bytes == [16, 16, 8]
    by_rows = [b.num_rows for b in redecode_rows(plan(batch_rows=10, batch_bytes=MIB), iter([rows_of_json(25, 10)]))]
    assert by_rows == [10, 10, 5]
