"""What the jobs read from the bucket: the runtime bundle, its entry point and the job config, content-addressed."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from .bundle import Bundle
from .jobs import BUNDLE_PREFIX, config_key


@dataclass
class RuntimeArtifactsArgs:
    bucket: pulumi.Input[str]
    bundle: Bundle
    job_config: pulumi.Input[str]  # jobs.job_config_document(...)


class RuntimeArtifacts(pulumi.ComponentResource):
    """S3 keys carry the content hash, so a new bundle or config is a new object: running jobs keep theirs."""

    archive_uri: pulumi.Output[str]
    entry_point_uri: pulumi.Output[str]
    config_uri: pulumi.Output[str]

    def __init__(self, name: str, args: RuntimeArtifactsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("icefloe:bundle:RuntimeArtifacts", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        prefix = f"{BUNDLE_PREFIX}/{args.bundle.digest}"
        archive = aws.s3.BucketObjectv2(
            f"{name}-bundle", bucket=args.bucket, key=f"{prefix}/deps.tar.gz", content_type="application/gzip",
            source=pulumi.FileAsset(str(args.bundle.archive)), opts=child,
        )  # fmt: skip
        entry_point = aws.s3.BucketObjectv2(
            f"{name}-entry-point", bucket=args.bucket, key=f"{prefix}/main.py", content_type="text/x-python",
            source=pulumi.FileAsset(str(args.bundle.entry_point)), opts=child,
        )  # fmt: skip
        body = pulumi.Output.from_input(args.job_config)
        config = aws.s3.BucketObjectv2(
            f"{name}-job-config", bucket=args.bucket, key=body.apply(config_key), content=body,
            content_type="application/json", opts=child,
        )  # fmt: skip
        self.archive_uri = pulumi.Output.concat("s3://", archive.bucket, "/", archive.key)
        self.entry_point_uri = pulumi.Output.concat("s3://", entry_point.bucket, "/", entry_point.key)
        self.config_uri = pulumi.Output.concat("s3://", config.bucket, "/", config.key)
        self.register_outputs(
            {"archiveUri": self.archive_uri, "entryPointUri": self.entry_point_uri, "configUri": self.config_uri}
        )
