"""The upgrade of the 7-node lab (1.35.2 -> 1.36.0): how many serialized steps, and how long each
node is drained.

Two sources, both the real code:
- the program under the mock engine, before and after the change of labs-k8s:kubernetes.version
  (the after run reads the before run as its previous state): the steps `pulumi up` runs, in its
  order (components.changes.plan_changes), so the serialized chain;
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.changes import plan_changes
from components.offline import run_program
from tests.labs import make_lab_config, namespace
from tests.upgrade_harness import build_cluster, run_chain

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


def graph_figures() -> None:
    created = run_program("labs", overrides=version(BEFORE))
    upgraded = run_program("labs", overrides=version(AFTER), previous=created.previous_state())
    plan = plan_changes(created, upgraded)
    waves = [step for step in plan.steps if step.kind in ("replace", "create replacement")]
    print(f"pulumi up after labs-k8s:kubernetes.version {BEFORE} -> {AFTER} (7-node lab, workersAtOnce=1):")
    print(f"  {len(waves)} serialized waves of steps; the upgrade chain within them:")
    chain = []
    for step in waves:
        names = [n for n in step.names if n.endswith(UPGRADE_SUFFIXES)]
        if names:
            chain.append(names)
            print(f"    wave {step.order:>2}: {', '.join(names)}")
    print(f"  {len(chain)} serialized upgrade steps (3 control planes, 3 per worker); "
          f"{sum(1 for s in waves if not any(n.endswith(UPGRADE_SUFFIXES) for n in s.names))} other waves: prepare, "
          "init, refresh and join (they find their node done), flannel, verify-cluster, kubeconfig")


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


def script_figures() -> None:
    with tempfile.TemporaryDirectory(prefix="labs-k8s-upgrade-bench-") as tmp:
        cluster = build_cluster(Path(tmp) / "lab")
        cluster.reset_log()
        run = run_chain(cluster, make_lab_config(kubernetes={"version": AFTER}))
        if run.failed:
            raise SystemExit(f"{run.failed} failed:\n{run.stderr(run.failed)}")
        timeline: list[tuple[str, str, int]] = []
        for node, command, *args in cluster.calls():
            kind = classify(node, command, args)
            if kind is not None:
                target = next((a for a in args if a.startswith("labs-k8s-")), node) if command == "kubectl" else node
                timeline.append((kind, target, ESTIMATE_SECONDS[kind]))
    total = sum(seconds for _, _, seconds in timeline)
    print(f"\nthe scripts on the stand-in cluster: {len(timeline)} timed commands, about {total / 60:.0f} min "
          "of serialized work (estimates)")
    print(f"  {'node':<14} {'drained for':>12}  commands while cordoned")
    opened: dict[str, int] = {}
    for index, (kind, target, _) in enumerate(timeline):
        if kind == "kubectl drain":
            opened[target] = index
        elif kind == "kubectl uncordon" and target in opened:
            window = timeline[opened.pop(target) : index + 1]
            seconds = sum(s for _, _, s in window)
            inside = ", ".join(k for k, _, _ in window[1:-1])
            print(f"  {target:<14} {seconds / 60:>9.1f} min  {inside}")
    print("  at most one node is cordoned at any time; the API stays up through the VIP (one apiserver "
          "restarts at a time, HAProxy retries elsewhere: docs/load-balancers.md)")


def main() -> int:
    graph_figures()
    script_figures()
    return 0


if __name__ == "__main__":
    sys.exit(main())
