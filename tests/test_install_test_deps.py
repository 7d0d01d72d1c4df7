"""`make test` on a workstation: scripts/install-test-deps.sh must not leave services enabled there.

Run for real in a Debian bookworm root filesystem (the debootstrap tarball tests/test_seal_rootfs.py
caches), with chroot inside a private mount namespace, and real `apt-get install` from the Debian
mirror: Debian's own maintainer scripts enable haproxy, keepalived, openssh-server and cloud-init
for the next boot (deb-systemd-helper writes the *.wants symlinks), exactly as on a workstation. The
script must say so before it installs them, and leave none of them enabled afterwards, cloud-init and
sshd switched off at boot, and a package the machine already had untouched. LABS_K8S_TEST_PACKAGES
narrows the package list to these four so the test does not install a Go toolchain into the rootfs.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from components.tools.offline import REPO_ROOT
from tests.debian_rootfs import unpack
from tests.requirements import require_root, require_tool
from tests.test_seal_rootfs import _rootfs_tarball

SCRIPT = REPO_ROOT / "scripts" / "install-test-deps.sh"
UNITS = {
    "haproxy": ["haproxy.service"],
    "keepalived": ["keepalived.service"],
    "openssh-server": ["ssh.service", "ssh.socket"],
    "cloud-init": [
        "cloud-init-local.service",
        "cloud-init.service",
        "cloud-config.service",
        "cloud-final.service",
        "cloud-init-hotplugd.socket",
    ],
}


def online_rootfs(tarball: Path, root: Path) -> None:
    """`tarball` unpacked at `root`, able to reach the Debian mirror as this machine does: its
    resolv.conf and its apt proxy settings, if any (apt-get in the rootfs runs with a clean environment).
    Here rather than in tests/debian_rootfs.py, whose text keys the first-boot image cache."""
    unpack(tarball, root)
    shutil.copy2("/etc/resolv.conf", root / "etc" / "resolv.conf")
    for name in Path("/etc/apt/apt.conf.d").glob("*"):
        if name.is_file() and "proxy" in name.read_text(errors="replace").lower():
            shutil.copy2(name, root / "etc" / "apt" / "apt.conf.d" / name.name)


def enabled_units(root: Path) -> set[str]:
    """Units that systemd would start at boot: symlinks in /etc/systemd/system/*.wants."""
    wants = root / "etc" / "systemd" / "system"
    return {link.name for link in wants.glob("*.wants/*") if link.is_symlink()}


def in_chroot(root: Path, command: str, env: str = "") -> subprocess.CompletedProcess[str]:
    """`command` in the rootfs, with /proc and /dev from a private mount namespace (nothing leaks)."""
    script = f"""
set -euo pipefail
mount --make-rprivate /
mount --bind /proc {root}/proc
mount --bind /dev {root}/dev
exec chroot {root} /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root {env} bash -c '{command}'
"""
    return subprocess.run(
        ["unshare", "--mount", "bash", "-c", script], capture_output=True, text=True, timeout=1200, check=False
    )


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory) -> Path:
    require_root()
    require_tool("debootstrap", "tar", "chroot", "unshare")
    root = tmp_path_factory.mktemp("workstation") / "root"
    online_rootfs(_rootfs_tarball({}), root)
    shutil.copy2(SCRIPT, root / "tmp" / "install-test-deps.sh")
    return root


def test_services_the_tests_only_run_as_programs_are_not_enabled_after_install(rootfs):
    # A workstation: systemd, a keepalived of its own that the script must leave as it is, and no
    # sshd (the rootfs has one: tests/test_seal_rootfs.py's INCLUDE).
    own = in_chroot(
        rootfs,
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
        "--no-install-recommends systemd keepalived >/dev/null && "
        "DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq openssh-server >/dev/null",
    )
    assert own.returncode == 0, own.stderr[-3000:]
    assert "keepalived.service" in enabled_units(rootfs), "Debian's postinst did not enable keepalived: no baseline"

    result = in_chroot(
        rootfs,
        "bash /tmp/install-test-deps.sh 2>&1",
        env="LABS_K8S_TEST_PACKAGES='haproxy keepalived openssh-server cloud-init'",
    )
    output = result.stdout
    assert result.returncode == 0, output[-3000:] + result.stderr[-2000:]
    # Said plainly, before anything is installed.
    notice = "install-test-deps: installing haproxy openssh-server cloud-init on this machine"
    assert notice in output, output[-2000:]
    assert output.index(notice) < output.index("install-test-deps: installed haproxy openssh-server cloud-init")

    enabled = enabled_units(rootfs)
    assert not enabled & {*UNITS["haproxy"], *UNITS["openssh-server"], *UNITS["cloud-init"]}, sorted(enabled)
    assert (rootfs / "etc" / "cloud" / "cloud-init.disabled").is_file()
    # Debian's own switch for sshd (ssh.service's ConditionPathExists, /etc/init.d/ssh).
    assert (rootfs / "etc" / "ssh" / "sshd_not_to_be_run").is_file()
    assert (rootfs / "usr" / "sbin" / "sshd").exists()
    assert "keepalived.service" in enabled  # the machine's own, untouched
    # The tests still get the programs.
    assert (rootfs / "usr" / "sbin" / "haproxy").exists()
    schema = in_chroot(rootfs, "cloud-init schema --help >/dev/null && echo usable")
    assert schema.stdout.strip() == "usable", schema.stderr[-2000:]
    # A later upgrade of the package (its postinst runs again) does not enable it again.
    again = in_chroot(rootfs, "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --reinstall haproxy >/dev/null")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "haproxy.service" not in enabled_units(rootfs)
