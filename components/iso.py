"""Install media of the golden template: fetch the Debian netinst ISO and remaster it.

`download_iso` streams the ISO to disk and checks its SHA-256 before anything uses it.
`remaster_iso` adds/replaces files (preseed, seal bundle, boot menus) with xorriso, which
replays the source's El Torito boot records (BIOS isolinux and UEFI efi.img) and its hybrid
MBR/GPT, so the result boots the way the original does (docs/template.md says why not pycdlib).
`prepare_template_iso` ties both to the config and caches by content: the remastered ISO is
named after the template (`<template.name>-<content hash>.iso`).

No Pulumi in here: the template builder calls these from a dynamic resource or a pre-step.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path, PurePosixPath
from urllib.parse import urlparse

from components.config import LabConfig
from components.rendering.template import (
    GRUB_CFG_ISO_PATH,
    INSTALLER_INITRD,
    INSTALLER_KERNEL,
    ISOLINUX_CFG_ISO_PATH,
    SEAL_SCRIPT_ISO_PATH,
    iso_files,
    remastered_iso_name,
)

CHUNK_SIZE = 1 << 20
MIB = 1 << 20
# How often a running download says how far it is (the netinst is ~700 MB: minutes on a slow link).
PROGRESS_INTERVAL_S = 10.0
# Where a build phase is, as it happens: the template provider passes pulumi.log.info's wrapper.
Progress = Callable[[str], None]


def _no_progress(_message: str) -> None:
    pass


def mib_rate(size: int, seconds: float) -> str:
    """ "702 MiB in 95 s, 7.4 MiB/s" """
    return f"{size / MIB:.0f} MiB in {seconds:.0f} s, {size / MIB / max(seconds, 1e-3):.1f} MiB/s"


_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_EXECUTABLE_ISO_PATHS = frozenset({SEAL_SCRIPT_ISO_PATH})
# What the remastered boot menus rely on: a Debian amd64 netinst has all of these.
NETINST_PATHS = (INSTALLER_KERNEL, INSTALLER_INITRD, ISOLINUX_CFG_ISO_PATH, GRUB_CFG_ISO_PATH)


class IsoError(RuntimeError):
    """Fetching or remastering the install ISO failed; the message says what to do."""


class IsoChecksumError(IsoError):
    """The downloaded ISO is not the one the config pins."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(CHUNK_SIZE):
            digest.update(chunk)
    return digest.hexdigest()


def download_iso(
    url: str, sha256: str, dest: Path, *, timeout: float = 60.0, progress: Progress = _no_progress
) -> Path:
    """Download `url` to `dest`, streaming, and verify its SHA-256; return `dest`.

    An existing `dest` with the right checksum is reused without downloading. The download
    goes to `dest.part` first and is renamed only once the checksum matches, so `dest` is
    never a partial or wrong file. Raises IsoChecksumError on a mismatch, IsoError otherwise.
    """
    expected = sha256.strip().lower()
    if not _SHA256.match(expected):
        raise IsoError(f"{sha256!r} is not a SHA-256 (64 hex digits); set labs-k8s:template.isoSha256")
    dest = Path(dest)
    if dest.is_file() and sha256_file(dest) == expected:
        progress(f"the Debian ISO is already in {dest} (SHA-256 checked): no download")
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    digest = hashlib.sha256()
    size = 0
    started = last = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(part, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0)
            progress(f"downloading {url}" + (f" ({total / MIB:.0f} MiB)" if total else "") + f" into {dest.parent}")
            while chunk := response.read(CHUNK_SIZE):
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
                if time.monotonic() - last >= PROGRESS_INTERVAL_S:
                    last = time.monotonic()
                    of_total = f" of {total / MIB:.0f}" if total else ""
                    progress(f"downloaded {size / MIB:.0f}{of_total} MiB ({mib_rate(size, last - started)})")
    except (urllib.error.URLError, OSError) as error:
        part.unlink(missing_ok=True)
        raise IsoError(
            f"could not download the install ISO {url}: {error}; check labs-k8s:template.isoUrl "
            f"and this machine's access to it (or put the verified ISO at {dest} yourself)"
        ) from error
    actual = digest.hexdigest()
    if actual != expected:
        part.unlink(missing_ok=True)
        raise IsoChecksumError(
            f"checksum mismatch for {url}: expected sha256 {expected}, got {actual} ({size} bytes). "
            "The download is corrupt or the URL serves another file. Take the checksum from the "
            "SHA256SUMS file next to the ISO (same point release) and set labs-k8s:template.isoSha256, "
            "or fix labs-k8s:template.isoUrl."
        )
    os.replace(part, dest)
    progress(f"downloaded {url}: {mib_rate(size, time.monotonic() - started)}, SHA-256 checked")
    return dest


def _xorriso() -> str:
    path = shutil.which("xorriso")
    if path is None:
        raise IsoError("xorriso is not installed; it remasters the install ISO (Debian: apt-get install xorriso)")
    return path


def _run(args: list[str], what: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
        raise IsoError(f"{what} failed (xorriso exit {result.returncode}):\n{tail}")
    return result


def _check_iso_path(iso_path: str) -> str:
    pure = PurePosixPath(iso_path)
    if not pure.is_absolute() or ".." in pure.parts or str(pure) == "/":
        raise IsoError(f"{iso_path!r} is not an absolute file path inside the ISO")
    return str(pure)


def remaster_iso(source: Path, dest: Path, files: Mapping[str, str | bytes], *, require: Iterable[str] = ()) -> Path:
    """Write `dest`: the ISO `source` with `files` (ISO path -> content) added or replaced.

    The El Torito boot catalog (BIOS and UEFI entries), the isolinux boot info table and the
    hybrid MBR/GPT are re-created from the source (`-boot_image any replay`). The source must
    have El Torito boot records and every path in `require`; the result must have the same
    boot images, else IsoError. `dest` appears only when all of that holds.
    """
    source, dest = Path(source), Path(dest)
    if not source.is_file():
        raise IsoError(f"source ISO {source} does not exist")
    xorriso = _xorriso()
    # xorriso treats a file that is no ISO as a blank medium and happily writes a new,
    # unbootable image: check what the source is before, and what was written after.
    boot = boot_images(source)
    if not boot:
        raise IsoError(
            f"{source} has no El Torito boot record: it is not a bootable install ISO "
            "(a truncated download, or not the Debian netinst image?)"
        )
    missing = sorted(set(map(_check_iso_path, require)) - iso_paths_present(source, require))
    if missing:
        raise IsoError(f"{source} lacks {', '.join(missing)}: it is not a Debian 12 amd64 netinst ISO")
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    part.unlink(missing_ok=True)
    try:
        with tempfile.TemporaryDirectory(prefix="labs-k8s-iso-") as staging:
            args = [xorriso, "-no_rc", "-indev", str(source), "-outdev", str(part), "-boot_image", "any", "replay"]
            for index, (iso_path, content) in enumerate(sorted(files.items())):
                iso_path = _check_iso_path(iso_path)
                local = Path(staging) / f"{index:03d}-{PurePosixPath(iso_path).name}"
                local.write_bytes(content.encode() if isinstance(content, str) else content)
                local.chmod(0o755 if iso_path in _EXECUTABLE_ISO_PATHS else 0o644)
                args += ["-map", str(local), iso_path]
            args += ["-commit"]
            _run(args, f"remastering {source} into {dest}")
        written = boot_images(part)
        if written != boot:
            raise IsoError(f"remastering {source} lost boot records: had {boot}, wrote {written}")
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    os.replace(part, dest)
    return dest


def read_iso_file(iso: Path, iso_path: str) -> bytes:
    """One file's content from an ISO (via xorriso's extract), for checks and diagnostics."""
    xorriso = _xorriso()
    with tempfile.TemporaryDirectory(prefix="labs-k8s-iso-") as scratch:
        local = Path(scratch) / "extracted"
        _run(
            [
                xorriso,
                "-no_rc",
                "-osirrox",
                "on",
                "-indev",
                str(iso),
                "-extract",
                _check_iso_path(iso_path),
                str(local),
            ],
            f"reading {iso_path} from {iso}",
        )
        return local.read_bytes()


def el_torito_report(iso: Path) -> str:
    """xorriso's plain report of the ISO's El Torito boot catalog and system area."""
    result = _run(
        [_xorriso(), "-no_rc", "-indev", str(iso), "-report_el_torito", "plain", "-report_system_area", "plain"],
        f"reading the boot records of {iso}",
    )
    return result.stdout


def boot_images(iso: Path) -> dict[str, str]:
    """Platform ("BIOS", "UEFI") -> boot image path, from the ISO's El Torito catalog."""
    report = el_torito_report(iso)
    platforms = dict(re.findall(r"^El Torito boot img :\s+(\d+)\s+(\w+)\s", report, re.MULTILINE))
    paths = dict(re.findall(r"^El Torito img path :\s+(\d+)\s+(\S+)$", report, re.MULTILINE))
    return {platform: paths.get(number, "") for number, platform in platforms.items()}


def iso_paths_present(iso: Path, paths: Iterable[str]) -> set[str]:
    """Which of `paths` exist in the ISO."""
    wanted = [_check_iso_path(p) for p in paths]
    if not wanted:
        return set()
    result = _run([_xorriso(), "-no_rc", "-indev", str(iso), "-ls", *wanted], f"listing {iso}")
    listed = {line.strip().strip("'") for line in result.stdout.splitlines()}
    return {p for p in wanted if p in listed}


def source_iso_name(url: str) -> str:
    """The cached source ISO's file name: the URL's last path component."""
    name = PurePosixPath(urlparse(url).path).name
    if not name.endswith(".iso"):
        raise IsoError(f"{url} does not name an .iso file; set labs-k8s:template.isoUrl to the netinst ISO")
    return name


def build_install_media(
    url: str,
    sha256: str,
    files: Mapping[str, str | bytes],
    name: str,
    cache_dir: Path,
    progress: Progress = _no_progress,
) -> Path:
    """Download the source ISO (once, verified) and remaster it with `files` (once per `name`).

    `name` is the remastered ISO's file name; it carries the template's content hash, so a
    cached file with that name always has exactly these contents.
    """
    cache_dir = Path(cache_dir)
    source = download_iso(url, sha256, cache_dir / source_iso_name(url), progress=progress)
    dest = cache_dir / name
    if dest.is_file():
        progress(f"the remastered installer ISO is already in {dest}")
        return dest
    started = time.monotonic()
    progress(f"remastering the installer ISO with xorriso: preseed, seal script, boot menus -> {dest.name}")
    remaster_iso(source, dest, files, require=NETINST_PATHS)
    progress(f"remastered {dest.name} in {time.monotonic() - started:.0f} s")
    return dest


def prepare_template_iso(cfg: LabConfig, cache_dir: Path) -> Path:
    """build_install_media for a lab config: its ISO, its rendered files, its template name."""
    return build_install_media(
        cfg.template.iso_url, cfg.template.iso_sha256, iso_files(cfg), remastered_iso_name(cfg), cache_dir
    )


__all__ = [
    "NETINST_PATHS",
    "IsoChecksumError",
    "IsoError",
    "boot_images",
    "build_install_media",
    "download_iso",
    "el_torito_report",
    "iso_paths_present",
    "prepare_template_iso",
    "read_iso_file",
    "remaster_iso",
    "sha256_file",
    "source_iso_name",
]
