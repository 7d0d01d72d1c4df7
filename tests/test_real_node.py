"""The project's own steps on a node of real programs (tests/real_node.py): prepare-node.sh installs the
real containerd, kubelet and kubeadm from the box's signed repositories; kubeadm-init.sh runs the real
kubeadm init through the VIP (HAProxy with the project's haproxy.cfg); apply-flannel.sh rolls out
Flannel from the registry mirror. The node becomes Ready, every pod runs, CoreDNS answers through
kube-proxy's Service, and the steps run again change nothing."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from subprocess import CompletedProcess
from typing import Any

import pytest

from components.rendering import k8s as k8s_rendering
from tests import kube_programs, real_node
from tests.machine_settings import changed, machine_sysctls
from tests.requirements import require_root, require_tool, unavailable

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

TOKEN = "labsk8.0123456789abcdef"
# What the kubelet sets at start (k8s.io/kubernetes pkg/kubelet/cm/container_manager_linux.go).
KUBELET_SET = {"vm.overcommit_memory": "1", "vm.panic_on_oom": "0", "kernel.panic": "10", "kernel.panic_on_oops": "1"}
CERTIFICATE_KEY = "0f" * 32
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


@dataclass
class Run:
    node: real_node.RealNode
    steps: dict[str, CompletedProcess[str]] = field(default_factory=dict)
    again: dict[str, CompletedProcess[str]] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)


def steps(node: real_node.RealNode) -> dict[str, tuple[dict[str, str], str]]:
    cfg = node.cfg
    return {
        "prepare": (k8s_rendering.prepare_files(cfg, node.node), k8s_rendering.PREPARE_ENTRYPOINT),
        "init": (k8s_rendering.init_files(cfg, TOKEN, CERTIFICATE_KEY), k8s_rendering.INIT_ENTRYPOINT),
        "flannel": (k8s_rendering.flannel_files(cfg), k8s_rendering.FLANNEL_ENTRYPOINT),
    }


def kubectl(node: real_node.RealNode, *args: str) -> CompletedProcess[str]:
    return node.host.run("kubectl", "--kubeconfig", "/etc/kubernetes/admin.conf", *args)


def main_pids(node: real_node.RealNode) -> dict[str, str]:
    show = node.host.run("systemctl", "show", "-p", "MainPID", "--value", "kubelet", "containerd")
    return dict(zip(("kubelet", "containerd"), show.stdout.split(), strict=True))


def wait_all_running(node: real_node.RealNode, timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        listed = kubectl(node, "get", "pods", "-A", "-o", "json")
        pods = json.loads(listed.stdout)["items"] if listed.returncode == 0 else []
        ready = {
            p["metadata"]["name"]: all(c.get("ready") for c in p["status"].get("containerStatuses", [{}])) for p in pods
        }
        if pods and all(ready.values()):
            return {"pods": pods}
        assert time.monotonic() < deadline, f"pods not ready after {timeout:g}s: {ready}\n{listed.stderr}"
        time.sleep(3)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    require_root()
    require_tool("ip", "unshare", "nsenter", "haproxy", "mkfs.ext4", "openssl", "debootstrap")
    before = machine_sysctls()
    try:
        context = real_node.control_plane(tmp_path_factory.mktemp("real-node"))
        node = context.__enter__()
    except kube_programs.BuildError as error:
        unavailable(f"the node's real programs could not be built: {error}")
        raise AssertionError("unreachable") from error
    try:
        result = Run(node)
        for name, (files, entrypoint) in steps(node).items():
            result.steps[name] = done = node.step(name, files, entrypoint)
            if done.returncode != 0:
                break
        else:
            result.facts |= wait_all_running(node)
            result.facts["dns"] = node.host.run(
                "python3", "-c", DNS_QUERY, "kubernetes.default.svc.cluster.local", "10.96.0.10"
            )
            result.facts["pids_before"] = main_pids(node)
            for name, (files, entrypoint) in steps(node).items():
                result.again[name] = node.step(name, files, entrypoint)
            result.facts["pids_after"] = main_pids(node)
            result.facts["restarts"] = {
                p["metadata"]["name"]: sum(c["restartCount"] for c in p["status"]["containerStatuses"])
                for p in json.loads(kubectl(node, "get", "pods", "-A", "-o", "json").stdout)["items"]
            }
            result.facts["tunables"] = {key: node.host.run("sysctl", "-n", key).stdout.strip() for key in KUBELET_SET}
            result.facts["machine_settings_changed"] = changed(before, machine_sysctls())
        yield result
    finally:
        context.__exit__(None, None, None)


def output(done: CompletedProcess[str]) -> str:
    return "\n".join(line for line in (done.stdout + done.stderr).splitlines() if "Reading database" not in line)


def test_the_steps_make_a_ready_control_plane_of_the_real_programs(run: Run) -> None:
    for name, done in run.steps.items():
        assert done.returncode == 0, f"{name}:\n{output(done)[-6000:]}"
    assert list(run.steps) == ["prepare", "init", "flannel"]
    (node,) = json.loads(kubectl(run.node, "get", "nodes", "-o", "json").stdout)["items"]
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == f"v{run.node.cfg.kubernetes.version}"
    assert info["containerRuntimeVersion"] == f"containerd://{run.node.cfg.kubernetes.containerd_version}"
    ready = [c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready == ["True"], node["status"]["conditions"]


def test_every_pod_runs_from_the_registry_mirror(run: Run) -> None:
    assert "pods" in run.facts, f"the steps did not finish: {sorted(run.steps)}"
    names = sorted(p["metadata"]["name"].rsplit("-", 1)[0] for p in run.facts["pods"])
    for expected in ("etcd-labs-k8s", "kube-apiserver-labs-k8s", "kube-proxy", "kube-flannel-ds", "coredns-"):
        assert any(name.startswith(expected) for name in names), names
    images = {c["image"] for p in run.facts["pods"] for c in p["spec"]["containers"]}
    assert "ghcr.io/flannel-io/flannel:v0.28.9" in images, images


def test_coredns_answers_through_the_kube_dns_service(run: Run) -> None:
    dns = run.facts.get("dns")
    assert dns is not None, f"the steps did not finish: {sorted(run.steps)}"
    assert dns.returncode == 0 and dns.stdout.split() == ["1", "10.96.0.1"], dns.stdout + dns.stderr


def test_the_steps_run_again_change_nothing(run: Run) -> None:
    """What a no-change `up` after a replaced bundle does on a node: every step converges at once;
    neither the kubelet nor containerd restarts, no container restarts."""
    assert run.again, f"the steps did not finish: {sorted(run.steps)}"
    for name, done in run.again.items():
        assert done.returncode == 0, f"{name}:\n{output(done)[-6000:]}"
    assert "installing" not in output(run.again["prepare"]), output(run.again["prepare"])
    assert "kubeadm init for" not in output(run.again["init"]), output(run.again["init"])
    assert run.facts["pids_after"] == run.facts["pids_before"]
    assert not {name: n for name, n in run.facts["restarts"].items() if n}, run.facts["restarts"]


def test_the_kubelets_kernel_tunables_stay_in_the_node(run: Run) -> None:
    """The kubelet writes machine-wide kernel tunables at start (setupKernelTunables): in the box they
    land in the host's own files, and the machine's settings are as they were."""
    assert "tunables" in run.facts, f"the steps did not finish: {sorted(run.steps)}"
    assert run.facts["tunables"] == KUBELET_SET, run.facts["tunables"]
    assert run.facts["machine_settings_changed"] == {}
