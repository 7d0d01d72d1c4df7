"""A stand-in Debian 12 netinst ISO and a loopback HTTP server to fetch it from.

The stand-in is laid out like the real netinst (isolinux/ with Debian's isolinux.bin and
ldlinux.c32, boot/grub/ with a FAT efi.img, El Torito BIOS + UEFI entries, isohybrid MBR/GPT), so
the real download and remaster code (components/iso.py) runs on it: tests/test_iso.py checks the
remaster, tests/test_template_engine.py feeds it to the template provider through Pulumi's
dynamic-provider host.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

from tests.requirements import require_tool, unavailable

ISOLINUX_BIN = Path("/usr/lib/ISOLINUX/isolinux.bin")
ISOHYBRID_MBR = Path("/usr/lib/ISOLINUX/isohdpfx.bin")
SYSLINUX_BIOS = Path("/usr/lib/syslinux/modules/bios")
SYSLINUX_MODULES = ("ldlinux.c32", "vesamenu.c32", "libcom32.c32", "libutil.c32")
VOLUME_ID = "Debian 12.12.0 amd64 n"
PROXY_VARIABLES = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


def debian_like_menus() -> dict[str, str]:
    """Boot menus shaped like Debian 12's (graphical installer first, no preseed)."""
    return {
        "isolinux/isolinux.cfg": "path\ninclude menu.cfg\ndefault vesamenu.c32\nprompt 0\ntimeout 0\n",
        "isolinux/menu.cfg": "menu hshift 4\nmenu width 70\ninclude gtk.cfg\ninclude txt.cfg\n",
        "isolinux/gtk.cfg": (
            "default installgui\nlabel installgui\n\tmenu label ^Graphical install\n\tmenu default\n"
            "\tkernel /install.amd/vmlinuz\n\tappend vga=788 initrd=/install.amd/gtk/initrd.gz --- quiet\n"
        ),
        "isolinux/txt.cfg": (
            "label install\n\tmenu label ^Install\n\tkernel /install.amd/vmlinuz\n"
            "\tappend vga=788 initrd=/install.amd/initrd.gz --- quiet\n"
        ),
        "boot/grub/grub.cfg": (
            "set theme=/boot/grub/theme/1\nmenuentry --hotkey=g 'Graphical install' {\n"
            "    set background_color=black\n    linux    /install.amd/vmlinuz vga=788 --- quiet\n"
            "    initrd   /install.amd/gtk/initrd.gz\n}\n"
        ),
    }


def build_standin_netinst(work: Path) -> Path:
    """Write a stand-in Debian 12 netinst ISO into ``work`` and return its path."""
    require_tool("xorriso", "mkfs.vfat", "mmd", "mcopy")
    missing = [str(p) for p in (ISOLINUX_BIN, ISOHYBRID_MBR) if not p.is_file()]
    missing += [str(SYSLINUX_BIOS / m) for m in SYSLINUX_MODULES if not (SYSLINUX_BIOS / m).is_file()]
    if missing:
        unavailable(f"needs Debian's isolinux and syslinux-common packages (missing {', '.join(missing)})")
    stage = work / "stage"
    for rel, text in {
        **debian_like_menus(),
        "install.amd/vmlinuz": "stand-in kernel\n",
        "install.amd/initrd.gz": "stand-in initrd\n",
        "install.amd/gtk/initrd.gz": "stand-in gtk initrd\n",
        ".disk/info": 'Debian GNU/Linux 12.12.0 "Bookworm" - Official amd64 NETINST (stand-in)\n',
        "md5sum.txt": "00000000000000000000000000000000  ./install.amd/vmlinuz\n",
    }.items():
        (stage / rel).parent.mkdir(parents=True, exist_ok=True)
        (stage / rel).write_text(text)
    shutil.copy(ISOLINUX_BIN, stage / "isolinux" / "isolinux.bin")
    for module in SYSLINUX_MODULES:
        shutil.copy(SYSLINUX_BIOS / module, stage / "isolinux" / module)
    # UEFI: a FAT image holding EFI/boot/bootx64.efi, as Debian's boot/grub/efi.img does. The
    # loader inside is a placeholder: this test checks the boot records, it boots nothing.
    efi_img = stage / "boot" / "grub" / "efi.img"
    loader = work / "bootx64.efi"
    loader.write_bytes(b"MZ stand-in EFI loader\n")
    _run(["mkfs.vfat", "-C", str(efi_img), "1440"])
    _run(["mmd", "-i", str(efi_img), "::/EFI", "::/EFI/boot"])
    _run(["mcopy", "-i", str(efi_img), str(loader), "::/EFI/boot/bootx64.efi"])
    iso = work / "debian-12.12.0-amd64-netinst.iso"
    _run(
        [
            "xorriso",
            "-as",
            "mkisofs",
            "-r",
            "-J",
            "-joliet-long",
            "-V",
            VOLUME_ID,
            "-o",
            str(iso),
            "-isohybrid-mbr",
            str(ISOHYBRID_MBR),
            "-b",
            "isolinux/isolinux.bin",
            "-c",
            "isolinux/boot.cat",
            "-no-emul-boot",
            "-boot-load-size",
            "4",
            "-boot-info-table",
            "-eltorito-alt-boot",
            "-e",
            "boot/grub/efi.img",
            "-no-emul-boot",
            "-isohybrid-gpt-basdat",
            str(stage),
        ]
    )
    return iso


def _run(args: list[str]) -> str:
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{' '.join(args)}\n{result.stdout}\n{result.stderr}"
    return result.stdout


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    requests_seen: ClassVar[list[str]] = []

    def log_message(self, format: str, *args: object) -> None:
        QuietHandler.requests_seen.append(self.path)


@contextlib.contextmanager
def serve_directory(directory: Path) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 serving ``directory``; yields its base URL.

    Requests are recorded in QuietHandler.requests_seen (cleared here). Callers keep proxies
    away from loopback themselves (PROXY_VARIABLES, no_proxy): this only serves.
    """
    QuietHandler.requests_seen = []
    handler = functools.partial(QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
