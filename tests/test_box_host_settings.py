"""A host of the lab in a box (tests/lab_box.py, tests/tools/box/systemd-host-boot.sh) cannot change
the machine's kernel settings: its /proc/sys is read-only but for net/, its network namespace's own,
and it sends no uevent for the machine's devices (its /sys is read-only, so udev stays off).

Before, each host's init.sh ran `sysctl --system` with the machine's /proc/sys writable, and Debian's
protect-links.conf set fs.protected_{fifos,hardlinks,regular,symlinks} on the machine running the
tests, at every box run (they are not namespaced)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.firstboot import sealed_rootfs
from tests.lab_box import LabBox, NodeHost
from tests.labs import make_lab_config
from tests.machine_settings import changed, machine_sysctls
from tests.requirements import require_root, require_tool

pytestmark = pytest.mark.integration


@contextlib.contextmanager
def booted_host(directory: Path, systemd: bool) -> Iterator[tuple[NodeHost, dict[str, str]]]:
    """A booted host (its sysctl.d applied), and the machine's settings before it booted."""
    require_root()
    require_tool("ip", "unshare", "nsenter", "sysctl", "debootstrap")
    cfg = make_lab_config()
    rootfs = sealed_rootfs(cfg)
    netns = f"lk8s-settings-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    hosts = None
    before = machine_sysctls()
    try:
        hosts = LabBox(directory / "hosts", netns, rootfs, f"{cfg.network.gateway}/24", systemd=systemd)
        host = hosts.start_outside_vcenter("labs-k8s-m01", "00:50:56:3c:00:51", {})
        hosts.wait_booted([host.name], timeout=180)
        yield host, before
    finally:
        if hosts is not None:
            hosts.close()
        subprocess.run(["ip", "netns", "del", netns], check=False)


@pytest.fixture(params=["stand-in init", "systemd"])
def host(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[NodeHost, dict[str, str]]]:
    with booted_host(tmp_path, request.param == "systemd") as booted:
        yield booted


def test_a_hosts_sysctl_writes_its_own_network_settings_and_none_of_the_machines(
    host: tuple[NodeHost, dict[str, str]],
) -> None:
    booted, before = host
    if booted.system is not None:  # systemd-sysctl ran, as on a VM
        sysctl = booted.run("systemctl", "show", "-p", "ConditionResult,Result,ExecMainStatus", "systemd-sysctl")
        assert sysctl.stdout.split() == ["Result=success", "ExecMainStatus=0", "ConditionResult=yes"], sysctl
    else:
        assert "labs-k8s-box: sysctl --quiet --system" in booted.boot_log(), booted.boot_log()
    # A write of the value the machine has: refused, and nothing would change if it were not.
    current = Path("/proc/sys/kernel/printk_ratelimit").read_text().strip()
    refused = booted.run("sysctl", "-w", f"kernel.printk_ratelimit={current}")
    assert refused.returncode != 0 and re.search("Read-only file system|permission denied", refused.stderr), refused
    again = booted.run("sysctl", "--system")
    assert "fs.protected_regular" in again.stdout + again.stderr, again  # Debian's protect-links.conf was read
    assert booted.run("sysctl", "-w", "net.ipv4.ip_nonlocal_bind=1").returncode == 0  # the balancer's setting
    assert booted.run("sysctl", "-n", "net.ipv4.ip_nonlocal_bind").stdout.strip() == "1"
    assert changed(before, machine_sysctls()) == {}


def test_a_systemd_host_leaves_the_machines_devices_alone(tmp_path: Path) -> None:
    """udevd and udev-trigger would write every device's uevent file under /sys: the machine's."""
    with booted_host(tmp_path, systemd=True) as (booted, _):
        assert_no_udev(booted)


def assert_no_udev(booted: NodeHost) -> None:
    for unit in ("systemd-udevd", "systemd-udev-trigger"):
        shown = booted.run("systemctl", "show", "-p", "ConditionResult,ActiveState", unit).stdout.split()
        assert shown == ["ActiveState=inactive", "ConditionResult=no"], (unit, shown)
    refused = booted.run("sh", "-c", "echo change > /sys/class/net/lo/uevent")
    assert refused.returncode != 0 and "Read-only file system" in refused.stderr, refused
