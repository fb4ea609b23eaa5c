"""Kafka: what to read and reading it.

Owns the offset plan (`kafka`: committed positions, log bounds, leader epochs, the ranges a batch reads), Spark's Kafka
source (`spark_kafka`) and Amazon MSK IAM authentication (`msk_iam`). Imports only the top-level contracts (`errors`,
`spec`, `credentials`); knows nothing of formats, tables or commits.
"""
