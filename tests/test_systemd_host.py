"""A box host with systemd as PID 1 (tests/systemd_host.py), booted from the sealed template rootfs:
systemd boots it, makes the slices and scopes the kubelet and runc ask it for inside the host's own
cgroups, the kubelet's kernel tunables land in the host's files, and no machine-wide setting moves."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.firstboot import sealed_rootfs
from tests.labs import make_lab_config
from tests.machine_settings import changed, machine_sysctls, settings
from tests.requirements import require_root, require_tool
from tests.systemd_host import KUBELET_SYSCTLS, SystemdHost, hierarchies

# Units a container has no business running, and why they fail in one (none is ours): systemd's
# own conditions keep most of them quiet; these are what a booted box host lists as failed.
EXPECTED_FAILED: dict[str, str] = {}


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
    assert changed(before, machine_sysctls()) == {}
    assert not [hierarchy for hierarchy in hierarchies() if (hierarchy / group).exists()]


def test_the_sysctl_comparison_sees_a_changed_setting_and_ignores_counters() -> None:
    """The check can fail: a setting that moved differs; a counter that moved does not."""
    before = settings("kernel.panic = 0\nfs.file-nr = 1 0 9\nfs.protected_regular = 0\nnet.ipv4.ip_forward = 0\n")
    assert changed(before, settings("kernel.panic = 10\nfs.file-nr = 5 0 9\nfs.protected_regular = 0\n"))
    assert changed(before, settings("kernel.panic = 0\nfs.file-nr = 5 0 9\nfs.protected_regular = 2\n"))
    assert not changed(before, settings("kernel.panic = 0\nfs.file-nr = 5 0 9\nfs.protected_regular = 0\n"))
