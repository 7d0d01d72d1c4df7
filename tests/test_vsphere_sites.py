"""vSphere as sites have it (issue 23): storage types, hardware checks a rebuild cannot fix, DRS.

vcsim shows what it models (tests/test_preflight.py: an NFS datastore, a vSAN datastore, a DRS
automation level, rules and VM placement). What it cannot show, these tests give preflight as
pyvmomi-level fakes: the exact managed-object properties preflight reads, with pyVmomi's own
data objects where a value has a type. vcsim never reports an NFS datastore with hardware
acceleration (HostFileSystemMountInfo.vStorageSupport is "vStorageUnsupported" or absent), never
evaluates a rule (ClusterRuleInfo.inCompliance stays as created), and its datastores are of type
OTHER, not VMFS.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any

import pytest
from pyVmomi import vim

from components import vsphere as vs
from components.template import DatastoreUnfitError, TemplateBuildError, TemplateBuildProvider

# The package re-exports the function `preflight`, which hides the module of that name.
vpf = importlib.import_module("components.vsphere.preflight")


# ---------------------------------------------------------------------------- storage
def datastore(kind: str, top_level_dirs: bool = True, name: str = "ds1") -> Any:
    return SimpleNamespace(
        name=name,
        summary=SimpleNamespace(type=kind, accessible=True),
        capability=vim.Datastore.Capability(
            directoryHierarchySupported=True,
            rawDiskMappingsSupported=False,
            perFileThinProvisioningSupported=True,
            topLevelDirectoryCreateSupported=top_level_dirs,
        ),
    )


def host_mounting(ds: Any, name: str, vstorage: str | None) -> tuple[Any, dict[str, Any]]:
    """A connected host that mounts ``ds``; ``vstorage`` is its HostFileSystemMountInfo.vStorageSupport."""
    mounts = (
        []
        if vstorage is None
        else [
            vim.host.FileSystemMountInfo(volume=vim.host.NasVolume(name=ds.name, type="NFS"), vStorageSupport=vstorage)
        ]
    )
    storage = SimpleNamespace(fileSystemVolumeInfo=vim.host.FileSystemVolumeInfo(mountInfo=mounts))
    host = SimpleNamespace(configManager=SimpleNamespace(storageSystem=storage))
    return host, {"name": name, "datastore": [ds]}


def type_findings(ds: Any, hosts: list[tuple[Any, dict[str, Any]]]) -> vpf.PreflightReport:
    report = vpf.PreflightReport()
    vpf._check_datastore_type(report, ds, hosts)
    return report


def test_vsan_is_refused_naming_the_key():
    ds = datastore("vsan", top_level_dirs=False)
    report = type_findings(ds, [host_mounting(ds, "esx1", None)])
    (error,) = report.errors
    assert "type vsan" in error.message and "namespaces" in error.message
    assert "labs-k8s:vsphere.datastore" in error.message and "VMFS" in error.message


def test_a_datastore_without_top_level_directories_is_refused():
    """vVols, or anything else where FileManager.MakeDirectory at the top level fails."""
    report = type_findings(datastore("VVOL", top_level_dirs=False), [])
    assert [f.check for f in report.errors] == ["datastore"]
    assert "labs-k8s:vsphere.datastore" in report.errors[0].message


def test_nfs_without_hardware_acceleration_is_refused_with_the_hosts_named():
    ds = datastore("NFS")
    hosts = [
        host_mounting(ds, "esx1", "vStorageSupported"),
        host_mounting(ds, "esx2", "vStorageUnsupported"),
        host_mounting(ds, "esx3", None),
    ]
    (error,) = type_findings(ds, hosts).errors
    assert "esx2 (vStorageUnsupported)" in error.message and "esx3 (vStorageUnknown)" in error.message
    assert "esx1" not in error.message
    assert "only thin disks" in error.message and "labs-k8s:vsphere.datastore" in error.message


def test_nfs_with_hardware_acceleration_everywhere_and_vmfs_pass():
    ds = datastore("NFS41")
    assert type_findings(ds, [host_mounting(ds, h, "vStorageSupported") for h in ("a", "b", "c")]).ok
    vmfs = type_findings(datastore("VMFS"), [])
    assert vmfs.ok and not vmfs.warnings


def test_an_unknown_type_is_a_warning_that_names_the_key():
    """vcsim's own datastores are "OTHER": not refused, but not silently passed either."""
    report = type_findings(datastore("OTHER"), [])
    assert report.ok
    (warning,) = report.warnings
    assert "labs-k8s:vsphere.datastore" in warning.message


# ---------------------------------------------------------------------------- hardware check
def template_vm(thin: bool, eager: bool) -> Any:
    controller = vim.vm.device.ParaVirtualSCSIController(key=1000, busNumber=0)
    disk = vim.vm.device.VirtualDisk(
        key=2000,
        controllerKey=1000,
        unitNumber=0,
        capacityInKB=1024,
        backing=vim.vm.device.VirtualDisk.FlatVer2BackingInfo(thinProvisioned=thin, eagerlyScrub=eager),
    )
    nic = vim.vm.device.VirtualVmxnet3(key=4000)
    return SimpleNamespace(
        config=SimpleNamespace(
            hardware=SimpleNamespace(device=[controller, disk, nic]),
            extraConfig=[vim.option.OptionValue(key="disk.EnableUUID", value="TRUE")],
        )
    )


def test_a_thin_disk_on_the_template_is_the_datastore_s_doing_and_no_rebuild_is_promised(monkeypatch):
    vm = template_vm(thin=True, eager=False)
    problems = vs.verify_template_hardware(vm)
    assert problems and all(p.datastore_bound for p in problems)
    with pytest.raises(DatastoreUnfitError) as caught:
        TemplateBuildProvider._verify(vm, "labs-k8s-debian12-x", "nfs1")
    message = str(caught.value)
    assert "'nfs1'" in message and "labs-k8s:vsphere.datastore" in message
    assert "building again on it ends the same" in message
    assert "run `pulumi up` again" not in message
    # The failed build's message (the builder kept for inspection) does not promise a rebuild either.
    monkeypatch.setattr(vs, "inventory_path", lambda si, vm: "DC0/vm/labs-k8s/builder")
    monkeypatch.setattr(vs, "power_off", lambda vm: None)
    spec = SimpleNamespace(name="labs-k8s-debian12-x")
    kept = TemplateBuildProvider._keep_for_inspection(None, vm, spec, caught.value)  # type: ignore[arg-type]
    assert "builds the template again" not in kept and "labs-k8s:vsphere.datastore" in kept


def test_a_fixable_hardware_problem_still_says_run_up_again(monkeypatch):
    vm = template_vm(thin=False, eager=True)
    vm.config.extraConfig = []
    with pytest.raises(TemplateBuildError) as caught:
        TemplateBuildProvider._verify(vm, "t", "ds1")
    assert not isinstance(caught.value, DatastoreUnfitError)
    monkeypatch.setattr(vs, "inventory_path", lambda si, vm: "DC0/vm/b")
    monkeypatch.setattr(vs, "power_off", lambda vm: None)
    kept = TemplateBuildProvider._keep_for_inspection(None, vm, SimpleNamespace(name="t"), caught.value)  # type: ignore[arg-type]
    assert "builds the template again" in kept


# ---------------------------------------------------------------------------- DRS
def cluster_with_drs(behavior: str | None) -> Any:
    drs = vim.cluster.DrsConfigInfo(enabled=True)
    drs.defaultVmBehavior = behavior
    return SimpleNamespace(name="C0", configurationEx=SimpleNamespace(drsConfig=drs, rule=[]))


RULES = (vs.AntiAffinityRule("labs-k8s-labs-control-planes", ("m01", "m02", "m03")),)


@pytest.mark.parametrize(
    ("behavior", "says"),
    [
        ("partiallyAutomated", "places VMs at power-on but never migrates them"),
        ("manual", "only makes recommendations"),
    ],
)
def test_drs_that_does_not_migrate_is_a_warning_naming_the_risk(behavior, says):
    """Each automation level preflight reads, without a vCenter (partiallyAutomated is also shown
    on vcsim, tests/test_preflight.py)."""
    report = vpf.PreflightReport()
    vpf._check_drs(
        report, vpf.PreflightSpec("dc", "C0", "ds", "net", anti_affinity_rules=RULES), cluster_with_drs(behavior)
    )
    (warning,) = report.warnings
    assert f"is {behavior}: it {says}" in warning.message
    assert "created after their VMs are placed" in warning.message and "fully automated" in warning.message


@pytest.mark.parametrize("behavior", ["fullyAutomated", None])
def test_fully_automated_drs_passes(behavior):
    report = vpf.PreflightReport()
    vpf._check_drs(
        report, vpf.PreflightSpec("dc", "C0", "ds", "net", anti_affinity_rules=RULES), cluster_with_drs(behavior)
    )
    assert report.ok and not report.warnings


def test_a_rule_vcenter_calls_out_of_compliance_is_named_with_its_vms():
    """inCompliance is vCenter's own verdict (vcsim never sets it); the members are on distinct
    hosts as far as runtime.host says, so only vCenter's verdict tells."""
    vms = [
        SimpleNamespace(name=n, runtime=SimpleNamespace(host=SimpleNamespace(name=f"esx-{n}")))
        for n in ("m01", "m02", "m03")
    ]
    cluster = cluster_with_drs("fullyAutomated")
    cluster.configurationEx.rule = [
        SimpleNamespace(name="labs-k8s-labs-control-planes", vm=vms, inCompliance=False),
        SimpleNamespace(name="someone-elses-rule", vm=vms, inCompliance=False),
    ]
    report = vpf.PreflightReport()
    vpf._check_drs(report, vpf.PreflightSpec("dc", "C0", "ds", "net", anti_affinity_rules=RULES), cluster)
    (warning,) = report.warnings
    assert (
        "'labs-k8s-labs-control-planes' is violated (vCenter: not in compliance; VMs m01, m02, m03)" in warning.message
    )


# ---------------------------------------------------------------------------- installer logs
# Stand-ins for debian-installer's finish-install.d, which finish-install runs in name order:
# 07preseed (package preseed) runs preseed/late_command, whose last step is the seal; then
# 55netcfg-copy-config (netcfg) and 94save-logs (finish-install: copies /var/log/syslog and
# cdebconf's questions.dat, the preseed's answers, to /target/var/log/installer).
FINISH_INSTALL = {
    "55netcfg-copy-config": 'mkdir -p "$TARGET/etc/network" && echo "iface ens192 inet static" '
    '> "$TARGET/etc/network/interfaces"\n',
    "94save-logs": 'mkdir -p "$TARGET/var/log/installer/cdebconf" && '
    'echo "mirror/http/proxy http://user:secret@proxy:3142" '
    '> "$TARGET/var/log/installer/cdebconf/questions.dat"\n',
}


def test_the_installer_saves_no_logs_into_the_sealed_template(tmp_path, lab_config):
    """The late_command's installer-side steps run against a stand-in finish-install.d, then the
    scripts after 07preseed run as finish-install runs them: nothing reaches /target/var/log/installer."""
    import subprocess

    from components.rendering.template import late_commands

    scripts, target = tmp_path / "finish-install.d", tmp_path / "target"
    scripts.mkdir()
    target.mkdir()
    for name, body in FINISH_INSTALL.items():
        (scripts / name).write_text("#!/bin/sh\n" + body)
        (scripts / name).chmod(0o755)
    for command in late_commands(lab_config):
        if command.startswith("rm -f /usr/lib/finish-install.d/"):  # the installer's own environment
            subprocess.run(["sh", "-c", command.replace("/usr/lib/finish-install.d", str(scripts))], check=True)
    for script in sorted(scripts.iterdir()):
        subprocess.run([str(script)], check=True, env={"TARGET": str(target), "PATH": "/usr/bin:/bin"})
    assert not (target / "var/log/installer").exists()
    assert not (target / "etc/network/interfaces").exists()
