"""`format: avro`: through a Confluent-compatible registry (the subject's latest version), the AWS Glue Schema
Registry, or an inline schema (Confluent wire format, its id ignored). Read on the JVM path (`avro.jvm`) where Avro
Java takes the table's schema; the Python decoder is fastavro's (`avro.reader`)."""

from __future__ import annotations

import json

from pyspark.sql import SparkSession
from pyspark.sql.types import StructField

from icefloe.errors import ConfigError
from icefloe.formats import decoding, glue_framed
from icefloe.formats.avro import reader
from icefloe.formats.avro.jvm import AvroJvmPlan, plan_avro
from icefloe.formats.avro.mapping import avro_value_fields
from icefloe.formats.base import CONFLUENT, GLUE, INLINE, Decoder, DecoderSpec, ValueRules
from icefloe.formats.inline import inline_to_avro, inline_value_fields
from icefloe.registries import confluent
from icefloe.spec import SourceCluster, TableSpec


class Avro:
    name = "avro"

    def resolve(self, table: TableSpec, cluster: SourceCluster, keys: dict) -> DecoderSpec:
        if decoding.uses_glue(cluster):
            return decoding.glue_spec(table, cluster, keys)
        registry = decoding.confluent_conf(cluster)
        if table.inline_schema is not None and registry is None:
            schema = json.dumps(inline_to_avro(table.inline_schema))
            return DecoderSpec(self.name, INLINE, table.topic, schema, **keys)
        if registry is None:
            raise ConfigError(
                f"table {table.table_name}: format avro needs sourceCluster {cluster.name}.schemaRegistry or an "
                "inline schema"
            )
        schema = confluent.latest_schema(registry, confluent.subject_for(table.topic))  # through the module: tests
        return DecoderSpec(self.name, CONFLUENT, table.topic, schema, registry, **keys)

    def value_fields(self, spec: DecoderSpec, table: TableSpec, identifier: str) -> list[StructField] | None:
        if spec.schema_from == CONFLUENT:
            return avro_value_fields(spec.schema, f"{identifier} (subject {table.topic}-value)")
        if spec.schema_from == GLUE:
            return avro_value_fields(spec.schema, f"{identifier} (Glue schema {spec.registry['schema']})")
        return inline_value_fields(table.inline_schema)  # type: ignore[arg-type]  # an inline table has one

    def for_batch(self, spark, spec, batch):
        raise NotImplementedError

    def registry_schema(self, spec: DecoderSpec) -> bool:
        return spec.schema_from in (CONFLUENT, GLUE)

    def rules(self, spec: DecoderSpec, table: TableSpec) -> ValueRules:
        return ValueRules(framed=spec.schema_from != GLUE)

    def jvm_codec(self, spark: SparkSession, spec: DecoderSpec) -> AvroJvmPlan | str:
        return plan_avro(spark, spec) or "Avro Java cannot use the table's schema"

    def decoder(self, spec: DecoderSpec) -> Decoder:
        if spec.schema_from == GLUE:
            return glue_framed.decoder(spec.registry, reader.glue_payload, spec.schema, spec.message_type)
        if spec.schema_from == INLINE:
            return reader.inline_avro_decoder(spec.schema)
        return reader.with_unions(
            spec.schema, lambda names: reader.registry_avro_decoder(spec, spec.schema, False, names)
        )

    def key_decoder(self, spec: DecoderSpec) -> Decoder:
        if spec.key_conf is not None:  # framed for the AWS Glue Schema Registry, decoded as written
            return glue_framed.decoder(spec.key_conf, reader.glue_payload)
        decoding.needs_registry(spec)
        return reader.registry_avro_decoder(spec, None, True)


AVRO = Avro()
