"""The k8s step scripts: shellcheck, and their guards, run against stand-in commands.

Each test lays out a step directory exactly as its bundle would (tests/shell_harness.py),
runs the script with a fake root prefix and stand-ins on PATH, then asserts on the logged
invocations (what was run, how often, with which arguments) and on the files written.
"""

from __future__ import annotations

import email.utils
import hashlib
import itertools
import os
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
from tests.shell_harness import TEST_CERTIFICATE_KEY, TEST_ENCRYPTION_KEY, TEST_TOKEN, ShellHarness, modes

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
        k8s.WORKER_JOIN_ENTRYPOINT, k8s.FLANNEL_ENTRYPOINT, k8s.VERIFY_ENTRYPOINT, k8s.LEAVE_ENTRYPOINT,
        k8s.TEARDOWN_ENTRYPOINT, k8s.KUBECONFIG_ENTRYPOINT, k8s.LIB_FILE, k8s.UPGRADE_CONTROL_PLANE_ENTRYPOINT,
        k8s.UPGRADE_WORKER_ENTRYPOINT, k8s.UPGRADE_DRAIN_ENTRYPOINT, k8s.UPGRADE_LIB_FILE,
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


@pytest.mark.parametrize(
    "script",
    [p for p in SCRIPTS if p.name not in (k8s.LIB_FILE, k8s.UPGRADE_LIB_FILE, k8s.CONTROL_PLANE_FILES_LIB)],
    ids=lambda path: path.name,
)
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
        step_bundle(
            "k8s-init", k8s.init_files(cfg, TEST_TOKEN, TEST_CERTIFICATE_KEY, TEST_ENCRYPTION_KEY), k8s.INIT_ENTRYPOINT
        ),
        step_bundle(
            "k8s-join",
            k8s.worker_join_files(cfg, cfg.workers[0], TEST_TOKEN),
            k8s.WORKER_JOIN_ENTRYPOINT,
            k8s.join_args("sha256:" + "ab" * 32),
        ),
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
    for package, version in (
        ("systemd-timesyncd", "252.39-1~deb12u1"),
        ("ca-certificates", "20230311"),
        ("ufw", "0.36.2-1"),
    ):
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
    for key in (
        "net.bridge.bridge-nf-call-iptables = 1",
        "net.bridge.bridge-nf-call-ip6tables = 1",
        "net.ipv4.ip_forward = 1",
    ):
        assert key in sysctl
    assert h.calls_matching("sysctl", "-p")

    # Swap: off now, gone from fstab, its units masked.
    assert h.calls_matching("swapoff", "-a")
    fstab = (h.root / "etc/fstab").read_text()
    assert "\n# labs-k8s: swap off for the kubelet: UUID=0b1c2d3e-0000-4000-8000-000000000002 none" in fstab
    assert [line for line in fstab.splitlines() if " swap " in line and not line.startswith("#")] == []
    assert h.calls_matching("systemctl", "mask", "dev-sda5.swap")
    assert h.calls_matching("systemctl", "mask", "swap.target")

    # ufw purged; time synced (which servers is node-settings' business: no drop-in written here).
    assert h.calls_matching("apt-get", "purge", "ufw")
    assert not (h.root / "etc/systemd/timesyncd.conf.d/labs-k8s.conf").exists()
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


def test_prepare_node_without_a_running_udevd_leaves_the_rule_for_it_to_read(
    harness: ShellHarness, cfg: LabConfig
) -> None:
    """udevadm control fails when no udevd runs (a container, the box's hosts): the rule is written and
    read by udevd when it starts; the step does not fail on a reload of nothing."""
    h = harness
    fresh_debian_node(h)
    h.stub("udevadm", 'if [[ $1 == control ]]; then echo "Failed to send reload request: No such file" >&2; exit 1; fi')
    h.install_step(k8s.prepare_files(cfg, cfg.workers[1]))
    ok(h.run(k8s.PREPARE_ENTRYPOINT))
    assert (h.root / "etc/udev/rules.d/90-labs-k8s-flannel-checksum.rules").is_file()
    assert h.calls_matching("udevadm", "control", "--reload") == []


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
    assert h.calls("mkfs.ext4") == [] and h.calls("mount") == []
    # The signing keys are fetched and checked again (a re-issued key is picked up), and unchanged.
    assert sorted(call[-1] for call in h.calls("curl")) == [
        "https://download.docker.com/linux/debian/gpg",
        "https://pkgs.k8s.io/core:/stable:/v1.36/deb/Release.key",
    ]
    for verb in ("restart", "start", "mask", "enable", "daemon-reload"):
        assert h.calls_matching("systemctl", verb) == [], verb
    assert h.calls_matching("apt-mark", "hold") == [] and h.calls_matching("udevadm", "control") == []
    # What it still does is re-assert state, harmlessly.
    assert h.calls_matching("swapoff", "-a") and h.calls_matching("containerd", "config", "dump")


def test_prepare_node_finishes_a_dpkg_run_an_earlier_attempt_left_interrupted(
    harness: ShellHarness, cfg: LabConfig
) -> None:
    """A prepare step cut off while dpkg worked (the VM powered off, the step's deadline) leaves dpkg
    "interrupted", and apt refuses every install until `dpkg --configure -a` (found by the lab in a
    box on the balancer step, tests/test_lab_box.py): the retry finishes it first, then installs."""
    h = harness
    fresh_debian_node(h)
    h.set_state("dpkg-interrupted", "")
    h.install_step(k8s.prepare_files(cfg, cfg.workers[0]))
    ok(h.run(k8s.PREPARE_ENTRYPOINT))
    assert call_index(h, "dpkg", "--configure", "-a") < call_index(h, "apt-get", "install")
    assert h.calls_matching("apt-get", "install", "kubeadm=1.36.0-1.1")


def test_prepare_node_reinstalls_a_package_dpkg_left_half_unpacked(harness: ShellHarness, cfg: LabConfig) -> None:
    """Cut off while dpkg unpacked a package, an earlier prepare left it reinst-required: `dpkg
    --configure -a` refuses it and apt's installs fail while it is so (the lab in a box's balancer,
    tests/test_interrupted_dpkg.py with the real dpkg). The retry reinstalls it at the version dpkg
    recorded, before the step's own installs."""
    h = harness
    fresh_debian_node(h)
    h.set_state("dpkg/containerd.io", "1.7.28-1~debian.12~bookworm")
    h.set_state("dpkg-reinstreq", "containerd.io\n")
    h.install_step(k8s.prepare_files(cfg, cfg.workers[0]))
    ok(h.run(k8s.PREPARE_ENTRYPOINT))
    reinstall = call_index(h, "apt-get", "install", "--reinstall", "containerd.io=1.7.28-1~debian.12~bookworm")
    assert call_index(h, "apt-get", "update") < reinstall < call_index(h, "apt-get", "install", "kubeadm=1.36.0-1.1")
    assert (h.state / "dpkg-reinstreq").read_text() == ""


def test_prepare_node_control_plane_puts_etcd_on_the_data_disk(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    fresh_debian_node(h, data_disk_gib=20)
    h.install_step(k8s.prepare_files(cfg, cfg.control_planes[0]))
    ok(h.run(k8s.PREPARE_ENTRYPOINT))
    assert h.calls("mkfs.ext4") == [["mkfs.ext4", "-q", "-L", "labs-etcd", "/dev/sdb"]]
    assert f"UUID={DATA_UUID} /var/lib/etcd ext4 defaults,noatime,nofail 0 2\n" in (h.root / "etc/fstab").read_text()
    assert modes(h.root / "var/lib/etcd") == 0o700
    # The new filesystem's empty lost+found is gone: kubeadm's preflight DirAvailable--var-lib-etcd
    # refuses a /var/lib/etcd that holds anything (cloud-init's path, data-disk-ready.sh, does the same).
    assert list((h.root / "var/lib/etcd").iterdir()) == []
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
        (
            f"/dev/sda disk {20 * GIB} 0\n/dev/sdb disk {50 * GIB} 0\n/dev/sdc disk {50 * GIB} 0\n",
            {},
            "found 2 (/dev/sdb /dev/sdc)",
        ),
        (f"/dev/sda disk {20 * GIB} 0\n/dev/sdb disk {40 * GIB} 0\n", {}, "found 0 (none)"),
        (
            f"/dev/sda disk {20 * GIB} 0\n/dev/sdb disk {50 * GIB} 0\n",
            {"fs/sdb.pttype": "gpt\n"},
            "has a partition table but no filesystem",
        ),
        (
            f"/dev/sda disk {20 * GIB} 0\n/dev/sdb disk {50 * GIB} 0\n",
            {"fs/sdb.type": "ntfs\n"},
            "already holds a ntfs filesystem",
        ),
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
    h.set_state(
        "containerd-dump",
        (REAL_DUMP_2X if dump == "2x" else REAL_DUMP_1X).replace("SystemdCgroup = true", "SystemdCgroup = false"),
    )
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
    assert (
        "the Kubernetes repository https://pkgs.k8s.io/core:/stable:/v1.36/deb/ "
        "(labs-k8s:mirrors.kubernetesRepository.url) has no kubeadm 1.36.9"
    ) in result.stderr
    assert "1.36.1-1.1" in result.stderr
    assert h.calls_matching("apt-get", "install", "kubeadm=1.36.9-1.1") == []


def test_prepare_node_leaves_a_joined_node_at_its_version_for_the_upgrade_steps(harness: ShellHarness) -> None:
    """A new labs-k8s:kubernetes.version reaches a running node through the upgrade steps, drained and
    in order; its prepare step (which runs first) prepares it for the version it runs meanwhile."""
    h = harness
    fresh_debian_node(h)
    for package in ("kubeadm", "kubelet", "kubectl"):
        h.set_state(f"dpkg/{package}", "1.35.2-1.1")
        h.set_state(f"repo/{package}", "1.36.0-1.1\n1.35.2-1.1\n")
    h.write("/etc/kubernetes/kubelet.conf", "kubelet\n")
    for plugin in ("bridge", "host-local", "loopback", "portmap"):
        h.write(f"/opt/cni/bin/{plugin}", "").chmod(0o755)
    cfg = make_lab_config(kubernetes={"version": "1.36.0"})
    h.install_step(k8s.prepare_files(cfg, cfg.workers[0]))
    result = ok(h.run(k8s.PREPARE_ENTRYPOINT))
    assert "runs kubelet 1.35.2 in the cluster; labs-k8s:kubernetes.version 1.36.0 comes with the upgrade steps" in (
        result.stderr
    )
    pinned = ("kubeadm=", "kubelet=", "kubectl=")
    assert not [call for call in h.calls("apt-get") if any(arg.startswith(pinned) for arg in call)]
    kubernetes_list = (h.root / "etc/apt/sources.list.d/kubernetes.list").read_text()
    assert "https://pkgs.k8s.io/core:/stable:/v1.35/deb/ /" in kubernetes_list
    assert h.calls_matching("kubeadm", "config", "images", "list", "--kubernetes-version", "v1.35.2")

    # Half-way through its own upgrade (kubeadm and the repository already at 1.36, the kubelet not
    # yet), a prepare step that runs again takes nothing back: the upgrade step finishes the job.
    h.set_state("dpkg/kubeadm", "1.36.0-1.1")
    new_list = kubernetes_list.replace("v1.35", "v1.36")
    h.write("/etc/apt/sources.list.d/kubernetes.list", new_list)
    h.reset_log()
    ok(h.run(k8s.PREPARE_ENTRYPOINT))
    assert (h.state / "dpkg/kubeadm").read_text() == "1.36.0-1.1"
    assert (h.root / "etc/apt/sources.list.d/kubernetes.list").read_text() == new_list
    assert not [call for call in h.calls("apt-get") if any(arg.startswith(pinned) for arg in call)]


def test_prepare_node_uses_the_configured_mirrors(harness: ShellHarness) -> None:
    h = harness
    from tests.test_config import _test_ca

    ca = _test_ca()
    cfg = make_lab_config(
        mirrors={
            "aptProxy": "http://apt.labs.local:3142",
            "registryMirror": "https://registry.labs.local:5000",
            "registryMirrorCa": ca,
        }
    )
    fresh_debian_node(h)
    h.install_step(k8s.prepare_files(cfg, cfg.workers[0]))
    ok(h.run(k8s.PREPARE_ENTRYPOINT))
    proxy = (h.root / "etc/apt/apt.conf.d/90labs-k8s-proxy").read_text()
    assert 'Acquire::http::Proxy "http://apt.labs.local:3142";' in proxy
    assert 'Acquire::https::Proxy "http://apt.labs.local:3142";' in proxy
    assert all("--proxy" in call and "http://apt.labs.local:3142" in call for call in h.calls("curl"))
    hosts = (h.root / "etc/containerd/certs.d/_default/hosts.toml").read_text()
    assert '[host."https://registry.labs.local:5000"]' in hosts and '"pull", "resolve"' in hosts
    # The mirror's CA, pinned as apt's mirrors pin their keys (issue 50): containerd reads it for that host.
    assert '  ca = "/etc/containerd/certs.d/_default/registry-mirror-ca.crt"' in hosts
    assert ca in (h.root / "etc/containerd/certs.d/_default/registry-mirror-ca.crt").read_text()

    # Dropping the mirrors from the config removes what this project wrote, and only that.
    plain = make_lab_config()
    h.install_step(k8s.prepare_files(plain, plain.workers[0]))
    h.reset_log()
    ok(h.run(k8s.PREPARE_ENTRYPOINT))
    assert not (h.root / "etc/apt/apt.conf.d/90labs-k8s-proxy").exists()
    assert not (h.root / "etc/containerd/certs.d/_default/hosts.toml").exists()
    assert not (h.root / "etc/containerd/certs.d/_default/registry-mirror-ca.crt").exists()
    assert len(h.calls_matching("systemctl", "restart", "containerd")) == 1


# An air-gapped site's mirror (Artifactory, Nexus, aptly) re-signs what it serves with its own key.
MIRROR_KUBERNETES = "https://artifactory.lab.local/artifactory/k8s-stable"
MIRROR_CONTAINERD = "https://artifactory.lab.local/artifactory/docker-debian"
MIRROR_KEY = "5A3B1C0F9E8D7C6B5A4F3E2D1C0B9A8F7E6D5C4B"
MIRRORS = {
    "kubernetesRepository": {"url": MIRROR_KUBERNETES, "keyFingerprint": MIRROR_KEY},
    "containerdRepository": {"url": MIRROR_CONTAINERD + "/", "keyFingerprint": MIRROR_KEY.lower()},
}


def test_prepare_node_installs_from_the_configured_repositories_with_their_keys(harness: ShellHarness) -> None:
    h = harness
    cfg = make_lab_config(mirrors=MIRRORS)
    fresh_debian_node(h)
    for repo in ("docker", "kubernetes"):
        h.set_state(f"gpg-fpr-{repo}", MIRROR_KEY)  # the keys the mirror serves are its own
    h.install_step(k8s.prepare_files(cfg, cfg.workers[0]))
    result = ok(h.run(k8s.PREPARE_ENTRYPOINT))

    # The keys come from the mirror, checked against the configured fingerprint.
    assert sorted(call[-1] for call in h.calls("curl")) == [
        f"{MIRROR_CONTAINERD}/gpg",
        f"{MIRROR_KUBERNETES}/v1.36/deb/Release.key",
    ]
    assert f"fingerprint {MIRROR_KEY} alone, from {MIRROR_CONTAINERD}/gpg" in result.stderr
    assert f"fingerprint {MIRROR_KEY} alone, from {MIRROR_KUBERNETES}/v1.36/deb/Release.key" in result.stderr
    # apt's sources name the mirror, each with the keyring of its own key.
    docker_list = (h.root / "etc/apt/sources.list.d/docker.list").read_text()
    assert (
        f"deb [arch=amd64 signed-by=/etc/apt/keyrings/docker.asc] {MIRROR_CONTAINERD} bookworm stable\n" in docker_list
    )
    kubernetes_list = (h.root / "etc/apt/sources.list.d/kubernetes.list").read_text()
    assert (
        f"deb [signed-by=/etc/apt/keyrings/kubernetes-apt-keyring.asc] {MIRROR_KUBERNETES}/v1.36/deb/ /\n"
    ) in kubernetes_list
    assert "pkgs.k8s.io" not in docker_list + kubernetes_list and "download.docker.com" not in docker_list
    assert h.calls_matching("apt-get", "install", "kubeadm=1.36.0-1.1", "kubelet=1.36.0-1.1", "kubectl=1.36.0-1.1")

    # Upstream's key served where the mirror's is pinned (a mirror not re-signing, or the wrong one): refused.
    h.clear_state("gpg-fpr-kubernetes")
    h.set_state("key-edition", " upstream")
    result = failed(h.run(k8s.PREPARE_ENTRYPOINT))
    assert (
        f"the key served by {MIRROR_KUBERNETES}/v1.36/deb/Release.key does not have the fingerprint {MIRROR_KEY}"
    ) in result.stderr


def test_prepare_node_names_the_configured_repository_when_a_release_is_missing(harness: ShellHarness) -> None:
    h = harness
    cfg = make_lab_config(mirrors=MIRRORS, kubernetes={"version": "1.36.9", "containerdVersion": "2.1.9"})
    fresh_debian_node(h)
    for repo in ("docker", "kubernetes"):
        h.set_state(f"gpg-fpr-{repo}", MIRROR_KEY)
    h.install_step(k8s.prepare_files(cfg, cfg.workers[0]))
    result = failed(h.run(k8s.PREPARE_ENTRYPOINT))
    assert (
        f"the containerd repository {MIRROR_CONTAINERD} (labs-k8s:mirrors.containerdRepository.url) "
        "has no containerd.io 2.1.9"
    ) in result.stderr

    h.set_state("repo/containerd.io", "2.1.9-1~debian.12~bookworm\n")
    result = failed(h.run(k8s.PREPARE_ENTRYPOINT))
    assert (
        f"the Kubernetes repository {MIRROR_KUBERNETES}/v1.36/deb/ (labs-k8s:mirrors.kubernetesRepository.url) "
        "has no kubeadm 1.36.9"
    ) in result.stderr


def test_prepare_node_refuses_a_docker_key_with_another_fingerprint(harness: ShellHarness, cfg: LabConfig) -> None:
    h = harness
    fresh_debian_node(h)
    h.set_state("gpg-fpr-docker", "0000000000000000000000000000000000000000")
    h.install_step(k8s.prepare_files(cfg, cfg.workers[0]))
    result = failed(h.run(k8s.PREPARE_ENTRYPOINT))
    assert "does not have the fingerprint 9DC858229FC7DD38854AE2D88D81803C0EBFCD88" in result.stderr
    assert not (h.root / "etc/apt/keyrings/docker.asc").exists()


def test_prepare_node_fetches_and_checks_the_signing_keys_again_on_every_run(
    harness: ShellHarness, cfg: LabConfig
) -> None:
    """Upstream extends its keys (same fingerprint, other bytes): a later run installs the new
    ones, so an upgrade's `apt-get update` months on does not fail on an expired key. A key
    with another fingerprint is refused and the checked one stays; an unreachable upstream
    keeps the installed keys."""
    h = harness
    fresh_debian_node(h)
    h.install_step(k8s.prepare_files(cfg, cfg.workers[0]))
    ok(h.run(k8s.PREPARE_ENTRYPOINT))
    keyrings = h.root / "etc/apt/keyrings"
    first = {name: (keyrings / name).read_text() for name in ("docker.asc", "kubernetes-apt-keyring.asc")}

    h.set_state("key-edition", " extended 2027")
    result = ok(h.run(k8s.PREPARE_ENTRYPOINT))
    for name, old in first.items():
        assert (keyrings / name).read_text() == old.replace("\n-----END", " extended 2027\n-----END"), name
        assert f"installed /etc/apt/keyrings/{name}" in result.stderr
        assert modes(keyrings / name) == 0o644
    extended = {name: (keyrings / name).read_text() for name in first}

    h.set_state("offline")
    result = ok(h.run(k8s.PREPARE_ENTRYPOINT))
    assert "could not download https://download.docker.com/linux/debian/gpg to check it again" in result.stderr
    assert {name: (keyrings / name).read_text() for name in first} == extended
    h.clear_state("offline")

    h.set_state("gpg-fpr-docker", "0000000000000000000000000000000000000000")
    h.set_state("key-edition", " swapped")
    result = failed(h.run(k8s.PREPARE_ENTRYPOINT))
    assert "does not have the fingerprint 9DC858229FC7DD38854AE2D88D81803C0EBFCD88" in result.stderr
    assert {name: (keyrings / name).read_text() for name in first} == extended


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
    h.set_state("gpg-fpr-kubernetes", "1111111111111111111111111111111111111111")
    h.install_step(k8s.prepare_files(cfg, cfg.workers[0]))
    result = failed(h.run(k8s.PREPARE_ENTRYPOINT))
    assert "Release.key does not have the fingerprint DE15B14486CD377B9E876E1A234654DA9A296436" in result.stderr
    assert (h.root / "etc/apt/keyrings/docker.asc").exists()
    assert not (h.root / "etc/apt/keyrings/kubernetes-apt-keyring.asc").exists()
    assert h.calls_matching("apt-get", "install", "kubeadm=1.36.0-1.1") == []


# The cluster steps (init, refresh, joins, leave, teardown guard, flannel, verify, kubeconfig)
# are run against the modelled cluster in tests/test_k8s_convergence.py.


def test_scripts_refuse_to_run_without_root_outside_the_harness(cfg: LabConfig) -> None:
    """Without LABS_K8S_ROOT (a real node), a non-root user is turned away before anything runs."""
    require_tool("bash")
    as_root = os.geteuid() == 0
    if as_root:
        require_tool("setpriv")
    directory = Path(tempfile.mkdtemp(prefix="labs-k8s-nonroot-"))
    try:
        directory.chmod(0o755)
        for name, text in k8s.kubeconfig_files(cfg, "9f" * 32).items():
            (directory / name).write_text(text)
            (directory / name).chmod(0o644)
        drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if as_root else []
        result = subprocess.run(
            [*drop, "bash", f"./{k8s.KUBECONFIG_ENTRYPOINT}"],
            cwd=directory,
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin"},
            check=False,
        )
    finally:
        shutil.rmtree(directory)
    assert result.returncode != 0
    assert "must run as root" in result.stderr
    assert result.stdout == ""


# ------------------------------------------------------------------ prepare-node.sh: what the pinned keyring holds


class OpenPGPKeys:
    """Real OpenPGP keys made with gpg in a throwaway GNUPGHOME (no network, no agent left behind)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        home.mkdir(mode=0o700)

    def gpg(self, *args: str, stdin: str | None = None) -> str:
        result = subprocess.run(
            ["gpg", "--homedir", str(self.home), "--batch", "--quiet", *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    def make(self, name: str) -> str:
        """A new Ed25519 signing key; its primary fingerprint."""
        self.gpg("--passphrase", "", "--quick-gen-key", f"{name} <{name}@example.invalid>", "ed25519", "sign", "never")
        return primary_fingerprints_of(self.gpg("--armor", "--export", f"{name}@example.invalid"))[0]

    def armored(self, *fingerprints: str) -> str:
        return self.gpg("--armor", "--export", *fingerprints)

    def clearsign(self, fingerprint: str, text: str) -> str:
        return self.gpg("--local-user", fingerprint, "--clearsign", "--digest-algo", "SHA256", stdin=text)

    def close(self) -> None:
        subprocess.run(["gpgconf", "--homedir", str(self.home), "--kill", "all"], capture_output=True, check=False)


def primary_fingerprints_of(armored: str) -> list[str]:
    home = Path(tempfile.mkdtemp(prefix="gpg-show-"))
    try:
        listing = subprocess.run(
            ["gpg", "--homedir", str(home), "--batch", "--show-keys", "--with-colons"],
            input=armored,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        shutil.rmtree(home)
    records = [line.split(":") for line in listing.splitlines()]
    return [fpr[9] for pub, fpr in itertools.pairwise(records) if pub[0] == "pub" and fpr[0] == "fpr"]


@pytest.fixture
def openpgp_keys() -> Iterator[OpenPGPKeys]:
    require_tool("gpg", "gpgconf", "gpg-agent")
    # A short path: gpg-agent's socket lives in the home and a socket path is limited to 108 bytes.
    base = Path(tempfile.mkdtemp(prefix="labs-k8s-gpg-"))
    keys = OpenPGPKeys(base / "home")
    try:
        yield keys
    finally:
        keys.close()
        shutil.rmtree(base, ignore_errors=True)


def apt_update(tmp_path: Path, keyring: Path, repository: Path) -> subprocess.CompletedProcess[str]:
    """`apt-get update` of one flat file:// repository whose signed-by is `keyring`, in a scratch apt root."""
    apt_root = tmp_path / "apt-root"
    for directory in ("etc/apt/apt.conf.d", "etc/apt/preferences.d", "etc/apt/trusted.gpg.d",
                      "var/lib/apt/lists/partial", "var/cache/apt/archives/partial", "var/lib/dpkg"):  # fmt: skip
        (apt_root / directory).mkdir(parents=True, exist_ok=True)
    (apt_root / "var/lib/dpkg/status").touch()
    sources = apt_root / "etc/apt/sources.list"
    sources.write_text(f"deb [signed-by={keyring}] file://{repository} ./\n")
    return subprocess.run(
        ["apt-get", "update", "-o", f"Dir={apt_root}", "-o", f"Dir::State::status={apt_root}/var/lib/dpkg/status",
         "-o", "Dir::Etc::sourceparts=-", "-o", "APT::Sandbox::User=root", "-o", "Debug::NoLocking=1"],
        capture_output=True, text=True, check=False, timeout=120, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
    )  # fmt: skip


def signed_flat_repository(directory: Path, keys: OpenPGPKeys, signer: str) -> Path:
    """An empty flat apt repository whose InRelease is signed by `signer`."""
    directory.mkdir(parents=True)
    (directory / "Packages").write_text("")
    release = (
        "Origin: labs-k8s test\nLabel: labs-k8s test\nSuite: stable\nCodename: stable\n"
        f"Date: {email.utils.formatdate(usegmt=True)}\n"
        f"SHA256:\n {hashlib.sha256(b'').hexdigest()} 0 Packages\n"
    )
    (directory / "InRelease").write_text(keys.clearsign(signer, release))
    return directory


def test_prepare_node_keeps_only_the_pinned_key_of_a_served_file_with_two(
    harness: ShellHarness, cfg: LabConfig, openpgp_keys: OpenPGPKeys, tmp_path: Path
) -> None:
    """A served key file with the pinned key and another one (a compromised mirror or proxy adding
    its own): the keyring apt gets holds the pinned key alone, and apt refuses a repository signed
    by the other key while it accepts one signed by the pinned key. Real gpg, real apt (issue #30 §2)."""
    h, keys = harness, openpgp_keys
    pinned, other = keys.make("labs-k8s-pinned"), keys.make("labs-k8s-other")
    served = keys.armored(pinned, other)
    assert sorted(primary_fingerprints_of(served)) == sorted([pinned, other])
    fresh_debian_node(h)
    h.set_state("served-key.asc", served)
    h.stub(
        "curl",
        r"""
out=""; url=""
while (($#)); do case $1 in -o) out=$2; shift ;; http*) url=$1 ;; esac; shift; done
case $url in */gpg|*/Release.key) cp "$STATE/served-key.asc" "$out" ;; *) exit 6 ;; esac
""",
    )
    h.stub("gpg", f'exec {shutil.which("gpg")} "$@"')
    # Pin the test's key in place of Docker's and the Kubernetes project's (their private keys are not
    # ours), as a site whose mirror re-signs with its own key does.
    mirrors = {
        repository: {"keyFingerprint": pinned} for repository in ("containerdRepository", "kubernetesRepository")
    }
    pinning = make_lab_config(mirrors=mirrors)
    h.install_step(k8s.prepare_files(pinning, pinning.workers[0]))
    ok(h.run(k8s.PREPARE_ENTRYPOINT))

    require_tool("apt-get", "gpgv")
    keyrings = h.root / "etc/apt/keyrings"
    keyring = keyrings / "docker.asc"
    accepted = apt_update(
        tmp_path / "by-pinned", keyring, signed_flat_repository(tmp_path / "repo-pinned", keys, pinned)
    )
    assert accepted.returncode == 0 and "NO_PUBKEY" not in accepted.stdout + accepted.stderr, accepted.stderr
    refused = apt_update(tmp_path / "by-other", keyring, signed_flat_repository(tmp_path / "repo-other", keys, other))
    assert "NO_PUBKEY " + other[-16:] in refused.stdout + refused.stderr, refused.stdout + refused.stderr
    assert refused.returncode != 0 and "is not signed" in refused.stderr
    for name in ("docker.asc", "kubernetes-apt-keyring.asc"):
        assert primary_fingerprints_of((keyrings / name).read_text()) == [pinned], name
