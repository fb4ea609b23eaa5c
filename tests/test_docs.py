"""The README and docs/ stay true: their stack config validates, every config key is documented, CI runs the
README's test command. (The site's links are checked by `mkdocs build --strict` in .ci/run.)"""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from pydantic import BaseModel

from icefloe.spec import (
    DEPLOYMENT_KEYS,
    AlarmSpec,
    MaintenanceSpec,
    SchemaRegistrySpec,
    SourceCluster,
    TableSpec,
    TlsSpec,
    namespaced,
    parse_config,
)
from icefloe_infra.deployment import load_stack_config

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()


def fenced(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.M | re.S)


def stack_files(text: str) -> list[dict]:
    """The YAML blocks of a page that are whole stack files (`config:` at the top)."""
    return [
        document["config"]
        for block in fenced(text, "yaml")
        if (document := yaml.safe_load(block)) and "config" in document
    ]


def test_the_readme_stack_file_is_a_valid_stack():
    (config,) = stack_files(README)
    spec, _ = load_stack_config(namespaced(config), "README.md")
    assert [table.topic for table in spec.tables] == ["stock_trades"]


def test_the_configuration_example_is_valid():
    (config,) = stack_files(CONFIGURATION)
    assert parse_config(namespaced(config), "docs/configuration.md").tables


def test_ci_runs_the_readme_commands():
    commands = [line for block in fenced(README, "bash") for line in block.splitlines() if line.startswith("./")]
    assert commands == [
        "./scripts/setup.sh && .venv/bin/icefloe demo",
        "./scripts/setup.sh && .venv/bin/python -m pytest -n 2 --dist loadfile",
    ]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert "./scripts/setup.sh" in ci and commands[1].split(" && ")[1] in ci


def keys(model: type[BaseModel]) -> set[str]:
    return {field.alias or name for name, field in model.model_fields.items()}


def test_every_config_key_is_in_the_configuration_reference():
    documented = set(re.findall(r"^\| `([A-Za-z.:]+)`", CONFIGURATION, flags=re.M))
    for model in (SourceCluster, SchemaRegistrySpec, TlsSpec, TableSpec, MaintenanceSpec, AlarmSpec):
        assert keys(model) <= documented, (model.__name__, sorted(keys(model) - documented))
    assert {f"icefloe:{key}" for key in DEPLOYMENT_KEYS} <= documented
