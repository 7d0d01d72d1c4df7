"""The k8s step scripts: shellcheck, and their guards, run against stand-in commands.

Each test lays out a step directory exactly as its bundle would (tests/shell_harness.py),
runs the script with a fake root prefix and stand-ins on PATH, then asserts on the logged
invocations (what was run, how often, with which arguments) and on the files written.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from components.config import LabConfig
from components.rendering import CLOUDINIT_DIR, k8s, step_bundle
from tests.labs import make_lab_config
from tests.requirements import require_tool, unavailable
from tests.shell_harness import TEST_CERTIFICATE_KEY, TEST_TOKEN, ShellHarness, modes

K8S_DIR = CLOUDINIT_DIR / "k8s"
SCRIPTS = sorted(K8S_DIR.glob("*.sh"))
VIP = "10.3.60.100"
GIB = 1024**3


@pytest.fixture
def cfg(lab_config: LabConfig) -> LabConfig:
    return lab_config


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[ShellHarness]:
    require_tool("bash", "openssl", "jq", "timeout")
    h = ShellHarness(tmp_path)
    if h.missing_tools:
        unavailable(f"the shell harness needs {', '.join(h.missing_tools)} on PATH")
    yield h


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def failed(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode != 0, f"expected a failure\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def no_secrets(result: subprocess.CompletedProcess[str]) -> None:
    for secret in (TEST_TOKEN, TEST_TOKEN.split(".")[1], TEST_CERTIFICATE_KEY):
        assert secret not in result.stdout
        assert secret not in result.stderr


# ------------------------------------------------------------------ static checks


def test_there_are_scripts_to_check() -> None:
    names = {path.name for path in SCRIPTS}
    assert {
        k8s.PREPARE_ENTRYPOINT, k8s.INIT_ENTRYPOINT, k8s.REFRESH_ENTRYPOINT, k8s.CONTROL_PLANE_JOIN_ENTRYPOINT,
        k8s.WORKER_JOIN_ENTRYPOINT, k8s.FLANNEL_ENTRYPOINT, k8s.VERIFY_ENTRYPOINT, k8s.DRAIN_ENTRYPOINT,
        k8s.KUBECONFIG_ENTRYPOINT, k8s.LIB_FILE,
    } <= names  # fmt: skip


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_shellcheck_is_clean(script: Path) -> None:
    require_tool("shellcheck")
    result = subprocess.run(
        ["shellcheck", "--external-sources", f"--source-path={K8S_DIR}", "--severity=style", str(script)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("script", [p for p in SCRIPTS if p.name != k8s.LIB_FILE], ids=lambda path: path.name)
def test_scripts_are_strict_and_source_the_library(script: Path) -> None:
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "\nset -Eeuo pipefail\n" in text
    assert '\n. "$HERE/lib.sh"\n' in text
    assert "\nrequire_root\n" in text


def test_every_bundle_is_valid_bash(cfg: LabConfig) -> None:
    require_tool("bash")
    bundles = [
        step_bundle("k8s-prepare", k8s.prepare_files(cfg, cfg.workers[0]), k8s.PREPARE_ENTRYPOINT),
        step_bundle("k8s-init", k8s.init_files(cfg, TEST_TOKEN, TEST_CERTIFICATE_KEY), k8s.INIT_ENTRYPOINT),
        step_bundle("k8s-join", k8s.worker_join_files(cfg, cfg.workers[0], TEST_TOKEN), k8s.WORKER_JOIN_ENTRYPOINT,
                    k8s.join_args("sha256:" + "ab" * 32)),
        step_bundle("k8s-verify", k8s.verify_files(cfg), k8s.VERIFY_ENTRYPOINT),
    ]
    for bundle in bundles:
        result = subprocess.run(["bash", "-n"], input=bundle, capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr


# ------------------------------------------------------------------ prepare-node.sh

FSTAB = """\
# /etc/fstab: static file system information.
UUID=0b1c2d3e-0000-4000-8000-000000000001 /               ext4    errors=remount-ro 0       1
UUID=0b1c2d3e-0000-4000-8000-000000000002 none            swap    sw              0       0
/dev/sr0        /media/cdrom0   udf,iso9660 user,noauto     0       0
"""
DATA_UUID = "3f0c1a2b-4d5e-4f60-8a7b-9c0d1e2f3a4b"
CONTAINERD_2 = "2.2.1-1~debian.12~bookworm"


def fresh_debian_node(h: ShellHarness, data_disk_gib: int = 50) -> None:
    """A Debian 12 clone of the golden template: swap in fstab, ufw installed, a blank second disk."""
    h.write("/etc/os-release", 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nVERSION_CODENAME=bookworm\n')
    h.write("/etc/fstab", FSTAB)
    for package, version in (("systemd-timesyncd", "252.39-1~deb12u1"), ("ca-certificates", "20230311"),
                             ("ufw", "0.36.2-1")):
        h.set_state(f"dpkg/{package}", version)
    h.set_state("repo/containerd.io", f"{CONTAINERD_2}\n2.1.5-1~debian.12~bookworm\n1.7.28-1~debian.12~bookworm\n")
    for package in ("kubeadm", "kubelet", "kubectl"):
        h.set_state(f"repo/{package}", "1.36.1-1.1\n1.36.0-1.1\n")
    h.set_state("repo/kubernetes-cni", "1.8.0-1.1\n")
    h.set_state("repo/cri-tools", "1.36.0-1.1\n")
    h.set_state("swap-units", "dev-sda5.swap loaded active active Swap Partition\n")
    h.set_state("disks", f"/dev/sda disk {20 * GIB} 0\n/dev/sdb disk {data_disk_gib * GIB} 0\n/dev/sr0 rom {GIB} 1\n")
    h.set_state("children/sda", "sda1\nsda2\nsda5\n")


def call_index(h: ShellHarness, name: str, *words: str) -> int:
    for index, call in enumerate(h.calls()):
        if call[0] == name and all(word in call[1:] for word in words):
            return index
    raise AssertionError(f"{name} {words} was not called")


def test_prepare_node_sets_up_a_worker(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    fresh_debian_node(h)
    h.install_step(k8s.prepare_files(cfg, cfg.workers[0]))
    result = ok(h.run(k8s.PREPARE_ENTRYPOINT))
    assert result.stdout == "prepared labs-k8s-w01\n"

    # Kernel: modules now and at boot, sysctl applied and checked.
    assert h.calls_matching("modprobe", "overlay") and h.calls_matching("modprobe", "br_netfilter")
    assert (h.root / "etc/modules-load.d/k8s.conf").read_text().splitlines()[1:] == ["overlay", "br_netfilter"]
    sysctl = (h.root / "etc/sysctl.d/99-kubernetes.conf").read_text()
    for key in ("net.bridge.bridge-nf-call-iptables = 1", "net.bridge.bridge-nf-call-ip6tables = 1",
                "net.ipv4.ip_forward = 1"):
        assert key in sysctl
    assert h.calls_matching("sysctl", "-p")

    # Swap: off now, gone from fstab, its units masked.
    assert h.calls_matching("swapoff", "-a")
    fstab = (h.root / "etc/fstab").read_text()
    assert "\n# labs-k8s: swap off for the kubelet: UUID=0b1c2d3e-0000-4000-8000-000000000002 none" in fstab
    assert [line for line in fstab.splitlines() if " swap " in line and not line.startswith("#")] == []
    assert h.calls_matching("systemctl", "mask", "dev-sda5.swap")
    assert h.calls_matching("systemctl", "mask", "swap.target")

    # ufw purged; time from the configured servers.
    assert h.calls_matching("apt-get", "purge", "ufw")
    timesyncd = (h.root / "etc/systemd/timesyncd.conf.d/labs-k8s.conf").read_text()
    assert "NTP=0.debian.pool.ntp.org 1.debian.pool.ntp.org\n" in timesyncd
    # systemd-timesyncd reads its drop-ins as its own user: the new directory must be readable.
    assert modes(h.root / "etc/systemd/timesyncd.conf.d") == 0o755
    assert modes(h.root / "etc/systemd/timesyncd.conf.d/labs-k8s.conf") == 0o644
    assert h.calls_matching("timedatectl", "set-ntp", "true")

    # Data disk: the blank 50 GiB disk, formatted once, in fstab by UUID, mounted before containerd exists.
    assert h.calls("mkfs.ext4") == [["mkfs.ext4", "-q", "-L", "labs-containerd", "/dev/sdb"]]
    assert f"UUID={DATA_UUID} /var/lib/containerd ext4 defaults,noatime,nofail 0 2\n" in fstab
    assert call_index(h, "mount") < call_index(h, "apt-get", "install", f"containerd.io={CONTAINERD_2}")
    drop_in = (h.root / "etc/systemd/system/containerd.service.d/10-labs-k8s-data-disk.conf").read_text()
    assert "RequiresMountsFor=/var/lib/containerd" in drop_in

    # containerd 2.x from Docker's repo, held; config for 2.x, verified.
    docker_list = (h.root / "etc/apt/sources.list.d/docker.list").read_text()
    assert "https://download.docker.com/linux/debian bookworm stable" in docker_list
    assert "[arch=amd64 signed-by=/etc/apt/keyrings/docker.asc]" in docker_list
    assert h.calls_matching("apt-mark", "hold", "containerd.io")
    config = (h.root / "etc/containerd/config.toml").read_text()
    assert "version = 3\n" in config
    runtime, images = "plugins.'io.containerd.cri.v1.runtime'", "plugins.'io.containerd.cri.v1.images'"
    assert f"[{runtime}.containerd.runtimes.runc.options]\n  SystemdCgroup = true\n" in config
    assert f"[{images}.pinned_images]\n  sandbox = 'registry.k8s.io/pause:3.10.1'\n" in config
    assert "config_path = '/etc/containerd/certs.d'" in config
    assert "grpc.v1.cri" not in config
    assert h.calls_matching("containerd", "config", "dump")
    assert len(h.calls_matching("systemctl", "restart", "containerd")) == 1
    assert not (h.root / "etc/containerd/certs.d/_default/hosts.toml").exists()
    assert not (h.root / "etc/apt/apt.conf.d/90labs-k8s-proxy").exists()

    # Kubernetes from pkgs.k8s.io v1.36, pinned to the exact 1.36.0 package, held.
    kubernetes_list = (h.root / "etc/apt/sources.list.d/kubernetes.list").read_text()
    assert "https://pkgs.k8s.io/core:/stable:/v1.36/deb/ /" in kubernetes_list
    assert h.calls_matching("apt-get", "install", "kubeadm=1.36.0-1.1", "kubelet=1.36.0-1.1", "kubectl=1.36.0-1.1")
    assert h.calls_matching("apt-mark", "hold", "kubeadm", "kubelet", "kubectl")
    assert h.calls_matching("kubeadm", "config", "images", "list", "--kubernetes-version", "v1.36.0")

    # flannel.1 checksum offload off whenever the device appears.
    rule = (h.root / "etc/udev/rules.d/90-labs-k8s-flannel-checksum.rules").read_text()
    assert 'KERNEL=="flannel.1"' in rule and "ethtool -K %k tx-checksum-ip-generic off" in rule
    assert h.calls_matching("systemctl", "enable", "kubelet")


def test_prepare_node_twice_changes_nothing(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    fresh_debian_node(h)
    h.install_step(k8s.prepare_files(cfg, cfg.workers[1]))
    ok(h.run(k8s.PREPARE_ENTRYPOINT))
    before = h.snapshot()
    h.reset_log()

    result = ok(h.run(k8s.PREPARE_ENTRYPOINT))
    assert result.stdout == "prepared labs-k8s-w02\n"
    assert h.snapshot() == before
    assert h.calls("apt-get") == [], "a second run installs, updates or purges nothing"
    assert h.calls("mkfs.ext4") == [] and h.calls("mount") == [] and h.calls("curl") == []
    for verb in ("restart", "start", "mask", "enable", "daemon-reload"):
        assert h.calls_matching("systemctl", verb) == [], verb
    assert h.calls_matching("apt-mark", "hold") == [] and h.calls_matching("udevadm", "control") == []
    # What it still does is re-assert state, harmlessly.
    assert h.calls_matching("swapoff", "-a") and h.calls_matching("containerd", "config", "dump")


def test_prepare_node_control_plane_puts_etcd_on_the_data_disk(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    fresh_debian_node(h, data_disk_gib=20)
    h.install_step(k8s.prepare_files(cfg, cfg.control_planes[0]))
    ok(h.run(k8s.PREPARE_ENTRYPOINT))
    assert h.calls("mkfs.ext4") == [["mkfs.ext4", "-q", "-L", "labs-etcd", "/dev/sdb"]]
    assert f"UUID={DATA_UUID} /var/lib/etcd ext4 defaults,noatime,nofail 0 2\n" in (h.root / "etc/fstab").read_text()
    assert modes(h.root / "var/lib/etcd") == 0o700
    drop_in = h.root / "etc/systemd/system/kubelet.service.d/10-labs-k8s-data-disk.conf"
    assert "RequiresMountsFor=/var/lib/etcd" in drop_in.read_text()


def test_prepare_node_keeps_an_existing_filesystem(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    fresh_debian_node(h)
    h.set_state("fs/sdb.type", "ext4\n")
    h.set_state("fs/sdb.uuid", "11111111-2222-4333-8444-555555555555\n")
    h.install_step(k8s.prepare_files(cfg, cfg.workers[0]))
    ok(h.run(k8s.PREPARE_ENTRYPOINT))
    assert h.calls("mkfs.ext4") == []
    assert "UUID=11111111-2222-4333-8444-555555555555 /var/lib/containerd ext4" in (h.root / "etc/fstab").read_text()


@pytest.mark.parametrize(
    ("disks", "extra_state", "message"),
    [
        (f"/dev/sda disk {20 * GIB} 0\n/dev/sdb disk {50 * GIB} 0\n/dev/sdc disk {50 * GIB} 0\n", {},
         "found 2 (/dev/sdb /dev/sdc)"),
        (f"/dev/sda disk {20 * GIB} 0\n/dev/sdb disk {40 * GIB} 0\n", {}, "found 0 (none)"),
        (f"/dev/sda disk {20 * GIB} 0\n/dev/sdb disk {50 * GIB} 0\n", {"fs/sdb.pttype": "gpt\n"},
         "has a partition table but no filesystem"),
        (f"/dev/sda disk {20 * GIB} 0\n/dev/sdb disk {50 * GIB} 0\n", {"fs/sdb.type": "ntfs\n"},
         "already holds a ntfs filesystem"),
    ],
    ids=["two-candidates", "no-candidate", "partition-table", "foreign-filesystem"],
)
def test_prepare_node_refuses_an_ambiguous_or_foreign_data_disk(
    harness: ShellHarness, cfg: LabConfig, disks: str, extra_state: dict[str, str], message: str
) -> None:
    h = harness
    fresh_debian_node(h)
    h.set_state("disks", disks)
    h.set_state("children/sda", "sda1\n")
    for path, text in extra_state.items():
        h.set_state(path, text)
    h.install_step(k8s.prepare_files(cfg, cfg.workers[0]))
    result = failed(h.run(k8s.PREPARE_ENTRYPOINT))
    assert message in result.stderr
    assert h.calls("mkfs.ext4") == [] and h.calls("mount") == []
    assert h.calls_matching("apt-get", "install") == [], "nothing is installed on top of a wrong disk"


def test_prepare_node_with_containerd_1_7_on_an_older_minor_writes_the_1x_config(harness: ShellHarness) -> None:
    h = harness
    cfg = make_lab_config(kubernetes={"version": "1.35.2", "containerdVersion": "1.7.28"})
    fresh_debian_node(h)
    h.set_state("dpkg/containerd.io", "1.7.28-1~debian.12~bookworm")
    h.set_state("containerd-version", "1.7.28")
    for package in ("kubeadm", "kubelet", "kubectl"):
        h.set_state(f"repo/{package}", "1.35.2-1.1\n")
    h.install_step(k8s.prepare_files(cfg, cfg.workers[0]))
    ok(h.run(k8s.PREPARE_ENTRYPOINT))
    assert not any(arg.startswith("containerd.io=") for call in h.calls("apt-get") for arg in call)
    config = (h.root / "etc/containerd/config.toml").read_text()
    assert "version = 2\n" in config
    assert '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n' in config
    assert '  sandbox_image = "registry.k8s.io/pause:3.10.1"\n' in config
    assert "cri.v1.runtime" not in config
    kubernetes_list = (h.root / "etc/apt/sources.list.d/kubernetes.list").read_text()
    assert "https://pkgs.k8s.io/core:/stable:/v1.35/deb/ /" in kubernetes_list


def test_prepare_node_replaces_debian_containerd_1_6_for_kubernetes_1_36(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    fresh_debian_node(h)
    h.set_state("dpkg/containerd", "1.6.20~ds1-1+b1")
    h.set_state("containerd-version", "1.6.20~ds1")
    h.install_step(k8s.prepare_files(cfg, cfg.workers[0]))
    ok(h.run(k8s.PREPARE_ENTRYPOINT))
    assert h.calls_matching("apt-get", "install", f"containerd.io={CONTAINERD_2}")
    assert "version = 3\n" in (h.root / "etc/containerd/config.toml").read_text()


# Excerpts of real `containerd config dump` output for the configs prepare-node.sh writes
# (containerd 2.1.9 from Debian sid and 1.6.20 from Debian 12, run with --config on the
# rendered file): section headers indented, 2.x single-quoted, 1.x double-quoted.
REAL_DUMP_2X = """\
version = 3
root = '/var/lib/containerd'
state = '/run/containerd'
temp = ''
disabled_plugins = []
required_plugins = []
oom_score = 0
imports = []
    image_pull_progress_timeout = '5m0s'
    image_pull_with_sync_fs = false
    stats_collect_period = 10
    use_local_image_pull = false

    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = 'registry.k8s.io/pause:3.10.1'

    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = '/etc/containerd/certs.d'


      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes]
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
          runtime_type = 'io.containerd.runc.v2'
          runtime_path = ''
          pod_annotations = []
          container_annotations = []
          privileged_without_host_devices = false
          privileged_without_host_devices_all_devices_allowed = false
          cgroup_writable = false
          base_runtime_spec = ''
          cni_conf_dir = ''
          cni_max_conf_num = 0
          snapshotter = ''
          sandboxer = 'podsandbox'
          io_type = ''

          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
            BinaryName = ''
            CriuImagePath = ''
            CriuWorkPath = ''
            IoGid = 0
            IoUid = 0
            NoNewKeyring = false
            Root = ''
            ShimCgroup = ''
            SystemdCgroup = true

"""
REAL_DUMP_1X = """\
disabled_plugins = []
imports = ["config-1.35.2.toml"]
oom_score = 0
  [plugins."io.containerd.grpc.v1.cri"]
    device_ownership_from_security_context = false
    disable_apparmor = false
    disable_cgroup = false
    disable_hugetlb_controller = true
    disable_proc_mount = false
    disable_tcp_service = true
    enable_selinux = false
    enable_tls_streaming = false
    enable_unprivileged_icmp = false
    enable_unprivileged_ports = false
    ignore_image_defined_volumes = false
    max_concurrent_downloads = 3
    max_container_log_line_size = 16384
    netns_mounts_under_state_dir = false
    restrict_oom_score_adj = false
    sandbox_image = "registry.k8s.io/pause:3.10.1"
    selinux_category_range = 1024
          cni_max_conf_num = 0
          container_annotations = []
          pod_annotations = []
          privileged_without_host_devices = false
          runtime_engine = ""
          runtime_path = ""
          runtime_root = ""
          runtime_type = "io.containerd.runc.v2"

          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
            SystemdCgroup = true

    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = "/etc/containerd/certs.d"

"""


@pytest.mark.parametrize("dump", ["2x", "1x"])
def test_prepare_node_reads_real_containerd_dumps(harness: ShellHarness, dump: str) -> None:
    h = harness
    if dump == "2x":
        cfg = make_lab_config()
        fresh_debian_node(h)
        h.set_state("containerd-dump", REAL_DUMP_2X)
    else:
        cfg = make_lab_config(kubernetes={"version": "1.35.2", "containerdVersion": "1.7.28"})
        fresh_debian_node(h)
        h.set_state("dpkg/containerd.io", "1.7.28-1~debian.12~bookworm")
        h.set_state("containerd-version", "1.7.28")
        for package in ("kubeadm", "kubelet", "kubectl"):
            h.set_state(f"repo/{package}", "1.35.2-1.1\n")
        h.set_state("containerd-dump", REAL_DUMP_1X)
    h.install_step(k8s.prepare_files(cfg, cfg.workers[0]))
    result = ok(h.run(k8s.PREPARE_ENTRYPOINT))
    assert "SystemdCgroup = true, sandbox registry.k8s.io/pause:3.10.1" in result.stderr

    # The same real dump with the default (false) is caught.
    h.set_state("containerd-dump", (REAL_DUMP_2X if dump == "2x" else REAL_DUMP_1X).replace(
        "SystemdCgroup = true", "SystemdCgroup = false"))
    assert "does not apply SystemdCgroup = true" in failed(h.run(k8s.PREPARE_ENTRYPOINT)).stderr


def test_prepare_node_fails_clearly_when_systemd_cgroup_is_not_effective(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    fresh_debian_node(h)
    # containerd 2.x would ignore a 1.x-style section: the dump shows the setting elsewhere.
    h.set_state(
        "containerd-dump",
        "version = 3\n[plugins.'io.containerd.grpc.v1.cri'.containerd.runtimes.runc.options]\n  SystemdCgroup = true\n",
    )
    h.install_step(k8s.prepare_files(cfg, cfg.workers[0]))
    result = failed(h.run(k8s.PREPARE_ENTRYPOINT))
    assert "does not apply SystemdCgroup = true under [plugins.'io.containerd.cri.v1.runtime'" in result.stderr


def test_prepare_node_fails_clearly_when_the_patch_release_is_not_published(harness: ShellHarness) -> None:
    h = harness
    cfg = make_lab_config(kubernetes={"version": "1.36.9"})
    fresh_debian_node(h)
    h.install_step(k8s.prepare_files(cfg, cfg.workers[0]))
    result = failed(h.run(k8s.PREPARE_ENTRYPOINT))
    assert "pkgs.k8s.io v1.36 has no kubeadm 1.36.9" in result.stderr
    assert "1.36.1-1.1" in result.stderr
    assert h.calls_matching("apt-get", "install", "kubeadm=1.36.9-1.1") == []


def test_prepare_node_never_upgrades_a_joined_node(harness: ShellHarness) -> None:
    h = harness
    fresh_debian_node(h)
    h.set_state("dpkg/kubeadm", "1.36.0-1.1")
    h.write("/etc/kubernetes/kubelet.conf", "kubelet\n")
    cfg = make_lab_config(kubernetes={"version": "1.36.1"})
    h.install_step(k8s.prepare_files(cfg, cfg.workers[0]))
    result = failed(h.run(k8s.PREPARE_ENTRYPOINT))
    assert "is an upgrade (kubeadm upgrade)" in result.stderr
    assert h.calls_matching("apt-get", "install", "kubeadm=1.36.1-1.1") == []


def test_prepare_node_uses_the_configured_mirrors(harness: ShellHarness) -> None:
    h = harness
    cfg = make_lab_config(
        mirrors={"aptProxy": "http://apt.labs.local:3142", "registryMirror": "http://registry.labs.local:5000"}
    )
    fresh_debian_node(h)
    h.install_step(k8s.prepare_files(cfg, cfg.workers[0]))
    ok(h.run(k8s.PREPARE_ENTRYPOINT))
    proxy = (h.root / "etc/apt/apt.conf.d/90labs-k8s-proxy").read_text()
    assert 'Acquire::http::Proxy "http://apt.labs.local:3142";' in proxy
    assert 'Acquire::https::Proxy "http://apt.labs.local:3142";' in proxy
    assert all("--proxy" in call and "http://apt.labs.local:3142" in call for call in h.calls("curl"))
    hosts = (h.root / "etc/containerd/certs.d/_default/hosts.toml").read_text()
    assert '[host."http://registry.labs.local:5000"]' in hosts and '"pull", "resolve"' in hosts

    # Dropping the mirrors from the config removes what this project wrote, and only that.
    plain = make_lab_config()
    h.install_step(k8s.prepare_files(plain, plain.workers[0]))
    h.reset_log()
    ok(h.run(k8s.PREPARE_ENTRYPOINT))
    assert not (h.root / "etc/apt/apt.conf.d/90labs-k8s-proxy").exists()
    assert not (h.root / "etc/containerd/certs.d/_default/hosts.toml").exists()
    assert len(h.calls_matching("systemctl", "restart", "containerd")) == 1


def test_prepare_node_refuses_a_docker_key_with_another_fingerprint(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    fresh_debian_node(h)
    h.stub("gpg", 'echo "fpr:::::::::0000000000000000000000000000000000000000:"')
    h.install_step(k8s.prepare_files(cfg, cfg.workers[0]))
    result = failed(h.run(k8s.PREPARE_ENTRYPOINT))
    assert "does not have the fingerprint 9DC858229FC7DD38854AE2D88D81803C0EBFCD88" in result.stderr
    assert not (h.root / "etc/apt/keyrings/docker.asc").exists()


def test_prepare_node_installs_exactly_the_pinned_containerd_and_holds_it(harness: ShellHarness) -> None:
    h = harness
    cfg = make_lab_config(kubernetes={"containerdVersion": "2.1.5"})
    fresh_debian_node(h)
    h.install_step(k8s.prepare_files(cfg, cfg.workers[0]))
    ok(h.run(k8s.PREPARE_ENTRYPOINT))
    # Not the newest 2.x the repository offers (2.2.1): the configured one.
    assert h.calls_matching("apt-get", "install", "containerd.io=2.1.5-1~debian.12~bookworm")
    assert not any("containerd.io=" + CONTAINERD_2 in call for call in h.calls("apt-get"))
    assert h.calls_matching("apt-mark", "hold", "containerd.io")

    # The same pin again: nothing installed. A new pin: exactly that version, over the hold.
    h.reset_log()
    ok(h.run(k8s.PREPARE_ENTRYPOINT))
    assert not any(arg.startswith("containerd.io=") for call in h.calls("apt-get") for arg in call)
    moved = make_lab_config(kubernetes={"containerdVersion": "2.2.1"})
    h.install_step(k8s.prepare_files(moved, moved.workers[0]))
    ok(h.run(k8s.PREPARE_ENTRYPOINT))
    install = h.calls_matching("apt-get", "install", f"containerd.io={CONTAINERD_2}")
    assert install and "--allow-change-held-packages" in install[0]


def test_prepare_node_names_the_key_when_the_pinned_containerd_is_not_published(harness: ShellHarness) -> None:
    h = harness
    cfg = make_lab_config(kubernetes={"containerdVersion": "2.9.9"})
    fresh_debian_node(h)
    h.install_step(k8s.prepare_files(cfg, cfg.workers[0]))
    result = failed(h.run(k8s.PREPARE_ENTRYPOINT))
    assert "no containerd.io 2.9.9" in result.stderr
    assert "labs-k8s:kubernetes.containerdVersion" in result.stderr
    assert "2.2.1-1~debian.12~bookworm" in result.stderr  # what the repository does have
    assert not any(arg.startswith("containerd.io=") for call in h.calls("apt-get") for arg in call)


def test_prepare_node_refuses_a_kubernetes_key_with_another_fingerprint(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    fresh_debian_node(h)
    h.stub("gpg", r"""
case $(cat "${*: -1}") in
    *docker*) echo "fpr:::::::::9DC858229FC7DD38854AE2D88D81803C0EBFCD88:" ;;
    *) echo "fpr:::::::::1111111111111111111111111111111111111111:" ;;
esac
""")
    h.install_step(k8s.prepare_files(cfg, cfg.workers[0]))
    result = failed(h.run(k8s.PREPARE_ENTRYPOINT))
    assert "Release.key does not have the fingerprint DE15B14486CD377B9E876E1A234654DA9A296436" in result.stderr
    assert (h.root / "etc/apt/keyrings/docker.asc").exists()
    assert not (h.root / "etc/apt/keyrings/kubernetes-apt-keyring.asc").exists()
    assert h.calls_matching("apt-get", "install", "kubeadm=1.36.0-1.1") == []


# ------------------------------------------------------------------ kubeadm-init.sh


def init_harness(h: ShellHarness, cfg: LabConfig) -> None:
    h.install_step(k8s.init_files(cfg, TEST_TOKEN, TEST_CERTIFICATE_KEY))
    h.set_state("admin-server", f"https://{VIP}:6443")


def test_init_runs_kubeadm_init_once(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    init_harness(h, cfg)
    result = ok(h.run(k8s.INIT_ENTRYPOINT))
    assert result.stdout == "initialized\n"
    inits = h.calls_matching("kubeadm", "init")
    assert inits == [["kubeadm", "init", "--config", str(h.step / "kubeadm-init.yaml"), "--upload-certs",
                      "--skip-token-print", "--skip-certificate-key-print"]]
    kubeconfig = h.root / "root/.kube/config"
    assert kubeconfig.read_text() == (h.root / "etc/kubernetes/admin.conf").read_text()
    assert modes(kubeconfig) == 0o600
    # kubeadm printed the token and the key: they went to the root-only log, not to our output.
    no_secrets(result)
    assert TEST_TOKEN in (h.step / "kubeadm-init.log").read_text()
    assert modes(h.step / "kubeadm-init.log") == 0o600

    # Second run: admin.conf exists and the local API server answers.
    h.set_state("api/127.0.0.1")
    h.reset_log()
    result = ok(h.run(k8s.INIT_ENTRYPOINT))
    assert result.stdout == "already-initialized\n"
    assert h.calls("kubeadm") == []


def test_init_does_not_create_a_second_cluster_when_the_vip_answers(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    init_harness(h, cfg)
    h.set_state(f"api/{VIP}")
    result = ok(h.run(k8s.INIT_ENTRYPOINT))
    assert result.stdout == "cluster-answers-on-vip\n"
    assert h.calls("kubeadm") == []
    assert not (h.root / "etc/kubernetes/admin.conf").exists()
    assert [call[-1] for call in h.calls("curl")] == [f"https://{VIP}:6443/readyz"]


def test_init_leaves_a_half_initialised_node_alone(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    init_harness(h, cfg)
    h.write("/etc/kubernetes/admin.conf", f"clusters:\n- cluster:\n    server: https://{VIP}:6443\n")
    result = failed(h.run(k8s.INIT_ENTRYPOINT))
    assert "Not running kubeadm init over it" in result.stderr
    assert h.calls("kubeadm") == []
    # Bounded: 120 s of 5 s polls of the local API server, then one look at the VIP.
    assert len(h.calls("sleep")) == k8s.API_WAIT_SECONDS // 5


def test_init_failure_shows_redacted_output(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    init_harness(h, cfg)
    h.set_state("init-fails")
    result = failed(h.run(k8s.INIT_ENTRYPOINT))
    assert "kubeadm init failed" in result.stderr
    assert "--token <redacted-token> --certificate-key <redacted-hex>" in result.stderr
    assert "error execution phase wait-control-plane" in result.stderr
    no_secrets(result)


def test_init_checks_that_admin_conf_points_at_the_vip(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    init_harness(h, cfg)
    h.set_state("admin-server", "https://10.3.60.51:6443")
    result = failed(h.run(k8s.INIT_ENTRYPOINT))
    assert "controlPlaneEndpoint was not applied" in result.stderr


# ------------------------------------------------------------------ refresh-join-material.sh


def make_ca(h: ShellHarness, key_type: str) -> Path:
    ca = h.root / "etc/kubernetes/pki/ca.crt"
    ca.parent.mkdir(parents=True, exist_ok=True)
    key_args = ["-newkey", "rsa:2048"] if key_type == "rsa" else ["-newkey", "ec", "-pkeyopt",
                                                                   "ec_paramgen_curve:P-256"]
    subprocess.run(
        ["openssl", "req", "-x509", *key_args, "-nodes", "-keyout", str(h.base / "ca.key"), "-out", str(ca),
         "-subj", "/CN=kubernetes", "-days", "1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return ca


def _der_header(der: bytes, offset: int) -> tuple[int, int]:
    """(header length, content length) of the DER element at offset."""
    first = der[offset + 1]
    if first < 0x80:
        return 2, first
    count = first & 0x7F
    return 2 + count, int.from_bytes(der[offset + 2 : offset + 2 + count], "big")


def spki_sha256(pem: str) -> str:
    """kubeadm's CA pin computed independently of openssl: sha256 of the certificate's SubjectPublicKeyInfo."""
    der = base64.b64decode("".join(line for line in pem.splitlines() if not line.startswith("-----")))
    header, _ = _der_header(der, 0)  # Certificate
    position = header
    header, _ = _der_header(der, position)  # tbsCertificate
    position += header
    if der[position] == 0xA0:  # [0] version
        header, length = _der_header(der, position)
        position += header + length
    for _ in range(5):  # serialNumber, signature, issuer, validity, subject
        header, length = _der_header(der, position)
        position += header + length
    header, length = _der_header(der, position)  # subjectPublicKeyInfo
    return "sha256:" + hashlib.sha256(der[position : position + header + length]).hexdigest()


def refresh_harness(h: ShellHarness, cfg: LabConfig, key_type: str = "rsa") -> Path:
    h.install_step(k8s.refresh_files(cfg, TEST_TOKEN, TEST_CERTIFICATE_KEY))
    h.write("/etc/kubernetes/admin.conf", f"clusters:\n- cluster:\n    server: https://{VIP}:6443\n")
    h.set_state("api/127.0.0.1")
    return make_ca(h, key_type)


@pytest.mark.parametrize("key_type", ["rsa", "ec"])
def test_refresh_reuploads_certs_creates_the_token_once_and_prints_the_ca_hash(
    harness: ShellHarness, cfg: LabConfig, key_type: str
) -> None:
    h = harness
    ca = refresh_harness(h, cfg, key_type)
    config = str(h.step / "kubeadm-init.yaml")
    admin = str(h.root / "etc/kubernetes/admin.conf")

    result = ok(h.run(k8s.REFRESH_ENTRYPOINT))
    assert result.stdout == spki_sha256(ca.read_text()) + "\n"
    assert re.fullmatch(r"sha256:[0-9a-f]{64}\n", result.stdout)
    assert h.calls_matching("kubeadm", "init", "phase", "upload-certs") == [
        ["kubeadm", "init", "phase", "upload-certs", "--upload-certs", "--config", config, "--kubeconfig", admin]
    ]
    assert h.calls_matching("kubeadm", "token", "create") == [
        ["kubeadm", "token", "create", "--config", config, "--kubeconfig", admin]
    ]
    no_secrets(result)

    # Again, before the next join: certificates re-uploaded (2 h expiry), the live token kept.
    h.reset_log()
    again = ok(h.run(k8s.REFRESH_ENTRYPOINT))
    assert again.stdout == result.stdout
    assert len(h.calls_matching("kubeadm", "init", "phase", "upload-certs")) == 1
    assert h.calls_matching("kubeadm", "token", "create") == []
    assert h.calls_matching("kubeadm", "token", "list")


def test_refresh_recreates_a_token_about_to_expire(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    refresh_harness(h, cfg)
    soon = subprocess.run(["date", "-u", "-d", "+30 minutes", "+%Y-%m-%dT%H:%M:%SZ"], capture_output=True, text=True,
                          check=True).stdout.strip()
    h.set_state("tokens", f"{TEST_TOKEN}   29m   {soon}   authentication,signing   labs-k8s   system:bootstrappers\n")
    ok(h.run(k8s.REFRESH_ENTRYPOINT))
    assert len(h.calls_matching("kubeadm", "token", "create")) == 1


def test_refresh_ignores_other_tokens(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    refresh_harness(h, cfg)
    h.set_state("tokens", "zzzzzz.0123456789abcdef   23h   2099-01-01T00:00:00Z   authentication,signing   other\n")
    ok(h.run(k8s.REFRESH_ENTRYPOINT))
    assert len(h.calls_matching("kubeadm", "token", "create")) == 1


def test_refresh_needs_an_initialised_node(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    h.install_step(k8s.refresh_files(cfg, TEST_TOKEN, TEST_CERTIFICATE_KEY))
    result = failed(h.run(k8s.REFRESH_ENTRYPOINT))
    assert "kubeadm init has not run on this node" in result.stderr
    assert result.stdout == ""
    assert h.calls("kubeadm") == []


def test_refresh_fails_when_the_certificates_cannot_be_uploaded(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    refresh_harness(h, cfg)
    h.set_state("upload-certs-exit", "1")
    result = failed(h.run(k8s.REFRESH_ENTRYPOINT))
    assert "upload-certs failed" in result.stderr
    assert result.stdout == ""


# ------------------------------------------------------------------ join-*.sh

CA_HASH = "sha256:" + "5c" * 32


@pytest.mark.parametrize("role", ["worker", "control-plane"])
def test_join_runs_once_with_the_ca_hash(harness: ShellHarness, cfg: LabConfig, role: str) -> None:
    h = harness
    if role == "worker":
        files = k8s.worker_join_files(cfg, cfg.workers[0], TEST_TOKEN)
        entrypoint = k8s.WORKER_JOIN_ENTRYPOINT
    else:
        files = k8s.control_plane_join_files(cfg, cfg.control_planes[1], TEST_TOKEN, TEST_CERTIFICATE_KEY)
        entrypoint = k8s.CONTROL_PLANE_JOIN_ENTRYPOINT
    h.install_step(files)
    h.set_state(f"api/{VIP}")

    result = ok(h.run(entrypoint, CA_HASH))
    assert result.stdout == "joined\n"
    final = h.step / "kubeadm-join.final.yaml"
    assert h.calls("kubeadm") == [["kubeadm", "join", "--config", str(final)]]
    assert f'- "{CA_HASH}"' in final.read_text()
    assert k8s.CA_CERT_HASH_PLACEHOLDER not in final.read_text()
    assert modes(final) == 0o600
    assert (h.root / "root/.kube/config").exists() == (role == "control-plane")
    no_secrets(result)

    h.reset_log()
    again = ok(h.run(entrypoint, CA_HASH))
    assert again.stdout == "already-joined\n"
    assert h.calls("kubeadm") == []


@pytest.mark.parametrize("argument", [None, "sha256:abc", "sha1:" + "5c" * 20, CA_HASH + "; reboot"])
def test_join_refuses_a_missing_or_malformed_ca_hash(
    harness: ShellHarness, cfg: LabConfig, argument: str | None
) -> None:
    h = harness
    h.install_step(k8s.worker_join_files(cfg, cfg.workers[0], TEST_TOKEN))
    h.set_state(f"api/{VIP}")
    result = failed(h.run(k8s.WORKER_JOIN_ENTRYPOINT, *([argument] if argument is not None else [])))
    assert "sha256:<64 hex digits>" in result.stderr
    assert h.calls("kubeadm") == []


def test_join_waits_for_the_vip_then_gives_up(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    h.install_step(k8s.worker_join_files(cfg, cfg.workers[1], TEST_TOKEN))
    result = failed(h.run(k8s.WORKER_JOIN_ENTRYPOINT, CA_HASH))
    assert f"no API server answers on https://{VIP}:6443" in result.stderr
    assert h.calls("kubeadm") == []
    assert len(h.calls("sleep")) == k8s.API_WAIT_SECONDS // 5


def test_failed_join_says_how_to_retry(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    h.install_step(k8s.control_plane_join_files(cfg, cfg.control_planes[2], TEST_TOKEN, TEST_CERTIFICATE_KEY))
    h.set_state(f"api/{VIP}")
    h.set_state("join-fails")
    result = failed(h.run(k8s.CONTROL_PLANE_JOIN_ENTRYPOINT, CA_HASH))
    assert "kubeadm reset -f" in result.stderr and "etcdctl member list" in result.stderr
    assert not (h.root / "etc/kubernetes/kubelet.conf").exists()
    no_secrets(result)


# ------------------------------------------------------------------ apply-flannel.sh


def test_flannel_is_applied_and_its_rollout_awaited(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    h.install_step(k8s.flannel_files(cfg))
    h.write("/etc/kubernetes/admin.conf", f"clusters:\n- cluster:\n    server: https://{VIP}:6443\n")
    result = ok(h.run(k8s.FLANNEL_ENTRYPOINT))
    assert result.stdout == "flannel-ready\n"
    assert h.calls_matching("kubectl", "apply", "-f", str(h.step / "kube-flannel.yml"))
    assert h.calls_matching("kubectl", "rollout", "status", "daemonset/kube-flannel-ds", "--timeout=300s")
    assert '"Network": "10.244.0.0/16"' in (h.step / "kube-flannel.yml").read_text()

    h.set_state("kubectl/rollout-exit", "1")
    result = failed(h.run(k8s.FLANNEL_ENTRYPOINT))
    assert "did not roll out within 300s" in result.stderr
    assert "CrashLoopBackOff" in result.stderr


# ------------------------------------------------------------------ verify-cluster.sh

# Two member IDs that a double cannot tell apart: the leader check must not rely on jq numbers.
ETCD_IDS = (10276657743932975437, 10276657743932975438, 4392718472123456789)


def etcd_status(ids: tuple[int, ...], leaders: tuple[int, ...], terms: tuple[int, ...]) -> str:
    """`etcdctl endpoint status --cluster -w json` as etcd prints it: 64-bit IDs as bare numbers."""
    members = [
        f'{{"Endpoint":"https://10.3.60.5{i + 1}:2379","Status":{{"header":{{"cluster_id":17237436991929493444,'
        f'"member_id":{member},"revision":812,"raft_term":{terms[i]}}},"version":"3.6.6",'
        f'"dbSize":4096000,"leader":{leaders[i]},"raftIndex":900,"raftTerm":{terms[i]}}}}}'
        for i, member in enumerate(ids)
    ]
    return "[" + ",".join(members) + "]"


def etcd_health(healthy: tuple[bool, ...]) -> str:
    return json.dumps([{"endpoint": f"https://10.3.60.5{i + 1}:2379", "health": ok_, "took": "9ms"}
                       for i, ok_ in enumerate(healthy)])


def healthy_cluster(h: ShellHarness, cfg: LabConfig, timeout: int = 30) -> None:
    files = k8s.verify_files(cfg)
    files[k8s.PARAMS_FILE] = files[k8s.PARAMS_FILE].replace(
        f"VERIFY_TIMEOUT_SECONDS={k8s.VERIFY_TIMEOUT_SECONDS}", f"VERIFY_TIMEOUT_SECONDS={timeout}"
    )
    h.install_step(files)
    h.write("/etc/kubernetes/admin.conf", f"clusters:\n- cluster:\n    server: https://{VIP}:6443\n")
    h.set_state(f"api/{VIP}")
    h.set_state("kubectl/nodes", "".join(f"{n.name}=True\n" for n in cfg.kubernetes_nodes))
    pods = [f"{c}-{n.name}=Running" for n in cfg.control_planes
            for c in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd")]
    pods += ["coredns-7c65d6cfc9-abcde=Running", "kube-proxy-xyz12=Running"]
    h.set_state("kubectl/pods", "\n".join(pods) + "\n")
    h.set_state("kubectl/coredns", "True")
    h.set_state("kubectl/etcd-status", etcd_status(ETCD_IDS, leaders=(ETCD_IDS[1],) * 3, terms=(4, 4, 4)))
    h.set_state("kubectl/etcd-health", etcd_health((True, True, True)))


def test_verify_accepts_a_complete_cluster(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    healthy_cluster(h, cfg)
    result = ok(h.run(k8s.VERIFY_ENTRYPOINT))
    assert result.stdout == "cluster-ok\n"
    assert h.calls("sleep") == []
    status = h.calls_matching("kubectl", "endpoint", "status", "--cluster", "-w", "json")
    assert status and "etcd-labs-k8s-m01" in status[0] and "--cacert=/etc/kubernetes/pki/etcd/ca.crt" in status[0]
    assert h.calls_matching("curl", f"https://{VIP}:6443/readyz")


def test_verify_lists_exactly_what_is_missing(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    healthy_cluster(h, cfg, timeout=30)
    h.set_state("kubectl/nodes", "labs-k8s-m01=True\nlabs-k8s-m02=True\nlabs-k8s-m03=True\nlabs-k8s-w01=False\n")
    pods = (h.state / "kubectl/pods").read_text().replace("kube-scheduler-labs-k8s-m03=Running",
                                                           "kube-scheduler-labs-k8s-m03=Pending")
    h.set_state("kubectl/pods", pods)
    h.set_state("kubectl/coredns", "False")
    # Two members claim leadership, on two terms, one endpoint unhealthy, one missing.
    h.set_state("kubectl/etcd-status", etcd_status(ETCD_IDS[:2], leaders=ETCD_IDS[:2], terms=(4, 5)))
    h.set_state("kubectl/etcd-health", etcd_health((True, False, True)))
    h.set_state("kubectl/etcd-health-exit", "1")
    h.clear_state(f"api/{VIP}")

    result = failed(h.run(k8s.VERIFY_ENTRYPOINT))
    assert result.stdout == ""
    for line in (
        "node labs-k8s-w01 is not Ready (Ready=False)",
        "node labs-k8s-w02 is not registered",
        "pod kube-system/kube-scheduler-labs-k8s-m03 is Pending, not Running",
        "deployment kube-system/coredns is not Available (Available=False)",
        "etcd has 2 members answering, expected 3 (one per control plane)",
        "etcd has 2 members that are leader, expected exactly 1",
        "etcd members disagree on the leader (2 different leaders reported)",
        "etcd members are on 2 different raft terms",
        "etcd endpoints not healthy: https://10.3.60.52:2379",
        f"the API does not answer through the VIP (https://{VIP}:6443/readyz)",
    ):
        assert f"  - {line}\n" in result.stderr, line
    assert "labs-k8s-w01 is not registered" not in result.stderr
    # Bounded: 30 s of 10 s polls.
    assert len(h.calls("sleep")) == 3


def test_verify_waits_for_a_cluster_that_is_still_converging(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    healthy_cluster(h, cfg, timeout=60)
    ready = (h.state / "kubectl/nodes").read_text()
    h.set_state("kubectl/nodes-ready", ready)
    h.set_state("kubectl/nodes", ready.replace("labs-k8s-w02=True", "labs-k8s-w02=False"))
    # The node turns Ready during the first wait.
    h.stub("sleep", 'cp "$STATE/kubectl/nodes-ready" "$STATE/kubectl/nodes"')
    result = ok(h.run(k8s.VERIFY_ENTRYPOINT))
    assert result.stdout == "cluster-ok\n"
    assert len(h.calls("sleep")) == 1


# ------------------------------------------------------------------ drain-node.sh


def drain_harness(h: ShellHarness, cfg: LabConfig, node: str = "labs-k8s-w02") -> None:
    h.install_step(k8s.drain_files(cfg, node))
    h.write("/etc/kubernetes/admin.conf", f"clusters:\n- cluster:\n    server: https://{VIP}:6443\n")
    h.set_state(f"kubectl/nodes.d/{node}")


def test_drain_evicts_then_deletes_the_node(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    drain_harness(h, cfg)
    result = ok(h.run(k8s.DRAIN_ENTRYPOINT))
    assert result.stdout == "drained\n"
    drains = h.calls_matching("kubectl", "drain", "labs-k8s-w02")
    assert len(drains) == 1
    for flag in ("--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout=180s"):
        assert flag in drains[0]
    assert "--disable-eviction" not in drains[0]
    assert h.calls_matching("kubectl", "delete", "node", "labs-k8s-w02", "--ignore-not-found")
    assert not (h.state / "kubectl/nodes.d/labs-k8s-w02").exists()


def test_drain_falls_back_to_deleting_pods_when_eviction_is_blocked(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    drain_harness(h, cfg)
    h.set_state("kubectl/drain-exit", "1")
    result = ok(h.run(k8s.DRAIN_ENTRYPOINT))
    assert result.stdout == "drained\n"
    drains = h.calls_matching("kubectl", "drain", "labs-k8s-w02")
    assert len(drains) == 2 and "--disable-eviction" in drains[1]
    assert h.calls_matching("kubectl", "delete", "node", "labs-k8s-w02")

    # Even when that fails too, the Node goes: the VM is leaving anyway.
    h.set_state("kubectl/nodes.d/labs-k8s-w02")
    h.set_state("kubectl/drain-force-exit", "1")
    result = ok(h.run(k8s.DRAIN_ENTRYPOINT))
    assert "did not drain within the time allowed" in result.stderr
    assert not (h.state / "kubectl/nodes.d/labs-k8s-w02").exists()


def test_drain_is_harmless_for_a_node_already_gone(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    drain_harness(h, cfg)
    h.clear_state("kubectl/nodes.d/labs-k8s-w02")
    result = ok(h.run(k8s.DRAIN_ENTRYPOINT))
    assert result.stdout == "already-gone\n"
    assert h.calls_matching("kubectl", "drain") == [] and h.calls_matching("kubectl", "delete") == []


def test_drain_skips_everything_during_teardown(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    drain_harness(h, cfg)
    h.write("/var/lib/labs-k8s/teardown", "")
    result = ok(h.run(k8s.DRAIN_ENTRYPOINT))
    assert result.stdout == "skipped-teardown\n"
    assert h.calls("kubectl") == []


def test_drain_fails_clearly_when_the_api_is_unreachable(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    drain_harness(h, cfg)
    h.set_state("kubectl/unreachable")
    result = failed(h.run(k8s.DRAIN_ENTRYPOINT))
    assert "cannot ask the API about node labs-k8s-w02" in result.stderr
    assert "/var/lib/labs-k8s/teardown" in result.stderr
    assert h.calls_matching("kubectl", "drain") == []


# ------------------------------------------------------------------ print-kubeconfig.sh


def test_print_kubeconfig_prints_admin_conf_only_when_it_points_at_the_vip(
    harness: ShellHarness, cfg: LabConfig
) -> None:
    h = harness
    h.install_step(k8s.kubeconfig_files(cfg))
    admin = (
        "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: AAAA\n"
        f"    server: https://{VIP}:6443\n  name: labs-k8s\nusers:\n- name: kubernetes-admin\n"
    )
    h.write("/etc/kubernetes/admin.conf", admin)
    assert ok(h.run(k8s.KUBECONFIG_ENTRYPOINT)).stdout == admin

    h.write("/etc/kubernetes/admin.conf", admin.replace(VIP, "10.3.60.51"))
    result = failed(h.run(k8s.KUBECONFIG_ENTRYPOINT))
    assert result.stdout == ""
    assert "points at 'https://10.3.60.51:6443', expected https://10.3.60.100:6443" in result.stderr


def test_scripts_refuse_to_run_without_root_outside_the_harness(cfg: LabConfig) -> None:
    """Without LABS_K8S_ROOT (a real node), a non-root user is turned away before anything runs."""
    require_tool("bash")
    as_root = os.geteuid() == 0
    if as_root:
        require_tool("setpriv")
    directory = Path(tempfile.mkdtemp(prefix="labs-k8s-nonroot-"))
    try:
        directory.chmod(0o755)
        for name, text in k8s.kubeconfig_files(cfg).items():
            (directory / name).write_text(text)
            (directory / name).chmod(0o644)
        drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if as_root else []
        result = subprocess.run([*drop, "bash", f"./{k8s.KUBECONFIG_ENTRYPOINT}"], cwd=directory,
                                capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, check=False)
    finally:
        shutil.rmtree(directory)
    assert result.returncode != 0
    assert "must run as root" in result.stderr
    assert result.stdout == ""
