"""A real Debian 12 root filesystem for the template tests, and the preseed's late_command run in it.

`debootstrap_tarball` builds a bookworm rootfs with `debootstrap` through the Debian mirror apt is
configured with and keeps it as a tarball, so later runs only unpack it. `late_command_argv` turns
one step of the preseed's `late_command` into what it does to such a rootfs: the installer mounts
the remastered ISO at /cdrom and the new system at /target, and `in-target X` is `chroot /target X`.
Used by tests/test_seal_rootfs.py (the seal script alone) and tests/firstboot.py (a bootable image).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"


def run(args: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, check=False, **kwargs)


def clean_env() -> dict[str, str]:
    """What a command in the target sees: no host variables (locale, Python, proxies)."""
    return {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}


def debootstrap(root: Path, include: Sequence[str] = (), variant: str | None = None) -> float:
    """A bookworm rootfs at `root` (replaced if there); the seconds it took. Fails the test on error."""
    started = time.monotonic()
    args = ["debootstrap", *([f"--variant={variant}"] if variant else [])]
    if include:
        args.append(f"--include={','.join(include)}")
    # Once more on failure: a mirror caught mid-sync answers "Invalid Release signature" for a while.
    for _attempt in range(2):
        shutil.rmtree(root, ignore_errors=True)
        result = run([*args, SUITE, str(root), MIRROR])
        if result.returncode == 0:
            break
    if result.returncode != 0:
        log = root / "debootstrap" / "debootstrap.log"
        detail = log.read_text()[-3000:] if log.is_file() else ""
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"debootstrap failed ({result.returncode}):\n{result.stderr[-3000:]}\n{detail}", pytrace=False)
    return time.monotonic() - started


def pack(root: Path, tarball: Path) -> None:
    """`root` as a tarball (numeric owners, xattrs), written under a temporary name then renamed."""
    part = tarball.with_name(tarball.name + ".part")
    tar = run(["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-cf", str(part), "."])
    assert tar.returncode == 0, tar.stderr
    os.replace(part, tarball)


def debootstrap_tarball(tarball: Path, include: Sequence[str], variant: str | None = None) -> float | None:
    """Make `tarball` (a bookworm rootfs with `include`) unless it exists; seconds debootstrap took, or None."""
    if tarball.is_file():
        return None
    tarball.parent.mkdir(parents=True, exist_ok=True)
    build = tarball.with_name(tarball.name + ".build")
    shutil.rmtree(build, ignore_errors=True)
    seconds = debootstrap(build / "root", include, variant)
    pack(build / "root", tarball)
    shutil.rmtree(build, ignore_errors=True)
    return seconds


def in_target(root: Path, script: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    """`script` (sh) run in `root` as d-i's in-target runs a command: /proc, /sys and /dev/pts
    mounted, services kept from starting (policy-rc.d). The mounts live in a private mount
    namespace, so they go away with the command, whatever happens to it."""
    policy = root / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    r = shlex.quote(str(root))
    inner = (
        f"mount -t proc proc {r}/proc && mount -t sysfs sysfs {r}/sys && mkdir -p {r}/dev/pts"
        f" && mount -t devpts devpts {r}/dev/pts && exec chroot {r} sh -ec {shlex.quote(script)}"
    )
    env = {**clean_env(), "DEBIAN_FRONTEND": "noninteractive"}
    try:
        return run(["unshare", "--mount", "--propagation", "private", "sh", "-c", inner], env=env, timeout=timeout)
    finally:
        policy.unlink()


def unpack(tarball: Path, root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    result = run(["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-xpf", str(tarball)])
    assert result.returncode == 0, result.stderr


def write_tree(base: Path, files: Mapping[str, str]) -> None:
    """Relative path -> text, written under `base` (the remastered ISO's content, for /cdrom)."""
    for rel, content in files.items():
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


def late_command_argv(command: str, root: Path, cdrom: Path) -> list[str] | None:
    """One late_command step against `root`; None for a step that only touches the installer itself."""
    if command.startswith("in-target "):
        return ["chroot", str(root), *shlex.split(command.removeprefix("in-target "))]
    if "/target" in command:
        return ["sh", "-c", command.replace("/target", str(root)).replace("/cdrom", str(cdrom))]
    return None
