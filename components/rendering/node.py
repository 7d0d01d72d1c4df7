"""cloud-init instance data of each clone: identity, network and first-boot setup.

Each clone reads it through cloud-init's VMware datasource from guestinfo keys in the VM's
extraConfig (not through VMware guest customization, which is unreliable on Debian:
vmware/packer-examples-for-vsphere#815, #848). The documents are templates under
`cloudinit/node/`; docs/cloud-init.md explains every choice. Targets cloud-init 22.4 (Debian 12).

Pure: config in, text out. No Pulumi and no network in here.
"""

from __future__ import annotations

import base64
import functools
import gzip
from collections.abc import Sequence
from dataclasses import dataclass

import yaml

from components.config import LabConfig, Node, Role
from components.rendering import content_hash, read_file, render_template
from components.rendering.host_keys import HostKey

METADATA_TEMPLATE = "node/metadata.yaml.j2"
NETWORK_TEMPLATE = "node/network-config.yaml.j2"
USERDATA_TEMPLATE = "node/user-data.yaml.j2"
DATA_DISK_CHECK = "node/data-disk-ready.sh"
SETTINGS_SCRIPT = "node/apply-node-settings.sh"
SETTINGS_ENTRYPOINT = "apply-node-settings.sh"

# The config keys whose change a running node takes in place (the node-settings step), without
# a new VM. Everything else in a node's cloud-init documents is its identity: a change there
# gives a new instance-id, and the VM layer replaces the VM on a new instance-id.
IN_PLACE_KEYS = (
    "ssh.publicKey",
    "ssh.extraPublicKeys",
    "network.ntpServers",
    "network.dnsServers",
    "mirrors.aptProxy",
)

# The data disk: SCSI unit 1 of the first PVSCSI controller. vSphere puts that controller in
# PCI slot 160, which Linux sees as 0000:03:00.0 (as slot 192 gives the NIC its name ens192).
# udev's by-path name depends only on that layout, never on probe order as /dev/sdb does.
DATA_DISK_BY_PATH = "/dev/disk/by-path/pci-0000:03:00.0-scsi-0:0:1:0"
DATA_DISK_ALIAS = "labs_data"


@dataclass(frozen=True)
class DataDisk:
    """Where a role's data disk goes and what depends on it."""

    mount_point: str
    label: str  # ext4 labels: at most 16 bytes
    consumer: str  # the unit that must not start before the disk is mounted
    purpose: str  # argument of data-disk-ready.sh ("etcd": mode 0700, empty)


DATA_DISKS: dict[Role, DataDisk] = {
    Role.CONTROL_PLANE: DataDisk("/var/lib/etcd", "labs-etcd", "kubelet.service", "etcd"),
    Role.WORKER: DataDisk("/var/lib/containerd", "labs-containerd", "containerd.service", ""),
}

# open-vm-tools caps one guestinfo value at 64 KiB (GUESTMSG_MAX_IN_SIZE); the RPC reply
# framing takes a few bytes of it, so keep a margin.
GUESTINFO_VALUE_LIMIT = 63 * 1024


def yaml_scalar(value: object) -> str:
    """`value` as one YAML scalar that loads back to exactly `value`, quoted only if needed.

    Memoized: the same few hundred values recur for every node, and PyYAML's emitter is slow.
    """
    return _yaml_scalar(value) if not isinstance(value, (list, dict)) else _yaml_scalar_uncached(value)


@functools.lru_cache(maxsize=4096)
def _yaml_scalar(value: object) -> str:
    return _yaml_scalar_uncached(value)


def _yaml_scalar_uncached(value: object) -> str:
    """`value` as one YAML scalar that loads back to exactly `value`, quoted only if needed.

    PyYAML decides the quoting. The value is dumped inside a flow sequence, whose rules for
    plain scalars are the strictest (no `,`, `[`, `]`...), so the result is safe anywhere in
    a template: a block mapping or a `[a, b]` flow sequence alike.
    """
    for style in (None, '"'):  # a string with a line break needs double quotes to stay on one line
        text = yaml.safe_dump([value], default_flow_style=True, default_style=style, width=float("inf"))
        if "\n" not in text[:-1]:
            return text[1:-2]
    raise ValueError(f"cannot write {value!r} as a one-line YAML scalar")


def fqdn(cfg: LabConfig, node: Node) -> str | None:
    domain = cfg.network.search_domain
    return f"{node.name}.{domain}" if domain else None


def node_mac(node: Node) -> str:
    """The static MAC of the node's NIC (lowercase, colon-separated): the per-host
    `nodes.<role>.hosts[].mac`, else derived from the node's IP (config.mac_for_ip).

    The VM layer gives the NIC this MAC (`use_static_mac`) and the network config matches it.
    """
    return node.mac


def interface_name(cfg: LabConfig) -> str:
    """The NIC's name on every node (`network.interface`): set by cloud-init, bound by Keepalived."""
    return cfg.network.interface


def render_network_config(cfg: LabConfig, node: Node) -> str:
    """Network config version 2 of the node: its NIC found by MAC, named, with the static address."""
    domain = cfg.network.search_domain
    return render_template(
        NETWORK_TEMPLATE,
        q=yaml_scalar,
        interface=interface_name(cfg),
        mac=node_mac(node),
        address=f"{node.ip}/{cfg.prefix_length}",
        gateway=str(cfg.network.gateway),
        dns_servers=[str(server) for server in cfg.network.dns_servers],
        search_domains=[domain] if domain else [],
    )


def _inline_script(text: str) -> str:
    """A script for `bash -c`, without its comment lines (they would only weigh on guestinfo)."""
    return "\n".join(line for line in text.splitlines() if not line.startswith("#")).strip() + "\n"


def _data_disk_context(node: Node) -> dict[str, str] | None:
    disk = DATA_DISKS.get(node.role)
    if disk is None or node.data_disk_gib <= 0:
        return None
    options = f"defaults,nofail,x-systemd.before={disk.consumer},x-systemd.required-by={disk.consumer}"
    return {
        "alias": DATA_DISK_ALIAS,
        "device": DATA_DISK_BY_PATH,
        "label": disk.label,
        "mount_point": disk.mount_point,
        "mount_options": options,
        "check": _inline_script(read_file(DATA_DISK_CHECK)),
        "purpose": disk.purpose,
    }


def authorized_keys(cfg: LabConfig) -> list[str]:
    """The keys the node's user trusts: ssh.publicKey, then ssh.extraPublicKeys (no duplicates)."""
    keys = [cfg.ssh.public_key.strip(), *(key.strip() for key in cfg.ssh.extra_public_keys)]
    return list(dict.fromkeys(key for key in keys if key))


HOST_KEY_FILES = {"ed25519": "/etc/ssh/ssh_host_ed25519_key", "ecdsa": "/etc/ssh/ssh_host_ecdsa_key"}


def host_key_config(host_keys: Sequence[HostKey]) -> str:
    """sshd's HostKey lines for exactly these keys: with any HostKey given, sshd loads no other
    (sshd_config(5)), so the RSA key that labs-k8s-ssh-hostkeys.service's `ssh-keygen -A` makes
    is never presented."""
    return "".join(f"HostKey {HOST_KEY_FILES[key.kind]}\n" for key in host_keys)


def render_userdata(cfg: LabConfig, node: Node, host_keys: Sequence[HostKey] = ()) -> str:
    """The node's `#cloud-config`. `host_keys`: the node's SSH host keys (its Ed25519 key, and on a
    control plane the shared VIP key); never part of the instance identity (`instance_id` renders
    without them), so a rotation changes no instance-id and replaces no VM."""
    return render_template(
        USERDATA_TEMPLATE,
        q=yaml_scalar,
        role=node.role.value,
        hostname=node.name,
        fqdn=fqdn(cfg, node),
        ssh_user=cfg.ssh.user,
        ssh_public_keys=authorized_keys(cfg),
        ntp_servers=list(cfg.network.ntp_servers),
        apt_proxy=cfg.mirrors.apt_proxy,
        data_disk=_data_disk_context(node),
        host_keys=list(host_keys),
        host_key_config=host_key_config(host_keys),
    )


def identity_config(cfg: LabConfig) -> LabConfig:
    """`cfg` with the IN_PLACE_KEYS blanked: what a node's identity is computed from."""
    return cfg.model_copy(
        update={
            "ssh": cfg.ssh.model_copy(update={"public_key": "", "extra_public_keys": []}),
            "network": cfg.network.model_copy(update={"ntp_servers": [], "dns_servers": []}),
            "mirrors": cfg.mirrors.model_copy(update={"apt_proxy": None}),
        }
    )


def instance_id(cfg: LabConfig, node: Node) -> str:
    """Stable for the same identity; new when anything of this node's user-data, network config
    or data disk changes but the IN_PLACE_KEYS (those a running node takes without a new VM).

    The VM layer replaces the VM when it changes (its `replace_trigger`); cloud-init treats a new
    ID as a new instance. Keeping it across in-place changes keeps a reboot from re-running
    cloud-init's per-instance modules (new host keys, users) on a node that is in service.
    """
    identity = identity_config(cfg)
    digest = content_hash(
        render_userdata(identity, node), render_network_config(identity, node), f"data-disk:{node.data_disk_gib}"
    )
    return f"{node.name}-{digest}"


def render_metadata(cfg: LabConfig, node: Node) -> str:
    """The VMware datasource metadata: instance-id, local-hostname and the network config."""
    return render_template(
        METADATA_TEMPLATE,
        q=yaml_scalar,
        instance_id=instance_id(cfg, node),
        hostname=node.name,
        network_config=render_network_config(cfg, node),
    )


def encode_guestinfo(text: str, limit: int = GUESTINFO_VALUE_LIMIT) -> tuple[str, str]:
    """(value, encoding) for one guestinfo key: base64, or gzip+base64 when base64 is too big.

    gzip's header timestamp is zeroed so the same text always gives the same value (no diff
    in `pulumi preview`). Raises ValueError when even the compressed value exceeds `limit`.
    """
    raw = text.encode()
    value = base64.b64encode(raw).decode()
    if len(value) <= limit:
        return value, "base64"
    value = base64.b64encode(gzip.compress(raw, compresslevel=9, mtime=0)).decode()
    if len(value) <= limit:
        return value, "gzip+base64"
    raise ValueError(
        f"{len(raw)} bytes of cloud-init data give a {len(value)}-byte guestinfo value even gzipped; "
        f"guestinfo values are limited to {limit} bytes: move content out of the cloud-config"
    )


def guestinfo_extra_config(cfg: LabConfig, node: Node, host_keys: Sequence[HostKey] = ()) -> dict[str, str]:
    """The VM's extraConfig keys that the VMware datasource reads."""
    metadata, metadata_encoding = encode_guestinfo(render_metadata(cfg, node))
    userdata, userdata_encoding = encode_guestinfo(render_userdata(cfg, node, host_keys))
    return {
        "guestinfo.metadata": metadata,
        "guestinfo.metadata.encoding": metadata_encoding,
        "guestinfo.userdata": userdata,
        "guestinfo.userdata.encoding": userdata_encoding,
    }


def node_files(cfg: LabConfig, node: Node) -> dict[str, str]:
    """The node's cloud-init documents by file name, for the offline render."""
    return {
        "meta-data.yaml": render_metadata(cfg, node),
        "user-data.yaml": render_userdata(cfg, node),
    }


def node_settings_files(cfg: LabConfig, node: Node) -> dict[str, str]:
    """The bundle of the node-settings step: cloudinit/node/apply-node-settings.sh and its inputs,
    the current values of the IN_PLACE_KEYS (the same values the node's guestinfo carries)."""
    resolv = [f"nameserver {server}" for server in cfg.network.dns_servers]
    if cfg.network.search_domain:
        resolv.append(f"search {cfg.network.search_domain}")
    return {
        SETTINGS_ENTRYPOINT: read_file(SETTINGS_SCRIPT),
        "authorized_keys": "".join(f"{key}\n" for key in authorized_keys(cfg)),
        "ntp-servers": " ".join(cfg.network.ntp_servers) + "\n",
        "network-config.yaml": render_network_config(cfg, node),
        "resolv.conf": "".join(f"{line}\n" for line in resolv),
        "apt-proxy": f"{cfg.mirrors.apt_proxy}\n" if cfg.mirrors.apt_proxy else "",
    }
