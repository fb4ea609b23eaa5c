"""`format: json`: JSON objects, with an inline `schema` (its columns, `optional: false` enforced) or schemaless
(the columns inferred per batch, `schemaless_json`). Read on the Python path: the inline checks (strict types,
`optional: false`, ints given as 1.0, ISO strings and epoch numbers for timestamps, base64 binary) have no exact
`from_json` equivalent."""

from __future__ import annotations

from dataclasses import replace

from pyspark.sql import SparkSession
from pyspark.sql.types import StructField

from icefloe.formats import schemaless_json
from icefloe.formats.base import BATCH, INLINE, BatchContext, Decoder, DecoderSpec, ValueRules
from icefloe.formats.decoding import confluent_conf
from icefloe.formats.inline import inline_value_fields, required_paths
from icefloe.formats.json import json_object, parse_json
from icefloe.spec import SourceCluster, TableSpec


class Json:
    name = "json"

    def resolve(self, table: TableSpec, cluster: SourceCluster, keys: dict) -> DecoderSpec:
        schema_from = INLINE if table.inline_schema is not None else BATCH
        return DecoderSpec(self.name, schema_from, table.topic, registry_conf=confluent_conf(cluster), **keys)

    def value_fields(self, spec: DecoderSpec, table: TableSpec, identifier: str) -> list[StructField] | None:
        if spec.schema_from == BATCH:  # schemaless: the columns come from each batch
            return None
        return inline_value_fields(table.inline_schema)  # type: ignore[arg-type]  # an inline table has one

    def for_batch(
        self, spark: SparkSession, spec: DecoderSpec, batch: BatchContext
    ) -> tuple[DecoderSpec, list[StructField]]:
        """The batch's types inferred from its records, merged into the table's columns."""
        inferred = schemaless_json.infer_batch(spark, batch.kafka_conf, batch.tasks, batch.max_record_bytes)
        values = schemaless_json.value_struct(batch.table_fields, inferred)
        return replace(spec, schema_str=values.json()), list(values.fields)

    def registry_schema(self, spec: DecoderSpec) -> bool:
        return False

    def rules(self, spec: DecoderSpec, table: TableSpec) -> ValueRules:
        required = required_paths(table.inline_schema) if spec.schema_from == INLINE else frozenset()
        return ValueRules(strict=True, required=required)

    def jvm_codec(self, spark: SparkSession, spec: DecoderSpec) -> str:
        return "JSON values are checked against the table's types in Python"

    def decoder(self, spec: DecoderSpec) -> Decoder:
        if spec.schema_from == BATCH:  # shaped for the types inferred for the batch
            return schemaless_json.decoder(spec.schema)
        return json_object

    def key_decoder(self, spec: DecoderSpec) -> Decoder:
        return parse_json  # an object, or for one key field its value alone


JSON = Json()
