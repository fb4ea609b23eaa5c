"""Where writer schemas come from: the AWS Glue Schema Registry (`glue`: its wire format, versions and caches).

The Confluent-compatible registry client lives with the decoders (`formats.decoding`) for now. Imports the top-level
contracts and the formats that a Glue version resolves to.
"""
