"""Entry point the Pulumi CLI runs for `--policy-pack policies` (with this directory as sys.path[0]).

PolicyPack(...) starts the analyzer's gRPC server and blocks, so nothing may import this file; tests use
icefloe_policies.runner instead.
"""

from pulumi_policy import PolicyPack

from icefloe_policies import PACK_NAME
from icefloe_policies.pack import DEFAULT_ENFORCEMENT, all_policies

PolicyPack(
    name=PACK_NAME,
    policies=all_policies(),
    enforcement_level=DEFAULT_ENFORCEMENT,
    description="icefloe safety: stops stacks that would leak lakehouse data or grant too much.",
)
