"""What this stack's last deployment left in its state, read before any resource is registered.

Config validation sees only the new config; some decisions need the old one too:
- which control planes the cluster has now (refusing a change that would drop etcd below quorum);
- whether a node's join step finished (a join retried in a later `up` needs fresh join material,
  so its refresh step must run again even though nothing about it changed);
- until when the exported kubeconfig's client certificate is valid (re-export before it lapses).

How, in two steps (pulumi/pulumi pkg/resource/deploy/builtins.go, builtinProvider.Invoke):

1. `pulumi:pulumi:readStackOutputs` (readStackReference -> backendClient.GetStackOutputs): the
   stack's outputs. It is safe on every backend and in every state: a self-managed backend answers
   {} for a stack with no deployment (pkg/backend/diy/state.go getSnapshotStackOutputs checks
   `checkpoint.Latest == nil`).
2. `pulumi:pulumi:readStackResourceOutputs` (pkg/backend/backend.go
   backendClient.GetStackResourceOutputs): every resource of the latest checkpoint with its
   outputs. It is NOT safe on a self-managed backend (file://, s3://, azblob://, gs://,
   postgres://) for a stack with no deployment: `pulumi stack init` stores a checkpoint without
   one (diy/backend.go CreateStack, `saveStack(..., apitype.TypedDeployment{})`),
   stack.DeserializeCheckpoint returns a nil snapshot, and GetStackResourceOutputs ranges over
   `snap.Resources` with no nil check: the CLI dies with a nil-pointer panic, before anything is
   written, at every retry. So it is called only for a stack known to have a deployment: one
   with outputs (they come from that deployment), or one on Pulumi Cloud (the service answers an
   empty deployment for a new stack).

A self-managed stack with no outputs is then either new or has a deployment whose `up` failed
before the program's outputs were registered (a first `up` that created VMs, then failed): the
program cannot tell them apart. `make up` removes the doubt: it gives a self-managed stack that
has no deployment an initial one whose stack resource carries the output INITIAL_DEPLOYMENT_OUTPUT
(components/tools/first_run.py), and the engine keeps a stack resource's outputs until an `up`
registers new ones, so a first `up` that fails still leaves an output behind. A stack created by
a bare `pulumi stack init` + `pulumi up` whose first `up` failed is read as new: its first retry
then re-runs no join-material refresh (join-attempt stays 1).

The program calls both synchronously at start, before registering anything of its own, so the
checkpoint is still the previous deployment's. It is not always still on disk, though: the SDK has
registered the root stack resource by then, and during an `up` the engine saves the checkpoint for
that step while the program reads it. On a file:// backend, gocloud's fileblob writes the
checkpoint by rename but its `<stack>.json.attrs` sidecar in place (blob/fileblob/attrs.go setAttrs:
os.Create, then encode), and reads decode that sidecar first (fileblob.go forKey -> getAttrs): a
read between the truncate and the write fails with "failed to load checkpoint: EOF". Seen on the
real engine (a template-layer `up` on a new stack died in its first second). Such a torn read is
read again after a short wait (TORN_READ_DELAYS); any other failure is not.

Alternatives that do not work here: `pulumi:pulumi:getResource`
reads only the resources registered in the *current* deployment (builtinProvider.getResource
looks in `news` and `reads`), and a StackReference is itself a resource (registered, read
asynchronously).

When an invoke fails (a backend that cannot answer it), the run stops before anything is
registered, saying why: without the state, every join-attempt generation would restart at 1 and
the engine would re-run every join-material refresh and, through their triggers, the joins,
verify and kubeconfig, in a preview full of replacements unrelated to the change. One `up` or
`preview` with `labs-k8s:previousState.unreadable: ignore` goes on without it (the runtime guards
still hold: leave-cluster.sh refuses to break quorum); remove the key afterwards.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pulumi
from pulumi.output import Unknown

from components.config import ConfigProblem, LabConfig, LabConfigError, Role

READ_STACK_OUTPUTS = "pulumi:pulumi:readStackOutputs"
READ_STACK_RESOURCE_OUTPUTS = "pulumi:pulumi:readStackResourceOutputs"
STACK_TYPE = "pulumi:pulumi:Stack"
# A self-managed backend's stacks all belong to this organization (pkg/backend/diy/store.go).
SELF_MANAGED_ORGANIZATION = "organization"
# The stack output of the initial deployment `make up` gives a new self-managed stack
# (components/tools/first_run.py): it says "this stack has a deployment" before the program's first
# outputs are registered.
INITIAL_DEPLOYMENT_OUTPUT = "labsK8sInitialDeployment"
UNREADABLE_KEY = "labs-k8s:previousState.unreadable"
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


def self_managed_backend() -> bool:
    return pulumi.get_organization() == SELF_MANAGED_ORGANIZATION


class PreviousStateUnreadable(Exception):
    """A builtin invoke failed: the reason, for the message."""


# A read that met a checkpoint mid-write (see the module docstring): fileblob's sidecar truncated
# (EOF) or half written (unexpected EOF).
_TORN_READ = re.compile(r"failed to load checkpoint: (unexpected )?EOF\b")
# Seconds to wait before each new read of a torn checkpoint: a save takes milliseconds, so five
# reads over about 6 s tell a torn read from a sidecar left empty by a crashed writer.
TORN_READ_DELAYS: tuple[float, ...] = (0.2, 0.5, 1.0, 2.0, 2.5)


def _invoke(token: str, args: dict[str, Any]) -> dict[str, Any]:
    delays = iter(TORN_READ_DELAYS)
    while True:
        try:
            result = pulumi.runtime.invoke(token, args)
        except Exception as error:
            delay = next(delays, None) if _TORN_READ.search(str(error)) else None
            if delay is None:
                raise PreviousStateUnreadable(f"{token}: {type(error).__name__}: {error}") from None
            pulumi.log.info(f"the backend was saving the checkpoint while {token} read it ({error}); reading again")
            time.sleep(delay)
            continue
        return dict(_known(result.value or {}))


def _known(value: Any) -> Any:
    """`value` with every unknown replaced by None ("not known").

    An output the last run could not compute (a targeted `up` skips the resources it comes from)
    is saved as the engine's unknown placeholder, and the SDK reads it back as
    `pulumi.output.Unknown` (sdk/python/lib/pulumi/runtime/rpc.py deserialize_property), not as a
    string: it crashed every later run in `renewal_due` (`'Unknown' object has no attribute
    'replace'`)."""
    if isinstance(value, Unknown):
        return None
    if isinstance(value, dict):
        return {key: _known(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_known(item) for item in value]
    return value


def read_previous_state(unreadable: str = "fail") -> PreviousState:
    """The last deployment's outputs and resources, without ever asking a backend for the
    resources of a stack that may have no deployment (see the module docstring).

    `unreadable` is labs-k8s:previousState.unreadable: "fail" raises pulumi.RunError when the
    state cannot be read, "ignore" warns and goes on without it.
    """
    name = stack_name()
    try:
        outputs = dict(_invoke(READ_STACK_OUTPUTS, {"name": name}).get("outputs") or {})
        if not outputs and self_managed_backend():
            # New, or its first `up` failed before any output (not made by `make up`): read as new.
            return PreviousState(available=True, reason="no deployment with outputs")
        value = _invoke(READ_STACK_RESOURCE_OUTPUTS, {"stackName": name})
    except PreviousStateUnreadable as error:
        if unreadable != "ignore":
            raise pulumi.RunError(
                f"could not read this stack's previous state ({error}). Without it every join-material "
                "generation restarts at 1: the refresh steps, the joins, verify and the kubeconfig would be "
                "re-run, and the control-plane quorum and version checks would be skipped. Fix the backend "
                "access (login, passphrase, network) and run again; or, knowing this, run once with "
                f"`pulumi config set --stack {pulumi.get_stack()} --path {UNREADABLE_KEY} ignore` "
                f"and remove it afterwards (`pulumi config rm --stack {pulumi.get_stack()} --path {UNREADABLE_KEY}`)"
            ) from None
        pulumi.log.warn(
            f"could not read this stack's previous state ({error}); {UNREADABLE_KEY} is `ignore`: the "
            "control-plane quorum check and the retry bookkeeping of joins are skipped this run"
        )
        return PreviousState(available=False, reason=str(error))
    resources: dict[str, dict[str, Any]] = {}
    for urn, entry in (value.get("outputs") or {}).items():
        if not isinstance(entry, dict):
            continue
        if entry.get("type") == STACK_TYPE:
            outputs = dict(entry.get("outputs") or outputs)
        else:
            resources[str(urn).rsplit("::", 1)[-1]] = dict(entry.get("outputs") or {})
    outputs.pop(INITIAL_DEPLOYMENT_OUTPUT, None)
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
    raise LabConfigError(
        [
            ConfigProblem(
                "nodes.controlPlanes.hosts",
                f"this change removes or replaces {len(gone)} of the {len(old)} control planes the cluster has "
                f"({', '.join(gone)}) in one `pulumi up`; etcd keeps its quorum only if at least {quorum} of them "
                "stay. "
                f"Change at most {len(old) - quorum} per `pulumi up` (e.g. 5 -> 3, then 3 -> 1 with "
                "kubernetes.allowSingleControlPlane)",
            )
        ]
    )


def renewal_due(valid_until: object, days: int, now: datetime | None = None) -> bool:
    """Is a certificate valid until `valid_until` (RFC 3339) within `days` of expiring? Anything
    but a string (no output, or one the last run could not compute) is "not known": no renewal
    is forced, the kubeconfig step runs whenever its own inputs change."""
    if not isinstance(valid_until, str) or not valid_until:
        return False
    try:
        end = datetime.fromisoformat(valid_until.replace("Z", "+00:00"))
    except ValueError:
        return True
    return (end - (now or datetime.now(UTC))).total_seconds() < days * 86400
