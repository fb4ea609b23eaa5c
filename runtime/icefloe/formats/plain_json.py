"""`format: json`: JSON objects, with an inline `schema` (its columns, `optional: false` enforced) or schemaless
(the columns inferred per batch, `schemaless_json`). Both read on the JVM path where `json_jvm` covers the
columns' types (each record proven to decode as in Python, else decoded by Python)."""

from __future__ import annotations

import json
import logging
from dataclasses import replace

from pyspark.sql import SparkSession
from pyspark.sql.types import StructField, StructType

from icefloe.formats import json_jvm, schemaless_json
from icefloe.formats.base import BATCH, INLINE, BatchColumns, BatchContext, Decoder, DecoderSpec, ValueRules
from icefloe.formats.decoding import confluent_conf
from icefloe.formats.inline import inline_value_fields, required_paths
from icefloe.formats.json import json_object, parse_json
from icefloe.source.spark_kafka import kafka_timestamp_overflow
from icefloe.spec import SourceCluster, TableSpec

log = logging.getLogger(__name__)
# A new schemaless table's first batch: the columns of each partition's first records this many records stand in
# for the table's, so the JVM pass leaves to Python's inference only the records they do not explain.
SAMPLE_RECORDS = 1_000
INFERRED_HERE = 10_000  # records to infer in the driver, not in Spark tasks (their Python workers cost more)


class Json:
    name = "json"

    def resolve(self, table: TableSpec, cluster: SourceCluster, keys: dict) -> DecoderSpec:
        if table.inline_schema is None:  # schemaless: the columns come from each batch (`for_batch`)
            return DecoderSpec(self.name, BATCH, table.topic, registry_conf=confluent_conf(cluster), **keys)
        columns = StructType(inline_value_fields(table.inline_schema))
        schema = json_jvm.inline_schema_str(columns, required_paths(table.inline_schema))
        return DecoderSpec(
            self.name, INLINE, table.topic, schema_str=schema, registry_conf=confluent_conf(cluster), **keys
        )

    def value_fields(self, spec: DecoderSpec, table: TableSpec, identifier: str) -> list[StructField] | None:
        if spec.schema_from == BATCH:  # schemaless: the columns come from each batch
            return None
        return inline_value_fields(table.inline_schema)  # type: ignore[arg-type]  # an inline table has one

    def for_batch(self, spark: SparkSession, spec: DecoderSpec, batch: BatchContext) -> BatchColumns:
        """The batch's types inferred from its records, merged into the table's columns: only the records the
        table's columns do not explain are inferred (`schemaless_json.unexplained_ranges`). Where the batch may
        assume columns (`BatchContext.assume`) and the JVM can check records against them, an existing table's
        columns are assumed instead, and the records the write leaves to Python are inferred then
        (`BatchColumns.explains`): a batch that adds no column is read once."""
        current = schemaless_json.value_struct(batch.table_fields, "null")
        sampled: schemaless_json.Inferred = "null"
        if not current.fields:  # a new table: the columns of each partition's first records stand in for the table's
            sample = schemaless_json.first_records(batch.tasks, SAMPLE_RECORDS)
            sampled = schemaless_json.infer_here(batch.kafka_conf, sample, batch.max_record_bytes)
            current = schemaless_json.value_struct([], sampled)
        codec = json_jvm.schemaless_codec(current) if current.fields else None
        if batch.assume and sampled == "null" and isinstance(codec, json_jvm.JsonJvmCodec):
            # Not a new table's sampled columns: the table would have them before the batch proved them, and a later
            # record making one a string could not be undone by a schema change.

            def explains(ranges: list) -> bool:
                """Whether these records' types leave the table's columns as they are (else the batch's columns are
                inferred as without `assume`)."""
                return schemaless_json.value_struct(batch.table_fields, _inferred(spark, batch, ranges)) == current

            log.info(
                "%s: the table's columns assumed, the records they do not explain inferred as the batch is written",
                batch.where or spec.topic,
            )
            return BatchColumns(replace(spec, schema_str=current.json()), list(current.fields), explains)
        ranges = batch.tasks
        if isinstance(codec, json_jvm.JsonJvmCodec):
            try:
                ranges = schemaless_json.unexplained_ranges(spark, codec, batch)
            except Exception as error:  # a Kafka timestamp Spark cannot read: the batch goes to Python whole
                if not kafka_timestamp_overflow(error):
                    raise
                ranges = batch.tasks
            log.info(
                "%s: %s of the batch's records to infer in Python, the %s columns explain the others",
                batch.where or spec.topic,
                f"{sum(r.count for r in ranges):,} (at most)" if ranges else "none",
                "table's" if sampled == "null" else "first records'",
            )
        if ranges is batch.tasks:  # the whole batch inferred, in its order: the sample adds nothing
            sampled = "null"
        inferred = _inferred(spark, batch, ranges) if ranges else "null"
        # The records the sample's columns explain add nothing to its types: the batch's types are both unified.
        values = schemaless_json.value_struct(batch.table_fields, schemaless_json.unify(sampled, inferred))
        return BatchColumns(replace(spec, schema_str=values.json()), list(values.fields))

    def registry_schema(self, spec: DecoderSpec) -> bool:
        return False

    def rules(self, spec: DecoderSpec, table: TableSpec) -> ValueRules:
        required = required_paths(table.inline_schema) if spec.schema_from == INLINE else frozenset()
        return ValueRules(strict=True, required=required)

    def jvm_codec(self, spark: SparkSession, spec: DecoderSpec) -> json_jvm.JsonJvmCodec | str:
        if spec.schema_from == BATCH:  # the columns the batch's records gave (`for_batch`)
            if spec.schema_str is None:
                return "schemaless JSON: the batch's records give the columns (not inferred yet)"
            return json_jvm.schemaless_codec(StructType.fromJson(json.loads(spec.schema)))
        return json_jvm.codec_for(spec.schema)

    def decoder(self, spec: DecoderSpec) -> Decoder:
        if spec.schema_from == BATCH:  # shaped for the types inferred for the batch
            return schemaless_json.decoder(spec.schema)
        return json_object

    def key_decoder(self, spec: DecoderSpec) -> Decoder:
        return parse_json  # an object, or for one key field its value alone


def _inferred(spark: SparkSession, batch: BatchContext, ranges: list) -> schemaless_json.Inferred:
    """The unified type of the records in `ranges`: read by the driver where they are few (a Spark task would start
    a Python worker), else by Spark tasks."""
    if sum(r.count for r in ranges) <= INFERRED_HERE:
        return schemaless_json.infer_here(batch.kafka_conf, ranges, batch.max_record_bytes)
    return schemaless_json.infer_batch(spark, batch.kafka_conf, ranges, batch.max_record_bytes)


JSON = Json()
