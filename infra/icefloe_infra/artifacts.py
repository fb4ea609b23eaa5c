"""What the jobs read from the bucket: the runtime bundle, its entry point, the jars and the job config.

Every key carries a content hash, so a new bundle, jar or config is a new object: `pulumi up` after a change
replaces it, and a job that is running keeps reading the objects it started with.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import pulumi
import pulumi_aws as aws

from . import prefixes
from .bundle import Bundle


@dataclass
class RuntimeArtifactsArgs:
    bucket: pulumi.Input[str]
    bundle: Bundle
    job_config: pulumi.Input[str]  # jobs.job_config_document(...)
    jars: dict[str, Path] = field(default_factory=dict)  # {artifactId: file}: jars.job_jars(...)


def config_key(body: str) -> str:
    return f"{prefixes.CONFIG}/{hashlib.sha256(body.encode()).hexdigest()}.json"


def jar_key(path: Path) -> str:
    """`icefloe/jars/<sha256>/<file name>`: the name stays readable in Spark's logs."""
    return f"{prefixes.JARS}/{hashlib.sha256(path.read_bytes()).hexdigest()}/{path.name}"


class RuntimeArtifacts(pulumi.ComponentResource):
    archive_uri: pulumi.Output[str]
    entry_point_uri: pulumi.Output[str]
    config_uri: pulumi.Output[str]
    jar_uris: pulumi.Output[list[str]]

    def __init__(self, name: str, args: RuntimeArtifactsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("icefloe:bundle:RuntimeArtifacts", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        def upload(suffix: str, key: pulumi.Input[str], content_type: str, **body) -> pulumi.Output[str]:
            uploaded = aws.s3.BucketObjectv2(
                f"{name}-{suffix}", bucket=args.bucket, key=key, content_type=content_type, opts=child, **body
            )
            return pulumi.Output.all(uploaded.bucket, uploaded.key).apply(lambda v: prefixes.s3_uri(v[0], v[1]))

        prefix = f"{prefixes.BUNDLE}/{args.bundle.digest}"
        self.archive_uri = upload(
            "bundle", f"{prefix}/deps.tar.gz", "application/gzip", source=pulumi.FileAsset(str(args.bundle.archive))
        )
        self.entry_point_uri = upload(
            "entry-point", f"{prefix}/main.py", "text/x-python", source=pulumi.FileAsset(str(args.bundle.entry_point))
        )
        body = pulumi.Output.from_input(args.job_config)
        self.config_uri = upload("job-config", body.apply(config_key), "application/json", content=body)
        # Named by the artifact, not its version: after a version bump `pulumi up` replaces the object.
        self.jar_uris = pulumi.Output.all(
            *[
                upload(
                    f"jar-{re.sub(r'[^a-z0-9-]+', '-', artifact)}",
                    jar_key(path),
                    "application/java-archive",
                    source=pulumi.FileAsset(str(path)),
                )
                for artifact, path in args.jars.items()
            ]
        )
        self.register_outputs(
            {
                "archiveUri": self.archive_uri,
                "entryPointUri": self.entry_point_uri,
                "configUri": self.config_uri,
                "jarUris": self.jar_uris,
            }
        )
