"""The golden template's install media, rendered from the config: pure, no Pulumi, no network.

The template is a Debian 12 netinst ISO remastered with:
- `/preseed.cfg`: the unattended install (cloudinit/template/preseed.cfg.j2);
- `/isolinux/isolinux.cfg`, `/isolinux/txt.cfg` (BIOS) and `/boot/grub/grub.cfg` (UEFI): boot
  menus whose default entry starts that install with `preseed/file=/cdrom/preseed.cfg`;
- `/labs-k8s/`: the seal script and the files the installer puts into the target.

The template's name carries a hash of all of this plus the source ISO's checksum, so a change
to any of the template's own inputs makes a new template, and a change to nodes does not. How the
installer reaches the network during the build (name servers, NTP server, apt proxy, a static
build address) is left out of that hash: none of it stays in the sealed template (clones get
theirs from cloud-init and the node-settings step), so changing it records the new media for the
next build instead of rebuilding the template (template_version).
"""

from __future__ import annotations

import ipaddress
import re

from components.config import LabConfig
from components.rendering import content_hash, read_file, render_template

# Where things are on the remastered ISO (the installer mounts it at /cdrom).
PRESEED_ISO_PATH = "/preseed.cfg"
BUNDLE_ISO_DIR = "/labs-k8s"
SEAL_SCRIPT = "seal-template.sh"
SEAL_SCRIPT_ISO_PATH = f"{BUNDLE_ISO_DIR}/{SEAL_SCRIPT}"
ISOLINUX_CFG_ISO_PATH = "/isolinux/isolinux.cfg"
ISOLINUX_TXT_ISO_PATH = "/isolinux/txt.cfg"
GRUB_CFG_ISO_PATH = "/boot/grub/grub.cfg"

# Where the bundle lands in the installed system (kept there, so the template can be re-sealed).
TARGET_BUNDLE_DIR = "/usr/local/lib/labs-k8s/template"

# Debian 12 amd64 netinst: the text-mode installer kernel and initrd.
INSTALLER_KERNEL = "/install.amd/vmlinuz"
INSTALLER_INITRD = "/install.amd/initrd.gz"
BOOT_MENU_TIMEOUT_SECONDS = 3

# Security updates only, never the cluster's packages (issue 50): an apt.conf.d drop-in of the template.
UNATTENDED_UPGRADES = "52labs-k8s-unattended-upgrades"

# Packages on top of tasksel's "standard" and "ssh-server".
EXTRA_PACKAGES = (
    "open-vm-tools",
    "cloud-init",
    "sudo",
    "curl",
    "ca-certificates",
    "gnupg",
    "systemd-timesyncd",
    # ifupdown applies the clones' `dns-nameservers` (written by cloud-init's ENI renderer) only
    # through resolvconf; without it clones keep the build's /etc/resolv.conf (docs/cloud-init.md).
    "resolvconf",
)

# The seal script's snippets: static files that go into the bundle unchanged.
SEAL_SNIPPETS = (
    "90-labs-k8s-datasource.cfg",
    "tools.conf",
    "labs-k8s-ssh-hostkeys.service",
)

_KERNEL_ARG_SAFE = re.compile(r"^[A-Za-z0-9._:/=,+-]+$")


def build_hostname(cfg: LabConfig) -> str:
    """The build VM's hostname: the template name as a DNS label (clones get their own)."""
    label = re.sub(r"[^a-z0-9-]+", "-", cfg.template.name.lower()).strip("-")[:63].strip("-")
    return label or "labs-k8s-template"


def _static_network(cfg: LabConfig) -> dict[str, str] | None:
    if cfg.template.build_ip is None:
        return None
    return {
        "address": str(cfg.template.build_ip),
        "netmask": str(cfg.network.cidr.netmask),
        "gateway": str(cfg.network.gateway),
    }


def _bundle_path(name: str) -> str:
    return f"{TARGET_BUNDLE_DIR}/{name}"


def late_commands(cfg: LabConfig) -> list[str]:
    """The installer's last steps, in the installer's shell (busybox), chained with `&&`."""
    bundle = f"/cdrom{BUNDLE_ISO_DIR}"
    commands = [
        # netcfg would copy the installer's network config (the build address) into the target
        # after this command; the template must not carry it, cloud-init configures each clone.
        "rm -f /usr/lib/finish-install.d/55netcfg-copy-config",
        # finish-install's 94save-logs would then copy the installer's logs and debconf answers
        # (cdebconf questions.dat: the build address, the apt proxy URL with any credentials, the
        # name servers) to /target/var/log/installer, after the seal below, into every clone.
        "rm -f /usr/lib/finish-install.d/94save-logs",
        f"rm -rf /target{TARGET_BUNDLE_DIR}",
        f"mkdir -p /target{TARGET_BUNDLE_DIR.rsplit('/', 1)[0]}",
        f"cp -r {bundle} /target{TARGET_BUNDLE_DIR}",
        f"in-target install -m 0440 {_bundle_path('sudoers')} /etc/sudoers.d/labs-k8s",
        "in-target visudo -cf /etc/sudoers.d/labs-k8s",
        f"in-target install -D -m 0644 {_bundle_path('sshd.conf')} /etc/ssh/sshd_config.d/labs-k8s.conf",
        f"in-target install -D -m 0644 {_bundle_path(UNATTENDED_UPGRADES)} /etc/apt/apt.conf.d/{UNATTENDED_UPGRADES}",
    ]
    commands.append(f"in-target bash {_bundle_path(SEAL_SCRIPT)} /")
    return commands


def render_preseed(cfg: LabConfig) -> str:
    """The debian-installer preseed file (debconf-set-selections format)."""
    return render_template(
        "template/preseed.cfg.j2",
        hostname=build_hostname(cfg),
        domain=cfg.network.search_domain or "",
        static=_static_network(cfg),
        # netcfg's list of name servers is space-separated.
        nameservers=" ".join(str(ns) for ns in cfg.network.dns_servers),
        apt_proxy=cfg.mirrors.apt_proxy or "",
        ntp_servers=cfg.network.ntp_servers or ["0.debian.pool.ntp.org"],
        ssh_user=cfg.ssh.user,
        efi=cfg.template.firmware == "efi",
        packages=EXTRA_PACKAGES,
        late_commands=late_commands(cfg),
    )


def render_seal_script(cfg: LabConfig) -> str:
    """The seal script: the same for every lab (it takes no config), read as is."""
    return read_file(f"template/{SEAL_SCRIPT}")


def installer_kernel_args(cfg: LabConfig) -> str:
    """Kernel command line of the automatic boot entry (before the `---` separator)."""
    args = [
        "auto=true",
        "priority=critical",
        f"preseed/file=/cdrom{PRESEED_ISO_PATH}",
        "DEBIAN_FRONTEND=text",
        "locale=en_US.UTF-8",
        "keymap=us",
        f"hostname={build_hostname(cfg)}",
    ]
    if cfg.network.search_domain:
        args.append(f"domain={cfg.network.search_domain}")
    static = _static_network(cfg)
    if static is None:
        args.append("netcfg/choose_interface=auto")
    else:
        args += [
            "netcfg/choose_interface=auto",
            "netcfg/disable_autoconfig=true",
            f"netcfg/get_ipaddress={static['address']}",
            f"netcfg/get_netmask={static['netmask']}",
            f"netcfg/get_gateway={static['gateway']}",
            # One value on the kernel line (no spaces there); the preseed lists them all.
            f"netcfg/get_nameservers={cfg.network.dns_servers[0]}",
            "netcfg/confirm_static=true",
        ]
    unsafe = [a for a in args if not _KERNEL_ARG_SAFE.match(a)]
    if unsafe:
        raise ValueError(f"kernel arguments with characters a boot loader would mangle: {unsafe}")
    return " ".join(args)


def render_boot_menus(cfg: LabConfig) -> dict[str, str]:
    """ISO path -> boot menu text: isolinux (BIOS) and GRUB (UEFI), both defaulting to the automatic install."""
    context = {
        "template_name": cfg.template.name,
        "kernel": INSTALLER_KERNEL,
        "initrd": INSTALLER_INITRD,
        "auto_args": installer_kernel_args(cfg),
        "timeout_seconds": BOOT_MENU_TIMEOUT_SECONDS,
    }
    return {
        ISOLINUX_CFG_ISO_PATH: render_template("template/isolinux/isolinux.cfg.j2", **context),
        ISOLINUX_TXT_ISO_PATH: render_template("template/isolinux/txt.cfg.j2", **context),
        GRUB_CFG_ISO_PATH: render_template("template/grub/grub.cfg.j2", **context),
    }


def render_bundle(cfg: LabConfig) -> dict[str, str]:
    """ISO path -> text of the `/labs-k8s/` directory: seal script, its snippets, installer drop-ins."""
    files = {SEAL_SCRIPT_ISO_PATH: render_seal_script(cfg)}
    for snippet in SEAL_SNIPPETS:
        files[f"{BUNDLE_ISO_DIR}/{snippet}"] = read_file(f"template/{snippet}")
    files[f"{BUNDLE_ISO_DIR}/sshd.conf"] = read_file("template/sshd.conf")
    files[f"{BUNDLE_ISO_DIR}/{UNATTENDED_UPGRADES}"] = read_file(f"template/{UNATTENDED_UPGRADES}")
    files[f"{BUNDLE_ISO_DIR}/sudoers"] = render_template("template/sudoers.j2", ssh_user=cfg.ssh.user)
    return files


def iso_files(cfg: LabConfig) -> dict[str, str]:
    """Every file the remaster adds to or replaces on the ISO: ISO path -> text."""
    files = {PRESEED_ISO_PATH: render_preseed(cfg)}
    files.update(render_boot_menus(cfg))
    files.update(render_bundle(cfg))
    return dict(sorted(files.items()))


def template_files(cfg: LabConfig) -> dict[str, str]:
    """Relative path -> text, for the offline render command (`render/template/...`)."""
    return {path.lstrip("/"): text for path, text in iso_files(cfg).items()}


# How the installer reaches the network while it builds; nothing of it stays in the sealed
# template (seal-template.sh drops the installer's apt proxy; 55netcfg-copy-config is removed).
_BUILD_ENVIRONMENT_PLACEHOLDERS = {
    "dns_servers": [ipaddress.IPv4Address("192.0.2.53")],  # TEST-NET-1 (RFC 5737): never a real server
    "ntp_servers": ["ntp.build.invalid"],
}


def _without_build_environment(cfg: LabConfig) -> LabConfig:
    """`cfg` with the build-time network settings replaced by fixed placeholders (for hashing only)."""
    return cfg.model_copy(
        update={
            "network": cfg.network.model_copy(update=_BUILD_ENVIRONMENT_PLACEHOLDERS),
            "template": cfg.template.model_copy(update={"build_ip": None}),
            "mirrors": cfg.mirrors.model_copy(update={"apt_proxy": None}),
        }
    )


def _media_hash(cfg: LabConfig) -> str:
    parts = [f"iso-sha256={cfg.template.iso_sha256}", f"disk-gib={cfg.template.disk_gib}"]
    for path, text in iso_files(cfg).items():
        parts += [path, text]
    return content_hash(*parts)


def template_version(cfg: LabConfig) -> str:
    """Content hash of what the template is: the source ISO, everything put on it, and the OS disk
    size (clones never grow their OS disk beyond the template's). Nodes do not enter it, and
    neither does the build environment (name servers, NTP, apt proxy, build address): a new DNS
    server must not cost a 30-minute rebuild of a template that keeps nothing of it."""
    return _media_hash(_without_build_environment(cfg))


def template_identity(cfg: LabConfig, stack: str) -> str:
    """Hash of everything that makes one template VM different from another: its content
    (template_version), where it lives (datacenter, cluster, datastore, network, folder, resource
    pool), its firmware, and the stack that owns it. Two stacks, or two placements, never share a
    name, so no `up` can mistake another template for its own."""
    placement = cfg.vsphere
    return content_hash(
        f"version={template_version(cfg)}",
        f"stack={stack}",
        f"datacenter={placement.datacenter}",
        f"cluster={placement.compute_cluster}",
        f"datastore={placement.datastore}",
        f"network={placement.network}",
        f"folder={placement.folder}",
        f"resource-pool={placement.resource_pool or ''}",
        f"firmware={cfg.template.firmware}",
    )


def template_vm_name(cfg: LabConfig, stack: str) -> str:
    """The template VM's name in vCenter: `<template.name>-<identity>`."""
    return f"{cfg.template.name}-{template_identity(cfg, stack)}"


def remastered_iso_name(cfg: LabConfig) -> str:
    """File name of the remastered ISO in the local cache: by the media's exact content (build
    environment included), so a placement change (a new template, same media) reuses it and new
    media never do. On the datastore it is stored per stack and template."""
    return f"{cfg.template.name}-{_media_hash(cfg)}.iso"


__all__ = [
    "BOOT_MENU_TIMEOUT_SECONDS",
    "EXTRA_PACKAGES",
    "GRUB_CFG_ISO_PATH",
    "ISOLINUX_CFG_ISO_PATH",
    "ISOLINUX_TXT_ISO_PATH",
    "PRESEED_ISO_PATH",
    "SEAL_SCRIPT_ISO_PATH",
    "build_hostname",
    "installer_kernel_args",
    "iso_files",
    "late_commands",
    "remastered_iso_name",
    "render_boot_menus",
    "render_bundle",
    "render_preseed",
    "render_seal_script",
    "template_files",
    "template_identity",
    "template_version",
    "template_vm_name",
]
