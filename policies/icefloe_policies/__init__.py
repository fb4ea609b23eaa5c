"""icefloe's CrossGuard policy pack: rules that stop a stack which would leak data or grant too much.

Only the constants are imported here, so `from icefloe_policies import TAG_STACK` stays cheap for the
Pulumi program. Rules live in one module per concern; `icefloe_policies.pack` lists them all and
`icefloe_policies.runner` runs them the way the Pulumi engine does.
"""

from .constants import PACK_NAME, ROLE_LAKEHOUSE, TAG_OWNER, TAG_ROLE, TAG_STACK

__all__ = ["PACK_NAME", "ROLE_LAKEHOUSE", "TAG_OWNER", "TAG_ROLE", "TAG_STACK"]
