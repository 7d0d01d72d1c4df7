"""A stand-in host of the lab in a box (tests/lab_box.py, tests/tools/box/host-boot.sh) cannot change
the machine's kernel settings: its /proc/sys is read-only but for net/, its network namespace's own.

Before, each host's init.sh ran `sysctl --system` with the machine's /proc/sys writable, and Debian's
protect-links.conf set fs.protected_{fifos,hardlinks,regular,symlinks} on the machine running the
tests, at every box run (they are not namespaced)."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.firstboot import sealed_rootfs
from tests.lab_box import LabBox, NodeHost
from tests.labs import make_lab_config
from tests.machine_settings import changed, machine_sysctls
from tests.requirements import require_root, require_tool

pytestmark = pytest.mark.integration


@pytest.fixture
def host(tmp_path: Path) -> Iterator[tuple[NodeHost, dict[str, str]]]:
    """A host booted past init.sh's `sysctl --system`, and the machine's settings before it booted."""
    require_root()
    require_tool("ip", "unshare", "nsenter", "sysctl", "debootstrap")
    cfg = make_lab_config()
    rootfs = sealed_rootfs(cfg)
    netns = f"lk8s-settings-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    hosts = None
    before = machine_sysctls()
    try:
        hosts = LabBox(tmp_path / "hosts", netns, rootfs, f"{cfg.network.gateway}/24")
        host = hosts.start_outside_vcenter("labs-k8s-m01", "00:50:56:3c:00:51", {})
        deadline = time.monotonic() + 120
        while "cloud-init init --local" not in host.boot_log():  # init.sh's stage after sysctl
            assert host.running() and time.monotonic() < deadline, host.boot_log()
            time.sleep(0.5)
        yield host, before
    finally:
        if hosts is not None:
            hosts.close()
        subprocess.run(["ip", "netns", "del", netns], check=False)


def test_a_hosts_sysctl_writes_its_own_network_settings_and_none_of_the_machines(
    host: tuple[NodeHost, dict[str, str]],
) -> None:
    booted, before = host
    log = booted.boot_log()
    assert "labs-k8s-box: sysctl --quiet --system" in log, log  # the boot's systemd-sysctl ran
    # A write of the value the machine has: refused, and nothing would change if it were not.
    current = Path("/proc/sys/kernel/printk_ratelimit").read_text().strip()
    refused = booted.run("sysctl", "-w", f"kernel.printk_ratelimit={current}")
    assert refused.returncode != 0 and re.search("Read-only file system|permission denied", refused.stderr), refused
    again = booted.run("sysctl", "--system")
    assert "fs.protected_regular" in again.stdout + again.stderr, again  # Debian's protect-links.conf was read
    assert booted.run("sysctl", "-w", "net.ipv4.ip_nonlocal_bind=1").returncode == 0  # the balancer's setting
    assert booted.run("sysctl", "-n", "net.ipv4.ip_nonlocal_bind").stdout.strip() == "1"
    assert changed(before, machine_sysctls()) == {}
