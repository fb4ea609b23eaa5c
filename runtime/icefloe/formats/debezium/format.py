"""`envelope: debezium`: the `Envelope` object `formats.registry.ENVELOPES` holds. Each answer is the driver side's
(`tables`) or the executor side's (`envelope`); materialize asks this object and never this package."""

from __future__ import annotations

from dataclasses import replace

from pyspark.sql import SparkSession
from pyspark.sql.types import StructField

from icefloe.formats.base import CONFLUENT, BatchContext, ChangeDecoder, DecoderSpec, ValueRules
from icefloe.formats.debezium import tables
from icefloe.formats.debezium.jvm import DebeziumJvmPlan, plan_debezium
from icefloe.formats.decoding import confluent_conf
from icefloe.spec import SourceCluster, TableSpec


class Debezium:
    name = "debezium"

    def resolve(self, table: TableSpec, cluster: SourceCluster) -> DecoderSpec:
        return tables.decoder_spec(table, confluent_conf(cluster), f"table {table.table_name}")

    def value_fields(self, spec: DecoderSpec, table: TableSpec, identifier: str) -> list[StructField]:
        """Avro: the columns of the registry's envelope; JSON: the cdc_ columns until a batch is read."""
        return tables.layout_of(spec).value_fields()

    def per_batch(self, spec: DecoderSpec) -> bool:
        return spec.data_format == "json"  # the columns the batch's change events give

    def for_batch(
        self, spark: SparkSession, spec: DecoderSpec, batch: BatchContext
    ) -> tuple[DecoderSpec, list[StructField]]:
        current = tables.layout_of(spec)
        layout = tables.json_layout(
            spark, batch.kafka_conf, batch.tasks, batch.max_record_bytes, list(batch.table_fields), current.mode,
            current.soft, batch.where,
        )  # fmt: skip
        return tables.with_layout(spec, layout, tables.placeholder_of(spec)), layout.value_fields()

    def registry_schema(self, spec: DecoderSpec) -> bool:
        return spec.schema_from == CONFLUENT

    def rules(self, spec: DecoderSpec, inner: ValueRules) -> ValueRules:
        return replace(inner, strict=True, required=frozenset())  # checked field by field, whatever the encoding

    def change_fields(self, spec: DecoderSpec) -> list[StructField]:
        return tables.layout_of(spec).change_fields()

    def row_keys(self, spec: DecoderSpec) -> list[str]:
        return tables.layout_of(spec).keys

    def jvm_codec(self, spark: SparkSession, spec: DecoderSpec) -> DebeziumJvmPlan | str:
        return plan_debezium(spark, spec)

    def decoder(self, spec: DecoderSpec) -> ChangeDecoder:
        return tables.change_decoder(spec)


DEBEZIUM = Debezium()
