"""S3 ACLs: nothing made public through an ACL, and ACLs switched off on the lakehouse bucket.

ACLs are a second way into a bucket beside its policy, one that the policy rules cannot see. A public canned
ACL or a grant to the AllUsers/AuthenticatedUsers groups opens a bucket or object to everyone (for
AuthenticatedUsers: every AWS account). `BucketOwnerEnforced` object ownership disables ACLs altogether,
so only policies decide access. AWS has made it the default for new buckets (April 2023), which is why a
lakehouse bucket that declares no ownership controls is only an advisory finding; declaring it keeps the
setting in the program, where an edit or an imported older bucket cannot silently differ.
"""

from __future__ import annotations

from collections.abc import Iterator

from pulumi_policy import (
    EnforcementLevel,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    Severity,
    StackValidationArgs,
    StackValidationPolicy,
)

from . import tokens
from .constants import TAG_ROLE
from .props import UNKNOWN, as_list, get, known
from .remedy import message
from .stack import attached, is_lakehouse, of_type

PUBLIC_CANNED_ACLS = ("public-read", "public-read-write", "authenticated-read")
PUBLIC_GROUPS = ("AllUsers", "AuthenticatedUsers")  # http://acs.amazonaws.com/groups/global/<group>
BUCKET_OWNER_ENFORCED = "BucketOwnerEnforced"


def _public_group(uri: object) -> str | None:
    group = str(uri or "").rstrip("/").rsplit("/", 1)[-1]
    return group if "acs.amazonaws.com/groups/global/" in str(uri) and group in PUBLIC_GROUPS else None


def _grants(args: ResourceValidationArgs) -> Iterator[tuple[object, object]]:
    """(grantee URI, permission) of the resource's ACL grants."""
    if args.resource_type in tokens.BUCKET:  # grants: [{type, uri | id, permissions}]
        for grant in as_list(get(args.props, "grants")):
            yield get(grant, "uri"), ", ".join(map(str, as_list(get(grant, "permissions"))))
    elif args.resource_type in tokens.BUCKET_ACL:  # accessControlPolicy.grants: [{grantee: {type, uri}, permission}]
        for grant in as_list(get(args.props, "accessControlPolicy", "grants")):
            yield get(grant, "grantee", "uri"), get(grant, "permission")


def _validate_public_acl(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type not in tokens.BUCKET | tokens.BUCKET_ACL | tokens.BUCKET_OBJECT:
        return
    found = []
    acl = get(args.props, "acl")
    if acl in PUBLIC_CANNED_ACLS:
        found.append(f"canned ACL '{acl}'")
    for uri, permission in _grants(args):
        if group := _public_group(uri):
            found.append(f"{permission} to the {group} group")
    if found:
        report(
            message(
                f"'{args.name}' ({args.resource_type.split(':')[-1]}) is made public by its ACL ({', '.join(found)}): "
                "everyone (AuthenticatedUsers: every AWS account) can reach the data, whatever the bucket policy says.",
                "drop the ACL (keep 'private' or none) and grant access in the bucket policy to named principals; "
                "set the bucket's object ownership to BucketOwnerEnforced so ACLs are ignored.",
            )
        )


def _lakehouse_buckets(args: StackValidationArgs):
    return [b for b in of_type(args.resources, tokens.BUCKET) if is_lakehouse(b)]


def _validate_owner_enforced(args: StackValidationArgs, report: ReportViolation) -> None:
    for bucket in _lakehouse_buckets(args):
        for controls in attached(args.resources, tokens.BUCKET_OWNERSHIP_CONTROLS, bucket):
            ownership = known(controls.props, "rule", "objectOwnership")
            if ownership is not UNKNOWN and ownership != BUCKET_OWNER_ENFORCED:
                report(
                    message(
                        f"Bucket '{bucket.name}' sets object ownership '{ownership}', which keeps ACLs in force: objects "
                        "written by other accounts stay theirs and an ACL can open them to the public.",
                        f"set rule.object_ownership to '{BUCKET_OWNER_ENFORCED}' in its aws.s3.BucketOwnershipControls "
                        f"(a bucket that is not the lakehouse can opt out with the tag {TAG_ROLE}=<its role>).",
                    ),
                    controls.urn,
                )


def _validate_ownership_declared(args: StackValidationArgs, report: ReportViolation) -> None:
    for bucket in _lakehouse_buckets(args):
        if not attached(args.resources, tokens.BUCKET_OWNERSHIP_CONTROLS, bucket):
            report(
                message(
                    f"Bucket '{bucket.name}' declares no object ownership, so whether ACLs are disabled depends on "
                    f"AWS's default for new buckets ({BUCKET_OWNER_ENFORCED} since April 2023) rather than on the program.",
                    f"add an aws.s3.BucketOwnershipControls for it with rule object_ownership '{BUCKET_OWNER_ENFORCED}'.",
                ),
                bucket.urn,
            )


NO_PUBLIC_ACL = ResourceValidationPolicy(
    name="s3-no-public-acl",
    description="No bucket, BucketAcl or object has a public canned ACL (public-read, public-read-write, "
    "authenticated-read) or an ACL grant to the AllUsers or AuthenticatedUsers group.",
    validate=_validate_public_acl,
    severity=Severity.CRITICAL,
    remediation_steps="Remove the public ACL; grant access through the bucket policy to named principals.",
)
OWNER_ENFORCED = StackValidationPolicy(
    name="s3-bucket-owner-enforced",
    description=f"The lakehouse bucket's ownership controls, if declared, are {BUCKET_OWNER_ENFORCED} (ACLs disabled).",
    validate=_validate_owner_enforced,
    severity=Severity.HIGH,
    remediation_steps=f"Set object_ownership to {BUCKET_OWNER_ENFORCED} in aws.s3.BucketOwnershipControls.",
)
OWNERSHIP_DECLARED = StackValidationPolicy(
    name="s3-bucket-ownership-declared",
    description=f"The lakehouse bucket declares aws.s3.BucketOwnershipControls (advisory: AWS defaults new buckets "
    f"to {BUCKET_OWNER_ENFORCED}).",
    validate=_validate_ownership_declared,
    enforcement_level=EnforcementLevel.ADVISORY,
    severity=Severity.LOW,
    remediation_steps=f"Add aws.s3.BucketOwnershipControls with object_ownership {BUCKET_OWNER_ENFORCED}.",
)

POLICIES = [NO_PUBLIC_ACL, OWNER_ENFORCED, OWNERSHIP_DECLARED]
