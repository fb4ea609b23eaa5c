"""`icefloe plan`: the deploy dry run a user runs before `pulumi up`, end to end through the `icefloe` command.

The command runs as a user runs it (a subprocess of the installed entry point), with jvm/lib pointed at stand-in
jars (ICEFLOE_JVM_LIB), so Maven need not have run. What it prints is checked against the program's own
registrations under the test harness's mocks.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from icefloe.cli import main as cli_main
from icefloe_infra import iam as iam_module
from pulumi_mocks import decrypted_value, fake_jar_dir, run_program

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "Pulumi.example.yaml"
MINIMAL = ROOT / "examples" / "Pulumi.minimal.yaml"
ICEFLOE = Path(sys.executable).with_name("icefloe")


@pytest.fixture(autouse=True)
def _collect_after_failed_programs():
    yield
    gc.collect()


@pytest.fixture(scope="module")
def jvm_lib(tmp_path_factory) -> Path:
    """A jvm/lib with stand-in Spark jars, as ICEFLOE_JVM_LIB."""
    lib = tmp_path_factory.mktemp("jvm-lib")
    fake_jar_dir(lib / "spark")
    return lib


def plan(config: Path, jvm_lib: Path, *flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ICEFLOE_JVM_LIB": str(jvm_lib)}
    return subprocess.run(
        [str(ICEFLOE), "plan", "--config", str(config), *flags], capture_output=True, text=True, env=env, timeout=300
    )


def stack(tmp_path: Path, name: str, base: Path = MINIMAL, **changes) -> Path:
    document = yaml.safe_load(base.read_text())
    for key, value in changes.items():
        if value is None:
            document["config"].pop(key)
        else:
            document["config"][key] = value
    path = tmp_path / f"Pulumi.{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_plan_of_the_example_prints_resources_tables_and_the_pack_verdict(jvm_lib):
    result = plan(EXAMPLE, jvm_lib)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    declared = [r for r in run_program(EXAMPLE, jar_dir=jvm_lib / "spark") if r.custom]
    assert f"Resources `pulumi up` would create ({len(declared)}):" in out
    for resource in declared:
        assert f"  {resource.type}  {resource.name}\n" in out
    # The settings a reviewer looks for: encryption, trust and its ExternalId, the release and its Python.
    assert "sseAlgorithm: aws:kms\n" in out and "enableKeyRotation: true\n" in out
    assert "trusts: AWS:arn:aws:iam::210987654321:user/snowflake-integration (sts:ExternalId required)" in out
    assert "releaseLabel: emr-7.12.0\n" in out and "image: the release's own\n" in out
    assert "  main.stock_trades: batch, rate(15 minutes), each job stopped after 60 min\n" in out
    assert "  main.accounts: batch, rate(5 minutes), each job stopped after 30 min\n" in out
    assert "  main.clickstream: continuous, rate(60 minutes), each job stopped after 60 min\n" in out
    assert "  main.audit_log: disabled, no schedule\n" in out
    assert "  spark.executorEnv.PYSPARK_PYTHON=/usr/bin/python3.11\n" in out
    assert "      /usr/share/aws/iceberg/lib/iceberg-spark3-runtime.jar\n" in out
    assert "/spark-sql-kafka-0-10_2.12-3.5.7.jar\n" in out
    assert "Policy pack: passed (0 mandatory," in out
    # No secret: neither the ExternalId given in config nor the (placeholder) registry password.
    password = decrypted_value(
        yaml.safe_load(EXAMPLE.read_text())["config"]["icefloe:secrets"]["registry"]["password"]["secure"]
    )
    assert "MYORG_SFCRole" not in out and password not in out and "secretString: [secret]" in out
    assert result.stderr == ""


def test_plan_as_json_for_each_example_stack(jvm_lib):
    for path, tables in ((EXAMPLE, 4), (MINIMAL, 1)):
        result = plan(path, jvm_lib, "--json")
        assert result.returncode == 0, result.stderr
        document = json.loads(result.stdout)
        assert document["stack"] == path.name.removeprefix("Pulumi.").removesuffix(".yaml")
        assert len(document["tables"]) == tables and document["violations"] == []
        application = next(r for r in document["resources"] if r["type"] == "aws:emrserverless/application:Application")
        assert application["settings"]["releaseLabel"] == "emr-7.12.0"
        first = document["tables"][0]
        assert first["run"] == "batch" and first["schedule"] == "rate(15 minutes)"
        assert first["spark"]["spark.emr-serverless.driverEnv.PYSPARK_PYTHON"] == "/usr/bin/python3.11"


def test_plan_of_a_broken_stack_names_the_key_and_exits_2(jvm_lib, tmp_path):
    typo = stack(
        tmp_path, "typo", **{"icefloe:tables": [{"sourceCluster": "events", "topic": "orders", "format": "avr"}]}
    )
    result = plan(typo, jvm_lib)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("icefloe plan: invalid stack: ")
    assert "icefloe:tables[0] (orders).format: Input should be 'avro', 'json'" in result.stderr


@pytest.mark.parametrize(
    "name, changes, expected",
    [
        (
            "release",
            {"icefloe:emr": {"releaseLabel": "emr-6.15.0"}},
            "icefloe:emr.releaseLabel: 'emr-6.15.0' is not a release icefloe runs on",
        ),
        ("unknown", {"icefloe:tabels": []}, "unknown key(s) icefloe:tabels"),
        ("noowner", {"icefloe:owner": None}, "Stack 'noowner' is missing configuration value(s) icefloe:owner"),
        (
            "byo",
            {"icefloe:storage": {"existingBucket": "corp-lake"}},
            "icefloe:storage: existingBucket needs existingKmsKeyArn",
        ),
    ],
)
def test_every_kind_of_stack_error_is_a_named_exit_2(jvm_lib, tmp_path, monkeypatch, capsys, name, changes, expected):
    monkeypatch.setenv("ICEFLOE_JVM_LIB", str(jvm_lib))
    assert cli_main(["plan", "--config", str(stack(tmp_path, name, **changes))]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and expected in captured.err


def test_plan_without_the_jars_says_to_run_setup(tmp_path):
    (tmp_path / "spark").mkdir()
    result = plan(MINIMAL, tmp_path)
    assert result.returncode == 2
    assert "the jobs' jars are missing from" in result.stderr and "run scripts/setup.sh" in result.stderr


def test_plan_fails_an_unsafe_stack_without_printing_the_credential(jvm_lib, tmp_path):
    leaked = "Tr0ub4dor&3xyz!"
    result = plan(stack(tmp_path, "leaky", **{"icefloe:tags": {"db-password": leaked}}), jvm_lib)
    assert result.returncode == 1, result.stderr
    assert "Policy pack: FAILED (" in result.stdout
    assert "  mandatory no-plaintext-credentials [" in result.stdout
    assert leaked not in result.stdout + result.stderr
    assert '"db-password": "[secret]"' in result.stdout


def test_plan_fails_when_the_program_grants_too_much(jvm_lib, monkeypatch, capsys):
    # An external role without the ExternalId condition (a program defect, not a config one): the pack catches it.
    monkeypatch.setenv("ICEFLOE_JVM_LIB", str(jvm_lib))
    monkeypatch.setattr(
        iam_module,
        "external_trust",
        lambda principal, _id: iam_module.policy(
            {"Effect": "Allow", "Principal": {"AWS": principal}, "Action": "sts:AssumeRole"}
        ),
    )
    assert cli_main(["plan", "--config", str(EXAMPLE)]) == 1
    out = capsys.readouterr().out
    assert "mandatory iam-external-trust-requires-external-id [icefloe-snowflake-role]" in out
    assert "trusts: AWS:arn:aws:iam::210987654321:user/snowflake-integration\n" in out


def test_the_runtime_cli_does_not_import_pulumi():
    # `plan` plugs in through icefloe_infra.command, which must stay light: Pulumi loads only when the plan runs.
    code = (
        "import sys, icefloe.cli; icefloe.cli.build_parser()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pulumi', 'pulumi_aws', 'icefloe_infra')\n"
        "             and m not in ('icefloe_infra', 'icefloe_infra.command')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr
