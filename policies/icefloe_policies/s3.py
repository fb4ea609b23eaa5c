"""S3 buckets: KMS encryption, public access blocked, TLS only, versioning.

These are stack rules because each property lives in its own resource beside the bucket
(pulumi-aws 7 deprecates the inline bucket arguments), so "every bucket has one" can only be checked
across the whole stack. They run at the end of `pulumi preview`, and `pulumi up` previews first, so a
violation stops the update before anything is created.
"""

from __future__ import annotations

from pulumi_policy import PolicyResource, ReportViolation, Severity, StackValidationArgs, StackValidationPolicy

from . import tokens
from .constants import TAG_ROLE
from .documents import DocumentError, parse
from .props import UNKNOWN, known
from .remedy import message
from .stack import attached, is_lakehouse, of_type

KMS_ALGORITHMS = {"aws:kms", "aws:kms:dsse"}
PUBLIC_ACCESS_SETTINGS = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")


def _buckets(args: StackValidationArgs) -> list[PolicyResource]:
    return of_type(args.resources, tokens.BUCKET)


def _uses_kms(config: PolicyResource) -> bool | None:
    """True/False once the algorithm is known; None while it is not (preview)."""
    rules = known(config.props, "rules", default=[])
    if rules is UNKNOWN:
        return None
    algorithms = [known(rules, i, "applyServerSideEncryptionByDefault", "sseAlgorithm") for i in range(len(rules))]
    if UNKNOWN in algorithms:
        return None
    return any(a in KMS_ALGORITHMS for a in algorithms)


def _validate_encryption(args: StackValidationArgs, report: ReportViolation) -> None:
    for bucket in _buckets(args):
        configs = attached(args.resources, tokens.BUCKET_SSE, bucket)
        if not configs:
            report(
                message(
                    f"Bucket '{bucket.name}' has no server-side encryption configuration.",
                    "add an aws.s3.BucketServerSideEncryptionConfiguration for it with sse_algorithm "
                    "'aws:kms' (or 'aws:kms:dsse') and kms_master_key_id set to the stack's KMS key.",
                ),
                bucket.urn,
            )
        elif not any(_uses_kms(c) in (True, None) for c in configs):
            report(
                message(
                    f"Bucket '{bucket.name}' is encrypted without KMS (SSE-S3/AES256), so access to the data "
                    "is not governed by the key policy.",
                    "set sse_algorithm to 'aws:kms' (or 'aws:kms:dsse') with kms_master_key_id in its "
                    "BucketServerSideEncryptionConfiguration.",
                ),
                configs[0].urn,
            )


def _blocks_everything(block: PolicyResource) -> bool:
    # An unknown setting is computed from an output, which icefloe never does; count it as off.
    return all(known(block.props, setting) is True for setting in PUBLIC_ACCESS_SETTINGS)


def _validate_public_access(args: StackValidationArgs, report: ReportViolation) -> None:
    for bucket in _buckets(args):
        blocks = attached(args.resources, tokens.BUCKET_PUBLIC_ACCESS_BLOCK, bucket)
        if not blocks:
            report(
                message(
                    f"Bucket '{bucket.name}' has no public access block, so an ACL or bucket policy can make it "
                    "public.",
                    "add an aws.s3.BucketPublicAccessBlock for it with block_public_acls, block_public_policy, "
                    "ignore_public_acls and restrict_public_buckets all True.",
                ),
                bucket.urn,
            )
        elif not any(_blocks_everything(b) for b in blocks):
            off = [s for s in PUBLIC_ACCESS_SETTINGS if known(blocks[0].props, s) is not True]
            report(
                message(
                    f"Bucket '{bucket.name}' has a public access block with {', '.join(off)} not enabled.",
                    "set all four settings of its BucketPublicAccessBlock to True.",
                ),
                blocks[0].urn,
            )


def _denies_insecure_transport(document) -> bool:
    for statement in parse(document):
        everyone = ("AWS", "*") in statement.principals
        all_s3 = any(a in ("*", "s3:*") for a in statement.actions)
        objects = any(r == "*" or r.endswith("/*") for r in statement.resources)
        insecure = [str(v).lower() for v in statement.condition_values("Bool", "aws:SecureTransport")]
        if statement.effect == "Deny" and everyone and all_s3 and objects and insecure == ["false"]:
            return True
    return False


def _validate_tls(args: StackValidationArgs, report: ReportViolation) -> None:
    for bucket in _buckets(args):
        verdicts = []
        for bucket_policy in attached(args.resources, tokens.BUCKET_POLICY, bucket):
            document = known(bucket_policy.props, "policy")
            if document is UNKNOWN:  # built from outputs during preview; checked again by `pulumi up`
                verdicts.append(True)
                continue
            try:
                verdicts.append(_denies_insecure_transport(document))
            except DocumentError:
                verdicts.append(False)
        if not any(verdicts):
            report(
                message(
                    f"Bucket '{bucket.name}' accepts requests without TLS: no bucket policy denies them.",
                    "attach an aws.s3.BucketPolicy with a statement {Effect: Deny, Principal: '*', Action: 's3:*', "
                    "Resource: [bucket ARN, bucket ARN + '/*'], Condition: {Bool: {'aws:SecureTransport': 'false'}}}.",
                ),
                bucket.urn,
            )


def _validate_versioning(args: StackValidationArgs, report: ReportViolation) -> None:
    for bucket in filter(is_lakehouse, _buckets(args)):
        statuses = [
            known(v.props, "versioningConfiguration", "status")
            for v in attached(args.resources, tokens.BUCKET_VERSIONING, bucket)
        ]
        if not any(s in ("Enabled", UNKNOWN) for s in statuses):
            report(
                message(
                    f"Bucket '{bucket.name}' is not versioned, so an overwritten or deleted Iceberg data or "
                    "metadata file cannot be recovered.",
                    "add an aws.s3.BucketVersioning for it with versioning_configuration status 'Enabled' "
                    f"(a bucket that is not the lakehouse can opt out with the tag {TAG_ROLE}=<its role>).",
                ),
                bucket.urn,
            )


ENCRYPTION = StackValidationPolicy(
    name="s3-bucket-kms-encryption",
    description="Every S3 bucket has a server-side encryption configuration using KMS (aws:kms or aws:kms:dsse).",
    validate=_validate_encryption,
    severity=Severity.HIGH,
    remediation_steps="Add aws.s3.BucketServerSideEncryptionConfiguration with sse_algorithm 'aws:kms' and the "
    "stack's KMS key.",
)
PUBLIC_ACCESS_BLOCK = StackValidationPolicy(
    name="s3-bucket-public-access-block",
    description="Every S3 bucket has a public access block with all four settings enabled.",
    validate=_validate_public_access,
    severity=Severity.CRITICAL,
    remediation_steps="Add aws.s3.BucketPublicAccessBlock with all four settings True.",
)
DENY_INSECURE_TRANSPORT = StackValidationPolicy(
    name="s3-bucket-deny-insecure-transport",
    description="Every S3 bucket has a bucket policy that denies requests made without TLS "
    "(aws:SecureTransport = false).",
    validate=_validate_tls,
    severity=Severity.HIGH,
    remediation_steps="Attach a BucketPolicy denying s3:* to '*' when aws:SecureTransport is false.",
)
VERSIONING = StackValidationPolicy(
    name="s3-bucket-versioning",
    description=f"The lakehouse bucket (every bucket unless tagged {TAG_ROLE} with another role) has "
    "versioning enabled.",
    validate=_validate_versioning,
    severity=Severity.MEDIUM,
    remediation_steps="Add aws.s3.BucketVersioning with status 'Enabled'.",
)

POLICIES = [ENCRYPTION, PUBLIC_ACCESS_BLOCK, DENY_INSECURE_TRANSPORT, VERSIONING]
