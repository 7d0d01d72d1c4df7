"""The lab's typed configuration: a pydantic v2 model of the `labs-k8s:` config namespace.

Validation happens in two passes, both before any Pulumi resource is registered:
1. pydantic checks types and shapes (an address that is not an address, a missing key);
2. `domain_problems` checks the lab as a whole (IP plan, quorum, sizes, versions) and
   returns every problem at once, so a user fixes a config in one round trip.

Every message names the config key as the user writes it (`labs-k8s:nodes.workers[0].ip`)
and says how to fix it.
"""

from __future__ import annotations

import base64
import ipaddress
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from pydantic import (
    AliasGenerator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)
from pydantic.alias_generators import to_camel

NAMESPACE = "labs-k8s"

# Top-level keys of the `labs-k8s:` namespace, in the order a user reads Pulumi.labs.yaml.
TOP_LEVEL_KEYS = (
    "vsphere",
    "network",
    "template",
    "nodes",
    "loadBalancer",
    "kubernetes",
    "ssh",
    "antiAffinity",
    "mirrors",
    "preflight",
    "previousState",
)

# Minors this program knows how to install: the kubeadm API version and the containerd
# major depend on it (v1beta3 up to 1.30, v1beta4 from 1.31; containerd 2.x after 1.35).
SUPPORTED_K8S_MINORS = range(30, 38)
KUBEADM_V1BETA4_FROM_MINOR = 31

# DNS label: RFC 1123, what Kubernetes accepts as a node name component.
_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_K8S_VERSION = re.compile(r"^1\.(\d+)\.(\d+)$")
_CONTAINERD_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
# Kubernetes 1.36 no longer supports containerd 1.x (KEP-4033); older minors accept 1.7.
CONTAINERD_2_FROM_MINOR = 36
_SSH_KEY_TYPES = (
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
)


class _Model(BaseModel):
    """Config keys are camelCase in YAML (Pulumi's convention), snake_case in Python."""

    model_config = ConfigDict(
        alias_generator=AliasGenerator(validation_alias=to_camel, serialization_alias=to_camel),
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )


class Role(StrEnum):
    BALANCER = "balancer"
    CONTROL_PLANE = "control-plane"
    WORKER = "worker"


class VsphereConfig(_Model):
    """Where the lab lives in vCenter. Credentials are the provider's own (`vsphere:*` or VSPHERE_*)."""

    datacenter: str = Field(min_length=1)
    compute_cluster: str = Field(min_length=1)
    datastore: str = Field(min_length=1)
    network: str = Field(min_length=1)
    folder: str = Field(min_length=1)
    resource_pool: str | None = None


class NetworkConfig(_Model):
    cidr: ipaddress.IPv4Network
    gateway: ipaddress.IPv4Address
    dns_servers: list[ipaddress.IPv4Address] = Field(min_length=1)
    search_domain: str | None = None
    ntp_servers: list[str] = Field(default_factory=lambda: ["0.debian.pool.ntp.org", "1.debian.pool.ntp.org"])
    # The node NIC's name on every node. cloud-init names the NIC with the node's static MAC
    # at first boot (set-name), so it no longer depends on the PCI slot vSphere picks
    # (ens160, ens192, ens224...); Keepalived binds this name.
    interface: str = "ens192"


class TemplateConfig(_Model):
    """The golden Debian 12 template: built once, reused by every clone."""

    name: str = "labs-k8s-debian12"
    iso_url: str = Field(min_length=1)
    iso_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    # None: the installer takes an address by DHCP; otherwise a static build address on the node network.
    build_ip: ipaddress.IPv4Address | None = None
    disk_gib: int = 20
    vcpu: int = 2
    memory_mib: int = 2048
    firmware: Literal["bios", "efi"] = "bios"
    build_timeout_minutes: int = 60
    retain_on_destroy: bool = False


class NodeConfig(_Model):
    name: str
    ip: ipaddress.IPv4Address
    # Static MAC of the node's NIC; derived from `ip` when unset (mac_for_ip).
    mac: str | None = None


class RoleConfig(_Model):
    vcpu: int
    memory_mib: int
    # Extra eager-zeroed disk: etcd on control planes, /var/lib/containerd on workers.
    # 0 means none. The OS disk is never grown beyond the template (provider #2123).
    data_disk_gib: int = 0
    hosts: list[NodeConfig]


class NodesConfig(_Model):
    balancers: RoleConfig
    control_planes: RoleConfig
    workers: RoleConfig


class LoadBalancerConfig(_Model):
    vip: ipaddress.IPv4Address
    vrrp_router_id: int = 51
    # VRRP advertisement interval; failover takes about 3 x advert_int.
    advert_int_seconds: int = 1
    # Explicit non-HA opt-in: one balancer, no Keepalived peer.
    allow_single_balancer: bool = False


class UpgradeConfig(_Model):
    """How a change of `kubernetes.version` rolls through the running cluster (docs/runbook.md)."""

    # Workers drained and upgraded at the same time. kubeadm's procedure: "one node at a time or few
    # nodes at a time, without compromising the minimum required capacity for running your workloads".
    workers_at_once: int = 1


class KubernetesConfig(_Model):
    version: str = "1.36.0"
    pod_cidr: ipaddress.IPv4Network = ipaddress.IPv4Network("10.244.0.0/16")
    service_cidr: ipaddress.IPv4Network = ipaddress.IPv4Network("10.96.0.0/12")
    cluster_name: str = "labs-k8s"
    # containerd.io from Docker's repository, installed at exactly this upstream version and held:
    # the runtime under every pod changes only when this value does.
    containerd_version: str = "2.2.1"
    # Explicit non-HA opt-in: exactly one control plane.
    allow_single_control_plane: bool = False
    # Explicit opt-in: one worker, which every upgrade drains with nowhere for its pods to go.
    allow_single_worker: bool = False
    upgrade: UpgradeConfig = UpgradeConfig()

    @property
    def minor(self) -> int:
        match = _K8S_VERSION.match(self.version)
        if match is None:
            raise ValueError(f"not a Kubernetes version: {self.version!r}")
        return int(match.group(1))

    @property
    def minor_version(self) -> str:
        return f"1.{self.minor}"

    @property
    def kubeadm_api_version(self) -> str:
        return "kubeadm.k8s.io/v1beta4" if self.minor >= KUBEADM_V1BETA4_FROM_MINOR else "kubeadm.k8s.io/v1beta3"


class SshConfig(_Model):
    user: str = "labs"
    # The key the remote steps log in with: labs-k8s:sshPrivateKey is its private half.
    public_key: str
    # More keys the user trusts (people; the next key during a rotation, docs/runbook.md).
    extra_public_keys: list[str] = Field(default_factory=list)


Policy = Literal["mandatory", "preferred", "off"]


class AntiAffinityConfig(_Model):
    """DRS anti-affinity per role. `mandatory` is a hard rule; `preferred` a soft one; `off` none."""

    control_planes: Policy = "mandatory"
    balancers: Policy = "mandatory"
    workers: Policy = "preferred"

    def for_role(self, role: Role) -> Policy:
        return {
            Role.BALANCER: self.balancers,
            Role.CONTROL_PLANE: self.control_planes,
            Role.WORKER: self.workers,
        }[role]


# The apt repositories the Kubernetes nodes install from, and the fingerprints of the keys that sign
# them: prepare-node.sh fetches each key and refuses one with another fingerprint before apt trusts
# it. The defaults are upstream's. pkgs.k8s.io's key: isv:kubernetes OBS project,
# `curl -fsSL https://pkgs.k8s.io/core:/stable:/v1.36/deb/Release.key | gpg --show-keys`. Docker's
# release key: docs.docker.com, "Install Docker Engine on Debian".
KUBERNETES_REPOSITORY_URL = "https://pkgs.k8s.io/core:/stable:"
KUBERNETES_KEY_FINGERPRINT = "DE15B14486CD377B9E876E1A234654DA9A296436"
CONTAINERD_REPOSITORY_URL = "https://download.docker.com/linux/debian"
CONTAINERD_KEY_FINGERPRINT = "9DC858229FC7DD38854AE2D88D81803C0EBFCD88"


class _RepositoryConfig(_Model):
    """An apt repository and its signing key's fingerprint. An internal mirror (Artifactory, Nexus,
    aptly) that re-signs what it serves has its own key: its fingerprint goes here.

    Written as users may copy them: a trailing "/" of the URL and the spaces gpg prints between the
    fingerprint's groups are dropped, the fingerprint upper-cased (domain_problems checks the rest)."""

    url: str
    key_fingerprint: str

    @field_validator("url")
    @classmethod
    def _without_trailing_slash(cls, url: str) -> str:
        return url.rstrip("/")

    @field_validator("key_fingerprint")
    @classmethod
    def _fingerprint_normalised(cls, fingerprint: str) -> str:
        return fingerprint.replace(" ", "").upper()


class KubernetesRepositoryConfig(_RepositoryConfig):
    """kubeadm, kubelet and kubectl: one repository per minor, `<url>/v<minor>/deb/`, whose key is
    `<url>/v<minor>/deb/Release.key` ("Changing The Kubernetes Package Repository", kubernetes.io)."""

    url: str = KUBERNETES_REPOSITORY_URL
    key_fingerprint: str = KUBERNETES_KEY_FINGERPRINT

    def key_url(self, minor: str) -> str:
        return f"{self.url}/v{minor}/deb/Release.key"


class ContainerdRepositoryConfig(_RepositoryConfig):
    """containerd.io: Docker's Debian repository (`deb <url> <codename> stable`), whose key is `<url>/gpg`."""

    url: str = CONTAINERD_REPOSITORY_URL
    key_fingerprint: str = CONTAINERD_KEY_FINGERPRINT

    def key_url(self) -> str:
        return f"{self.url}/gpg"


class MirrorsConfig(_Model):
    """For labs without direct internet access."""

    apt_proxy: str | None = None
    registry_mirror: str | None = None
    # Images are pulled by tag, so through a plain-http mirror anyone on the path serves the
    # apiserver's image: http:// is refused unless this opts in (and every run then warns).
    allow_insecure_registry_mirror: bool = False
    # The mirror's CA certificate(s), PEM, as apt's mirrors pin their signing keys: containerd
    # trusts it for that host (on top of the system's CAs), so a private CA needs no skip_verify.
    registry_mirror_ca: str | None = None
    kubernetes_repository: KubernetesRepositoryConfig = KubernetesRepositoryConfig()
    containerd_repository: ContainerdRepositoryConfig = ContainerdRepositoryConfig()


class PreflightConfig(_Model):
    enabled: bool = True
    # A DRS rule on a cluster without DRS does nothing: fail by default, or only warn.
    drs_disabled: Literal["fail", "warn"] = "fail"
    # Room kept free on the datastore on top of every eager-zeroed disk and VM swap file.
    datastore_margin_percent: int = 15
    # Where preflight checks that kubernetes.version exists (components/releases.py). Unset: the
    # repository the nodes install from, mirrors.kubernetesRepository.url (LabConfig.release_check_url).
    # "" skips that check.
    kubernetes_packages_url: str | None = None


class PreviousStateConfig(_Model):
    # What a run does when the last deployment's state cannot be read (components/previous_state.py):
    # "fail" stops before anything is registered; "ignore", for one run, goes on without it.
    unreadable: Literal["fail", "ignore"] = "fail"


# VMware's range for manually assigned MACs: 00:50:56:00:00:00-00:50:56:3F:FF:FF. vCenter
# refuses a static MAC with VMware's OUI outside it (the rest is for generated MACs).
VMWARE_MANUAL_MAC_PREFIX = "00:50:56"
VMWARE_MANUAL_MAC_BITS = 22
_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


def mac_for_ip(ip: ipaddress.IPv4Address) -> str:
    """00:50:56 followed by the low 22 bits of the address: inside VMware's manual range, and
    different for any two addresses of one network of /10 or longer (a node network always is)."""
    low = int(ip) & ((1 << VMWARE_MANUAL_MAC_BITS) - 1)
    return VMWARE_MANUAL_MAC_PREFIX + "".join(f":{b:02x}" for b in low.to_bytes(3, "big"))


def normalize_mac(text: str) -> str:
    """Lowercase, colon-separated (what vSphere and cloud-init compare against)."""
    return text.strip().lower().replace("-", ":")


def mac_problem(mac: str) -> str | None:
    if not _MAC.match(mac):
        return f"{mac!r} is not a MAC address; write six hex pairs such as 00:50:56:03:3c:33"
    if not mac.startswith(VMWARE_MANUAL_MAC_PREFIX + ":") or int(mac[9:11], 16) > 0x3F:
        return (
            f"{mac} is outside VMware's range for static MACs, which vCenter enforces; use "
            "00:50:56:00:00:00-00:50:56:3f:ff:ff, or remove the key to derive one from the IP"
        )
    return None


@dataclass(frozen=True)
class Node:
    """One VM of the lab with its role and sizing, flattened for the components."""

    name: str
    ip: ipaddress.IPv4Address
    role: Role
    vcpu: int
    memory_mib: int
    data_disk_gib: int
    # The NIC's static MAC; "" derives it from the IP (mac_for_ip).
    mac: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "mac", normalize_mac(self.mac) if self.mac else mac_for_ip(self.ip))


class LabConfig(_Model):
    vsphere: VsphereConfig
    network: NetworkConfig
    template: TemplateConfig
    nodes: NodesConfig
    load_balancer: LoadBalancerConfig
    kubernetes: KubernetesConfig = KubernetesConfig()
    ssh: SshConfig
    anti_affinity: AntiAffinityConfig = AntiAffinityConfig()
    mirrors: MirrorsConfig = MirrorsConfig()
    preflight: PreflightConfig = PreflightConfig()
    previous_state: PreviousStateConfig = PreviousStateConfig()

    def role_config(self, role: Role) -> RoleConfig:
        return {
            Role.BALANCER: self.nodes.balancers,
            Role.CONTROL_PLANE: self.nodes.control_planes,
            Role.WORKER: self.nodes.workers,
        }[role]

    def nodes_of(self, role: Role) -> list[Node]:
        group = self.role_config(role)
        return [
            Node(h.name, h.ip, role, group.vcpu, group.memory_mib, group.data_disk_gib, h.mac or "")
            for h in group.hosts
        ]

    @property
    def balancers(self) -> list[Node]:
        return self.nodes_of(Role.BALANCER)

    @property
    def control_planes(self) -> list[Node]:
        return self.nodes_of(Role.CONTROL_PLANE)

    @property
    def workers(self) -> list[Node]:
        return self.nodes_of(Role.WORKER)

    @property
    def all_nodes(self) -> list[Node]:
        return self.balancers + self.control_planes + self.workers

    @property
    def kubernetes_nodes(self) -> list[Node]:
        return self.control_planes + self.workers

    @property
    def prefix_length(self) -> int:
        return self.network.cidr.prefixlen

    @property
    def release_check_url(self) -> str:
        """Where preflight checks that kubernetes.version exists: preflight.kubernetesPackagesUrl when it
        is set ("" skips the check), else the repository the nodes install from."""
        explicit = self.preflight.kubernetes_packages_url
        return self.mirrors.kubernetes_repository.url if explicit is None else explicit


# --------------------------------------------------------------------------- errors


@dataclass(frozen=True)
class ConfigProblem:
    key: str
    message: str

    def __str__(self) -> str:
        return f"{NAMESPACE}:{self.key}: {self.message}"


class LabConfigError(ValueError):
    """Every problem found in one config, each naming its key and the fix."""

    def __init__(self, problems: list[ConfigProblem]) -> None:
        self.problems = problems
        lines = [f"the {NAMESPACE} config has {len(problems)} problem(s); nothing was created:"]
        lines += [f"  - {p}" for p in problems]
        super().__init__("\n".join(lines))


def _key_from_loc(loc: Iterable[int | str]) -> str:
    key = ""
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
        else:
            key += f".{part}" if key else str(part)
    return key


_PYDANTIC_HINTS = {
    "missing": "this key is required; add it to Pulumi.<stack>.yaml (see Pulumi.labs.yaml for an example)",
    "extra_forbidden": "unknown key; check its spelling against Pulumi.labs.yaml (keys are camelCase)",
    "ip_v4_address": "write a dotted IPv4 address such as 10.3.60.51",
    "ip_v4_network": "write an IPv4 network in CIDR form with no host bits, such as 10.3.60.0/24",
    # YAML reads `dnsServers: 10.3.60.1` as one string, and `version: 1.36` as a number.
    "list_type": "write a YAML list, one `- item` per line (or [a, b] on one line)",
    "string_type": "quote it, so that YAML keeps it text",
}


def _hint(err: Any, key: str) -> str:
    hint = _PYDANTIC_HINTS.get(err["type"], "")
    if err["type"] == "string_type" and isinstance(err.get("input"), int | float) and key.lower().endswith("version"):
        hint += ' and whole: "1.36.0" (YAML reads an unquoted 1.36 as the number 1.36)'
    return hint


def _pydantic_problems(error: ValidationError) -> list[ConfigProblem]:
    problems = []
    for err in error.errors():
        hint = _hint(err, _key_from_loc(err["loc"]))
        got = f" (got {err['input']!r})" if err["type"] not in ("missing",) and "input" in err else ""
        text = err["msg"] + got + (f": {hint}" if hint else "")
        problems.append(ConfigProblem(_key_from_loc(err["loc"]), text))
    return problems


# --------------------------------------------------------------------------- domain checks

_ROLE_KEYS = {
    Role.BALANCER: "nodes.balancers",
    Role.CONTROL_PLANE: "nodes.controlPlanes",
    Role.WORKER: "nodes.workers",
}

# Seed 000 sizing: control plane >= 2 vCPU / 4 GiB, workers 2-4 vCPU / 4-8 GiB, balancers 1-2 vCPU / 1-2 GiB.
MINIMUM_SIZES = {
    Role.BALANCER: (1, 1024),
    Role.CONTROL_PLANE: (2, 4096),
    Role.WORKER: (2, 4096),
}
# etcd wants its own disk (fsync under 50 ms, seed 000); keep it big enough for a few snapshots.
MINIMUM_DATA_DISK_GIB = {Role.BALANCER: 0, Role.CONTROL_PLANE: 10, Role.WORKER: 20}
MINIMUM_TEMPLATE_DISK_GIB = 16


def _control_characters(text: str) -> bool:
    return any(ord(char) < 0x20 or ord(char) == 0x7F for char in text)


def _ssh_key_problem(public_key: str) -> str | None:
    # Exactly one line: the key becomes one line of authorized_keys (and of the user-data), so a
    # newline in it would add lines the config never shows as keys (issue #30 §3).
    if _control_characters(public_key):
        return (
            "holds a newline, tab or other control character; an SSH public key is exactly one line "
            "`ssh-ed25519 AAAA... you@host`: paste the single line of the .pub file"
        )
    parts = public_key.strip().split()
    if len(parts) < 2 or parts[0] not in _SSH_KEY_TYPES:
        return (
            "not an OpenSSH public key; paste one line such as `ssh-ed25519 AAAA... you@host` "
            f"(the contents of ~/.ssh/id_ed25519.pub, never the private key; types: {', '.join(_SSH_KEY_TYPES)})"
        )
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except ValueError:
        return "the key's base64 body is damaged; copy the whole line from the .pub file again"
    # The blob starts with the length-prefixed key type: a cheap integrity check.
    if len(blob) < 4 or blob[4 : 4 + int.from_bytes(blob[:4], "big")].decode(errors="replace") != parts[0]:
        return f"the key body does not match its type {parts[0]}; copy the whole line from the .pub file again"
    return None


# A host name (RFC 1123: dot-separated labels of letters, digits and inner hyphens, 253 at most).
_HOST_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
# Everything a proxy or mirror URL may hold. Its value is written verbatim into apt.conf
# (`Acquire::http::Proxy "…";`), containerd's hosts.toml (`[host."…"]`), cloud-init's user-data
# and curl's argv: a quote, semicolon, brace, space or newline there is syntax in those files, so a
# URL ending in `";APT::Update::Pre-Invoke{…};//` ran a command as root (issue #30 §3).
_URL_CHARACTERS = re.compile(r"^[A-Za-z0-9._~:/%\[\]-]+$")
_URL_PATH = re.compile(r"^(/[A-Za-z0-9._~:%-]*)*$")


def _not_a_host_name(name: str) -> bool:
    """True when `name` is not a host name (a trailing dot, the root, is allowed; a last label of
    digits alone is not, so 10.3.60.300 is a mistyped address rather than a name)."""
    labels = name[:-1].split(".") if name.endswith(".") else name.split(".")
    return not (0 < len(name) <= 253 and all(_HOST_LABEL.match(label) for label in labels) and not labels[-1].isdigit())


def _is_ip_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _url_problem(url: str, example: str) -> str | None:
    """Why `url` is not a whole http(s) URL of scheme, host, optional port and optional path, or None."""
    fix = f"write a whole URL of scheme, host, optional port and path only, such as {example}"
    if not url:
        return f"empty; {fix}, or delete the key"
    if not _URL_CHARACTERS.match(url):
        bad = sorted({repr(char) for char in url if not _URL_CHARACTERS.match(char)})
        return (
            f"{url!r} holds {', '.join(bad)}, which is not part of a proxy or mirror URL "
            f"(quotes, semicolons, braces, spaces, control characters, user names, queries are refused); {fix}"
        )
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as error:  # e.g. an IPv4 address in brackets
        return f"{url!r} is not a URL ({error}); {fix}"
    try:
        port = parts.port
    except ValueError:
        return f"{url!r} has a port that is not a number from 1 to 65535; {fix}"
    host = parts.hostname or ""
    if parts.scheme not in ("http", "https"):
        return f"{url!r} is not an http:// or https:// URL; {fix}"
    if not host or (not _is_ip_address(host) and _not_a_host_name(host)):
        return f"{url!r} has no valid host name or IP address; {fix}"
    if port == 0 or parts.netloc.endswith(":"):
        return f"{url!r} has an empty or zero port; {fix}"
    if not _URL_PATH.match(parts.path):
        return f"{url!r} has a path that is not /-separated segments; {fix}"
    return None


_PEM_CERTIFICATE = re.compile(r"-----BEGIN CERTIFICATE-----\n[A-Za-z0-9+/=\n]+-----END CERTIFICATE-----\n?")


def _registry_mirror_problems(mirrors: MirrorsConfig) -> list[ConfigProblem]:
    """mirrors.registryMirror: https unless plain http is accepted by name; its CA: PEM certificates only."""
    problems = []
    mirror = mirrors.registry_mirror
    if mirror and mirror.startswith("http://") and not mirrors.allow_insecure_registry_mirror:
        problems.append(
            ConfigProblem(
                "mirrors.registryMirror",
                f"{mirror!r} is plain http: images are pulled by tag, so anyone on the path between the nodes and "
                "the mirror could serve the images the cluster runs; use https:// (with "
                "labs-k8s:mirrors.registryMirrorCa for a private CA), or accept that risk with "
                "labs-k8s:mirrors.allowInsecureRegistryMirror: true",
            )
        )
    ca = mirrors.registry_mirror_ca
    if ca is None:
        return problems
    if not mirror or not mirror.startswith("https://"):
        problems.append(
            ConfigProblem(
                "mirrors.registryMirrorCa",
                "a CA for no https:// mirror: set labs-k8s:mirrors.registryMirror to the mirror's https:// URL, "
                "or delete this key",
            )
        )
    blocks = _PEM_CERTIFICATE.findall(ca.strip() + "\n")
    if not blocks or "".join(blocks).strip() != ca.strip() or not all(_is_certificate(b) for b in blocks):
        problems.append(
            ConfigProblem(
                "mirrors.registryMirrorCa",
                "not PEM certificates only: give the mirror's CA certificate(s) as `openssl x509 -in ca.crt` prints "
                "them, -----BEGIN CERTIFICATE----- to -----END CERTIFICATE-----, nothing else "
                "(pulumi config set --path 'labs-k8s:mirrors.registryMirrorCa' < ca.crt)",
            )
        )
    return problems


def _is_certificate(pem: str) -> bool:
    from cryptography import x509

    try:
        x509.load_pem_x509_certificate(pem.encode())
    except ValueError:
        return False
    return True


def config_warnings(cfg: LabConfig) -> list[str]:
    """What a valid config accepts at a risk the user named: printed at every preview and up."""
    mirror = cfg.mirrors.registry_mirror
    if mirror and mirror.startswith("http://"):
        return [
            f"labs-k8s:mirrors.registryMirror {mirror!r} is plain http (labs-k8s:mirrors.allowInsecureRegistryMirror: "
            "true): anyone on the path between the nodes and the mirror can serve the images the cluster runs; "
            "use an https:// mirror"
        ]
    return []


_FINGERPRINT = re.compile(r"[0-9A-F]{40}")
# The repository of one minor, where the base of them all belongs: .../core:/stable:/v1.36/deb
_ONE_MINOR = re.compile(r"/v1\.\d+/deb$")


def _repository_problems(cfg: LabConfig) -> list[ConfigProblem]:
    """mirrors.kubernetesRepository and mirrors.containerdRepository: whole URLs, and fingerprints of 40
    hex digits (the model already dropped a trailing "/" and the spaces between the groups)."""
    problems = []
    kubernetes, containerd = cfg.mirrors.kubernetes_repository, cfg.mirrors.containerd_repository
    version = _K8S_VERSION.match(cfg.kubernetes.version)
    minor = f"1.{version.group(1)}" if version else "<minor>"
    for key, url, fingerprint, example, key_file in (
        (
            "mirrors.kubernetesRepository",
            kubernetes.url,
            kubernetes.key_fingerprint,
            "https://artifactory.lab.example/k8s-stable",
            kubernetes.key_url(minor),
        ),
        (
            "mirrors.containerdRepository",
            containerd.url,
            containerd.key_fingerprint,
            "https://artifactory.lab.example/docker-debian",
            containerd.key_url(),
        ),
    ):
        url_problem = _url_problem(url, example)
        one_minor = _ONE_MINOR.search(url) if key == "mirrors.kubernetesRepository" else None
        if url_problem:
            problems.append(ConfigProblem(f"{key}.url", url_problem))
        elif one_minor:
            problems.append(
                ConfigProblem(
                    f"{key}.url",
                    f"{url!r} is the repository of one minor; give the base, {url[: one_minor.start()]!r}: "
                    "the program adds /v<minor>/deb/ for the minor of labs-k8s:kubernetes.version "
                    "(and an upgrade the next minor's)",
                )
            )
        if not _FINGERPRINT.fullmatch(fingerprint):
            where = f"its key file, {key_file}" if not (url_problem or one_minor) else "its key file"
            problems.append(
                ConfigProblem(
                    f"{key}.keyFingerprint",
                    f"{fingerprint!r} is not a key fingerprint: write the 40 hex digits (spaces between groups "
                    "are fine) of the primary key that signs the repository, as "
                    f"`gpg --show-keys --with-fingerprint <key file>` prints them for {where}; take that file "
                    "from the repository's owners, not from the repository alone: the fingerprint is what checks it",
                )
            )
    return problems


# Linux caps names at 15 bytes (IFNAMSIZ - 1); ifupdown and Keepalived want no exotic characters.
_INTERFACE_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,14}$")
_KERNEL_INTERFACE_NAME = re.compile(r"^(eth|wlan|ib)\d+$|^lo$")


def domain_problems(cfg: LabConfig) -> list[ConfigProblem]:
    """Whole-lab checks pydantic cannot express. Returns every problem found."""
    problems: list[ConfigProblem] = []
    add = problems.append
    net = cfg.network.cidr

    # Hostnames: DNS labels, unique.
    seen_names: dict[str, str] = {}
    seen_ips: dict[ipaddress.IPv4Address, str] = {}
    seen_macs: dict[str, str] = {}
    for role, role_key in _ROLE_KEYS.items():
        group = cfg.role_config(role)
        for index, host in enumerate(group.hosts):
            key = f"{role_key}.hosts[{index}]"
            if not _DNS_LABEL.match(host.name):
                add(
                    ConfigProblem(
                        f"{key}.name",
                        f"{host.name!r} is not a valid hostname: use 1-63 lowercase letters, digits and "
                        "hyphens, starting and ending with a letter or digit (e.g. labs-k8s-w03)",
                    )
                )
            if host.name in seen_names:
                add(
                    ConfigProblem(
                        f"{key}.name",
                        f"{host.name!r} is already used by {seen_names[host.name]}; give every VM its own name",
                    )
                )
            else:
                seen_names[host.name] = f"{NAMESPACE}:{key}.name"
            duplicate_ip = host.ip in seen_ips
            if duplicate_ip:
                add(
                    ConfigProblem(
                        f"{key}.ip", f"{host.ip} is already used by {seen_ips[host.ip]}; give every VM its own address"
                    )
                )
            else:
                seen_ips[host.ip] = f"{NAMESPACE}:{key}.ip"
            if host.ip not in net:
                add(
                    ConfigProblem(
                        f"{key}.ip",
                        f"{host.ip} is outside network.cidr {net}; pick an address inside it or widen network.cidr",
                    )
                )
            elif host.ip in (net.network_address, net.broadcast_address):
                add(
                    ConfigProblem(
                        f"{key}.ip",
                        f"{host.ip} is the network or broadcast address of {net}; pick a usable host address",
                    )
                )
            if host.ip == cfg.network.gateway:
                add(ConfigProblem(f"{key}.ip", f"{host.ip} is the gateway; pick another address"))
            mac = normalize_mac(host.mac) if host.mac is not None else mac_for_ip(host.ip)
            mac_key = f"{key}.mac" if host.mac is not None else f"{key}.ip"
            if host.mac is not None and (problem := mac_problem(mac)):
                add(ConfigProblem(mac_key, problem))
            elif mac in seen_macs and not (duplicate_ip and host.mac is None):  # said once, for the IP
                source = "" if host.mac is not None else f" (the MAC derived from {host.ip})"
                add(
                    ConfigProblem(
                        mac_key,
                        f"MAC {mac}{source} is already used by {seen_macs[mac]}; "
                        f"set a distinct labs-k8s:{key}.mac in 00:50:56:00:00:00-00:50:56:3f:ff:ff",
                    )
                )
            else:
                seen_macs[mac] = f"{NAMESPACE}:{mac_key}"

        vcpu_min, mem_min = MINIMUM_SIZES[role]
        if group.vcpu < vcpu_min:
            add(
                ConfigProblem(
                    f"{role_key}.vcpu",
                    f"{group.vcpu} vCPU is below the minimum of {vcpu_min} for "
                    f"this role (seed sizing); set at least {vcpu_min}",
                )
            )
        if group.memory_mib < mem_min:
            add(
                ConfigProblem(
                    f"{role_key}.memoryMib",
                    f"{group.memory_mib} MiB is below the minimum of {mem_min} "
                    f"MiB for this role (seed sizing); set at least {mem_min}",
                )
            )
        disk_min = MINIMUM_DATA_DISK_GIB[role]
        if group.data_disk_gib < disk_min:
            add(
                ConfigProblem(
                    f"{role_key}.dataDiskGib",
                    f"{group.data_disk_gib} GiB is below the minimum of "
                    f"{disk_min} GiB for this role's data disk; set at least {disk_min}",
                )
            )

    # The NIC name cloud-init gives every node (set-name) and Keepalived binds.
    interface = cfg.network.interface
    if not _INTERFACE_NAME.match(interface):
        add(
            ConfigProblem(
                "network.interface",
                f"{interface!r} is not a usable interface name: use 1-15 "
                "lowercase letters, digits, '-' or '_', starting with a letter (e.g. ens192)",
            )
        )
    elif _KERNEL_INTERFACE_NAME.match(interface):
        add(
            ConfigProblem(
                "network.interface",
                f"{interface!r} is in the kernel's own namespace: renaming into it "
                "races with the kernel's names (systemd.net-naming-scheme(7)); use e.g. ens192",
            )
        )

    # Gateway and VIP.
    if cfg.network.gateway not in net:
        add(
            ConfigProblem(
                "network.gateway",
                f"{cfg.network.gateway} is outside network.cidr {net}; the gateway must be on the node network",
            )
        )
    vip = cfg.load_balancer.vip
    if vip not in net:
        add(
            ConfigProblem(
                "loadBalancer.vip",
                f"{vip} is outside network.cidr {net}; VRRP moves the VIP "
                "within one L2 segment, so pick a free address inside the node network",
            )
        )
    if vip == cfg.network.gateway:
        add(ConfigProblem("loadBalancer.vip", f"{vip} is the gateway; pick a free address for the VIP"))
    if vip in seen_ips:
        add(
            ConfigProblem(
                "loadBalancer.vip",
                f"{vip} is already the address of {seen_ips[vip]}; the VIP must be an address no VM owns",
            )
        )
    if not 1 <= cfg.load_balancer.vrrp_router_id <= 255:
        add(
            ConfigProblem(
                "loadBalancer.vrrpRouterId",
                f"{cfg.load_balancer.vrrp_router_id} is out of range; use 1-255, unique on the L2 segment",
            )
        )
    if not 1 <= cfg.load_balancer.advert_int_seconds <= 10:
        add(ConfigProblem("loadBalancer.advertIntSeconds", "use 1-10 seconds"))
    if cfg.template.build_ip is not None:
        build_ip = cfg.template.build_ip
        if build_ip not in net:
            add(
                ConfigProblem(
                    "template.buildIp",
                    f"{build_ip} is outside network.cidr {net}; "
                    "pick a free address on the node network, or remove the key to use DHCP",
                )
            )
        if build_ip in seen_ips or build_ip in (vip, cfg.network.gateway):
            add(ConfigProblem("template.buildIp", f"{build_ip} is already in use in this lab; pick a free address"))

    # Quorum and redundancy.
    cp_count = len(cfg.nodes.control_planes.hosts)
    if cp_count == 0:
        add(ConfigProblem("nodes.controlPlanes.hosts", "no control planes; list 3 (or 5) for an HA etcd quorum"))
    elif cp_count == 1 and not cfg.kubernetes.allow_single_control_plane:
        add(
            ConfigProblem(
                "nodes.controlPlanes.hosts",
                "1 control plane is not HA; list 3, or set "
                "labs-k8s:kubernetes.allowSingleControlPlane: true for a non-HA lab",
            )
        )
    elif cp_count > 1 and cp_count % 2 == 0:
        add(
            ConfigProblem(
                "nodes.controlPlanes.hosts",
                f"{cp_count} control planes: etcd needs an odd number "
                f"for quorum ({cp_count} tolerates no more failures than {cp_count - 1}); "
                f"list {cp_count - 1} or {cp_count + 1}",
            )
        )
    lb_count = len(cfg.nodes.balancers.hosts)
    if lb_count == 1 and not cfg.load_balancer.allow_single_balancer:
        add(
            ConfigProblem(
                "nodes.balancers.hosts",
                "1 balancer is a single point of failure; list 2, or set "
                "labs-k8s:loadBalancer.allowSingleBalancer: true for a lab without a Keepalived peer",
            )
        )
    elif lb_count != 1 and lb_count != 2:
        add(
            ConfigProblem(
                "nodes.balancers.hosts",
                f"{lb_count} balancers: the Keepalived pair is exactly 2 (MASTER and BACKUP); list 2",
            )
        )

    # Address plan: nodes, pods and services must not overlap (routing would be ambiguous).
    cidrs = {
        "network.cidr": net,
        "kubernetes.podCidr": cfg.kubernetes.pod_cidr,
        "kubernetes.serviceCidr": cfg.kubernetes.service_cidr,
    }
    names = list(cidrs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if cidrs[a].overlaps(cidrs[b]):
                add(
                    ConfigProblem(
                        b,
                        f"{cidrs[b]} overlaps {a} {cidrs[a]}; node, pod and service ranges "
                        "must be disjoint: pick another range",
                    )
                )
    if cfg.kubernetes.pod_cidr.prefixlen > 22:
        add(
            ConfigProblem(
                "kubernetes.podCidr",
                f"/{cfg.kubernetes.pod_cidr.prefixlen} is too small: Flannel gives each node a /24, so use /16 to /22",
            )
        )

    # Kubernetes version.
    match = _K8S_VERSION.match(cfg.kubernetes.version)
    supported = f"1.{SUPPORTED_K8S_MINORS.start}-1.{SUPPORTED_K8S_MINORS.stop - 1}"
    if match is None:
        add(
            ConfigProblem(
                "kubernetes.version",
                f"{cfg.kubernetes.version!r} is not a Kubernetes version; "
                f"write MAJOR.MINOR.PATCH such as 1.36.0 (supported minors: {supported})",
            )
        )
    elif int(match.group(1)) not in SUPPORTED_K8S_MINORS:
        add(
            ConfigProblem(
                "kubernetes.version", f"{cfg.kubernetes.version} is not supported; use a release of minors {supported}"
            )
        )

    # Container runtime: Kubernetes 1.36 dropped containerd 1.x; older minors accept 1.7 and later.
    containerd = _CONTAINERD_VERSION.match(cfg.kubernetes.containerd_version)
    if containerd is None:
        add(
            ConfigProblem(
                "kubernetes.containerdVersion",
                f"{cfg.kubernetes.containerd_version!r} is not a "
                "containerd release; write MAJOR.MINOR.PATCH as Docker's containerd.io package has it "
                "(e.g. 2.2.1; `apt-cache madison containerd.io` lists them)",
            )
        )
    elif match is not None:
        needed = (2, 0) if int(match.group(1)) >= CONTAINERD_2_FROM_MINOR else (1, 7)
        if (int(containerd.group(1)), int(containerd.group(2))) < needed:
            add(
                ConfigProblem(
                    "kubernetes.containerdVersion",
                    f"containerd {cfg.kubernetes.containerd_version} is "
                    f"too old for Kubernetes {cfg.kubernetes.version} (labs-k8s:kubernetes.version); use "
                    f"{needed[0]}.{needed[1]} or newer, or stay on a minor it supports",
                )
            )

    # Workers. kubeadm init taints every control plane node-role.kubernetes.io/control-plane:NoSchedule
    # (kubeadm cmd/kubeadm/app/phases/markcontrolplane), so with no worker no pod of the lab's users runs.
    worker_count = len(cfg.nodes.workers.hosts)
    if worker_count == 0:
        add(
            ConfigProblem(
                "nodes.workers.hosts",
                "no workers: kubeadm taints the control planes NoSchedule, so "
                "no workload could be scheduled (and the worker and drain drills have nothing to drill); "
                "list 2 workers, or 1 with labs-k8s:kubernetes.allowSingleWorker: true",
            )
        )
    elif worker_count == 1 and not cfg.kubernetes.allow_single_worker:
        add(
            ConfigProblem(
                "nodes.workers.hosts",
                "1 worker: every Kubernetes upgrade drains it "
                "(labs-k8s:kubernetes.upgrade.workersAtOnce is at least 1), leaving its pods nowhere to "
                "run until it is back, and the worker and drain drills refuse; list 2, or set "
                "labs-k8s:kubernetes.allowSingleWorker: true for a lab that accepts that",
            )
        )

    # Rolling upgrades: never drain every worker at once (their pods would have nowhere to go).
    workers_at_once = cfg.kubernetes.upgrade.workers_at_once
    most = max(1, worker_count - 1)
    if worker_count and not 1 <= workers_at_once <= most:
        add(
            ConfigProblem(
                "kubernetes.upgrade.workersAtOnce",
                f"{workers_at_once} is out of range; use 1 to {most} "
                f"(fewer than the {len(cfg.nodes.workers.hosts)} workers, so that drained workloads "
                "have somewhere to run)",
            )
        )

    # SSH.
    ssh_problem = _ssh_key_problem(cfg.ssh.public_key)
    if ssh_problem:
        add(ConfigProblem("ssh.publicKey", ssh_problem))
    for index, extra_key in enumerate(cfg.ssh.extra_public_keys):
        if extra_problem := _ssh_key_problem(extra_key):
            add(ConfigProblem(f"ssh.extraPublicKeys[{index}]", extra_problem))
    if not re.match(r"^[a-z_][a-z0-9_-]{0,31}$", cfg.ssh.user) or cfg.ssh.user == "root":
        add(ConfigProblem("ssh.user", f"{cfg.ssh.user!r}: use a lowercase Linux user name other than root"))

    # Template.
    if cfg.template.disk_gib < MINIMUM_TEMPLATE_DISK_GIB:
        add(
            ConfigProblem(
                "template.diskGib",
                f"{cfg.template.disk_gib} GiB is too small for Debian 12 with "
                f"containerd images; use at least {MINIMUM_TEMPLATE_DISK_GIB}",
            )
        )
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,60}$", cfg.template.name):
        add(ConfigProblem("template.name", "use letters, digits, dot, dash and underscore only"))
    iso_example = "https://cdimage.debian.org/debian-cd/current/amd64/iso-cd/debian-12.x-amd64-netinst.iso"
    if iso_problem := _url_problem(cfg.template.iso_url, iso_example):
        add(ConfigProblem("template.isoUrl", f"{iso_problem} (the Debian 12 netinst ISO; template.isoSha256 pins it)"))
    if not _DNS_LABEL.match(cfg.kubernetes.cluster_name):
        add(
            ConfigProblem(
                "kubernetes.clusterName",
                f"{cfg.kubernetes.cluster_name!r} is not a DNS label: write 1 to 63 lowercase letters, digits and "
                "inner hyphens, such as labs-k8s (it names the cluster in kubeadm's config and the kubeconfig)",
            )
        )

    packages_url = cfg.preflight.kubernetes_packages_url
    if packages_url and (url_problem := _url_problem(packages_url, KUBERNETES_REPOSITORY_URL)):
        add(
            ConfigProblem(
                "preflight.kubernetesPackagesUrl",
                f"{url_problem} (or delete the key: preflight then checks mirrors.kubernetesRepository.url; "
                '"" skips the release check)',
            )
        )

    for key, url, example in (
        ("mirrors.aptProxy", cfg.mirrors.apt_proxy, "http://proxy.lab.example:3142"),
        ("mirrors.registryMirror", cfg.mirrors.registry_mirror, "https://registry-mirror.lab.example:5000"),
    ):
        if url is not None and (url_problem := _url_problem(url, example)):
            add(ConfigProblem(key, url_problem))
    problems += _registry_mirror_problems(cfg.mirrors)
    problems += _repository_problems(cfg)

    # Network names: written into the user-data, chrony's and resolv.conf's lines.
    for index, server in enumerate(cfg.network.ntp_servers):
        if _is_ip_address(server) or not _not_a_host_name(server):
            continue
        add(
            ConfigProblem(
                f"network.ntpServers[{index}]",
                f"{server!r} is not a host name or IP address; write one server per list item, "
                "such as 0.debian.pool.ntp.org or 10.3.60.1",
            )
        )
    domain = cfg.network.search_domain
    if domain is not None and (_not_a_host_name(domain) or _is_ip_address(domain)):
        add(
            ConfigProblem(
                "network.searchDomain",
                f"{domain!r} is not a domain name; write dot-separated labels of letters, digits and "
                "inner hyphens, such as labs.local (or delete the key for none)",
            )
        )
    return problems


# Keys that moved: (section, key) -> (new key, why). Named in the error, never silently accepted.
MOVED_KEYS = {
    ("loadBalancer", "interface"): (
        "network.interface",
        "it now names the NIC of every node (cloud-init sets it by the node's static MAC), not only the balancers'",
    ),
}


def _moved_key_problems(raw: Mapping[str, Any]) -> tuple[dict[str, Any], list[ConfigProblem]]:
    """The namespace without moved keys, and one problem per moved key that is still used."""
    problems = []
    cleaned = dict(raw)
    for (section, key), (new_key, why) in MOVED_KEYS.items():
        values = raw.get(section)
        if isinstance(values, Mapping) and key in values:
            problems.append(
                ConfigProblem(
                    f"{section}.{key}",
                    f"moved to {NAMESPACE}:{new_key} ({why}); move the value there "
                    f"(pulumi config set --path {NAMESPACE}:{new_key} {values[key]}) and delete this key",
                )
            )
            cleaned[section] = {k: v for k, v in values.items() if k != key}
    return cleaned, problems


def snake_case_problems(raw: Any, model: type[BaseModel] = LabConfig, key: str = "") -> list[ConfigProblem]:
    """Keys written snake_case (data_disk_gib): pydantic takes them by name (populate_by_name, which
    the Python code needs), so they passed silently although the YAML's keys are camelCase."""
    if isinstance(raw, list):
        return [p for i, item in enumerate(raw) for p in snake_case_problems(item, model, f"{key}[{i}]")]
    if not isinstance(raw, Mapping):
        return []
    problems = []
    fields = model.model_fields
    for name, value in raw.items():
        field = fields.get(name) if isinstance(name, str) else None
        if field is None:
            camel = next((f for n, f in fields.items() if f.validation_alias == name), None)
            nested = _nested_model(camel.annotation) if camel is not None else None
            if nested is not None:
                problems += snake_case_problems(value, nested, f"{key}.{name}" if key else name)
            continue
        alias = field.validation_alias
        if isinstance(alias, str) and alias != name:
            problems.append(
                ConfigProblem(
                    f"{key}.{name}" if key else name,
                    f"write it camelCase, as every key in Pulumi.labs.yaml: {alias}",
                )
            )
        nested = _nested_model(field.annotation)
        if nested is not None:
            problems += snake_case_problems(value, nested, f"{key}.{name}" if key else name)
    return problems


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds, itself or in a list/optional."""
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
        for inner in getattr(candidate, "__args__", ()):
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                return inner
    return None


def load_lab_config(raw: Mapping[str, Any]) -> LabConfig:
    """Validate the `labs-k8s:` namespace (a mapping of top-level key to structured value).

    Raises LabConfigError listing every problem; returns the frozen model otherwise.
    """
    unknown = sorted(set(raw) - set(TOP_LEVEL_KEYS))
    problems = [
        ConfigProblem(k, f"unknown key; the {NAMESPACE} namespace has: {', '.join(TOP_LEVEL_KEYS)}") for k in unknown
    ]
    raw, moved = _moved_key_problems(raw)
    problems += moved
    problems += snake_case_problems({k: v for k, v in raw.items() if k in TOP_LEVEL_KEYS})
    try:
        cfg = LabConfig.model_validate({k: v for k, v in raw.items() if k in TOP_LEVEL_KEYS})
    except ValidationError as error:
        raise LabConfigError(problems + _pydantic_problems(error)) from None
    problems += domain_problems(cfg)
    if problems:
        raise LabConfigError(problems)
    return cfg
