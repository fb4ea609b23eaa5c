"""`pulumi up` entry point (Pulumi.yaml: main: infra/). Everything lives in the importable icefloe_infra package."""

from icefloe_infra.program import run

run()
