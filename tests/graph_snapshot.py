"""The graph the mock engine registers, as a reviewable snapshot: `tests/golden/graph/<scenario>.json`.

Every resource of the program, sorted by URN, with its parent, options (secret outputs,
replace-on-changes, ignore-changes, delete-before-replace, retain, timeouts), dependencies, property
dependencies, which inputs are secret, and its inputs (secrets unwrapped: the mock's own values,
never a real one; long strings such as step bundles as their SHA-256). The scenarios cover every
kind of remote step and every previous state that changes what a step is given: a new stack, a
join retried after a failed first `up`, an upgrade and a containerd roll (the order between nodes),
workers in lanes, a kubeconfig renewal.

tests/test_graph_snapshot.py compares the program with these files. A change that is meant to alter
the graph rewrites them, and the diff is part of its review:

    .venv/bin/python -m tests.graph_snapshot --write
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.previous_state import INITIAL_DEPLOYMENT_OUTPUT
from components.tools.offline import OfflineRun, Registration, run_program
from tests.labs import namespace
from tests.test_cluster_graph import failed_first_up

GOLDEN = Path(__file__).resolve().parent / "golden" / "graph"
# Longer strings (bundles, cloud-init documents) are kept as their digest: the snapshot stays readable
# and still changes when a byte of them does.
LONGEST_KEPT_STRING = 160


def _digested(value: Any) -> Any:
    if isinstance(value, str) and len(value) > LONGEST_KEPT_STRING:
        return f"sha256:{hashlib.sha256(value.encode()).hexdigest()} ({len(value)} chars)"
    if isinstance(value, dict):
        return {k: _digested(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_digested(v) for v in value]
    return value


def resource_entry(reg: Registration) -> dict[str, Any]:
    return {
        "urn": reg.urn,
        "parent": reg.parent,
        "custom": reg.custom,
        "dependencies": sorted(reg.dependencies),
        "propertyDependencies": {k: sorted(v) for k, v in sorted(reg.property_dependencies.items()) if v},
        "additionalSecretOutputs": list(reg.additional_secret_outputs),
        "replaceOnChanges": list(reg.replace_on_changes),
        "ignoreChanges": list(reg.ignore_changes),
        "deleteBeforeReplace": reg.delete_before_replace,
        "retainOnDelete": reg.retain_on_delete,
        "customTimeouts": reg.custom_timeouts,
        "secretInputs": sorted(reg.secret_input_keys),
        "inputs": _digested(reg.plain_inputs),
    }


def graph(run: OfflineRun) -> list[dict[str, Any]]:
    """Sorted by URN: registration order depends on when outputs resolve, the graph does not."""
    return sorted((resource_entry(reg) for reg in run.registrations.values()), key=lambda entry: entry["urn"])


def _kubernetes(**changes: Any) -> dict[str, Any]:
    return {"labs-k8s:kubernetes": {**namespace()["kubernetes"], **changes}}


def _four_workers_two_at_once(version: str) -> dict[str, Any]:
    workers = {"hosts": [{"name": f"labs-k8s-w{i:02}", "ip": f"10.3.60.{60 + i}"} for i in range(1, 5)]}
    nodes = {**namespace()["nodes"], "workers": {**namespace()["nodes"]["workers"], **workers}}
    # Two more 60 GiB eager-zeroed disks need a longer vSphere timeout (components/clone_timing.py).
    return {
        "labs-k8s:nodes": nodes,
        "vsphere:apiTimeout": "120",
        **_kubernetes(version=version, upgrade={"workersAtOnce": 2}),
    }


# A self-managed stack made by `make up` (components/previous_state.py INITIAL_DEPLOYMENT_OUTPUT).
MADE_BY_MAKE_UP = {INITIAL_DEPLOYMENT_OUTPUT: "make up"}


def _kubeconfig_expiring(state: dict[str, Any]) -> dict[str, Any]:
    edited = dict(state)
    for urn, entry in state.items():
        if entry["type"] == "pulumi:pulumi:Stack":
            edited[urn] = {**entry, "outputs": {**entry["outputs"], "kubeconfigValidUntil": "2000-01-01T00:00:00Z"}}
    return edited


def scenarios() -> dict[str, Callable[[], OfflineRun]]:
    """Each scenario's run; the runs it builds on are made once."""
    made: dict[str, OfflineRun] = {}

    def once(name: str, make: Callable[[], OfflineRun]) -> Callable[[], OfflineRun]:
        def get() -> OfflineRun:
            if name not in made:
                made[name] = make()
            return made[name]

        return get

    created = once("new-stack", lambda: run_program("labs", overrides=_kubernetes(version="1.35.2")))
    lanes = once("lanes-created", lambda: run_program("labs", overrides=_four_workers_two_at_once("1.35.2")))
    return {
        "new-stack": created,
        "join-retry": once(
            "join-retry",
            lambda: run_program(
                "labs",
                overrides=_kubernetes(version="1.35.2"),
                previous=failed_first_up(created().previous_state(), MADE_BY_MAKE_UP),
            ),
        ),
        "upgrade": once(
            "upgrade",
            lambda: run_program("labs", overrides=_kubernetes(version="1.36.0"), previous=created().previous_state()),
        ),
        "containerd-roll": once(
            "containerd-roll",
            lambda: run_program(
                "labs",
                overrides=_kubernetes(version="1.35.2", containerdVersion="2.1.5"),
                previous=created().previous_state(),
            ),
        ),
        "upgrade-in-lanes": once(
            "upgrade-in-lanes",
            lambda: run_program(
                "labs", overrides=_four_workers_two_at_once("1.36.0"), previous=lanes().previous_state()
            ),
        ),
        "kubeconfig-renewal": once(
            "kubeconfig-renewal",
            lambda: run_program(
                "labs",
                overrides=_kubernetes(version="1.35.2"),
                previous=_kubeconfig_expiring(created().previous_state()),
            ),
        ),
    }


def render(entries: list[dict[str, Any]]) -> str:
    return json.dumps(entries, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.graph_snapshot", description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite tests/golden/graph/*.json from the program")
    args = parser.parse_args(argv)
    GOLDEN.mkdir(parents=True, exist_ok=True)
    changed = 0
    for name, make in scenarios().items():
        path = GOLDEN / f"{name}.json"
        text = render(graph(make()))
        if not path.exists() or path.read_text() != text:
            changed += 1
            print(f"{'wrote' if args.write else 'differs'}: {path.relative_to(Path.cwd())}")
            if args.write:
                path.write_text(text)
    return 0 if args.write or not changed else 1


if __name__ == "__main__":
    sys.exit(main())
