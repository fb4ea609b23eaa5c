"""Data formats: how a record's bytes become a row, and which table columns a format gives.

`base` says what a format is (`Format`, the picklable `DecoderSpec`: what the bytes are and where the schema comes
from); `registry` holds one `Format` per table `format` (`FORMATS`) and is all the materialize layer asks. One
module or package per format (`avro/`, `protobuf/`, `json_schema`, `plain_json` with `schemaless_json`, `raw`);
`json` is strict UTF-8 and JSON for all of them, `decoding` the schema registries' clients and the Avro decoders,
`glue_framed` the AWS Glue Schema Registry's framing, `schema_mapping` the type mapping to Iceberg/Spark. Imports
the top-level contracts and `registries`; never the table, commit or materialize layers.
"""
