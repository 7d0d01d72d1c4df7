"""The golden template's rendered media: preseed, boot menus, seal bundle, content-addressed name."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.rendering import CLOUDINIT_DIR
from components.rendering.template import (
    EXTRA_PACKAGES,
    GRUB_CFG_ISO_PATH,
    ISOLINUX_CFG_ISO_PATH,
    ISOLINUX_TXT_ISO_PATH,
    PRESEED_ISO_PATH,
    SEAL_SCRIPT_ISO_PATH,
    build_hostname,
    iso_files,
    late_commands,
    remastered_iso_name,
    render_boot_menus,
    render_bundle,
    render_preseed,
    render_seal_script,
    template_files,
    template_identity,
    template_version,
    template_vm_name,
)
from tests.labs import make_lab_config, namespace, public_key
from tests.requirements import require_tool

TEMPLATE_DIR = CLOUDINIT_DIR / "template"
EXCLUDE_NICS = "flannel*,cni*,veth*,docker*,cali*,vxlan*,tunl*,kube-ipvs*,cilium*"


# --------------------------------------------------------------------------- helpers (also used by test_iso)


def parse_preseed(text: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(owner, question) -> (type, value), joining backslash-continued lines like debconf does."""
    result: dict[tuple[str, str], tuple[str, str]] = {}
    logical = ""
    for line in text.splitlines():
        if not logical and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical += line
        owner, question, qtype, *value = logical.split(None, 3)
        result[(owner, question)] = (qtype, value[0].strip() if value else "")
        logical = ""
    assert not logical, "the preseed ends inside a continued line"
    return result


def isolinux_default_append(isolinux_cfg: str, txt_cfg: str) -> tuple[str, str]:
    """(default label, its append line) of an isolinux config split in isolinux.cfg + txt.cfg."""
    default = re.search(r"^default\s+(\S+)", isolinux_cfg, re.MULTILINE | re.IGNORECASE)
    assert default, "isolinux.cfg has no default"
    labels = re.split(r"^label\s+", txt_cfg, flags=re.MULTILINE | re.IGNORECASE)[1:]
    by_name = {block.split()[0]: block for block in labels}
    block = by_name[default.group(1)]
    append = re.search(r"^\s*append\s+(.*)$", block, re.MULTILINE | re.IGNORECASE)
    assert append, f"label {default.group(1)} has no append line"
    return default.group(1), append.group(1)


def grub_default_linux(grub_cfg: str) -> tuple[str, str]:
    """(default entry id, its linux line) of a grub.cfg."""
    default = re.search(r"^\s*set\s+default=\"?([^\"\s]+)", grub_cfg, re.MULTILINE)
    assert default, "grub.cfg sets no default"
    entries = re.findall(r"menuentry\s+'[^']*'\s+--id\s+(\S+)\s*\{(.*?)\n\}", grub_cfg, re.DOTALL)
    by_id = dict(entries)
    body = by_id[default.group(1)]
    linux = re.search(r"^\s*linux\s+(.*)$", body, re.MULTILINE)
    assert linux, f"menuentry {default.group(1)} has no linux line"
    kernel, _, args = linux.group(1).partition(" ")
    assert kernel == "/install.amd/vmlinuz"
    return default.group(1), args


def kernel_args(line: str) -> dict[str, str]:
    before_separator = line.split(" --- ")[0]
    return dict(word.partition("=")[::2] for word in before_separator.split())


STATIC = {"template": {"buildIp": "10.3.60.60"}}
EFI = {"template": {"firmware": "efi"}}
PROXY = {"mirrors": {"aptProxy": "http://apt-cache.labs.local:3142"}}
VARIANTS = {
    "dhcp-bios": {},
    "static-bios": STATIC,
    "dhcp-efi": EFI,
    "static-efi-proxy": {"template": {"buildIp": "10.3.60.60", "firmware": "efi"}, **PROXY},
}


# --------------------------------------------------------------------------- preseed


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_preseed_passes_debconf_checkonly(variant: str, tmp_path: Path) -> None:
    require_tool("debconf-set-selections")
    preseed = tmp_path / "preseed.cfg"
    preseed.write_text(render_preseed(make_lab_config(**VARIANTS[variant])))
    result = subprocess.run(
        ["debconf-set-selections", "--checkonly", str(preseed)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_debconf_checkonly_rejects_a_broken_preseed(tmp_path: Path) -> None:
    """The check above is worth something: a preseed with a broken line fails it."""
    require_tool("debconf-set-selections")
    broken = tmp_path / "broken.cfg"
    broken.write_text(render_preseed(make_lab_config()) + "d-i\n")
    result = subprocess.run(
        ["debconf-set-selections", "--checkonly", str(broken)], capture_output=True, text=True, check=False
    )
    assert result.returncode != 0


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_partitioning_is_one_ext4_root_and_no_swap(variant: str) -> None:
    cfg = make_lab_config(**VARIANTS[variant])
    answers = parse_preseed(render_preseed(cfg))
    recipe = answers[("d-i", "partman-auto/expert_recipe")][1]
    assert "swap" not in recipe, recipe
    assert recipe.count("mountpoint{ / }") == 1
    assert "filesystem{ ext4 }" in recipe
    assert answers[("d-i", "partman-auto/method")] == ("string", "regular")
    assert answers[("d-i", "partman-auto/choose_recipe")] == ("select", recipe.split()[0])
    # "Go back and add swap?" -> no.
    assert answers[("d-i", "partman-basicfilesystems/no_swap")] == ("boolean", "false")
    if cfg.template.firmware == "efi":
        assert "method{ efi }" in recipe
        assert answers[("d-i", "partman-partitioning/choose_label")] == ("select", "gpt")
    else:
        assert "efi" not in recipe
        assert answers[("d-i", "partman-partitioning/choose_label")] == ("select", "msdos")


def test_preseed_accounts_packages_and_finish() -> None:
    cfg = make_lab_config()
    answers = parse_preseed(render_preseed(cfg))
    assert answers[("d-i", "passwd/root-login")] == ("boolean", "false")
    assert answers[("d-i", "passwd/username")] == ("string", cfg.ssh.user)
    # A locked password: no password can ever log in; no clear-text password anywhere.
    assert answers[("d-i", "passwd/user-password-crypted")] == ("password", "!")
    assert ("d-i", "passwd/user-password") not in answers
    assert ("d-i", "passwd/root-password") not in answers
    assert answers[("tasksel", "tasksel/first")] == ("multiselect", "standard, ssh-server")
    included = answers[("d-i", "pkgsel/include")][1].split()
    assert set(EXTRA_PACKAGES) <= set(included)
    assert set(included) >= {
        "open-vm-tools",
        "cloud-init",
        "sudo",
        "curl",
        "ca-certificates",
        "gnupg",
        "systemd-timesyncd",
    }
    assert not any("desktop" in p or "gnome" in p or "kde" in p for p in included)
    assert answers[("d-i", "mirror/http/hostname")] == ("string", "deb.debian.org")
    assert answers[("d-i", "mirror/protocol")] == ("string", "http")
    assert answers[("d-i", "mirror/http/proxy")] == ("string", "")
    assert answers[("d-i", "clock-setup/utc")] == ("boolean", "true")
    assert answers[("d-i", "time/zone")] == ("string", "UTC")
    assert answers[("d-i", "clock-setup/ntp")] == ("boolean", "true")
    assert answers[("d-i", "clock-setup/ntp-server")] == ("string", cfg.network.ntp_servers[0])
    assert answers[("d-i", "debian-installer/exit/poweroff")] == ("boolean", "true")
    assert answers[("d-i", "cdrom-detect/eject")] == ("boolean", "false")


def test_late_command_copies_and_runs_the_seal_script_from_the_cdrom() -> None:
    answers = parse_preseed(render_preseed(make_lab_config()))
    late = answers[("d-i", "preseed/late_command")][1]
    steps = [step.strip() for step in late.split("&&")]
    assert "cp -r /cdrom/labs-k8s /target/usr/local/lib/labs-k8s/template" in steps
    assert steps[-1] == "in-target bash /usr/local/lib/labs-k8s/template/seal-template.sh /"
    assert "rm -f /usr/lib/finish-install.d/55netcfg-copy-config" in steps
    assert "in-target visudo -cf /etc/sudoers.d/labs-k8s" in steps
    # Every file the late command installs is in the bundle on the ISO.
    bundle = {path.rsplit("/", 1)[1] for path in render_bundle(make_lab_config())}
    for used in re.findall(r"/usr/local/lib/labs-k8s/template/(\S+)", late):
        assert used in bundle, used


def test_preseed_network_dhcp_and_static() -> None:
    dhcp = parse_preseed(render_preseed(make_lab_config()))
    assert dhcp[("d-i", "netcfg/disable_autoconfig")] == ("boolean", "false")
    assert ("d-i", "netcfg/get_ipaddress") not in dhcp
    assert dhcp[("d-i", "netcfg/get_hostname")] == ("string", "labs-k8s-debian12")
    assert dhcp[("d-i", "netcfg/get_domain")] == ("string", "labs.local")

    cfg = make_lab_config(network={"dnsServers": ["10.3.60.1", "10.3.60.2"]}, **STATIC)
    static = parse_preseed(render_preseed(cfg))
    assert static[("d-i", "netcfg/disable_autoconfig")] == ("boolean", "true")
    assert static[("d-i", "netcfg/get_ipaddress")] == ("string", "10.3.60.60")
    assert static[("d-i", "netcfg/get_netmask")] == ("string", "255.255.255.0")
    assert static[("d-i", "netcfg/get_gateway")] == ("string", "10.3.60.1")
    assert static[("d-i", "netcfg/get_nameservers")] == ("string", "10.3.60.1 10.3.60.2")
    assert static[("d-i", "netcfg/confirm_static")] == ("boolean", "true")


# What netcfg (debian-installer 12) can ask on the way through an unattended install, by path.
# dhcp.c asks dhcp_failed/dhcp_options when no lease comes, no_default_route when the lease has
# no router and get_nameservers when it has no DNS, all at critical priority: unanswered, each
# stops the install at a prompt.
NETCFG_EVERY_MODE = {
    "choose_interface",
    "link_wait_timeout",
    "disable_autoconfig",
    "get_hostname",
    "hostname",
    "get_domain",
    "get_nameservers",
    "wireless_wep",
}
NETCFG_DHCP = {"dhcp_timeout", "no_default_route", "dhcp_failed", "dhcp_options"}
NETCFG_STATIC = {"get_ipaddress", "get_netmask", "get_gateway", "confirm_static"}
# netcfg/dhcp_options' choices (netcfg's templates; a select is answered with the English text).
DHCP_OPTIONS = {
    "Retry network autoconfiguration",
    "Retry network autoconfiguration with a DHCP hostname",
    "Configure network manually",
    "Do not configure the network at this time",
}


@pytest.mark.parametrize("mode", ["dhcp", "static"])
def test_preseed_answers_every_netcfg_question(mode: str) -> None:
    cfg = make_lab_config(network={"dnsServers": ["10.3.60.1", "10.3.60.2"]}, **(STATIC if mode == "static" else {}))
    answers = parse_preseed(render_preseed(cfg))
    netcfg = {
        question.removeprefix("netcfg/"): answer
        for (owner, question), answer in answers.items()
        if owner == "d-i" and question.startswith("netcfg/")
    }
    expected = NETCFG_EVERY_MODE | (NETCFG_STATIC if mode == "static" else NETCFG_DHCP)
    assert expected <= set(netcfg), f"unanswered: {sorted(expected - set(netcfg))}"
    # A lease without DNS must not stop the install: the lab's DNS servers, in both modes.
    assert netcfg["get_nameservers"] == ("string", "10.3.60.1 10.3.60.2")
    if mode == "dhcp":
        assert not NETCFG_STATIC & set(netcfg)
        assert netcfg["no_default_route"] == ("boolean", "true")
        assert netcfg["dhcp_failed"] == ("note", "")
        qtype, choice = netcfg["dhcp_options"]
        assert qtype == "select" and choice in DHCP_OPTIONS
        assert choice.startswith("Retry")  # no manual configuration to fall back on without a build address
    else:
        assert not NETCFG_DHCP & set(netcfg)


def test_preseed_apt_proxy() -> None:
    answers = parse_preseed(render_preseed(make_lab_config(**PROXY)))
    assert answers[("d-i", "mirror/http/proxy")] == ("string", "http://apt-cache.labs.local:3142")


def test_build_hostname_is_a_dns_label() -> None:
    assert build_hostname(make_lab_config()) == "labs-k8s-debian12"
    assert build_hostname(make_lab_config(template={"name": "Golden_Deb.12"})) == "golden-deb-12"


# --------------------------------------------------------------------------- boot menus


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_boot_menus_default_to_the_automatic_install(variant: str) -> None:
    cfg = make_lab_config(**VARIANTS[variant])
    menus = render_boot_menus(cfg)
    assert set(menus) == {ISOLINUX_CFG_ISO_PATH, ISOLINUX_TXT_ISO_PATH, GRUB_CFG_ISO_PATH}

    label, append = isolinux_default_append(menus[ISOLINUX_CFG_ISO_PATH], menus[ISOLINUX_TXT_ISO_PATH])
    entry, linux = grub_default_linux(menus[GRUB_CFG_ISO_PATH])
    assert label == entry == "auto"
    bios_args, uefi_args = kernel_args(append), kernel_args(linux)
    bios_args.pop("initrd")
    assert bios_args == uefi_args
    for args in (bios_args, uefi_args):
        assert args["auto"] == "true"
        assert args["priority"] == "critical"
        assert args["preseed/file"] == "/cdrom/preseed.cfg"
        assert args["DEBIAN_FRONTEND"] == "text"
        assert args["netcfg/choose_interface"] == "auto"
        if cfg.template.build_ip is None:
            assert "netcfg/disable_autoconfig" not in args
        else:
            assert args["netcfg/disable_autoconfig"] == "true"
            assert args["netcfg/get_ipaddress"] == str(cfg.template.build_ip)
            assert args["netcfg/get_gateway"] == str(cfg.network.gateway)
            assert args["netcfg/get_netmask"] == "255.255.255.0"
    assert " --- " in append and " --- " in linux
    # Short timeouts, so the unattended build starts by itself.
    assert re.search(r"^timeout\s+([1-9]\d?)$", menus[ISOLINUX_CFG_ISO_PATH], re.MULTILINE)
    assert re.search(r"^set timeout=([1-9])$", menus[GRUB_CFG_ISO_PATH], re.MULTILINE)


# --------------------------------------------------------------------------- seal bundle


def test_seal_bundle_contents() -> None:
    cfg = make_lab_config()
    bundle = render_bundle(cfg)
    assert bundle[SEAL_SCRIPT_ISO_PATH] == (TEMPLATE_DIR / "seal-template.sh").read_text()
    assert render_seal_script(cfg).startswith("#!/usr/bin/env bash\n")
    datasource = bundle["/labs-k8s/90-labs-k8s-datasource.cfg"]
    assert yaml.safe_load(datasource) == {"datasource_list": ["VMware", "OVF", "NoCloud", "None"]}
    assert "datasource_list: [ VMware, OVF, NoCloud, None ]" in datasource
    tools = bundle["/labs-k8s/tools.conf"]
    assert re.search(r"^\[guestinfo\]\nexclude-nics=(\S+)$", tools, re.MULTILINE).group(1) == EXCLUDE_NICS
    unit = bundle["/labs-k8s/labs-k8s-ssh-hostkeys.service"]
    assert "ExecStart=/usr/bin/ssh-keygen -A" in unit
    assert re.search(r"^Before=.*\bssh\.service\b", unit, re.MULTILINE)
    assert bundle["/labs-k8s/sudoers"].strip().endswith(f"{cfg.ssh.user} ALL=(ALL:ALL) NOPASSWD: ALL")
    assert not any("timesyncd" in path for path in bundle)  # clones get NTP from cloud-init
    assert "PasswordAuthentication no" in bundle["/labs-k8s/sshd.conf"]


def test_seal_script_is_shellcheck_clean() -> None:
    require_tool("shellcheck")
    result = subprocess.run(
        ["shellcheck", "--shell=bash", "--severity=style", str(TEMPLATE_DIR / "seal-template.sh")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout


# --------------------------------------------------------------------------- files and naming


def test_template_files_for_the_offline_render() -> None:
    cfg = make_lab_config()
    files = template_files(cfg)
    assert not any(path.startswith("/") for path in files)
    assert files["preseed.cfg"] == render_preseed(cfg)
    assert files["labs-k8s/seal-template.sh"] == render_seal_script(cfg)
    assert {"isolinux/isolinux.cfg", "isolinux/txt.cfg", "boot/grub/grub.cfg"} <= set(files)
    assert set(iso_files(cfg)) == {f"/{path}" for path in files}
    assert PRESEED_ISO_PATH in iso_files(cfg)


def test_template_name_is_content_addressed() -> None:
    base = make_lab_config()
    version = template_version(base)
    assert re.fullmatch(r"[0-9a-f]{12}", version)
    assert template_version(make_lab_config()) == version, "rendering must be deterministic"
    assert re.fullmatch(r"labs-k8s-debian12-[0-9a-f]{12}\.iso", remastered_iso_name(base))

    template_inputs = {
        "iso checksum": {"template": {"isoSha256": "1" * 64}},
        "firmware": EFI,
        "disk size": {"template": {"diskGib": 40}},
        "ssh user": {"ssh": {"user": "ops"}},
        "search domain": {"network": {"searchDomain": "lab.example"}},
    }
    for what, change in template_inputs.items():
        assert template_version(make_lab_config(**change)) != version, f"changing the {what} must make a new template"

    node_inputs = {
        "worker sizing": {"nodes": {**_nodes(), "workers": {**_nodes()["workers"], "vcpu": 4, "memoryMib": 8192}}},
        "kubernetes version": {"kubernetes": {"version": "1.35.2"}},
        "ssh key": {"ssh": {"publicKey": public_key(comment="someone-else")}},
        "load balancer": {"loadBalancer": {"vip": "10.3.60.101"}},
        "vsphere folder": {"vsphere": {"folder": "elsewhere"}},
        "build VM size": {"template": {"vcpu": 4, "memoryMib": 4096, "buildTimeoutMinutes": 90}},
    }
    for what, change in node_inputs.items():
        assert template_version(make_lab_config(**change)) == version, f"the {what} must not rebuild the template"

    # How the installer reaches the network during the build: new media for the next build (a new
    # ISO in the cache), never a rebuild of a template that keeps nothing of it.
    network = namespace()["network"]
    build_environment = {
        "build address": STATIC,
        "apt proxy": PROXY,
        "ntp servers": {"network": {**network, "ntpServers": ["ntp.labs.local"]}},
        "dns servers": {"network": {**network, "dnsServers": ["10.3.60.2"]}},
    }
    for what, change in build_environment.items():
        cfg = make_lab_config(**change)
        assert iso_files(cfg) != iso_files(base), f"the {what} is on the install media"
        assert remastered_iso_name(cfg) != remastered_iso_name(base), f"new media for the {what}: a new cached ISO"
        assert template_version(cfg) == version, f"the {what} must not rebuild the template"


def test_template_name_carries_its_identity() -> None:
    """Content, placement, firmware and stack: a template differing in any of them has another name,
    so no `up` mistakes it for its own (a placement change used to adopt, then delete, the old one)."""
    base = make_lab_config()
    identity = template_identity(base, "labs")
    assert re.fullmatch(r"[0-9a-f]{12}", identity)
    assert template_vm_name(base, "labs") == f"labs-k8s-debian12-{identity}"
    assert template_identity(make_lab_config(), "labs") == identity, "deterministic"
    vsphere = namespace()["vsphere"]
    different = {
        "stack": (base, "other"),
        "content": (make_lab_config(template={"isoSha256": "1" * 64}), "labs"),
        "firmware": (make_lab_config(**EFI), "labs"),
        **{
            key: (make_lab_config(vsphere={**vsphere, key: f"elsewhere-{key}"}), "labs")
            for key in ("datacenter", "computeCluster", "datastore", "network", "folder", "resourcePool")
        },
    }
    for what, (cfg, stack) in different.items():
        assert template_identity(cfg, stack) != identity, f"the {what} must be part of the template's identity"
    same = {
        "worker sizing": {"nodes": {**_nodes(), "workers": {**_nodes()["workers"], "vcpu": 4}}},
        "build VM size": {"template": {"vcpu": 4, "memoryMib": 4096, "buildTimeoutMinutes": 90}},
        "kubernetes version": {"kubernetes": {"version": "1.35.2"}},
    }
    for what, change in same.items():
        assert template_identity(make_lab_config(**change), "labs") == identity, f"the {what} is not identity"


def _nodes() -> dict[str, Any]:
    return namespace()["nodes"]


def test_nodes_take_security_updates_but_never_the_clusters_own_packages() -> None:
    """Issue 50: `pkgsel/update-policy none` and a template reused for months left every node
    without security updates. Debian's unattended-upgrades runs daily (security origins only);
    kubeadm, the kubelet, kubectl and containerd change only through the config (and are held)."""
    cfg = make_lab_config()
    preseed = render_preseed(cfg)
    assert "d-i pkgsel/update-policy select unattended-upgrades" in preseed
    assert "update-policy select none" not in preseed
    config = render_bundle(cfg)["/labs-k8s/52labs-k8s-unattended-upgrades"]
    blacklist = re.search(r"Unattended-Upgrade::Package-Blacklist \{([^}]*)\};", config).group(1)
    for package in ("kubeadm", "kubelet", "kubectl", "containerd.io"):
        assert f'"{package}";' in blacklist, package
    assert 'Unattended-Upgrade::Automatic-Reboot "false";' in config
    assert any(
        c.endswith("52labs-k8s-unattended-upgrades /etc/apt/apt.conf.d/52labs-k8s-unattended-upgrades")
        for c in late_commands(cfg)
    )
    runbook = (TEMPLATE_DIR.parent.parent / "docs" / "runbook.md").read_text()
    assert "unattended-upgrades" in runbook and "Rebuilding the template" in runbook
