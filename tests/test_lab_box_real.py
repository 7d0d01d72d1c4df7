"""The lab in a box on the real programs (issue 49): `make up` from an empty vcsim to verify-cluster,
with the real kubeadm, kubelet, containerd, etcd, control plane, CoreDNS and Flannel.

The same box as tests/test_lab_box.py (vcsim, the real CLI and plugins, a systemd host per clone booted
by cloud-init from the guestinfo the provider set, real SSH with pinned keys, HAProxy and Keepalived),
with the real packages in the box's signed repositories (tests/box_repo.py) and their images in the
registry mirror at the gateway, over TLS with the CA the stack pins (tests/kube_images.py). Nothing of
Kubernetes is pre-loaded into a node. The box's deviations from a VM: tests/real_node.py, docs/testing.md.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests import kube_programs
from tests.machine_settings import changed, machine_sysctls
from tests.requirements import require_root, require_tool, unavailable
from tests.test_lab_box import CFG, NODES, Box, assert_ok, open_box

pytestmark = [pytest.mark.integration, pytest.mark.timeout(3600)]

MINOR = "1.36"
WORKERS = [node.name for node in CFG.workers]
# etcdctl inside the etcd pod, with the certificates kubeadm gave that member.
ETCDCTL = (
    "--endpoints=https://127.0.0.1:2379", "--cacert=/etc/kubernetes/pki/etcd/ca.crt",
    "--cert=/etc/kubernetes/pki/etcd/server.crt", "--key=/etc/kubernetes/pki/etcd/server.key",
)  # fmt: skip
# busybox (Debian's busybox-static, in the kube-proxy image's userland: tests/kube_images.py).
BUSYBOX = "/bin/busybox"


def kubectl(box: Box, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The real kubectl of the minor, in the CLI's namespace, with the stack's kubeconfig output:
    through the VIP, HAProxy and an API server, as a user runs it."""
    lab = box.lab
    config = lab.root / "kubeconfig"
    if not config.exists():
        shown = lab.pulumi("stack", "output", "--stack", lab.stack, "--show-secrets", "kubeconfig").stdout
        config.touch(mode=0o600)
        config.write_text(shown)
    program = kube_programs.build_one(f"kubernetes-{MINOR}") / "kubectl"
    argv = lab.in_lab(str(program), "--kubeconfig", str(config), *args, trusted=False)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def json_of(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def wait_all_ready(box: Box, timeout: float = 300) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        listed = kubectl(box, "get", "pods", "-A", "-o", "json")
        pods = json.loads(listed.stdout)["items"] if listed.returncode == 0 else []
        ready = {
            p["metadata"]["name"]: all(c.get("ready") for c in p["status"].get("containerStatuses", [{}])) for p in pods
        }
        if pods and all(ready.values()):
            return pods
        assert time.monotonic() < deadline, f"pods not ready after {timeout:g}s: {ready}\n{listed.stderr}"
        time.sleep(3)


def main_pids(box: Box) -> dict[str, str]:
    pids = {}
    for name in (node.name for node in CFG.kubernetes_nodes):
        shown = box.hosts.by_name(name).run("systemctl", "show", "-p", "MainPID", "--value", "kubelet", "containerd")
        kubelet, containerd = shown.stdout.split()
        pids |= {f"{name} kubelet": kubelet, f"{name} containerd": containerd}
    return pids


def restarts(box: Box) -> dict[str, int]:
    pods = json_of(kubectl(box, "get", "pods", "-A", "-o", "json"))["items"]
    return {p["metadata"]["name"]: sum(c["restartCount"] for c in p["status"]["containerStatuses"]) for p in pods}


def traffic(box: Box) -> dict[str, Any]:
    """A web server pod on one worker behind a ClusterIP Service, a client pod on the other: the
    client reaches the server's pod address (Flannel's VXLAN between the hosts), the Service's address
    (kube-proxy's rules), and resolves the Service's name (CoreDNS)."""
    image = f"registry.k8s.io/kube-proxy:{kube_programs.entry(f'kubernetes-{MINOR}')['version']}"
    server, client = WORKERS
    manifest = [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "labels": {"app": "web"}},
         "spec": {"nodeName": server, "containers": [{"name": "web", "image": image, "command": [
             BUSYBOX, "sh", "-c", "mkdir -p /www && echo served-by-web > /www/index.html && "
             f"exec {BUSYBOX} httpd -f -p 8080 -h /www"]}]}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client"},
         "spec": {"nodeName": client, "containers": [{"name": "client", "image": image,
                                                      "command": [BUSYBOX, "sleep", "3600"]}]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
         "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}},
    ]  # fmt: skip
    path = box.lab.root / "traffic.yaml"
    path.write_text(yaml.safe_dump_all(manifest))
    facts: dict[str, Any] = {"applied": kubectl(box, "apply", "-f", str(path))}
    facts["ready"] = kubectl(box, "wait", "--for=condition=Ready", "pod/web", "pod/client", "--timeout=180s")
    web = json_of(kubectl(box, "get", "pod", "web", "-o", "json"))
    facts["web_ip"] = web["status"].get("podIP", "")

    def from_client(*argv: str) -> subprocess.CompletedProcess[str]:
        return kubectl(box, "exec", "client", "--", BUSYBOX, *argv)

    def get(address: str, port: int) -> subprocess.CompletedProcess[str]:
        # nc, not busybox-static's wget, which segfaults (Debian's 1:1.35.0-4+deb12u1+b1, on this machine too).
        request = f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | {BUSYBOX} nc -w 10 {address} {port}"
        return from_client("sh", "-c", request)

    service = json_of(kubectl(box, "get", "service", "web", "-o", "json"))
    facts["service_ip"] = service["spec"].get("clusterIP", "")
    facts["pod_ip"] = get(facts["web_ip"], 8080)
    facts["service"] = get(facts["service_ip"], 80)
    # busybox's own resolver asks the pod's nameserver (the kube-dns Service, CoreDNS behind it).
    facts["dns"] = from_client("nslookup", "web.default.svc.cluster.local")
    facts["deleted"] = kubectl(box, "delete", "-f", str(path), "--wait=true")
    return facts


def run_scenario(box: Box) -> None:
    lab, hosts = box.lab, box.hosts
    box.stages["vsphere"] = lab.make("up", layer="vsphere", args="--yes", timeout=1200)
    if not box.stages["vsphere"].ok:
        return
    box.stages["boot_seconds"] = hosts.wait_booted(NODES, timeout=600)
    started = time.monotonic()
    box.stages["cluster_up"] = lab.make("up", args="--yes --parallel 16", timeout=2400)
    box.stages["cluster_up_seconds"] = round(time.monotonic() - started)
    if not box.stages["cluster_up"].ok:
        return
    box.stages["nodes"] = json_of(kubectl(box, "get", "nodes", "-o", "json"))["items"]
    box.stages["pods"] = wait_all_ready(box)
    first = CFG.control_planes[0].name
    box.stages["etcd_members"] = kubectl(
        box, "-n", "kube-system", "exec", f"etcd-{first}", "--", "etcdctl", *ETCDCTL, "member", "list", "-w", "json"
    )
    box.stages["traffic"] = traffic(box)
    box.stages["pids_before"], box.stages["restarts_before"] = main_pids(box), restarts(box)
    box.stages["again"] = lab.engine("preview", expect_no_changes=True)
    box.stages["up_again"] = lab.make("up", args="--yes", timeout=1800)
    box.stages["pids_after"], box.stages["restarts_after"] = main_pids(box), restarts(box)


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    require_root()
    require_tool("ip", "make", "jq", "ssh-keygen", "nsenter", "unshare", "debootstrap", "mkfs.ext4", "openssl")
    before = machine_sysctls()
    try:
        context = open_box(tmp_path_factory.mktemp("real-box"), real=MINOR)
        opened = context.__enter__()
    except kube_programs.BuildError as error:
        unavailable(f"the nodes' real programs could not be built: {error}")
        raise AssertionError("unreachable") from error
    try:
        run_scenario(opened)
        opened.stages["machine_settings_changed"] = changed(before, machine_sysctls())
        figures = {key: opened.stages.get(key) for key in ("boot_seconds", "cluster_up_seconds")}
        (opened.lab.artifacts / "figures.json").write_text(json.dumps(figures))
        yield opened
    finally:
        context.__exit__(None, None, None)


def test_make_up_builds_the_cluster_of_the_real_programs_to_verify_cluster(box: Box) -> None:
    """Five Nodes Ready at the pinned kubelet and containerd, seen through the VIP with the stack's
    kubeconfig output and the real kubectl; every pod ready, its image from the registry mirror."""
    assert_ok(box, "cluster_up")
    nodes = {n["metadata"]["name"]: n for n in box.stages["nodes"]}
    assert sorted(nodes) == sorted(n.name for n in CFG.kubernetes_nodes), sorted(nodes)
    version = box.repo.kubernetes_versions[MINOR].split("-")[0]
    (containerd,) = box.repo.containerd_versions
    for name, node in nodes.items():
        info = node["status"]["nodeInfo"]
        assert info["kubeletVersion"] == f"v{version}", (name, info)
        assert info["containerRuntimeVersion"] == f"containerd://{containerd.split('-')[0]}", (name, info)
        ready = [c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready == ["True"], (name, node["status"]["conditions"])
    names = sorted(p["metadata"]["name"] for p in box.stages["pods"])
    for node in CFG.control_planes:
        for component in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"):
            assert f"{component}-{node.name}" in names, (component, names)
    for prefix in ("kube-proxy-", "kube-flannel-ds-", "coredns-"):
        assert any(name.startswith(prefix) for name in names), (prefix, names)


def test_the_three_control_planes_are_voting_etcd_members(box: Box) -> None:
    listed = box.stages.get("etcd_members")
    assert listed is not None, f"the scenario stopped before: {sorted(box.stages)}"
    members = json_of(listed)["members"]
    assert sorted(m["name"] for m in members) == sorted(n.name for n in CFG.control_planes), members
    assert not [m for m in members if m.get("isLearner")], members


def test_pods_on_two_workers_talk_over_flannel_through_a_service_and_by_name(box: Box) -> None:
    facts = box.stages.get("traffic")
    assert facts is not None, f"the scenario stopped before: {sorted(box.stages)}"
    assert facts["ready"].returncode == 0, facts["ready"].stdout + facts["ready"].stderr
    for check in ("pod_ip", "service"):
        answer, error = facts[check].stdout, facts[check].stderr
        assert answer.startswith("HTTP/1.") and answer.rstrip().endswith("served-by-web"), (check, answer, error)
    assert f"Address: {facts['service_ip']}" in facts["dns"].stdout, facts["dns"].stdout + facts["dns"].stderr


def test_a_second_make_up_changes_nothing_and_restarts_nothing(box: Box) -> None:
    assert_ok(box, "cluster_up")
    again = box.stages["again"]
    assert again.ok, again.output[-3000:]
    assert box.stages["up_again"].ok, box.stages["up_again"].output[-3000:]
    assert box.stages["pids_after"] == box.stages["pids_before"]
    assert box.stages["restarts_after"] == box.stages["restarts_before"]


def test_the_real_cluster_changed_no_machine_wide_setting(box: Box) -> None:
    assert_ok(box, "cluster_up")
    assert box.stages["machine_settings_changed"] == {}
