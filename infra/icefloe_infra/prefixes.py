"""Where the stack keeps things in the lakehouse bucket: one definition for the jobs, the roles and the uploads.

The tables live under the user's warehouse prefix (`icefloe:storage.warehousePrefix`); everything else the stack
writes is under the prefixes below. Jobs may read `ARTIFACTS` and never write it; they write only `LOGS`.
"""

from __future__ import annotations

ARTIFACTS = "icefloe"
BUNDLE = f"{ARTIFACTS}/bundle"  # <sha256 of the archive>/deps.tar.gz and main.py
JARS = f"{ARTIFACTS}/jars"  # <sha256 of the jar>/<file name>
CONFIG = f"{ARTIFACTS}/config"  # <sha256 of the document>.json
LOGS = "logs"  # EMR Serverless job logs


def s3_uri(bucket: str, key: str) -> str:
    return f"s3://{bucket}/{key}"
