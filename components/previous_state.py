"""What this stack's last deployment left in its state, read before any resource is registered.

Config validation sees only the new config; some decisions need the old one too:
- which control planes the cluster has now (refusing a change that would drop etcd below quorum);
- whether a node's join step finished (a join retried in a later `up` needs fresh join material,
  so its refresh step must run again even though nothing about it changed);
- until when the exported kubeconfig's client certificate is valid (re-export before it lapses).

How: the engine's builtin invoke `pulumi:pulumi:readStackResourceOutputs` (pulumi/pulumi
pkg/resource/deploy/builtins.go) returns, for a stack named `org/project/stack`, every resource of
its latest checkpoint with its outputs (backendClient.GetStackResourceOutputs). The program
calls it synchronously at start, before registering anything, so the checkpoint is still the
previous deployment's. Alternatives that do not work here: `pulumi:pulumi:getResource` reads only
the resources registered in the *current* deployment (builtinProvider.getResource looks in `news`
and `reads`), and a StackReference is itself a resource (registered, read asynchronously).

When the invoke fails (a backend that cannot answer it), the program warns and goes on without:
the runtime guards still hold (leave-cluster.sh refuses to break quorum).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pulumi

from components.config import ConfigProblem, LabConfig, LabConfigError, Role

READ_STACK_RESOURCE_OUTPUTS = "pulumi:pulumi:readStackResourceOutputs"
STACK_TYPE = "pulumi:pulumi:Stack"
_GENERATION = re.compile(r"^([a-z-]+):(\d+)$")


def stack_name() -> str:
    """The fully qualified name the backend resolves: org/project/stack (`organization` for a
    self-managed backend)."""
    return f"{pulumi.get_organization()}/{pulumi.get_project()}/{pulumi.get_stack()}"


@dataclass(frozen=True)
class PreviousState:
    available: bool
    reason: str = ""
    stack_outputs: dict[str, Any] = field(default_factory=dict)
    # Resource name (the last URN segment; unique in this program) -> its outputs.
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)

    def control_planes(self) -> list[tuple[str, str]] | None:
        """(name, ip) of the control planes of the last deployment, from its `nodes` output."""
        nodes = self.stack_outputs.get("nodes")
        if not isinstance(nodes, list):
            return None
        role = Role.CONTROL_PLANE.value
        return [(n["name"], n["ip"]) for n in nodes if isinstance(n, dict) and n.get("role") == role]

    def stdout(self, resource_name: str) -> str | None:
        outputs = self.resources.get(resource_name)
        if outputs is None:
            return None
        value = outputs.get("stdout")
        return value.strip() if isinstance(value, str) else None

    def generation(self, resource_name: str, key: str) -> int | None:
        """N of the `key:N` trigger the resource had last time (None: no such resource or trigger)."""
        outputs = self.resources.get(resource_name)
        if outputs is None:
            return None
        for trigger in outputs.get("triggers") or []:
            match = _GENERATION.match(str(trigger))
            if match and match.group(1) == key:
                return int(match.group(2))
        return None

    def next_generation(self, resource_name: str, key: str, bump: bool) -> str:
        """The `key:N` trigger for this run: the last one, one more when `bump`, 1 the first time."""
        last = self.generation(resource_name, key)
        if last is None:
            return f"{key}:1"
        return f"{key}:{last + 1 if bump else last}"


def read_previous_state() -> PreviousState:
    try:
        result = pulumi.runtime.invoke(READ_STACK_RESOURCE_OUTPUTS, {"stackName": stack_name()})
    except Exception as error:
        reason = f"{type(error).__name__}: {error}"
        pulumi.log.warn(
            f"could not read this stack's previous state ({reason}): the control-plane quorum check and "
            "the retry bookkeeping of joins are skipped this run"
        )
        return PreviousState(available=False, reason=reason)
    value = result.value or {}
    outputs: dict[str, Any] = {}
    resources: dict[str, dict[str, Any]] = {}
    for urn, entry in (value.get("outputs") or {}).items():
        if not isinstance(entry, dict):
            continue
        if entry.get("type") == STACK_TYPE:
            outputs = dict(entry.get("outputs") or {})
        else:
            resources[str(urn).rsplit("::", 1)[-1]] = dict(entry.get("outputs") or {})
    return PreviousState(available=True, stack_outputs=outputs, resources=resources)


def check_control_plane_change(lab: LabConfig, previous: PreviousState) -> None:
    """Refuse, before anything is registered, a change that removes or replaces so many control
    planes at once that etcd would lose its quorum: at least a majority of the control planes of
    the last deployment must stay (same name and address)."""
    old = previous.control_planes()
    if not old:
        return
    new = {(n.name, str(n.ip)) for n in lab.control_planes}
    kept = [name for name, ip in old if (name, ip) in new]
    quorum = len(old) // 2 + 1
    if len(kept) >= quorum:
        return
    gone = [name for name, ip in old if (name, ip) not in new]
    raise LabConfigError([ConfigProblem(
        "nodes.controlPlanes.hosts",
        f"this change removes or replaces {len(gone)} of the {len(old)} control planes the cluster has "
        f"({', '.join(gone)}) in one `pulumi up`; etcd keeps its quorum only if at least {quorum} of them stay. "
        f"Change at most {len(old) - quorum} per `pulumi up` (e.g. 5 -> 3, then 3 -> 1 with "
        "kubernetes.allowSingleControlPlane)",
    )])


def renewal_due(valid_until: str | None, days: int, now: datetime | None = None) -> bool:
    """Is a certificate valid until `valid_until` (RFC 3339) within `days` of expiring?"""
    if not valid_until:
        return False
    try:
        end = datetime.fromisoformat(valid_until.replace("Z", "+00:00"))
    except ValueError:
        return True
    return (end - (now or datetime.now(UTC))).total_seconds() < days * 86400
