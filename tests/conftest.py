"""Shared fixtures: one real Tansu broker, one development Schema Registry, one local SparkSession per test run.

Tests that materialize use the runtime's own code paths against these real processes and read the tables back
with independent readers (pyiceberg, DuckDB).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from icefloe.spec import CatalogSpec, IcefloeConfig, parse_config


@pytest.fixture(scope="session")
def state_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("icefloe-state")


@pytest.fixture(scope="session")
def broker(state_dir):
    from icefloe.local.broker import TansuBroker

    with TansuBroker(state_dir / "broker") as running:
        yield running


@pytest.fixture(scope="session")
def registry():
    from icefloe.local.dev_registry import DevSchemaRegistry

    with DevSchemaRegistry() as running:
        yield running


@pytest.fixture(scope="session")
def spark(state_dir):
    from icefloe.session import spark_session

    session = spark_session(CatalogSpec(), state_dir)
    yield session
    session.stop()


@pytest.fixture
def topic(request, broker) -> str:
    """A fresh topic name per test (3 partitions), so tests share the broker without sharing data."""
    name = re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:80]
    return name


@pytest.fixture
def make_config(broker, registry):
    def build(*tables: dict, registry_url: str | None = None, bootstrap: str | None = None) -> IcefloeConfig:
        cluster = {
            "name": "local",
            "bootstrapServers": bootstrap or broker.bootstrap_servers,
            "schemaRegistry": {"url": registry_url or registry.url},
        }
        return parse_config({"sourceClusters": [cluster], "tables": [{"sourceCluster": "local", **t} for t in tables]})

    return build
