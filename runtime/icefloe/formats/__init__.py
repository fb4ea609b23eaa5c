"""Data formats: how a record's bytes become a row, and which table columns a format gives.

One module or package per format (`avro/`, `protobuf/`, `json_schema`, `schemaless_json`, `raw`), with the shared
decoder resolution and dispatch in `decoding` and the type mapping to Iceberg/Spark in `schema_mapping`. Imports the
top-level contracts and `registries`; never the table, commit or materialize layers.
"""
