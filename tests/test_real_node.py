"""The project's own steps on nodes of real programs (tests/real_node.py), two control planes and a
worker: prepare-node.sh installs the real containerd, kubelet and kubeadm from the box's signed
repositories; kubeadm-init.sh runs the real kubeadm init through the VIP (HAProxy with the project's
haproxy.cfg); refresh-join-material.sh and the join scripts join m02 and w01 with the CA hash the
refresh printed; apply-flannel.sh rolls out Flannel from the registry mirror. The Nodes become Ready,
m02 is a voting etcd member, every pod runs, CoreDNS answers through kube-proxy's Service, a pod on the
worker is reached over Flannel's VXLAN, and the steps run again change nothing."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from subprocess import CompletedProcess
from typing import Any

import pytest

from components.config import Role
from components.rendering import k8s as k8s_rendering
from tests import kube_programs, real_node
from tests.machine_settings import changed, machine_sysctls
from tests.requirements import require_root, require_tool, unavailable

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

TOKEN = "labsk8.0123456789abcdef"
# etcdctl inside the etcd pod, with the certificates kubeadm gave that member.
ETCDCTL = (
    "--endpoints=https://127.0.0.1:2379", "--cacert=/etc/kubernetes/pki/etcd/ca.crt",
    "--cert=/etc/kubernetes/pki/etcd/server.crt", "--key=/etc/kubernetes/pki/etcd/server.key",
)  # fmt: skip
# What the kubelet sets at start (k8s.io/kubernetes pkg/kubelet/cm/container_manager_linux.go).
KUBELET_SET = {"vm.overcommit_memory": "1", "vm.panic_on_oom": "0", "kernel.panic": "10", "kernel.panic_on_oops": "1"}
CERTIFICATE_KEY = "0f" * 32
# The Secrets' encryption key, as the program renders the stack's (32 bytes, base64).
ENCRYPTION_KEY = base64.b64encode(b"labs-k8s real-node secretbox key").decode()
# A Secret written through m01's API server and read back through m02's (issue 50).
AT_REST_SECRET, AT_REST_VALUE = "labs-k8s-at-rest", "plain-text-that-etcd-must-not-hold"
# A TCP connect to port 80 of a pause container: nothing listens, so its kernel answers with a reset.
CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], 80), timeout=10)
    print("accepted")
except ConnectionRefusedError:
    print("refused")
"""
# A DNS query for an A record, answered by CoreDNS through the kube-dns Service (kube-proxy's rules).
DNS_QUERY = """
import socket, struct, sys
name, server = sys.argv[1], sys.argv[2]
query = struct.pack(">HHHHHH", 7, 0x0100, 1, 0, 0, 0)
query += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\\0" + struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
s.sendto(query, (server, 53))
reply = s.recv(512)
print(struct.unpack(">H", reply[6:8])[0], ".".join(str(b) for b in reply[-4:]))
"""


CONTROL_PLANE, JOINING_CONTROL_PLANE, WORKER = "labs-k8s-m01", "labs-k8s-m02", "labs-k8s-w01"
NODES = (CONTROL_PLANE, JOINING_CONTROL_PLANE, WORKER)


@dataclass
class Run:
    lab: real_node.RealLab
    steps: dict[str, CompletedProcess[str]] = field(default_factory=dict)
    again: dict[str, CompletedProcess[str]] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def control_plane(self) -> real_node.RealNode:
        return self.lab.nodes[CONTROL_PLANE]


def kubectl(node: real_node.RealNode, *args: str, timeout: float = 60) -> CompletedProcess[str]:
    return node.host.run("kubectl", "--kubeconfig", "/etc/kubernetes/admin.conf", *args, timeout=timeout)


def main_pids(lab: real_node.RealLab) -> dict[str, str]:
    pids = {}
    for name, node in lab.nodes.items():
        shown = node.host.run("systemctl", "show", "-p", "MainPID", "--value", "kubelet", "containerd")
        kubelet, containerd = shown.stdout.split()
        pids |= {f"{name} kubelet": kubelet, f"{name} containerd": containerd}
    return pids


def restarts(node: real_node.RealNode) -> dict[str, int]:
    """Each pod's containers' restarts (a DaemonSet's pod may restart once while its node joins)."""
    pods = json.loads(kubectl(node, "get", "pods", "-A", "-o", "json").stdout)["items"]
    return {p["metadata"]["name"]: sum(c["restartCount"] for c in p["status"]["containerStatuses"]) for p in pods}


def wait_all_running(node: real_node.RealNode, timeout: float = 300) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        listed = kubectl(node, "get", "pods", "-A", "-o", "json")
        pods = json.loads(listed.stdout)["items"] if listed.returncode == 0 else []
        ready = {
            p["metadata"]["name"]: all(c.get("ready") for c in p["status"].get("containerStatuses", [{}])) for p in pods
        }
        if pods and all(ready.values()):
            return pods
        assert time.monotonic() < deadline, f"pods not ready after {timeout:g}s: {ready}\n{listed.stderr}"
        time.sleep(3)


def converge(run: Run, into: dict[str, CompletedProcess[str]], refresh: bool) -> bool:
    """The cluster's steps in the program's order (components/cluster.py): prepare each node (at once,
    as the engine runs them), init, then for each joining node its join-material refresh on the first
    control plane (its stdout: the CA hash the join pins) and its join, the control plane first, then
    Flannel. False at the first step that fails."""
    cfg, first = run.lab.cfg, run.lab.nodes[CONTROL_PLANE]
    prepare = k8s_rendering.PREPARE_ENTRYPOINT
    with ThreadPoolExecutor() as pool:
        prepared = {
            name: pool.submit(node.step, "prepare", k8s_rendering.prepare_files(cfg, node.node), prepare)
            for name, node in run.lab.nodes.items()
        }
    into |= {f"{name} prepare": future.result() for name, future in prepared.items()}
    if any(done.returncode for done in into.values()):
        return False
    into["init"] = first.step(
        "init", k8s_rendering.init_files(cfg, TOKEN, CERTIFICATE_KEY, ENCRYPTION_KEY), k8s_rendering.INIT_ENTRYPOINT
    )
    if into["init"].returncode:
        return False
    for name in (JOINING_CONTROL_PLANE, WORKER):
        joining = run.lab.nodes[name]
        control_plane = joining.node.role is Role.CONTROL_PLANE
        if refresh:
            key = CERTIFICATE_KEY if control_plane else None
            files = k8s_rendering.refresh_files(cfg, TOKEN, key, joining.node)
            into[f"{name} refresh"] = done = first.step(f"{name}-refresh", files, k8s_rendering.REFRESH_ENTRYPOINT)
            if done.returncode:
                return False
            run.facts[f"{name} ca_cert_hash"] = done.stdout.strip().splitlines()[-1]
        if control_plane:
            files = k8s_rendering.control_plane_join_files(cfg, joining.node, TOKEN, CERTIFICATE_KEY, ENCRYPTION_KEY)
            entrypoint = k8s_rendering.CONTROL_PLANE_JOIN_ENTRYPOINT
        else:
            files = k8s_rendering.worker_join_files(cfg, joining.node, TOKEN)
            entrypoint = k8s_rendering.WORKER_JOIN_ENTRYPOINT
        args = k8s_rendering.join_args(run.facts[f"{name} ca_cert_hash"])
        into[f"{name} join"] = done = joining.step("join", files, entrypoint, args)
        if done.returncode:
            return False
    into["flannel"] = first.step("flannel", k8s_rendering.flannel_files(cfg), k8s_rendering.FLANNEL_ENTRYPOINT)
    return into["flannel"].returncode == 0


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    require_root()
    require_tool("ip", "unshare", "nsenter", "haproxy", "mkfs.ext4", "openssl", "debootstrap")
    before = machine_sysctls()
    try:
        context = real_node.lab(tmp_path_factory.mktemp("real-node"), NODES)
        lab = context.__enter__()
    except kube_programs.BuildError as error:
        unavailable(f"the node's real programs could not be built: {error}")
        raise AssertionError("unreachable") from error
    try:
        result = Run(lab)
        if converge(result, result.steps, refresh=True):
            node = result.control_plane
            result.facts["pods"] = wait_all_running(node)
            result.facts["dns"] = node.host.run(
                "python3", "-c", DNS_QUERY, "kubernetes.default.svc.cluster.local", "10.96.0.10"
            )
            result.facts["vxlan"] = pod_across_hosts(result)
            result.facts["etcd_members"] = kubectl(
                node, "-n", "kube-system", "exec", f"etcd-{CONTROL_PLANE}", "--", "etcdctl", *ETCDCTL, "member", "list",
                "-w", "json",
            )  # fmt: skip
            result.facts["at_rest"] = secrets_at_rest(result)
            result.facts["pids_before"], result.facts["restarts_before"] = main_pids(lab), restarts(node)
            converge(result, result.again, refresh=False)
            result.facts["pids_after"], result.facts["restarts_after"] = main_pids(lab), restarts(node)
            result.facts["tunables"] = {key: node.host.run("sysctl", "-n", key).stdout.strip() for key in KUBELET_SET}
            result.facts["machine_settings_changed"] = changed(before, machine_sysctls())
        yield result
    finally:
        context.__exit__(None, None, None)


def pod_across_hosts(run: Run) -> dict[str, str]:
    """A pod on the worker (the pause image: its kernel answers a TCP connect with a reset), reached
    from the control plane: the route to its address is Flannel's VXLAN device."""
    node = run.control_plane
    pause = f"registry.k8s.io/pause:{kube_programs.entry('kubernetes-1.36')['pins']['pause']}"
    overrides = json.dumps({"spec": {"nodeName": WORKER}})
    created = kubectl(node, "run", "probe", f"--image={pause}", "--restart=Never", f"--overrides={overrides}")
    assert created.returncode == 0, created.stderr
    waited = kubectl(node, "wait", "--for=condition=Ready", "pod/probe", "--timeout=180s", timeout=200)
    described = kubectl(node, "describe", "pod", "probe").stdout
    assert waited.returncode == 0, waited.stdout + waited.stderr + described
    ip = kubectl(node, "get", "pod", "probe", "-o", "jsonpath={.status.podIP}").stdout.strip()
    route = node.host.run("ip", "route", "get", ip).stdout
    reached = node.host.run("python3", "-c", CONNECT, ip)
    deleted = kubectl(node, "delete", "pod", "probe", "--wait=true")
    assert deleted.returncode == 0, deleted.stderr
    return {"ip": ip, "route": route, "reached": reached.stdout.strip() + reached.stderr}


def secrets_at_rest(run: Run) -> dict[str, Any]:
    """A Secret created through m01's own API server, its value as etcd holds it (etcdctl in m01's
    etcd pod), the same Secret read through m02's API server, each control plane's files and modes,
    and the audit events both API servers logged for it."""
    m01, m02 = run.control_plane, run.lab.nodes[JOINING_CONTROL_PLANE]
    server = {node.node.name: f"--server=https://{node.node.ip}:{k8s_rendering.API_PORT}" for node in (m01, m02)}
    created = kubectl(
        m01,
        server[CONTROL_PLANE],
        "create",
        "secret",
        "generic",
        AT_REST_SECRET,
        f"--from-literal=value={AT_REST_VALUE}",
    )
    assert created.returncode == 0, created.stderr
    stored = kubectl(
        m01, "-n", "kube-system", "exec", f"etcd-{CONTROL_PLANE}", "--", "etcdctl", *ETCDCTL, "get",
        f"/registry/secrets/default/{AT_REST_SECRET}", "-w", "json",
    )  # fmt: skip
    assert stored.returncode == 0, stored.stderr
    (kv,) = json.loads(stored.stdout)["kvs"]
    read = kubectl(m02, server[JOINING_CONTROL_PLANE], "get", "secret", AT_REST_SECRET, "-o", "jsonpath={.data.value}")
    facts: dict[str, Any] = {
        "etcd_value": base64.b64decode(kv["value"]),
        "read_through_m02": base64.b64decode(read.stdout).decode() if read.returncode == 0 else read.stderr,
    }
    paths = (
        k8s_rendering.ENCRYPTION_CONFIG_PATH, k8s_rendering.ENCRYPTION_CONFIG_PATH.rsplit("/", 1)[0],
        k8s_rendering.AUDIT_POLICY_PATH, k8s_rendering.AUDIT_LOG_PATH, k8s_rendering.AUDIT_LOG_PATH.rsplit("/", 1)[0],
    )  # fmt: skip
    for node in (m01, m02):
        name = node.node.name
        facts[f"{name} modes"] = node.host.run("stat", "-c", "%n %a %U", *paths).stdout.splitlines()
        facts[f"{name} config"] = node.host.run("cat", k8s_rendering.ENCRYPTION_CONFIG_PATH).stdout
        manifest = node.host.run("cat", "/etc/kubernetes/manifests/kube-apiserver.yaml").stdout
        facts[f"{name} flags"] = [line.strip() for line in manifest.splitlines() if "- --encryption" in line]
        log = node.host.run("cat", k8s_rendering.AUDIT_LOG_PATH).stdout
        events = [json.loads(line) for line in log.splitlines() if line.strip()]
        facts[f"{name} audit"] = {
            "events": len(events),
            "holds_value": AT_REST_VALUE in log or ENCRYPTION_KEY in log,
            "secret": [
                {key: event.get(key) for key in ("verb", "level", "stage", "requestObject", "responseObject")}
                for event in events
                if (event.get("objectRef") or {}).get("name") == AT_REST_SECRET
            ],
        }
    return facts


def output(done: CompletedProcess[str]) -> str:
    return "\n".join(line for line in (done.stdout + done.stderr).splitlines() if "Reading database" not in line)


def test_the_steps_make_a_ready_cluster_of_the_real_programs(run: Run) -> None:
    for name, done in run.steps.items():
        assert done.returncode == 0, f"{name}:\n{output(done)[-6000:]}"
    joins = [f"{name} {step}" for name in (JOINING_CONTROL_PLANE, WORKER) for step in ("refresh", "join")]
    assert sorted(run.steps) == sorted([*(f"{name} prepare" for name in NODES), "init", *joins, "flannel"])
    nodes = json.loads(kubectl(run.control_plane, "get", "nodes", "-o", "json").stdout)["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == sorted(NODES)
    cfg = run.lab.cfg
    for node in nodes:
        info = node["status"]["nodeInfo"]
        assert info["kubeletVersion"] == f"v{cfg.kubernetes.version}"
        assert info["containerRuntimeVersion"] == f"containerd://{cfg.kubernetes.containerd_version}"
        ready = [c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready == ["True"], node["status"]["conditions"]


def test_every_pod_runs_from_the_registry_mirror(run: Run) -> None:
    assert "pods" in run.facts, f"the steps did not finish: {sorted(run.steps)}"
    names = sorted(p["metadata"]["name"] for p in run.facts["pods"])
    for expected in ("etcd-labs-k8s", "kube-apiserver-labs-k8s", "kube-proxy", "kube-flannel-ds", "coredns-"):
        assert any(name.startswith(expected) for name in names), names
    images = {c["image"] for p in run.facts["pods"] for c in p["spec"]["containers"]}
    assert "ghcr.io/flannel-io/flannel:v0.28.9" in images, images


def test_coredns_answers_through_the_kube_dns_service(run: Run) -> None:
    dns = run.facts.get("dns")
    assert dns is not None, f"the steps did not finish: {sorted(run.steps)}"
    assert dns.returncode == 0 and dns.stdout.split() == ["1", "10.96.0.1"], dns.stdout + dns.stderr


def test_the_steps_run_again_change_nothing(run: Run) -> None:
    """What a no-change `up` after a replaced bundle does on the nodes: every step converges at once;
    neither the kubelet nor containerd restarts, no container restarts."""
    assert run.again, f"the steps did not finish: {sorted(run.steps)}"
    for name, done in run.again.items():
        assert done.returncode == 0, f"{name}:\n{output(done)[-6000:]}"
    for name in NODES:
        assert "installing" not in output(run.again[f"{name} prepare"]), output(run.again[f"{name} prepare"])
    assert "kubeadm init for" not in output(run.again["init"]), output(run.again["init"])
    for name in ("init", f"{JOINING_CONTROL_PLANE} join"):  # the same files: not rewritten
        assert "wrote /etc/kubernetes/" not in output(run.again[name]), output(run.again[name])
    assert run.facts["pids_after"] == run.facts["pids_before"]
    assert run.facts["restarts_after"] == run.facts["restarts_before"]


def test_the_kubelets_kernel_tunables_stay_in_the_node(run: Run) -> None:
    """The kubelet writes machine-wide kernel tunables at start (setupKernelTunables): in the box they
    land in the host's own files, and the machine's settings are as they were."""
    assert "tunables" in run.facts, f"the steps did not finish: {sorted(run.steps)}"
    assert run.facts["tunables"] == KUBELET_SET, run.facts["tunables"]
    assert run.facts["machine_settings_changed"] == {}


def test_a_pod_on_the_worker_is_reached_from_the_control_plane_over_flannels_vxlan(run: Run) -> None:
    vxlan = run.facts.get("vxlan")
    assert vxlan is not None, f"the steps did not finish: {sorted(run.steps)}"
    assert " dev flannel.1 " in vxlan["route"], vxlan
    assert vxlan["reached"] == "refused", vxlan  # a reset from the pod's own kernel, not a timeout


def test_the_joined_control_plane_is_a_second_voting_etcd_member(run: Run) -> None:
    listed = run.facts.get("etcd_members")
    assert listed is not None, f"the steps did not finish: {sorted(run.steps)}"
    assert listed.returncode == 0, listed.stderr
    members = json.loads(listed.stdout)["members"]
    assert sorted(m["name"] for m in members) == [CONTROL_PLANE, JOINING_CONTROL_PLANE], members
    assert not [m for m in members if m.get("isLearner")], members


def test_a_secret_read_straight_from_etcd_is_encrypted_and_the_joined_control_plane_reads_it(run: Run) -> None:
    """Issue 50: kube-apiserver encrypts Secrets with the stack's key (secretbox) before etcd stores
    them; the control plane that joined has the same key (its API server decrypts what m01's wrote);
    the configuration is root-only on both."""
    at_rest = run.facts.get("at_rest")
    assert at_rest is not None, f"the steps did not finish: {sorted(run.steps)}"
    stored = at_rest["etcd_value"]
    assert stored.startswith(b"k8s:enc:secretbox:v1:labs-k8s-1:"), stored[:40]
    assert AT_REST_VALUE.encode() not in stored
    assert at_rest["read_through_m02"] == AT_REST_VALUE
    expected = k8s_rendering.render_encryption_config(ENCRYPTION_KEY)
    for name in (CONTROL_PLANE, JOINING_CONTROL_PLANE):
        assert at_rest[f"{name} config"] == expected, name
        assert at_rest[f"{name} flags"] == [f"- --encryption-provider-config={k8s_rendering.ENCRYPTION_CONFIG_PATH}"]
        assert at_rest[f"{name} modes"] == [
            f"{k8s_rendering.ENCRYPTION_CONFIG_PATH} 600 root",
            "/etc/kubernetes/encryption 700 root",
            f"{k8s_rendering.AUDIT_POLICY_PATH} 600 root",
            f"{k8s_rendering.AUDIT_LOG_PATH} 600 root",
            "/var/log/kubernetes/audit 700 root",
        ], name


def test_each_api_server_keeps_an_audit_log_of_metadata_without_the_secrets_value(run: Run) -> None:
    """m01's log holds the Secret's create, m02's its read: at Metadata, with no request or response
    body, and neither the Secret's value nor the key anywhere in either log."""
    at_rest = run.facts.get("at_rest")
    assert at_rest is not None, f"the steps did not finish: {sorted(run.steps)}"
    for name, verb in ((CONTROL_PLANE, "create"), (JOINING_CONTROL_PLANE, "get")):
        audit = at_rest[f"{name} audit"]
        assert audit["events"] > 0 and not audit["holds_value"], (name, audit)
        expected = {"verb": verb, "level": "Metadata", "stage": "ResponseComplete"}
        assert {**expected, "requestObject": None, "responseObject": None} in audit["secret"], (name, audit["secret"])
        assert {event["level"] for event in audit["secret"]} == {"Metadata"}, audit["secret"]
