"""The seal script, run for real against a Debian 12 (bookworm) root filesystem.

The rootfs comes from `debootstrap --variant=minbase --include=openssh-server bookworm` (so
real SSH host keys exist to delete) through the Debian mirror apt is configured with. It is
cached as a tarball under .cache/seal-rootfs/ (gitignored), so re-runs only unpack it.

The build's leftovers are planted on top (a machine-id, a swap line in fstab, the installer's
static network config, history, logs, cloud-init state), then the script runs twice: first
inside the rootfs with chroot, as the installer's `in-target` does, then from outside with the
root prefix argument. Both runs must leave the same sealed state.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from components.rendering.template import late_commands, template_files
from tests.debian_rootfs import SUITE, clean_env, debootstrap_tarball, late_command_argv, run, unpack, write_tree
from tests.labs import make_lab_config
from tests.requirements import require_root, require_tool

REPO = Path(__file__).resolve().parents[1]
CACHE_DIR = REPO / ".cache" / "seal-rootfs"
# openssh-server: real host keys to delete; sudo: visudo for the late command's sudoers check.
INCLUDE = ("openssh-server", "sudo")
# Bump when the recipe changes, so a stale cached rootfs is not reused.
ROOTFS_TARBALL = CACHE_DIR / f"{SUITE}-minbase-{'-'.join(INCLUDE)}-v1.tar"
BUNDLE_IN_TARGET = "usr/local/lib/labs-k8s/template"
EXCLUDE_NICS = "exclude-nics=flannel*,cni*,veth*,docker*,cali*,vxlan*,tunl*,kube-ipvs*,cilium*"

FSTAB_BEFORE = """\
# /etc/fstab: static file system information.
UUID=0a1b2c3d-0000-4000-8000-000000000001 /               ext4    errors=remount-ro 0       1
# swap was on /dev/sda5 during installation
UUID=0a1b2c3d-0000-4000-8000-000000000002 none            swap    sw              0       0
/swapfile none swap defaults 0 0
/dev/sr0        /media/cdrom0   udf,iso9660 user,noauto     0       0
"""
INTERFACES_BEFORE = """\
source /etc/network/interfaces.d/*
auto lo
iface lo inet loopback
allow-hotplug ens192
iface ens192 inet static
\taddress 10.3.60.60/24
\tgateway 10.3.60.1
"""


def _rootfs_tarball(timings: dict[str, float]) -> Path:
    """The cached bookworm rootfs tarball, built with debootstrap on first use."""
    seconds = debootstrap_tarball(ROOTFS_TARBALL, INCLUDE, variant="minbase")
    if seconds is not None:
        timings["debootstrap_seconds"] = seconds
        (CACHE_DIR / "debootstrap-seconds.txt").write_text(f"{seconds:.1f}\n")
    return ROOTFS_TARBALL


def _plant_build_leftovers(root: Path) -> None:
    """What a freshly installed template carries that clones must not inherit."""
    (root / "etc/machine-id").write_text("0123456789abcdef0123456789abcdef\n")
    (root / "var/lib/dbus").mkdir(parents=True, exist_ok=True)
    (root / "var/lib/dbus/machine-id").write_text("0123456789abcdef0123456789abcdef\n")
    (root / "var/lib/systemd").mkdir(parents=True, exist_ok=True)
    (root / "var/lib/systemd/random-seed").write_bytes(os.urandom(512))
    (root / "etc/fstab").write_text(FSTAB_BEFORE)
    (root / "etc/network/interfaces.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/network/interfaces").write_text(INTERFACES_BEFORE)
    (root / "var/lib/dhcp").mkdir(parents=True, exist_ok=True)
    (root / "var/lib/dhcp/dhclient.ens192.leases").write_text("lease { fixed-address 10.3.60.60; }\n")
    (root / "var/lib/cloud/instances/build-vm").mkdir(parents=True, exist_ok=True)
    (root / "var/lib/cloud/seed/nocloud").mkdir(parents=True, exist_ok=True)
    (root / "var/lib/cloud/instance-id").write_text("build-vm\n")
    (root / "var/log/cloud-init.log").write_text("cloud-init ran on the build VM\n")
    (root / "var/log/syslog").write_text("build log line\n" * 100)
    (root / "var/log/syslog.1").write_text("rotated\n")
    (root / "var/log/installer").mkdir(parents=True, exist_ok=True)
    (root / "var/log/installer/syslog.gz").write_bytes(b"\x1f\x8b rotated")
    (root / "var/log/journal/0123456789abcdef0123456789abcdef").mkdir(parents=True, exist_ok=True)
    (root / "var/log/journal/0123456789abcdef0123456789abcdef/system.journal").write_bytes(b"LPKSHHRH")
    (root / "var/cache/apt/pkgcache.bin").write_bytes(b"cache")
    # What the installer's apt-setup writes for `mirror/http/proxy` (the build's apt proxy).
    (root / "etc/apt/apt.conf").write_text('Acquire::http::Proxy "http://apt-cache.build.invalid:3142/";\n')
    (root / "root/.bash_history").write_text("sudo cat /etc/shadow\n")
    (root / "home/labs").mkdir(parents=True, exist_ok=True)
    (root / "home/labs/.bash_history").write_text("ls\n")
    (root / "var/tmp/build-scratch").write_text("x\n")


def _observe(root: Path) -> dict[str, Any]:
    """Everything the seal is responsible for, as plain data (compared across runs)."""

    def text(rel: str) -> str | None:
        path = root / rel
        return path.read_text() if path.is_file() else None

    def link(rel: str) -> str | None:
        path = root / rel
        return os.readlink(path) if path.is_symlink() else ("<file>" if path.exists() else None)

    def listing(rel: str) -> list[str]:
        base = root / rel
        return sorted(str(p.relative_to(base)) for p in base.rglob("*")) if base.is_dir() else []

    machine_id = root / "etc/machine-id"
    return {
        "machine_id": (machine_id.is_file(), machine_id.stat().st_size if machine_id.is_file() else None),
        "machine_id_mode": oct(machine_id.stat().st_mode & 0o777),
        "dbus_machine_id": link("var/lib/dbus/machine-id"),
        "random_seed": (root / "var/lib/systemd/random-seed").exists(),
        "host_keys": sorted(p.name for p in (root / "etc/ssh").glob("ssh_host_*")),
        "hostkey_unit": text("etc/systemd/system/labs-k8s-ssh-hostkeys.service"),
        "hostkey_unit_wants": [
            link(f"etc/systemd/system/{wants}/labs-k8s-ssh-hostkeys.service")
            for wants in ("multi-user.target.wants", "ssh.service.wants")
        ],
        "fstab": text("etc/fstab"),
        "swap_target": link("etc/systemd/system/swap.target"),
        "datasource": text("etc/cloud/cloud.cfg.d/90-labs-k8s-datasource.cfg"),
        "tools_conf": text("etc/vmware-tools/tools.conf"),
        "cloud_dir": listing("var/lib/cloud"),
        "cloud_logs": [p for p in ("var/log/cloud-init.log", "var/log/cloud-init-output.log") if (root / p).exists()],
        "interfaces": text("etc/network/interfaces"),
        "leases": listing("var/lib/dhcp"),
        "apt_conf": text("etc/apt/apt.conf"),
        "apt_debs": sorted(p.name for p in (root / "var/cache/apt").rglob("*.deb")),
        "apt_bins": sorted(p.name for p in (root / "var/cache/apt").rglob("*.bin")),
        "apt_lists": sorted(p.name for p in (root / "var/lib/apt/lists").rglob("*") if p.is_file()),
        "histories": sorted(
            str(p.relative_to(root))
            for p in [root / "root/.bash_history", *root.glob("home/*/.bash_history")]
            if p.exists()
        ),
        "var_tmp": listing("var/tmp"),
        "logs": {str(p.relative_to(root)): p.stat().st_size for p in (root / "var/log").rglob("*") if p.is_file()},
        "journal": listing("var/log/journal"),
    }


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    require_root()
    require_tool("debootstrap", "tar", "chroot", "bash")
    timings: dict[str, float] = {}
    tarball = _rootfs_tarball(timings)

    root = tmp_path_factory.mktemp("seal") / "root"
    started = time.monotonic()
    unpack(tarball, root)
    timings["unpack_seconds"] = time.monotonic() - started

    _plant_build_leftovers(root)
    before = _observe(root)

    # Run 1: the preseed's late_command, as the installer runs it: /cdrom is the remastered ISO's
    # content, /target the rootfs, `in-target X` is `chroot /target X`. Its last step is the seal.
    # Steps that touch only the installer's own environment (no /target) are left out.
    files = template_files(make_lab_config())
    cdrom = tmp_path_factory.mktemp("cdrom")
    write_tree(cdrom, files)
    (root / "run/sshd").mkdir(parents=True, exist_ok=True)
    steps: list[tuple[str, subprocess.CompletedProcess[str]]] = []
    commands = late_commands(make_lab_config())
    started = time.monotonic()
    for command in commands:
        args = late_command_argv(command, root, cdrom)
        if args is None:
            continue
        if command == commands[-1]:
            started = time.monotonic()
            # sshd's own check of the installed drop-in, while host keys still exist.
            steps.append(("sshd -t", run(["chroot", str(root), "/usr/sbin/sshd", "-t"], env=clean_env())))
        steps.append((command, run(args, env=clean_env())))
    timings["seal_chroot_seconds"] = time.monotonic() - started
    first = steps[-1][1]
    after_first = _observe(root)

    # Run 2: from outside, with the root prefix and the bundle from the renderer.
    outside = tmp_path_factory.mktemp("bundle")
    for rel, content in files.items():
        if rel.startswith("labs-k8s/"):
            (outside / rel.removeprefix("labs-k8s/")).write_text(content)
    started = time.monotonic()
    second = run(["bash", str(outside / "seal-template.sh"), str(root)], env=clean_env())
    timings["seal_prefix_seconds"] = time.monotonic() - started
    after_second = _observe(root)

    # A clone's first boot: the safety-net unit's command brings host keys back.
    unit_exec = run(["chroot", str(root), "/usr/bin/ssh-keygen", "-A"], env=clean_env())
    regenerated = sorted(p.name for p in (root / "etc/ssh").glob("ssh_host_*"))

    print(f"\nseal rootfs timings: {', '.join(f'{k}={v:.1f}' for k, v in timings.items())}")
    return {
        "root": root,
        "files": files,
        "before": before,
        "steps": steps,
        "first": first,
        "second": second,
        "after_first": after_first,
        "after_second": after_second,
        "unit_exec": unit_exec,
        "regenerated": regenerated,
        "timings": timings,
    }


def test_rootfs_starts_unsealed(sealed: dict[str, Any]) -> None:
    """The leftovers are really there before sealing, so the checks below mean something."""
    before = sealed["before"]
    assert before["machine_id"] == (True, 33)
    assert {"ssh_host_ed25519_key", "ssh_host_rsa_key", "ssh_host_ecdsa_key"} <= set(before["host_keys"])
    assert "swap" in before["fstab"]
    assert before["apt_debs"] and before["apt_bins"] and before["apt_lists"]
    assert before["cloud_dir"] and before["histories"] and before["journal"]
    assert before["logs"]["var/log/syslog"] > 0


def test_late_command_runs_in_the_target(sealed: dict[str, Any]) -> None:
    for command, result in sealed["steps"]:
        assert result.returncode == 0, f"{command}:\n{result.stdout}\n{result.stderr}"
    ran = [command for command, _ in sealed["steps"]]
    assert "in-target visudo -cf /etc/sudoers.d/labs-k8s" in ran
    assert ran[-1].endswith("seal-template.sh /")
    root = sealed["root"]
    sudoers = root / "etc/sudoers.d/labs-k8s"
    assert sudoers.stat().st_mode & 0o777 == 0o440
    assert sudoers.read_text() == sealed["files"]["labs-k8s/sudoers"]
    assert (root / "etc/ssh/sshd_config.d/labs-k8s.conf").read_text() == sealed["files"]["labs-k8s/sshd.conf"]
    # No NTP servers baked in: clones get network.ntpServers from cloud-init and node-settings.
    assert not (root / "etc/systemd/timesyncd.conf.d/labs-k8s.conf").exists()
    # The bundle stays in the template, so it can be re-sealed by hand.
    assert (root / BUNDLE_IN_TARGET / "seal-template.sh").read_text() == sealed["files"]["labs-k8s/seal-template.sh"]


def test_both_runs_succeed(sealed: dict[str, Any]) -> None:
    for which in ("first", "second"):
        result = sealed[which]
        assert result.returncode == 0, f"{which} run failed:\n{result.stdout}\n{result.stderr}"
        assert "sealed" in result.stderr


def test_second_run_is_harmless_and_changes_nothing(sealed: dict[str, Any]) -> None:
    assert sealed["after_second"] == sealed["after_first"]


def test_machine_id_is_empty(sealed: dict[str, Any]) -> None:
    state = sealed["after_second"]
    assert state["machine_id"] == (True, 0), "/etc/machine-id must exist and be empty"
    assert state["machine_id_mode"] == "0o444"
    assert state["dbus_machine_id"] == "/etc/machine-id"
    assert state["random_seed"] is False


def test_ssh_host_keys_are_gone_and_come_back_at_first_boot(sealed: dict[str, Any]) -> None:
    state = sealed["after_second"]
    assert state["host_keys"] == []
    assert state["hostkey_unit"] == sealed["files"]["labs-k8s/labs-k8s-ssh-hostkeys.service"]
    assert state["hostkey_unit_wants"] == ["/etc/systemd/system/labs-k8s-ssh-hostkeys.service"] * 2
    assert sealed["unit_exec"].returncode == 0, sealed["unit_exec"].stderr
    assert {"ssh_host_ed25519_key", "ssh_host_rsa_key", "ssh_host_ecdsa_key"} <= set(sealed["regenerated"])


def test_no_swap_left(sealed: dict[str, Any]) -> None:
    fstab = sealed["after_second"]["fstab"]
    active = [line.split() for line in fstab.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert [fields for fields in active if fields[2] == "swap"] == []
    # Everything else in fstab is kept as it was.
    assert [fields[1] for fields in active] == ["/", "/media/cdrom0"]
    assert sealed["after_second"]["swap_target"] == "/dev/null"


def test_cloud_init_is_clean_and_prefers_vmware(sealed: dict[str, Any]) -> None:
    state = sealed["after_second"]
    assert state["cloud_dir"] == []
    assert state["cloud_logs"] == []
    assert state["datasource"] is not None
    assert "datasource_list: [ VMware, OVF, NoCloud, None ]" in state["datasource"]


def test_vmware_tools_excludes_overlay_nics(sealed: dict[str, Any]) -> None:
    tools = sealed["after_second"]["tools_conf"]
    assert tools is not None
    lines = [line.strip() for line in tools.splitlines()]
    assert lines.index("[guestinfo]") < lines.index(EXCLUDE_NICS)


def test_build_network_config_is_dropped(sealed: dict[str, Any]) -> None:
    state = sealed["after_second"]
    assert "10.3.60.60" not in state["interfaces"]
    assert "source /etc/network/interfaces.d/*" in state["interfaces"]
    assert "iface lo inet loopback" in state["interfaces"]
    assert state["leases"] == []
    # The build's apt proxy is the build environment's: it must not outlive mirrors.aptProxy.
    assert sealed["before"]["apt_conf"] and state["apt_conf"] is None


def test_apt_caches_history_and_logs_are_empty(sealed: dict[str, Any]) -> None:
    state = sealed["after_second"]
    assert state["apt_debs"] == []
    assert state["apt_bins"] == []
    assert set(state["apt_lists"]) <= {"lock"}
    assert state["histories"] == []
    assert state["var_tmp"] == []
    assert state["journal"] == []
    assert state["logs"], "log files are truncated, not deleted"
    assert {path: size for path, size in state["logs"].items() if size} == {}
    assert not any(path.endswith((".gz", ".1", ".old")) for path in state["logs"])


def test_seal_refuses_a_directory_that_is_not_a_debian_root(tmp_path: Path) -> None:
    require_tool("bash")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    for rel, content in template_files(make_lab_config()).items():
        if rel.startswith("labs-k8s/"):
            (bundle / rel.removeprefix("labs-k8s/")).write_text(content)
    victim = tmp_path / "home-directory"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me\n")
    result = run(["bash", str(bundle / "seal-template.sh"), str(victim)])
    assert result.returncode != 0
    assert "does not look like a Debian root" in result.stderr
    assert sorted(p.name for p in victim.iterdir()) == ["precious.txt"]
    # Without its snippets next to it the script stops before touching anything.
    (victim / "etc").mkdir()
    (victim / "etc/debian_version").write_text("12.12\n")
    (bundle / "tools.conf").unlink()
    result = run(["bash", str(bundle / "seal-template.sh"), str(victim)])
    assert result.returncode != 0 and "tools.conf is missing" in result.stderr
    assert not (victim / "etc/machine-id").exists()
