"""The registered graph equals its reviewed snapshot (tests/graph_snapshot.py, tests/golden/graph/).

It pins what the mock engine registers, resource by resource: URNs, parents, options, dependencies
and inputs. A refactoring (remote steps by kind, modules moved) must leave it as it is; a change
meant to alter the graph rewrites the snapshot, and its diff is reviewed with the change.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from tests import graph_snapshot

SCENARIOS = graph_snapshot.scenarios()
FIX = "if the change is meant, run `.venv/bin/python -m tests.graph_snapshot --write` and review the diff"


def differences(golden: list[dict[str, Any]], registered: list[dict[str, Any]]) -> list[str]:
    expected = {entry["urn"]: entry for entry in golden}
    actual = {entry["urn"]: entry for entry in registered}
    found = [f"added {urn}" for urn in sorted(set(actual) - set(expected))]
    found += [f"gone {urn}" for urn in sorted(set(expected) - set(actual))]
    for urn in sorted(set(expected) & set(actual)):
        fields = sorted(key for key in {*expected[urn], *actual[urn]} if expected[urn].get(key) != actual[urn].get(key))
        if fields:
            found.append(f"{urn.rsplit('::', 1)[-1]}: {', '.join(fields)}")
    return found


def registered(scenario: str) -> list[dict[str, Any]]:
    return json.loads(graph_snapshot.render(graph_snapshot.graph(SCENARIOS[scenario]())))


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_the_registered_graph_is_the_reviewed_snapshot(scenario: str) -> None:
    golden = json.loads((graph_snapshot.GOLDEN / f"{scenario}.json").read_text())
    found = differences(golden, registered(scenario))
    assert not found, f"{scenario}: the registered graph differs from its snapshot: {found}; {FIX}"


def test_the_comparison_sees_an_option_a_dependency_and_a_byte_of_a_bundle() -> None:
    golden = registered("new-stack")
    join = next(i for i, e in enumerate(golden) if e["urn"].endswith("::labs-k8s-w01-kubeadm-join"))
    assert golden[join]["inputs"]["stdin"].startswith("sha256:") and "triggers" in golden[join]["replaceOnChanges"]
    for field, change in [
        ("deleteBeforeReplace", lambda e: not e["deleteBeforeReplace"]),
        ("dependencies", lambda e: e["dependencies"][1:]),
        ("inputs", lambda e: {**e["inputs"], "stdin": graph_snapshot._digested("x" * 200)}),
    ]:
        edited = copy.deepcopy(golden)
        edited[join][field] = change(edited[join])
        assert differences(golden, edited) == [f"labs-k8s-w01-kubeadm-join: {field}"]
    assert graph_snapshot._digested("x" * 200) != graph_snapshot._digested("x" * 199 + "y")
