"""The real kubeadm judges what we render, at the version each configuration is for.

kubeadm is built from the Go module proxy for every minor the project supports or upgrades between
(tests/kube_programs.py, tests/tools/kube/manifest.json; tests/kubeadm_real.py). For the
default lab and a 10-worker lab, at each of those minors, every kubeadm configuration a step hands
to kubeadm:
- kubeadm-init.yaml with the certificate key (kubeadm-init.sh; refresh-join-material.sh before a
  control plane joins) and without it (refresh-join-material.sh before a worker joins);
- each control plane's and each worker's kubeadm-join.yaml, as the join script hands it over (the
  CA cert hash placeholder replaced: lib.sh join_cluster).
The upgrade steps hand kubeadm no configuration (`kubeadm upgrade apply vX.Y.Z --yes`, `kubeadm
upgrade node`: cloudinit/k8s/upgrade-*.sh); the cluster's own kubeadm-config is what init uploaded.

Proven: `kubeadm config validate` accepts each (and refuses a broken one, so the check can fail);
`kubeadm init --dry-run` of the init configuration, in a mount and network namespace of its own,
writes the certificates, kubeconfigs, static pod manifests and kubelet files our config asks for;
the phase names our scripts and guards call exist in that kubeadm, in the order our resume logic
assumes.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from components.config import KubernetesConfig, LabConfig
from components.rendering import k8s
from components.tools.offline import REPO_ROOT
from tests import kubeadm_real
from tests.labs import make_lab_config, make_lab_config_with
from tests.requirements import require_root, require_tool
from tests.shell_harness import STANDIN, TEST_CERTIFICATE_KEY, TEST_ENCRYPTION_KEY, TEST_TOKEN, ClusterLab, ShellHarness

VIP = "10.3.60.100"
# What refresh-join-material.sh prints and the join scripts put in place of the placeholder.
CA_CERT_HASH = "sha256:" + "ab" * 32
K8S_SCRIPTS = REPO_ROOT / "cloudinit" / "k8s"
SCRIPTS = sorted(K8S_SCRIPTS.glob("*.sh"))
STANDIN_SCRIPTS = sorted((REPO_ROOT / "tests" / "standins").glob("*.bash"))


# ------------------------------------------------------------------ the labs and their configurations


def _ten_workers(raw: dict[str, Any]) -> None:
    hosts = raw["nodes"]["workers"]["hosts"]
    hosts += [{"name": f"labs-k8s-w{i:02}", "ip": f"10.3.60.{70 + i}"} for i in range(3, 11)]


def lab(name: str, minor: str) -> LabConfig:
    """The default lab or the 10-worker lab, at `minor`: the default version when that is its
    minor (1.36.0), else the patch kubeadm is built at (a lab created at 1.35, upgraded from)."""
    default = KubernetesConfig().version
    version = default if kubeadm_real.minor_of(default) == minor else kubeadm_real.version_of(minor).removeprefix("v")
    kubernetes = {"version": version}
    if name == "default":
        return make_lab_config(kubernetes=kubernetes)
    assert name == "ten-workers"
    cfg = make_lab_config_with(_ten_workers, kubernetes=kubernetes)
    assert len(cfg.workers) == 10
    return cfg


@dataclass(frozen=True)
class Rendered:
    name: str  # what hands it to kubeadm
    kind: str  # "init" or "join"
    text: str


def rendered_configs(cfg: LabConfig) -> list[Rendered]:
    """Every kubeadm configuration the steps of `cfg` hand to kubeadm, as kubeadm reads it."""
    configs = [
        Rendered(
            "kubeadm-init.sh, refresh for a control plane",
            "init",
            k8s.render_init_config(cfg, TEST_TOKEN, TEST_CERTIFICATE_KEY),
        ),
        Rendered("refresh for a worker (no certificate key)", "init", k8s.render_init_config(cfg, TEST_TOKEN, None)),
    ]
    for node in cfg.control_planes:
        text = k8s.render_control_plane_join_config(cfg, node, TEST_TOKEN, TEST_CERTIFICATE_KEY)
        configs.append(Rendered(f"join-control-plane.sh on {node.name}", "join", as_joined(text)))
    for node in cfg.workers:
        text = k8s.render_worker_join_config(cfg, node, TEST_TOKEN)
        configs.append(Rendered(f"join-worker.sh on {node.name}", "join", as_joined(text)))
    return configs


def as_joined(template: str) -> str:
    """What join_cluster (cloudinit/k8s/lib.sh) hands kubeadm: the placeholder replaced by the hash."""
    assert k8s.CA_CERT_HASH_PLACEHOLDER in template
    return template.replace(k8s.CA_CERT_HASH_PLACEHOLDER, CA_CERT_HASH)


LABS = ("default", "ten-workers")


def lab_cases() -> list[Any]:
    return [pytest.param(name, minor, id=f"{name}-{minor}") for name in LABS for minor in kubeadm_real.minors()]


def run_kubeadm(minor: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(kubeadm_real.binary(minor)), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def validate(minor: str, path: Path) -> subprocess.CompletedProcess[str]:
    return run_kubeadm(minor, "config", "validate", "--config", str(path))


# ------------------------------------------------------------------ the binaries


def test_a_kubeadm_for_every_minor_the_project_supports_or_upgrades_between() -> None:
    """The minor a lab upgrades from (kubeadm upgrades one minor at a time), the default's and the
    next one, each at the newest patch the proxy serves: what the manifest says, stamped in."""
    default_minor = KubernetesConfig().minor
    assert kubeadm_real.minors() == [f"1.{default_minor + step}" for step in (-1, 0, 1)]
    for minor in kubeadm_real.minors():
        version = kubeadm_real.version_of(minor)
        assert kubeadm_real.minor_of(version) == minor
        short = run_kubeadm(minor, "version", "-o", "short")
        assert short.returncode == 0, short.stderr
        assert short.stdout.strip() == version
        reported = yaml.safe_load(run_kubeadm(minor, "version", "-o", "yaml").stdout)["clientVersion"]
        assert (reported["major"], reported["minor"]) == tuple(minor.split("."))
        assert reported["buildDate"] != "1970-01-01T00:00:00Z"


# ------------------------------------------------------------------ kubeadm config validate


@pytest.mark.parametrize(("lab_name", "minor"), lab_cases())
def test_every_rendered_config_passes_kubeadm_config_validate(lab_name: str, minor: str, tmp_path: Path) -> None:
    cfg = lab(lab_name, minor)
    configs = rendered_configs(cfg)
    assert len([c for c in configs if c.kind == "join"]) == len(cfg.control_planes) + len(cfg.workers)
    for index, config in enumerate(configs):
        path = tmp_path / f"{index:02}-{config.kind}.yaml"
        path.write_text(config.text)
        result = validate(minor, path)
        assert result.returncode == 0, f"kubeadm {minor} refuses the config of {config.name}:\n{result.stderr}"
        assert "ok" in result.stdout.lower(), result.stdout


def _wrong_api_version(text: str) -> str:
    return text.replace("apiVersion: kubeadm.k8s.io/v1beta4", "apiVersion: kubeadm.k8s.io/v1beta9", 1)


def _unknown_field(text: str) -> str:
    return text.replace("nodeRegistration:\n", "nodeRegistration:\n  kubeletExtraArguments: []\n", 1)


def _bad_value(text: str) -> str:
    return re.sub(r"podSubnet: \S+", 'podSubnet: "10.244.0.0/33"', text, count=1)


@pytest.mark.parametrize(
    ("breakage", "said"),
    [
        pytest.param(_wrong_api_version, "v1beta9", id="wrong-apiVersion"),
        pytest.param(_unknown_field, "kubeletExtraArguments", id="unknown-field"),
        pytest.param(_bad_value, "podSubnet", id="bad-pod-subnet"),
    ],
)
@pytest.mark.parametrize("minor", kubeadm_real.minors())
def test_kubeadm_config_validate_refuses_a_broken_config(breakage: Any, said: str, minor: str, tmp_path: Path) -> None:
    """The check can fail: one field broken in the init configuration, and kubeadm says which."""
    text = k8s.render_init_config(lab("default", minor), TEST_TOKEN, TEST_CERTIFICATE_KEY)
    broken = breakage(text)
    assert broken != text
    path = tmp_path / "kubeadm-init.yaml"
    path.write_text(broken)
    result = validate(minor, path)
    assert result.returncode != 0, f"kubeadm {minor} accepted a config with a broken {said}"
    assert said in result.stderr, result.stderr


# ------------------------------------------------------------------ kubeadm init --dry-run

# Preflight checks that only a prepared node passes (prepare-node.sh installs and sets what they
# look for), ignored by name (preflight's "[ERROR <Name>]"); every other check runs, and fails the
# test when it fails. Warnings (Hostname: the node's name resolves on a node; Service-kubelet) pass.
IGNORED_PREFLIGHT = {
    "CRI": "no containerd socket in the namespace (prepare-node.sh installs containerd)",
    "ContainerRuntimeVersion": "asks the same absent containerd socket for its CRI version",
    "SystemVerification": "runs `kubelet --version`, and no kubelet is installed here",
    "KubeletVersion": "no kubelet installed here (prepare-node.sh installs it at kubernetes.version)",
    # A new network namespace starts with forwarding off; prepare-node.sh sets the sysctl.
    "FileContent--proc-sys-net-ipv4-ip_forward": "net.ipv4.ip_forward is 0 in a new network namespace",
}

# Runs as root in a new mount and network namespace (only a loopback, down: nothing outside is
# reachable). /etc and /var/lib get a tmpfs layer (overlayfs, upper on a tmpfs) so that
# /etc/kubernetes, /var/lib/kubelet and /var/lib/etcd can be made without touching the host, and
# each gets a tmpfs of its own; everything kubeadm writes vanishes with the namespace, once the
# dry-run directory (KUBEADM_INIT_DRYRUN_DIR, cmd/kubeadm/app/constants GetDryRunDir; by default
# /etc/kubernetes/tmp/kubeadm-init-dryrun*) is copied out to $OUT.
IN_NAMESPACE = r"""
set -euo pipefail
mount --make-rprivate /
layer=$(mktemp -d)
mount -t tmpfs labs-k8s-kubeadm "$layer"
for dir in /etc /var/lib; do
    mkdir -p "$layer/upper$dir" "$layer/work$dir"
    mount -t overlay overlay -o "lowerdir=$dir,upperdir=$layer/upper$dir,workdir=$layer/work$dir" "$dir"
done
for dir in /etc/kubernetes /var/lib/kubelet /var/lib/etcd; do
    mkdir -p "$dir"
    mount -t tmpfs labs-k8s-kubeadm "$dir"
done
mkdir -p /etc/kubernetes/tmp/dryrun
rc=0
KUBEADM_INIT_DRYRUN_DIR=/etc/kubernetes/tmp/dryrun "$KUBEADM" init --dry-run --config "$CONFIG" \
    --ignore-preflight-errors="$IGNORED" >"$OUT/stdout" 2>"$OUT/stderr" || rc=$?
cp -a /etc/kubernetes/tmp/dryrun/. "$OUT/dryrun/"
exit "$rc"
"""


@dataclass(frozen=True)
class DryRun:
    out: Path
    stdout: str
    stderr: str

    def file(self, name: str) -> str:
        return (self.out / "dryrun" / name).read_text()

    def manifest(self, component: str) -> dict[str, Any]:
        return yaml.safe_load(self.file(f"{component}.yaml"))

    def flags(self, component: str) -> dict[str, str]:
        (container,) = self.manifest(component)["spec"]["containers"]
        flags = {}
        for argument in container["command"][1:]:
            name, _, value = argument.removeprefix("--").partition("=")
            flags[name] = value
        return flags


def _dry_run(lab_name: str, minor: str, out: Path) -> DryRun:
    cfg = lab(lab_name, minor)
    (out / "dryrun").mkdir(parents=True)
    config = out / "kubeadm-init.yaml"
    config.write_text(k8s.render_init_config(cfg, TEST_TOKEN, TEST_CERTIFICATE_KEY))
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "KUBEADM": str(kubeadm_real.binary(minor)),
        "CONFIG": str(config),
        "OUT": str(out),
        "IGNORED": ",".join(sorted(IGNORED_PREFLIGHT)),
    }
    proc = subprocess.run(
        ["unshare", "--mount", "--net", "bash", "-c", IN_NAMESPACE],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    stdout = (out / "stdout").read_text() if (out / "stdout").exists() else ""
    stderr = (out / "stderr").read_text() if (out / "stderr").exists() else ""
    assert proc.returncode == 0, (
        f"kubeadm {minor} init --dry-run failed ({proc.returncode}):\n{proc.stderr}\n{stderr[-4000:]}"
    )
    return DryRun(out, stdout, stderr)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """kubeadm init --dry-run of a lab's init configuration, once per lab and minor."""
    require_root()
    require_tool("unshare", "mount")

    def run(lab_name: str, minor: str) -> DryRun:
        return _dry_run(lab_name, minor, tmp_path_factory.mktemp(f"dry-run-{lab_name}-{minor}"))

    return cache(run)


def expected_sans(cfg: LabConfig) -> set[str]:
    """Every name docs/cluster.md ("kubeadm documents") promises in the apiserver certificate: the
    VIP and every control plane (name, FQDN under network.searchDomain, address), localhost and
    127.0.0.1, never a balancer (they pass TLS through); kubeadm adds the first control plane's name and address."""
    domain = cfg.network.search_domain
    assert domain == "labs.local"
    names = {VIP, "localhost", "127.0.0.1"}
    for node in cfg.control_planes:
        names |= {node.name, str(node.ip), f"{node.name}.{domain}"}
    return names


@pytest.mark.parametrize(("lab_name", "minor"), lab_cases())
def test_kubeadm_init_dry_run_writes_what_our_config_asks_for(lab_name: str, minor: str, dry_run: Any) -> None:
    cfg = lab(lab_name, minor)
    result: DryRun = dry_run(lab_name, minor)
    first = cfg.control_planes[0]
    version = f"v{cfg.kubernetes.version}"

    # The apiserver certificate's SANs.
    cert = x509.load_pem_x509_certificate((result.out / "dryrun" / "apiserver.crt").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    names = set(sans.get_values_for_type(x509.DNSName)) | {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    missing = expected_sans(cfg) - names
    assert not missing, f"the apiserver certificate lacks {sorted(missing)}; it holds {sorted(names)}"
    assert "10.96.0.1" in names  # the first address of the service range: in-cluster clients
    assert not {str(w.ip) for w in cfg.workers} & names

    # controlPlaneEndpoint: the admins' kubeconfigs name the VIP (kubeadm-init.sh checks admin.conf's);
    # the node's own components talk to its own API server: the controller manager and scheduler
    # always, the kubelet since ControlPlaneKubeletLocalMode (GA and locked on in 1.35).
    for conf, server in (
        ("admin.conf", VIP),
        ("super-admin.conf", VIP),
        ("controller-manager.conf", str(first.ip)),
        ("scheduler.conf", str(first.ip)),
        ("kubelet.conf", str(first.ip)),
    ):
        assert re.search(rf"^\s+server: https://{re.escape(server)}:6443$", result.file(conf), flags=re.M), conf

    # The static pod manifests carry the flags our config asks for.
    apiserver = result.flags("kube-apiserver")
    assert apiserver["advertise-address"] == str(first.ip)
    assert apiserver["secure-port"] == "6443"
    assert apiserver["service-cluster-ip-range"] == "10.96.0.0/12"
    # Secrets encrypted at rest and the audit log (issue 50): the flags, and each file's directory mounted.
    assert {name: apiserver.get(name) for name, _ in k8s.api_server_extra_args()} == dict(k8s.api_server_extra_args())
    pod = result.manifest("kube-apiserver")["spec"]
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    for volume in k8s.api_server_extra_volumes():
        (host,) = [v["hostPath"] for v in pod["volumes"] if v["name"] == volume.name]
        assert host == {"path": volume.host_path, "type": volume.path_type}, volume
        assert mounts[volume.name]["mountPath"] == volume.mount_path
        assert mounts[volume.name].get("readOnly", False) is volume.read_only, volume
    controller_manager = result.flags("kube-controller-manager")
    assert controller_manager["allocate-node-cidrs"] == "true"
    assert controller_manager["cluster-cidr"] == "10.244.0.0/16"  # Flannel's Network (kube-flannel.yml)
    assert controller_manager["cluster-name"] == "labs-k8s"
    assert controller_manager["service-cluster-ip-range"] == "10.96.0.0/12"
    etcd = result.flags("etcd")
    assert etcd["data-dir"] == "/var/lib/etcd"
    assert etcd["advertise-client-urls"] == f"https://{first.ip}:2379"
    assert etcd["name"] == first.name
    for component in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        (container,) = result.manifest(component)["spec"]["containers"]
        assert container["image"] == f"registry.k8s.io/{component}:{version}", component

    # The kubelet: the node's address and the systemd cgroup driver (KubeletConfiguration).
    assert f"--node-ip={first.ip}" in result.file("kubeadm-flags.env")
    assert yaml.safe_load(result.file("config.yaml"))["cgroupDriver"] == "systemd"


@pytest.mark.parametrize(("lab_name", "minor"), lab_cases())
def test_kubeadm_init_dry_run_uploads_our_cluster_configuration(lab_name: str, minor: str, dry_run: Any) -> None:
    """The ClusterConfiguration kubeadm would store in kubeadm-config (what `kubeadm upgrade` and
    every join read back): our endpoint, subnets and SANs, at our version."""
    cfg = lab(lab_name, minor)
    result: DryRun = dry_run(lab_name, minor)
    uploaded = uploaded_cluster_configuration(result.stdout)
    assert uploaded["controlPlaneEndpoint"] == f"{VIP}:6443"
    assert uploaded["networking"]["podSubnet"] == "10.244.0.0/16"
    assert uploaded["networking"]["serviceSubnet"] == "10.96.0.0/12"
    assert uploaded["kubernetesVersion"] == f"v{cfg.kubernetes.version}"
    assert uploaded["clusterName"] == "labs-k8s"
    assert expected_sans(cfg) == set(uploaded["apiServer"]["certSANs"])


def uploaded_cluster_configuration(stdout: str) -> dict[str, Any]:
    """The kubeadm-config ConfigMap's ClusterConfiguration, from the objects the dry-run prints
    after each "[dryrun] Attached object:" line (up to the next "[phase]" line)."""
    for chunk in stdout.split("[dryrun] Attached object:\n")[1:]:
        lines = []
        for line in chunk.splitlines():
            if line.startswith("["):
                break
            lines.append(line)
        body = yaml.safe_load("\n".join(lines))
        if isinstance(body, dict) and body.get("kind") == "ConfigMap" and body["metadata"]["name"] == "kubeadm-config":
            return dict(yaml.safe_load(body["data"]["ClusterConfiguration"]))
    raise AssertionError(f"the dry-run printed no kubeadm-config ConfigMap:\n{stdout[-3000:]}")


# ------------------------------------------------------------------ phase names and their order


def _unquoted(line: str) -> str:
    """The line without its "..." strings: a phase named in a message is not a call."""
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', line)


@dataclass(frozen=True)
class PhaseCall:
    workflow: str  # init or join
    phase: str
    subphase: str | None
    flags: tuple[str, ...]  # the --flags the call passes


def scan_phase_calls(path: Path) -> list[PhaseCall]:
    """Every `kubeadm init|join phase ...` the file runs, in file order, and kubeadm-init.sh's
    `phase NAME [SUB] [FLAGS]` helper (which runs `kubeadm init phase NAME ... --config`)."""
    calls: list[PhaseCall] = []
    word = r"([a-z][a-z-]*)"
    text = re.sub(r"\\\n\s*", " ", path.read_text())  # continuation lines
    for line in text.splitlines():
        code = "" if line.lstrip().startswith("#") else _unquoted(line)
        for match in re.finditer(rf"\bkubeadm\s+(init|join)\s+phase\s+{word}(?:\s+(?!-){word})?", code):
            flags = re.findall(r"\s(--[a-z][a-z-]*)", re.split(r"\|\||&&|;", code[match.end() :])[0])
            calls.append(PhaseCall(match.group(1), match.group(2), match.group(3), tuple(flags)))
        if path.name == k8s.INIT_ENTRYPOINT:
            for match in re.finditer(rf"(?:^\s*|\bthen\s+|;\s*)phase\s+{word}(?:\s+(?!-){word})?", code):
                flags = re.findall(r"\s(--[a-z][a-z-]*)", re.split(r"\|\||&&|;", code[match.end() :])[0])
                calls.append(PhaseCall("init", match.group(1), match.group(2), (*flags, "--config")))
    return calls


def phase_calls(path: Path) -> list[tuple[str, str, str | None]]:
    """(workflow, phase, subphase) of every phase the file runs, in file order."""
    return [(call.workflow, call.phase, call.subphase) for call in scan_phase_calls(path)]


@dataclass(frozen=True)
class PhaseTree:
    phases: list[str]  # top-level, in kubeadm's order
    subphases: dict[str, list[str]]


def listed_phases(minor: str, workflow: str) -> PhaseTree:
    """The phases `kubeadm init|join --help` lists ('The "init" command executes the following
    phases:'), in the order the workflow runs them (cmd/kubeadm/app/cmd/init.go AppendPhase)."""
    text = run_kubeadm(minor, workflow, "--help").stdout
    # 'The "init" command ...', 'The "join [api-server-endpoint]" command ...'
    parts = re.split(rf'The "{workflow}\b[^"]*" command executes the following phases:', text, maxsplit=1)
    assert len(parts) == 2, f"kubeadm {minor} {workflow} --help lists no phases:\n{text}"
    block = parts[1]
    block = block.split("```", 2)[1] if "```" in block else block
    phases: list[str] = []
    subphases: dict[str, list[str]] = {}
    for line in block.splitlines():
        if not line.strip() or line.startswith(("Usage:", "Flags:")):
            if phases and not line.strip():
                continue
            if line.startswith(("Usage:", "Flags:")):
                break
        top = re.match(r"^([a-z][a-z-]*)\s", line)
        sub = re.match(r"^\s+/([a-z][a-z-]*)\s", line)
        if top:
            phases.append(top.group(1))
        elif sub and phases:
            subphases.setdefault(phases[-1], []).append(sub.group(1))
    assert phases, f"kubeadm {minor} {workflow} --help lists no phases:\n{text}"
    return PhaseTree(phases, subphases)


def phase_help_commands(minor: str, *words: str) -> list[str]:
    """The commands `kubeadm <words> --help` lists under "Available Commands:"."""
    text = run_kubeadm(minor, *words, "--help").stdout
    assert "Available Commands:" in text, text
    block = text.split("Available Commands:", 1)[1].split("\n\n", 1)[0]
    return [line.split()[0] for line in block.splitlines() if line.strip()]


def test_the_scripts_call_phases_the_scan_finds() -> None:
    """The scan below sees the calls we know of, and no word of a message (so it cannot pass empty)."""
    init = phase_calls(K8S_SCRIPTS / k8s.INIT_ENTRYPOINT)
    assert ("init", "certs", "all") in init and ("init", "addon", "kube-proxy") in init
    assert ("init", "upload-certs", None) in phase_calls(K8S_SCRIPTS / k8s.REFRESH_ENTRYPOINT)
    assert ("join", "control-plane-join", "mark-control-plane") in phase_calls(K8S_SCRIPTS / k8s.LIB_FILE)
    assert not [call for call in init if call[2] == "failed"], "a die message read as a call"


@pytest.mark.parametrize("minor", kubeadm_real.minors())
def test_every_phase_our_scripts_call_exists_in_that_kubeadm(minor: str) -> None:
    for workflow in ("init", "join"):
        available = phase_help_commands(minor, workflow, "phase")
        for path in [*SCRIPTS, *STANDIN_SCRIPTS]:
            for called_workflow, phase, subphase in phase_calls(path):
                if called_workflow != workflow:
                    continue
                where = f"{path.relative_to(REPO_ROOT)}: kubeadm {workflow} phase {phase} {subphase or ''}"
                assert phase in available, f"{where}: kubeadm {minor} has no such phase ({available})"
                subcommands = phase_help_commands(minor, workflow, "phase", phase) if subphase else []
                assert subphase is None or subphase in subcommands, f"{where}: not in {subcommands}"


@pytest.mark.parametrize("minor", kubeadm_real.minors())
def test_every_flag_our_scripts_hand_a_phase_exists_in_that_kubeadm(minor: str) -> None:
    @cache
    def accepted(words: tuple[str, ...]) -> set[str]:
        return set(re.findall(r"\s(--[a-z][a-z-]*)", run_kubeadm(minor, *words, "--help").stdout))

    checked = []
    for path in SCRIPTS:
        for call in scan_phase_calls(path):
            words = (call.workflow, "phase", call.phase, *([call.subphase] if call.subphase else []))
            unknown = set(call.flags) - accepted(words)
            assert not unknown, f"{path.name}: kubeadm {minor} {' '.join(words)} has no {sorted(unknown)}"
            checked.append(call.flags)
    assert ("--skip-token-print", "--config", "--kubeconfig") in checked
    # kubeadm-init.sh's first init: the flags of the whole workflow.
    init = run_kubeadm(minor, "init", "--help").stdout
    for flag in ("--config", "--upload-certs", "--skip-token-print", "--skip-certificate-key-print"):
        assert re.search(rf"\s{flag}\b", init), flag


# Phases kubeadm runs but neither lists nor lets one run alone: check-etcd (Hidden: true,
# cmd/kubeadm/app/cmd/phases/join/checketcd.go), between control-plane-prepare and kubelet-start.
HIDDEN_PHASES = {"check-etcd"}


def _is_subsequence(calls: list[str], order: list[str]) -> bool:
    position = 0
    for call in calls:
        try:
            position = order.index(call, position)
        except ValueError:
            return False
    return True


@pytest.mark.parametrize("minor", kubeadm_real.minors())
def test_our_resume_order_is_the_order_kubeadm_lists(minor: str) -> None:
    """finish_init (kubeadm-init.sh) and the join resume (lib.sh) run the phases that are missing in
    kubeadm's order; the stand-in models (tests/kube_standin.py) list kubeadm's phases exactly."""
    from tests.kube_standin import INIT_PHASES, JOIN_PHASES

    for workflow, modelled, script in (
        ("init", INIT_PHASES, k8s.INIT_ENTRYPOINT),
        ("init", INIT_PHASES, k8s.REFRESH_ENTRYPOINT),
        ("join", JOIN_PHASES, k8s.LIB_FILE),
    ):
        tree = listed_phases(minor, workflow)
        listed = [phase for phase in modelled if phase not in HIDDEN_PHASES]
        assert listed == tree.phases, f"tests/kube_standin.py models {workflow} as {modelled}"
        calls = [(p, s) for w, p, s in phase_calls(K8S_SCRIPTS / script) if w == workflow]
        assert calls, script
        order = [(p, s) for p in tree.phases for s in [None, "all", *tree.subphases.get(p, [])]]
        assert _is_subsequence(calls, order), f"{script} runs {calls}; kubeadm {minor}'s order is {tree.phases}"


# ------------------------------------------------------------------ the stand-in kubeadm


def _first_control_plane(tmp_path: Path, cfg: LabConfig) -> ShellHarness:
    """The first control plane of `cfg` over the model, with both balancers (one holds the VIP)."""
    require_tool("bash", "openssl", "jq", "timeout")
    cluster = ClusterLab(tmp_path, vip=str(cfg.load_balancer.vip))
    cluster.add_balancer("labs-k8s-lb01", "00:50:56:00:00:50", holds_vip=True)
    cluster.add_balancer("labs-k8s-lb02", "00:50:56:00:00:56", holds_vip=False)
    first = cfg.control_planes[0]
    harness = cluster.add_node(first.name, str(first.ip), first.role.value)
    assert not harness.missing_tools, harness.missing_tools
    return harness


def test_the_stand_in_kubeadm_refuses_a_config_the_real_one_refuses(tmp_path: Path) -> None:
    """kubeadm-init.sh over the stand-ins: a config with an unknown field is refused with the real
    kubeadm's words before the model runs a phase; the rendered one goes through."""
    kubeadm_real.bin_dir()
    cfg = make_lab_config()
    files = k8s.init_files(cfg, TEST_TOKEN, TEST_CERTIFICATE_KEY, TEST_ENCRYPTION_KEY)
    broken = dict(files, **{k8s.INIT_CONFIG_FILE: _unknown_field(files[k8s.INIT_CONFIG_FILE])})
    harness = _first_control_plane(tmp_path / "broken", cfg)
    harness.install_step(broken)
    refused = harness.run(k8s.INIT_ENTRYPOINT)
    assert refused.returncode != 0
    assert 'unknown field "nodeRegistration.kubeletExtraArguments"' in (harness.step / "kubeadm-init.log").read_text()
    assert not (harness.root / "etc/kubernetes/pki/ca.crt").exists(), "the model ran a phase anyway"

    harness = _first_control_plane(tmp_path / "rendered", cfg)
    harness.install_step(files)
    done = harness.run(k8s.INIT_ENTRYPOINT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "initialized"


def test_under_ci_the_stand_in_kubeadm_needs_the_real_one(tmp_path: Path) -> None:
    """CI=true without the real kubeadm: the stand-in refuses to model a config it cannot check."""
    config = tmp_path / "kubeadm-init.yaml"
    config.write_text(k8s.render_init_config(make_lab_config(), TEST_TOKEN, TEST_CERTIFICATE_KEY))
    (tmp_path / "cluster").mkdir()
    env = {
        "HARNESS_CLUSTER": str(tmp_path / "cluster"),
        "HARNESS_NODE": "labs-k8s-m01",
        "LABS_K8S_ROOT": str(tmp_path / "root"),
        "PATH": "/usr/bin:/bin",
        "CI": "true",
    }
    args = [sys.executable, str(STANDIN), "kubeadm", "init", "phase", "certs", "all", "--config", str(config)]
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode != 0
    assert f"CI=true and no real kubeadm to validate {config}" in result.stderr


def test_the_stand_in_writes_the_kubeconfigs_the_real_kubeadm_writes(tmp_path: Path, dry_run: Any) -> None:
    """After kubeadm-init.sh over the stand-ins, each kubeconfig names the API server the real
    kubeadm's names (kubeadm init --dry-run of the same config): the VIP for admin.conf and
    super-admin.conf, the node's own for the kubelet, controller manager and scheduler."""
    cfg = make_lab_config()
    harness = _first_control_plane(tmp_path, cfg)
    harness.install_step(k8s.init_files(cfg, TEST_TOKEN, TEST_CERTIFICATE_KEY, TEST_ENCRYPTION_KEY))
    done = harness.run(k8s.INIT_ENTRYPOINT)
    assert done.returncode == 0, done.stderr
    real = dry_run("default", kubeadm_real.minor_of(cfg.kubernetes.version))
    server = re.compile(r"^\s+server: (\S+)$", flags=re.M)
    for conf in ("admin.conf", "super-admin.conf", "kubelet.conf", "controller-manager.conf", "scheduler.conf"):
        modelled = server.findall((harness.root / "etc/kubernetes" / conf).read_text())
        assert modelled == server.findall(real.file(conf)), f"{conf}: the stand-in names {modelled}"
