"""Names shared by the policy pack and the icefloe Pulumi program.

This module imports nothing, so infra code can use the tag keys without pulling in pulumi-policy:

    from icefloe_policies import TAG_STACK, TAG_OWNER
"""

PACK_NAME = "icefloe-safety"

# Every bucket and Glue database icefloe creates carries these tags (rule `icefloe-ownership-tags`).
TAG_STACK = "icefloe:stack"
TAG_OWNER = "icefloe:owner"

# Optional: what a bucket is for. Versioning is required on every bucket unless this tag names a
# role other than the lakehouse (e.g. "scratch"), so forgetting the tag fails safe.
TAG_ROLE = "icefloe:role"
ROLE_LAKEHOUSE = "lakehouse"
