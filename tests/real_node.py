"""TEST ONLY: a Kubernetes node of the lab on the real programs, in a box host with systemd as PID 1.

One control plane (labs-k8s-m01) booted from the sealed template (tests/systemd_host.py), in a network
namespace of its own with the node's address, wired to a balancer's (lb01's address and the VIP, HAProxy
with the project's haproxy.cfg), and the site's services on the node's loopback:
the apt mirror (Debian's packages recorded, tests/apt_mirror.py, and the box's signed repositories of
the real .debs, tests/box_repo.py) and the registry mirror over TLS (tests/kube_images.py). The
project's own steps run on it as the fleet runs them (`step_bundle` on `bash -s`'s stdin), as root.

The box's deviations from a VM, each for a property of this machine (docs/testing.md):
- cgroup v1 here: the kubelet runs with `--fail-cgroupv1=false` (a drop-in of the box's);
- containerd's overlay snapshots need a filesystem that is not the host's overlay root: a tmpfs;
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

from components.config import LabConfig, Node
from components.rendering import k8s as k8s_rendering
from components.rendering import lb as lb_rendering
from components.rendering import step_bundle
from components.template import CACHE_ROOT
from tests import kube_images
from tests.apt_mirror import record
from tests.box_repo import BoxRepo, upstream
from tests.box_repo import build as build_box_repo
from tests.firstboot import sealed_rootfs
from tests.lab_box import modules_index
from tests.labs import make_lab_config_with
from tests.systemd_host import SystemdHost

REPO = Path(__file__).resolve().parents[1]
APT_MIRROR = "127.0.0.1:3142"
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


@dataclass
class Site:
    """What the lab's site serves the node: the addresses and the keys' fingerprints its stack names."""

    repo: BoxRepo
    snapshot: Path
    registry_store: Path
    ca: Path
    cert: Path
    key: Path


def site(directory: Path) -> Site:
    rootfs = sealed_rootfs(make_lab_config_with())
    snapshot = record(rootfs, NODE_PACKAGES, CACHE_ROOT / "box-mirror")
    repo = build_box_repo(CACHE_ROOT / "box-repo-real", real=True)
    ca, cert, key = kube_images.tls_for_loopback(directory)
    return Site(repo, snapshot, kube_images.build_store(), ca, cert, key)


def lab_config(site: Site, registry: str, minor: str = "1.36") -> LabConfig:
    """The example lab on the box's mirrors, at the patch release of `minor` the repository serves."""

    def change(raw: dict[str, Any]) -> None:
        mirrors = raw.setdefault("mirrors", {})
        mirrors["aptProxy"] = f"http://{APT_MIRROR}"
        mirrors["registryMirror"] = f"https://{registry}"
        mirrors["kubernetesRepository"] = {
            "url": BoxRepo.kubernetes_url(APT_MIRROR), "keyFingerprint": site.repo.kubernetes_fingerprint,
        }  # fmt: skip
        mirrors["containerdRepository"] = {
            "url": BoxRepo.containerd_url(APT_MIRROR), "keyFingerprint": site.repo.containerd_fingerprint,
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
        self, name: str, files: dict[str, str], entrypoint: str, timeout: float = 900
    ) -> subprocess.CompletedProcess[str]:
        """One of the fleet's steps, as its Command runs it: the bundle on `bash -s`'s stdin, as root."""
        bundle = step_bundle(f"{self.node.name}-{name}", files, entrypoint)
        return self.host.run("bash", "-s", input=bundle, timeout=timeout)


def _ip(netns: str, *args: str) -> None:
    subprocess.run(["ip", "-n", netns, *args], check=True, capture_output=True)


def _host_files(upper: Path, cfg: LabConfig, node: Node, ca: Path) -> None:
    """The box's deviations, and the VM's identity as cloud-init's network stage leaves it (this host
    boots without a datasource: tests/lab_box.py's hosts get theirs from guestinfo)."""
    (upper / "etc").mkdir(parents=True, exist_ok=True)
    (upper / "etc/hostname").write_text(f"{node.name}\n")
    servers = "".join(f"nameserver {server}\n" for server in cfg.network.dns_servers)
    (upper / "etc/resolv.conf").write_text(f"{servers}search {cfg.network.search_domain}\n")
    for path, (source, mode) in DEVIATIONS.items():
        target = upper / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(NODE_TOOLS / source, target)
        target.chmod(mode)
    trusted = upper / "usr/local/share/ca-certificates/labs-k8s-box-registry.crt"
    trusted.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(ca, trusted)


@contextlib.contextmanager
def control_plane(directory: Path, minor: str = "1.36") -> Iterator[RealNode]:
    """labs-k8s-m01 booted, its network and the site's mirrors up; nothing of the steps run yet."""
    directory.mkdir(parents=True, exist_ok=True)
    served = site(directory)
    netns, balancer_ns = f"lk8s-node-{os.getpid()}", f"lk8s-nodelb-{os.getpid()}"
    for name in (netns, balancer_ns):
        subprocess.run(["ip", "netns", "add", name], check=True)
    host: SystemdHost | None = None
    mirror: subprocess.Popen[str] | None = None
    haproxy: subprocess.Popen[bytes] | None = None
    try:
        _ip(netns, "link", "set", "lo", "up")
        with kube_images.serve(served.registry_store, served.cert, served.key, netns) as registry:
            cfg = lab_config(served, registry, minor)
            node = next(n for n in cfg.control_planes)
            prefix = cfg.network.cidr.prefixlen
            # The node's NIC, wired to a balancer's: lb01's address and the VIP, HAProxy on it with
            # the project's own haproxy.cfg (Keepalived and the second balancer: tests/test_lb_netns.py).
            balancer = cfg.balancers[0]
            _ip(balancer_ns, "link", "set", "lo", "up")
            _ip(netns, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", balancer_ns)
            _ip(netns, "addr", "add", f"{node.ip}/{prefix}", "dev", "eth0")
            _ip(netns, "link", "set", "eth0", "up")
            _ip(netns, "route", "add", "default", "via", str(cfg.network.gateway), "dev", "eth0", "onlink")
            _ip(balancer_ns, "addr", "add", f"{balancer.ip}/{prefix}", "dev", "eth0")
            _ip(balancer_ns, "addr", "add", f"{cfg.load_balancer.vip}/32", "dev", "eth0")
            _ip(balancer_ns, "link", "set", "eth0", "up")
            haproxy_dir = directory / "haproxy"
            haproxy_dir.mkdir(mode=0o755, exist_ok=True)
            paths = lb_rendering.BalancerPaths(stats_socket=str(haproxy_dir / "admin.sock"))
            (haproxy_dir / "haproxy.cfg").write_text(lb_rendering.render_haproxy_cfg(cfg, paths=paths))
            haproxy = subprocess.Popen(
                ["ip", "netns", "exec", balancer_ns, "haproxy", "-db", "-f", str(haproxy_dir / "haproxy.cfg")],
                stdout=(haproxy_dir / "haproxy.log").open("w"), stderr=subprocess.STDOUT,
            )  # fmt: skip
            mirror = subprocess.Popen(
                ["ip", "netns", "exec", netns, sys.executable, "-m", "tests.apt_mirror", "serve",
                 str(served.snapshot), APT_MIRROR, "--log", str(directory / "apt-mirror.log"),
                 "--repo", str(served.repo.root)],
                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip
            assert mirror.stdout is not None and mirror.stdout.readline().startswith("MIRROR"), "no apt mirror"
            rootfs = sealed_rootfs(cfg)
            disk = directory / "data-disk.img"
            subprocess.run(["truncate", "-s", f"{node.data_disk_gib}G", str(disk)], check=True)
            subprocess.run(["mkfs.ext4", "-q", "-L", k8s_rendering.DATA_DISK_LABELS[node.role], str(disk)], check=True)
            host = SystemdHost(
                node.name, rootfs, directory / "host", memory_mib=3072, netns=netns,
                data_disk=(disk, k8s_rendering.DATA_DISK_MOUNTS[node.role]),
                modules=modules_index(directory, rootfs), scratch=("/var/lib/containerd",),
            )  # fmt: skip
            _host_files(host.directory / "upper", cfg, node, served.ca)
            host.start()
            host.wait_booted()
            updated = host.run("update-ca-certificates")
            assert updated.returncode == 0, updated.stdout + updated.stderr
            yield RealNode(cfg, node, host, netns)
    finally:
        if host is not None:
            host.stop()
        for process in (mirror, haproxy):
            if process is not None:
                process.kill()
                process.wait()
        for name in (netns, balancer_ns):
            subprocess.run(["ip", "netns", "del", name], check=False)
