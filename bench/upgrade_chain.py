"""The upgrade of the 7-node lab (1.35.2 -> 1.36.0): how many serialized steps, and how long each
node is drained.

Two sources, both the real code:
- the program under the mock engine, before and after the change of labs-k8s:kubernetes.version
  (the after run reads the before run as its previous state): the steps `pulumi up` runs, in its
  order (components.tools.changes.plan_changes), so the serialized chain;
- the real upgrade scripts run node after node on the stand-in cluster (tests/upgrade_harness.py):
  every command each node issues, so what happens between a node's cordon and its uncordon.

Durations cannot be measured here (no vCenter, no real kubeadm): each command the scripts issued is
given an estimate for a small vSphere lab with a local mirror (ESTIMATE_SECONDS, stated below), and
the windows are sums of those. Replace them with a real run's figures.

    .venv/bin/python bench/upgrade_chain.py
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.tools.changes import plan_changes
from components.tools.offline import run_program
from tests.labs import make_lab_config, namespace
from tests.upgrade_harness import FakeCluster, build_cluster, run_chain

BEFORE, AFTER = "1.35.2", "1.36.0"
UPGRADE_SUFFIXES = ("-upgrade", "-upgrade-drain", "-upgrade-uncordon")

# Estimated seconds per command the upgrade scripts issue (a small lab, packages and images from a
# local mirror, etcd of a few MB). Not measured here.
ESTIMATE_SECONDS = {
    "apt-get update": 15,
    "apt-get install kubeadm": 20,
    "apt-get install kubelet kubectl": 25,
    "kubeadm upgrade plan": 10,
    "etcdctl snapshot save": 5,
    # Pulls four images, then restarts etcd, kube-apiserver, -controller-manager, -scheduler one by
    # one, each waiting for its new static pod to be healthy; plus CoreDNS and kube-proxy.
    "kubeadm upgrade apply": 180,
    "kubeadm upgrade node (control plane)": 150,
    "kubeadm upgrade node (worker)": 10,
    "kubectl drain": 30,  # evictions of a lab's workloads; bounded at 300 s
    "prepare-node.sh": 15,
    "systemctl restart kubelet": 30,  # until the node reports Ready at the new version
    "kubectl uncordon": 1,
}


def version(value: str) -> dict:
    return {"labs-k8s:kubernetes": {**namespace()["kubernetes"], "version": value}}


@dataclass(frozen=True)
class GraphFigures:
    waves: int  # the distinct step numbers of the change plan: steps with one number run in parallel
    chain: list[tuple[int, list[str]]]  # (wave, upgrade steps in it), in order


def graph_figures() -> GraphFigures:
    created = run_program("labs", overrides=version(BEFORE))
    upgraded = run_program("labs", overrides=version(AFTER), previous=created.previous_state())
    plan = plan_changes(created, upgraded)
    # The upgrade steps where they run (replaced: run again), not where the engine deletes the old ones.
    chain = [
        (step.order, [n for n in step.names if n.endswith(UPGRADE_SUFFIXES)])
        for step in plan.steps
        if step.kind in ("replace", "create replacement")
    ]
    return GraphFigures(waves=len({step.order for step in plan.steps}), chain=[(o, n) for o, n in chain if n])


def print_graph_figures(figures: GraphFigures) -> None:
    print(f"pulumi up after labs-k8s:kubernetes.version {BEFORE} -> {AFTER} (7-node lab, workersAtOnce=1):")
    print(
        f"  {figures.waves} waves of steps (steps in one wave run in parallel; the last deletes the replaced "
        "ones); the upgrade chain within them:"
    )
    for wave, names in figures.chain:
        print(f"    wave {wave:>2}: {', '.join(names)}")
    print(
        f"  {sum(len(names) for _, names in figures.chain)} serialized upgrade steps (3 control planes, "
        f"3 per worker) in {len(figures.chain)} waves; the {figures.waves - len(figures.chain)} other waves: "
        "prepare, init, refresh and join (they find their node done), kubeconfig, verify-cluster, the deletes"
    )


def classify(node: str, command: str, args: list[str]) -> str | None:
    words = [a for a in args if not a.startswith("-")]
    if command == "apt-get" and words[:1] == ["update"]:
        return "apt-get update"
    if command == "apt-get" and words[:1] == ["install"]:
        packages = sorted(w.split("=")[0] for w in words[1:] if "=" in w and "::" not in w)
        if packages == ["kubeadm"]:
            return "apt-get install kubeadm"
        if packages == ["kubectl", "kubelet"]:
            return "apt-get install kubelet kubectl"
        return None
    if command == "kubeadm" and words[:2] == ["upgrade", "plan"]:
        return "kubeadm upgrade plan"
    if command == "kubeadm" and words[:2] == ["upgrade", "apply"]:
        return "kubeadm upgrade apply"
    if command == "kubeadm" and words[:2] == ["upgrade", "node"]:
        return "kubeadm upgrade node (worker)" if "-w" in node else "kubeadm upgrade node (control plane)"
    if command == "kubectl" and "snapshot" in args:
        return "etcdctl snapshot save"
    if command == "kubectl" and "drain" in args:
        return "kubectl drain"
    if command == "kubectl" and "uncordon" in args:
        return "kubectl uncordon"
    if command == "systemctl" and args[:2] == ["restart", "kubelet"]:
        return "systemctl restart kubelet"
    if command == "kubeadm" and words[:2] == ["config", "images"]:
        return "prepare-node.sh"  # the re-run of the node's preparation asks kubeadm for its pause image
    return None


@dataclass(frozen=True)
class ScriptFigures:
    commands: int  # the timed commands the scripts issued, node after node
    total_seconds: int  # their estimated durations, summed
    drained: list[tuple[str, int, list[str]]]  # (node, seconds from drain to uncordon, commands in between)
    most_drained_at_once: int


def script_figures(cluster: FakeCluster) -> ScriptFigures:
    """Run the upgrade chain on `cluster` (five nodes at BEFORE, tests/upgrade_harness.build_cluster)
    and time what its scripts issued."""
    cluster.reset_log()
    run = run_chain(cluster, make_lab_config(kubernetes={"version": AFTER}))
    if run.failed:
        raise RuntimeError(f"{run.failed} failed:\n{run.stderr(run.failed)}")
    timeline: list[tuple[str, str, int]] = []
    for node, command, *args in cluster.calls():
        kind = classify(node, command, args)
        if kind is not None:
            target = next((a for a in args if a.startswith("labs-k8s-")), node) if command == "kubectl" else node
            timeline.append((kind, target, ESTIMATE_SECONDS[kind]))
    drained: list[tuple[str, int, list[str]]] = []
    opened: dict[str, int] = {}
    most = 0
    for index, (kind, target, _) in enumerate(timeline):
        if kind == "kubectl drain":
            opened[target] = index
            most = max(most, len(opened))
        elif kind == "kubectl uncordon" and target in opened:
            window = timeline[opened.pop(target) : index + 1]
            drained.append((target, sum(s for _, _, s in window), [k for k, _, _ in window[1:-1]]))
    return ScriptFigures(len(timeline), sum(s for _, _, s in timeline), drained, most)


def print_script_figures(figures: ScriptFigures) -> None:
    print(
        f"\nthe scripts on the stand-in cluster: {figures.commands} timed commands, about "
        f"{figures.total_seconds / 60:.0f} min of serialized work (estimates)"
    )
    print(f"  {'node':<14} {'drained for':>12}  commands while cordoned")
    for node, seconds, inside in figures.drained:
        print(f"  {node:<14} {seconds / 60:>9.1f} min  {', '.join(inside)}")
    print(
        f"  at most {figures.most_drained_at_once} node(s) cordoned at any time; the API stays up through the "
        "VIP (one apiserver restarts at a time, HAProxy retries elsewhere: docs/load-balancers.md)"
    )


def main() -> int:
    print_graph_figures(graph_figures())
    with tempfile.TemporaryDirectory(prefix="labs-k8s-upgrade-bench-") as tmp:
        print_script_figures(script_figures(build_cluster(Path(tmp) / "lab")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
