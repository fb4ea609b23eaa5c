"""Reading small files (configs) from a local path or an s3:// URI."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse


def read_text(location: str) -> str:
    if location.startswith("s3://"):
        import boto3

        url = urlparse(location)
        body = boto3.client("s3").get_object(Bucket=url.netloc, Key=url.path.lstrip("/"))["Body"]
        return body.read().decode("utf-8")
    return Path(location).read_text(encoding="utf-8")
