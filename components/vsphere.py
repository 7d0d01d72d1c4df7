"""Every conversation with vCenter that this project has, in one place (pyvmomi).

Nothing else in the project imports pyVmomi: the Pulumi program uses the
pulumi-vsphere provider for the VMs themselves and calls in here for what the
provider cannot do (golden template build, preflight, drills). Inputs are plain
dataclasses and primitives defined here, so this module stays independent of
the pydantic config model.

Upstream pitfalls this module works around (cited where they bite):
- pyVim.connect.getSslContext() silently builds an *unverified* TLS context
  when no context is passed and the host is localhost/127.0.0.1/::1, so we
  always pass our own context and only skip verification when asked.
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
- ESXi's /folder PUT does not create missing directories (govc needs
  datastore.mkdir first), so uploads make the parent directory themselves.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import ssl
import time
import urllib.parse
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pyVim.connect import Disconnect, SmartConnect
from pyVmomi import vim, vmodl

log = logging.getLogger(__name__)

GiB = 1024**3

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

# extraConfig key marking VMs this stack owns; preflight does not call a VM
# with our name a conflict when it carries our stack's value here. guestinfo.*
# keys are plain VMX options, readable (not writable) from inside the guest.
STACK_TAG_KEY = "guestinfo.labs-k8s.stack"

PowerState = Literal["poweredOn", "poweredOff", "suspended"]
Firmware = Literal["bios", "efi"]


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------


class VSphereError(RuntimeError):
    """Any failure talking to vCenter, with a message meant for the user."""


class NotFoundError(VSphereError):
    """An inventory object is missing; the message names it and where we looked."""

    def __init__(self, kind: str, name: str, where: str, available: Sequence[str] = ()) -> None:
        self.kind = kind
        self.name = name
        self.where = where
        self.available = list(available)
        message = f"{kind} {name!r} not found in {where}"
        if self.available:
            shown = ", ".join(repr(a) for a in sorted(self.available)[:20])
            more = "" if len(self.available) <= 20 else f" and {len(self.available) - 20} more"
            message += f"; available: {shown}{more}"
        else:
            message += f"; there is no {kind} there at all"
        super().__init__(message)


class TaskError(VSphereError):
    """A vCenter task failed; ``fault`` is the vmodl fault vCenter returned."""

    def __init__(self, message: str, fault: Any) -> None:
        super().__init__(message)
        self.fault = fault


class AmbiguousError(VSphereError):
    """A name matches several objects; the message lists their paths."""


class VSphereTimeoutError(VSphereError, TimeoutError):
    """A wait ran out of time; the message says what we waited for."""


# --------------------------------------------------------------------------
# Connection
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """Where a ServiceInstance talks to; kept for plain HTTP calls (uploads)."""

    host: str
    port: int
    tls: ssl.SSLContext


# Keyed by the SOAP stub so it dies with the connection. Only connect() fills
# it: upload_to_datastore() must reuse the same TLS decision as the SOAP side.
_ENDPOINTS: weakref.WeakKeyDictionary[Any, Endpoint] = weakref.WeakKeyDictionary()


def _tls_context(insecure: bool, ca_file: str | None) -> ssl.SSLContext:
    # ssl.create_default_context() reads the system store (and SSL_CERT_FILE
    # per OpenSSL) but never REQUESTS_CA_BUNDLE: that variable is a convention
    # of the requests library and must not change how we trust vCenter.
    if insecure:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    return ssl.create_default_context(cafile=ca_file)


def connect(
    host: str,
    user: str,
    password: str,
    port: int = 443,
    insecure: bool = False,
    ca_file: str | None = None,
) -> vim.ServiceInstance:
    """Log in to vCenter and return its ServiceInstance.

    TLS is verified against the system store (or ``ca_file``) unless
    ``insecure`` is True. We always hand pyVim an explicit context: given none,
    pyVim turns verification off for 127.0.0.1/localhost without saying so.
    """
    tls = _tls_context(insecure, ca_file)
    try:
        si = SmartConnect(host=host, port=port, user=user, pwd=password, sslContext=tls)
    except vim.fault.InvalidLogin as exc:
        raise VSphereError(
            f"vCenter {host}:{port} rejected the login for user {user!r}; check the user name and password"
        ) from exc
    except ssl.SSLCertVerificationError as exc:
        raise VSphereError(
            f"cannot verify the TLS certificate of {host}:{port} ({exc.verify_message}); "
            "pass the vCenter CA as ca_file, or insecure=True for a lab only"
        ) from exc
    except OSError as exc:
        raise VSphereError(f"cannot reach vCenter at {host}:{port}: {exc}") from exc
    _ENDPOINTS[si._GetStub()] = Endpoint(host=host, port=port, tls=tls)
    return si


def disconnect(si: vim.ServiceInstance) -> None:
    """Log out; errors are logged, not raised (we are usually cleaning up)."""
    try:
        Disconnect(si)
    except Exception as exc:
        log.warning("vCenter logout failed: %s", exc)


@contextlib.contextmanager
def session(
    host: str,
    user: str,
    password: str,
    port: int = 443,
    insecure: bool = False,
    ca_file: str | None = None,
) -> Iterator[vim.ServiceInstance]:
    """``with session(...) as si:`` connects and always logs out afterwards."""
    si = connect(host, user, password, port=port, insecure=insecure, ca_file=ca_file)
    try:
        yield si
    finally:
        disconnect(si)


# --------------------------------------------------------------------------
# Tasks and property collection
# --------------------------------------------------------------------------


def _fault_text(error: Any) -> str:
    if error is None:
        return "unknown error"
    text = getattr(error, "msg", "") or getattr(error, "localizedMessage", "")
    fault = getattr(error, "fault", None)
    name = type(fault).__name__ if fault is not None else type(error).__name__
    return f"{name}: {text}" if text else name


def wait_for_task(task: vim.Task, what: str, timeout_s: float = 600, poll_s: float = 0.5) -> Any:
    """Wait for a vCenter task; return its result or raise with the fault text."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = task.info
        if info.state == vim.TaskInfo.State.success:
            return info.result
        if info.state == vim.TaskInfo.State.error:
            raise TaskError(f"{what} failed: {_fault_text(info.error)}", info.error)
        if time.monotonic() >= deadline:
            raise VSphereTimeoutError(f"{what} did not finish within {timeout_s:g}s (task {task._moId})")
        time.sleep(poll_s)


def _collect(
    si: vim.ServiceInstance,
    root: vim.ManagedEntity,
    vimtype: type,
    props: Sequence[str],
) -> list[tuple[Any, dict[str, Any]]]:
    """Read ``props`` of every ``vimtype`` object under ``root`` in one round trip.

    One PropertyCollector call over a ContainerView instead of touching
    ``obj.prop`` per object: on a big inventory that is the difference between
    one request and thousands.
    """
    content = si.RetrieveContent()
    view = content.viewManager.CreateContainerView(root, [vimtype], True)
    try:
        traversal = vmodl.query.PropertyCollector.TraversalSpec(
            name="view", path="view", skip=False, type=vim.view.ContainerView
        )
        spec = vmodl.query.PropertyCollector.FilterSpec(
            objectSet=[vmodl.query.PropertyCollector.ObjectSpec(obj=view, skip=True, selectSet=[traversal])],
            propSet=[vmodl.query.PropertyCollector.PropertySpec(type=vimtype, pathSet=list(props))],
        )
        collector = content.propertyCollector
        options = vmodl.query.PropertyCollector.RetrieveOptions()
        result = collector.RetrievePropertiesEx([spec], options)
        rows: list[tuple[Any, dict[str, Any]]] = []
        seen: set[str] = set()
        while result is not None:
            for obj in result.objects:
                if obj.obj._moId in seen:
                    continue
                seen.add(obj.obj._moId)
                rows.append((obj.obj, {p.name: p.val for p in obj.propSet}))
            if not result.token:
                break
            result = collector.ContinueRetrievePropertiesEx(result.token)
        return rows
    finally:
        view.Destroy()


# --------------------------------------------------------------------------
# Inventory lookups
# --------------------------------------------------------------------------


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
    return si.RetrieveContent().searchIndex.FindByInventoryPath(path)


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
        rows.extend(_collect(si, base, vimtype, ["name"]))
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
    rows = _collect(si, root, vim.Datacenter, ["name"])
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
    root = cluster.resourcePool
    if not path:
        return root
    return _find_under(si, "resource pool", path.strip("/"), root, (vim.ResourcePool,))


def find_vm(si: vim.ServiceInstance, name: str, datacenter: vim.Datacenter | None = None) -> vim.VirtualMachine | None:
    """The VM or template called ``name`` (None if absent; error if several)."""
    root = datacenter.vmFolder if datacenter is not None else si.RetrieveContent().rootFolder
    matches = [o for o, props in _collect(si, root, vim.VirtualMachine, ["name"]) if props.get("name") == name]
    if len(matches) > 1:
        paths = ", ".join(sorted(inventory_path(si, m) for m in matches))
        raise AmbiguousError(f"VM name {name!r} is used by {len(matches)} VMs ({paths}); rename or remove the extras")
    return matches[0] if matches else None


def find_vm_by_uuid(si: vim.ServiceInstance, uuid: str) -> vim.VirtualMachine | None:
    """The VM or template whose BIOS UUID (config.uuid, see template_uuid) is ``uuid``."""
    index = si.RetrieveContent().searchIndex
    return index.FindByUuid(datacenter=None, uuid=uuid, vmSearch=True, instanceUuid=False)


def get_vm(si: vim.ServiceInstance, name: str, datacenter: vim.Datacenter | None = None) -> vim.VirtualMachine:
    """Like find_vm, but a missing VM is a NotFoundError."""
    vm = find_vm(si, name, datacenter)
    if vm is None:
        where = f"datacenter {datacenter.name!r}" if datacenter is not None else "vCenter inventory"
        raise NotFoundError("VM", name, where)
    return vm


# --------------------------------------------------------------------------
# Golden template build
# --------------------------------------------------------------------------


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
        option = cluster.environmentBrowser.QueryConfigOptionEx(spec)
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
        port = vim.dvs.PortConnection(switchUuid=network.config.distributedVirtualSwitch.uuid, portgroupKey=network.key)
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
    devices = vm.config.hardware.device
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


def make_datastore_dir(si: vim.ServiceInstance, datacenter: str, datastore: str, path: str) -> str:
    """mkdir -p ``[datastore] path``; an existing directory is fine. Returns the path."""
    dc = find_datacenter(si, datacenter)
    ds = find_datastore(si, dc, datastore)
    ds_path = f"[{ds.name}] {path.strip('/')}"
    with contextlib.suppress(vim.fault.FileAlreadyExists):
        si.RetrieveContent().fileManager.MakeDirectory(name=ds_path, datacenter=dc, createParentDirectories=True)
    return ds_path


def upload_to_datastore(
    si: vim.ServiceInstance,
    datacenter: str,
    datastore: str,
    remote_path: str,
    source: str | Path | bytes,
    timeout_s: float = 3600,
) -> str:
    """PUT a local file (or bytes) to ``[datastore] remote_path``; return that path.

    Uses vCenter's /folder HTTP interface with the SOAP session cookie, over
    the same TLS settings as connect(). The file is streamed, not read into
    memory (ISOs are hundreds of MB).
    """
    endpoint = _ENDPOINTS.get(si._GetStub())
    if endpoint is None:
        raise VSphereError("upload_to_datastore needs a ServiceInstance made by components.vsphere.connect()")
    dc = find_datacenter(si, datacenter)
    ds = find_datastore(si, dc, datastore)
    remote = remote_path.lstrip("/")
    if "/" in remote:
        make_datastore_dir(si, datacenter, datastore, remote.rsplit("/", 1)[0])
    query = urllib.parse.urlencode({"dcPath": inventory_path(si, dc), "dsName": ds.name})
    url = f"/folder/{urllib.parse.quote(remote)}?{query}"
    # The stub's cookie is 'vmware_soap_session="..."; Path=/; ...': only the
    # name=value pair goes back (same as pyvmomi-community-samples' uploader).
    cookie = si._GetStub().cookie.split(";", 1)[0].strip()
    conn = http.client.HTTPSConnection(endpoint.host, endpoint.port, context=endpoint.tls, timeout=timeout_s)
    try:
        if isinstance(source, bytes):
            size = len(source)
            headers = {"Cookie": cookie, "Content-Type": "application/octet-stream", "Content-Length": str(size)}
            conn.request("PUT", url, body=source, headers=headers)
        else:
            size = Path(source).stat().st_size
            headers = {"Cookie": cookie, "Content-Type": "application/octet-stream", "Content-Length": str(size)}
            with open(source, "rb") as fh:
                conn.request("PUT", url, body=fh, headers=headers)
        response = conn.getresponse()
        body = response.read(500).decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as exc:
        raise VSphereError(f"upload to [{ds.name}] {remote} failed: {exc}") from exc
    finally:
        conn.close()
    if response.status not in (200, 201, 204):
        raise VSphereError(
            f"upload to [{ds.name}] {remote} failed: HTTP {response.status} {response.reason} {body}".strip()
        )
    return f"[{ds.name}] {remote}"


def power_state(vm: vim.VirtualMachine) -> str:
    """'poweredOn', 'poweredOff' or 'suspended'."""
    return str(vm.runtime.powerState)


def power_on(vm: vim.VirtualMachine, timeout_s: float = 300) -> None:
    """Power on; no-op when already on (vCenter would fault InvalidPowerState)."""
    if power_state(vm) == "poweredOn":
        return
    wait_for_task(vm.PowerOnVM_Task(), f"powering on VM {vm.name!r}", timeout_s)


def power_off(vm: vim.VirtualMachine, timeout_s: float = 300) -> None:
    """Hard power off (pulls the plug, no guest shutdown); no-op when off."""
    if power_state(vm) == "poweredOff":
        return
    wait_for_task(vm.PowerOffVM_Task(), f"powering off VM {vm.name!r}", timeout_s)


def wait_for_power_state(vm: vim.VirtualMachine, state: PowerState, timeout_s: float, poll_s: float = 2.0) -> None:
    """Poll until the VM reaches ``state``; VSphereTimeoutError says what it was."""
    deadline = time.monotonic() + timeout_s
    current = power_state(vm)
    while current != state:
        if time.monotonic() >= deadline:
            raise VSphereTimeoutError(f"VM {vm.name!r} is still {current} after {timeout_s:g}s waiting for {state}")
        time.sleep(poll_s)
        current = power_state(vm)


def wait_for_power_off(vm: vim.VirtualMachine, timeout_s: float, poll_s: float = 2.0) -> None:
    """Wait for the installer to power the VM off (preseed ends with poweroff).

    A timeout usually means the installer stopped at a question: open the VM
    console to see which one.
    """
    try:
        wait_for_power_state(vm, "poweredOff", timeout_s, poll_s)
    except VSphereTimeoutError as exc:
        raise VSphereTimeoutError(
            f"{exc}; the unattended install did not finish: open the console of {vm.name!r} "
            "to see where the installer stopped"
        ) from exc


def _cdroms(vm: vim.VirtualMachine) -> list[vim.vm.device.VirtualCdrom]:
    return [d for d in vm.config.hardware.device if isinstance(d, vim.vm.device.VirtualCdrom)]


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
    if vm.config.template:
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
    return str(vm.config.uuid)


def _device_name(device: vim.vm.device.VirtualDevice) -> str:
    label = device.deviceInfo.label if device.deviceInfo is not None else type(device).__name__
    return f"{label} (key {device.key})"


def _type_name(device: Any) -> str:
    return type(device).__name__.rsplit(".", 1)[-1]


def verify_template_hardware(vm: vim.VirtualMachine) -> list[str]:
    """Problems that would make clones of ``vm`` differ from the design; [] = good.

    Checks: every SCSI controller is PVSCSI and every disk hangs off one;
    every disk is flat thick eager-zeroed; every NIC is exactly VMXNET3;
    disk.EnableUUID is TRUE; no CD-ROM still carries an ISO.
    """
    problems: list[str] = []
    devices = list(vm.config.hardware.device)
    by_key = {d.key: d for d in devices}
    pvscsi = [d for d in devices if isinstance(d, vim.vm.device.ParaVirtualSCSIController)]
    if not pvscsi:
        problems.append("no VMware Paravirtual SCSI controller: add one and move the disks to it")
    for dev in devices:
        if isinstance(dev, vim.vm.device.VirtualSCSIController) and not isinstance(
            dev, vim.vm.device.ParaVirtualSCSIController
        ):
            problems.append(f"{_device_name(dev)} is {_type_name(dev)}, not VMware Paravirtual (PVSCSI)")
    disks = [d for d in devices if isinstance(d, vim.vm.device.VirtualDisk)]
    if not disks:
        problems.append("no virtual disk")
    for disk in disks:
        name = _device_name(disk)
        controller = by_key.get(disk.controllerKey)
        if not isinstance(controller, vim.vm.device.ParaVirtualSCSIController):
            where = _device_name(controller) if controller is not None else f"controller key {disk.controllerKey}"
            problems.append(f"{name} is attached to {where}, not to a PVSCSI controller")
        backing = disk.backing
        if not isinstance(backing, vim.vm.device.VirtualDisk.FlatVer2BackingInfo):
            problems.append(f"{name} has backing {_type_name(backing)}, not a flat thick disk")
            continue
        if backing.thinProvisioned is not False:
            problems.append(f"{name} is thin provisioned; it must be thick provisioned eager-zeroed")
        if backing.eagerlyScrub is not True:
            problems.append(f"{name} is not eager-zeroed (eagerlyScrub is {backing.eagerlyScrub})")
    nics = [d for d in devices if isinstance(d, vim.vm.device.VirtualEthernetCard)]
    if not nics:
        problems.append("no network adapter")
    for nic in nics:
        # Exact type: VirtualVmxnet3Vrdma subclasses VirtualVmxnet3 but is PVRDMA.
        if type(nic) is not vim.vm.device.VirtualVmxnet3:
            problems.append(f"{_device_name(nic)} is {_type_name(nic)}, not VMXNET3")
    extra = {o.key: str(o.value) for o in (vm.config.extraConfig or [])}
    if extra.get("disk.EnableUUID", "").upper() != "TRUE":
        problems.append("extraConfig disk.EnableUUID is not TRUE (the vSphere CSI driver needs it)")
    for cdrom in _cdroms(vm):
        if isinstance(cdrom.backing, vim.vm.device.VirtualCdrom.IsoBackingInfo) and cdrom.backing.fileName:
            problems.append(f"{_device_name(cdrom)} still has ISO {cdrom.backing.fileName}: clones would boot it")
    return problems


def destroy_vm(vm: vim.VirtualMachine, timeout_s: float = 600) -> None:
    """Power off (if running) and delete the VM or template with its files."""
    name = vm.name  # read before the VM is gone: vcsim deletes before the task returns
    if not vm.config.template:
        power_off(vm, timeout_s)
    wait_for_task(vm.Destroy_Task(), f"deleting VM {name!r}", timeout_s)


# --------------------------------------------------------------------------
# Preflight
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedVm:
    """A VM the stack will create: its name, IPs and eager-zeroed disks."""

    name: str
    ip_addresses: tuple[str, ...] = ()
    disk_gib: tuple[int, ...] = ()
    memory_mib: int = 0  # its .vswp swap file is this big (no reservation)


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
    free_space_margin: float = 0.15  # on top of disks + swap: snapshots, logs, growth


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


def _check_drs(report: PreflightReport, spec: PreflightSpec, cluster: vim.ClusterComputeResource) -> None:
    if not spec.anti_affinity_rules:
        return  # nothing depends on DRS then
    drs = cluster.configurationEx.drsConfig
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
    if drs.defaultVmBehavior == vim.cluster.DrsConfigInfo.DrsBehavior.manual:
        report.warn(
            "drs",
            f"DRS on cluster {cluster.name!r} is in manual mode: rules only produce recommendations "
            "that someone must apply. Set the automation level to partially or fully automated",
        )


def _connected_hosts(si: vim.ServiceInstance, cluster: vim.ClusterComputeResource) -> list[tuple[Any, dict[str, Any]]]:
    rows = _collect(
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
) -> None:
    summary = datastore.summary
    if not summary.accessible:
        report.error("datastore", f"datastore {datastore.name!r} is not accessible; check its mounts")
        return
    disks = sum(g for vm in spec.vms for g in vm.disk_gib) * GiB
    swap = sum(vm.memory_mib for vm in spec.vms) * 1024 * 1024
    required = int((disks + swap) * (1 + spec.free_space_margin))
    report.required_bytes = required
    report.datastore_free_bytes = int(summary.freeSpace)
    if summary.freeSpace < required:
        report.error(
            "datastore",
            f"datastore {datastore.name!r} has {summary.freeSpace / GiB:.1f} GiB free, but the stack needs "
            f"{required / GiB:.1f} GiB ({disks / GiB:.0f} GiB of eager-zeroed disks, which are fully "
            f"allocated at clone time, + {swap / GiB:.1f} GiB of VM swap files + "
            f"{spec.free_space_margin:.0%} margin). Free space, pick a bigger datastore, or shrink the disks",
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


def _vm_ips(props: Mapping[str, Any]) -> set[str]:
    ips = {props["guest.ipAddress"]} if props.get("guest.ipAddress") else set()
    for nic in props.get("guest.net") or []:
        ips.update(nic.ipAddress or [])
    return ips


def _stack_of(vm: vim.VirtualMachine) -> str | None:
    for option in vm.config.extraConfig or []:
        if option.key == STACK_TAG_KEY:
            return str(option.value)
    return None


def _check_collisions(report: PreflightReport, spec: PreflightSpec, si: vim.ServiceInstance) -> None:
    """Our names and IPs must not be in use by VMs of any other stack (whole vCenter)."""
    names = {vm.name for vm in spec.vms}
    owner_of_ip = {ip: vm.name for vm in spec.vms for ip in vm.ip_addresses}
    owner_of_ip.update({ip: "extra address" for ip in spec.extra_ips})
    root = si.RetrieveContent().rootFolder
    for vm, props in _collect(si, root, vim.VirtualMachine, ["name", "guest.ipAddress", "guest.net"]):
        name = props.get("name", "")
        clashes = sorted(_vm_ips(props) & owner_of_ip.keys())
        if name not in names and not clashes:
            continue
        # Only now read extraConfig: it is large, and only suspects need it.
        stack = _stack_of(vm)
        if spec.stack and stack == spec.stack:
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


def preflight(si: vim.ServiceInstance, spec: PreflightSpec) -> PreflightReport:
    """Check vCenter can host the stack before anything is created.

    Every problem found is reported, not only the first; checks that depend on
    a missing object are skipped (their error already says what to fix).
    """
    report = PreflightReport()
    dc = _lookup(
        report,
        "datacenter",
        "Fix the datacenter name in the stack configuration.",
        find_datacenter,
        si,
        spec.datacenter,
    )
    if dc is None:
        _check_collisions(report, spec, si)
        return report
    cluster = _lookup(
        report, "cluster", "Fix the cluster name in the stack configuration.", find_cluster, si, dc, spec.cluster
    )
    datastore = _lookup(
        report,
        "datastore",
        "Fix the datastore name in the stack configuration.",
        find_datastore,
        si,
        dc,
        spec.datastore,
    )
    _lookup(
        report,
        "network",
        "Fix the network (portgroup) name in the stack configuration.",
        find_network,
        si,
        dc,
        spec.network,
    )
    _lookup(
        report,
        "folder",
        "Create the VM folder or fix its path in the stack configuration.",
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
            "Create the resource pool or fix its path in the stack configuration.",
            find_resource_pool,
            si,
            cluster,
            spec.resource_pool,
        )
        _check_drs(report, spec, cluster)
        hosts = _connected_hosts(si, cluster)
        _check_hosts(report, spec, cluster, len(hosts))
    if datastore is not None:
        _check_datastore(report, spec, datastore, hosts)
    _check_collisions(report, spec, si)
    return report


def stack_tag(stack: str) -> dict[str, str]:
    """extraConfig entry that marks a VM as owned by ``stack`` (see preflight)."""
    return {STACK_TAG_KEY: stack}


# --------------------------------------------------------------------------
# Drills (components/drills): what a failure drill reads from vCenter
# --------------------------------------------------------------------------


def vm_guest_ips(vm: vim.VirtualMachine) -> set[str]:
    """Every address VMware Tools reports for the guest (guest.ipAddress and each NIC's).

    A Keepalived VIP is a secondary address on the balancer's NIC, so the balancer
    holding it reports it here. Tools refresh this every 30 s by default
    (guestinfo poll-interval), so a VIP move shows up with that much delay at most.
    A powered-off VM reports nothing on vCenter (vcsim keeps the last values).
    """
    guest = vm.guest
    if guest is None:
        return set()
    return _vm_ips({"guest.ipAddress": guest.ipAddress, "guest.net": guest.net})


def vm_stack(vm: vim.VirtualMachine) -> str | None:
    """The stack that tagged ``vm`` (extraConfig STACK_TAG_KEY), or None when untagged."""
    return _stack_of(vm)
