"""What the last deployment says about the cluster's Kubernetes version, and what follows from it.

Every node's upgrade step prints where it left its node ("<node> already at v1.36.0, containerd
2.2.1", "<node> upgraded to v1.36.0, containerd 2.2.1; ..."), and the stack's state keeps that
stdout. Read before anything is registered, it lets the program:

- refuse a bad change of `labs-k8s:kubernetes.version` in config validation, in `pulumi preview`
  already: a downgrade, a skipped minor, a new minor while an earlier upgrade is unfinished. The
  first control plane checks the same against the running cluster before it changes anything (the
  state can be unreadable, or a node changed by hand);
- run the upgrade chain serialized (one node at a time, kubeadm's procedure) only when some node of
  the last deployment is not at the configured version, or not on the configured containerd
  (`labs-k8s:kubernetes.containerdVersion` is rolled by the same steps, drained, node by node).
  Otherwise, at creation and on every `up`
  that does not change the version, the upgrade steps are no-ops and run in parallel after their
  node's join, so the graph's depth does not grow with the number of workers. When the state says
  nothing for certain, the chain is serialized: slower, never wrong.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from components.config import ConfigProblem, LabConfig, LabConfigError, Role
from components.previous_state import PreviousState

_RECORD = re.compile(r"^\S+ (?:already at|upgraded to) v(\d+)\.(\d+)\.(\d+)\b")
_CONTAINERD_RECORD = re.compile(r"^\S+ (?:already at|upgraded to) v[\d.]+, containerd (\d+\.\d+\.\d+)\b")

Version = tuple[int, int, int]


def upgrade_step_name(node_name: str) -> str:
    """The resource whose stdout records where the upgrade left `node_name`."""
    return f"{node_name}-upgrade"


def recorded_version(stdout: str | None) -> Version | None:
    """The version an upgrade step's stdout reports, or None."""
    match = _RECORD.match((stdout or "").strip())
    if match is None:
        return None
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def recorded_containerd(stdout: str | None) -> str | None:
    """The containerd version an upgrade step's stdout reports, or None (a step from before the
    record carried it, or one that never finished)."""
    match = _CONTAINERD_RECORD.match((stdout or "").strip())
    return match.group(1) if match else None


def parse_version(text: str) -> Version:
    major, minor, patch = (int(part) for part in text.removeprefix("v").split("."))
    return major, minor, patch


def show(version: Version) -> str:
    return "v{}.{}.{}".format(*version)


@dataclass(frozen=True)
class VersionRecords:
    """The Kubernetes nodes of the last deployment and the version each one's upgrade step reported.

    known: the previous state could be read. fresh: this stack has no previous deployment.
    versions: node name -> reported version, None when its step left no record (a node deployed
    before upgrade steps existed, or whose step never finished). containerd: node name -> the
    containerd version its step reported, None likewise.
    """

    known: bool
    fresh: bool = False
    versions: Mapping[str, Version | None] = field(default_factory=dict)
    containerd: Mapping[str, str | None] = field(default_factory=dict)


def records_from(
    known: bool, previous_nodes: list[str] | None, stdout_of: Callable[[str], str | None]
) -> VersionRecords:
    """Build the records from what the previous state offers: the Kubernetes node names of the last
    deployment (None: no previous deployment) and the stdout of a resource by name."""
    if not known:
        return VersionRecords(known=False)
    if previous_nodes is None:
        return VersionRecords(known=True, fresh=True)
    stdouts = {name: stdout_of(upgrade_step_name(name)) for name in previous_nodes}
    return VersionRecords(
        known=True,
        versions={name: recorded_version(stdout) for name, stdout in stdouts.items()},
        containerd={name: recorded_containerd(stdout) for name, stdout in stdouts.items()},
    )


def version_problems(lab: LabConfig, records: VersionRecords) -> list[ConfigProblem]:
    """Refusals of `labs-k8s:kubernetes.version` the last deployment's records already justify."""
    reported = {name: v for name, v in records.versions.items() if v is not None}
    if not reported:
        return []
    target = parse_version(lab.kubernetes.version)
    newest_node, newest = max(reported.items(), key=lambda item: item[1])
    oldest_node, oldest = min(reported.items(), key=lambda item: item[1])
    key = "kubernetes.version"
    if target < newest:
        return [
            ConfigProblem(
                key,
                f"{lab.kubernetes.version} is older than {show(newest)}, which {newest_node} "
                "already runs (last pulumi up): downgrades are not supported (kubeadm upgrades and "
                f"etcd's data do not go back); set {show(newest)[1:]} or later",
            )
        ]
    if target[1] > oldest[1] + 1:
        if oldest[1] < newest[1]:
            return [
                ConfigProblem(
                    key,
                    f"{oldest_node} is still at {show(oldest)}: the upgrade to {show(newest)} did "
                    f"not finish. Set {show(newest)[1:]} and run pulumi up to finish it, then "
                    f"{lab.kubernetes.version}",
                )
            ]
        return [
            ConfigProblem(
                key,
                f"{lab.kubernetes.version} skips a minor: the cluster runs {show(oldest)} and "
                f"kubeadm upgrades one minor at a time; set a 1.{oldest[1] + 1}.x release, run pulumi "
                f"up, then {lab.kubernetes.version}",
            )
        ]
    return []


def rolling_upgrade(lab: LabConfig, records: VersionRecords) -> bool:
    """Must the upgrade steps run as the serialized chain this time? Yes unless the records prove
    that every node of the last deployment is at the configured version and on the configured
    containerd (or there was none): a containerd change alone is rolled node by node too."""
    if not records.known:
        return True
    if records.fresh:
        return False
    target = parse_version(lab.kubernetes.version)
    containerd = lab.kubernetes.containerd_version
    return any(version != target for version in records.versions.values()) or any(
        records.containerd.get(name) != containerd for name in records.versions
    )


def records_from_previous(previous: PreviousState) -> VersionRecords:
    """The records in this stack's last deployment: its Kubernetes nodes (the `nodes` output) and
    their upgrade steps' stdout."""
    nodes = previous.stack_outputs.get("nodes") if previous.available else None
    names = None
    if isinstance(nodes, list):
        kubernetes_roles = {Role.CONTROL_PLANE.value, Role.WORKER.value}
        names = [n["name"] for n in nodes if isinstance(n, dict) and n.get("role") in kubernetes_roles]
    return records_from(previous.available, names, previous.stdout)


def check_version_change(lab: LabConfig, previous: PreviousState) -> None:
    """Raise, before anything is registered, when the last deployment rules the version change out."""
    problems = version_problems(lab, records_from_previous(previous))
    if problems:
        raise LabConfigError(problems)
