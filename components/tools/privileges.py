"""The vCenter privileges this project needs: one list, from which the docs table and the role snippet are made.

Every privilege is here because of an API call, listed in `API_CALLS` with where the call is
made: this project's pyvmomi code (components/vsphere*), or the vSphere provider
(terraform-provider-vsphere, which pulumi-vsphere bridges), read in its source. The tests check
the list against the code and the libraries:

- every pyvmomi method the code calls has an entry here, and every privilege pyVmomi's own
  type information names for it (method and parameters) is granted;
- every granted privilege is used by at least one listed call, and every call's privileges are
  granted: nothing extra, nothing missing;
- the privilege IDs are real: vcsim (whose list was captured from a vCenter) accepts them in a role;
- docs/runbook.md's tables and govc snippet are exactly what `render_*` below produce.

Roles are split by where they are granted, so that no privilege reaches further than its use:
`labs-k8s-read` on the vCenter root (no propagation) and on the datacenter; `labs-k8s-vms` on
the VM folder, the resource pool, the datastore and the port group; `labs-k8s-drs` on the one
compute cluster. `pulumi preview` needs only `labs-k8s-read`.

`python -m components privileges --stack <stack>` prints the snippet with that stack's
inventory paths filled in.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Phase = Literal["preview", "up"]


@dataclass(frozen=True)
class Privilege:
    id: str  # the API privilege ID (what govc, PowerCLI and the API use)
    group: str  # where the vSphere 8 Client shows it (Administration > Roles)
    name: str  # its label there


@dataclass(frozen=True)
class Role:
    name: str
    description: str
    privileges: tuple[str, ...]


@dataclass(frozen=True)
class Grant:
    role: str
    target: str  # a key of TARGETS
    propagate: bool


@dataclass(frozen=True)
class ApiCall:
    """One API call and the privileges it needs (on the object it acts on)."""

    caller: str  # who makes it: "template", "preflight", "drills", "provider: ..."
    call: str  # "<vmodl type>.<WSDL method>" for SOAP, or the HTTP request
    privileges: tuple[str, ...]
    phase: Phase  # "preview": also made by `pulumi preview` (and refresh); "up": only by up/destroy
    source: str  # where in the code, or the reference that says which privilege


PRIVILEGES: tuple[Privilege, ...] = (
    Privilege("System.Anonymous", "(every role)", "implicit"),
    Privilege("System.View", "(every role)", "implicit"),
    Privilege("System.Read", "(every role)", "implicit"),
    Privilege("StorageProfile.View", "Profile-driven storage", "Profile-driven storage view"),
    Privilege("Datastore.AllocateSpace", "Datastore", "Allocate space"),
    Privilege("Datastore.Browse", "Datastore", "Browse datastore"),
    Privilege("Datastore.FileManagement", "Datastore", "Low level file operations"),
    Privilege("Network.Assign", "Network", "Assign network"),
    Privilege("Resource.AssignVMToPool", "Resource", "Assign virtual machine to resource pool"),
    Privilege("Host.Inventory.EditCluster", "Host > Inventory", "Modify cluster"),
    Privilege("VirtualMachine.Inventory.Create", "Virtual machine > Edit Inventory", "Create new"),
    Privilege(
        "VirtualMachine.Inventory.CreateFromExisting", "Virtual machine > Edit Inventory", "Create from existing"
    ),
    Privilege("VirtualMachine.Inventory.Delete", "Virtual machine > Edit Inventory", "Remove"),
    Privilege("VirtualMachine.Provisioning.DeployTemplate", "Virtual machine > Provisioning", "Deploy template"),
    Privilege("VirtualMachine.Provisioning.MarkAsTemplate", "Virtual machine > Provisioning", "Mark as template"),
    Privilege("VirtualMachine.Config.AddNewDisk", "Virtual machine > Change Configuration", "Add new disk"),
    Privilege(
        "VirtualMachine.Config.AddRemoveDevice", "Virtual machine > Change Configuration", "Add or remove device"
    ),
    Privilege(
        "VirtualMachine.Config.AdvancedConfig", "Virtual machine > Change Configuration", "Advanced configuration"
    ),
    Privilege("VirtualMachine.Config.Annotation", "Virtual machine > Change Configuration", "Set annotation"),
    Privilege("VirtualMachine.Config.CPUCount", "Virtual machine > Change Configuration", "Change CPU count"),
    Privilege("VirtualMachine.Config.DiskExtend", "Virtual machine > Change Configuration", "Extend virtual disk"),
    Privilege("VirtualMachine.Config.EditDevice", "Virtual machine > Change Configuration", "Modify device settings"),
    Privilege("VirtualMachine.Config.Memory", "Virtual machine > Change Configuration", "Change Memory"),
    Privilege("VirtualMachine.Config.Rename", "Virtual machine > Change Configuration", "Rename"),
    Privilege("VirtualMachine.Config.Resource", "Virtual machine > Change Configuration", "Change resource"),
    Privilege("VirtualMachine.Config.Settings", "Virtual machine > Change Configuration", "Change Settings"),
    Privilege(
        "VirtualMachine.Config.SwapPlacement", "Virtual machine > Change Configuration", "Change Swapfile placement"
    ),
    Privilege("VirtualMachine.Interact.PowerOff", "Virtual machine > Interaction", "Power off"),
    Privilege("VirtualMachine.Interact.PowerOn", "Virtual machine > Interaction", "Power on"),
    Privilege("VirtualMachine.Interact.SetCDMedia", "Virtual machine > Interaction", "Configure CD media"),
)

READ_ONLY = ("System.Anonymous", "System.View", "System.Read")

ROLES: tuple[Role, ...] = (
    Role(
        "labs-k8s-read",
        "inventory lookups, preflight, refresh; storage policy reads (pulumi preview needs only this role)",
        (*READ_ONLY, "StorageProfile.View"),
    ),
    Role(
        "labs-k8s-vms",
        "the template, the clones and their disks, on the lab's folder, pool, datastore and port group",
        (
            *READ_ONLY,
            "Datastore.AllocateSpace",
            "Datastore.Browse",
            "Datastore.FileManagement",
            "Network.Assign",
            "Resource.AssignVMToPool",
            "VirtualMachine.Inventory.Create",
            "VirtualMachine.Inventory.CreateFromExisting",
            "VirtualMachine.Inventory.Delete",
            "VirtualMachine.Provisioning.DeployTemplate",
            "VirtualMachine.Provisioning.MarkAsTemplate",
            "VirtualMachine.Config.AddNewDisk",
            "VirtualMachine.Config.AddRemoveDevice",
            "VirtualMachine.Config.AdvancedConfig",
            "VirtualMachine.Config.Annotation",
            "VirtualMachine.Config.CPUCount",
            "VirtualMachine.Config.DiskExtend",
            "VirtualMachine.Config.EditDevice",
            "VirtualMachine.Config.Memory",
            "VirtualMachine.Config.Rename",
            "VirtualMachine.Config.Resource",
            "VirtualMachine.Config.Settings",
            "VirtualMachine.Config.SwapPlacement",
            "VirtualMachine.Interact.PowerOff",
            "VirtualMachine.Interact.PowerOn",
            "VirtualMachine.Interact.SetCDMedia",
        ),
    ),
    Role(
        "labs-k8s-drs",
        "the DRS anti-affinity rules, on the one compute cluster",
        (*READ_ONLY, "Host.Inventory.EditCluster"),
    ),
)

# Inventory objects a role is granted on; the placeholders are the stack's labs-k8s:vsphere keys.
TARGETS: dict[str, str] = {
    "root": "/",
    "datacenter": "/{datacenter}",
    "folder": "/{datacenter}/vm/{folder}",
    "pool": "/{datacenter}/host/{computeCluster}/Resources{resourcePoolPath}",
    "datastore": "/{datacenter}/datastore/{datastore}",
    "network": "/{datacenter}/network/{network}",
    "cluster": "/{datacenter}/host/{computeCluster}",
}

GRANTS: tuple[Grant, ...] = (
    # Lookups start at the root folder (SearchIndex paths, container views, the provider's finder),
    # and storage policies (PBM) are global objects: read-only there, not propagated.
    Grant("labs-k8s-read", "root", propagate=False),
    # Preflight and the provider read the cluster, its hosts, datastores and networks.
    Grant("labs-k8s-read", "datacenter", propagate=True),
    # The folder holds the template, the builder VM and the clones (propagated to them).
    Grant("labs-k8s-vms", "folder", propagate=True),
    Grant("labs-k8s-vms", "pool", propagate=False),
    Grant("labs-k8s-vms", "datastore", propagate=False),
    Grant("labs-k8s-vms", "network", propagate=False),
    # Only this cluster's rules, not every cluster's in the datacenter.
    Grant("labs-k8s-drs", "cluster", propagate=False),
)

PREVIEW_ROLES = ("labs-k8s-read",)

_API = "vSphere Web Services API reference"
_TF = "terraform-provider-vsphere"

API_CALLS: tuple[ApiCall, ...] = (
    # ------------------------------------------------------------------ sessions (everyone)
    ApiCall(
        "template, preflight, drills",
        "vim.SessionManager.Login",
        ("System.Anonymous",),
        "preview",
        "pyVim.connect.SmartConnect in components/vsphere connect()",
    ),
    ApiCall(
        "template, preflight, drills",
        "vim.SessionManager.Logout",
        ("System.View",),
        "preview",
        "pyVim.connect.Disconnect in components/vsphere disconnect()",
    ),
    ApiCall(
        "template, preflight, drills",
        "vim.ServiceInstance.RetrieveServiceContent",
        ("System.Anonymous",),
        "preview",
        "si.RetrieveContent()",
    ),
    # ------------------------------------------------------------------ lookups and reads
    ApiCall(
        "template, preflight, drills",
        "vim.view.ViewManager.CreateContainerView",
        ("System.View",),
        "preview",
        "_collect(): one PropertyCollector call over a container view, from the root folder for VM lookups",
    ),
    ApiCall(
        "template, preflight, drills",
        "vim.view.View.DestroyView",
        ("System.View",),
        "preview",
        "_collect() cleans its view up",
    ),
    ApiCall(
        "template, preflight, drills",
        "vmodl.query.PropertyCollector.RetrievePropertiesEx",
        ("System.Anonymous", "System.Read"),
        "preview",
        "_collect(); each object's properties need System.Read on it",
    ),
    ApiCall(
        "template, preflight, drills",
        "vmodl.query.PropertyCollector.ContinueRetrievePropertiesEx",
        ("System.View", "System.Read"),
        "preview",
        "_collect() pages",
    ),
    ApiCall(
        "template, preflight",
        "vim.SearchIndex.FindByInventoryPath",
        ("System.View",),
        "preview",
        "find_datacenter(), _find_under(): paths from the root folder",
    ),
    ApiCall(
        "template, preflight",
        "vim.SearchIndex.FindByUuid",
        ("System.View",),
        "preview",
        "find_vm_by_uuid(): the template provider's read (refresh) and delete; preflight: does the "
        "template a node's clone source keeps still exist",
    ),
    ApiCall(
        "template, preflight",
        "vim.EnvironmentBrowser.QueryConfigOptionEx",
        ("System.View",),
        "preview",
        "choose_guest_id(): which guest ids the cluster's hosts know (preflight reports it, the builder uses it)",
    ),
    ApiCall(
        "template",
        "vmodl.query.PropertyCollector.RetrieveContents",
        ("System.Anonymous", "System.Read"),
        "up",
        "wait_for_task(): a task's state read field by field when its TaskInfo does not parse "
        "(vcsim's FileManager tasks)",
    ),
    # ------------------------------------------------------------------ the golden template (pyvmomi)
    ApiCall(
        "template",
        "vim.FileManager.MakeDirectory",
        ("Datastore.FileManagement", "System.View"),
        "up",
        f"make_datastore_dir() for the ISO; {_API}: MakeDirectory needs Datastore.FileManagement on the "
        "datastore, System.View on the datacenter",
    ),
    ApiCall(
        "template",
        "vim.FileManager.DeleteDatastoreFile_Task",
        ("Datastore.FileManagement", "System.View"),
        "up",
        f"delete_datastore_file(): the install ISO once the template exists, and on delete; {_API}: "
        "DeleteDatastoreFile_Task needs Datastore.FileManagement on the datastore",
    ),
    ApiCall(
        "template",
        "vim.host.DatastoreBrowser.SearchDatastore_Task",
        ("Datastore.Browse",),
        "up",
        f"remove_empty_datastore_dir(): is the stack's ISO directory empty once its ISO is gone; {_API}: "
        "SearchDatastore_Task needs Datastore.Browse on the datastore",
    ),
    ApiCall(
        "template",
        "HTTPS PUT /folder/<path>?dcPath=&dsName=",
        ("Datastore.FileManagement", "System.View"),
        "up",
        "upload_to_datastore(): vCenter resolves dcPath from the root folder, then writes the file",
    ),
    ApiCall(
        "template",
        "vim.Folder.CreateVM_Task",
        (
            "VirtualMachine.Inventory.Create",
            "Resource.AssignVMToPool",
            "Datastore.AllocateSpace",
            "Network.Assign",
            "VirtualMachine.Config.AdvancedConfig",
            "VirtualMachine.Config.AddNewDisk",
        ),
        "up",
        f"create_builder_vm(); {_API}, CreateVM_Task: Inventory.Create on the folder, AssignVMToPool on the "
        "pool, AllocateSpace on the datastore, Network.Assign on the NIC's network, AdvancedConfig for "
        "extraConfig (disk.EnableUUID, the stack tag); the eager-zeroed disk it creates (fileOperation "
        "create) is a new disk",
    ),
    ApiCall(
        "template",
        "vim.VirtualMachine.ReconfigVM_Task (add CD-ROM with the ISO)",
        ("VirtualMachine.Config.AddRemoveDevice", "VirtualMachine.Interact.SetCDMedia", "Datastore.Browse"),
        "up",
        "attach_iso(): a new CD-ROM backed by the installer ISO on the datastore",
    ),
    ApiCall(
        "template",
        "vim.VirtualMachine.PowerOnVM_Task",
        ("VirtualMachine.Interact.PowerOn",),
        "up",
        "the builder VM boots the installer",
    ),
    ApiCall(
        "template, drills",
        "vim.VirtualMachine.PowerOffVM_Task",
        ("VirtualMachine.Interact.PowerOff",),
        "up",
        "destroy_vm() of a running builder VM; the drills' power-off",
    ),
    ApiCall(
        "template",
        "vim.VirtualMachine.ReconfigVM_Task (remove CD-ROM)",
        ("VirtualMachine.Config.AddRemoveDevice",),
        "up",
        "detach_iso(remove_device=True) before the seal",
    ),
    ApiCall(
        "template",
        "vim.VirtualMachine.MarkAsTemplate",
        ("VirtualMachine.Provisioning.MarkAsTemplate",),
        "up",
        "mark_as_template()",
    ),
    ApiCall(
        "template",
        "vim.ManagedEntity.Destroy_Task",
        ("VirtualMachine.Inventory.Delete",),
        "up",
        f"destroy_vm(): template delete, leftover builder VM; {_API}: Destroy_Task on a VM needs "
        "VirtualMachine.Inventory.Delete",
    ),
    ApiCall(
        "drills",
        "vim.VirtualMachine.PowerOnVM_Task (drills)",
        ("VirtualMachine.Interact.PowerOn",),
        "up",
        "components/tools/drills: a drill powers a node back on",
    ),
    # ------------------------------------------------------------------ the vSphere provider
    ApiCall(
        "provider: configure",
        "vim.SessionManager.Login + vAPI session + pbm.NewClient",
        ("System.Anonymous",),
        "preview",
        f"{_TF} vsphere/config.go Client(): SOAP login, REST session (tags), PBM client",
    ),
    ApiCall(
        "provider: data sources",
        "getDatacenter, getComputeCluster, getDatastore, getNetwork, getResourcePool",
        ("System.View", "System.Read"),
        "preview",
        f"{_TF} find.Finder from the root folder (vsphere/internal/helper/*: FromPath/FromID)",
    ),
    ApiCall(
        "provider: VirtualMachine read",
        "PropertyCollector (VM config, runtime, devices)",
        ("System.Read",),
        "preview",
        f"{_TF} resourceVSphereVirtualMachineRead",
    ),
    ApiCall(
        "provider: VirtualMachine read",
        "pbm.PbmQueryAssociatedProfile (VM and each disk)",
        ("StorageProfile.View",),
        "preview",
        f"{_TF} spbm.PolicyIDByVirtualMachine / PolicyIDByVirtualDisk, after every clone and on every "
        "read (hashicorp/terraform-provider-vsphere#1216, #1404); its docs/index.md asks for "
        "StorageProfile.View",
    ),
    ApiCall(
        "provider: VirtualMachine create",
        "vim.VirtualMachine.CloneVM_Task (from the template)",
        (
            "VirtualMachine.Provisioning.DeployTemplate",
            "VirtualMachine.Inventory.CreateFromExisting",
            "Resource.AssignVMToPool",
            "Datastore.AllocateSpace",
        ),
        "up",
        f"{_TF} vmworkflow.ExpandVirtualMachineCloneSpec + virtualmachine.Clone; {_API}, CloneVM_Task: "
        "a template source needs DeployTemplate (not Clone, not CloneTemplate), CreateFromExisting on the "
        "folder, AssignVMToPool on the pool, AllocateSpace on the datastore",
    ),
    ApiCall(
        "provider: VirtualMachine create/update",
        "vim.VirtualMachine.ReconfigVM_Task (post-clone config)",
        (
            "VirtualMachine.Config.CPUCount",
            "VirtualMachine.Config.Memory",
            "VirtualMachine.Config.Settings",
            "VirtualMachine.Config.Resource",
            "VirtualMachine.Config.AdvancedConfig",
            "VirtualMachine.Config.Annotation",
            "VirtualMachine.Config.Rename",
            "VirtualMachine.Config.SwapPlacement",
        ),
        "up",
        f"{_TF} resourceVSphereVirtualMachinePostDeployChanges -> expandVirtualMachineConfigSpec sends name, "
        "numCPUs, memoryMB, guestId/flags/tools/bootOptions/firmware (Settings), cpuAllocation and "
        "memoryAllocation (Resource), extraConfig (guestinfo: AdvancedConfig), annotation, swapPlacement "
        "(its docs/index.md asks for SwapPlacement) on every create and update",
    ),
    ApiCall(
        "provider: VirtualMachine create/update",
        "vim.VirtualMachine.ReconfigVM_Task (disks and NIC)",
        (
            "VirtualMachine.Config.EditDevice",
            "VirtualMachine.Config.AddNewDisk",
            "VirtualMachine.Config.DiskExtend",
            "Datastore.AllocateSpace",
            "Network.Assign",
        ),
        "up",
        f"{_TF} DiskPostCloneOperation (the data disk is new; growing labs-k8s:nodes.<role>.dataDiskGib on "
        "a running node extends it in place), NetworkInterfacePostCloneOperation (the NIC's port group)",
    ),
    ApiCall(
        "provider: VirtualMachine create/update",
        "vim.VirtualMachine.PowerOnVM_Task / ShutdownGuest",
        ("VirtualMachine.Interact.PowerOn", "VirtualMachine.Interact.PowerOff"),
        "up",
        f"{_TF} powers the clone on; a change that needs a reboot shuts the guest down and powers it on",
    ),
    ApiCall(
        "provider: VirtualMachine delete",
        "vim.VirtualMachine.PowerOffVM_Task + Destroy_Task",
        ("VirtualMachine.Interact.PowerOff", "VirtualMachine.Inventory.Delete"),
        "up",
        f"{_TF} resourceVSphereVirtualMachineDelete",
    ),
    ApiCall(
        "provider: ComputeClusterVmAntiAffinityRule",
        "vim.ComputeResource.ReconfigureComputeResource_Task",
        ("Host.Inventory.EditCluster",),
        "up",
        f"{_TF} resource_vsphere_compute_cluster_vm_anti_affinity_rule.go (rulesSpec add/edit/remove)",
    ),
    ApiCall(
        "provider: ComputeClusterVmAntiAffinityRule read",
        "cluster configurationEx.rule",
        ("System.Read",),
        "preview",
        f"{_TF} resourceVSphereComputeClusterVMAntiAffinityRuleRead",
    ),
)

# Privileges this project does NOT ask for, with why, so a reviewer does not add them back.
NOT_NEEDED: tuple[tuple[str, str], ...] = (
    ("VirtualMachine.Provisioning.Clone", "Clone virtual machine: the clones' source is a template (DeployTemplate)"),
    ("VirtualMachine.Provisioning.CloneTemplate", "Clone template: that is template-to-template cloning"),
    ("VirtualMachine.Config.ChangeTracking", "Toggle disk change tracking: never set"),
    ("Datastore.UpdateVirtualMachineFiles", "Update virtual machine files: no VM files are re-registered"),
    ("VirtualMachine.Interact.DeviceConnection", "Connect devices: no device is connected on a running VM"),
    (
        "VirtualMachine.Config.RemoveDisk",
        "Remove disk: removing a node's data disk (dataDiskGib -> 0) is refused "
        "by vCenter on purpose; replace the node instead",
    ),
    ("Host.Inventory.EditCluster on the datacenter", "Modify cluster is granted on the lab's cluster only"),
)


# --------------------------------------------------------------------------- derived views


def role(name: str) -> Role:
    return next(r for r in ROLES if r.name == name)


def privilege(privilege_id: str) -> Privilege:
    return next(p for p in PRIVILEGES if p.id == privilege_id)


def privileges_for(phase: Phase) -> set[str]:
    """Every privilege the calls of `phase` need (`up` includes what preview does)."""
    phases: tuple[Phase, ...] = ("preview",) if phase == "preview" else ("preview", "up")
    return {p for call in API_CALLS if call.phase in phases for p in call.privileges}


def granted(roles: Iterable[str]) -> set[str]:
    return {p for name in roles for p in role(name).privileges}


def _roles_of(privilege_id: str) -> list[str]:
    return [r.name for r in ROLES if privilege_id in r.privileges]


def render_privilege_table(phase: Phase) -> str:
    """The Markdown table docs/runbook.md shows for `up` (all roles) or `preview`."""
    names = PREVIEW_ROLES if phase == "preview" else tuple(r.name for r in ROLES)
    wanted = granted(names)
    rows = ["| vSphere 8 Client | privilege ID | role | used by |", "|---|---|---|---|"]
    for item in PRIVILEGES:
        if item.id not in wanted or item.id in READ_ONLY:
            continue
        users = sorted(
            {c.caller for c in API_CALLS if item.id in c.privileges and (phase == "up" or c.phase == "preview")}
        )
        roles = ", ".join(r for r in _roles_of(item.id) if r in names)
        rows.append(f"| {item.group} > {item.name} | `{item.id}` | {roles} | {'; '.join(users)} |")
    rows.append(
        "| (every role) | `System.Anonymous`, `System.View`, `System.Read` | all | logins, lookups, property reads |"
    )
    return "\n".join(rows)


def render_grant_table(phase: Phase) -> str:
    names = PREVIEW_ROLES if phase == "preview" else tuple(r.name for r in ROLES)
    rows = ["| role | granted on | propagate |", "|---|---|---|"]
    for grant in GRANTS:
        if grant.role in names:
            path = _target_path(grant.target, PLACEHOLDER_PLACEMENT)
            rows.append(f"| {grant.role} | `{path}` | {'yes' if grant.propagate else 'no'} |")
    return "\n".join(rows)


PLACEHOLDER_PLACEMENT = {
    "datacenter": "$DC",
    "computeCluster": "$CLUSTER",
    "datastore": "$DATASTORE",
    "network": "$NETWORK",
    "folder": "$FOLDER",
    "resourcePool": "",
}


def _target_path(target: str, placement: Mapping[str, str]) -> str:
    pool = placement.get("resourcePool") or ""
    values = {**placement, "resourcePoolPath": f"/{pool.strip('/')}" if pool else ""}
    return TARGETS[target].format(**values)


def render_govc(placement: Mapping[str, str] | None = None, phase: Phase = "up", principal: str | None = None) -> str:
    """A govc script that creates the roles and grants them to the principal (run it as a vCenter admin).

    Without `placement`, the paths use shell variables ($DC, $CLUSTER, ...) as the runbook shows.
    """
    names = PREVIEW_ROLES if phase == "preview" else tuple(r.name for r in ROLES)
    variables = placement is None

    def quoted(value: str) -> str:
        return f'"{value}"' if variables else shlex.quote(value)

    who = shlex.quote(principal) if principal else '"$PRINCIPAL"'

    lines = []
    for item in ROLES:
        if item.name in names:
            # vCenter adds System.Anonymous, System.View and System.Read to every role by itself.
            extra = [p for p in item.privileges if p not in READ_ONLY]
            lines.append(" ".join(["govc role.create", item.name, *extra]))
    for grant in GRANTS:
        if grant.role in names:
            path = _target_path(grant.target, PLACEHOLDER_PLACEMENT if placement is None else placement)
            lines.append(
                f"govc permissions.set -principal {who} -role {grant.role} "
                f"-propagate={'true' if grant.propagate else 'false'} {quoted(path)}"
            )
    return "\n".join(lines)


def placement_of_stack(stack: str) -> tuple[dict[str, str], str | None]:
    """The stack file's labs-k8s:vsphere placement and vsphere:user (or VSPHERE_USER), read offline."""
    from components.tools.offline import read_stack_file

    config = read_stack_file(stack).get("config") or {}
    placement = dict(PLACEHOLDER_PLACEMENT)
    for key, value in (config.get("labs-k8s:vsphere") or {}).items():
        placement[key] = str(value)
    user = config.get("vsphere:user") or os.environ.get("VSPHERE_USER")
    return placement, (str(user) if user else None)


def render_not_needed() -> str:
    return "\n".join(f"- `{privilege_id}`: {why}" for privilege_id, why in NOT_NEEDED)


DOC_BLOCKS = {
    "not-needed": render_not_needed,
    "privileges-up": lambda: render_privilege_table("up"),
    "grants-up": lambda: render_grant_table("up"),
    "govc-up": lambda: f"```sh\n{render_govc(phase='up')}\n```",
    "privileges-preview": lambda: render_privilege_table("preview"),
    "grants-preview": lambda: render_grant_table("preview"),
    "govc-preview": lambda: f"```sh\n{render_govc(phase='preview')}\n```",
}


def write_docs(path: Path) -> None:
    """Rewrite the generated blocks of docs/runbook.md from this module."""
    text = path.read_text()
    for name, render in DOC_BLOCKS.items():
        pattern = re.compile(rf"(<!-- generated: {name} -->\n)(?:.*?\n)?(<!-- end: {name} -->)", flags=re.S)
        if not pattern.search(text):
            raise ValueError(f"{path} has no block <!-- generated: {name} --> ... <!-- end: {name} -->")

        def fill(match: re.Match[str], render: Callable[[], str] = render) -> str:
            return match.group(1) + render() + "\n" + match.group(2)

        text = pattern.sub(fill, text)
    path.write_text(text)


def cli(stack: str | None, phase: Phase, principal: str | None, write: bool = False) -> int:
    """`python -m components privileges`: the govc snippet, for the runbook or for one stack."""
    from components.tools.offline import REPO_ROOT, StackFileError

    if write:
        write_docs(REPO_ROOT / "docs" / "runbook.md")
        print("docs/runbook.md: vCenter privilege blocks rewritten")
        return 0
    if stack is None:
        print(render_govc(phase=phase, principal=principal))
        return 0
    try:
        placement, user = placement_of_stack(stack)
    except StackFileError as error:
        print(f"privileges: {error}", file=sys.stderr)
        return 2
    print(f"# vCenter roles for stack {stack!r} ({phase}); run as a vCenter administrator, with GOVC_URL set")
    if not (principal or user):
        print("# PRINCIPAL: the account in vsphere:user (or VSPHERE_USER), e.g. PRINCIPAL=labs-k8s@vsphere.local")
    print(render_govc(placement, phase=phase, principal=principal or user))
    return 0
