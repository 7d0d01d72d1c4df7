"""The lab in a box (issue #31): the whole `make up`, for real, on a host per clone.

One scenario per run (the `box` fixture, module scope), on the real CLI, language host and
plugins (tests/pulumi_engine.py): `make up LAYER=vsphere` clones the seven VMs in vcsim; each clone
the real vSphere provider powers on becomes a node host (tests/lab_box.py), whose cloud-init first
boot applies the user-data the provider set in the VM's guestinfo; a first `up` of the fleet's and
the balancers' steps is cut by a balancer's power-off; then `make up` runs the whole graph over the
real pulumi-command SSH, with the pinned host keys: HAProxy and Keepalived from Debian's signed
packages through the stack's apt proxy (tests/apt_mirror.py) holding the VIP, and every Kubernetes
step to verify-cluster, with the stand-in packages from the box's signed repositories
(tests/box_repo.py). Then the paths after the first `up`: no change, failover, key rotation, an
impostor, a worker added (its join dying half-way) and removed, a control plane replaced, an
upgrade, `make destroy`. Each test reads what the scenario kept for it.

Then the seeds' failure drills, as a user runs them. docs/testing.md, "The lab in a box", says what
is real and what is simulated.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import ipaddress
import itertools
import json
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.config import Role
from components.rendering import node as node_rendering
from components.rendering.node import DATA_DISKS
from components.template import CACHE_ROOT
from components.tools.offline import PROJECT
from components.tools.targets import layer_targets
from tests import kube_images, real_node
from tests.apt_mirror import record
from tests.box_kubectl import write_launcher
from tests.box_repo import STANDIN_DEPENDS, BoxRepo, upstream
from tests.box_repo import build as build_box_repo
from tests.firstboot import sealed_rootfs
from tests.lab_box import SSHD_LOG, SYSLOG, DataDiskImage, HostProfile, LabBox, NodeHost
from tests.labs import make_lab_config
from tests.machine_settings import changed, machine_sysctls
from tests.pulumi_engine import EngineLab, Result, readme_setup, start_lab, stop_lab
from tests.requirements import require_root, require_tool, unavailable
from tests.standin_iso import build_standin_netinst
from tests.test_real_engine import ISO_NAME, assert_no_clear_secret

# The whole scenario runs in the module fixture (about 15 minutes on 2 cores): more than the suite's
# 600 s per test.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(3600)]

CFG = make_lab_config()
NODES = [node.name for node in CFG.all_nodes]
BALANCERS = [node.name for node in CFG.balancers]
# What the balancer step installs (cloudinit/lb/setup-balancer.sh), recorded from Debian's archive.
BALANCER_PACKAGES = ("haproxy", "keepalived")
# What the Kubernetes steps install from Debian's archive (cloudinit/k8s/prepare-node.sh
# install_base_packages and configure_time), then what the stand-in packages of tests/box_repo.py
# depend on from it (STANDIN_DEPENDS; kubelet's iptables, mount and util-linux are above or in every
# node). For one the template already has, apt records only a newer version, if the archive has one.
NODE_PACKAGES = (
    "ca-certificates", "curl", "gnupg", "ethtool", "jq", "conntrack", "socat", "iptables", "iputils-arping",
    "systemd-timesyncd", *STANDIN_DEPENDS,
)  # fmt: skip
PREFIX = ipaddress.ip_network(CFG.network.cidr).prefixlen
# The box's stack installs the first of the two stand-in releases the repository serves, so the
# upgrade has a newer one to go to (tests/box_repo.py).
BOX_KUBERNETES_VERSION = "1.35.4"
UPGRADED_KUBERNETES_VERSION = "1.36.0"
MIRROR = f"{CFG.network.gateway}:3142"
_LAB = f"urn:pulumi:mysite::{PROJECT}::labs-k8s:lab:Lab"
# The worker the scenario adds, then removes: inside network.cidr, no other node's address.
EXTRA_WORKER = ("labs-k8s-w03", "10.3.60.57")
# The fleet's remote steps and the balancers, on top of the vSphere layer.
NODES_AND_BALANCERS = (
    f"{_LAB}$labs-k8s:fleet:NodeFleet$**",
    f"{_LAB}$labs-k8s:lb:LoadBalancerPair::balancers",
    f"{_LAB}$labs-k8s:lb:LoadBalancerPair$**",
)


@dataclass
class Box:
    lab: EngineLab
    hosts: LabBox
    rootfs: Path
    mirror_log: Path
    repo: BoxRepo
    stages: dict[str, Any] = field(default_factory=dict)


def targets() -> list[str]:
    return [*layer_targets("mysite", "vsphere"), *NODES_AND_BALANCERS]


def data_disks(workers: list[tuple[str, str]] | None) -> dict[str, DataDiskImage]:
    """Each control plane's and worker's second disk, as the stack configures it (the extra workers'
    as a worker's)."""
    disks = {}
    for node in CFG.all_nodes:
        if node.role in DATA_DISKS and node.data_disk_gib > 0:
            disk = DATA_DISKS[node.role]
            disks[node.name] = DataDiskImage(disk.mount_point, disk.label, node.data_disk_gib)
    worker = DATA_DISKS[Role.WORKER]
    for name, _ in [*(workers or []), EXTRA_WORKER]:
        disks[name] = DataDiskImage(worker.mount_point, worker.label, CFG.nodes.workers.data_disk_gib)
    return disks


def real_profiles(workers: list[tuple[str, str]] | None) -> dict[str, HostProfile]:
    """Each Kubernetes node's host profile on the real programs (tests/real_node.py `host_profile`)."""
    profiles = {node.name: real_node.host_profile(node.role) for node in CFG.kubernetes_nodes}
    for name, _ in [*(workers or []), EXTRA_WORKER]:
        profiles[name] = real_node.host_profile(Role.WORKER)
    return profiles


@contextlib.contextmanager
def open_box(
    root: Path,
    workers: list[tuple[str, str]] | None = None,
    progress: Callable[[str], None] | None = None,
    real: str | None = None,
) -> Iterator[Box]:
    """The box, with a stack made the README's way and the apt proxy set; `workers` (name, ip)
    replaces the example's workers (bench/lab_box.py's 10-worker lab); `progress` is told each
    phase as it starts (`make box` prints them); `real`: the Kubernetes minor whose real programs the
    nodes install (the box's registry mirror at the gateway serving their images), else the stand-ins."""
    from tests.vcsim import vcsim_binary

    say = progress or (lambda _: None)
    say("the sealed template rootfs (debootstrap; cached in ~/.cache/labs-k8s after the first run)")
    rootfs = sealed_rootfs(CFG)
    say("the package mirror (recorded from Debian's archive once, then cached)")
    node_packages = real_node.NODE_PACKAGES if real else NODE_PACKAGES
    snapshot = record(rootfs, (*BALANCER_PACKAGES, *node_packages), CACHE_ROOT / "box-mirror")
    if real:
        say("the real Kubernetes programs, their packages and images (built from source once, then cached)")
        repo = build_box_repo(CACHE_ROOT / "box-repo-real", real=True)
        registry_store = kube_images.build_store()
    else:
        say("the signed stand-in Kubernetes repositories")
        repo = build_box_repo(CACHE_ROOT / "box-repo")
    say("vcsim, the CLI's namespace and the stack")
    served = root / "iso"
    served.mkdir(parents=True)
    shutil.copy2(build_standin_netinst(root / "standin"), served / ISO_NAME)
    iso_sha = hashlib.sha256((served / ISO_NAME).read_bytes()).hexdigest()
    lab = start_lab(root / "lab", vcsim_binary(), served, watch_clones=True)
    assert lab.password_file is not None
    hosts = LabBox(
        root / "hosts", lab.netns, rootfs, f"{CFG.network.gateway}/{PREFIX}", data_disks(workers),
        systemd=bool(real), profiles=real_profiles(workers) if real else {},
        guest_addresses=lab.password_file.parent / "guest-addresses.json",
    )  # fmt: skip
    assert lab.box is not None and lab.box.stdout is not None
    hosts.follow(lab.box.stdout)
    mirror_log = lab.artifacts / "apt-mirror.log"
    lab.artifacts.mkdir(parents=True, exist_ok=True)
    mirror = subprocess.Popen(
        lab.in_lab(str(lab.workspace / ".venv/bin/python"), "-m", "tests.apt_mirror", "serve", str(snapshot), MIRROR,
                   "--log", str(mirror_log), "--repo", str(repo.root), trusted=False),
        cwd=lab.workspace, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    services = contextlib.ExitStack()
    try:
        assert mirror.stdout is not None
        assert mirror.stdout.readline().startswith("MIRROR"), "the apt mirror did not start"
        readme_setup(lab, iso_sha256=iso_sha, iso_name=ISO_NAME)
        stack = ["--stack", lab.stack]
        settings = {
            "mirrors.aptProxy": f"http://{MIRROR}",
            # The Kubernetes packages' repositories, on the mirror, signed by the box's own keys.
            "mirrors.kubernetesRepository.url": BoxRepo.kubernetes_url(MIRROR),
            "mirrors.kubernetesRepository.keyFingerprint": repo.kubernetes_fingerprint,
            "mirrors.containerdRepository.url": BoxRepo.containerd_url(MIRROR),
            "mirrors.containerdRepository.keyFingerprint": repo.containerd_fingerprint,
            "kubernetes.version": BOX_KUBERNETES_VERSION,
        }
        if real:
            # The site's registry mirror over TLS at the gateway, its CA pinned by the stack.
            gateway = str(CFG.network.gateway)
            ca, cert, key = kube_images.throwaway_tls(root, (gateway,))
            registry = services.enter_context(kube_images.serve(registry_store, cert, key, lab.netns, gateway))
            (containerd,) = repo.containerd_versions
            settings |= {
                "mirrors.registryMirror": f"https://{registry}",
                "mirrors.registryMirrorCa": ca.read_text(),
                "kubernetes.version": upstream(repo.kubernetes_versions[real]),
                "kubernetes.containerdVersion": upstream(containerd),
            }
        for key, value in settings.items():
            lab.pulumi("config", "set", *stack, "--path", f"labs-k8s:{key}", "--", value)
        if workers is not None:
            stack_file = lab.workspace / f"Pulumi.{lab.stack}.yaml"
            stack_settings = yaml.safe_load(stack_file.read_text())
            hosts_setting = [{"name": n, "ip": ip} for n, ip in workers]
            stack_settings["config"]["labs-k8s:nodes"]["workers"]["hosts"] = hosts_setting
            stack_file.write_text(yaml.safe_dump(stack_settings))
        yield Box(lab, hosts, rootfs, mirror_log, repo)
    finally:
        if os.environ.get("LABS_K8S_BOX_HOLD"):  # debugging: keep the box up to look inside
            (root / "HOLDING").write_text(str(os.getpid()))
            while (root / "HOLDING").exists():
                time.sleep(2)
        hosts.close()
        if hosts.logs.is_dir():
            shutil.copytree(hosts.logs, lab.artifacts / "hosts", dirs_exist_ok=True)
        services.close()
        mirror.kill()
        stop_lab(lab)


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    require_root()
    require_tool("ip", "make", "jq", "ssh-keygen", "ssh-keyscan", "nsenter", "unshare", "debootstrap")
    before = machine_sysctls()
    with open_box(tmp_path_factory.mktemp("box")) as box:
        run_scenario(box)
        box.stages["machine_settings_changed"] = changed(before, machine_sysctls())
        yield box


def run_scenario(box: Box) -> None:
    lab, hosts = box.lab, box.hosts
    box.stages["vsphere"] = lab.make("up", layer="vsphere", args="--yes", timeout=1200)
    if not box.stages["vsphere"].ok:
        return
    box.stages["boot_seconds"] = hosts.wait_booted(NODES, timeout=600)
    box.stages["cloud_init"] = {name: first_boot_facts(hosts.by_name(name)) for name in NODES}
    # What the CLI's namespace is presented at each node's address (what pulumi-command pins).
    box.stages["keyscan"] = {
        node.name: subprocess.run(
            lab.in_lab("ssh-keyscan", "-t", "ed25519", str(node.ip), trusted=False),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout
        for node in CFG.all_nodes
    }
    box.stages["known_hosts"] = lab.pulumi("stack", "output", "--stack", lab.stack, "sshKnownHosts").stdout
    # The first up of the steps, with lb02 powered off in vcsim while dpkg unpacks HAProxy there.
    box.stages["interrupted"] = interrupted_up(box, "labs-k8s-lb02")
    set_power(lab, "labs-k8s-lb02", on=True)
    hosts.wait_booted(["labs-k8s-lb02"], timeout=300)
    # The rest of the graph, as a user runs it: every Kubernetes step to verify-cluster, the seven
    # machines' steps at once (the vSphere half has nothing to change now, so vcsim's property
    # collector is not in the way: tests/pulumi_engine.py VCSIM_PARALLEL; the last --parallel wins).
    box.stages["cluster_up"] = lab.make("up", args="--yes --parallel 16", timeout=2400)
    if not box.stages["cluster_up"].ok:
        return
    box.stages["cpu_groups"] = {name: cpu_groups(hosts.by_name(name)) for name in NODES}
    box.stages["balancers"] = {name: balancer_facts(hosts.by_name(name)) for name in BALANCERS}
    box.stages["cluster"] = cluster_facts(box)
    box.stages["kubeconfig"] = kubeconfig_through_vip(box)
    box.stages["again"] = lab.engine("preview", expect_no_changes=True)
    box.stages["up_again"] = lab.make("up", args="--yes", timeout=1800)
    box.stages["failover"] = balancer_failover(box)
    box.stages["after_failover"] = lab.engine("preview", expect_no_changes=True)
    box.stages["drills"] = failure_drills(box)
    box.stages["rotation"] = ssh_key_rotation(box)
    box.stages["impostor"] = impostor_at(box, "labs-k8s-w01")
    box.stages["worker"] = add_and_remove_worker(box)
    box.stages["replace"] = replace_control_plane(box, "labs-k8s-m03")
    box.stages["upgrade"] = upgrade(box)
    box.stages["export"] = json.dumps(lab.stack_export())
    box.stages["store_before_destroy"] = cluster_store(hosts)
    box.stages["events_before_destroy"] = len(hosts.events)
    box.stages["destroy"] = lab.make("destroy", args="--yes", timeout=1800)
    if box.stages["destroy"].ok:
        deadline = time.monotonic() + 30
        while hosts.names() and time.monotonic() < deadline:
            time.sleep(0.5)
        # Under the hosts' lock: a removal in progress (tests/lab_box.py `_remove`) finishes first.
        box.stages["hosts_after_destroy"] = hosts.names()
        # The cluster as its members' disks last held it: with the last control plane's VM, the
        # box's store forgot it (tests/lab_box.py forget_cluster_without_members).
        box.stages["forgotten_clusters"] = list(hosts.forgotten_clusters)
        box.stages["store_after_destroy"] = cluster_store(hosts)
        box.stages["after_destroy"] = up_after_destroy(box)


def up_after_destroy(box: Box) -> dict[str, Any]:
    """The lab rebuilt after `make destroy`: one `make up` from an empty vCenter, the whole graph at
    once as a user types it (at make's parallelism, PULUMI_PARALLEL=64: the seven clones at once, their task
    waits on one property collector, tests/pulumi_engine.py VCSIM_PARALLEL), to verify-cluster on
    new VMs whose new disks hold a new cluster; then `make destroy` again (the same), which leaves nothing."""
    lab, hosts = box.lab, box.hosts
    facts: dict[str, Any] = {"up": lab.make("up", args="--yes", timeout=2400, cli_parallel=True)}
    if facts["up"].ok:
        facts["store"] = cluster_store(hosts)
        facts["cluster"] = cluster_facts(box)
    facts["destroy"] = lab.make("destroy", args="--yes", timeout=1800, cli_parallel=True)
    deadline = time.monotonic() + 30
    while hosts.names() and time.monotonic() < deadline:
        time.sleep(0.5)
    facts["hosts_after"] = hosts.names()
    return facts


def edit_store(hosts: LabBox, edit: Any) -> None:
    """`edit(state)` on the stand-ins' cluster store, under their own lock (a test's plan)."""
    store = hosts.store / "cluster.json"
    with open(hosts.store / "cluster.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = json.loads(store.read_text())
        edit(state)
        written = store.with_name(".cluster.json.plan")
        written.write_text(json.dumps(state))
        os.replace(written, store)


def plan_death(hosts: LabBox, node: str, workflow: str, phase: str) -> None:
    """The stand-in kubeadm on `node` dies after `phase` of its next `workflow` ("init", "join"):
    kube_standin.py `die_after`."""
    edit_store(hosts, lambda state: state.setdefault("die", {}).setdefault(node, {}).__setitem__(workflow, phase))


def block_evictions(hosts: LabBox, node: str, blocked: bool) -> None:
    """A PodDisruptionBudget that allows no disruption covers a pod on `node`, or no longer does:
    a drain there waits (kube_standin.py `wait_out_blocked_evictions`)."""

    def edit(state: dict[str, Any]) -> None:
        nodes = [n for n in state.get("pdb_blocks", []) if n != node]
        state["pdb_blocks"] = [*nodes, node] if blocked else nodes
        state.setdefault("evictions_refused", {}).pop(node, None)

    edit_store(hosts, edit)


def vip_holder_killed_mid_step(box: Box, up: Any, running: Any) -> dict[str, Any]:
    """`up()` in a thread; once `running()` says its step is at work on a control plane through the
    VIP, the VIP's holder is powered off in vcsim. The step's session ends with it (its TCP
    connection was to the VIP, which the other balancer now holds and knows nothing of): how long
    until `up` fails. The holder is then powered on again."""
    lab, hosts = box.lab, box.hosts
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.__setitem__("up", up()))
    thread.start()
    started = time.monotonic()
    while thread.is_alive() and time.monotonic() - started < 600:
        if running():
            holders = vip_holders(hosts)
            result["killed"] = holders
            if len(holders) == 1:
                set_power(lab, holders[0], on=False)
                result["killed_at"] = time.monotonic()
            break
        time.sleep(0.5)
    thread.join()
    if "killed_at" in result:
        result["failed_after_s"] = round(time.monotonic() - result["killed_at"], 1)
        set_power(lab, result["killed"][0], on=True)
        hosts.wait_booted(result["killed"], timeout=300)
        deadline = time.monotonic() + 60
        while not vip_answers(lab) and time.monotonic() < deadline:
            time.sleep(0.5)
    return result


def cluster_store(hosts: LabBox) -> dict[str, Any]:
    """The Kubernetes stand-ins' shared store (what etcd holds): the Nodes and the etcd members."""
    path = hosts.store / "cluster.json"
    return json.loads(path.read_text()) if path.exists() else {}


def cluster_facts(box: Box) -> dict[str, Any]:
    """What a control plane's kubectl and etcdctl say, and what each node installed from the box's
    repositories (apt's own view: version, hold, origin)."""
    first = box.hosts.by_name(CFG.control_planes[0].name)

    kube = ("env", "KUBECONFIG=/etc/kubernetes/admin.conf")
    facts: dict[str, Any] = {
        "nodes": ran(first, *kube, "kubectl", "get", "nodes", "-o", "json"),
        "pods": ran(first, *kube, "kubectl", "-n", "kube-system", "get", "pods", "-o", "json"),
        "packages": {},
    }
    for node in CFG.kubernetes_nodes:
        host = box.hosts.by_name(node.name)
        facts["packages"][node.name] = {
            "installed": ran(host, "dpkg-query", "-W", "-f", "${Package} ${Version}\\n",
                             "kubeadm", "kubelet", "kubectl", "containerd.io"),
            "held": ran(host, "apt-mark", "showhold"),
            "policy": ran(host, "apt-cache", "policy", "kubeadm"),
            "kubelet": ran(host, "systemctl", "is-active", "kubelet"),
        }  # fmt: skip
    return facts


def kubeconfig_through_vip(box: Box) -> dict[str, Any]:
    """The stack's `kubeconfig` output, used from the CLI's namespace with a real TLS client (curl):
    its server is the VIP, its CA pins the API server's certificate, its client certificate logs in."""
    lab = box.lab
    shown = lab.pulumi("stack", "output", "--stack", lab.stack, "--show-secrets", "kubeconfig").stdout
    config = yaml.safe_load(shown)
    cluster = config["clusters"][0]["cluster"]
    user = config["users"][0]["user"]
    material = lab.root / "kubeconfig-material"
    material.mkdir(mode=0o700, exist_ok=True)
    for name, data in (
        ("ca.crt", cluster["certificate-authority-data"]),
        ("client.crt", user["client-certificate-data"]),
        ("client.key", user["client-key-data"]),
    ):
        (material / name).write_bytes(base64.b64decode(data))  # fmt: skip

    def curl(*extra: str) -> subprocess.CompletedProcess[str]:
        argv = ["curl", "-sS", "--max-time", "10", "--cacert", str(material / "ca.crt"), *extra,
                f"{cluster['server']}/api"]  # fmt: skip
        return subprocess.run(lab.in_lab(*argv, trusted=False), capture_output=True, text=True, check=False)

    facts = {
        "server": cluster["server"],
        "with_client_cert": curl("--cert", str(material / "client.crt"), "--key", str(material / "client.key")),
        "anonymous": curl(),
    }
    shutil.rmtree(material)
    return facts


def interrupted_up(box: Box, name: str) -> dict[str, Any]:
    """`up` of the steps while `name` is powered off in the middle of dpkg's work there (the balancer
    step's package install): the step must fail, and within its bound, not hang."""
    lab, hosts = box.lab, box.hosts
    result: dict[str, Any] = {}

    def run() -> None:
        result["up"] = lab.engine("up", *targets(), timeout=1800)

    thread = threading.Thread(target=run)
    thread.start()
    while thread.is_alive() and "killed_at" not in result:
        host = next((h for h in hosts.snapshot() if h.name == name and h.running()), None)
        # dpkg's journal (/var/lib/dpkg/updates) holds entries while a package is half unpacked or
        # configured: power off then, and dpkg is left "interrupted" (apt-pkg's pkgSystem checks it).
        journal = host.upper / "var/lib/dpkg/updates" if host is not None else None
        if journal is not None and journal.is_dir() and any(journal.iterdir()):
            set_power(lab, name, on=False)
            result["killed_at"] = time.monotonic()
        time.sleep(0.2)
    thread.join()
    if "killed_at" in result:
        result["failed_after_s"] = round(time.monotonic() - result["killed_at"], 1)
    return result


def ssh_key_rotation(box: Box) -> dict[str, Any]:
    """docs/runbook.md "Rotating the SSH key", both `up`s, on the hosts: no VM reboots, each node
    trusts both keys after the first, only the new one after the second; the old key is refused."""
    lab, hosts = box.lab, box.hosts
    stack = ["--stack", lab.stack]
    old_key = lab.root / "home/.ssh/labs-k8s"
    new_key = lab.root / "home/.ssh/labs-k8s-next"
    keygen = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "labs-k8s-next", "-f", str(new_key)]
    subprocess.run(keygen, check=True)
    new_public = new_key.with_suffix(".pub").read_text().strip()
    old_public = old_key.with_suffix(".pub").read_text().strip()
    events_before = len(hosts.events)
    facts: dict[str, Any] = {}
    lab.pulumi("config", "set", *stack, "--path", "labs-k8s:ssh.extraPublicKeys[0]", new_public)
    facts["first"] = lab.engine("up", timeout=1800)
    facts["trusted_after_first"] = {n: authorized(hosts.by_name(n)) for n in NODES}
    lab.pulumi("config", "set", *stack, "--path", "labs-k8s:ssh.publicKey", new_public)
    lab.pulumi("config", "set", *stack, "--secret", "labs-k8s:sshPrivateKey", stdin=new_key.read_text())
    lab.pulumi("config", "rm", *stack, "--path", "labs-k8s:ssh.extraPublicKeys")
    facts["second"] = lab.engine("up", timeout=1800)
    facts["trusted_after_second"] = {n: authorized(hosts.by_name(n)) for n in NODES}
    facts["power_changes"] = [e for e in hosts.events[events_before:]]
    facts["again"] = lab.engine("preview", expect_no_changes=True)
    facts["old_key_login"] = ssh_login(lab, old_key, CFG.all_nodes[0].ip)
    facts["new_key_login"] = ssh_login(lab, new_key, CFG.all_nodes[0].ip)
    facts["keys"] = (old_public.split()[1], new_public.split()[1])
    return facts


def authorized(host: NodeHost) -> str:
    return host.run("cat", f"/home/{CFG.ssh.user}/.ssh/authorized_keys").stdout


def ssh_login(lab: EngineLab, key: Path, ip: object) -> subprocess.CompletedProcess[str]:
    """`ssh -i key user@ip true` from the CLI's namespace, the host key checked against the stack's."""
    known = lab.root / "known_hosts"
    known.write_text(lab.pulumi("stack", "output", "--stack", lab.stack, "sshKnownHosts").stdout)
    return subprocess.run(
        lab.in_lab("ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                   "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes",
                   f"{CFG.ssh.user}@{ip}", "sudo", "-n", "true", trusted=False),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def impostor_at(box: Box, name: str) -> dict[str, Any]:
    """Another machine answers at `name`'s address (the VM is running but unreachable, and a host
    booted from the template with its own host keys took its address): a step on `name` is refused
    at the key exchange, before any secret or command leaves; with the VM back, `up` converges."""
    lab, hosts = box.lab, box.hosts
    real = hosts.by_name(name)
    node = next(n for n in CFG.all_nodes if n.name == name)
    # Its own user-data, rendered offline without the stack's host keys: cloud-init makes new ones.
    impostor_guestinfo = node_rendering.guestinfo_extra_config(CFG, node)
    hosts.halt_outside_vcenter(real)
    impostor = hosts.start_outside_vcenter(f"{name}-impostor", real.mac, impostor_guestinfo)
    facts: dict[str, Any] = {}
    try:
        hosts.wait_booted([impostor.name], timeout=300)
        urn = f"{_LAB}$labs-k8s:fleet:NodeFleet$command:remote:Command::{name}-node-settings"
        facts["refused"] = lab.engine("up", extra=("--replace", urn), timeout=900)
        facts["impostor_sshd_log"] = (impostor.upper / SSHD_LOG).read_text(errors="replace")
    finally:
        hosts.halt_outside_vcenter(impostor)
        hosts.forget(impostor)
        hosts.boot_outside_vcenter(real)
    hosts.wait_booted([name], timeout=300)
    facts["converged"] = lab.engine("up", timeout=900)
    return facts


def add_and_remove_worker(box: Box) -> dict[str, Any]:
    """A worker added to `labs-k8s:nodes.workers.hosts`: its clone gets a host of its own, which
    boots and takes its steps; removed again: its VM goes, and with it the host and its disk."""
    lab, hosts = box.lab, box.hosts
    stack_file = lab.workspace / f"Pulumi.{lab.stack}.yaml"
    before = stack_file.read_text()
    settings = yaml.safe_load(before)
    name, ip = EXTRA_WORKER
    settings["config"]["labs-k8s:nodes"]["workers"]["hosts"].append({"name": name, "ip": ip})
    stack_file.write_text(yaml.safe_dump(settings))
    # Its first join dies inside kubelet-start (the kubelet stopped, its files written): that `up`
    # fails on the join, and the next one converges.
    plan_death(hosts, name, "join", "kubelet-start/written")
    facts: dict[str, Any] = {"join_died": lab.engine("up", timeout=1800)}
    facts["added"] = lab.engine("up", timeout=1800)
    if facts["added"].ok:
        hosts.wait_booted([name], timeout=300)
        facts["added_host"] = first_boot_facts(hosts.by_name(name))
    facts["store_after_add"] = cluster_store(hosts)
    stack_file.write_text(before)
    # Removed while a PodDisruptionBudget holds its drain (the leave guard's delete, through the
    # VIP, waits on it): the VIP's holder dies meanwhile, and that `up` fails with the session. The
    # budget lifted, the next `up` runs the delete again and converges.
    block_evictions(hosts, name, blocked=True)
    facts["vip_killed"] = vip_holder_killed_mid_step(
        box, lambda: lab.engine("up", timeout=1800), lambda: name in cluster_store(hosts).get("evictions_refused", {})
    )
    block_evictions(hosts, name, blocked=False)
    facts["removed"] = lab.engine("up", timeout=1800)
    facts["store_after_remove"] = cluster_store(hosts)
    deadline = time.monotonic() + 30
    while name in hosts.names() and time.monotonic() < deadline:
        time.sleep(0.5)
    facts["hosts_after"] = hosts.names()
    facts["again"] = lab.engine("preview", expect_no_changes=True)
    return facts


def replace_control_plane(box: Box, name: str) -> dict[str, Any]:
    """docs/runbook.md "Replacing a node": `up --replace` of its clone source. Its leave guard goes
    first (its etcd member removed, its Node deleted), then a new VM, so a new host with a new disk,
    which is prepared and joins as a control plane; a no-change preview after."""
    lab, hosts = box.lab, box.hosts
    before = {h.vm for h in hosts.snapshot() if h.name == name}
    member_before = [m["id"] for m in cluster_store(hosts).get("members", []) if m.get("name") == name]
    source = f"{_LAB}$labs-k8s:fleet:NodeFleet$pulumi-python:dynamic:Resource::{name}-clone-source"
    facts: dict[str, Any] = {"up": lab.make("up", args=f"--yes --replace {source}", timeout=2400)}
    facts["new_host"] = sorted({h.vm for h in hosts.snapshot() if h.name == name} - before)
    store = cluster_store(hosts)
    facts["members"] = [(m["id"], m.get("name"), m.get("learner")) for m in store.get("members", [])]
    facts["member_before"] = member_before
    facts["cluster"] = cluster_facts(box)
    facts["again"] = lab.engine("preview", expect_no_changes=True)
    return facts


def upgrade(box: Box) -> dict[str, Any]:
    """docs/runbook.md "Upgrading Kubernetes": kubernetes.version to the next minor the repository
    serves and containerdVersion to the newer containerd.io, one `make up`: the control planes one
    at a time, then each worker drained, upgraded and uncordoned; then a no-change preview."""
    lab = box.lab
    stack = ["--stack", lab.stack]
    containerd = box.repo.containerd_versions[-1].split("-")[0]
    lab.pulumi("config", "set", *stack, "--path", "labs-k8s:kubernetes.version", UPGRADED_KUBERNETES_VERSION)
    lab.pulumi("config", "set", *stack, "--path", "labs-k8s:kubernetes.containerdVersion", containerd)
    facts: dict[str, Any] = {"up": lab.make("up", args="--yes", timeout=3600), "containerd": containerd}
    # When each upgrade step ran: its create (or create-replacement) from the engine's pre event to
    # its outputs event. A replaced step's other events (the replace itself, the old one's delete
    # at the end of the update) are not its run.
    spans: dict[str, list[float]] = {}
    for event in facts["up"].event_log():
        for kind in ("resourcePreEvent", "resOutputsEvent"):
            metadata = event.get(kind, {}).get("metadata", {})
            urn = str(metadata.get("urn", ""))
            if "-upgrade" in urn and metadata.get("op") in ("create", "create-replacement", "update"):
                spans.setdefault(urn.rsplit("::", 1)[1], []).append(float(event["timestamp"]))
    facts["spans"] = spans
    facts["cluster"] = cluster_facts(box)
    facts["store"] = cluster_store(box.hosts)
    facts["again"] = lab.engine("preview", expect_no_changes=True)
    return facts


def set_power(lab: EngineLab, name: str, on: bool) -> None:
    """Power a VM on or off in vcsim, as the failure drills do (a hard power-off, no guest shutdown)."""
    assert lab.password_file is not None
    host, port = lab.vcsim.split(":")
    script = f"""
from components import vsphere as vs
si = vs.connect({host!r}, "labs", open({str(lab.password_file)!r}).read().strip(), port={port}, insecure=True)
vm = vs.get_vm(si, {name!r})
(vs.power_on if {on!r} else vs.power_off)(vm)
"""
    done = lab.run(f"power-{'on' if on else 'off'}-{name}", "python", "-c", script, trusted=False)
    assert done.ok, done.output


def vip_answers(lab: EngineLab) -> bool:
    """A TCP connection to VIP:6443 from the CLI's namespace is accepted (HAProxy's frontend)."""
    probe = f"exec 3<>/dev/tcp/{CFG.load_balancer.vip}/6443"
    probed = subprocess.run(lab.in_lab("timeout", "2", "bash", "-c", probe, trusted=False), capture_output=True)
    return probed.returncode == 0


def vip_holders(hosts: LabBox) -> list[str]:
    held = []
    for name in BALANCERS:
        host = hosts.by_name(name)
        if host.running() and f" {CFG.load_balancer.vip}/" in host.run("ip", "-4", "-o", "addr").stdout:
            held.append(name)
    return held


def balancer_failover(box: Box) -> dict[str, Any]:
    """The VIP's holder powered off in vcsim: how long until the VIP answers again, from the other
    balancer; then powered on again: it boots from its own disk, HAProxy and Keepalived start as
    enabled units, and one balancer holds the VIP."""
    lab, hosts = box.lab, box.hosts
    before = vip_holders(hosts)
    facts: dict[str, Any] = {"before": before, "answered_before": vip_answers(lab)}
    if len(before) != 1:
        return facts
    set_power(lab, before[0], on=False)
    off = time.monotonic()
    while time.monotonic() - off < 60:
        if not hosts.by_name(before[0]).running() and vip_answers(lab):
            break
        time.sleep(0.2)
    facts["answered_after_s"] = round(time.monotonic() - off, 1)
    facts["during"] = vip_holders(hosts)
    # What Keepalived itself said on the balancer that took over (its syslog: tests/tools/box/syslogd.py).
    taker = next(iter(facts["during"]), None)
    log = hosts.by_name(taker).upper / SYSLOG if taker else None
    facts["taker_log"] = [
        line for line in (log.read_text(errors="replace").splitlines() if log and log.exists() else [])
        if "Keepalived_vrrp" in line
    ]  # fmt: skip
    set_power(lab, before[0], on=True)
    facts["reboot_s"] = round(hosts.wait_booted([before[0]], timeout=300), 1)
    time.sleep(5)  # Keepalived's adverts settle (advert_int 1 s)
    facts["after"] = vip_holders(hosts)
    facts["answered_after_reboot"] = vip_answers(lab)
    facts["services_after_reboot"] = balancer_facts(hosts.by_name(before[0]))
    return facts


DRILLS = ("control-plane", "balancer", "worker", "drain")


def failure_drills(box: Box) -> dict[str, Any]:
    """The seeds' failure drills as a user runs them (docs/drills.md): `python -m components drill
    <scenario> --stack S` on the CLI's machine, with kubectl there (the box's stand-in:
    tests/box_kubectl.py). Each powers a VM off in vcsim and on again, and measures the cluster
    through the VIP; then a no-change preview: the drills left the lab as they found it."""
    lab, hosts = box.lab, box.hosts
    kubectl = write_launcher(lab.root / "kubectl", hosts.store)
    facts: dict[str, Any] = {}
    for scenario in DRILLS:
        facts[scenario] = lab.run(
            f"drill-{scenario}", "python", "-m", "components", "drill", scenario, "--stack", lab.stack,
            "--kubectl", str(kubectl), timeout=900,
        )  # fmt: skip
        hosts.wait_booted(NODES, timeout=300)
    facts["after"] = lab.engine("preview", expect_no_changes=True)
    return facts


def first_boot_facts(host: NodeHost) -> dict[str, str]:
    def out(*argv: str) -> str:
        result = host.run(*argv)
        return (result.stdout + result.stderr).strip()

    return {
        "hostname": out("hostname"),
        "address": out("ip", "-4", "-o", "addr", "show", "dev", CFG.network.interface),
        "status": out("cloud-init", "status", "--long"),
        "authorized_keys": out("cat", f"/home/{CFG.ssh.user}/.ssh/authorized_keys"),
        "sudo": out("sudo", "-l", "-U", CFG.ssh.user),
        "apt_proxy": out("apt-config", "dump", "Acquire::http::Proxy"),
    }


def ran(host: NodeHost, *argv: str, timeout: float = 120) -> str:
    """`argv` on the host, as "[exit code] output" (what the tests read facts from)."""
    result = host.run(*argv, timeout=timeout)
    return f"[{result.returncode}] {(result.stdout + result.stderr).strip()}"


def cpu_groups(host: NodeHost) -> list[str]:
    """The CPU cgroup of each process in the host's network namespace (its daemons, and what its
    steps started through SSH sessions): /proc/PID/cgroup's line for the cpu controller (v1) or
    the unified one (v2)."""
    pids = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True, check=True)
    groups = []
    for pid in pids.stdout.split():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            lines = [line.split(":", 2) for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()]
            cpu = [path for _, controllers, path in lines if "cpu" in controllers.split(",")]
            groups.append((cpu or [path for number, _, path in lines if number == "0"])[0])
    return groups


def balancer_facts(host: NodeHost) -> dict[str, str]:
    return {
        "haproxy": ran(host, "/etc/init.d/haproxy", "status"),
        "keepalived": ran(host, "pidof", "keepalived"),  # its init script has no status action
        "vip": ran(host, "ip", "-4", "-o", "addr", "show", "dev", CFG.network.interface),
        "packages": ran(host, "dpkg-query", "-W", "-f", "${Package} ${Version} ${Status}\\n", "haproxy", "keepalived"),
    }


def assert_ok(box: Box, stage: str) -> Result:
    result = box.stages.get(stage)
    stopped = f"the scenario stopped before {stage}: {sorted(box.stages)}\n{box.lab.transcript()}"
    assert isinstance(result, Result), stopped
    assert result.ok, f"{stage} failed:\n{box.lab.transcript()}"
    return result


def test_the_real_provider_powers_on_seven_clones_and_each_becomes_a_host(box: Box) -> None:
    """Each clone vcsim reports powered on (with our user-data in its guestinfo) got one host, which
    booted: the first power-on of each of the seven, before any other power change."""
    assert_ok(box, "vsphere")
    first = [e["name"] for e in box.hosts.events if e["state"] == "poweredOn"][: len(NODES)]
    assert sorted(first) == sorted(NODES), box.hosts.events
    assert box.stages["boot_seconds"] < 600


def test_cloud_init_applies_the_user_data_the_provider_set_in_guestinfo(box: Box) -> None:
    """Hostname, static address on the NIC cloud-init renamed by its MAC, the operator's key, sudo,
    the apt proxy and the host keys the stack pins: cloud-init's own first boot on each host."""
    assert_ok(box, "vsphere")
    facts = box.stages["cloud_init"]
    public_key = (box.lab.root / "home/.ssh/labs-k8s.pub").read_text().split()[1]
    known_hosts = box.stages["known_hosts"]
    for node in CFG.all_nodes:
        seen = facts[node.name]
        assert seen["hostname"] == node.name, seen
        assert f"inet {node.ip}/{PREFIX}" in seen["address"], seen
        assert "status: done" in seen["status"], seen["status"]
        assert public_key in seen["authorized_keys"], seen
        assert "NOPASSWD: ALL" in seen["sudo"], seen
        assert f"http://{MIRROR}" in seen["apt_proxy"], seen
        presented = box.stages["keyscan"][node.name].split()
        assert presented[:2] == [str(node.ip), "ssh-ed25519"], presented
        assert f"{node.ip} ssh-ed25519 {presented[2]}" in known_hosts, (node.name, known_hosts)


def test_a_balancer_powered_off_while_its_step_installs_fails_the_step_in_bounds_then_converges(box: Box) -> None:
    """lb02 powered off in vcsim while dpkg unpacks HAProxy there: `up` fails, naming the step,
    within the step's dial bound (not its 15-minute timeout); powered on again, lb02 boots from its
    half-installed disk and the next `up` converges (the balancer step runs again)."""
    facts = box.stages.get("interrupted")
    assert facts and "killed_at" in facts, f"dpkg's journal never filled on lb02: {facts}"
    up = facts["up"]
    assert not up.ok, up.output[-3000:]
    assert "labs-k8s-lb02-lb-setup" in up.output, up.output[-3000:]
    assert facts["failed_after_s"] < 300, facts["failed_after_s"]
    assert_ok(box, "cluster_up")


def test_the_fleet_and_balancer_steps_run_over_real_ssh_on_the_hosts(box: Box) -> None:
    up = assert_ok(box, "cluster_up")
    assert up.summary().get("create", 0) >= 1, up.summary()  # the rest was made by the interrupted up
    for name, seen in box.stages["balancers"].items():
        assert seen["haproxy"].startswith("[0]") and seen["keepalived"].startswith("[0]"), (name, seen)
        assert "install ok installed" in seen["packages"], (name, seen)
    holders = [n for n, seen in box.stages["balancers"].items() if f"inet {CFG.load_balancer.vip}/" in seen["vip"]]
    assert len(holders) == 1, box.stages["balancers"]
    fetched = box.mirror_log.read_text()
    assert re.search(r" 200 http://deb\.debian\.org/debian(-security)?/pool/\S+/haproxy_", fetched), fetched[-2000:]


def test_the_whole_make_up_builds_the_cluster_on_the_hosts_through_the_vip(box: Box) -> None:
    """`make up` from the vSphere half to verify-cluster: every node installed the pinned stand-in
    packages from the box's signed repositories through the apt proxy and holds them; kubeadm init,
    the joins and Flannel went through the VIP; every Node is Ready at the pinned version and every
    control plane runs its static pods."""
    assert_ok(box, "cluster_up")
    facts = box.stages["cluster"]
    assert facts["nodes"].startswith("[0]"), facts["nodes"]
    nodes = {n["metadata"]["name"]: n for n in json.loads(facts["nodes"][4:])["items"]}
    assert sorted(nodes) == sorted(n.name for n in CFG.kubernetes_nodes), sorted(nodes)
    for name, node in nodes.items():
        ready = [c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready == ["True"], (name, node["status"])
        assert node["status"]["nodeInfo"]["kubeletVersion"] == f"v{BOX_KUBERNETES_VERSION}", (name, node["status"])
    pods = {p["metadata"]["name"]: p["status"]["phase"] for p in json.loads(facts["pods"][4:])["items"]}
    for node in CFG.control_planes:
        for component in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"):
            assert pods.get(f"{component}-{node.name}") == "Running", (component, node.name, pods)
    kubernetes_deb = box.repo.kubernetes_versions[BOX_KUBERNETES_VERSION.rsplit(".", 1)[0]]
    for name, seen in facts["packages"].items():
        assert f"kubeadm {kubernetes_deb}" in seen["installed"], (name, seen)
        assert f"kubelet {kubernetes_deb}" in seen["installed"], (name, seen)
        assert f"containerd.io {box.repo.containerd_versions[0]}" in seen["installed"], (name, seen)
        for package in ("kubeadm", "kubelet", "kubectl", "containerd.io"):
            assert package in seen["held"].split(), (name, seen["held"])
        assert f"http://{MIRROR}/pkgs.k8s.io/core:/stable:/v" in seen["policy"], (name, seen["policy"])
        assert seen["kubelet"] == "[0] active", (name, seen)
    fetched = box.mirror_log.read_text()
    assert re.search(r" 200 \S*/pkgs\.k8s\.io/core:/stable:/v1\.35/deb/InRelease", fetched), fetched[-2000:]
    assert re.search(r" 200 \S*/download\.docker\.com/linux/debian/dists/\S+/containerd\.io_", fetched), fetched[-2000:]


def test_every_process_of_every_host_runs_in_the_hosts_cpu_group(box: Box) -> None:
    """The hosts are the VMs: each host's processes, its SSH sessions' included (each a session,
    so an autogroup, of its own), run in the one cgroup of the hosts (tests/lab_box.py
    hosts_cpu_group), so that the hosts together do not starve the CLI of CPU."""
    assert_ok(box, "cluster_up")
    if box.hosts.cpu_group is None:
        unavailable("no writable cgroup with a CPU controller here: the hosts share CPU as other processes do")
    group = "/" + box.hosts.cpu_group.name
    groups = box.stages["cpu_groups"]
    assert set(groups) == set(NODES)
    for name, paths in groups.items():
        assert len(paths) >= 3 and set(paths) == {group}, (name, paths)


def test_the_kubeconfig_output_works_through_the_vip(box: Box) -> None:
    """From the CLI's namespace: the output's server is the VIP, its CA verifies the API server
    behind HAProxy, its client certificate is accepted; without it the API refuses."""
    assert_ok(box, "cluster_up")
    facts = box.stages["kubeconfig"]
    assert facts["server"] == f"https://{CFG.load_balancer.vip}:6443", facts["server"]
    authenticated = facts["with_client_cert"]
    assert authenticated.returncode == 0 and '"APIVersions"' in authenticated.stdout, authenticated
    assert '"Unauthorized"' in facts["anonymous"].stdout, facts["anonymous"]


def test_a_second_make_up_changes_nothing(box: Box) -> None:
    """`pulumi preview --expect-no-changes` first, then `make up`: no resource changes."""
    assert_ok(box, "again")
    again = assert_ok(box, "up_again")
    assert again.summary() == {}, again.summary()


def test_the_documented_ssh_key_rotation_on_the_hosts(box: Box) -> None:
    facts = box.stages.get("rotation")
    assert facts, f"the scenario stopped before the rotation: {sorted(box.stages)}"
    old, new = facts["keys"]
    for stage in ("first", "second", "again"):
        assert facts[stage].ok, f"rotation {stage}:\n{facts[stage].output[-3000:]}"
    assert all(old in keys and new in keys for keys in facts["trusted_after_first"].values()), facts
    assert all(old not in keys and new in keys for keys in facts["trusted_after_second"].values()), facts
    assert facts["power_changes"] == [], "a VM was powered off or on during the rotation"
    assert facts["new_key_login"].returncode == 0, facts["new_key_login"].stderr
    assert facts["old_key_login"].returncode != 0 and "Permission denied" in facts["old_key_login"].stderr


def test_a_host_at_a_nodes_address_without_its_key_is_refused_before_anything_leaves(box: Box) -> None:
    facts = box.stages.get("impostor")
    assert facts, f"the scenario stopped before the impostor: {sorted(box.stages)}"
    refused = facts["refused"]
    assert not refused.ok and "ssh: host key mismatch" in refused.output, refused.output[-3000:]
    # The provider's dials reached the impostor's sshd and ended before user authentication.
    log = facts["impostor_sshd_log"]
    preauth = r"Connection (closed|reset) by (authenticating user \S+ )?10\.3\.60\.1 port \d+ \[preauth\]"
    assert re.search(preauth, log), log
    assert "Accepted publickey" not in log and "session opened" not in log, log
    assert facts["converged"].ok, facts["converged"].output[-3000:]


def test_a_worker_added_gets_a_host_and_its_steps_and_removed_takes_its_host_with_it(box: Box) -> None:
    facts = box.stages.get("worker")
    assert facts, f"the scenario stopped before the worker change: {sorted(box.stages)}"
    name, ip = EXTRA_WORKER
    died = facts["join_died"]
    assert not died.ok and f"{name}-kubeadm-join" in died.output, died.output[-3000:]
    assert facts["added"].ok, facts["added"].output[-3000:]
    created = died.summary().get("create", 0) + facts["added"].summary().get("create", 0)
    assert created >= 4, (died.summary(), facts["added"].summary())  # its VM, clone source, host key seed, steps
    assert facts["added_host"]["hostname"] == name and f"inet {ip}/{PREFIX}" in facts["added_host"]["address"]
    # The VIP's holder powered off while the leave guard's delete waited on a drain through it: that
    # `up` failed on the delete, within the TCP keep-alive of the provider's SSH dial (Go's
    # net.Dialer: a 15 s idle probe, which the new holder answers with a reset), not the step's
    # 15-minute timeout; the VM stayed for the next `up`.
    killed = facts["vip_killed"]
    assert "killed_at" in killed, f"the drain never waited, or no single VIP holder: {killed}"
    assert not killed["up"].ok and f"{name}-leave-cluster" in killed["up"].output, killed["up"].output[-3000:]
    assert killed["failed_after_s"] < 90, killed["failed_after_s"]
    assert facts["removed"].ok, facts["removed"].output[-3000:]
    assert facts["removed"].summary().get("delete", 0) >= 3, facts["removed"].summary()
    assert facts["hosts_after"] == sorted(NODES), facts["hosts_after"]
    # It joined the cluster; removed, its leave guard drained it and deleted its Node.
    assert name in facts["store_after_add"].get("nodes", {}), sorted(facts["store_after_add"].get("nodes", {}))
    assert name not in facts["store_after_remove"].get("nodes", {}), sorted(facts["store_after_remove"]["nodes"])
    assert facts["again"].ok, facts["again"].output[-3000:]


def test_a_control_plane_replaced_leaves_etcd_and_its_new_vm_joins(box: Box) -> None:
    facts = box.stages.get("replace")
    assert facts, f"the scenario stopped before the replacement: {sorted(box.stages)}"
    assert facts["up"].ok, facts["up"].output[-3000:]
    assert len(facts["new_host"]) == 1, "the replaced VM did not get a new host"
    members = facts["members"]
    assert len(members) == len(CFG.control_planes) and all(learner is False for _, _, learner in members), members
    assert facts["member_before"] and facts["member_before"][0] not in [m[0] for m in members], members
    assert "labs-k8s-m03" in [name for _, name, _ in members], members
    nodes = json.loads(facts["cluster"]["nodes"][4:])["items"]
    # A condition carries its reason, message and times too (kube_standin.node_view, as the API returns it).
    ready = {
        n["metadata"]["name"]
        for n in nodes
        if [c["status"] for c in n["status"]["conditions"] if c["type"] == "Ready"] == ["True"]
    }
    assert ready == {n.name for n in CFG.kubernetes_nodes}, ready
    assert facts["again"].ok, facts["again"].output[-3000:]


def test_an_upgrade_goes_one_control_plane_at_a_time_then_drains_each_worker(box: Box) -> None:
    facts = box.stages.get("upgrade")
    assert facts, f"the scenario stopped before the upgrade: {sorted(box.stages)}"
    assert facts["up"].ok, facts["up"].output[-3000:]
    nodes = json.loads(facts["cluster"]["nodes"][4:])["items"]
    versions = {n["metadata"]["name"]: n["status"]["nodeInfo"]["kubeletVersion"] for n in nodes}
    assert set(versions.values()) == {f"v{UPGRADED_KUBERNETES_VERSION}"}, versions
    for name, seen in facts["cluster"]["packages"].items():
        assert f"containerd.io {facts['containerd']}-" in seen["installed"], (name, seen)
        assert f"kubeadm {UPGRADED_KUBERNETES_VERSION}-" in seen["installed"], (name, seen)
    spans = {name: (min(times), max(times)) for name, times in facts["spans"].items()}
    planes = [spans[f"{n.name}-upgrade"] for n in CFG.control_planes]
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(planes)), planes  # one at a time
    for worker in CFG.workers:
        drain, upgraded, uncordon = (spans[f"{worker.name}-upgrade{s}"] for s in ("-drain", "", "-uncordon"))
        assert planes[-1][1] <= drain[0] and drain[1] <= upgraded[0] and upgraded[1] <= uncordon[0], spans
    assert not [n for n, node in facts["store"]["nodes"].items() if node.get("unschedulable")], facts["store"]
    assert facts["again"].ok, facts["again"].output[-3000:]


def test_no_secret_in_clear_in_the_state_or_any_output(box: Box) -> None:
    assert_ok(box, "cluster_up")
    assert_no_clear_secret(box.lab, box.stages["export"], "`pulumi stack export`")
    for result in box.lab.results:
        assert_no_clear_secret(box.lab, result.output, result.log.name)


def test_the_vip_moves_when_its_balancer_is_powered_off_and_one_holds_it_after_power_on(box: Box) -> None:
    facts = box.stages.get("failover")
    assert facts, f"the scenario stopped before the failover: {sorted(box.stages)}"
    assert len(facts["before"]) == 1 and facts["answered_before"], facts
    assert facts["answered_after_s"] < 15, facts
    assert facts["during"] and facts["during"] != facts["before"], facts
    assert any(") Entering MASTER STATE" in line for line in facts["taker_log"][-20:]), facts["taker_log"]
    assert len(facts["after"]) == 1 and facts["answered_after_reboot"], facts
    services = facts["services_after_reboot"]
    assert services["haproxy"].startswith("[0]") and services["keepalived"].startswith("[0]"), facts
    assert_ok(box, "after_failover")


@pytest.mark.parametrize("scenario", DRILLS)
def test_the_seeds_failure_drills_pass_against_the_box(box: Box, scenario: str) -> None:
    """docs/drills.md on the box: the control plane (an etcd follower) powered off, the API stays up
    through the VIP and etcd keeps quorum, the member rejoins; the VIP's holder powered off, the
    other balancer reports the VIP (Tools' guest address in vcsim) and the API answers; a worker
    powered off, its pods run again on the other worker; a worker drained and uncordoned. Each
    passes within the drill's own bounds and restores the lab (a preview after them has no change)."""
    facts = box.stages.get("drills")
    assert facts, f"the scenario stopped before the drills: {sorted(box.stages)}"
    drilled = facts[scenario]
    assert drilled.ok and f"== {scenario} drill on stack {box.lab.stack}: PASS ==" in drilled.output, drilled.output
    assert "NOT RESTORED" not in drilled.output, drilled.output
    assert facts["after"].ok, facts["after"].output[-3000:]


def test_make_destroy_empties_vcenter_and_the_box(box: Box) -> None:
    """The teardown guard goes first, so the leave guards drain nothing and delete no Node: the
    cluster's store after `make destroy` holds every Node as before, none cordoned."""
    destroy = assert_ok(box, "destroy")
    assert box.stages["hosts_after_destroy"] == []
    deletes = [
        e["resourcePreEvent"]["metadata"]["urn"].rsplit("::", 1)[1]
        for e in destroy.event_log()
        if e.get("resourcePreEvent", {}).get("metadata", {}).get("op") == "delete"
        and "command:remote:Command" in e["resourcePreEvent"]["metadata"]["urn"]
    ]
    leaves = [i for i, name in enumerate(deletes) if name.endswith("-leave-cluster")]
    assert "teardown-guard" in deletes and leaves and deletes.index("teardown-guard") < min(leaves), deletes
    for node in CFG.kubernetes_nodes:
        assert f"not draining or removing {node.name}" in destroy.output, destroy.output[-3000:]
    before = box.stages["store_before_destroy"].get("nodes", {})
    forgotten = box.stages["forgotten_clusters"]
    assert len(forgotten) == 1, forgotten  # the last control plane's VM took the cluster with it
    assert not box.stages["store_after_destroy"].get("members"), box.stages["store_after_destroy"]
    after = forgotten[0].get("nodes", {})
    assert sorted(after) == sorted(before) and len(after) == len(CFG.kubernetes_nodes), (before, after)
    assert not [name for name, node in after.items() if node.get("unschedulable")], after
    during = box.hosts.events[box.stages["events_before_destroy"] :]
    gone = {e["name"] for e in during if e["state"] == "gone"}
    assert gone == set(NODES), during


def test_make_up_after_make_destroy_builds_a_new_cluster_and_destroy_leaves_nothing(box: Box) -> None:
    """After `make destroy`, one `make up` from the empty vCenter reaches verify-cluster again: new
    VMs, new etcd members (none of the destroyed cluster's), every Node Ready. Before the box's
    store forgot a destroyed cluster, kubeadm init's etcd waited for the old members."""
    assert_ok(box, "destroy")
    again = box.stages["after_destroy"]
    assert again["up"].ok, again["up"].output[-3000:]
    old_members = {m["id"] for m in box.stages["store_before_destroy"].get("members", [])}
    members = again["store"].get("members", [])
    assert sorted(m["name"] for m in members) == sorted(n.name for n in CFG.control_planes), members
    assert old_members and not old_members & {m["id"] for m in members}, (old_members, members)
    nodes = json.loads(again["cluster"]["nodes"][4:])["items"]
    ready = {
        n["metadata"]["name"]: [c["status"] for c in n["status"]["conditions"] if c["type"] == "Ready"] for n in nodes
    }
    assert ready == {n.name: ["True"] for n in CFG.kubernetes_nodes}, ready
    verified = f"labs-k8s[verify-cluster]: all {len(CFG.kubernetes_nodes)} nodes Ready"
    assert verified in again["up"].output, again["up"].output[-3000:]
    assert again["destroy"].ok, again["destroy"].output[-3000:]
    assert again["hosts_after"] == [], again["hosts_after"]


def test_the_whole_scenario_changed_no_machine_wide_setting(box: Box) -> None:
    """Fifteen hosts booted, their steps, the drills and two destroys: the machine's kernel settings
    (`sysctl -a` outside the box, less counters and net.*) are as they were before the box."""
    assert box.stages["machine_settings_changed"] == {}
