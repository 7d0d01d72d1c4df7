"""Shared fixtures: the committed lab config and the program run under Pulumi's mock engine."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

from components.config import LabConfig
from components.tools.offline import OfflineRun, lab_config_from_stack, run_program
from tests.labs import namespace

pytest_plugins = ["tests.vcsim"]


@pytest.fixture(autouse=True, scope="session")
def _no_machine_ca_bundle() -> None:
    """This machine exports REQUESTS_CA_BUNDLE for its own proxies; tests talk to loopback only."""
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        os.environ.pop(name, None)


@pytest.fixture(scope="session")
def lab_config() -> LabConfig:
    """The committed `labs` stack, validated (placeholder SSH key where none is committed)."""
    return lab_config_from_stack("labs")


@pytest.fixture
def lab_namespace() -> dict[str, Any]:
    """The `labs-k8s:` namespace of Pulumi.labs.yaml as plain data, a fresh copy per test."""
    return namespace()


@pytest.fixture(scope="session")
def offline_run() -> OfflineRun:
    """The real __main__.py under the mock engine, once per session (it is read-only)."""
    return run_program("labs")


@pytest.fixture
def run_with() -> Callable[..., OfflineRun]:
    """Run the program with some `labs-k8s:` keys replaced: run_with(nodes={...})."""

    def run(**namespace_overrides: Any) -> OfflineRun:
        return run_program("labs", overrides={f"labs-k8s:{k}": v for k, v in namespace_overrides.items()})

    return run
