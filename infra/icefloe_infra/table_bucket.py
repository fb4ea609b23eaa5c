"""An S3 table bucket for the tables (`icefloe:storage.type: s3tables`): the bucket and one namespace per database.

S3 Tables store Iceberg tables and maintain them (compaction and snapshot expiry per table, on by default;
unreferenced file removal per bucket, set here), so icefloe's own maintenance leaves those to it. The tables
themselves are the runtime's: it creates them through the bucket's Iceberg REST endpoint. Kept on `pulumi destroy`
unless `icefloe:storage.forceDestroy` is true, like the lakehouse bucket.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

# Files no snapshot references any more are marked after this many days and deleted this many days later
# (S3 Tables' unreferenced file removal; icefloe's own orphanFileAge default is 3 days).
UNREFERENCED_DAYS = 3
NONCURRENT_DAYS = 10


@dataclass
class TableBucketArgs:
    name: str
    namespaces: list[str]
    force_destroy: bool = False
    tags: dict[str, str] = field(default_factory=dict)


class TableBucket(pulumi.ComponentResource):
    arn: pulumi.Output[str]

    def __init__(self, name: str, args: TableBucketArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("icefloe:storage:TableBucket", name, None, opts)
        keep = pulumi.ResourceOptions(parent=self, retain_on_delete=not args.force_destroy)
        bucket = aws.s3tables.TableBucket(
            f"{name}-bucket",
            name=args.name,
            force_destroy=args.force_destroy,  # opted in: destroy deletes the tables too
            maintenance_configuration=aws.s3tables.TableBucketMaintenanceConfigurationArgs(
                iceberg_unreferenced_file_removal=aws.s3tables.TableBucketMaintenanceConfigurationIcebergUnreferencedFileRemovalArgs(
                    status="enabled",
                    settings=aws.s3tables.TableBucketMaintenanceConfigurationIcebergUnreferencedFileRemovalSettingsArgs(
                        unreferenced_days=UNREFERENCED_DAYS, non_current_days=NONCURRENT_DAYS
                    ),
                )
            ),
            tags=args.tags,
            opts=keep,
        )
        self.namespaces = {
            namespace: aws.s3tables.Namespace(
                f"{name}-{namespace}", namespace=namespace, table_bucket_arn=bucket.arn, opts=keep
            )
            for namespace in args.namespaces
        }
        self.arn = bucket.arn
        self.register_outputs({"arn": self.arn, "namespaces": list(self.namespaces)})
