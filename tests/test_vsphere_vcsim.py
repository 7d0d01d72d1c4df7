"""components/vsphere (the pyvmomi package) against a real vCenter simulator (govmomi's, tests/tools/go.mod).

Every test gets its own fresh vcsim (tests/vcsim.py). Limits of vcsim that
shape these tests: clones ignore powerOn/customization/location.host, DRS rules
are never enforced, there is no guest OS (so "the installer powers the VM off"
is simulated with a hard power-off), guest ids stop at debian10_64Guest, and
guest IPs are injected with the vcsim-only extraConfig key SET.guest.ipAddress.

A few tests build deliberately wrong hardware with pyVmomi directly: the
product code never creates such VMs, so that code lives only here.
"""

from __future__ import annotations

import dataclasses
import re
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pyVmomi import vim

from components import vsphere as vs

if TYPE_CHECKING:  # a runtime import would load the plugin before pytest can rewrite it
    from tests.vcsim import Vcsim

# Registers the vcsim fixtures until tests/conftest.py does it for every module
# (pytest ignores the second registration of the same plugin).
pytest_plugins = ["tests.vcsim"]

ISO = "[LocalDS_0] iso/debian-12-preseeded.iso"
STACK = "labs-test"


# ---------------------------------------------------------------- helpers


@pytest.fixture
def si(vcsim: Vcsim) -> Iterator[vim.ServiceInstance]:
    with vs.session(vcsim.host, vcsim.user, vcsim.password, port=vcsim.port, insecure=True) as service:
        yield service


@pytest.fixture
def connect_to() -> Iterator[Callable[[Vcsim], vim.ServiceInstance]]:
    opened: list[vim.ServiceInstance] = []

    def _connect(sim: Vcsim) -> vim.ServiceInstance:
        service = vs.connect(sim.host, sim.user, sim.password, port=sim.port, insecure=True)
        opened.append(service)
        return service

    yield _connect
    for service in opened:
        vs.disconnect(service)


def builder_spec(sim: Vcsim, name: str = "debian12-builder", **overrides: object) -> vs.BuilderVmSpec:
    spec = vs.BuilderVmSpec(
        name=name,
        datacenter=sim.datacenter,
        cluster=sim.cluster,
        datastore=sim.datastore,
        network=sim.network,
        iso_path=ISO,
        disk_gib=16,
        memory_mib=1024,
        extra_config=vs.stack_tag(STACK),
    )
    return dataclasses.replace(spec, **overrides)  # type: ignore[arg-type]


def reconfigure(vm: vim.VirtualMachine, changes: list[vim.vm.device.VirtualDeviceSpec]) -> None:
    vs.wait_for_task(vm.ReconfigVM_Task(vim.vm.ConfigSpec(deviceChange=changes)), "test reconfigure")


def add(device: vim.vm.device.VirtualDevice, create_file: bool = False) -> vim.vm.device.VirtualDeviceSpec:
    spec = vim.vm.device.VirtualDeviceSpec(operation=vim.vm.device.VirtualDeviceSpec.Operation.add, device=device)
    if create_file:
        spec.fileOperation = vim.vm.device.VirtualDeviceSpec.FileOperation.create
    return spec


def flat_disk(key: int, controller_key: int, unit: int, thin: bool, eager: bool) -> vim.vm.device.VirtualDisk:
    return vim.vm.device.VirtualDisk(
        key=key,
        controllerKey=controller_key,
        unitNumber=unit,
        capacityInKB=1024 * 1024,
        backing=vim.vm.device.VirtualDisk.FlatVer2BackingInfo(
            fileName="", diskMode="persistent", thinProvisioned=thin, eagerlyScrub=eager
        ),
    )


def one(devices: list[object], kind: type) -> object:
    found = [d for d in devices if isinstance(d, kind)]
    assert len(found) == 1, f"expected one {kind.__name__}, got {found}"
    return found[0]


def cluster_vms(count: int, disk_gib: int = 2) -> tuple[vs.PlannedVm, ...]:
    # Small: vcsim reports the free space of this machine's disk, which other jobs share.
    return tuple(
        vs.PlannedVm(name=f"k8s-{i}", ip_addresses=(f"192.0.2.{10 + i}",), disk_gib=(disk_gib,), memory_mib=512)
        for i in range(count)
    )


def preflight_spec(sim: Vcsim, **overrides: object) -> vs.PreflightSpec:
    vms = cluster_vms(7)
    spec = vs.PreflightSpec(
        datacenter=sim.datacenter,
        cluster=sim.cluster,
        datastore=sim.datastore,
        network=sim.network,
        stack=STACK,
        vms=vms,
        extra_ips=("192.0.2.100",),
        anti_affinity_rules=(vs.AntiAffinityRule("control-plane", tuple(v.name for v in vms[:3])),),
    )
    return dataclasses.replace(spec, **overrides)  # type: ignore[arg-type]


def messages(findings: list[vs.Finding]) -> str:
    return "\n".join(str(f) for f in findings)


# ---------------------------------------------------------------- connection


@pytest.mark.parametrize(
    ("value", "host", "port"),
    [
        ("vcenter.labs.local", "vcenter.labs.local", 443),
        ("vcenter.labs.local:8443", "vcenter.labs.local", 8443),
        ("10.3.60.10:443", "10.3.60.10", 443),
        ("[fd00::10]", "fd00::10", 443),
        ("[fd00::10]:8443", "fd00::10", 8443),
    ],
)
def test_server_address_forms(value: str, host: str, port: int) -> None:
    assert vs.parse_server(value) == vs.ServerAddress(host, port)


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("", "is empty"),
        ("https://vcenter.labs.local/sdk", "is a URL"),
        ("vcenter.labs.local/sdk", "is a URL"),
        ("vcenter.labs.local:", "has no valid port"),
        ("vcenter.labs.local:70000", "has no valid port"),
        (":443", "has no host"),
        ("[fd00::10]8443", "is not [IPv6]:port"),
    ],
)
def test_server_address_errors_name_the_key(value: str, complaint: str) -> None:
    with pytest.raises(vs.VSphereError, match=f"vsphere:vsphereServer.*{re.escape(complaint)}.*host name"):
        vs.parse_server(value)


# Forms the vsphere provider cannot use although pyVim would: it parses "https://" + value + "/sdk"
# with Go's url.Parse (terraform-provider-vsphere config.go vimURL), which fails on the spaces
# ("invalid port \":8443 \" after host", "invalid character \" \" in host name") and reads a bare
# IPv6 address as host "fd00:", port "10" (checked with Go 1.19's net/url).
@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        (" vcenter.labs.local:8443 ", "has spaces around it"),
        ("vcenter.labs.local ", "has spaces around it"),
        ("fd00::10", "is an IPv6 address without brackets"),
    ],
)
def test_server_forms_the_vsphere_provider_cannot_use_are_refused(value: str, complaint: str) -> None:
    with pytest.raises(vs.VSphereError, match=f"vsphere:vsphereServer {re.escape(repr(value))} {complaint}"):
        vs.parse_server(value)
    if complaint.startswith("is an IPv6"):
        with pytest.raises(vs.VSphereError, match=re.escape("write it as [fd00::10] (or [fd00::10]:443)")):
            vs.parse_server(value)


def test_connect_verifies_tls_even_on_localhost(vcsim: Vcsim) -> None:
    """pyVim alone would skip verification for 127.0.0.1; connect() must not."""
    with pytest.raises(vs.VSphereError, match="cannot verify the TLS certificate"):
        vs.connect(vcsim.host, vcsim.user, vcsim.password, port=vcsim.port)


def test_connect_rejects_wrong_password(vcsim: Vcsim) -> None:
    with pytest.raises(vs.VSphereError, match=f"rejected the login for user '{vcsim.user}'"):
        vs.connect(vcsim.host, vcsim.user, "wrong", port=vcsim.port, insecure=True)


def test_session_logs_out(vcsim: Vcsim) -> None:
    with vs.session(vcsim.host, vcsim.user, vcsim.password, port=vcsim.port, insecure=True) as service:
        content = service.RetrieveContent()
        assert content.sessionManager.currentSession.userName == vcsim.user
    with pytest.raises(vim.fault.NotAuthenticated):
        content.sessionManager.currentSession.userName  # noqa: B018 - the read is the assertion


# ---------------------------------------------------------------- lookups


def test_lookups_find_every_kind_of_object(si: vim.ServiceInstance, vcsim: Vcsim) -> None:
    dc = vs.find_datacenter(si, vcsim.datacenter)
    assert isinstance(dc, vim.Datacenter) and dc.name == "DC0"
    cluster = vs.find_cluster(si, dc, vcsim.cluster)
    assert isinstance(cluster, vim.ClusterComputeResource) and len(cluster.host) == 3
    assert vs.find_datastore(si, dc, vcsim.datastore).name == vcsim.datastore
    std = vs.find_network(si, dc, vcsim.network)
    assert type(std) is vim.Network
    dvpg = vs.find_network(si, dc, vcsim.dvs_portgroup)
    assert isinstance(dvpg, vim.dvs.DistributedVirtualPortgroup)
    assert vs.find_vm_folder(si, dc, "") == dc.vmFolder
    assert vs.find_resource_pool(si, cluster) == cluster.resourcePool
    assert vs.inventory_path(si, cluster) == "DC0/host/DC0_C0"


@pytest.mark.parametrize(
    ("finder", "name", "kind"),
    [
        ("find_cluster", "no-such-cluster", "compute cluster"),
        ("find_datastore", "no-such-ds", "datastore"),
        ("find_network", "no-such-net", "network"),
        ("find_vm_folder", "no/such/folder", "VM folder"),
    ],
)
def test_missing_objects_are_named(si: vim.ServiceInstance, vcsim: Vcsim, finder: str, name: str, kind: str) -> None:
    dc = vs.find_datacenter(si, vcsim.datacenter)
    with pytest.raises(vs.NotFoundError) as err:
        getattr(vs, finder)(si, dc, name)
    text = str(err.value)
    assert f"{kind} {name!r} not found in 'DC0/" in text
    assert err.value.kind == kind and err.value.name == name


def test_missing_network_lists_what_exists(si: vim.ServiceInstance, vcsim: Vcsim) -> None:
    dc = vs.find_datacenter(si, vcsim.datacenter)
    with pytest.raises(vs.NotFoundError, match=r"available: .*'DC0_DVPG0'.*'VM Network'"):
        vs.find_network(si, dc, "vm network")  # names are case sensitive


def test_missing_datacenter_and_pool(si: vim.ServiceInstance, vcsim: Vcsim) -> None:
    with pytest.raises(vs.NotFoundError, match="datacenter 'DC9' not found in vCenter inventory; available: 'DC0'"):
        vs.find_datacenter(si, "DC9")
    dc = vs.find_datacenter(si, vcsim.datacenter)
    cluster = vs.find_cluster(si, dc, vcsim.cluster)
    with pytest.raises(vs.NotFoundError, match="resource pool 'k8s' not found in 'DC0/host/DC0_C0/Resources'"):
        vs.find_resource_pool(si, cluster, "k8s")


# ---------------------------------------------------------------- upload


def test_upload_bytes_and_file_to_datastore(si: vim.ServiceInstance, vcsim: Vcsim, tmp_path: Path) -> None:
    """vcsim backs each datastore with a local directory, so we read the result there.

    (vcsim does not check the session cookie on /folder; real vCenter does.)
    """
    dc = vs.find_datacenter(si, vcsim.datacenter)
    ds_dir = Path(vs.find_datastore(si, dc, vcsim.datastore).info.url)

    path = vs.upload_to_datastore(si, vcsim.datacenter, vcsim.datastore, "iso/seed.txt", b"hello vcsim\n")
    assert path == "[LocalDS_0] iso/seed.txt"
    assert (ds_dir / "iso" / "seed.txt").read_bytes() == b"hello vcsim\n"

    local = tmp_path / "debian 12.iso"
    payload = bytes(range(256)) * 4096  # 1 MiB, streamed from disk
    local.write_bytes(payload)
    path = vs.upload_to_datastore(si, vcsim.datacenter, vcsim.datastore, "iso/debian 12.iso", local)
    assert path == "[LocalDS_0] iso/debian 12.iso"
    assert (ds_dir / "iso" / "debian 12.iso").read_bytes() == payload


def test_make_datastore_dir_is_mkdir_p(si: vim.ServiceInstance, vcsim: Vcsim) -> None:
    dc = vs.find_datacenter(si, vcsim.datacenter)
    ds_dir = Path(vs.find_datastore(si, dc, vcsim.datastore).info.url)
    assert vs.make_datastore_dir(si, vcsim.datacenter, vcsim.datastore, "/a/b/c/") == "[LocalDS_0] a/b/c"
    assert (ds_dir / "a" / "b" / "c").is_dir()
    vs.make_datastore_dir(si, vcsim.datacenter, vcsim.datastore, "a/b/c")  # exists already: fine


def test_failed_task_carries_the_fault(si: vim.ServiceInstance, vcsim: Vcsim) -> None:
    vm = vs.create_builder_vm(si, builder_spec(vcsim)).vm
    with pytest.raises(vs.TaskError, match=r"powering off failed: vim\.fault\.InvalidPowerState") as err:
        vs.wait_for_task(vm.PowerOffVM_Task(), "powering off")  # it is already off
    assert isinstance(err.value.fault, vim.fault.InvalidPowerState)


def test_upload_to_missing_datastore_names_it(si: vim.ServiceInstance, vcsim: Vcsim) -> None:
    with pytest.raises(vs.NotFoundError, match="datastore 'isos' not found"):
        vs.upload_to_datastore(si, vcsim.datacenter, "isos", "a.iso", b"x")


# ---------------------------------------------------------------- golden template


def test_guest_id_unverified_when_vcenter_cannot_tell(si: vim.ServiceInstance, vcsim: Vcsim) -> None:
    """vcsim answers QueryConfigOptionEx with descriptors pyVmomi cannot parse (no recommendedDiskController)."""
    dc = vs.find_datacenter(si, vcsim.datacenter)
    cluster = vs.find_cluster(si, dc, vcsim.cluster)
    guest_id, notes = vs.choose_guest_id(cluster, vs.DEBIAN12_GUEST_ID, vs.GUEST_ID_FALLBACKS)
    assert guest_id == "debian12_64Guest"
    assert len(notes) == 1 and "using debian12_64Guest unverified" in notes[0]


class _FakeBrowser:
    def __init__(self, ids: list[str]) -> None:
        self.ids = ids
        self.asked: list[str] = []

    def QueryConfigOptionEx(self, spec: vim.EnvironmentBrowser.ConfigOptionQuerySpec) -> object:
        self.asked = list(spec.guestId)
        return types.SimpleNamespace(guestOSDescriptor=[types.SimpleNamespace(id=i) for i in self.ids])


def _fake_cluster(ids: list[str]) -> object:
    return types.SimpleNamespace(name="C1", environmentBrowser=_FakeBrowser(ids))


def test_guest_id_choice_follows_what_the_cluster_lists() -> None:
    """No vcsim: a stand-in environment browser, as a vSphere 7 cluster answers."""
    vsphere7 = _fake_cluster(["debian10_64Guest", "debian11_64Guest", "other4xLinux64Guest", "windows9Guest"])
    guest_id, notes = vs.choose_guest_id(vsphere7, vs.DEBIAN12_GUEST_ID, vs.GUEST_ID_FALLBACKS)
    assert guest_id == "debian11_64Guest"
    assert notes == [
        "guest id debian12_64Guest is not supported by cluster 'C1' (older vSphere); using debian11_64Guest instead"
    ]
    assert vsphere7.environmentBrowser.asked == [vs.DEBIAN12_GUEST_ID, *vs.GUEST_ID_FALLBACKS]

    vsphere8 = _fake_cluster(["debian12_64Guest", "debian11_64Guest"])
    assert vs.choose_guest_id(vsphere8, vs.DEBIAN12_GUEST_ID, vs.GUEST_ID_FALLBACKS) == ("debian12_64Guest", [])

    with pytest.raises(vs.VSphereError, match="supports none of the guest ids debian12_64Guest, debian11_64Guest"):
        vs.choose_guest_id(_fake_cluster(["windows9Guest"]), vs.DEBIAN12_GUEST_ID, ("debian11_64Guest",))


def test_golden_template_lifecycle(si: vim.ServiceInstance, vcsim: Vcsim) -> None:
    """Create -> read hardware back -> "installer" powers off -> eject -> template -> delete.

    There is no guest in vcsim, so the installer's final poweroff is simulated
    with a hard power-off while wait_for_power_off() is the real code path.
    """
    iso = vs.upload_to_datastore(si, vcsim.datacenter, vcsim.datastore, "iso/debian-12-preseeded.iso", b"ISO")
    built = vs.create_builder_vm(si, builder_spec(vcsim, iso_path=iso))
    vm = built.vm
    assert built.guest_id == "debian12_64Guest" and "unverified" in built.notes[0]
    assert built.moid == vm._moId and built.uuid == vm.config.uuid

    devices = list(vm.config.hardware.device)
    controller = one(devices, vim.vm.device.VirtualSCSIController)
    assert type(controller) is vim.vm.device.ParaVirtualSCSIController
    disk = one(devices, vim.vm.device.VirtualDisk)
    assert disk.controllerKey == controller.key
    assert disk.capacityInKB == 16 * 1024 * 1024
    assert disk.backing.eagerlyScrub is True and disk.backing.thinProvisioned is False
    nic = one(devices, vim.vm.device.VirtualEthernetCard)
    assert type(nic) is vim.vm.device.VirtualVmxnet3
    assert nic.backing.deviceName == vcsim.network
    cdrom = one(devices, vim.vm.device.VirtualCdrom)
    assert isinstance(cdrom.backing, vim.vm.device.VirtualCdrom.IsoBackingInfo)
    assert cdrom.backing.fileName == iso and cdrom.connectable.startConnected
    assert vm.config.firmware == "bios"
    assert vm.config.guestId == "debian12_64Guest"
    extra = {o.key: o.value for o in vm.config.extraConfig}
    assert extra["disk.EnableUUID"] == "TRUE"
    assert extra[vs.STACK_TAG_KEY] == STACK
    assert vm.config.hardware.numCPU == 2 and vm.config.hardware.memoryMB == 1024

    # Before the ISO is ejected the hardware check must object to it.
    assert [p for p in vs.verify_template_hardware(vm) if "still has ISO" in p]

    vs.power_on(vm)
    assert vs.power_state(vm) == "poweredOn"
    vs.power_off(vm)  # the "installer" finishes
    vs.wait_for_power_off(vm, timeout_s=10, poll_s=0.1)
    vs.detach_iso(vm)
    cdrom = one(list(vm.config.hardware.device), vim.vm.device.VirtualCdrom)
    assert not isinstance(cdrom.backing, vim.vm.device.VirtualCdrom.IsoBackingInfo)
    assert cdrom.connectable.startConnected is False

    vs.mark_as_template(vm)
    assert vm.config.template is True
    vs.mark_as_template(vm)  # idempotent
    assert vs.verify_template_hardware(vm) == []
    uuid = vs.template_uuid(vm)
    assert uuid == vm.config.uuid and uuid != vm.config.instanceUuid
    assert vs.find_vm_by_uuid(si, uuid) == vm

    found_by_name = vs.find_vm(si, built.vm.name)
    assert found_by_name == vm
    vs.destroy_vm(vm)
    assert vs.find_vm(si, "debian12-builder") is None
    assert vs.find_vm_by_uuid(si, uuid) is None
    with pytest.raises(vs.NotFoundError, match="VM 'debian12-builder' not found"):
        vs.get_vm(si, "debian12-builder")


def test_detach_iso_can_remove_the_cdrom(si: vim.ServiceInstance, vcsim: Vcsim) -> None:
    """The template provider removes the CD-ROM outright; verify must then pass."""
    vm = vs.create_builder_vm(si, builder_spec(vcsim)).vm
    assert [d for d in vm.config.hardware.device if isinstance(d, vim.vm.device.VirtualCdrom)]
    vs.detach_iso(vm, remove_device=True)
    assert [d for d in vm.config.hardware.device if isinstance(d, vim.vm.device.VirtualCdrom)] == []
    vs.mark_as_template(vm)
    assert vs.verify_template_hardware(vm) == []


def test_builder_on_dvs_portgroup_with_efi(si: vim.ServiceInstance, vcsim: Vcsim) -> None:
    built = vs.create_builder_vm(si, builder_spec(vcsim, network=vcsim.dvs_portgroup, firmware="efi"))
    vm = built.vm
    nic = one(list(vm.config.hardware.device), vim.vm.device.VirtualEthernetCard)
    assert isinstance(nic.backing, vim.vm.device.VirtualEthernetCard.DistributedVirtualPortBackingInfo)
    dc = vs.find_datacenter(si, vcsim.datacenter)
    assert nic.backing.port.portgroupKey == vs.find_network(si, dc, vcsim.dvs_portgroup).key
    assert vm.config.firmware == "efi"
    assert vm.config.bootOptions.efiSecureBootEnabled is False  # packer-examples-for-vsphere#964


def test_builder_refuses_an_existing_name(si: vim.ServiceInstance, vcsim: Vcsim) -> None:
    vs.create_builder_vm(si, builder_spec(vcsim))
    with pytest.raises(vs.VSphereError, match="a VM named 'debian12-builder' already exists"):
        vs.create_builder_vm(si, builder_spec(vcsim))


def test_builder_with_missing_datastore_names_it(si: vim.ServiceInstance, vcsim: Vcsim) -> None:
    with pytest.raises(vs.NotFoundError, match="datastore 'ssd-01' not found in 'DC0/datastore'"):
        vs.create_builder_vm(si, builder_spec(vcsim, datastore="ssd-01"))


def _template_ready(si: vim.ServiceInstance, vcsim: Vcsim) -> vim.VirtualMachine:
    vm = vs.create_builder_vm(si, builder_spec(vcsim)).vm
    vs.detach_iso(vm)
    assert vs.verify_template_hardware(vm) == []
    return vm


def test_verify_flags_a_thin_disk(si: vim.ServiceInstance, vcsim: Vcsim) -> None:
    vm = _template_ready(si, vcsim)
    pvscsi = one(list(vm.config.hardware.device), vim.vm.device.ParaVirtualSCSIController)
    reconfigure(vm, [add(flat_disk(-1, pvscsi.key, 1, thin=True, eager=False), create_file=True)])
    thin = [d for d in vm.config.hardware.device if isinstance(d, vim.vm.device.VirtualDisk) and d.unitNumber == 1]
    label = f"{thin[0].deviceInfo.label} (key {thin[0].key})"

    problems = vs.verify_template_hardware(vm)
    assert problems == [
        f"{label} is thin provisioned; it must be thick provisioned eager-zeroed",
        f"{label} is not eager-zeroed (eagerlyScrub is False)",
    ]


def test_verify_flags_wrong_controller_and_nic(si: vim.ServiceInstance, vcsim: Vcsim) -> None:
    vm = _template_ready(si, vcsim)
    lsi = vim.vm.device.VirtualLsiLogicController(key=-10, busNumber=1, sharedBus="noSharing")
    e1000 = vim.vm.device.VirtualE1000(
        key=-11, backing=vim.vm.device.VirtualEthernetCard.NetworkBackingInfo(deviceName=vcsim.network)
    )
    reconfigure(vm, [add(lsi), add(flat_disk(-12, -10, 0, thin=False, eager=True), create_file=True), add(e1000)])
    devices = list(vm.config.hardware.device)
    lsi_dev = one(devices, vim.vm.device.VirtualLsiLogicController)
    e1000_dev = one(devices, vim.vm.device.VirtualE1000)
    disk_on_lsi = [d for d in devices if isinstance(d, vim.vm.device.VirtualDisk) and d.controllerKey == lsi_dev.key]

    problems = vs.verify_template_hardware(vm)
    lsi_name = f"{lsi_dev.deviceInfo.label} (key {lsi_dev.key})"
    assert f"{lsi_name} is VirtualLsiLogicController, not VMware Paravirtual (PVSCSI)" in problems
    disk_name = f"{disk_on_lsi[0].deviceInfo.label} (key {disk_on_lsi[0].key})"
    assert f"{disk_name} is attached to {lsi_name}, not to a PVSCSI controller" in problems
    assert f"{e1000_dev.deviceInfo.label} (key {e1000_dev.key}) is VirtualE1000, not VMXNET3" in problems
    assert len(problems) == 3, problems


def test_wait_for_power_off_times_out_clearly(si: vim.ServiceInstance, vcsim: Vcsim) -> None:
    vm = vs.create_builder_vm(si, builder_spec(vcsim)).vm
    vs.power_on(vm)
    with pytest.raises(vs.VSphereTimeoutError, match=r"'debian12-builder' is still poweredOn after 0.3s.*console"):
        vs.wait_for_power_off(vm, timeout_s=0.3, poll_s=0.05)
    with pytest.raises(vs.VSphereError, match="must be powered off before it can become a template"):
        vs.mark_as_template(vm)
    vs.destroy_vm(vm)  # powers off first
    assert vs.find_vm(si, "debian12-builder") is None


# ---------------------------------------------------------------- drills


def test_drill_power_off_and_on(si: vim.ServiceInstance, vcsim: Vcsim) -> None:
    vm = vs.create_builder_vm(si, builder_spec(vcsim, name="k8s-cp-1")).vm
    assert vs.get_vm(si, "k8s-cp-1") == vm
    assert vs.power_state(vm) == "poweredOff"
    vs.power_on(vm)
    vs.wait_for_power_state(vm, "poweredOn", timeout_s=5, poll_s=0.05)
    vs.power_on(vm)  # already on: no InvalidPowerState fault
    vs.power_off(vm)
    vs.wait_for_power_state(vm, "poweredOff", timeout_s=5, poll_s=0.05)
    vs.power_off(vm)  # already off
    assert vs.power_state(vm) == "poweredOff"
    with pytest.raises(vs.VSphereTimeoutError, match="still poweredOff after"):
        vs.wait_for_power_state(vm, "poweredOn", timeout_s=0.2, poll_s=0.05)


# ---------------------------------------------------------------- preflight


def test_preflight_passes_on_three_hosts(si: vim.ServiceInstance, vcsim: Vcsim) -> None:
    report = vs.preflight(si, preflight_spec(vcsim))
    assert report.ok, report.render()
    # Two warnings by design (issue 23): a must-rule with one VM per host blocks host maintenance,
    # and vcsim's datastore is of type OTHER, which preflight cannot vouch for.
    assert [f.check for f in report.warnings] == ["hosts", "datastore"], report.render()
    assert "DRS cannot evacuate a host for maintenance mode" in report.warnings[0].message
    assert "is of type OTHER" in report.warnings[1].message
    assert report.connected_hosts == 3
    assert report.datastore_free_bytes is not None and report.datastore_free_bytes > report.required_bytes > 0
    # 7 x 2 GiB disks + 7 x 0.5 GiB swap, plus 15 %
    assert report.required_bytes == int((7 * 2 + 7 * 0.5) * vs.GiB * 1.15)
    # vcsim cannot tell which guest ids it supports: preflight says so, and which one it will use.
    assert report.guest_id == "debian12_64Guest"
    assert report.notes[0] == "guest id: the template and its clones will use debian12_64Guest"
    assert "using debian12_64Guest unverified" in report.notes[1]


def test_preflight_counts_only_what_does_not_exist_yet(si: vim.ServiceInstance, vcsim: Vcsim) -> None:
    """A re-run (or a PR preview) of a lab that exists: its VMs hold their disks and swap already,
    and the datastore's free space is what they left (vcsim, like vCenter, subtracts their disks).

    The lab fits on the empty datastore. With six of its seven VMs there (ours, running), only the
    seventh is still to be allocated; asking for all seven again would fail every re-run.
    """
    free = vs.preflight(si, preflight_spec(vcsim, vms=())).datastore_free_bytes
    assert free is not None
    each = max(1, int(free / vs.GiB / 10))  # the lab takes 7/10 of the free space, plus margin
    vms = tuple(dataclasses.replace(vm, disk_gib=(each,), memory_mib=256) for vm in cluster_vms(7))
    before = vs.preflight(si, preflight_spec(vcsim, vms=vms))
    assert before.ok, before.render()
    for vm in vms[:6]:
        built = vs.create_builder_vm(si, builder_spec(vcsim, name=vm.name, disk_gib=each, memory_mib=256))
        vs.power_on(built.vm)
    after = vs.preflight(si, preflight_spec(vcsim, vms=vms))
    assert after.ok, after.render()
    assert after.datastore_free_bytes is not None and after.datastore_free_bytes < free - 5 * each * vs.GiB
    assert before.existing_vms == [] and after.existing_vms == [vm.name for vm in vms[:6]]
    assert after.required_bytes == int((each * vs.GiB + 256 * 1024**2) * 1.15), "only the seventh VM"
    # Another stack's VM with one of our names holds nothing for us: it is a collision instead.
    vs.destroy_vm(vs.get_vm(si, vms[0].name))
    vs.create_builder_vm(si, builder_spec(vcsim, name=vms[0].name, disk_gib=each, extra_config=vs.stack_tag("x")))
    clash = vs.preflight(si, preflight_spec(vcsim, vms=vms))
    assert "names" in {f.check for f in clash.errors}, clash.render()
    assert vms[0].name not in clash.existing_vms


def test_preflight_two_hosts_cannot_hold_a_mandatory_three_vm_rule(
    vcsim_2hosts: Vcsim, connect_to: Callable[[Vcsim], vim.ServiceInstance]
) -> None:
    """vcsim stores DRS rules but never enforces them, so this checks our arithmetic,
    which is what protects a real cluster from VMs that cannot power on."""
    service = connect_to(vcsim_2hosts)
    report = vs.preflight(service, preflight_spec(vcsim_2hosts))
    assert not report.ok
    assert report.connected_hosts == 2
    assert len(report.errors) == 1, report.render()
    text = str(report.errors[0])
    assert "anti-affinity rule 'control-plane' keeps its 3 VMs (k8s-0, k8s-1, k8s-2)" in text
    assert "only 2 connected host(s)" in text
    assert "make the rule non-mandatory" in text

    soft = vs.AntiAffinityRule("control-plane", ("k8s-0", "k8s-1", "k8s-2"), mandatory=False)
    report = vs.preflight(service, preflight_spec(vcsim_2hosts, anti_affinity_rules=(soft,)))
    assert report.ok, report.render()
    assert "some of them will share a host" in messages(report.warnings)


def _disable_drs(cluster: vim.ClusterComputeResource) -> None:
    spec = vim.cluster.ConfigSpecEx(drsConfig=vim.cluster.DrsConfigInfo(enabled=False))
    vs.wait_for_task(cluster.ReconfigureComputeResource_Task(spec, True), "disable DRS")
    # The simulator applies drsConfig.enabled itself (simulator/cluster_compute_resource.go).
    assert not cluster.configurationEx.drsConfig.enabled, "vcsim ignored drsConfig.enabled"


def test_preflight_drs_disabled_fails_or_warns(si: vim.ServiceInstance, vcsim: Vcsim) -> None:
    dc = vs.find_datacenter(si, vcsim.datacenter)
    _disable_drs(vs.find_cluster(si, dc, vcsim.cluster))

    strict = vs.preflight(si, preflight_spec(vcsim, drs_required=True))
    assert not strict.ok
    assert len(strict.errors) == 1, strict.render()
    text = strict.errors[0].message
    assert strict.errors[0].check == "drs"
    assert "DRS is disabled on cluster 'DC0_C0'" in text
    assert "would be created but do nothing" in text
    assert "turn the anti-affinity rules off" in text

    lenient = vs.preflight(si, preflight_spec(vcsim, drs_required=False))
    assert lenient.ok, lenient.render()
    assert [f.check for f in lenient.warnings] == ["drs", "hosts", "datastore"]

    no_rules = vs.preflight(si, preflight_spec(vcsim, anti_affinity_rules=()))
    assert no_rules.ok and [f.check for f in no_rules.warnings] == ["datastore"], no_rules.render()


def test_preflight_names_missing_objects(si: vim.ServiceInstance, vcsim: Vcsim) -> None:
    report = vs.preflight(si, preflight_spec(vcsim, datastore="ssd-01", network="k8s-net", vm_folder="k8s"))
    errors = {f.check: f.message for f in report.errors}
    assert set(errors) == {"datastore", "network", "folder"}, report.render()
    assert "datastore 'ssd-01' not found in 'DC0/datastore'" in errors["datastore"]
    assert "available: 'LocalDS_0'" in errors["datastore"]
    assert "network 'k8s-net' not found in 'DC0/network'" in errors["network"]
    assert "VM folder 'k8s' not found in 'DC0/vm'" in errors["folder"]
    assert "Create the VM folder" in errors["folder"]

    report = vs.preflight(si, preflight_spec(vcsim, cluster="prod"))
    assert [f.check for f in report.errors] == ["cluster"]
    assert "compute cluster 'prod' not found in 'DC0/host'" in report.errors[0].message

    report = vs.preflight(si, preflight_spec(vcsim, datacenter="DC7"))
    assert [f.check for f in report.errors] == ["datacenter"]
    assert "datacenter 'DC7' not found" in report.errors[0].message


def test_preflight_datastore_too_small(si: vim.ServiceInstance, vcsim: Vcsim) -> None:
    """vcsim reports the free space of the host filesystem under its temp dir;
    we ask for more than that."""
    free = vs.preflight(si, preflight_spec(vcsim)).datastore_free_bytes
    assert free is not None and free > 0
    big = free // vs.GiB + 1
    vms = (vs.PlannedVm(name="k8s-0", disk_gib=(big,)),)
    report = vs.preflight(si, preflight_spec(vcsim, vms=vms, anti_affinity_rules=()))
    assert [f.check for f in report.errors] == ["datastore"], report.render()
    text = report.errors[0].message
    assert f"datastore 'LocalDS_0' has {free / vs.GiB:.1f} GiB free" in text
    assert f"({big} GiB of eager-zeroed disks" in text


def test_preflight_reports_name_and_address_collisions(si: vim.ServiceInstance, vcsim: Vcsim) -> None:
    """A foreign VM (no stack tag) named like ours, and one holding our address.

    vcsim has no guest tools: SET.guest.ipAddress (vcsim-only extraConfig)
    sets guest.ipAddress and guest.net[0].ipAddress like tools would.
    """
    vs.create_builder_vm(si, builder_spec(vcsim, name="k8s-1", extra_config={}))
    vs.create_builder_vm(
        si, builder_spec(vcsim, name="someone-else", extra_config={"SET.guest.ipAddress": "192.0.2.100"})
    )
    vs.create_builder_vm(si, builder_spec(vcsim, name="k8s-2"))  # ours (stack tag): fine, e.g. a re-run
    # Small disks: vcsim's LocalDS reports this machine's own free space, which is not this test's subject.
    report = vs.preflight(si, preflight_spec(vcsim, vms=cluster_vms(7, disk_gib=1)))
    errors = sorted(report.errors, key=lambda f: f.check)
    assert [f.check for f in errors] == ["addresses", "names"], report.render()
    assert "address 192.0.2.100 (planned for extra address) is already used by VM DC0/vm/someone-else" in str(errors[0])
    assert "VM name 'k8s-1' is already used by DC0/vm/k8s-1 (no stack of ours)" in str(errors[1])


def test_preflight_collision_with_another_stack(si: vim.ServiceInstance, vcsim: Vcsim) -> None:
    vs.create_builder_vm(
        si,
        builder_spec(vcsim, name="k8s-3", extra_config={**vs.stack_tag("other"), "SET.guest.ipAddress": "192.0.2.13"}),
    )
    report = vs.preflight(si, preflight_spec(vcsim))
    text = messages(report.errors)
    assert "VM name 'k8s-3' is already used by DC0/vm/k8s-3 (stack 'other')" in text
    assert "address 192.0.2.13 (planned for k8s-3) is already used by VM DC0/vm/k8s-3 (stack 'other')" in text


def test_vcsim_topology_flags(vcsim_factory: Callable[..., Vcsim]) -> None:
    """The fixture really passes its topology: 2 clusters of 4 hosts, 2 datastores."""
    sim = vcsim_factory(clusters=2, hosts=4, datastores=2)
    with vs.session(sim.host, sim.user, sim.password, port=sim.port, insecure=True) as service:
        dc = vs.find_datacenter(service, sim.datacenter)
        assert len(vs.find_cluster(service, dc, "DC0_C1").host) == 4
        assert vs.find_datastore(service, dc, "LocalDS_1").name == "LocalDS_1"


def test_a_nested_resource_pool_has_one_meaning(si: vim.ServiceInstance, vcsim: Vcsim) -> None:
    """labs-k8s:vsphere.resourcePool "team/k8s": the template builder resolves it below the
    cluster's root pool; the clones get <cluster>/Resources/team/k8s (components/fleet.py
    resource_pool_path), the inventory path below the datacenter's host folder that the provider's
    govmomi finder resolves. Both name the same nested pool, not a same-named pool elsewhere."""
    from components.fleet import resource_pool_path
    from tests.labs import make_lab_config

    dc = vs.find_datacenter(si, vcsim.datacenter)
    cluster = vs.find_cluster(si, dc, vcsim.cluster)
    allocation = vim.ResourceAllocationInfo(
        reservation=0, expandableReservation=True, limit=-1, shares=vim.SharesInfo(level="normal")
    )
    spec = vim.ResourceConfigSpec(cpuAllocation=allocation, memoryAllocation=allocation)
    team = cluster.resourcePool.CreateResourcePool("team", spec)
    nested = team.CreateResourcePool("k8s", spec)
    cluster.resourcePool.CreateResourcePool("k8s", spec)  # the same name one level up: not ours
    lab = make_lab_config()
    lab = lab.model_copy(
        update={
            "vsphere": lab.vsphere.model_copy(update={"compute_cluster": vcsim.cluster, "resource_pool": "team/k8s"})
        }
    )
    assert vs.find_resource_pool(si, cluster, lab.vsphere.resource_pool) == nested
    by_path = si.RetrieveContent().searchIndex.FindByInventoryPath(
        f"{vs.inventory_path(si, dc.hostFolder)}/{resource_pool_path(lab)}"
    )
    assert by_path == nested


def test_a_vm_made_again_under_the_same_name_gets_a_new_uuid(si: vim.ServiceInstance, vcsim: Vcsim) -> None:
    """vCenter gives every new VM a new BIOS uuid (the vSphere provider's VM id). The simulator
    derived it from the VM's path, so a VM replaced under its name came back with the old id and
    the host-key step took the new VM for the old one (the lab in a box's control-plane
    replacement); tests/tools/vcsim/main.go newUUIDForNewVM."""
    first = vs.create_builder_vm(si, builder_spec(vcsim, name="labs-k8s-replaced"))
    old_uuid = first.vm.config.uuid
    vs.destroy_vm(first.vm)
    second = vs.create_builder_vm(si, builder_spec(vcsim, name="labs-k8s-replaced"))
    assert second.vm.config.uuid != old_uuid
    assert vs.get_vm(si, "labs-k8s-replaced").config.uuid == second.vm.config.uuid
    vs.destroy_vm(second.vm)
