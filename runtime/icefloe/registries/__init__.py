"""Where writer schemas come from: a Confluent-compatible registry (`confluent`: the client, subjects, versions) and
the AWS Glue Schema Registry (`glue`: its wire format, versions and caches). Imports the top-level contracts only.
"""
