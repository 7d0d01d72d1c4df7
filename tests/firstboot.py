"""The golden template as a bootable disk image, and clones of it booted in QEMU with vSphere's devices.

Used by tests/test_firstboot_qemu.py (its timings: docs/template.md, "First boot, proven in QEMU").

The image. debian-installer cannot run here (the reachable archive lacks most installer udebs, and
an emulated install without KVM takes well over 30 minutes), so the image is built from what the
install produces, step by step:

1. `debootstrap` (default variant: required + important, d-i's base system, ifupdown and
   isc-dhcp-client included), then, in the target and with Recommends as d-i installs them, what
   the installer adds: the security and updates suites (apt-setup), `apt-get upgrade`
   (pkgsel/upgrade safe-upgrade), the kernel (base-installer), tasksel's `ssh-server` task and every
   package of the rendered preseed's `pkgsel/include`. tasksel's `standard` task (man pages,
   bash-completion, ...) is left out: nothing at first boot uses it.
2. What d-i's own components would do with the preseed's answers: /etc/hostname and /etc/hosts
   (netcfg), the generated default locale (localechooser), the user with its locked password and
   groups (user-setup), /etc/fstab by UUID (partman).
3. The preseed's `late_command`, replayed step by step (tests/debian_rootfs.py): the template files
   land where it puts them and the project's seal script runs in the target, as `in-target` does.
4. One ext4 filesystem filled from that directory (`mkfs.ext4 -d`, no mount or loop device) in
   partition 1 of a disk as big as `template.diskGib`, like the preseed's partman recipe; QEMU boots
   the image's own kernel and initrd with `-kernel/-initrd` (GRUB is the one thing not exercised).

One test-only file is added after the seal, tests/tools/firstboot-guestinfo-init.sh, inert unless
the kernel line names it as init (see the transport below).

The image is cached by the content hash of its inputs (package list, preseed, template files, seal
script, this recipe: `RECIPE_FILES`) under `~/.cache/labs-k8s/firstboot/` (`$LABS_K8S_CACHE`),
outside the repository: a second run on the same machine only boots. The installed rootfs has a cache key of
its own (suite, mirror, packages), so a change to the seal script re-seals without downloading.

The clones. Each is a copy-on-write qcow2 overlay of the image, booted with TCG (no KVM), with the
devices the program gives a clone on vSphere (components/fleet.py) in vSphere's PCI layout
(`PCI_LAYOUT` below says which and why), on a bridge in a network namespace made for the run, with
the lab's addresses. The bridge carries the lab's gateway address; nothing is routed out of the
namespace, and QEMU itself runs inside it.

The transport of the guestinfo documents. cloud-init 22.4's DataSourceVMware reads guestinfo either
through `vmware-rpctool` (VMware's backdoor I/O port, which QEMU does not implement: its `vmport`
device answers only the mouse and version calls, so the clones run with `vmport=off`, as on any
non-VMware machine) or, first, from the environment: `VMX_GUESTINFO=1` and
`VMX_GUESTINFO_<KEY>` for `guestinfo.<key>` (same decode path: encoding, base64/gzip, YAML).
ds-identify checks the same variables (`dscheck_VMware`) before it looks for VMware hardware. The
test puts the program's own guestinfo values, renamed by cloud-init's rule, into a systemd drop-in
(`DefaultEnvironment=`) and hands that to the clone through QEMU's fw_cfg; the test-only init
wrapper copies it to /run/systemd/system.conf.d/ and execs systemd, so the generators (ds-identify)
and every cloud-init unit see the variables. No datasource is forced: ds-identify finds VMware.
The SMBIOS system vendor and product are VMware's (`-smbios type=1`) and the CPU has no
hypervisor leaf, so `systemd-detect-virt` says `vmware` as on vSphere: units conditioned on
VMware (open-vm-tools) start, and ds-identify sees a VMware platform.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from components.config import LabConfig, Node
from components.rendering.template import late_commands, render_preseed, template_files
from components.template import CACHE_ROOT
from tests.debian_rootfs import (
    MIRROR,
    SUITE,
    clean_env,
    debootstrap,
    in_target,
    late_command_argv,
    pack,
    run,
    unpack,
    write_tree,
)
from tests.test_template_render import parse_preseed

REPO = Path(__file__).resolve().parents[1]
CACHE_DIR = CACHE_ROOT / "firstboot"
INIT_WRAPPER = REPO / "tests" / "tools" / "firstboot-guestinfo-init.sh"
INIT_IN_IMAGE = "/usr/local/lib/labs-k8s-test/guestinfo-init"
# The code that makes the image from its inputs: a change to any of them makes a new image.
# tests/debian_rootfs.py is how the late_command is replayed (where the template files land).
RECIPE_FILES = (Path(__file__).resolve(), REPO / "tests" / "debian_rootfs.py", INIT_WRAPPER)
FW_CFG_NAME = "opt/labs-k8s/guestinfo"  # the wrapper reads /sys/firmware/qemu_fw_cfg/by_name/<this>/raw

# What debian-installer installs besides debootstrap's base and the preseed's pkgsel/include:
# base-installer's kernel, and tasksel's `ssh-server` task (its metapackage).
INSTALLER_PACKAGES = ("linux-image-amd64", "task-ssh-server")
# apt-setup's sources with `apt-setup/services-select security, updates`, from the Debian mirror
# this machine's apt uses (d-i itself names security.debian.org for the security suite).
SOURCES_LIST = f"""\
deb {MIRROR} {SUITE} main non-free-firmware
deb {MIRROR} {SUITE}-updates main non-free-firmware
deb {MIRROR}-security {SUITE}-security main non-free-firmware
"""

# The first partition starts at 1 MiB, as partman aligns it.
PARTITION_OFFSET = 1024 * 1024
GIB = 1024**3

# vSphere's virtual hardware (version 13 and later), which QEMU's q35 machine is laid out to match:
#   00:15.0 .. 00:15.7  PCIe root ports, physical slots 160..167; the first SCSI controller sits
#                       behind 00:15.0, so Linux sees it at 0000:03:00.0 (the data disk's udev
#                       path, DATA_DISK_BY_PATH, depends on exactly that);
#   00:16.0             root port, slot 192; the first NIC sits behind it at 0000:0b:00.0, and udev
#                       names a NIC after its slot: ens192 (loadBalancer.interface, the key of the
#                       network config);
#   00:01.0, 00:11.0    the two bridges before them that take buses 1 and 2 on vSphere (there a
#                       PCI-to-PCI bridge and the AGP bridge; empty root ports here).
# The firmware numbers buses depth first in device order: 00:01.0 -> 1, 00:11.0 -> 2, 00:15.0 -> 3,
# 00:15.1-7 -> 4-10, 00:16.0 -> 11 (0x0b). vSphere's root ports use native PCIe hotplug (Linux's
# pciehp registers "Slot #160"), so QEMU's ACPI hotplug is off and pciehp reads the slot numbers.
PCI_LAYOUT: tuple[tuple[str, str, int], ...] = (
    # (id, address on pcie.0, physical slot; 0 = none)
    ("bridge1", "0x1.0", 0),
    ("bridge2", "0x11.0", 0),
    *((f"port16{i}", f"0x15.{i}", 160 + i) for i in range(8)),
    ("port192", "0x16.0", 192),
)
SCSI_PORT = "port160"
NIC_PORT = "port192"
SCSI_PCI_ADDRESS = "0000:03:00.0"
NIC_PCI_ADDRESS = "0000:0b:00.0"

# vSphere's SMBIOS system information of a BIOS VM (an EFI VM says "VMware7,1").
SMBIOS_VENDOR = "VMware, Inc."
SMBIOS_PRODUCT = "VMware Virtual Platform"

# An image or rootfs unused this long goes (each is 1-2 GB); the current one is touched on every use.
STALE_AFTER_SECONDS = 24 * 3600
CLONE_MEMORY_MIB = 1024  # TCG: more vCPUs or memory only slow the host down


# --------------------------------------------------------------------------- the preseed


def preseed_answers(text: str) -> dict[str, str]:
    """question -> value of a rendered preseed."""
    return {question: value for (_, question), (_, value) in parse_preseed(text).items()}


def image_packages(cfg: LabConfig) -> tuple[str, ...]:
    """debootstrap's --include: the installer's own additions, then the preseed's pkgsel/include."""
    answers = preseed_answers(render_preseed(cfg))
    assert "ssh-server" in answers["tasksel/first"], "the preseed no longer asks for tasksel's ssh-server task"
    return (*INSTALLER_PACKAGES, *answers["pkgsel/include"].split())


# --------------------------------------------------------------------------- the image


def _digest(*parts: str | bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _image_files(cfg: LabConfig) -> dict[str, str]:
    """The preseed and the /labs-k8s/ bundle: what the install reads from the ISO (no boot menus)."""
    return {k: v for k, v in template_files(cfg).items() if k == "preseed.cfg" or k.startswith("labs-k8s/")}


def image_key(cfg: LabConfig) -> tuple[str, str]:
    """(rootfs key, image key): content hashes of everything each one is made from."""
    rootfs = _digest(SUITE, MIRROR, *image_packages(cfg))
    files = _image_files(cfg)
    image = _digest(
        rootfs,
        f"disk-gib={cfg.template.disk_gib}",
        *(part for path in sorted(files) for part in (path, files[path])),
        *(recipe.read_bytes() for recipe in RECIPE_FILES),
    )
    return rootfs, image


@dataclass(frozen=True)
class TemplateImage:
    disk: Path  # qcow2, the clones' backing file
    kernel: Path
    initrd: Path
    facts: dict[str, Any]  # what the build saw: root UUID, pre-seal identity, initrd modules, timings
    built_now: bool


def _host_keys(root: Path) -> dict[str, str]:
    """key type (ssh-ed25519, ...) -> base64 public key, from the rootfs's host key files."""
    keys = {}
    for pub in sorted(root.glob("etc/ssh/ssh_host_*_key.pub")):
        kind, blob = pub.read_text().split()[:2]
        keys[kind] = blob
    return keys


def _chroot(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    result = run(["chroot", str(root), *args], env=clean_env())
    assert result.returncode == 0, f"chroot {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result


def _install_like_debian_installer(root: Path, answers: Mapping[str, str], root_uuid: str) -> None:
    """What netcfg, user-setup and partman write into the target from the preseed's answers."""
    hostname, domain = answers["netcfg/get_hostname"], answers["netcfg/get_domain"]
    (root / "etc/hostname").write_text(f"{hostname}\n")
    fqdn = f"{hostname}.{domain} " if domain else ""
    (root / "etc/hosts").write_text(
        f"127.0.0.1\tlocalhost\n127.0.1.1\t{fqdn}{hostname}\n\n"
        "::1     localhost ip6-localhost ip6-loopback\nff02::1 ip6-allnodes\nff02::2 ip6-allrouters\n"
    )
    user = answers["passwd/username"]
    _chroot(root, "adduser", "--disabled-password", "--gecos", answers["passwd/user-fullname"], user)
    for group in answers["passwd/user-default-groups"].split():
        _chroot(root, "adduser", user, group)
    _chroot(root, "usermod", "--password", answers["passwd/user-password-crypted"], user)
    # localechooser: debian-installer/locale becomes the target's generated default locale.
    locale = answers["debian-installer/locale"]
    entry = f"{locale} {locale.split('.', 1)[1] if '.' in locale else 'ISO-8859-1'}"
    locale_gen = root / "etc/locale.gen"
    lines = locale_gen.read_text().splitlines() if locale_gen.is_file() else []
    lines = [entry if line.lstrip("# ").strip() == entry else line for line in lines]
    locale_gen.write_text("\n".join(lines if entry in lines else [*lines, entry]) + "\n")
    _chroot(root, "locale-gen")
    _chroot(root, "update-locale", f"LANG={locale}")
    (root / "etc/fstab").write_text(
        "# /etc/fstab: static file system information.\n"
        f"UUID={root_uuid} /               ext4    errors=remount-ro 0       1\n"
    )


def _replay_late_command(root: Path, cfg: LabConfig, work: Path) -> None:
    cdrom = work / "cdrom"
    write_tree(cdrom, template_files(cfg))
    for command in late_commands(cfg):
        argv = late_command_argv(command, root, cdrom)
        if argv is None:
            continue
        result = run(argv, env=clean_env())
        assert result.returncode == 0, f"late_command step {command!r} failed:\n{result.stdout}\n{result.stderr}"
    shutil.rmtree(cdrom)


def _make_disk(root: Path, disk_gib: int, root_uuid: str, raw: Path, qcow2: Path) -> None:
    """One msdos partition over the whole disk, ext4 filled from `root`, written as qcow2."""
    size = disk_gib * GIB
    with raw.open("wb") as handle:
        handle.truncate(size)
    layout = f"label: dos\nstart={PARTITION_OFFSET // 512}, type=83, bootable\n"
    partition = run(["sfdisk", "--no-reread", "--no-tell-kernel", str(raw)], input=layout)
    assert partition.returncode == 0, partition.stderr
    blocks = (size - PARTITION_OFFSET) // 4096
    mkfs = run(
        [
            "mkfs.ext4",
            "-q",
            "-F",
            "-b",
            "4096",
            "-U",
            root_uuid,
            "-d",
            str(root),
            "-E",
            f"offset={PARTITION_OFFSET}",
            str(raw),
            str(blocks),
        ],
    )
    assert mkfs.returncode == 0, mkfs.stderr
    convert = run(["qemu-img", "convert", "-O", "qcow2", str(raw), str(qcow2)])
    assert convert.returncode == 0, convert.stderr
    raw.unlink()


def _installed_rootfs(tarball: Path, packages: Sequence[str]) -> float:
    """debootstrap, then what the installer installs on top (module docstring, step 1); seconds."""
    started = time.monotonic()
    tarball.parent.mkdir(parents=True, exist_ok=True)
    build = tarball.with_name(tarball.name + ".build")
    shutil.rmtree(build, ignore_errors=True)
    root = build / "root"
    debootstrap(root)
    (root / "etc/apt/sources.list").write_text(SOURCES_LIST)
    install = in_target(
        root,
        "apt-get update -q && apt-get upgrade -y -q"
        f" && apt-get install -y -q -o APT::Install-Recommends=true {' '.join(packages)}",
    )
    if install.returncode != 0:
        shutil.rmtree(build, ignore_errors=True)
        pytest.fail(
            f"installing {' '.join(packages)} in the rootfs failed:\n{install.stdout[-3000:]}\n"
            f"{install.stderr[-3000:]}",
            pytrace=False,
        )
    pack(root, tarball)
    shutil.rmtree(build, ignore_errors=True)
    return round(time.monotonic() - started, 1)


def build_image(cfg: LabConfig) -> TemplateImage:
    """The sealed template as a bootable qcow2 with its kernel and initrd, from the cache if there.

    Several checkouts on one machine share the cache: one builds while the others wait (a lock),
    and an image is removed only after a day without use, so none vanishes under a running test."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with (CACHE_DIR / "build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        image = _cached_or_built_image(cfg)
        for path in (image.disk.parent, CACHE_DIR / f"rootfs-{image.facts['rootfs_key']}.tar"):
            os.utime(path)  # last use, for the pruning below
        for stale in [*CACHE_DIR.glob("image-*"), *CACHE_DIR.glob("rootfs-*"), *CACHE_DIR.glob("sealed-*")]:
            if time.time() - stale.stat().st_mtime > STALE_AFTER_SECONDS:
                shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)
    return image


def sealed_rootfs(cfg: LabConfig) -> Path:
    """The template's root filesystem as the install leaves it, sealed (steps 1-3 of the module
    docstring, no disk): the read-only lower layer every node host of the lab in a box overlays
    (tests/lab_box.py). Cached as a directory beside the images, by the image's key."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    rootfs_key, key = image_key(cfg)
    final = CACHE_DIR / f"sealed-{key}"
    with (CACHE_DIR / "build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (final / "sealed.json").is_file():
            tarball = CACHE_DIR / f"rootfs-{rootfs_key}.tar"
            if not tarball.is_file():
                _installed_rootfs(tarball, image_packages(cfg))
            work = CACHE_DIR / f"sealed-{key}.build"
            shutil.rmtree(work, ignore_errors=True)
            unpack(tarball, work / "root")
            root_uuid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"labs-k8s-firstboot:{key}"))
            _install_like_debian_installer(work / "root", preseed_answers(render_preseed(cfg)), root_uuid)
            _replay_late_command(work / "root", cfg, work)
            (work / "sealed.json").write_text(json.dumps({"key": key, "rootfs_key": rootfs_key}) + "\n")
            shutil.rmtree(final, ignore_errors=True)
            os.replace(work, final)
        os.utime(final)  # last use, for build_image's pruning
        tarball = CACHE_DIR / f"rootfs-{rootfs_key}.tar"
        if tarball.exists():
            os.utime(tarball)
    return final / "root"


def _cached_or_built_image(cfg: LabConfig) -> TemplateImage:
    rootfs_key, key = image_key(cfg)
    final = CACHE_DIR / f"image-{key}"
    if (final / "facts.json").is_file():
        facts = json.loads((final / "facts.json").read_text())
        return TemplateImage(final / "disk.qcow2", final / "vmlinuz", final / "initrd.img", facts, built_now=False)

    started = time.monotonic()
    tarball = CACHE_DIR / f"rootfs-{rootfs_key}.tar"
    rootfs_seconds = None if tarball.is_file() else _installed_rootfs(tarball, image_packages(cfg))
    work = CACHE_DIR / f"image-{key}.build"
    shutil.rmtree(work, ignore_errors=True)
    root = work / "root"
    unpack(tarball, root)

    root_uuid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"labs-k8s-firstboot:{key}"))
    answers = preseed_answers(render_preseed(cfg))
    _install_like_debian_installer(root, answers, root_uuid)
    before_seal = {
        "machine_id": (root / "etc/machine-id").read_text().strip(),
        "host_keys": _host_keys(root),
    }
    _replay_late_command(root, cfg, work)
    after_seal = {
        "machine_id_bytes": (root / "etc/machine-id").stat().st_size,
        "host_keys": sorted(p.name for p in (root / "etc/ssh").glob("ssh_host_*")),
    }

    kernels = sorted((root / "boot").glob("vmlinuz-*"))
    assert len(kernels) == 1, f"expected one kernel in /boot, found {kernels}"
    version = kernels[0].name.removeprefix("vmlinuz-")
    shutil.copyfile(kernels[0], work / "vmlinuz")
    shutil.copyfile(root / f"boot/initrd.img-{version}", work / "initrd.img")
    listing = _chroot(root, "lsinitramfs", f"/boot/initrd.img-{version}").stdout.splitlines()
    drivers = sorted(p for p in listing if re.search(r"/(vmw_pvscsi|vmxnet3)\.ko", p))

    # Test only, after the seal: see the module docstring and the script's header.
    wrapper = root / INIT_IN_IMAGE.lstrip("/")
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(INIT_WRAPPER, wrapper)
    wrapper.chmod(0o755)

    _make_disk(root, cfg.template.disk_gib, root_uuid, work / "disk.raw", work / "disk.qcow2")
    shutil.rmtree(root)
    facts = {
        "key": key,
        "rootfs_key": rootfs_key,
        "packages": list(image_packages(cfg)),
        "kernel_version": version,
        "root_uuid": root_uuid,
        "initrd_drivers": drivers,
        "before_seal": before_seal,
        "after_seal": after_seal,
        "rootfs_seconds": rootfs_seconds,
        "build_seconds": round(time.monotonic() - started, 1),
    }
    (work / "facts.json").write_text(json.dumps(facts, indent=2) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(work, final)
    return TemplateImage(final / "disk.qcow2", final / "vmlinuz", final / "initrd.img", facts, built_now=True)


# --------------------------------------------------------------------------- clones


def guestinfo_environment(extra_config: Mapping[str, str]) -> dict[str, str]:
    """The VM's guestinfo.* keys as DataSourceVMware's environment transport names them.

    cloud-init 22.4: get_guestinfo_envvar_key_name(key) = ("vmx." + "guestinfo." + key).upper()
    with dots as underscores; VMX_GUESTINFO turns the transport on."""
    env = {"VMX_GUESTINFO": "1"}
    for key, value in extra_config.items():
        if key.startswith("guestinfo."):
            env[("vmx." + key).upper().replace(".", "_")] = value
    return env


def systemd_dropin(env: Mapping[str, str]) -> str:
    for name, value in env.items():
        # base64 and encoding names: nothing systemd's quoting would have to escape
        assert re.fullmatch(r"[A-Za-z0-9+/=._-]*", value), f"{name} has characters to quote"
    assignments = " ".join(f'"{name}={value}"' for name, value in env.items())
    return (
        "# labs-k8s test: the clone's guestinfo, for DataSourceVMware's environment transport\n"
        f"[Manager]\nDefaultEnvironment={assignments}\n"
    )


@dataclass
class Clone:
    node: Node
    mac: str
    extra_config: dict[str, str]
    workdir: Path
    tap: str
    disks: dict[str, Path] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0

    @property
    def console(self) -> Path:
        return self.workdir / "console.log"

    def console_tail(self, lines: int = 60) -> str:
        if not self.console.is_file():
            return "(no console output)"
        text = self.console.read_text(errors="replace").replace("\r", "")
        return "\n".join(text.splitlines()[-lines:])


def qemu_argv(image: TemplateImage, clone: Clone) -> list[str]:
    argv = [
        "qemu-system-x86_64",
        "-machine",
        "q35,accel=tcg,vmport=off",
        # No CPUID hypervisor leaf: TCG's would say "QEMU" first; without it systemd-detect-virt
        # reads the SMBIOS vendor below and says "vmware", as on vSphere (where CPUID says it too).
        "-cpu",
        "qemu64,hypervisor=off",
        # Native PCIe hotplug on the root ports, as on vSphere: pciehp reads their slot numbers.
        "-global",
        "ICH9-LPC.acpi-pci-hotplug-with-bridge-support=off",
        "-m",
        str(CLONE_MEMORY_MIB),
        "-smp",
        "1",
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-monitor",
        "none",
        "-serial",
        f"file:{clone.console}",
        "-smbios",
        f"type=1,manufacturer={SMBIOS_VENDOR.replace(',', ',,')},product={SMBIOS_PRODUCT}",
        "-uuid",
        str(uuid.uuid5(uuid.NAMESPACE_DNS, clone.node.name)),
        "-kernel",
        str(image.kernel),
        "-initrd",
        str(image.initrd),
        "-append",
        f"root=UUID={image.facts['root_uuid']} ro console=ttyS0,115200 init={INIT_IN_IMAGE}",
        "-fw_cfg",
        f"name={FW_CFG_NAME},file={clone.workdir / 'guestinfo.conf'}",
    ]
    for chassis, (port, address, slot) in enumerate(PCI_LAYOUT, start=1):
        multifunction = ",multifunction=on" if address.endswith(".0") and address.startswith("0x15") else ""
        slot_arg = f",slot={slot}" if slot else ""
        argv += [
            "-device",
            f"pcie-root-port,id={port},bus=pcie.0,addr={address},chassis={chassis}{slot_arg}{multifunction}",
        ]
    argv += ["-device", f"pvscsi,id=scsi0,bus={SCSI_PORT}"]
    for unit, (name, path) in enumerate(clone.disks.items()):
        argv += [
            "-drive",
            f"if=none,id={name},file={path},format=qcow2,cache=unsafe,discard=unmap",
            "-device",
            f"scsi-hd,bus=scsi0.0,scsi-id={unit},lun=0,drive={name}",
        ]
    argv += [
        "-netdev",
        f"tap,id=nic0,ifname={clone.tap},script=no,downscript=no",
        "-device",
        f"vmxnet3,netdev=nic0,mac={clone.mac},bus={NIC_PORT}",
    ]
    return argv


class CloneLab:
    """A network namespace with the lab's bridge, and the clones booted on it."""

    PREFIX = "lk8sfb"

    def __init__(self, cfg: LabConfig, image: TemplateImage, workdir: Path, ssh_user: str, private_key: Path):
        self.cfg = cfg
        self.image = image
        self.workdir = workdir
        self.ssh_user = ssh_user
        self.private_key = private_key
        self.known_hosts = workdir / "known_hosts"
        self.ns = f"{self.PREFIX}{os.getpid()}"
        self.clones: dict[str, Clone] = {}

    # ---- namespace
    def __enter__(self) -> CloneLab:
        self._remove_stale_namespaces()
        self._ip("netns", "add", self.ns)
        try:
            self._ip("-n", self.ns, "link", "set", "lo", "up")
            self._ip("-n", self.ns, "link", "add", "br0", "type", "bridge")
            gateway = f"{self.cfg.network.gateway}/{self.cfg.prefix_length}"
            self._ip("-n", self.ns, "addr", "add", gateway, "dev", "br0")
            self._ip("-n", self.ns, "link", "set", "br0", "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for clone in self.clones.values():
            self._stop(clone)
        run(["ip", "netns", "del", self.ns])

    def _remove_stale_namespaces(self) -> None:
        """Namespaces of an earlier run whose process is gone (a crash or a kill)."""
        listed = run(["ip", "netns", "list"]).stdout.split()
        for name in listed:
            match = re.fullmatch(rf"{self.PREFIX}(\d+)", name)
            if match and not Path(f"/proc/{match.group(1)}").exists():
                for pid in run(["ip", "netns", "pids", name]).stdout.split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
                run(["ip", "netns", "del", name])

    @staticmethod
    def _ip(*args: str) -> None:
        result = run(["ip", *args])
        assert result.returncode == 0, f"ip {' '.join(args)}: {result.stderr}"

    # ---- clones
    def add(self, node: Node, mac: str, extra_config: Mapping[str, str]) -> Clone:
        short = node.name.rsplit("-", 1)[-1]
        workdir = self.workdir / node.name
        workdir.mkdir(parents=True)
        clone = Clone(node, mac, dict(extra_config), workdir, tap=f"tap-{short}")
        (workdir / "guestinfo.conf").write_text(systemd_dropin(guestinfo_environment(extra_config)))
        os_disk = workdir / "os.qcow2"
        backing = ["-F", "qcow2", "-b", str(self.image.disk)]
        created = run(["qemu-img", "create", "-q", "-f", "qcow2", *backing, str(os_disk)])
        assert created.returncode == 0, created.stderr
        clone.disks["os"] = os_disk
        if node.data_disk_gib:
            data_disk = workdir / "data.qcow2"
            created = run(["qemu-img", "create", "-q", "-f", "qcow2", str(data_disk), f"{node.data_disk_gib}G"])
            assert created.returncode == 0, created.stderr
            clone.disks["data"] = data_disk
        self._ip("-n", self.ns, "tuntap", "add", "dev", clone.tap, "mode", "tap")
        self._ip("-n", self.ns, "link", "set", clone.tap, "master", "br0", "up")
        self.clones[node.name] = clone
        return clone

    def start(self, clone: Clone) -> None:
        log = (clone.workdir / "qemu.log").open("wb")
        clone.started_at = time.monotonic()
        clone.process = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, *qemu_argv(self.image, clone)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    def _stop(self, clone: Clone) -> None:
        if clone.process is None or clone.process.poll() is not None:
            return
        clone.process.terminate()
        try:
            clone.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            clone.process.kill()
            clone.process.wait(timeout=20)

    def failure_detail(self, clone: Clone) -> str:
        qemu_log = clone.workdir / "qemu.log"
        qemu = qemu_log.read_text(errors="replace")[-2000:] if qemu_log.is_file() else ""
        state = "running" if clone.process and clone.process.poll() is None else "exited"
        return f"QEMU {state}; its log:\n{qemu}\nconsole (last lines):\n{clone.console_tail()}"

    # ---- SSH, from inside the namespace
    def in_ns(self, *argv: str, input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return run(["ip", "netns", "exec", self.ns, *argv], input=input, timeout=timeout)

    def wait_for_ssh(self, clone: Clone, deadline: float) -> float:
        """Seconds from QEMU's start until sshd answered; the host keys go into known_hosts."""
        host = str(clone.node.ip)
        while True:
            if clone.process is not None and clone.process.poll() is not None:
                code = clone.process.returncode
                pytest.fail(f"{clone.node.name}: QEMU exited ({code})\n{self.failure_detail(clone)}")
            scan = self.in_ns("ssh-keyscan", "-T", "5", "-t", "rsa,ecdsa,ed25519", host, timeout=30)
            # The program's host keys: Ed25519, and on a control plane the VIP's ECDSA key besides.
            if scan.returncode == 0 and scan.stdout.count(host) >= 1:
                with self.known_hosts.open("a") as handle:
                    handle.write(scan.stdout)
                return time.monotonic() - clone.started_at
            if time.monotonic() > deadline:
                pytest.fail(f"{clone.node.name}: no SSH on {host} in time\n{self.failure_detail(clone)}")
            time.sleep(3)

    def host_keys(self, clone: Clone) -> dict[str, str]:
        """key type -> base64 public key, as the clone's sshd presents them (from known_hosts)."""
        keys = {}
        for line in self.known_hosts.read_text().splitlines():
            host, kind, blob = line.split()[:3]
            if host == str(clone.node.ip):
                keys[kind] = blob
        return keys

    def ssh(
        self, clone: Clone, command: str, stdin: str | None = None, timeout: float = 600, connect_timeout: int = 15
    ) -> subprocess.CompletedProcess[str]:
        """`ssh user@ip COMMAND` with the bundle on stdin: what pulumi-command's remote.Command does."""
        return self.in_ns(
            "ssh",
            "-i",
            str(self.private_key),
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            f"ConnectTimeout={connect_timeout}",
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "LogLevel=ERROR",
            f"{self.ssh_user}@{clone.node.ip}",
            command,
            input=stdin,
            timeout=timeout,
        )


@contextlib.contextmanager
def clone_lab(
    cfg: LabConfig, image: TemplateImage, workdir: Path, ssh_user: str, private_key: Path
) -> Iterator[CloneLab]:
    with CloneLab(cfg, image, workdir, ssh_user, private_key) as lab:
        yield lab


def make_ssh_key(directory: Path) -> tuple[Path, str]:
    """A fresh ed25519 key pair for this run: (private key file, public key line)."""
    key = directory / "id_ed25519"
    made = run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "labs-k8s-firstboot", "-f", str(key)])
    assert made.returncode == 0, made.stderr
    return key, key.with_suffix(".pub").read_text().strip()


def tools_missing() -> list[str]:
    tools = (
        "qemu-system-x86_64",
        "qemu-img",
        "debootstrap",
        "chroot",
        "tar",
        "mkfs.ext4",
        "sfdisk",
        "ssh",
        "ssh-keygen",
        "ssh-keyscan",
        "ip",
    )
    return [tool for tool in tools if shutil.which(tool) is None]


__all__: Sequence[str] = (
    "CloneLab",
    "TemplateImage",
    "build_image",
    "clone_lab",
    "guestinfo_environment",
    "image_packages",
    "make_ssh_key",
    "preseed_answers",
    "qemu_argv",
    "systemd_dropin",
    "tools_missing",
)
