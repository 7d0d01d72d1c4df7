"""Building the golden template: the builder VM, its hardware, and turning it into a template.

Upstream pitfalls this module works around (cited where they bite):
- vmware/packer-examples-for-vsphere#964: Debian templates built with UEFI +
  Secure Boot produce clones that do not boot (the installer writes only
  EFI/debian/shimx64.efi to NVRAM, which a clone does not carry). BIOS is the
  default here; EFI is possible but never with Secure Boot.
- hashicorp/packer#9547: sending bootOptions.efiSecureBootEnabled to a host
  that does not know it fails the whole CreateVM; we only send it for EFI.
- Kubernetes' vSphere CSI driver needs disk.EnableUUID=TRUE in the VM so the
  guest sees stable disk serials (kubernetes-sigs/vsphere-csi-driver docs,
  "Prerequisites"); clones inherit it from the template.
- Clones inherit the template's disk provisioning (the vsphere provider's
  clone docs require a clone disk's thin_provisioned/eagerly_scrub to match
  the template's), so the template's disks must already be thick
  eager-zeroed: no first-write zeroing penalty under etcd's fsyncs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pyVmomi import vim

from components.vsphere.errors import VSphereError, VSphereTimeoutError
from components.vsphere.inventory import (
    find_cluster,
    find_datacenter,
    find_datastore,
    find_network,
    find_resource_pool,
    find_vm,
    find_vm_folder,
)
from components.vsphere.session import GiB, present, wait_for_task
from components.vsphere.vm import destroy_vm, power_state, wait_for_power_state

log = logging.getLogger(__name__)

# Guest ids from most to least specific. debian12_64Guest only exists in recent
# vSphere 8 releases; older hosts do not list it (vCenter then fails CreateVM
# with InvalidArgument configSpec.guestId), so we fall back in this order.
DEBIAN12_GUEST_ID = "debian12_64Guest"
GUEST_ID_FALLBACKS: tuple[str, ...] = (
    "debian11_64Guest",
    "debian10_64Guest",
    "other5xLinux64Guest",
    "other4xLinux64Guest",
    "other3xLinux64Guest",
    "otherLinux64Guest",
)

Firmware = Literal["bios", "efi"]


class HardwareProblem(str):
    """One finding of verify_template_hardware; ``datastore_bound``: the datastore decided it.

    A disk that comes out thin or lazy-zeroed although CreateVM asked for eager-zeroed thick is
    the datastore's doing (NFS without hardware acceleration offers only thin disks, VMware
    vSphere Storage guide, "Thick Provision" formats on NFS; vSAN provisions by its storage
    policy): a rebuild on the same datastore ends the same, so the message must not promise one.
    """

    datastore_bound: bool = False

    @classmethod
    def of_datastore(cls, text: str) -> HardwareProblem:
        problem = cls(text)
        problem.datastore_bound = True
        return problem


@dataclass(frozen=True)
class BuilderVmSpec:
    """The VM the Debian installer runs in before it becomes the template."""

    name: str
    datacenter: str
    cluster: str
    datastore: str
    network: str
    iso_path: str  # datastore path, "[ds] iso/debian-12-preseeded.iso"
    folder: str = ""
    resource_pool: str | None = None
    num_cpus: int = 2
    memory_mib: int = 2048
    disk_gib: int = 20
    guest_id: str = DEBIAN12_GUEST_ID
    guest_id_fallbacks: tuple[str, ...] = GUEST_ID_FALLBACKS
    firmware: Firmware = "bios"
    annotation: str = ""
    extra_config: Mapping[str, str] = field(default_factory=dict)
    create_timeout_s: float = 3600  # eager zeroing writes the whole disk first


@dataclass(frozen=True)
class BuilderVm:
    """What create_builder_vm made; ``notes`` lists deliberate fallbacks."""

    vm: vim.VirtualMachine
    moid: str
    uuid: str
    guest_id: str
    notes: tuple[str, ...] = ()


def supported_guest_ids(cluster: vim.ClusterComputeResource, wanted: Sequence[str]) -> set[str] | None:
    """Which of ``wanted`` the cluster's hosts accept as guestId; None = cannot tell.

    QueryConfigOptionEx filters guestOSDescriptor to the ids in the spec and,
    per the API reference, returns the whole list when none match, so the
    intersection with ``wanted`` is the answer either way. pyVmomi rejects
    (TypeError) descriptors that lack required fields, which is what vcsim
    0.24 sends; an answer without descriptors also tells us nothing.
    """
    spec = vim.EnvironmentBrowser.ConfigOptionQuerySpec(guestId=list(wanted))
    try:
        option = present(cluster.environmentBrowser, "ComputeResource.environmentBrowser").QueryConfigOptionEx(spec)
    except TypeError as exc:
        log.warning("cannot read the guest OS list of cluster %r: %s", cluster.name, exc)
        return None
    descriptors = getattr(option, "guestOSDescriptor", None) or []
    if not descriptors:
        return None
    return {d.id for d in descriptors} & set(wanted)


def choose_guest_id(
    cluster: vim.ClusterComputeResource, preferred: str, fallbacks: Sequence[str]
) -> tuple[str, list[str]]:
    """Pick ``preferred`` or the first supported fallback; return (id, notes).

    A fallback only changes VMware Tools/driver defaults vCenter applies, not
    how Debian 12 runs, so it is a note, not an error.
    """
    chain = [preferred, *fallbacks]
    supported = supported_guest_ids(cluster, chain)
    if supported is None:
        note = (
            f"could not read which guest ids cluster {cluster.name!r} supports; "
            f"using {preferred} unverified (vCenter rejects it with "
            "InvalidArgument configSpec.guestId if it is unknown there)"
        )
        log.warning(note)
        return preferred, [note]
    for guest_id in chain:
        if guest_id not in supported:
            continue
        if guest_id == preferred:
            return guest_id, []
        note = (
            f"guest id {preferred} is not supported by cluster {cluster.name!r} "
            f"(older vSphere); using {guest_id} instead"
        )
        log.warning(note)
        return guest_id, [note]
    raise VSphereError(
        f"cluster {cluster.name!r} supports none of the guest ids {', '.join(chain)}; "
        "set the template's guest id to one your vSphere version lists"
    )


def _nic_backing(network: vim.Network) -> vim.vm.device.VirtualDevice.BackingInfo:
    if isinstance(network, vim.dvs.DistributedVirtualPortgroup):
        switch = present(network.config.distributedVirtualSwitch, "DVPortgroupConfigInfo.distributedVirtualSwitch")
        port = vim.dvs.PortConnection(switchUuid=switch.uuid, portgroupKey=network.key)
        return vim.vm.device.VirtualEthernetCard.DistributedVirtualPortBackingInfo(port=port)
    if isinstance(network, vim.OpaqueNetwork):
        raise VSphereError(f"network {network.name!r} is an NSX opaque network, which this project does not support")
    return vim.vm.device.VirtualEthernetCard.NetworkBackingInfo(deviceName=network.name, network=network)


def _builder_device_changes(spec: BuilderVmSpec, network: vim.Network) -> list[vim.vm.device.VirtualDeviceSpec]:
    """PVSCSI controller, one thick eager-zeroed disk on it, one VMXNET3 NIC.

    Negative keys are placeholders vCenter replaces; the disk refers to the
    controller by its placeholder key in the same spec.
    """
    add = vim.vm.device.VirtualDeviceSpec.Operation.add
    controller = vim.vm.device.ParaVirtualSCSIController(
        key=-100, busNumber=0, sharedBus=vim.vm.device.VirtualSCSIController.Sharing.noSharing
    )
    disk = vim.vm.device.VirtualDisk(
        key=-101,
        controllerKey=controller.key,
        unitNumber=0,
        capacityInKB=spec.disk_gib * 1024 * 1024,
        capacityInBytes=spec.disk_gib * GiB,
        backing=vim.vm.device.VirtualDisk.FlatVer2BackingInfo(
            fileName="",
            diskMode="persistent",
            thinProvisioned=False,
            eagerlyScrub=True,
        ),
    )
    nic = vim.vm.device.VirtualVmxnet3(
        key=-102,
        addressType="generated",
        backing=_nic_backing(network),
        connectable=vim.vm.device.VirtualDevice.ConnectInfo(
            startConnected=True, connected=True, allowGuestControl=True
        ),
    )
    return [
        vim.vm.device.VirtualDeviceSpec(operation=add, device=controller),
        vim.vm.device.VirtualDeviceSpec(
            operation=add, fileOperation=vim.vm.device.VirtualDeviceSpec.FileOperation.create, device=disk
        ),
        vim.vm.device.VirtualDeviceSpec(operation=add, device=nic),
    ]


def _builder_config_spec(
    spec: BuilderVmSpec, guest_id: str, datastore: vim.Datastore, network: vim.Network
) -> vim.vm.ConfigSpec:
    extra = {"disk.EnableUUID": "TRUE", **dict(spec.extra_config)}
    config = vim.vm.ConfigSpec(
        name=spec.name,
        guestId=guest_id,
        numCPUs=spec.num_cpus,
        memoryMB=spec.memory_mib,
        annotation=spec.annotation,
        files=vim.vm.FileInfo(vmPathName=f"[{datastore.name}]"),
        firmware=spec.firmware,
        extraConfig=[vim.option.OptionValue(key=k, value=v) for k, v in extra.items()],
        deviceChange=_builder_device_changes(spec, network),
    )
    if spec.firmware == "efi":
        # Secure Boot off on purpose: packer-examples-for-vsphere#964. Sent only
        # for EFI because old hosts reject the field outright (packer#9547).
        config.bootOptions = vim.vm.BootOptions(efiSecureBootEnabled=False)
    return config


def _free_ide_slot(vm: vim.VirtualMachine) -> tuple[int, int]:
    """(controller key, unit) of a free IDE slot; vCenter adds two IDE controllers."""
    devices = present(vm.config, "VirtualMachine.config").hardware.device
    for ctrl in devices:
        if isinstance(ctrl, vim.vm.device.VirtualIDEController):
            used = {d.unitNumber for d in devices if d.controllerKey == ctrl.key}
            for unit in (0, 1):
                if unit not in used:
                    return ctrl.key, unit
    raise VSphereError(f"VM {vm.name!r} has no free IDE slot for the installer CD-ROM")


def attach_iso(vm: vim.VirtualMachine, iso_path: str, timeout_s: float = 300) -> None:
    """Add a CD-ROM with ``iso_path`` ('[ds] dir/file.iso'), connected at power-on.

    Added after CreateVM, like packer's vsphere-iso does, because the default
    IDE controllers only exist once the VM does and their keys are the host's.
    """
    controller_key, unit = _free_ide_slot(vm)
    cdrom = vim.vm.device.VirtualCdrom(
        key=-200,
        controllerKey=controller_key,
        unitNumber=unit,
        backing=vim.vm.device.VirtualCdrom.IsoBackingInfo(fileName=iso_path),
        connectable=vim.vm.device.VirtualDevice.ConnectInfo(
            startConnected=True, connected=True, allowGuestControl=True
        ),
    )
    change = vim.vm.device.VirtualDeviceSpec(operation=vim.vm.device.VirtualDeviceSpec.Operation.add, device=cdrom)
    wait_for_task(
        vm.ReconfigVM_Task(vim.vm.ConfigSpec(deviceChange=[change])),
        f"attaching {iso_path} to VM {vm.name!r}",
        timeout_s,
    )


def create_builder_vm(si: vim.ServiceInstance, spec: BuilderVmSpec) -> BuilderVm:
    """Create the installer VM: PVSCSI, eager-zeroed thick disk, VMXNET3, ISO CD-ROM.

    Refuses to run when a VM of that name already exists (a leftover from an
    interrupted build must be removed on purpose, not reused by accident).
    """
    dc = find_datacenter(si, spec.datacenter)
    cluster = find_cluster(si, dc, spec.cluster)
    datastore = find_datastore(si, dc, spec.datastore)
    network = find_network(si, dc, spec.network)
    folder = find_vm_folder(si, dc, spec.folder)
    pool = find_resource_pool(si, cluster, spec.resource_pool)
    if find_vm(si, spec.name, dc) is not None:
        raise VSphereError(
            f"a VM named {spec.name!r} already exists in datacenter {dc.name!r}; "
            "delete it (it is probably a leftover builder VM) or choose another name"
        )
    guest_id, notes = choose_guest_id(cluster, spec.guest_id, spec.guest_id_fallbacks)
    config = _builder_config_spec(spec, guest_id, datastore, network)
    vm = wait_for_task(
        folder.CreateVM_Task(config=config, pool=pool),
        f"creating builder VM {spec.name!r}",
        spec.create_timeout_s,
    )
    try:
        attach_iso(vm, spec.iso_path)
    except VSphereError:
        # Half a builder VM would block the next run (name taken): remove it.
        destroy_vm(vm)
        raise
    return BuilderVm(vm=vm, moid=vm._moId, uuid=vm.config.uuid, guest_id=guest_id, notes=tuple(notes))


def wait_for_power_off(vm: vim.VirtualMachine, timeout_s: float, poll_s: float = 2.0) -> None:
    """Wait for the installer to power the VM off (preseed ends with poweroff).

    A timeout usually means the installer stopped at a question the preseed does
    not answer (or cannot reach its mirror); the VM console shows which.
    """
    try:
        wait_for_power_state(vm, "poweredOff", timeout_s, poll_s)
    except VSphereTimeoutError as exc:
        raise VSphereTimeoutError(
            f"{exc}; the unattended install did not finish (the installer usually stops at a question "
            "the preseed does not answer, or cannot reach its mirror: the VM console shows which)"
        ) from exc


def _cdroms(vm: vim.VirtualMachine) -> list[vim.vm.device.VirtualCdrom]:
    devices = present(vm.config, "VirtualMachine.config").hardware.device
    return [d for d in devices if isinstance(d, vim.vm.device.VirtualCdrom)]


def detach_iso(vm: vim.VirtualMachine, remove_device: bool = False, timeout_s: float = 300) -> None:
    """Empty every CD-ROM (or remove them), so clones never boot the installer.

    Emptying = client-device backing, not connected at power-on: what the
    vSphere client's "disconnect" does. Run it on the powered-off VM; a running
    guest may lock the tray and leave a pending VM question.
    """
    changes = []
    for cdrom in _cdroms(vm):
        if remove_device:
            changes.append(
                vim.vm.device.VirtualDeviceSpec(
                    operation=vim.vm.device.VirtualDeviceSpec.Operation.remove, device=cdrom
                )
            )
            continue
        cdrom.backing = vim.vm.device.VirtualCdrom.RemotePassthroughBackingInfo(deviceName="", exclusive=False)
        cdrom.connectable = vim.vm.device.VirtualDevice.ConnectInfo(
            startConnected=False, connected=False, allowGuestControl=True
        )
        changes.append(
            vim.vm.device.VirtualDeviceSpec(operation=vim.vm.device.VirtualDeviceSpec.Operation.edit, device=cdrom)
        )
    if changes:
        wait_for_task(
            vm.ReconfigVM_Task(vim.vm.ConfigSpec(deviceChange=changes)), f"detaching ISO from VM {vm.name!r}", timeout_s
        )


def mark_as_template(vm: vim.VirtualMachine) -> None:
    """Turn the powered-off VM into a template (vCenter refuses while it runs)."""
    if present(vm.config, "VirtualMachine.config").template:
        return
    state = power_state(vm)
    if state != "poweredOff":
        raise VSphereError(f"VM {vm.name!r} is {state}; it must be powered off before it can become a template")
    vm.MarkAsTemplate()


def template_uuid(vm: vim.VirtualMachine) -> str:
    """The BIOS UUID (config.uuid), which pulumi-vsphere's clone.templateUuid wants.

    Not config.instanceUuid: the provider looks templates up with
    SearchIndex.FindByUuid(instanceUuid=false).
    """
    return str(present(vm.config, "VirtualMachine.config").uuid)


def _device_name(device: vim.vm.device.VirtualDevice) -> str:
    label = device.deviceInfo.label if device.deviceInfo is not None else type(device).__name__
    return f"{label} (key {device.key})"


def _type_name(device: Any) -> str:
    return type(device).__name__.rsplit(".", 1)[-1]


def verify_template_hardware(vm: vim.VirtualMachine) -> list[HardwareProblem]:
    """Problems that would make clones of ``vm`` differ from the design; [] = good.

    Checks: every SCSI controller is PVSCSI and every disk hangs off one;
    every disk is flat thick eager-zeroed; every NIC is exactly VMXNET3;
    disk.EnableUUID is TRUE; no CD-ROM still carries an ISO.
    """
    problems: list[HardwareProblem] = []
    config = present(vm.config, "VirtualMachine.config")
    devices = list(config.hardware.device)
    # Keyed by int; typed to accept an unset (None) controllerKey, for which .get() gives None.
    by_key: dict[int | None, vim.vm.device.VirtualDevice] = {d.key: d for d in devices}
    pvscsi = [d for d in devices if isinstance(d, vim.vm.device.ParaVirtualSCSIController)]
    if not pvscsi:
        problems.append(HardwareProblem("no VMware Paravirtual SCSI controller: add one and move the disks to it"))
    for dev in devices:
        if isinstance(dev, vim.vm.device.VirtualSCSIController) and not isinstance(
            dev, vim.vm.device.ParaVirtualSCSIController
        ):
            problems.append(
                HardwareProblem(f"{_device_name(dev)} is {_type_name(dev)}, not VMware Paravirtual (PVSCSI)")
            )
    disks = [d for d in devices if isinstance(d, vim.vm.device.VirtualDisk)]
    if not disks:
        problems.append(HardwareProblem("no virtual disk"))
    for disk in disks:
        name = _device_name(disk)
        controller = by_key.get(disk.controllerKey)
        if not isinstance(controller, vim.vm.device.ParaVirtualSCSIController):
            where = _device_name(controller) if controller is not None else f"controller key {disk.controllerKey}"
            problems.append(HardwareProblem(f"{name} is attached to {where}, not to a PVSCSI controller"))
        backing = disk.backing
        if not isinstance(backing, vim.vm.device.VirtualDisk.FlatVer2BackingInfo):
            problems.append(
                HardwareProblem.of_datastore(f"{name} has backing {_type_name(backing)}, not a flat thick disk")
            )
            continue
        if backing.thinProvisioned is not False:
            problems.append(
                HardwareProblem.of_datastore(f"{name} is thin provisioned; it must be thick provisioned eager-zeroed")
            )
        if backing.eagerlyScrub is not True:
            problems.append(
                HardwareProblem.of_datastore(f"{name} is not eager-zeroed (eagerlyScrub is {backing.eagerlyScrub})")
            )
    nics = [d for d in devices if isinstance(d, vim.vm.device.VirtualEthernetCard)]
    if not nics:
        problems.append(HardwareProblem("no network adapter"))
    for nic in nics:
        # Exact type: VirtualVmxnet3Vrdma subclasses VirtualVmxnet3 but is PVRDMA.
        if type(nic) is not vim.vm.device.VirtualVmxnet3:
            problems.append(HardwareProblem(f"{_device_name(nic)} is {_type_name(nic)}, not VMXNET3"))
    extra = {o.key: str(o.value) for o in (config.extraConfig or [])}
    if extra.get("disk.EnableUUID", "").upper() != "TRUE":
        problems.append(HardwareProblem("extraConfig disk.EnableUUID is not TRUE (the vSphere CSI driver needs it)"))
    for cdrom in _cdroms(vm):
        if isinstance(cdrom.backing, vim.vm.device.VirtualCdrom.IsoBackingInfo) and cdrom.backing.fileName:
            problems.append(
                HardwareProblem(f"{_device_name(cdrom)} still has ISO {cdrom.backing.fileName}: clones would boot it")
            )
    return problems
