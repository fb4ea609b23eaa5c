"""The pack's entry point, run the way the Pulumi CLI runs it and spoken to over the analyzer gRPC protocol.

The CLI starts `python -u policies/` in a virtualenv built from policies/requirements.txt, where icefloe
is not installed; `-S` plus PYTHONPATH=site-packages reproduces that (the editable install's .pth hook
is not loaded), so `import icefloe_policies` has to work from the pack directory alone.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import sysconfig
from pathlib import Path

import grpc
import pytest
from google.protobuf import empty_pb2, struct_pb2
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc

from icefloe_policies.pack import all_policies

POLICIES_DIR = Path(__file__).resolve().parents[2] / "policies"


@pytest.fixture(scope="module")
def analyzer():
    env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]}
    process = subprocess.Popen(
        [sys.executable, "-S", "-u", str(POLICIES_DIR)],
        cwd=POLICIES_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready, _, _ = select.select([process.stdout], [], [], 60)
        port = process.stdout.readline().strip() if ready else ""
        exited = process.poll() is not None
        assert port.isdigit(), f"pack did not start: {port!r} {process.stderr.read() if exited else ''}"
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        yield analyzer_pb2_grpc.AnalyzerStub(channel)
        channel.close()
    finally:
        process.kill()
        process.wait(10)


def struct(props: dict) -> struct_pb2.Struct:
    value = struct_pb2.Struct()
    value.update(props)
    return value


SNOWFLAKE_ROLE = analyzer_pb2.AnalyzeRequest(
    type="aws:iam/role:Role",
    name="snowflake-access",
    urn="urn:pulumi:dev::icefloe::aws:iam/role:Role::snowflake-access",
    properties=struct(
        {
            "assumeRolePolicy": json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Principal": {"AWS": "arn:aws:iam::999988887777:user/sf"},
                            "Action": "sts:AssumeRole",
                        }
                    ],
                }
            )
        }
    ),
)


def test_pack_describes_every_policy(analyzer):
    info = analyzer.GetAnalyzerInfo(empty_pb2.Empty())
    assert info.name == "icefloe-safety" and info.supportsConfig
    assert {p.name for p in info.policies} == {p.name for p in all_policies()}
    levels = {p.name: p.enforcementLevel for p in info.policies}
    assert levels["scheduler-dead-letter"] == analyzer_pb2.ADVISORY
    assert levels["s3-bucket-kms-encryption"] == analyzer_pb2.MANDATORY
    schema = next(p for p in info.policies if p.name == "iam-external-trust-requires-external-id").configSchema
    assert "accountId" in schema.properties


def test_resource_violation_is_mandatory_until_configured_otherwise(analyzer):
    analyzer.Configure(analyzer_pb2.ConfigureAnalyzerRequest())
    [diagnostic] = analyzer.Analyze(SNOWFLAKE_ROLE).diagnostics
    assert diagnostic.policyName == "iam-external-trust-requires-external-id"
    assert diagnostic.enforcementLevel == analyzer_pb2.MANDATORY

    analyzer.Configure(
        analyzer_pb2.ConfigureAnalyzerRequest(
            policyConfig={
                "iam-external-trust-requires-external-id": analyzer_pb2.PolicyConfig(
                    enforcementLevel=analyzer_pb2.ADVISORY
                )
            }
        )
    )
    [diagnostic] = analyzer.Analyze(SNOWFLAKE_ROLE).diagnostics
    assert diagnostic.enforcementLevel == analyzer_pb2.ADVISORY
    analyzer.Configure(analyzer_pb2.ConfigureAnalyzerRequest())


def test_stack_violation_names_the_bucket(analyzer):
    bucket_urn = "urn:pulumi:dev::icefloe::aws:s3/bucket:Bucket::lake"
    request = analyzer_pb2.AnalyzeStackRequest(
        resources=[
            analyzer_pb2.AnalyzerResource(
                type="aws:s3/bucket:Bucket",
                name="lake",
                urn=bucket_urn,
                properties=struct(
                    {"bucket": "lake", "id": "lake", "tags": {"icefloe:stack": "dev", "icefloe:owner": "me"}}
                ),
            )
        ]
    )
    diagnostics = analyzer.AnalyzeStack(request).diagnostics
    assert {d.policyName for d in diagnostics} == {
        "s3-bucket-kms-encryption",
        "s3-bucket-public-access-block",
        "s3-bucket-deny-insecure-transport",
        "s3-bucket-versioning",
        "s3-bucket-ownership-declared",
    }
    assert {d.urn for d in diagnostics} == {bucket_urn}
    assert {d.policyName for d in diagnostics if d.enforcementLevel == analyzer_pb2.ADVISORY} == {
        "s3-bucket-ownership-declared"
    }
