"""TEST ONLY: nodes of the lab on the real programs, each a box host with systemd as PID 1.

Nodes of the example lab booted from the sealed template (tests/systemd_host.py), each in a network
namespace of its own on one bridge with the gateway's address; lb01 there too (its address and the VIP,
HAProxy with the project's haproxy.cfg); the site's services at the gateway: the apt mirror (Debian's
packages recorded, tests/apt_mirror.py, and the box's signed repositories of the real .debs,
tests/box_repo.py) and the registry mirror over TLS (tests/kube_images.py). The project's own steps
run on them as the fleet runs them (`step_bundle` on `bash -s`'s stdin), as root.

The box's deviations from a VM, each for a property of this machine (docs/testing.md):
- cgroup v1 here: the kubelet runs with `--fail-cgroupv1=false` (a drop-in of the box's);
- containerd's overlay snapshots need a filesystem that is not the host's overlay root: an ext4 image
  of the host's (a worker's is its data disk, as on a VM); the kubelet's root is there too, the VM's own disk
  (on the overlay root the kubelet judged the machine's disk, and evicted for DiskPressure);
- root lacks CAP_SYS_RESOURCE: a runc wrapper raises a negative `oomScoreAdj` to 0;
- kubeadm's preflight refuses cgroup v1: a kubeadm wrapper skips that one check (SystemVerification);
- nf_conntrack_max is writable in the machine's own network namespace alone: the same wrapper gives
  kube-proxy `conntrack.maxPerCore: 0` in init's configuration (as kind does);
- the registry's CA is the site's: in the host's trust store, as a site bakes it into its template.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.config import LabConfig, Node, Role
from components.rendering import k8s as k8s_rendering
from components.rendering import lb as lb_rendering
from components.rendering import step_bundle
from components.template import CACHE_ROOT
from tests import kube_images
from tests.apt_mirror import record
from tests.box_repo import BoxRepo, upstream
from tests.box_repo import build as build_box_repo
from tests.firstboot import sealed_rootfs
from tests.lab_box import HostProfile, modules_index
from tests.labs import make_lab_config_with
from tests.systemd_host import SystemdHost

REPO = Path(__file__).resolve().parents[1]
APT_PORT = 3142
CONTAINERD_ROOT = "/var/lib/containerd"
# The kubelet's nodefs: the VM's own disk, not the machine's (whose free share the kubelet would
# judge: below 10 % it evicts every pod for DiskPressure).
KUBELET_ROOT = "/var/lib/kubelet"
# What the steps install from Debian's archive (prepare-node.sh install_base_packages and
# configure_time), and what the real packages depend on besides.
NODE_PACKAGES = (
    "ca-certificates", "curl", "gnupg", "ethtool", "jq", "conntrack", "socat", "iptables", "iputils-arping",
    "systemd-timesyncd", "libseccomp2",
)  # fmt: skip
# The box's deviations on a node (files in the host's layer; their own comments say why).
NODE_TOOLS = REPO / "tests" / "tools" / "box" / "node"
DEVIATIONS = {
    "etc/systemd/system/kubelet.service.d/90-labs-k8s-box.conf": ("kubelet-cgroupv1.conf", 0o644),
    "usr/local/sbin/runc": ("runc-wrapper.sh", 0o755),
    "usr/local/bin/kubeadm": ("kubeadm-wrapper.sh", 0o755),
}


def host_profile(role: Role) -> HostProfile:
    """A Kubernetes node's host in the box: the deviations above, and its kubelet's and containerd's
    roots on a disk of its own (a worker's containerd root is its data disk, as on a VM)."""
    files = {path: (NODE_TOOLS / source, mode) for path, (source, mode) in DEVIATIONS.items()}
    on_data_disk = k8s_rendering.DATA_DISK_MOUNTS[role] == CONTAINERD_ROOT
    scratch = (KUBELET_ROOT,) if on_data_disk else (KUBELET_ROOT, CONTAINERD_ROOT)
    return HostProfile(memory_mib=3072 if role is Role.CONTROL_PLANE else 2048, scratch=scratch, files=files)


@dataclass
class Site:
    """What the lab's site serves the node: the addresses and the keys' fingerprints its stack names."""

    repo: BoxRepo
    snapshot: Path
    registry_store: Path
    ca: Path
    cert: Path
    key: Path


def site(directory: Path, address: str) -> Site:
    rootfs = sealed_rootfs(make_lab_config_with())
    snapshot = record(rootfs, NODE_PACKAGES, CACHE_ROOT / "box-mirror")
    repo = build_box_repo(CACHE_ROOT / "box-repo-real", real=True)
    ca, cert, key = kube_images.throwaway_tls(directory, (address,))
    return Site(repo, snapshot, kube_images.build_store(), ca, cert, key)


def lab_config(site: Site, apt_mirror: str, registry: str, minor: str = "1.36") -> LabConfig:
    """The example lab on the box's mirrors, at the patch release of `minor` the repository serves."""

    def change(raw: dict[str, Any]) -> None:
        mirrors = raw.setdefault("mirrors", {})
        mirrors["aptProxy"] = f"http://{apt_mirror}"
        mirrors["registryMirror"] = f"https://{registry}"
        mirrors["kubernetesRepository"] = {
            "url": BoxRepo.kubernetes_url(apt_mirror), "keyFingerprint": site.repo.kubernetes_fingerprint,
        }  # fmt: skip
        mirrors["containerdRepository"] = {
            "url": BoxRepo.containerd_url(apt_mirror), "keyFingerprint": site.repo.containerd_fingerprint,
        }  # fmt: skip
        raw.setdefault("kubernetes", {})["version"] = upstream(site.repo.kubernetes_versions[minor])
        (containerd,) = site.repo.containerd_versions
        raw["kubernetes"]["containerdVersion"] = upstream(containerd)

    return make_lab_config_with(change)


@dataclass
class RealNode:
    cfg: LabConfig
    node: Node
    host: SystemdHost
    netns: str

    def step(
        self, name: str, files: dict[str, str], entrypoint: str, args: tuple[str, ...] = (), timeout: float = 900
    ) -> subprocess.CompletedProcess[str]:
        """One of the fleet's steps, as its Command runs it: the bundle on `bash -s`'s stdin, as root."""
        bundle = step_bundle(f"{self.node.name}-{name}", files, entrypoint, args)
        return self.host.run("bash", "-s", input=bundle, timeout=timeout)


@dataclass
class RealLab:
    cfg: LabConfig
    nodes: dict[str, RealNode]  # by node name
    wire: str  # the network namespace of the lab's bridge, the gateway's address and the site's services


def _ip(netns: str, *args: str) -> None:
    subprocess.run(["ip", "-n", netns, *args], check=True, capture_output=True)


def _host_files(upper: Path, cfg: LabConfig, node: Node, ca: Path) -> None:
    """The box's deviations, and the VM's identity as cloud-init's network stage leaves it (this host
    boots without a datasource: tests/lab_box.py's hosts get theirs from guestinfo)."""
    (upper / "etc").mkdir(parents=True, exist_ok=True)
    (upper / "etc/hostname").write_text(f"{node.name}\n")
    servers = "".join(f"nameserver {server}\n" for server in cfg.network.dns_servers)
    (upper / "etc/resolv.conf").write_text(f"{servers}search {cfg.network.search_domain}\n")
    for path, (source, mode) in host_profile(node.role).files.items():
        target = upper / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        target.chmod(mode)
    trusted = upper / "usr/local/share/ca-certificates/labs-k8s-box-registry.crt"
    trusted.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(ca, trusted)


def _plug(wire: str, netns: str, index: int, addresses: list[str]) -> None:
    """A NIC in `netns` on the lab's bridge, holding `addresses`."""
    _ip(wire, "link", "add", f"port{index}", "type", "veth", "peer", "name", "eth0", "netns", netns)
    _ip(wire, "link", "set", f"port{index}", "master", "br0", "up")
    _ip(netns, "link", "set", "lo", "up")
    for address in addresses:
        _ip(netns, "addr", "add", address, "dev", "eth0")
    _ip(netns, "link", "set", "eth0", "up")


@contextlib.contextmanager
def lab(directory: Path, names: tuple[str, ...] = ("labs-k8s-m01",), minor: str = "1.36") -> Iterator[RealLab]:
    """The named nodes of the example lab booted on one bridge with the gateway's address, lb01 (its
    address and the VIP, HAProxy with the project's own haproxy.cfg; Keepalived and lb02:
    tests/test_lb_netns.py), and the site's apt mirror and registry mirror at the gateway; nothing of
    the steps run yet."""
    directory.mkdir(parents=True, exist_ok=True)
    example = make_lab_config_with()
    gateway, prefix = str(example.network.gateway), example.network.cidr.prefixlen
    served = site(directory, gateway)
    tag = os.getpid()
    wire, balancer_ns = f"lk8s-wire-{tag}", f"lk8s-nodelb-{tag}"
    namespaces = [wire, balancer_ns, *(f"lk8s-node-{tag}-{i}" for i in range(len(names)))]
    for name in namespaces:
        subprocess.run(["ip", "netns", "add", name], check=True)
    hosts: list[SystemdHost] = []
    processes: list[subprocess.Popen[Any]] = []
    try:
        _ip(wire, "link", "set", "lo", "up")
        _ip(wire, "link", "add", "br0", "type", "bridge")
        _ip(wire, "addr", "add", f"{gateway}/{prefix}", "dev", "br0")
        _ip(wire, "link", "set", "br0", "up")
        mirror = subprocess.Popen(
            ["ip", "netns", "exec", wire, sys.executable, "-m", "tests.apt_mirror", "serve", str(served.snapshot),
             f"{gateway}:{APT_PORT}", "--log", str(directory / "apt-mirror.log"), "--repo", str(served.repo.root)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        processes.append(mirror)
        assert mirror.stdout is not None and mirror.stdout.readline().startswith("MIRROR"), "no apt mirror"
        with kube_images.serve(served.registry_store, served.cert, served.key, wire, gateway) as registry:
            cfg = lab_config(served, f"{gateway}:{APT_PORT}", registry, minor)
            balancer = cfg.balancers[0]
            _plug(wire, balancer_ns, 0, [f"{balancer.ip}/{prefix}", f"{cfg.load_balancer.vip}/32"])
            haproxy_dir = directory / "haproxy"
            haproxy_dir.mkdir(mode=0o755, exist_ok=True)
            paths = lb_rendering.BalancerPaths(stats_socket=str(haproxy_dir / "admin.sock"))
            (haproxy_dir / "haproxy.cfg").write_text(lb_rendering.render_haproxy_cfg(cfg, paths=paths))
            haproxy = ["ip", "netns", "exec", balancer_ns, "haproxy", "-db", "-f", str(haproxy_dir / "haproxy.cfg")]
            log = (haproxy_dir / "haproxy.log").open("w")
            processes.append(subprocess.Popen(haproxy, stdout=log, stderr=subprocess.STDOUT))
            rootfs = sealed_rootfs(cfg)
            modules = modules_index(directory, rootfs)
            nodes: dict[str, RealNode] = {}
            for index, name in enumerate(names, start=1):
                node = next(n for n in cfg.kubernetes_nodes if n.name == name)
                netns = namespaces[index + 1]
                _plug(wire, netns, index, [f"{node.ip}/{prefix}"])
                _ip(netns, "route", "add", "default", "via", gateway)
                disk = directory / f"{name}-data.img"
                subprocess.run(["truncate", "-s", f"{node.data_disk_gib}G", str(disk)], check=True)
                label = k8s_rendering.DATA_DISK_LABELS[node.role]
                subprocess.run(["mkfs.ext4", "-q", "-L", label, str(disk)], check=True)
                mount, profile = k8s_rendering.DATA_DISK_MOUNTS[node.role], host_profile(node.role)
                host = SystemdHost(
                    name, rootfs, directory / name, memory_mib=profile.memory_mib, netns=netns,
                    data_disk=(disk, mount), modules=modules, scratch=profile.scratch,
                )  # fmt: skip
                _host_files(host.directory / "upper", cfg, node, served.ca)
                host.start()
                hosts.append(host)
                nodes[name] = RealNode(cfg, node, host, netns)
            for real in nodes.values():
                real.host.wait_booted()
                updated = real.host.run("update-ca-certificates")
                assert updated.returncode == 0, updated.stdout + updated.stderr
            yield RealLab(cfg, nodes, wire)
    finally:
        for host in hosts:
            host.stop()
        for process in processes:
            process.kill()
            process.wait()
        for name in namespaces:
            subprocess.run(["ip", "netns", "del", name], check=False)
