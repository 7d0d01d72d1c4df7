"""Finding inventory objects by name or path, and telling which stack owns a VM."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from pyVmomi import vim

from components.vsphere.errors import AmbiguousError, NotFoundError, VSphereError
from components.vsphere.session import collect_properties, present

# extraConfig key marking VMs this stack owns; preflight does not call a VM
# with our name a conflict when it carries our stack's value here. guestinfo.*
# keys are plain VMX options, readable (not writable) from inside the guest.
STACK_TAG_KEY = "guestinfo.labs-k8s.stack"


def inventory_path(si: vim.ServiceInstance, entity: vim.ManagedEntity) -> str:
    """'DC0/host/DC0_C0' style path of an entity (root folder excluded).

    Stops at the root folder instead of reading its unset ``parent``: vcsim
    0.24 crashes the request when an unset property is fetched on its own.
    """
    root = si.RetrieveContent().rootFolder
    parts: list[str] = []
    current: Any = entity
    while current is not None and current != root:
        parts.append(current.name)
        current = current.parent
    return "/".join(reversed(parts))


def _by_path(si: vim.ServiceInstance, path: str) -> Any:
    return present(si.RetrieveContent().searchIndex, "ServiceContent.searchIndex").FindByInventoryPath(path)


def _find_under(
    si: vim.ServiceInstance,
    kind: str,
    name: str,
    base: vim.ManagedEntity,
    vimtypes: tuple[type, ...],
) -> Any:
    """Find ``name`` under ``base``: as a path relative to it, else by unique name.

    A relative path ("sub/cluster") is exact. A bare name is also searched in
    subfolders, because users rarely know which folder a cluster sits in; two
    matches are an error rather than a guess.
    """
    base_path = inventory_path(si, base)
    obj = _by_path(si, f"{base_path}/{name}") if name else base
    if obj is not None and isinstance(obj, vimtypes):
        return obj
    rows: list[tuple[Any, dict[str, Any]]] = []
    for vimtype in vimtypes:
        rows.extend(collect_properties(si, base, vimtype, ["name"]))
    if "/" not in name:
        matches = [o for o, props in rows if props.get("name") == name]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            paths = ", ".join(sorted(inventory_path(si, m) for m in matches))
            raise AmbiguousError(
                f"{kind} name {name!r} matches {len(matches)} objects ({paths}); "
                f"give its path relative to {base_path!r} instead"
            )
    available = sorted({str(props.get("name")) for _, props in rows})
    raise NotFoundError(kind, name, f"{base_path!r} (searched by path and by name)", available)


def find_datacenter(si: vim.ServiceInstance, name: str) -> vim.Datacenter:
    """Datacenter by name or inventory path ('Folder/DC')."""
    root = si.RetrieveContent().rootFolder
    obj = _by_path(si, name)
    if isinstance(obj, vim.Datacenter):
        return obj
    rows = collect_properties(si, root, vim.Datacenter, ["name"])
    matches = [o for o, props in rows if props["name"] == name]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise AmbiguousError(f"datacenter name {name!r} is used {len(matches)} times; give its folder path")
    raise NotFoundError("datacenter", name, "vCenter inventory", [p["name"] for _, p in rows])


def find_cluster(si: vim.ServiceInstance, dc: vim.Datacenter, name: str) -> vim.ClusterComputeResource:
    """Compute cluster by name or path relative to the datacenter's host folder."""
    return _find_under(si, "compute cluster", name, dc.hostFolder, (vim.ClusterComputeResource,))


def find_datastore(si: vim.ServiceInstance, dc: vim.Datacenter, name: str) -> vim.Datastore:
    """Datastore by name or path relative to the datacenter's datastore folder."""
    return _find_under(si, "datastore", name, dc.datastoreFolder, (vim.Datastore,))


def find_network(si: vim.ServiceInstance, dc: vim.Datacenter, name: str) -> vim.Network:
    """Standard portgroup or distributed portgroup by name/path in the network folder.

    DVS uplink portgroups are refused: a VM NIC there never gets traffic.
    """
    net = _find_under(si, "network", name, dc.networkFolder, (vim.Network,))
    if isinstance(net, vim.dvs.DistributedVirtualPortgroup) and bool(getattr(net.config, "uplink", False)):
        raise VSphereError(
            f"network {name!r} is the uplink portgroup of a distributed switch; "
            "choose a VM portgroup of that switch instead"
        )
    return net


def find_vm_folder(si: vim.ServiceInstance, dc: vim.Datacenter, path: str = "") -> vim.Folder:
    """VM folder by path relative to the datacenter's 'vm' folder ('' = that folder)."""
    return _find_under(si, "VM folder", path.strip("/"), dc.vmFolder, (vim.Folder,))


def find_resource_pool(
    si: vim.ServiceInstance, cluster: vim.ClusterComputeResource, path: str | None = None
) -> vim.ResourcePool:
    """Resource pool by path below the cluster's root pool; None/'' = root pool."""
    root = present(cluster.resourcePool, "ClusterComputeResource.resourcePool")
    if not path:
        return root
    return _find_under(si, "resource pool", path.strip("/"), root, (vim.ResourcePool,))


def find_vm(si: vim.ServiceInstance, name: str, datacenter: vim.Datacenter | None = None) -> vim.VirtualMachine | None:
    """The VM or template called ``name`` (None if absent; error if several)."""
    root = datacenter.vmFolder if datacenter is not None else si.RetrieveContent().rootFolder
    rows = collect_properties(si, root, vim.VirtualMachine, ["name"])
    matches = [o for o, props in rows if props.get("name") == name]
    if len(matches) > 1:
        paths = ", ".join(sorted(inventory_path(si, m) for m in matches))
        raise AmbiguousError(f"VM name {name!r} is used by {len(matches)} VMs ({paths}); rename or remove the extras")
    return matches[0] if matches else None


def find_vm_by_uuid(si: vim.ServiceInstance, uuid: str) -> vim.VirtualMachine | None:
    """The VM or template whose BIOS UUID (config.uuid, see template_uuid) is ``uuid``."""
    index = present(si.RetrieveContent().searchIndex, "ServiceContent.searchIndex")
    # Typed as any ManagedEntity; with vmSearch=True it finds only VMs and templates.
    return cast(
        "vim.VirtualMachine | None", index.FindByUuid(datacenter=None, uuid=uuid, vmSearch=True, instanceUuid=False)
    )


def get_vm(si: vim.ServiceInstance, name: str, datacenter: vim.Datacenter | None = None) -> vim.VirtualMachine:
    """Like find_vm, but a missing VM is a NotFoundError."""
    vm = find_vm(si, name, datacenter)
    if vm is None:
        where = f"datacenter {datacenter.name!r}" if datacenter is not None else "vCenter inventory"
        raise NotFoundError("VM", name, where)
    return vm


def stack_tag(stack: str) -> dict[str, str]:
    """extraConfig entry that marks a VM as owned by ``stack`` (see preflight)."""
    return {STACK_TAG_KEY: stack}


def vm_ips(props: Mapping[str, Any]) -> set[str]:
    """Guest addresses in a property row of guest.ipAddress and guest.net."""
    ips = {props["guest.ipAddress"]} if props.get("guest.ipAddress") else set()
    for nic in props.get("guest.net") or []:
        ips.update(nic.ipAddress or [])
    return ips


def vm_stack(vm: vim.VirtualMachine) -> str | None:
    """The stack that tagged ``vm`` (extraConfig STACK_TAG_KEY), or None when untagged."""
    for option in present(vm.config, "VirtualMachine.config").extraConfig or []:
        if option.key == STACK_TAG_KEY:
            return str(option.value)
    return None
