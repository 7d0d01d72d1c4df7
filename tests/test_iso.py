"""Install media: verified download (file:// and a loopback HTTP server only) and the remaster.

The remaster test builds a small stand-in for the Debian netinst ISO laid out like the real one
(isolinux/ with Debian's isolinux.bin and ldlinux.c32, boot/grub/ with a FAT efi.img, El Torito
BIOS + UEFI entries, isohybrid MBR/GPT), remasters it, then reads it back with xorriso and,
independently, with pycdlib.
"""

from __future__ import annotations

import hashlib
import io
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pycdlib
import pytest

from components.iso import (
    IsoChecksumError,
    IsoError,
    boot_images,
    download_iso,
    el_torito_report,
    prepare_template_iso,
    read_iso_file,
    remaster_iso,
    source_iso_name,
)
from components.rendering.template import (
    GRUB_CFG_ISO_PATH,
    ISOLINUX_CFG_ISO_PATH,
    ISOLINUX_TXT_ISO_PATH,
    PRESEED_ISO_PATH,
    SEAL_SCRIPT_ISO_PATH,
    iso_files,
    remastered_iso_name,
    render_preseed,
    render_seal_script,
)
from tests.labs import make_lab_config
from tests.requirements import require_tool
from tests.standin_iso import (
    PROXY_VARIABLES,
    SYSLINUX_BIOS,
    VOLUME_ID,
    QuietHandler,
    build_standin_netinst,
    debian_like_menus,
    serve_directory,
)
from tests.test_template_render import grub_default_linux, isolinux_default_append, kernel_args

# --------------------------------------------------------------------------- download


@pytest.fixture
def payload(tmp_path: Path) -> tuple[Path, str]:
    """A 3 MiB stand-in 'ISO' (more than one download chunk) and its SHA-256."""
    served = tmp_path / "served"
    served.mkdir()
    path = served / "debian-12.12.0-amd64-netinst.iso"
    data = hashlib.sha256(b"seed").digest() * (3 * 1024 * 1024 // 32) + b"tail"
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


@pytest.fixture
def loopback_server(payload: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 serving the payload's directory; yields its base URL."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    with serve_directory(payload[0].parent) as url:
        yield url


def test_download_from_a_file_url_verifies_the_checksum(payload: tuple[Path, str], tmp_path: Path) -> None:
    source, sha = payload
    dest = tmp_path / "cache" / "netinst.iso"
    assert download_iso(source.as_uri(), sha, dest) == dest
    assert dest.read_bytes() == source.read_bytes()
    assert not dest.with_name(dest.name + ".part").exists()


def test_download_from_loopback_http(payload: tuple[Path, str], loopback_server: str, tmp_path: Path) -> None:
    source, sha = payload
    dest = tmp_path / "cache" / source.name
    download_iso(f"{loopback_server}/{source.name}", sha.upper(), dest)
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == sha
    assert QuietHandler.requests_seen == [f"/{source.name}"]


def test_checksum_mismatch_fails_clearly_and_leaves_nothing(
    payload: tuple[Path, str], loopback_server: str, tmp_path: Path
) -> None:
    source, sha = payload
    wrong = "0" * 64
    dest = tmp_path / "cache" / source.name
    with pytest.raises(IsoChecksumError) as error:
        download_iso(f"{loopback_server}/{source.name}", wrong, dest)
    message = str(error.value)
    assert f"expected sha256 {wrong}" in message
    assert f"got {sha}" in message
    assert "labs-k8s:template.isoSha256" in message
    assert not dest.exists()
    assert not dest.with_name(dest.name + ".part").exists()


def test_a_verified_cached_iso_is_not_downloaded_again(
    payload: tuple[Path, str], loopback_server: str, tmp_path: Path
) -> None:
    source, sha = payload
    dest = tmp_path / source.name
    url = f"{loopback_server}/{source.name}"
    download_iso(url, sha, dest)
    download_iso(url, sha, dest)
    assert QuietHandler.requests_seen == [f"/{source.name}"]
    # A cached file that no longer matches is replaced by a fresh, verified download.
    dest.write_bytes(b"corrupted")
    download_iso(url, sha, dest)
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == sha
    assert len(QuietHandler.requests_seen) == 2


def test_download_errors_name_the_url(loopback_server: str, tmp_path: Path) -> None:
    url = f"{loopback_server}/no-such.iso"
    with pytest.raises(IsoError, match=re.escape(url)) as error:
        download_iso(url, "a" * 64, tmp_path / "x.iso")
    assert not isinstance(error.value, IsoChecksumError)
    with pytest.raises(IsoError, match="64 hex digits"):
        download_iso(url, "not-a-checksum", tmp_path / "x.iso")


def test_source_iso_name() -> None:
    cfg = make_lab_config()
    assert source_iso_name(cfg.template.iso_url) == "debian-12.12.0-amd64-netinst.iso"
    with pytest.raises(IsoError):
        source_iso_name("https://example.invalid/download?id=3")


# --------------------------------------------------------------------------- stand-in netinst ISO


def _system_area(report: str) -> str:
    match = re.search(r"^System area summary: (.*)$", report, re.MULTILINE)
    return match.group(1) if match else ""


@pytest.fixture(scope="module")
def standin_iso(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_standin_netinst(tmp_path_factory.mktemp("standin"))


@pytest.fixture(scope="module")
def remastered(standin_iso: Path) -> tuple[Path, dict[str, str]]:
    cfg = make_lab_config(template={"buildIp": "10.3.60.60"})
    files = iso_files(cfg)
    dest = standin_iso.parent / "out" / remastered_iso_name(cfg)
    assert remaster_iso(standin_iso, dest, files) == dest
    return dest, files


def test_standin_is_a_hybrid_bios_and_uefi_iso(standin_iso: Path) -> None:
    report = el_torito_report(standin_iso)
    assert boot_images(standin_iso) == {"BIOS": "/isolinux/isolinux.bin", "UEFI": "/boot/grub/efi.img"}
    assert "MBR isohybrid" in _system_area(report) and "GPT" in _system_area(report)


def test_remaster_keeps_both_el_torito_boot_records(standin_iso: Path, remastered: tuple[Path, dict[str, str]]) -> None:
    iso, _ = remastered
    before, after = el_torito_report(standin_iso), el_torito_report(iso)
    assert (
        boot_images(iso)
        == boot_images(standin_iso)
        == {
            "BIOS": "/isolinux/isolinux.bin",
            "UEFI": "/boot/grub/efi.img",
        }
    )
    # isolinux.bin needs its boot info table patched for the new layout.
    assert re.search(r"^El Torito img opts :\s+1\s+.*boot-info-table", after, re.MULTILINE)
    # The hybrid MBR/GPT (USB-stick boot, and how some firmwares find efi.img) survives too.
    assert _system_area(after) == _system_area(before)
    assert iso.read_bytes()[510:512] == b"\x55\xaa"


def test_remaster_boot_records_read_back_with_pycdlib(remastered: tuple[Path, dict[str, str]]) -> None:
    iso_path, files = remastered
    iso = pycdlib.PyCdlib()
    iso.open(str(iso_path))
    try:
        assert iso.pvd.volume_identifier.decode().strip() == VOLUME_ID
        catalog = iso.eltorito_boot_catalog
        assert catalog is not None, "no El Torito boot catalog"
        assert catalog.validation_entry.platform_id == 0  # x86 BIOS
        assert catalog.initial_entry.boot_indicator == 0x88  # bootable
        assert catalog.initial_entry.sector_count == 4
        efi_sections = [s for s in catalog.sections if s.platform_id == 0xEF]
        assert len(efi_sections) == 1 and efi_sections[0].section_entries[0].boot_indicator == 0x88
        for iso_file, text in files.items():
            out = io.BytesIO()
            iso.get_file_from_iso_fp(out, rr_path=iso_file)
            assert out.getvalue().decode() == text, iso_file
        seal = iso.get_record(rr_path=SEAL_SCRIPT_ISO_PATH)
        assert seal.rock_ridge.get_file_mode() & 0o777 == 0o755
    finally:
        iso.close()


def test_remaster_adds_preseed_and_seal_bundle(remastered: tuple[Path, dict[str, str]]) -> None:
    iso, files = remastered
    cfg = make_lab_config(template={"buildIp": "10.3.60.60"})
    assert read_iso_file(iso, PRESEED_ISO_PATH).decode() == render_preseed(cfg) == files[PRESEED_ISO_PATH]
    assert read_iso_file(iso, SEAL_SCRIPT_ISO_PATH).decode() == render_seal_script(cfg)
    for snippet in ("90-labs-k8s-datasource.cfg", "tools.conf", "labs-k8s-ssh-hostkeys.service", "sudoers"):
        assert read_iso_file(iso, f"/labs-k8s/{snippet}").decode() == files[f"/labs-k8s/{snippet}"]
    # Everything else is the source's, untouched.
    assert read_iso_file(iso, "/install.amd/vmlinuz") == b"stand-in kernel\n"
    assert read_iso_file(iso, "/isolinux/ldlinux.c32") == (SYSLINUX_BIOS / "ldlinux.c32").read_bytes()
    assert read_iso_file(iso, "/isolinux/gtk.cfg").decode() == debian_like_menus()["isolinux/gtk.cfg"]


def test_remastered_boot_menus_default_to_the_preseeded_install(remastered: tuple[Path, dict[str, str]]) -> None:
    iso, files = remastered
    isolinux_cfg = read_iso_file(iso, ISOLINUX_CFG_ISO_PATH).decode()
    txt_cfg = read_iso_file(iso, ISOLINUX_TXT_ISO_PATH).decode()
    grub_cfg = read_iso_file(iso, GRUB_CFG_ISO_PATH).decode()
    assert (isolinux_cfg, txt_cfg, grub_cfg) == (
        files[ISOLINUX_CFG_ISO_PATH],
        files[ISOLINUX_TXT_ISO_PATH],
        files[GRUB_CFG_ISO_PATH],
    )
    # Debian's own menu chain (menu.cfg -> gtk.cfg, graphical default) is no longer included.
    assert "menu.cfg" not in isolinux_cfg and "gtk.cfg" not in isolinux_cfg
    label, append = isolinux_default_append(isolinux_cfg, txt_cfg)
    entry, linux = grub_default_linux(grub_cfg)
    assert label == entry == "auto"
    for args in (kernel_args(append), kernel_args(linux)):
        assert args["preseed/file"] == "/cdrom/preseed.cfg"
        assert args["auto"] == "true" and args["priority"] == "critical"
        assert args["netcfg/get_ipaddress"] == "10.3.60.60"
    assert kernel_args(append)["initrd"] == "/install.amd/initrd.gz"
    # The kernel and initrd the menus name exist on the ISO.
    for path in ("/install.amd/vmlinuz", "/install.amd/initrd.gz"):
        assert read_iso_file(iso, path)


def test_remaster_of_a_non_iso_fails_and_writes_nothing(tmp_path: Path) -> None:
    require_tool("xorriso")
    bogus = tmp_path / "bogus.iso"
    bogus.write_bytes(b"not an iso" * 1000)
    dest = tmp_path / "out.iso"
    # xorriso alone would write a fresh, unbootable ISO here (it takes a non-ISO for a blank medium).
    with pytest.raises(IsoError, match="no El Torito boot record"):
        remaster_iso(bogus, dest, {PRESEED_ISO_PATH: "d-i foo/bar string x\n"})
    assert not dest.exists() and not dest.with_name("out.iso.part").exists()
    with pytest.raises(IsoError, match="does not exist"):
        remaster_iso(tmp_path / "absent.iso", dest, {})


def test_remaster_requires_the_netinst_layout(standin_iso: Path, tmp_path: Path) -> None:
    dest = tmp_path / "out.iso"
    with pytest.raises(IsoError, match=re.escape("lacks /install.amd/xen/vmlinuz")):
        remaster_iso(standin_iso, dest, {}, require=["/install.amd/vmlinuz", "/install.amd/xen/vmlinuz"])
    with pytest.raises(IsoError, match="not an absolute file path"):
        remaster_iso(standin_iso, dest, {"preseed.cfg": "x"})
    assert not dest.exists()


def test_prepare_template_iso_downloads_once_and_names_by_content(
    standin_iso: Path, loopback_server: str, payload: tuple[Path, str], tmp_path: Path
) -> None:
    served = payload[0].parent / standin_iso.name
    shutil.copy(standin_iso, served)
    sha = hashlib.sha256(served.read_bytes()).hexdigest()
    base = make_lab_config()
    cfg = base.model_copy(
        update={
            "template": base.template.model_copy(
                update={"iso_url": f"{loopback_server}/{served.name}", "iso_sha256": sha}
            )
        }
    )
    cache = tmp_path / "cache"
    first = prepare_template_iso(cfg, cache)
    assert first == cache / remastered_iso_name(cfg)
    assert (cache / served.name).read_bytes() == served.read_bytes()
    assert read_iso_file(first, PRESEED_ISO_PATH).decode() == render_preseed(cfg)
    stamp = first.stat().st_mtime_ns
    assert prepare_template_iso(cfg, cache) == first
    assert first.stat().st_mtime_ns == stamp, "an existing remaster of the same version is reused"
    assert QuietHandler.requests_seen == [f"/{served.name}"], "the verified source ISO is downloaded once"
