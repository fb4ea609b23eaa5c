"""Lakehouse storage: a private, KMS-encrypted, versioned, TLS-only S3 bucket, or the user's own bucket.

Kept on `pulumi destroy` (with its key and settings) unless `icefloe:storage.forceDestroy` is true.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from icefloe_policies import ROLE_LAKEHOUSE, TAG_ROLE

from .deployment import StorageSpec


@dataclass
class LakehouseStorageArgs:
    spec: StorageSpec
    tags: dict[str, str] = field(default_factory=dict)


class LakehouseStorage(pulumi.ComponentResource):
    bucket_name: pulumi.Output[str]
    bucket_arn: pulumi.Output[str]
    kms_key_arn: pulumi.Output[str]

    def __init__(self, name: str, args: LakehouseStorageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("icefloe:storage:LakehouseStorage", name, None, opts)
        spec = args.spec
        if spec.existing_bucket:
            self.bucket_name = pulumi.Output.from_input(spec.existing_bucket)
            self.bucket_arn = pulumi.Output.from_input(f"arn:aws:s3:::{spec.existing_bucket}")
            self.kms_key_arn = pulumi.Output.from_input(spec.existing_kms_key_arn)  # type: ignore[arg-type]  # set with existingBucket (StorageSpec)
        else:
            self._create(name, args)
        self.warehouse_uri = self.bucket_name.apply(lambda b: f"s3://{b}/{spec.warehouse_prefix}")
        self.register_outputs(
            {"bucketName": self.bucket_name, "kmsKeyArn": self.kms_key_arn, "warehouseUri": self.warehouse_uri}
        )

    def _create(self, name: str, args: LakehouseStorageArgs) -> None:
        # The tables' data outlives `pulumi destroy` unless the user opts in: the bucket, every setting that keeps
        # it private and encrypted, and the key without which its objects cannot be read, all stay together.
        child = pulumi.ResourceOptions(parent=self, retain_on_delete=not args.spec.force_destroy)
        key = aws.kms.Key(
            f"{name}-key",
            description="icefloe lakehouse data key",
            enable_key_rotation=True,
            deletion_window_in_days=30,
            tags=args.tags,
            opts=child,
        )
        bucket = aws.s3.Bucket(
            f"{name}-bucket",
            force_destroy=args.spec.force_destroy,  # opted in: destroy deletes the objects too
            tags={**args.tags, TAG_ROLE: ROLE_LAKEHOUSE},
            opts=child,
        )
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-encryption",
            bucket=bucket.id,
            rules=[
                aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                    apply_server_side_encryption_by_default=aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                        sse_algorithm="aws:kms", kms_master_key_id=key.arn
                    ),
                    # S3 Bucket Keys: objects' data keys come from a bucket-level key, so S3 calls KMS far less.
                    bucket_key_enabled=True,
                )
            ],
            opts=child,
        )
        aws.s3.BucketVersioning(
            f"{name}-versioning",
            bucket=bucket.id,
            versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(status="Enabled"),
            opts=child,
        )
        aws.s3.BucketPublicAccessBlock(
            f"{name}-public-access",
            bucket=bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=child,
        )
        # ACLs off: the bucket owner owns every object (AWS's default for new buckets, stated so drift shows).
        aws.s3.BucketOwnershipControls(
            f"{name}-ownership",
            bucket=bucket.id,
            rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"),
            opts=child,
        )
        aws.s3.BucketPolicy(
            f"{name}-tls-only",
            bucket=bucket.id,
            policy=bucket.arn.apply(tls_only_policy),
            opts=child,
        )
        aws.s3.BucketLifecycleConfiguration(
            f"{name}-lifecycle",
            bucket=bucket.id,
            rules=[
                aws.s3.BucketLifecycleConfigurationRuleArgs(
                    id="abort-incomplete-multipart-uploads",
                    status="Enabled",
                    filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
                    abort_incomplete_multipart_upload=aws.s3.BucketLifecycleConfigurationRuleAbortIncompleteMultipartUploadArgs(
                        days_after_initiation=7
                    ),
                ),
                aws.s3.BucketLifecycleConfigurationRuleArgs(
                    id="expire-old-versions",
                    status="Enabled",
                    filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
                    noncurrent_version_expiration=aws.s3.BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
                        noncurrent_days=args.spec.noncurrent_version_days
                    ),
                ),
            ],
            opts=child,
        )
        self.bucket_name = bucket.bucket
        self.bucket_arn = bucket.arn
        self.kms_key_arn = key.arn


def tls_only_policy(bucket_arn: str) -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "DenyInsecureTransport",
                    "Effect": "Deny",
                    "Principal": "*",
                    "Action": "s3:*",
                    "Resource": [bucket_arn, f"{bucket_arn}/*"],
                    "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                }
            ],
        }
    )
