"""The Iceberg table and its catalog (Glue, S3 Tables, local SQL): loading, schema evolution, refs and appends.

Imports the top-level contracts and `formats.columns` (the columns a batch brings); never `commit`,
`materialize` or `operate`.
"""
