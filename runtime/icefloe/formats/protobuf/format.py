"""`format: protobuf`: through a Confluent-compatible registry (the subject's latest version, references resolved;
`messages`) or the AWS Glue Schema Registry (`glue`). Records of the latest version read on the JVM path with
icefloe's own decoder (`jvm`: Spark 3.5 has no spark-protobuf on Maven Central here); the rest on the Python path."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql.types import StructField

from icefloe.errors import ConfigError
from icefloe.formats import decoding, glue_framed
from icefloe.formats.base import CONFLUENT, GLUE, Decoder, DecoderSpec, JvmCodec, ValueRules
from icefloe.formats.protobuf import glue, jvm
from icefloe.formats.protobuf.messages import ProtobufDecoder, value_fields
from icefloe.formats.protobuf.schemas import ProtobufSchemas, deserialize_file, find_message, serialize_file
from icefloe.registries import confluent
from icefloe.spec import SourceCluster, TableSpec


class Protobuf:
    name = "protobuf"

    def resolve(self, table: TableSpec, cluster: SourceCluster, keys: dict) -> DecoderSpec:
        if decoding.uses_glue(cluster):
            return decoding.glue_spec(
                table,
                cluster,
                keys,
                lambda definition, where: glue.table_message(definition, table.message_type, where),
            )

        def build(client, latest, registry: dict[str, str]) -> DecoderSpec:
            subject = confluent.subject_for(table.topic)
            file = ProtobufSchemas(client).resolve(latest.schema, f"{subject}.proto")
            try:
                message = find_message(file, table.message_type).full_name
            except ValueError as error:
                raise ConfigError(f"table {table.table_name}: {error}") from None
            schema = serialize_file(file)
            return DecoderSpec(
                self.name,
                CONFLUENT,
                table.topic,
                schema,
                registry,
                message_type=message,
                schema_id=latest.schema_id,
                **keys,
            )

        return decoding.registry_spec(table, cluster, keys, "PROTOBUF", build)

    def value_fields(self, spec: DecoderSpec, table: TableSpec, identifier: str) -> list[StructField] | None:
        if spec.schema_from == GLUE:
            where = f"{identifier} (Glue schema {spec.registry['schema']})"
            return glue.value_fields(spec.schema, where, spec.message_type)
        return value_fields(find_message(deserialize_file(spec.schema), spec.message_type))

    def for_batch(self, spark, spec, batch):
        raise NotImplementedError

    def registry_schema(self, spec: DecoderSpec) -> bool:
        return True

    def rules(self, spec: DecoderSpec, table: TableSpec) -> ValueRules:
        return ValueRules(framed=spec.schema_from == CONFLUENT)

    def jvm_codec(self, spark: SparkSession, spec: DecoderSpec) -> JvmCodec | str:
        return jvm.codec_for(spark, spec)

    def decoder(self, spec: DecoderSpec) -> Decoder:
        if spec.schema_from == GLUE:
            return glue_framed.decoder(spec.registry, _glue_payload, spec.schema, spec.message_type)
        client = confluent.registry_client(spec.registry)  # through the module: tests count the clients
        return decoding.registry_checked(spec, ProtobufDecoder(client, spec.message_type))

    def key_decoder(self, spec: DecoderSpec) -> Decoder:  # the key's own message type, from its writer schema
        if spec.key_conf is not None:
            return glue_framed.decoder(spec.key_conf, _glue_payload)
        decoding.needs_registry(spec)
        return decoding.registry_checked(spec, ProtobufDecoder(confluent.registry_client(spec.registry), None))


def _glue_payload(writer: str, table: str | None, message_type: str | None) -> Decoder:
    return glue.payload_decoder(writer, table, message_type)  # type: ignore[arg-type]  # protobuf tables name theirs


PROTOBUF = Protobuf()
