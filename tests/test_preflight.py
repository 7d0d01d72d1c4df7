"""Preflight glue (components/preflight.py): the lab config turned into checks against a real vcsim.

vcsim does not enforce DRS rules; these tests check what preflight computes and reports
(hosts vs mandatory rule sizes, missing objects), not real placement.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import ClassVar

import pulumi
import pytest
from pyVmomi import vim

from components import releases
from components import vsphere as vs
from components.config import LabConfig
from components.preflight import preflight_spec, release_findings, run_preflight
from components.rendering.template import template_vm_name
from components.stack_config import StackInputs, VcenterCredentials
from components.tools.offline import REPO_ROOT
from tests.test_config import problems

FOLDER = "labs-k8s"


def lab_on(vcsim, lab_config: LabConfig, **placement: str) -> LabConfig:
    names = {
        "datacenter": vcsim.datacenter,
        "compute_cluster": vcsim.cluster,
        "datastore": vcsim.datastore,
        "network": vcsim.network,
        "folder": FOLDER,
        **placement,
    }
    # The committed stack's offline config has preflight off (no vCenter); these tests turn it on.
    return lab_config.model_copy(
        update={
            "vsphere": lab_config.vsphere.model_copy(update=names),
            # No internet in tests: the Kubernetes release check has its own, against a loopback server
            # (tests/test_release_check.py).
            "preflight": lab_config.preflight.model_copy(update={"enabled": True, "kubernetes_packages_url": ""}),
        }
    )


def inputs_for(vcsim, lab: LabConfig, monkeypatch) -> StackInputs:
    # Preflight reads the password from config/env, never these Outputs: plain strings stand in
    # (a real Output made outside an engine would be left pending on a dead event loop).
    return StackInputs(
        lab=lab,
        ssh_private_key="unused",  # type: ignore[arg-type]
        # `vsphere:vsphereServer` as host:port, the way a vCenter on another port is configured.
        vcenter=VcenterCredentials(
            server=vcsim.server,
            user=vcsim.user,
            password="unused",  # type: ignore[arg-type]
            allow_unverified_ssl=True,
            plain_password=vcsim.password,
        ),
        stack="labs",
    )


@pytest.fixture
def with_folder(vcsim_factory):
    def start(**topology: int):
        sim = vcsim_factory(**topology)
        with vs.session(sim.host, sim.user, sim.password, port=sim.port, insecure=True) as si:
            vs.find_datacenter(si, sim.datacenter).vmFolder.CreateFolder(FOLDER)
        return sim

    return start


def test_spec_carries_rules_vms_and_the_vip(lab_config):
    spec = preflight_spec(lab_config, "labs")
    rules = {r.name: r for r in spec.anti_affinity_rules}
    assert set(rules) == {"labs-k8s-labs-control-planes", "labs-k8s-labs-balancers", "labs-k8s-labs-workers"}
    assert rules["labs-k8s-labs-control-planes"].mandatory is True
    assert rules["labs-k8s-labs-workers"].mandatory is False
    assert len(rules["labs-k8s-labs-control-planes"].vm_names) == 3
    template = template_vm_name(lab_config, "labs")
    assert {vm.name for vm in spec.vms} == {n.name for n in lab_config.all_nodes} | {template}
    assert next(vm for vm in spec.vms if vm.name == template).disk_gib == (lab_config.template.disk_gib,)
    assert spec.extra_ips == ("10.3.60.100",)
    m01 = next(vm for vm in spec.vms if vm.name == "labs-k8s-m01")
    assert m01.disk_gib == (lab_config.template.disk_gib, 20)


def small_disks(lab: LabConfig, gib: int = 1) -> LabConfig:
    """vcsim's datastore reports this machine's free disk; keep the lab well inside it."""
    nodes = lab.nodes.model_copy(
        update={
            role: getattr(lab.nodes, role).model_copy(update={"data_disk_gib": gib})
            for role in ("control_planes", "workers")
        }
    )
    return lab.model_copy(update={"nodes": nodes, "template": lab.template.model_copy(update={"disk_gib": gib})})


def test_too_small_datastore_fails(with_folder, lab_config, monkeypatch):
    sim = with_folder(hosts=3)
    huge = lab_config.template.model_copy(update={"disk_gib": 10_000_000})
    with pytest.raises(pulumi.RunError, match=r"\[datastore\].*eager-zeroed") as caught:
        run_preflight(inputs_for(sim, lab_on(sim, lab_config.model_copy(update={"template": huge})), monkeypatch))
    assert "pick a bigger datastore (labs-k8s:vsphere.datastore)" in str(caught.value)  # the key, not only the name


def test_three_host_cluster_passes(with_folder, lab_config, monkeypatch):
    sim = with_folder(hosts=3)
    lab_config = small_disks(lab_config)
    connected = []
    session = vs.session
    monkeypatch.setattr(vs, "session", lambda *a, **k: connected.append((a, k)) or session(*a, **k))
    run_preflight(inputs_for(sim, lab_on(sim, lab_config), monkeypatch))  # raises on any error
    assert connected, "preflight did not talk to vcsim"
    # One parser for vsphere:vsphereServer (given as host:port): preflight connects with the host
    # and port parse_server gives, not with the raw value left to pyVim's own host:port parsing.
    ((args, kwargs),) = connected
    assert (args[0], kwargs.get("port")) == (sim.host, sim.port)


def test_two_hosts_fail_the_mandatory_control_plane_rule(with_folder, lab_config, monkeypatch):
    sim = with_folder(hosts=2)
    with pytest.raises(pulumi.RunError) as caught:
        run_preflight(inputs_for(sim, lab_on(sim, small_disks(lab_config)), monkeypatch))
    message = str(caught.value)
    assert "Nothing was created" in message
    assert "[hosts]" in message and "labs-k8s-labs-control-planes" in message


def test_missing_network_is_named(with_folder, lab_config, monkeypatch):
    sim = with_folder(hosts=3)
    with pytest.raises(pulumi.RunError, match="k8s-net"):
        run_preflight(inputs_for(sim, lab_on(sim, lab_config, network="k8s-net"), monkeypatch))


@pytest.mark.parametrize(
    ("placement", "value", "key"),
    [
        ("compute_cluster", "no-such-cluster", "labs-k8s:vsphere.computeCluster"),
        ("network", "no-such-net", "labs-k8s:vsphere.network"),
        ("folder", "no-such-folder", "labs-k8s:vsphere.folder"),
        ("datacenter", "no-such-dc", "labs-k8s:vsphere.datacenter"),
    ],
)
def test_a_wrong_placement_name_names_its_key(with_folder, lab_config, monkeypatch, placement, value, key):
    """Preflight named the key for a wrong datastore only; for the cluster or network it said
    "Fix the cluster name in the stack configuration", and the reader had to find which (issue 33)."""
    sim = with_folder(hosts=3)
    with pytest.raises(pulumi.RunError, match=value) as caught:
        run_preflight(inputs_for(sim, lab_on(sim, lab_config, **{placement: value}), monkeypatch))
    assert f"Fix {key}" in str(caught.value) or f"fix {key}" in str(caught.value)


def test_a_missing_datastore_names_the_key(with_folder, lab_config, monkeypatch):
    """The placement error listed the datastores vCenter has, but not the setting to change."""
    sim = with_folder(hosts=3)
    with pytest.raises(pulumi.RunError, match="no-such-ds") as caught:
        run_preflight(inputs_for(sim, lab_on(sim, lab_config, datastore="no-such-ds"), monkeypatch))
    assert "Fix labs-k8s:vsphere.datastore" in str(caught.value)


@pytest.mark.parametrize(("reported", "warned"), [("192.168.7.20", True), ("10.3.60.200", False)])
def test_a_port_group_whose_vms_report_another_subnet_is_warned_about(
    with_folder, lab_config, monkeypatch, reported, warned
):
    """The example's 10.3.60.0/24 kept on another network was found only at the first readiness
    step, 30-45 minutes in. A VM already on the port group (here an unrelated one whose Tools
    report `reported`, vcsim's SET.guest.ipAddress) tells preflight the port group's subnet."""
    sim = with_folder(hosts=3)
    with vs.session(sim.host, sim.user, sim.password, port=sim.port, insecure=True) as si:
        other = vs.create_builder_vm(
            si,
            vs.BuilderVmSpec(
                name="someone-elses-vm",
                datacenter=sim.datacenter,
                cluster=sim.cluster,
                datastore=sim.datastore,
                network=sim.network,
                iso_path=f"[{sim.datastore}] iso/none.iso",
                folder=FOLDER,
                disk_gib=1,
                memory_mib=64,
                extra_config={"SET.guest.ipAddress": reported},
            ),
        ).vm
        if other.runtime.powerState != "poweredOn":
            vs.wait_for_task(other.PowerOnVM_Task(), "power on someone-elses-vm")
    warnings: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **k: warnings.append(message))
    run_preflight(inputs_for(sim, lab_on(sim, small_disks(lab_config)), monkeypatch))  # a warning, not an error
    subnet = [w for w in warnings if "[network]" in w or "labs-k8s:network.cidr" in w]
    if warned:
        assert len(subnet) == 1, warnings
        assert (
            f"VMs on port group {sim.network!r} report 192.168.7.20 (someone-elses-vm), none inside "
            "labs-k8s:network.cidr 10.3.60.0/24" in subnet[0]
        )
    else:
        assert subnet == [], subnet


def test_preflight_can_be_switched_off(lab_config, monkeypatch):
    off = lab_config.model_copy(update={"preflight": lab_config.preflight.model_copy(update={"enabled": False})})

    def no_vcenter(*args, **kwargs):
        raise AssertionError("preflight off must not connect")

    monkeypatch.setattr(vs, "session", no_vcenter)
    run_preflight(
        StackInputs(
            lab=off,
            ssh_private_key="x",  # type: ignore[arg-type]
            vcenter=VcenterCredentials("h", "u", "p", False),
        )
    )  # type: ignore[arg-type]


def test_our_own_vms_are_not_collisions(with_folder, lab_config, monkeypatch):
    sim = with_folder(hosts=3)
    lab = lab_on(sim, small_disks(lab_config))
    with vs.session(sim.host, sim.user, sim.password, port=sim.port, insecure=True) as si:
        dc = vs.find_datacenter(si, sim.datacenter)
        pool = vs.find_cluster(si, dc, sim.cluster).resourcePool
        for name, stack in (("labs-k8s-w01", "labs"), ("labs-k8s-w02", "someone-else")):
            spec = vim.vm.ConfigSpec(
                name=name,
                guestId="otherGuest64",
                numCPUs=1,
                memoryMB=64,
                files=vim.vm.FileInfo(vmPathName=f"[{sim.datastore}]"),
                extraConfig=[vim.option.OptionValue(key=k, value=v) for k, v in vs.stack_tag(stack).items()],
            )
            vs.wait_for_task(dc.vmFolder.CreateVM_Task(config=spec, pool=pool), f"create {name}")
    with pytest.raises(pulumi.RunError) as caught:
        run_preflight(inputs_for(sim, lab, monkeypatch))
    assert "labs-k8s-w02" in str(caught.value)
    assert "labs-k8s-w01" not in str(caught.value)


def test_a_lab_that_exists_passes_preflight(with_folder, lab_config, monkeypatch):
    """Every re-run and every PR preview runs preflight against the lab it built: the stack's own
    VMs (and template) already hold their space, and the free space vCenter reports is what they
    left. Sized so that the lab fits the empty datastore, but not twice."""
    sim = with_folder(hosts=3)
    with vs.session(sim.host, sim.user, sim.password, port=sim.port, insecure=True) as si:
        dc = vs.find_datacenter(si, sim.datacenter)
        free = vs.find_datastore(si, dc, sim.datastore).summary.freeSpace
    gib = max(1, int(free / vs.GiB / 20))  # 8 VMs, 13 disks: 65 % of the free space, 75 % with margin
    lab = small_disks(lab_config, gib)
    # Little memory too: swap files count, and this machine's free space is not the subject.
    nodes = lab.nodes.model_copy(
        update={
            role: getattr(lab.nodes, role).model_copy(update={"memory_mib": 256})
            for role in ("balancers", "control_planes", "workers")
        }
    )
    lab = lab_on(
        sim, lab.model_copy(update={"nodes": nodes, "template": lab.template.model_copy(update={"memory_mib": 256})})
    )
    info: list[str] = []
    monkeypatch.setattr(pulumi.log, "info", lambda message, *a, **k: info.append(message))
    run_preflight(inputs_for(sim, lab, monkeypatch))  # the first `up`: it fits
    planned = preflight_spec(lab, "labs").vms
    with vs.session(sim.host, sim.user, sim.password, port=sim.port, insecure=True) as si:
        for vm in planned:
            built = vs.create_builder_vm(
                si,
                vs.BuilderVmSpec(
                    name=vm.name,
                    datacenter=sim.datacenter,
                    cluster=sim.cluster,
                    datastore=sim.datastore,
                    network=sim.network,
                    iso_path=f"[{sim.datastore}] iso/none.iso",
                    folder=FOLDER,
                    disk_gib=sum(vm.disk_gib),
                    memory_mib=vm.memory_mib,
                    extra_config=vs.stack_tag("labs"),
                ),
            )
            if vm.name.startswith(lab.template.name):
                vs.detach_iso(built.vm, remove_device=True)
                vs.mark_as_template(built.vm)
            else:
                vs.power_on(built.vm)
    info.clear()
    run_preflight(inputs_for(sim, lab, monkeypatch))  # the re-run: raises on any error
    assert "preflight: guest id: the template and its clones will use debian12_64Guest" in info
    assert (
        f"preflight: {len(planned)} of the stack's VMs exist already; the datastore check counts only "
        "what is still to be created" in info
    )


def test_plain_password_stays_out_of_reprs():
    credentials = VcenterCredentials("vc", "u", "out", False, plain_password="hunter2")  # type: ignore[arg-type]
    inputs = StackInputs(lab=None, ssh_private_key="k", vcenter=credentials)  # type: ignore[arg-type]
    assert "hunter2" not in repr(credentials) and "hunter2" not in repr(inputs)


# --------------------------------------------------------------------------- the Kubernetes release check
# Preflight asks the package repository whether labs-k8s:kubernetes.version exists (components/releases.py).
# A stand-in for pkgs.k8s.io on loopback serves `/v<minor>/deb/Packages` in the repository's own format
# (stanzas with Package/Version, versions like 1.36.2-1.1) and answers a minor it does not have with 404.

PATCHES = {"1.36": ["1.36.0", "1.36.1", "1.36.2"], "1.35": ["1.35.0"]}


def packages_index(minor: str) -> str:
    stanzas = []
    for patch in PATCHES[minor]:
        for package in ("cri-tools", "kubeadm", "kubectl", "kubelet", "kubernetes-cni"):
            version = patch if package in releases.PACKAGES else "1.5.0"
            stanzas.append(
                f"Package: {package}\nArchitecture: amd64\nVersion: {version}-1.1\n"
                f"Filename: {package}_{version}.deb\nSize: 1000\n"
            )
    return "\n".join(stanzas)


class PackagesHandler(http.server.BaseHTTPRequestHandler):
    requests: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        PackagesHandler.requests.append(self.path)
        minor = self.path.split("/")[1].lstrip("v")
        if minor not in PATCHES or not self.path.endswith("/deb/Packages"):
            self.send_error(404)
            return
        body = packages_index(minor).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def repository() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), PackagesHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    PackagesHandler.requests = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def with_version(lab, version: str, url: str):
    return lab.model_copy(
        update={
            "kubernetes": lab.kubernetes.model_copy(update={"version": version}),
            "preflight": lab.preflight.model_copy(update={"kubernetes_packages_url": url}),
        }
    )


@pytest.fixture
def sim(with_folder):
    return with_folder(hosts=3)


def test_a_patch_release_that_does_not_exist_fails_preflight(sim, lab_config, monkeypatch, repository):
    lab = with_version(lab_on(sim, small_disks(lab_config)), "1.36.9", repository)
    with pytest.raises(pulumi.RunError) as caught:
        run_preflight(inputs_for(sim, lab, monkeypatch))
    message = str(caught.value)
    assert "[kubernetes] labs-k8s:kubernetes.version: 1.36.9 does not exist" in message
    assert "Releases there: 1.36.0, 1.36.1, 1.36.2; the newest is 1.36.2" in message
    assert "Nothing was created" in message
    assert PackagesHandler.requests == ["/v1.36/deb/Packages"]


def test_an_unreleased_minor_fails_preflight(sim, lab_config, monkeypatch, repository):
    lab = with_version(lab_on(sim, small_disks(lab_config)), "1.37.0", repository)
    with pytest.raises(pulumi.RunError, match=r"no Kubernetes 1\.37 package repository .*HTTP 404"):
        run_preflight(inputs_for(sim, lab, monkeypatch))


def test_an_existing_release_passes(sim, lab_config, monkeypatch, repository):
    run_preflight(
        inputs_for(sim, with_version(lab_on(sim, small_disks(lab_config)), "1.36.2", repository), monkeypatch)
    )
    assert PackagesHandler.requests == ["/v1.36/deb/Packages"]


def test_an_unreachable_repository_only_warns(sim, lab_config, monkeypatch):
    warnings: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **k: warnings.append(message))
    closed = "http://127.0.0.1:9"  # discard port: nothing listens
    run_preflight(inputs_for(sim, with_version(lab_on(sim, small_disks(lab_config)), "1.36.2", closed), monkeypatch))
    assert any("could not check that Kubernetes 1.36.2 exists" in w for w in warnings)


def with_kubernetes_repository(lab, version: str, url: str):
    """The lab at `version` whose nodes install from `url` (labs-k8s:mirrors.kubernetesRepository.url)."""
    mirrors = lab.mirrors.model_copy(
        update={"kubernetes_repository": lab.mirrors.kubernetes_repository.model_copy(update={"url": url})}
    )
    return lab.model_copy(
        update={"kubernetes": lab.kubernetes.model_copy(update={"version": version}), "mirrors": mirrors}
    )


def test_the_check_asks_the_repository_the_nodes_install_from(lab_config, repository):
    """Unset, preflight.kubernetesPackagesUrl follows mirrors.kubernetesRepository.url: a site with its
    own mirror is checked against the mirror, not against pkgs.k8s.io."""
    assert lab_config.preflight.kubernetes_packages_url is None
    [finding] = release_findings(with_kubernetes_repository(lab_config, "1.36.9", repository))
    assert finding.error and f"the 1.36 repository ({repository}/v1.36/deb/Packages) has no" in finding.message
    assert PackagesHandler.requests == ["/v1.36/deb/Packages"]
    assert release_findings(with_kubernetes_repository(lab_config, "1.36.2", repository)) == []
    # Set explicitly, it wins; "" still skips the check.
    mirrored = with_kubernetes_repository(lab_config, "1.36.9", "http://127.0.0.1:9")
    assert release_findings(with_version(mirrored, "1.36.9", repository))[0].error
    assert release_findings(with_version(mirrored, "1.36.9", "")) == []


def test_an_empty_url_skips_the_check(lab_config):
    assert release_findings(with_version(lab_config, "1.36.9", "")) == []


def test_the_url_is_validated(lab_namespace):
    lab_namespace["preflight"]["kubernetesPackagesUrl"] = "pkgs.k8s.io"
    assert "is not an http:// or https:// URL" in problems(lab_namespace)["preflight.kubernetesPackagesUrl"]


def test_an_nfs_datastore_without_hardware_acceleration_is_refused(with_folder, lab_config, monkeypatch, tmp_path):
    """vcsim makes a real NFS datastore (HostDatastoreSystem.CreateNasDatastore) and reports no
    VAAI-NAS status for it: preflight refuses it, naming the key, before anything is built."""
    sim = with_folder(hosts=3)
    with vs.session(sim.host, sim.user, sim.password, port=sim.port, insecure=True) as si:
        cluster = vs.find_cluster(si, vs.find_datacenter(si, sim.datacenter), sim.cluster)
        # vcsim keeps the datastore's files in the local directory localPath; its base name is the name.
        (tmp_path / "nfs1").mkdir()
        spec = vim.host.NasVolume.Specification(
            remoteHost="127.0.0.1",
            remotePath="/export/nfs1",
            localPath=str(tmp_path / "nfs1"),
            accessMode="readWrite",
            type="NFS",
        )
        cluster.host[0].configManager.datastoreSystem.CreateNasDatastore(spec)
    with pytest.raises(pulumi.RunError) as caught:
        run_preflight(inputs_for(sim, lab_on(sim, small_disks(lab_config), datastore="nfs1"), monkeypatch))
    message = str(caught.value)
    assert "NFS datastore 'nfs1' has no hardware acceleration" in message
    assert "labs-k8s:vsphere.datastore" in message and "Nothing was created" in message


def test_a_tagged_vm_the_state_does_not_know_is_a_leftover(with_folder, lab_config, monkeypatch):
    """A clone the provider failed to roll back (its reconfigure outlived vsphere:apiTimeout): our
    name, our tag, but not in the stack's state. Preflight names it and says what to do, instead of
    the next create's DuplicateName; the VM the state does know passes, and so does any tagged VM
    when the state cannot be read."""
    from components.previous_state import PreviousState

    sim = with_folder(hosts=3)
    lab = lab_on(sim, small_disks(lab_config))
    with vs.session(sim.host, sim.user, sim.password, port=sim.port, insecure=True) as si:
        dc = vs.find_datacenter(si, sim.datacenter)
        pool = vs.find_cluster(si, dc, sim.cluster).resourcePool
        uuids = {}
        for name in ("labs-k8s-w01", "labs-k8s-w02"):
            spec = vim.vm.ConfigSpec(
                name=name,
                guestId="otherGuest64",
                numCPUs=1,
                memoryMB=64,
                files=vim.vm.FileInfo(vmPathName=f"[{sim.datastore}]"),
                extraConfig=[vim.option.OptionValue(key=k, value=v) for k, v in vs.stack_tag("labs").items()],
            )
            uuids[name] = vs.wait_for_task(dc.vmFolder.CreateVM_Task(config=spec, pool=pool), name).config.uuid
    state = PreviousState(available=True, resources={"labs-k8s-w01": {"uuid": uuids["labs-k8s-w01"]}})
    with pytest.raises(pulumi.RunError) as caught:
        run_preflight(inputs_for(sim, lab, monkeypatch), state)
    message = str(caught.value)
    assert (
        f"labs-k8s-w02 (uuid {uuids['labs-k8s-w02']}) carries this stack's tag, but the stack's state has "
        "no VM of that name" in message
    )
    assert "vsphere:apiTimeout" in message and "Delete from Disk" in message
    assert "labs-k8s-w01" not in message
    run_preflight(inputs_for(sim, lab, monkeypatch), PreviousState(available=False))  # raises on any error


def test_a_violated_rule_and_a_must_rule_as_wide_as_the_cluster_are_named(with_folder, lab_config, monkeypatch):
    """vcsim keeps the cluster's rules as given and places VMs where told, so both balancers on one
    host is a real violation here."""
    sim = with_folder(hosts=3)
    lab = lab_on(sim, small_disks(lab_config))
    with vs.session(sim.host, sim.user, sim.password, port=sim.port, insecure=True) as si:
        dc = vs.find_datacenter(si, sim.datacenter)
        cluster = vs.find_cluster(si, dc, sim.cluster)
        host = cluster.host[0]
        balancers = []
        for name in ("labs-k8s-lb01", "labs-k8s-lb02"):
            spec = vim.vm.ConfigSpec(
                name=name,
                guestId="otherGuest64",
                numCPUs=1,
                memoryMB=64,
                files=vim.vm.FileInfo(vmPathName=f"[{sim.datastore}]"),
                extraConfig=[vim.option.OptionValue(key=k, value=v) for k, v in vs.stack_tag("labs").items()],
            )
            task = dc.vmFolder.CreateVM_Task(config=spec, pool=cluster.resourcePool, host=host)
            balancers.append(vs.wait_for_task(task, name))
        rule = vim.cluster.AntiAffinityRuleSpec(
            name="labs-k8s-labs-balancers", enabled=True, mandatory=True, vm=balancers
        )
        change = vim.cluster.ConfigSpecEx(rulesSpec=[vim.cluster.RuleSpec(operation="add", info=rule)])
        vs.wait_for_task(cluster.ReconfigureComputeResource_Task(spec=change, modify=True), "rules")
        host_name = host.name
    warnings: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **k: warnings.append(message))
    run_preflight(inputs_for(sim, lab, monkeypatch))  # warnings, not errors
    text = "\n".join(warnings)
    assert (
        f"anti-affinity rule 'labs-k8s-labs-balancers' is violated: labs-k8s-lb01, labs-k8s-lb02 on {host_name}" in text
    )
    # Three control planes on three hosts under a must-rule: host maintenance is blocked.
    assert "mandatory anti-affinity rule 'labs-k8s-labs-control-planes' has 3 VMs" in text
    assert "DRS cannot evacuate a host for maintenance mode" in text and "Host maintenance" in text


def test_a_node_to_be_recloned_from_a_template_that_is_gone_is_named_with_the_fix(with_folder, lab_config, monkeypatch):
    """w01 was deleted outside Pulumi (refreshed out of the state) after a template rebuild: its
    clone source still keeps the old template, which vCenter no longer has. Instead of the
    provider's "virtual machine with UUID ... not found" half-way through the `up`, preflight says
    to replace the clone source, with the URN the engine uses."""
    from components.previous_state import PreviousState
    from components.rendering.node import instance_id

    sim = with_folder(hosts=3)
    lab = lab_on(sim, small_disks(lab_config))
    w01 = next(node for node in lab.all_nodes if node.name == "labs-k8s-w01")
    with vs.session(sim.host, sim.user, sim.password, port=sim.port, insecure=True) as si:
        dc = vs.find_datacenter(si, sim.datacenter)
        spec = vim.vm.ConfigSpec(
            name="labs-k8s-debian12-current",
            guestId="otherGuest64",
            numCPUs=1,
            memoryMB=64,
            files=vim.vm.FileInfo(vmPathName=f"[{sim.datastore}]"),
        )
        task = dc.vmFolder.CreateVM_Task(config=spec, pool=vs.find_cluster(si, dc, sim.cluster).resourcePool)
        current = vs.wait_for_task(task, "template").config.uuid
    gone = "4212d0c1-0000-0000-0000-00000000dead"
    others = {node.name: {"uuid": f"uuid-{node.name}"} for node in lab.all_nodes if node.name != w01.name}

    def state(template: str) -> PreviousState:
        source = {"template": template, "identity": instance_id(lab, w01)}
        return PreviousState(available=True, resources={**others, "labs-k8s-w01-clone-source": source})

    with pytest.raises(pulumi.RunError) as caught:
        run_preflight(inputs_for(sim, lab, monkeypatch), state(gone))
    message = str(caught.value)
    # The engine's URN carries every parent's type (the mock engine's only the nearest one), as
    # docs/runbook.md "Rebuilding the template" shows it.
    urn = (
        "urn:pulumi:labs::labs-k8s::labs-k8s:lab:Lab$labs-k8s:fleet:NodeFleet$pulumi-python:dynamic:Resource::"
        "labs-k8s-w01-clone-source"
    )
    # The runbook's command block names the user's stack and escapes `$` for the shell's "...".
    documented = urn.replace("urn:pulumi:labs::", "urn:pulumi:$STACK::").replace("$labs-k8s:fleet", "\\$labs-k8s:fleet")
    documented = documented.replace("$pulumi-python", "\\$pulumi-python")
    assert documented in (REPO_ROOT / "docs" / "runbook.md").read_text()
    assert (
        f"node labs-k8s-w01 has no VM in the stack's state (deleted outside Pulumi?) and would be cloned "
        f"again from template uuid {gone}" in message
    )
    assert f"pulumi up --replace '{urn}'" in message
    run_preflight(inputs_for(sim, lab, monkeypatch), state(current))  # its template exists: raises on any error


@pytest.mark.parametrize("preview", [False, True])
def test_the_rules_are_checked_once_the_up_has_made_them(with_folder, lab_config, monkeypatch, preview):
    """The program asks vCenter again after its rules' steps (an apply on their ids), so an `up`
    that places both balancers on one host says so at its end, not only on the next run. A
    preview does not (the ids are unknown there). The mock engine stands in for the rule's
    creation; vcsim holds the rule and the VMs' placement."""
    import pulumi_vsphere

    from components.preflight import check_rules_after_up
    from components.tools.offline import run_program

    sim = with_folder(hosts=3)
    with vs.session(sim.host, sim.user, sim.password, port=sim.port, insecure=True) as si:
        dc = vs.find_datacenter(si, sim.datacenter)
        cluster = vs.find_cluster(si, dc, sim.cluster)
        balancers = []
        for name in ("labs-k8s-lb01", "labs-k8s-lb02"):
            spec = vim.vm.ConfigSpec(
                name=name,
                guestId="otherGuest64",
                numCPUs=1,
                memoryMB=64,
                files=vim.vm.FileInfo(vmPathName=f"[{sim.datastore}]"),
            )
            task = dc.vmFolder.CreateVM_Task(config=spec, pool=cluster.resourcePool, host=cluster.host[1])
            balancers.append(vs.wait_for_task(task, name))
        rule = vim.cluster.AntiAffinityRuleSpec(
            name="labs-k8s-labs-balancers", enabled=True, mandatory=True, vm=balancers
        )
        change = vim.cluster.ConfigSpecEx(rulesSpec=[vim.cluster.RuleSpec(operation="add", info=rule)])
        vs.wait_for_task(cluster.ReconfigureComputeResource_Task(spec=change, modify=True), "rule")
        host_name = cluster.host[1].name
    inputs = inputs_for(sim, lab_on(sim, lab_config), monkeypatch)
    warnings: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **k: warnings.append(str(message)))

    def program() -> None:
        made = pulumi_vsphere.ComputeClusterVmAntiAffinityRule(
            "balancers-anti-affinity",
            name="labs-k8s-labs-balancers",
            compute_cluster_id="domain-c1",
            virtual_machine_ids=["vm-1", "vm-2"],
        )
        check_rules_after_up(inputs, [made.id])

    run_program("labs", program=program, preview=preview)
    after = [w for w in warnings if w.startswith("after up:")]
    if preview:
        assert after == []
    else:
        assert after == [
            f"after up: anti-affinity rule 'labs-k8s-labs-balancers' is violated: labs-k8s-lb01, "
            f"labs-k8s-lb02 on {host_name}. One host failure takes all of them. Let DRS fix it (fully "
            'automated), or vMotion one of them to another host (docs/runbook.md, "Host maintenance")'
        ]


def test_a_vsan_datastore_is_refused(with_folder, lab_config, monkeypatch):
    """vcsim (govmomi >= 0.52) makes a real vSAN datastore when vSAN is enabled on the cluster:
    type vsan, topLevelDirectoryCreateSupported false. Preflight refuses it, naming the key."""
    sim = with_folder(hosts=3)
    with vs.session(sim.host, sim.user, sim.password, port=sim.port, insecure=True) as si:
        cluster = vs.find_cluster(si, vs.find_datacenter(si, sim.datacenter), sim.cluster)
        change = vim.cluster.ConfigSpecEx(vsanConfig=vim.vsan.cluster.ConfigInfo(enabled=True))
        vs.wait_for_task(cluster.ReconfigureComputeResource_Task(spec=change, modify=True), "vsan")
    with pytest.raises(pulumi.RunError) as caught:
        run_preflight(inputs_for(sim, lab_on(sim, small_disks(lab_config), datastore="vsanDatastore"), monkeypatch))
    message = str(caught.value)
    assert "datastore 'vsanDatastore' is of type vsan, which labs-k8s does not support" in message
    assert "namespaces" in message and "labs-k8s:vsphere.datastore" in message


def test_partially_automated_drs_is_a_warning_naming_the_risk(with_folder, lab_config, monkeypatch):
    """vcsim (govmomi >= 0.52) applies a drsConfig change (0.24 ignored it); the other levels are
    in tests/test_vsphere_sites.py, as fakes."""
    sim = with_folder(hosts=3)
    with vs.session(sim.host, sim.user, sim.password, port=sim.port, insecure=True) as si:
        cluster = vs.find_cluster(si, vs.find_datacenter(si, sim.datacenter), sim.cluster)
        change = vim.cluster.ConfigSpecEx(
            drsConfig=vim.cluster.DrsConfigInfo(enabled=True, defaultVmBehavior="partiallyAutomated")
        )
        vs.wait_for_task(cluster.ReconfigureComputeResource_Task(spec=change, modify=True), "drs")
    warnings: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **k: warnings.append(str(message)))
    run_preflight(inputs_for(sim, lab_on(sim, small_disks(lab_config)), monkeypatch))  # warnings, not errors
    assert [
        w
        for w in warnings
        if "is partiallyAutomated: it places VMs at power-on but never migrates them" in w
        and "Set the automation level to fully automated" in w
    ]
