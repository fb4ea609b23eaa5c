"""Data formats: how a record's bytes become a row, and which table columns a format gives.

`base` says what a format is (`Format`, the picklable `DecoderSpec`: what the bytes are and where the schema comes
from); `registry` holds one `Format` per table `format` (`FORMATS`) and one `Envelope` per table `envelope`
(`ENVELOPES`), and is all the materialize layer asks. One module or package per format (`avro/`, `protobuf/`,
`json_schema`, `plain_json` with `schemaless_json`, `raw`) and per envelope (`debezium/`); `json` is strict UTF-8
and JSON for all of them, `decoding` the formats' side of the schema registries, `glue_framed` the AWS Glue Schema
Registry's framing, `inline` inline schemas' types, `columns` the table's columns around the value fields. Imports
the top-level contracts and `registries`; never the table, commit or materialize layers.
"""
