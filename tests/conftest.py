"""Shared fixtures: the committed lab config and the program run under Pulumi's mock engine."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

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


# `make test` runs two xdist workers (`-n 2`): the lab in a box, about half the suite's time and
# mostly waiting on its hosts, in one; every other test, in the order it has always run, in the
# other (none of them was written to run beside itself). The box's module fixture runs its
# scenario once either way. A scheduler of our own, not `--dist loadgroup`: xdist 3.8 groups by
# rewriting `item._nodeid`, which pytest 9 no longer reads (Node.nodeid is `_id`), so its groups
# were silently ignored and both workers ran the box.
# tests/test_box_cli.py runs `make box` itself, and tests/test_real_node.py a cluster of the real
# programs: in the box's worker, one after the other, so that the suite never has two boxes or two
# clusters up at once on two cores (beside the real box, m02's etcd learner missed kubeadm's wait).
BOX_MODULES = (
    "tests/test_lab_box.py::", "tests/test_lab_box_real.py::", "tests/test_real_node.py::", "tests/test_box_cli.py::",
)  # fmt: skip


class BoxBesideTheSuite(LoadScopeScheduling):
    def _split_scope(self, nodeid: str) -> str:
        return "box" if nodeid.startswith(BOX_MODULES) else "suite"


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> BoxBesideTheSuite:
    return BoxBesideTheSuite(config, log)
