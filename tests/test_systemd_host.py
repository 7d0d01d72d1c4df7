"""A box host with systemd as PID 1 (tests/systemd_host.py), booted from the sealed template rootfs:
systemd boots it, makes the slices and scopes the kubelet and runc ask it for inside the host's own
cgroups, the kubelet's kernel tunables land in the host's files, and no machine-wide setting moves."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.firstboot import sealed_rootfs
from tests.labs import make_lab_config
from tests.requirements import require_root, require_tool
from tests.systemd_host import KUBELET_SYSCTLS, SystemdHost, hierarchies

# Units a container has no business running, and why they fail in one (none is ours): systemd's
# own conditions keep most of them quiet; these are what a booted box host lists as failed.
EXPECTED_FAILED: dict[str, str] = {}
# sysctl -a keys left out: counters that move by themselves on a busy machine; net.*, per network
# namespace (the box beside the suite adds and removes interface keys in the machine's); and the
# fs.protected_* that the stand-in lab box's hosts still set machine-wide (tests/tools/box/init.sh's
# `sysctl --system`): they go from this list when the lab box's hosts are these.
VOLATILE = re.compile(
    r"^(fs\.(dentry-state|inode-nr|inode-state|file-nr|aio-nr|quota\..*|protected_.*)"
    r"|kernel\.(ns_last_pid|random\..*|pty\.nr)|net\..*|vm\.(nr_.*|stat_refresh)|fs\.fanotify\..*count.*) = ",
    re.M,
)


def settings(sysctl_a: str) -> dict[str, str]:
    """`sysctl -a`'s settings, less the counters that move by themselves."""
    lines = (line for line in sysctl_a.splitlines() if " = " in line and not VOLATILE.match(line))
    return dict(line.split(" = ", 1) for line in lines)


def machine_sysctls() -> dict[str, str]:
    return settings(subprocess.run(["sysctl", "-a"], capture_output=True, text=True, check=False).stdout)


@pytest.fixture
def host(tmp_path: Path) -> Iterator[SystemdHost]:
    require_root()
    require_tool("unshare", "nsenter", "sysctl")
    host = SystemdHost("m01", sealed_rootfs(make_lab_config()), tmp_path / "host")
    try:
        yield host
    finally:
        host.stop()


def test_systemd_boots_the_template_and_makes_the_kubelets_slices_in_the_hosts_cgroup(host: SystemdHost) -> None:
    before = machine_sysctls()
    host.start()
    state = host.wait_booted()
    assert state in ("running", "degraded"), state
    failed = [unit for unit in host.failed_units() if unit not in EXPECTED_FAILED]
    assert not failed, {unit: host.run("systemctl", "status", unit, "--no-pager").stdout for unit in failed}
    # What the kubelet's and runc's systemd cgroup driver ask for: a unit in a slice of kubepods.
    started = host.run("systemd-run", "--unit", "probe", "-p", "Slice=kubepods-besteffort.slice", "sleep", "300")
    assert started.returncode == 0, started.stderr
    pid = host.run("systemctl", "show", "-p", "MainPID", "--value", "probe").stdout.strip()
    assert pid.isdigit() and pid != "0", pid
    for hierarchy in ("systemd", "memory"):
        (group,) = [g for g in host.cgroups if g.parent.name == hierarchy]
        service = group / "kubepods.slice" / "kubepods-besteffort.slice" / "probe.service"
        assert service.is_dir(), sorted(p.name for p in group.iterdir())
        inside = host.run("cat", f"/sys/fs/cgroup/{hierarchy}/{service.relative_to(group)}/cgroup.procs")
        assert pid in inside.stdout.split(), inside
    # The kubelet's kernel tunables: written inside, kept in the host's files, the machine's untouched.
    for key, value in zip(KUBELET_SYSCTLS, ("1", "0", "10", "1", "1000000", "25000000"), strict=True):
        wrote = host.run("sysctl", "-w", f"{key}={value}")
        assert wrote.returncode == 0, wrote.stderr
        assert host.run("sysctl", "-n", key).stdout.strip() == value
        assert (host.directory / "sysctl" / key).read_text().strip() == value
    # Any other machine-wide setting is read-only in the host.
    refused = host.run("sysctl", "-w", "kernel.printk_ratelimit=7")
    assert refused.returncode != 0 and re.search("Read-only file system|permission denied", refused.stderr), refused
    # The network is the host's own namespace's: writable.
    assert host.run("sysctl", "-w", "net.ipv4.ip_forward=1").returncode == 0
    group = host.cgroups[0].name
    host.stop()
    after = machine_sysctls()
    assert {k: (v, after.get(k)) for k, v in before.items() if after.get(k) != v} == {}
    assert not [hierarchy for hierarchy in hierarchies() if (hierarchy / group).exists()]


def test_the_sysctl_comparison_sees_a_changed_setting_and_ignores_counters() -> None:
    """The check can fail: a setting that moved differs; a counter that moved does not."""
    before = settings("kernel.panic = 0\nfs.file-nr = 1 0 9\nnet.ipv4.ip_forward = 0\n")
    assert settings("kernel.panic = 10\nfs.file-nr = 5 0 9\n") != before
    assert settings("kernel.panic = 0\nfs.file-nr = 5 0 9\n") == before
