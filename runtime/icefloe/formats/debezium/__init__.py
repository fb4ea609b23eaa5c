"""Debezium change events (`envelope: debezium`): mirror tables (`mode: upsert`) and changelogs (`mode: append`).

`types`: Kafka Connect schemas (in Avro with `connect.name`, or the JsonConverter's `schema`) and Debezium's semantic
types to table types and values; `envelope`: one event to a row of the table and the change it makes (executors);
`tables`: the driver side (columns, key, decoder spec, per-batch columns of JSON topics). The upsert writer knows no
Debezium: it consumes the generic change columns of `batch_columns` (kind, source position, unchanged columns,
the key a row moved from).
"""
