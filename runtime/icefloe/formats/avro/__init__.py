"""Avro: named unions, what fastavro cannot decode exactly, and the JVM codec (`from_avro` without Python per record)."""
