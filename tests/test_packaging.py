"""The wheel's contents: setuptools puts in it only the packages pyproject.toml lists."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_of_the_source_tree_is_listed_for_the_wheel():
    """`pip install .` builds a wheel of `[tool.setuptools] packages` alone: a sub-package left out of the list
    (icefloe.formats.debezium was) is missing from the install, and its import fails there, not in an editable
    checkout, where the folder is found on disk."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    in_tree = set()
    for name, folder in setuptools["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            in_tree.add(".".join((name, *relative.parts)))
    assert in_tree - set(setuptools["packages"]) == set()
    assert "icefloe.formats.debezium" in in_tree
