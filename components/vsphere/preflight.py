"""Preflight: can this vCenter host the stack? Every problem found, before anything is created."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from pyVmomi import vim, vmodl

from components.vsphere.errors import VSphereError
from components.vsphere.inventory import (
    find_cluster,
    find_datacenter,
    find_datastore,
    find_network,
    find_resource_pool,
    find_vm_by_uuid,
    find_vm_folder,
    inventory_path,
    vm_ips,
    vm_stack,
)
from components.vsphere.session import GiB, collect_properties, present
from components.vsphere.subnet import check_node_subnet
from components.vsphere.template import DEBIAN12_GUEST_ID, GUEST_ID_FALLBACKS, choose_guest_id

MiB = 1024**2


@dataclass(frozen=True)
class PlannedVm:
    """A VM the stack will have: its name, IPs and eager-zeroed disks (the golden template too)."""

    name: str
    ip_addresses: tuple[str, ...] = ()
    disk_gib: tuple[int, ...] = ()
    memory_mib: int = 0  # its .vswp swap file is this big (no reservation)


@dataclass(frozen=True)
class HeldSpace:
    """What one of the stack's VMs that already exists holds on the target datastore."""

    disk_bytes: int
    swap_bytes: int  # a running VM's .vswp; a template or a stopped VM has none
    template: bool = False  # never powered on, so it will never need swap


@dataclass(frozen=True)
class AntiAffinityRule:
    """A VM-VM anti-affinity rule: ``mandatory`` means 'must', else 'should'."""

    name: str
    vm_names: tuple[str, ...]
    mandatory: bool = True


@dataclass(frozen=True)
class PreflightSpec:
    datacenter: str
    cluster: str
    datastore: str
    network: str
    vm_folder: str = ""
    resource_pool: str | None = None
    stack: str = ""  # value of STACK_TAG_KEY on the VMs this stack owns
    vms: tuple[PlannedVm, ...] = ()
    extra_ips: tuple[str, ...] = ()  # addresses no VM may hold, e.g. the API VIP
    anti_affinity_rules: tuple[AntiAffinityRule, ...] = ()
    drs_required: bool = True  # False: DRS off is a warning instead of an error
    # VM name -> the BIOS UUID the stack's state records for it ("" = no such resource in the
    # state); None: the state could not be read, so a tagged VM is taken for the stack's own.
    state_uuids: Mapping[str, str] | None = None
    # Node name -> (template UUID its clone source in the state keeps, that source's URN), for
    # nodes this run clones while keeping their clone source (identity unchanged).
    clone_sources: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    free_space_margin: float = 0.15  # on top of disks + swap: snapshots, logs, growth
    node_cidr: str = ""  # labs-k8s:network.cidr: warn when the port group's VMs report none inside (subnet.py)


@dataclass(frozen=True)
class Finding:
    check: str
    message: str

    def __str__(self) -> str:
        return f"[{self.check}] {self.message}"


@dataclass
class PreflightReport:
    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    connected_hosts: int | None = None
    datastore_free_bytes: int | None = None
    required_bytes: int = 0
    existing_vms: list[str] = field(default_factory=list)  # the stack's own, already holding their space
    guest_id: str | None = None  # the guest id the template and its clones will use here
    notes: list[str] = field(default_factory=list)  # facts worth printing, not problems

    @property
    def ok(self) -> bool:
        return not self.errors

    def error(self, check: str, message: str) -> None:
        self.errors.append(Finding(check, message))

    def warn(self, check: str, message: str) -> None:
        self.warnings.append(Finding(check, message))

    def render(self) -> str:
        lines = [f"preflight: {len(self.errors)} error(s), {len(self.warnings)} warning(s)"]
        lines += [f"ERROR   {f}" for f in self.errors]
        lines += [f"WARNING {f}" for f in self.warnings]
        return "\n".join(lines)


def _lookup(report: PreflightReport, check: str, fix: str, fn: Any, *args: Any) -> Any:
    """Run a finder; record a missing/ambiguous object as an error, return None."""
    try:
        return fn(*args)
    except VSphereError as exc:
        report.error(check, f"{exc}. {fix}")
        return None


def _cluster_config(cluster: vim.ClusterComputeResource) -> vim.cluster.ConfigInfoEx:
    # configurationEx is declared on ComputeResource as a ComputeResource.ConfigInfo; a cluster's is
    # always its subclass ClusterConfigInfoEx (vSphere API reference), which has DRS and the rules.
    return cast(vim.cluster.ConfigInfoEx, cluster.configurationEx)


def _check_drs(report: PreflightReport, spec: PreflightSpec, cluster: vim.ClusterComputeResource) -> None:
    if not spec.anti_affinity_rules:
        return  # nothing depends on DRS then
    drs = _cluster_config(cluster).drsConfig
    if not drs.enabled:
        message = (
            f"DRS is disabled on cluster {cluster.name!r}, so the anti-affinity rules "
            f"({', '.join(r.name for r in spec.anti_affinity_rules)}) would be created but do nothing: "
            "only DRS places VMs by them, and the control-plane VMs could all land on one host. "
            "Enable DRS on the cluster (vSphere Client: cluster > Configure > vSphere DRS > Edit), "
            "or turn the anti-affinity rules off in the stack configuration"
        )
        (report.error if spec.drs_required else report.warn)("drs", message)
        return
    # Unset means the API's default, fully automated (vcsim leaves it unset).
    behavior = str(drs.defaultVmBehavior or vim.cluster.DrsConfigInfo.DrsBehavior.fullyAutomated)
    if behavior != str(vim.cluster.DrsConfigInfo.DrsBehavior.fullyAutomated):
        # The rules need the VMs' ids, so they are made after the clones are placed and powered on,
        # and a replaced node is placed while its rule is deleted and remade: only a DRS that
        # migrates by itself moves rule members apart afterwards.
        what = (
            "only makes recommendations that someone must apply"
            if behavior == "manual"
            else "places VMs at power-on but never migrates them"
        )
        report.warn(
            "drs",
            f"DRS on cluster {cluster.name!r} is {behavior}: it {what}. The anti-affinity rules "
            f"({', '.join(r.name for r in spec.anti_affinity_rules)}) are created after their VMs are placed, "
            "so members that start on one host stay there, and losing that host takes them all. Set the "
            "automation level to fully automated (vSphere Client: cluster > Configure > vSphere DRS > Edit)",
        )
    _check_rule_compliance(report, spec, cluster)


def _check_rule_compliance(report: PreflightReport, spec: PreflightSpec, cluster: vim.ClusterComputeResource) -> None:
    for message in rule_violations(cluster, {rule.name for rule in spec.anti_affinity_rules}):
        report.warn("drs", message)


def rule_violations(cluster: vim.ClusterComputeResource, names: set[str]) -> list[str]:
    """The rules called ``names`` that exist and do not hold, each with its VMs; [] = all hold.

    ClusterRuleInfo.inCompliance is vCenter's verdict (unset until DRS has evaluated the rule);
    distinct runtime.host is checked as well, which holds right after a rule is made and for a
    should-rule DRS gave up on. Preflight reports the state the last `up` left; the program asks
    again once its rules exist (components/preflight.py check_rules_after_up).
    """
    found: list[str] = []
    for rule in _cluster_config(cluster).rule or []:
        if rule.name not in names:  # the stack's names; the program only makes anti-affinity rules
            continue
        # A rule of the stack's is an anti-affinity rule: the program names no other kind so.
        rule_vms = cast(vim.cluster.AntiAffinityRuleSpec, rule).vm
        members = [(vm.name, vm.runtime.host) for vm in rule_vms or []]
        by_host: dict[str, list[str]] = {}
        for name, host in members:
            if host is not None:
                by_host.setdefault(host.name, []).append(name)
        shared = {host: vms for host, vms in by_host.items() if len(vms) > 1}
        if rule.inCompliance is not False and not shared:
            continue
        where = "; ".join(f"{', '.join(sorted(vms))} on {host}" for host, vms in sorted(shared.items()))
        found.append(
            f"anti-affinity rule {rule.name!r} is violated"
            + (f": {where}" if where else f" (vCenter: not in compliance; VMs {', '.join(n for n, _ in members)})")
            + ". One host failure takes all of them. Let DRS fix it (fully automated), or vMotion one of them "
            'to another host (docs/runbook.md, "Host maintenance")'
        )
    return found


def check_rules(si: vim.ServiceInstance, datacenter: str, cluster: str, names: set[str]) -> list[str]:
    """rule_violations of the cluster found by its configured name."""
    return rule_violations(find_cluster(si, find_datacenter(si, datacenter), cluster), names)


def _connected_hosts(si: vim.ServiceInstance, cluster: vim.ClusterComputeResource) -> list[tuple[Any, dict[str, Any]]]:
    rows = collect_properties(
        si, cluster, vim.HostSystem, ["name", "runtime.connectionState", "runtime.inMaintenanceMode", "datastore"]
    )
    return [
        (host, props)
        for host, props in rows
        if props.get("runtime.connectionState") == "connected" and not props.get("runtime.inMaintenanceMode")
    ]


def _check_hosts(report: PreflightReport, spec: PreflightSpec, cluster: vim.ClusterComputeResource, hosts: int) -> None:
    report.connected_hosts = hosts
    if hosts == 0:
        report.error("hosts", f"cluster {cluster.name!r} has no connected host outside maintenance mode")
        return
    for rule in spec.anti_affinity_rules:
        count = len(rule.vm_names)
        if count == hosts and rule.mandatory:
            # A must-rule with one member per host leaves DRS nowhere to put a member: vSphere
            # Resource Management, "VM-VM Affinity Rule Conflicts" / mandatory rules are never violated.
            report.warn(
                "hosts",
                f"mandatory anti-affinity rule {rule.name!r} has {count} VMs ({', '.join(rule.vm_names)}) on the "
                f"{hosts} connected hosts of cluster {cluster.name!r}: while one host is down or in maintenance "
                "mode, no host is left for its member, so DRS cannot evacuate a host for maintenance mode, a "
                "manual vMotion to an occupied host is refused, and a member cannot be powered on. Follow "
                'docs/runbook.md "Host maintenance" for each maintenance, add a host, or make the rule '
                "preferred (labs-k8s:antiAffinity)",
            )
        if count <= hosts:
            continue
        text = (
            f"anti-affinity rule {rule.name!r} keeps its {count} VMs ({', '.join(rule.vm_names)}) "
            f"on {count} different hosts, but cluster {cluster.name!r} has only {hosts} connected "
            "host(s) outside maintenance mode"
        )
        if rule.mandatory:
            report.error(
                "hosts",
                f"{text}: vCenter would refuse to power on the extra VMs. Add hosts, take hosts "
                "out of maintenance mode, or make the rule non-mandatory (should instead of must)",
            )
        else:
            report.warn("hosts", f"{text}: some of them will share a host, losing that redundancy")


def _check_datastore(
    report: PreflightReport,
    spec: PreflightSpec,
    datastore: vim.Datastore,
    hosts: list[tuple[Any, dict[str, Any]]],
    held: Mapping[str, HeldSpace],
) -> None:
    summary = datastore.summary
    if not summary.accessible:
        report.error("datastore", f"datastore {datastore.name!r} is not accessible; check its mounts")
        return
    # Only what does not exist yet: on a re-run or a PR preview the stack's own VMs already hold
    # their disks and swap, and the datastore's free space is what is left after them.
    disks = swap = 0
    for vm in spec.vms:
        planned_disk = sum(vm.disk_gib) * GiB
        planned_swap = vm.memory_mib * MiB
        space = held.get(vm.name)
        if space is not None:
            planned_disk = max(0, planned_disk - space.disk_bytes)
            planned_swap = 0 if space.template else max(0, planned_swap - space.swap_bytes)
        disks += planned_disk
        swap += planned_swap
    report.existing_vms = sorted(held)
    required = int((disks + swap) * (1 + spec.free_space_margin))
    report.required_bytes = required
    report.datastore_free_bytes = int(summary.freeSpace)
    if summary.freeSpace < required:
        existing = (
            f"; the stack's VMs that exist already ({', '.join(sorted(held))}) are not counted again" if held else ""
        )
        report.error(
            "datastore",
            f"datastore {datastore.name!r} has {summary.freeSpace / GiB:.1f} GiB free, but the stack needs "
            f"{required / GiB:.1f} GiB more ({disks / GiB:.0f} GiB of eager-zeroed disks, which are fully "
            f"allocated at clone time, + {swap / GiB:.1f} GiB of VM swap files + "
            f"{spec.free_space_margin:.0%} margin{existing}). Free space, pick a bigger datastore "
            "(labs-k8s:vsphere.datastore), or shrink the disks",
        )
    mounted = [props["name"] for _, props in hosts if datastore in (props.get("datastore") or [])]
    unmounted = sorted(props["name"] for _, props in hosts if props["name"] not in mounted)
    largest_rule = max((len(r.vm_names) for r in spec.anti_affinity_rules if r.mandatory), default=1)
    # Too few hosts overall is the host check's finding; blame the datastore
    # only when hosts exist that it does not reach.
    if hosts and len(mounted) < min(largest_rule, len(hosts)):
        report.error(
            "datastore",
            f"datastore {datastore.name!r} is mounted on {len(mounted)} connected host(s) of the cluster, "
            f"but anti-affinity needs {largest_rule} hosts that can all reach it. Use shared storage "
            "mounted on every host (a host-local datastore pins VMs to that host)",
        )
    elif unmounted:
        report.warn(
            "datastore",
            f"datastore {datastore.name!r} is not mounted on {', '.join(unmounted)}; "
            "VMs on it cannot run there. Mount it on every host of the cluster",
        )


DATASTORE_KEY = "labs-k8s:vsphere.datastore"
# summary.type values (vim.host.FileSystemVolume.FileSystemType) the lab's disks work on.
NFS_TYPES = ("NFS", "NFS41")
# Storage that provisions by policy or offers no thick disks: vVols (namespaces, storage policy),
# PMem (persistent memory, vPMemDisk only), vFlash (VFFS: a host's flash cache, no VM files).
REFUSED_TYPES = ("VVOL", "PMEM", "VFFS")


def _nfs_without_acceleration(datastore: vim.Datastore, hosts: list[tuple[Any, dict[str, Any]]]) -> dict[str, str]:
    """Host name -> its vStorageSupport for ``datastore``, for every host that lacks VAAI-NAS on it.

    Each host's NAS plug-in decides (HostFileSystemMountInfo.vStorageSupport, read from the host's
    storage system); a host that does not mount the datastore is the mount check's business.
    """
    lacking: dict[str, str] = {}
    for host, props in hosts:
        if datastore not in (props.get("datastore") or []):
            continue
        try:
            storage = host.configManager.storageSystem
            info = storage.fileSystemVolumeInfo if storage is not None else None
            volumes = (info.mountInfo if info is not None else None) or []
        except vmodl.MethodFault:  # a host that cannot say counts as one without acceleration
            volumes = []
        status = next(
            (str(info.vStorageSupport) for info in volumes if getattr(info.volume, "name", None) == datastore.name),
            "vStorageUnknown",
        )
        if status != "vStorageSupported":
            lacking[props["name"]] = status
    return lacking


def _check_datastore_type(
    report: PreflightReport, datastore: vim.Datastore, hosts: list[tuple[Any, dict[str, Any]]]
) -> None:
    """Can this datastore hold eager-zeroed thick disks in a directory of our own? Refuse it if not.

    - vSAN (and vVols): top-level directories are namespaces that only
      DatastoreNamespaceManager.CreateDirectory makes (capability.topLevelDirectoryCreateSupported
      is false, so the ISO upload's FileManager.MakeDirectory fails), and disks are provisioned by
      the VM storage policy, not by eagerlyScrub: the template's hardware check cannot pass.
    - NFS: "On NFS datastores that do not support Hardware Acceleration, only thin format is
      available" (VMware vSphere Storage guide, virtual disk provisioning): CreateVM fails or
      the disk comes out thin, an hour into the build.
    """
    kind = str(datastore.summary.type)
    capability = datastore.capability
    fix = (
        f"Set {DATASTORE_KEY} to a VMFS datastore, or an NFS datastore with hardware acceleration "
        '(the storage vendor\'s VAAI-NAS plug-in) on every host (docs/template.md, "Storage")'
    )
    if kind == "vsan" or (capability is not None and capability.topLevelDirectoryCreateSupported is False):
        report.error(
            "datastore",
            f"datastore {datastore.name!r} is of type {kind}, which labs-k8s does not support: its top-level "
            "directories are namespaces (topLevelDirectoryCreateSupported is false), and it provisions disks "
            "by the VM storage policy, not as the eager-zeroed thick disks the template and every clone "
            f"need. {fix}",
        )
        return
    if kind in NFS_TYPES:
        lacking = _nfs_without_acceleration(datastore, hosts)
        if lacking:
            which = ", ".join(f"{name} ({status})" for name, status in sorted(lacking.items()))
            report.error(
                "datastore",
                f"NFS datastore {datastore.name!r} has no hardware acceleration on {which}: on such a "
                "datastore vSphere offers only thin disks, and the template and every clone need "
                "eager-zeroed thick ones (the build would fail its hardware check, and so would every "
                f"rebuild). Install and enable the storage vendor's VAAI-NAS plug-in on those hosts, or: {fix}",
            )
        return
    if kind in REFUSED_TYPES:
        report.error(
            "datastore",
            f"datastore {datastore.name!r} is of type {kind}, which cannot hold the lab's eager-zeroed thick "
            f"disks. {fix}",
        )
    elif kind != "VMFS":
        # vcsim's datastores are "OTHER" (a local directory); so may be a site's odd storage.
        report.warn(
            "datastore",
            f"datastore {datastore.name!r} is of type {kind}, which preflight cannot check: labs-k8s supports "
            "VMFS and NFS with hardware acceleration, and the template build fails its hardware check on "
            f"storage that does not provision eager-zeroed thick disks. {fix}",
        )


def _check_collisions(
    report: PreflightReport, spec: PreflightSpec, si: vim.ServiceInstance
) -> list[vim.VirtualMachine]:
    """Our names and IPs must not be in use by VMs of any other stack (whole vCenter).

    Returns the VMs that are this stack's own (its name, its tag): they exist already.
    """
    names = {vm.name for vm in spec.vms}
    owner_of_ip = {ip: vm.name for vm in spec.vms for ip in vm.ip_addresses}
    owner_of_ip.update({ip: "extra address" for ip in spec.extra_ips})
    root = si.RetrieveContent().rootFolder
    own: list[vim.VirtualMachine] = []
    for vm, props in collect_properties(si, root, vim.VirtualMachine, ["name", "guest.ipAddress", "guest.net"]):
        name = props.get("name", "")
        clashes = sorted(vm_ips(props) & owner_of_ip.keys())
        if name not in names and not clashes:
            continue
        # Only now read extraConfig: it is large, and only suspects need it.
        stack = vm_stack(vm)
        if spec.stack and stack == spec.stack:
            if name in names and _leftover(report, spec, si, vm, name):
                continue
            if name in names:
                own.append(vm)
            continue
        owner = f"stack {stack!r}" if stack else "no stack of ours"
        path = inventory_path(si, vm)
        if name in names:
            report.error(
                "names",
                f"VM name {name!r} is already used by {path} ({owner}). Rename or remove that VM, "
                "or change the VM name prefix of this stack",
            )
        for ip in clashes:
            report.error(
                "addresses",
                f"address {ip} (planned for {owner_of_ip[ip]}) is already used by VM {path} ({owner}). "
                "Pick another address in the stack configuration or free it",
            )
    return own


def _leftover(
    report: PreflightReport, spec: PreflightSpec, si: vim.ServiceInstance, vm: vim.VirtualMachine, name: str
) -> bool:
    """A VM with a node's name and this stack's tag that the state does not know: an error, True.

    The provider deletes a clone whose post-clone reconfigure failed (its api_timeout ran out while
    vCenter was still zeroing the data disk: terraform-provider-vsphere
    resourceVSphereVirtualMachineRollbackCreate); when that delete fails or is cut short the VM
    stays, tagged by its extraConfig, and the next create stops at DuplicateName.
    """
    if spec.state_uuids is None or name not in spec.state_uuids:
        return False
    recorded = spec.state_uuids[name]
    uuid = str(present(vm.config, "VirtualMachine.config").uuid)
    if recorded == uuid:
        return False
    known = f"the state records uuid {recorded}" if recorded else "the stack's state has no VM of that name"
    report.error(
        "names",
        f"VM {inventory_path(si, vm)} (uuid {uuid}) carries this stack's tag, but {known}: it is left over from a "
        "create that failed half-way (the vSphere provider deletes a clone whose disks were not ready within "
        "vsphere:apiTimeout, and a failed or cut-short delete leaves it behind), and the next create would stop "
        "at DuplicateName. Make sure it holds nothing you need, delete it in vCenter (power off, Delete from "
        "Disk), and run the command again; then raise vsphere:apiTimeout if it was a timeout "
        "(docs/troubleshooting.md). If instead the stack's state was lost, `pulumi import` the VM rather than "
        "deleting it",
    )
    return True


def _check_clone_sources(report: PreflightReport, spec: PreflightSpec, si: vim.ServiceInstance) -> None:
    """A node to be cloned again from a template that no longer exists (deleted outside Pulumi
    after a template rebuild): the provider would stop with "virtual machine with UUID ... not
    found" (its CustomizeDiff, vmworkflow.ValidateVirtualMachineClone)."""
    for node, (uuid, urn) in sorted(spec.clone_sources.items()):
        if find_vm_by_uuid(si, uuid) is not None:
            continue
        report.error(
            "clone source",
            f"node {node} has no VM in the stack's state (deleted outside Pulumi?) and would be cloned again "
            f"from template uuid {uuid}, which its clone source kept from the node's creation and which "
            "vCenter no longer has (the template was rebuilt since). Replace the clone source, so the node is "
            f"cloned from the current template: pulumi up --replace '{urn}' (docs/troubleshooting.md)",
        )


def _on(backing: Any, datastore: vim.Datastore) -> bool:
    if getattr(backing, "datastore", None) is not None:
        return bool(backing.datastore == datastore)
    return str(getattr(backing, "fileName", "")).startswith(f"[{datastore.name}]")


def _held_space(vms: list[vim.VirtualMachine], datastore: vim.Datastore) -> dict[str, HeldSpace]:
    """Disk and swap the stack's existing VMs hold on ``datastore`` (a VM elsewhere holds none there)."""
    held: dict[str, HeldSpace] = {}
    for vm in vms:
        config = present(vm.config, "VirtualMachine.config")
        disk_bytes = sum(
            int(device.capacityInBytes or device.capacityInKB * 1024)
            for device in config.hardware.device
            if isinstance(device, vim.vm.device.VirtualDisk) and _on(device.backing, datastore)
        )
        running = str(vm.runtime.powerState) == "poweredOn"
        swap_bytes = int(config.hardware.memoryMB) * MiB if running and not config.template else 0
        held[vm.name] = HeldSpace(disk_bytes=disk_bytes, swap_bytes=swap_bytes, template=bool(config.template))
    return held


def _check_guest_id(report: PreflightReport, cluster: vim.ClusterComputeResource) -> None:
    """Which guest id the template (and so every clone) will get on this vSphere."""
    try:
        guest_id, notes = choose_guest_id(cluster, DEBIAN12_GUEST_ID, GUEST_ID_FALLBACKS)
    except VSphereError as error:
        report.error("guest id", str(error))
        return
    report.guest_id = guest_id
    report.notes.append(f"guest id: the template and its clones will use {guest_id}")
    report.notes.extend(f"guest id: {note}" for note in notes)


def preflight(si: vim.ServiceInstance, spec: PreflightSpec) -> PreflightReport:
    """Check vCenter can host the stack before anything is created.

    Every problem found is reported, not only the first; checks that depend on
    a missing object are skipped (their error already says what to fix).
    """
    report = PreflightReport()
    dc = _lookup(
        report,
        "datacenter",
        "Fix labs-k8s:vsphere.datacenter in the stack configuration.",
        find_datacenter,
        si,
        spec.datacenter,
    )
    if dc is None:
        _check_collisions(report, spec, si)
        return report
    own = _check_collisions(report, spec, si)
    if spec.node_cidr and (subnet := check_node_subnet(si, spec.network, spec.node_cidr)):
        report.warn("network", subnet)
    _check_clone_sources(report, spec, si)
    cluster = _lookup(
        report,
        "cluster",
        "Fix labs-k8s:vsphere.computeCluster in the stack configuration.",
        find_cluster,
        si,
        dc,
        spec.cluster,
    )
    datastore = _lookup(
        report,
        "datastore",
        "Fix labs-k8s:vsphere.datastore in the stack configuration.",
        find_datastore,
        si,
        dc,
        spec.datastore,
    )
    _lookup(
        report,
        "network",
        "Fix labs-k8s:vsphere.network (the port group the nodes sit on) in the stack configuration.",
        find_network,
        si,
        dc,
        spec.network,
    )
    _lookup(
        report,
        "folder",
        "Create the VM folder, or fix labs-k8s:vsphere.folder in the stack configuration.",
        find_vm_folder,
        si,
        dc,
        spec.vm_folder,
    )
    hosts: list[tuple[Any, dict[str, Any]]] = []
    if cluster is not None:
        _lookup(
            report,
            "resource pool",
            "Create the resource pool, or fix labs-k8s:vsphere.resourcePool in the stack configuration.",
            find_resource_pool,
            si,
            cluster,
            spec.resource_pool,
        )
        _check_drs(report, spec, cluster)
        hosts = _connected_hosts(si, cluster)
        _check_hosts(report, spec, cluster, len(hosts))
        _check_guest_id(report, cluster)
    if datastore is not None:
        _check_datastore_type(report, datastore, hosts)
        _check_datastore(report, spec, datastore, hosts, _held_space(own, datastore))
    return report
