"""The drills' kubectl calls (components/tools/drills/cluster.py `KubectlCluster`) against the
Kubernetes stand-ins, not a double: every call below is the real KubectlCluster running the real
stand-in kubectl as a process.

- The shell harnesses' model (tests/kube_standin.py), on its own clock: a cluster as a finished
  `up` leaves it (three control planes with their etcd members, two workers, the balancers), built
  in the store directly; a test moves the clock (`advance`) and powers hosts off and on. With it,
  whole drills run too (`Drill` with the model's clock and sleep: a drill's minutes in seconds).
- The lab in a box's kubectl (box_cluster.kubectl_main) as the CLI's machine runs it
  (tests/box_kubectl.py's launcher), on real time. Its real HTTPS path needs an API server: the
  box's own (daemons.apiserver_main) runs only in a node host (its pki under /etc/kubernetes, its
  etcd on 127.0.0.1:2379), so a loopback TLS server with a certificate of the store's CA plays
  HAProxy and the API servers (/readyz, /api with the client certificate checked), and the
  members' peer ports and kubelets' API ports are loopback listeners on 127.0.0.11-13.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from components.tools.drills.cluster import (
    TEST_APP_LABEL,
    TEST_DEPLOYMENT,
    ClusterError,
    EtcdStatus,
    KubectlCluster,
    deployment_manifest,
)
from components.tools.drills.engine import EXIT_PASS, Limits
from components.tools.drills.inputs import DrillInputs, NodeInfo
from components.tools.drills.scenarios import SCENARIOS
from components.tools.drills.vcenter import VCenterMachines
from tests import box_kubectl
from tests import kube_standin as ks
from tests.requirements import require_tool

VIP = "10.3.60.100"
LB1, LB2 = "labs-k8s-lb01", "labs-k8s-lb02"
M1, M2, M3 = "labs-k8s-m01", "labs-k8s-m02", "labs-k8s-m03"
W1, W2 = "labs-k8s-w01", "labs-k8s-w02"
NODES = (
    NodeInfo(LB1, "balancer", "10.3.60.41"),
    NodeInfo(LB2, "balancer", "10.3.60.42"),
    NodeInfo(M1, "control-plane", "10.3.60.51"),
    NodeInfo(M2, "control-plane", "10.3.60.52"),
    NodeInfo(M3, "control-plane", "10.3.60.53"),
    NodeInfo(W1, "worker", "10.3.60.61"),
    NodeInfo(W2, "worker", "10.3.60.62"),
)
# Member IDs above 2^63: JSON must carry them exactly (jq's doubles would not).
MEMBER_IDS = {M1: 0x8E9E05C52164694D, M2: 0x8E9E05C52164694E, M3: 0x8E9E05C52164694F}
NODE_GRACE_S = 50.0  # kube-controller-manager's --node-monitor-grace-period (box_cluster.NODE_GRACE_S)
POD_READY_S = ks.CONTAINER_START_S + 2  # the container, then one readiness period (the manifest's 2 s)
PODS_PATH = f"/api/v1/namespaces/default/pods?labelSelector={TEST_APP_LABEL.replace('/', '%2F')}%3D{TEST_DEPLOYMENT}"
ETCDCTL = (
    "-n", "kube-system", "exec", f"etcd-{M1}", "-c", "etcd", "--", "etcdctl", "--endpoints=https://127.0.0.1:2379",
    "--cacert=/etc/kubernetes/pki/etcd/ca.crt", "--cert=/etc/kubernetes/pki/etcd/server.crt",
    "--key=/etc/kubernetes/pki/etcd/server.key", "--command-timeout=5s",
)  # fmt: skip


# --------------------------------------------------------------------------- the model's lab


class ModelLab:
    """The lab as a finished `up` leaves it in the model (kube_standin.py), and its kubectl."""

    def __init__(self, base: Path) -> None:
        require_tool("openssl")
        self.dir = base / "cluster"
        self.dir.mkdir(parents=True)
        with self.edit() as s:
            s.update(vip=VIP, cni=True, node_grace_s=NODE_GRACE_S)
            s["balancers"] = {
                LB1: {"mac": "00:50:56:00:00:50", "holds_vip": True, "haproxy": True},
                LB2: {"mac": "00:50:56:00:00:56", "holds_vip": False, "haproxy": True},
            }
            for node in NODES:
                if node.role == "balancer":
                    continue
                root = base / node.name
                s["hosts"][node.name] = {
                    "ip": node.ip,
                    "role": node.role,
                    "root": str(root),
                    "up": True,
                    "kubelet": True,
                }
                # The kubelet's client certificate (kubelet_has_client_cert reads kubelet.conf).
                ks.write(
                    root, "/etc/kubernetes/kubelet.conf", "users:\n- user:\n    client-certificate-data: Y2VydA==\n"
                )
                entry: dict[str, Any] = {"labels": {}}
                if node.role == "control-plane":
                    for manifest in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"):
                        ks.write(root, f"/etc/kubernetes/manifests/{manifest}.yaml", f"# {manifest}\n")
                    ks.write(root, "/var/lib/etcd/member/id", f"data-{node.name}\n")
                    s["members"].append(
                        {"id": MEMBER_IDS[node.name], "name": node.name, "peer": f"https://{node.ip}:2380",
                         "learner": False, "data": f"data-{node.name}"}
                    )  # fmt: skip
                    entry["labels"]["node-role.kubernetes.io/control-plane"] = ""
                    entry["taints"] = [{"key": ks.CONTROL_PLANE_TAINT, "effect": "NoSchedule"}]
                s["nodes"][node.name] = entry
        cluster = ks.Cluster(self.dir)
        with cluster.locked():
            # The stack's `kubeconfig` output: admin credentials embedded. Its server is the first
            # control plane's own address, so only --server can send a call through the VIP.
            self.kubeconfig = ks.kubeconfig_text(cluster, f"https://{NODES[2].ip}:6443", "kubernetes-admin")
        self.kubectl = base / "kubectl"
        self.kubectl.write_text(
            f"#!/bin/sh\nexport HARNESS_CLUSTER='{self.dir}' HARNESS_NODE=labs-k8s-cli\n"
            f"exec '{sys.executable}' '{ks.__file__}' kubectl \"$@\"\n"
        )
        self.kubectl.chmod(0o755)
        self.kubeconfig_file = base / "admin.kubeconfig"
        self.kubeconfig_file.write_text(self.kubeconfig)

    @contextlib.contextmanager
    def edit(self) -> Iterator[dict[str, Any]]:
        with ks.Cluster(self.dir).locked() as cluster:
            yield cluster.s

    def state(self) -> dict[str, Any]:
        return dict(json.loads((self.dir / "cluster.json").read_text()))

    def now(self) -> float:
        return float(self.state()["now"])

    def advance(self, seconds: float) -> None:
        with self.edit() as s:
            s["now"] += seconds

    def power(self, name: str, on: bool) -> None:
        with self.edit() as s:
            if name in s["balancers"]:
                s["balancers"][name]["haproxy"] = on
                if not on and s["balancers"][name]["holds_vip"]:  # Keepalived moves the VIP
                    s["balancers"][name]["holds_vip"] = False
                    other = next(b for b in s["balancers"] if b != name)
                    s["balancers"][other]["holds_vip"] = True
            else:
                s["hosts"][name]["up"] = on

    @contextlib.contextmanager
    def cluster(self, etcd_timeout_s: float = 10) -> Iterator[KubectlCluster]:
        with KubectlCluster(
            self.kubeconfig, f"https://{VIP}:6443", kubectl=str(self.kubectl), etcd_timeout_s=etcd_timeout_s
        ) as cluster:
            yield cluster

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """The stand-in kubectl with KubectlCluster's global flags."""
        cmd = [str(self.kubectl), f"--kubeconfig={self.kubeconfig_file}", f"--server=https://{VIP}:6443",
               "--request-timeout=5s", *args]  # fmt: skip
        return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=60, check=False)

    def raw(self, path: str) -> dict[str, Any]:
        proc = self.run("get", "--raw", path)
        assert proc.returncode == 0, proc.stderr
        return dict(json.loads(proc.stdout))

    def test_pods(self) -> list[dict[str, Any]]:
        return list(self.raw(PODS_PATH)["items"])


@pytest.fixture
def lab(tmp_path: Path) -> ModelLab:
    return ModelLab(tmp_path)


def ready_lab(lab: ModelLab, cluster: KubectlCluster, replicas: int = 4) -> list[str]:
    cluster.create_test_deployment(replicas)
    lab.advance(POD_READY_S)
    return cluster.pods_of_test_deployment()


# --------------------------------------------------------------------------- the API and the nodes


def test_readyz_goes_through_the_server_given_not_the_kubeconfigs(lab: ModelLab) -> None:
    lab.power(M1, False)  # the kubeconfig's own server
    with lab.cluster() as cluster:
        assert cluster.api_answers() is True  # --server: the VIP, HAProxy, m02 or m03
        plain = subprocess.run(
            [str(lab.kubectl), f"--kubeconfig={cluster.kubeconfig_path}", "get", "--raw", "/readyz"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert plain.returncode == 1 and f"The connection to the server {NODES[2].ip}:6443 was refused" in plain.stderr
        assert lab.run("get", "--raw", "/readyz").stdout == "ok\n"
        lab.power(LB1, False)
        lab.power(LB2, False)
        assert cluster.api_answers() is False
        assert "The connection to the server 10.3.60.100:6443 was refused" in lab.run("get", "--raw", "/readyz").stderr


def test_a_node_turns_not_ready_only_after_the_grace_period_and_back(lab: ModelLab) -> None:
    with lab.cluster() as cluster:
        assert cluster.node_ready(W1) and cluster.node_schedulable(W1)
        lab.power(W1, False)  # its kubelet's reports stop
        lab.advance(NODE_GRACE_S - 1)
        assert cluster.node_ready(W1), "Ready until the node monitor grace period has passed"
        lab.advance(2)
        assert not cluster.node_ready(W1)
        node = lab.raw(f"/api/v1/nodes/{W1}")
        ready = node["status"]["conditions"][0]
        assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "Unknown", "NodeStatusUnknown")
        assert {(t["key"], t["effect"]) for t in node["spec"]["taints"]} == {
            ("node.kubernetes.io/unreachable", "NoSchedule"),
            ("node.kubernetes.io/unreachable", "NoExecute"),
        }
        lab.power(W1, True)
        lab.advance(1)
        assert cluster.node_ready(W1)
        assert "taints" not in lab.raw(f"/api/v1/nodes/{W1}")["spec"]
        assert lab.raw(f"/api/v1/nodes/{M1}")["spec"]["taints"] == [
            {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}
        ]


def test_a_node_that_does_not_exist_is_the_apis_not_found(lab: ModelLab) -> None:
    proc = lab.run("get", "--raw", "/api/v1/nodes/labs-k8s-w09")
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr.strip() == 'Error from server (NotFound): nodes "labs-k8s-w09" not found'
    with lab.cluster() as cluster, pytest.raises(ClusterError, match="NotFound"):
        cluster.node_ready("labs-k8s-w09")


# --------------------------------------------------------------------------- etcd


def test_etcd_status_three_members_one_leader(lab: ModelLab) -> None:
    with lab.cluster() as cluster:
        assert cluster.etcd_status() == EtcdStatus(members=3, healthy=3, leaders=1, leader_ip=NODES[2].ip)
    members = json.loads(lab.run(*ETCDCTL, "member", "list", "-w", "json").stdout)
    assert [m["ID"] for m in members["members"]] == list(MEMBER_IDS.values())  # exact 64-bit integers
    assert members["members"][1] == {
        "ID": MEMBER_IDS[M2], "name": M2, "peerURLs": ["https://10.3.60.52:2380"],
        "clientURLs": ["https://10.3.60.52:2379"],
    }  # fmt: skip
    assert members["header"]["member_id"] == MEMBER_IDS[M1]


def test_etcd_with_a_member_down_keeps_quorum_and_etcdctl_says_so(lab: ModelLab) -> None:
    lab.power(M3, False)
    with lab.cluster() as cluster:
        # M3 is still Ready (grace period): its pod is skipped as Pending, or costs a failed exec.
        assert cluster.etcd_status() == EtcdStatus(members=3, healthy=2, leaders=1, leader_ip=NODES[2].ip)
    health = lab.run(*ETCDCTL, "endpoint", "health", "--cluster", "-w", "json")
    assert health.returncode == 1 and health.stderr.strip() == "Error: unhealthy cluster"
    entries = {h["endpoint"]: h for h in json.loads(health.stdout)}
    assert entries["https://10.3.60.53:2379"] == {
        "endpoint": "https://10.3.60.53:2379", "health": False, "took": "5.000873s",
        "error": "context deadline exceeded",
    }  # fmt: skip
    assert [entries[f"https://10.3.60.5{i}:2379"]["health"] for i in (1, 2)] == [True, True]
    status = lab.run(*ETCDCTL, "endpoint", "status", "--cluster", "-w", "json")
    assert status.returncode == 1
    assert (
        status.stderr.strip()
        == "Failed to get the status of endpoint https://10.3.60.53:2379 (context deadline exceeded)"
    )
    answered = json.loads(status.stdout)
    assert [e["Endpoint"] for e in answered] == ["https://10.3.60.51:2379", "https://10.3.60.52:2379"]
    assert {e["Status"]["leader"] for e in answered} == {MEMBER_IDS[M1]}
    assert [e["Status"]["header"]["member_id"] for e in answered] == [MEMBER_IDS[M1], MEMBER_IDS[M2]]


def test_the_leader_lost_gives_a_new_leader_in_a_new_term_which_keeps_the_lead(lab: ModelLab) -> None:
    def statuses() -> list[dict[str, Any]]:
        return [
            e["Status"] for e in json.loads(lab.run(*ETCDCTL, "endpoint", "status", "--cluster", "-w", "json").stdout)
        ]

    term = statuses()[0]["raftTerm"]
    lab.power(M1, False)
    with lab.cluster() as cluster:
        assert cluster.etcd_status() == EtcdStatus(members=3, healthy=2, leaders=1, leader_ip=NODES[3].ip)
    lab.power(M1, True)
    after = statuses()
    assert {s["leader"] for s in after} == {MEMBER_IDS[M2]}, "the old leader comes back as a follower"
    assert {s["raftTerm"] for s in after} == {term + 1}


def test_etcd_without_quorum_takes_the_api_with_it(lab: ModelLab) -> None:
    lab.power(M2, False)
    lab.power(M3, False)
    with lab.cluster() as cluster:
        assert cluster.api_answers() is False  # every API server needs its etcd's quorum
        with pytest.raises(ClusterError, match=f"the server {VIP}:6443 was refused"):  # --server, the VIP
            cluster.etcd_status()


def test_exec_into_a_pod_whose_node_is_down_fails_like_a_dead_kubelet(lab: ModelLab) -> None:
    lab.power(M1, False)
    proc = lab.run(*ETCDCTL, "member", "list", "-w", "json")
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip() == "Error from server: error dialing backend: dial tcp 10.3.60.51:10250: i/o timeout"


# --------------------------------------------------------------------------- the test deployment


def test_deployment_pods_spread_over_the_workers_and_turn_ready(lab: ModelLab) -> None:
    with lab.cluster() as cluster:
        cluster.create_test_deployment(4)
        pods = lab.test_pods()
        assert [p["status"]["phase"] for p in pods] == ["Pending"] * 4
        assert cluster.pods_of_test_deployment() == []
        lab.advance(POD_READY_S - 0.5)
        assert cluster.pods_of_test_deployment() == [], "not Ready before one readiness probe period"
        lab.advance(0.5)
        assert cluster.pods_of_test_deployment() == [W1, W1, W2, W2]
        for pod in lab.test_pods():
            assert re.fullmatch(
                rf"{TEST_DEPLOYMENT}-[{ks.ALPHANUMS}]{{6,10}}-[{ks.ALPHANUMS}]{{5}}", pod["metadata"]["name"]
            )
            owner = pod["metadata"]["ownerReferences"][0]
            assert (owner["kind"], owner["name"]) == ("ReplicaSet", pod["metadata"]["generateName"][:-1])
            assert pod["metadata"]["labels"]["pod-template-hash"] == owner["name"].rsplit("-", 1)[1]
        # The same manifest again changes nothing; more replicas add pods, spread.
        again = lab.run("apply", "-f", "-", stdin=json.dumps(deployment_manifest(4)))
        assert again.stdout == f"deployment.apps/{TEST_DEPLOYMENT} unchanged\n"
        cluster.create_test_deployment(6)
        lab.advance(POD_READY_S)
        assert cluster.pods_of_test_deployment() == [W1, W1, W1, W2, W2, W2]


def test_pods_of_a_dead_worker_move_after_not_ready_and_their_toleration_nothing_moves_back(lab: ModelLab) -> None:
    with lab.cluster() as cluster:
        assert ready_lab(lab, cluster) == [W1, W1, W2, W2]
        lab.power(W1, False)
        lab.advance(NODE_GRACE_S - 1)
        assert cluster.pods_of_test_deployment() == [W1, W1, W2, W2], "Ready as far as the API knows"
        lab.advance(2)
        assert not cluster.node_ready(W1)
        assert cluster.pods_of_test_deployment() == [W2, W2], "marked not Ready with their node"
        lab.advance(28)  # 29 s after NotReady (50 s after the last report): still tolerated
        assert cluster.pods_of_test_deployment() == [W2, W2]
        assert len(lab.test_pods()) == 4
        lab.advance(2)  # evicted at 30 s, recreated at once on the only schedulable worker
        pods = lab.test_pods()
        assert len([p for p in pods if "deletionTimestamp" in p["metadata"]]) == 2, "Terminating: the kubelet is dead"
        assert (
            sorted(p["spec"].get("nodeName", "") for p in pods if "deletionTimestamp" not in p["metadata"]) == [W2] * 4
        )
        lab.advance(POD_READY_S)
        assert cluster.pods_of_test_deployment() == [W2] * 4
        lab.power(W1, True)
        lab.advance(1)
        assert cluster.node_ready(W1)
        assert len(lab.test_pods()) == 4, "the kubelet back, the evicted pods are gone"
        lab.advance(60)
        assert cluster.pods_of_test_deployment() == [W2] * 4, "nothing moves back"


def test_drain_evicts_to_the_other_worker_and_uncordon_moves_nothing_back(lab: ModelLab) -> None:
    with lab.cluster() as cluster:
        assert ready_lab(lab, cluster) == [W1, W1, W2, W2]
        cluster.cordon(W1)
        assert not cluster.node_schedulable(W1)
        assert lab.run("cordon", W1).stdout == f"node/{W1} already cordoned\n"
        cluster.drain(W1, 120)
        assert cluster.pods_of_test_deployment() == [W2, W2], "the evicted pods are gone, the new ones starting"
        lab.advance(POD_READY_S)
        assert cluster.pods_of_test_deployment() == [W2] * 4
        cluster.uncordon(W1)
        assert cluster.node_schedulable(W1)
        lab.advance(60)
        assert cluster.pods_of_test_deployment() == [W2] * 4


def test_drain_of_a_worker_whose_kubelet_is_dead_times_out(lab: ModelLab) -> None:
    with lab.cluster() as cluster:
        ready_lab(lab, cluster)
        lab.power(W1, False)  # still Ready: the grace period
        with pytest.raises(ClusterError, match=r"kubectl drain labs-k8s-w01 --ignore-daemonsets failed \(1\)"):
            cluster.drain(W1, 120)
        # Evicted, they stay Terminating; a second drain waits for them again, in vain.
        proc = lab.run("drain", W1, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=120s")
        assert proc.returncode == 1
        assert "to terminate: global timeout reached: 2m0s" in proc.stderr
        assert cluster.pods_of_test_deployment() == [W2, W2], "their replacements are starting on the other worker"


def test_pods_stay_pending_while_no_worker_can_take_them(lab: ModelLab) -> None:
    with lab.cluster() as cluster:
        cluster.cordon(W1)
        cluster.cordon(W2)
        cluster.create_test_deployment(2)
        lab.advance(10)
        pods = lab.test_pods()
        assert [p["status"]["phase"] for p in pods] == ["Pending", "Pending"]
        assert all("nodeName" not in p["spec"] for p in pods), "control planes are tainted NoSchedule"
        cluster.uncordon(W2)
        lab.advance(POD_READY_S)
        assert cluster.pods_of_test_deployment() == [W2, W2]


def test_deleting_the_deployment_takes_its_pods_and_again_is_no_error(lab: ModelLab) -> None:
    with lab.cluster() as cluster:
        ready_lab(lab, cluster)
        proc = lab.run("-n", "default", "delete", "deployment", TEST_DEPLOYMENT, "--ignore-not-found", "--timeout=60s")
        assert proc.stdout == f'deployment.apps "{TEST_DEPLOYMENT}" deleted\n'
        assert lab.test_pods() == []
        cluster.delete_test_deployment()
        missing = lab.run("-n", "default", "delete", "deployment", TEST_DEPLOYMENT)
        assert missing.returncode == 1
        assert missing.stderr.strip() == f'Error from server (NotFound): deployments.apps "{TEST_DEPLOYMENT}" not found'


def test_apply_of_a_file_still_brings_flannel(lab: ModelLab, tmp_path: Path, lab_config: Any) -> None:
    from components.rendering import k8s

    with lab.edit() as s:
        s["cni"] = False
    manifest = tmp_path / "kube-flannel.yml"
    manifest.write_text(k8s.render_flannel_manifest(lab_config))
    proc = lab.run("apply", "-f", str(manifest))
    assert proc.returncode == 0, proc.stderr
    assert "namespace/kube-flannel created" in proc.stdout.splitlines()
    assert "daemonset.apps/kube-flannel-ds created" in proc.stdout.splitlines()
    assert lab.state()["cni"] is True
    assert "daemonset/kube-flannel/kube-flannel-ds" in lab.state()["objects"]


# --------------------------------------------------------------------------- whole drills on the model


class ModelMachines:
    """vCenter for the drills over the model: power a host off and on (a hard power-off)."""

    def __init__(self, lab: ModelLab) -> None:
        self.lab = lab
        self.off: set[str] = set()

    def problems(self, names: Any) -> list[str]:
        return [f"VM {name} is poweredOff" for name in names if name in self.off]

    def power_state(self, name: str) -> str:
        return "poweredOff" if name in self.off else "poweredOn"

    def power_off(self, name: str) -> None:
        self.off.add(name)
        self.lab.power(name, False)

    def power_on(self, name: str) -> None:
        self.off.discard(name)
        self.lab.power(name, True)


@pytest.mark.parametrize("scenario", ["worker", "drain", "control-plane"])
def test_a_whole_drill_passes_on_the_model(lab: ModelLab, scenario: str) -> None:
    """The drill with its live bounds, on the model's clock: its sleeps move that clock."""
    out: list[str] = []
    inputs = DrillInputs(stack="labs", api_endpoint=f"https://{VIP}:6443", nodes=NODES, kubeconfig=lab.kubeconfig)
    with lab.cluster() as cluster:
        drill = SCENARIOS[scenario](
            inputs, cluster, cast(VCenterMachines, ModelMachines(lab)), limits=Limits(), out=out.append,
            clock=lab.now, sleep=lab.advance,
        )  # fmt: skip
        result = drill.run()
    assert result.exit_code == EXIT_PASS, "\n".join(out)
    if scenario == "worker":
        # NotReady at the grace period; the pods back 30 s + a readiness period later.
        assert NODE_GRACE_S <= result.measured("node_notready_s") <= NODE_GRACE_S + 2
        assert 30 <= result.measured("pods_rescheduled_s") - result.measured("node_notready_s") <= 30 + 5
    if scenario == "control-plane":
        assert result.measured("etcd_degraded_s") < 3
    assert lab.test_pods() == [] and not any(n.get("unschedulable") for n in lab.state()["nodes"].values())


def test_the_worker_drill_fails_when_the_pods_cannot_move(lab: ModelLab) -> None:
    """The other worker is cordoned behind the drill's back: nothing can take the pods."""
    out: list[str] = []
    inputs = DrillInputs(stack="labs", api_endpoint=f"https://{VIP}:6443", nodes=NODES, kubeconfig=lab.kubeconfig)
    machines = ModelMachines(lab)

    def power_off(name: str) -> None:
        ModelMachines.power_off(machines, name)
        lab.run("cordon", W2 if name == W1 else W1)

    machines.power_off = power_off  # type: ignore[method-assign]
    with lab.cluster() as cluster:
        # 40 s for the pods to come back after NotReady: 30 s of toleration and a start would do.
        drill = SCENARIOS["worker"](
            inputs, cluster, cast(VCenterMachines, machines), limits=Limits(reschedule_s=40), out=out.append,
            clock=lab.now, sleep=lab.advance,
        )  # fmt: skip
        result = drill.run()
    assert result.exit_code == 1
    assert any("every test pod Ready on a node other than" in line and "not within 40s" in line for line in out)


# --------------------------------------------------------------------------- the box's kubectl on the CLI machine


def _listen(address: str, port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
    except OSError as error:
        sock.close()
        pytest.skip(f"cannot listen on {address}:{port}: {error}")
    sock.listen(16)
    threading.Thread(target=lambda: _accept(sock), daemon=True).start()
    return sock


def _accept(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while True:
            sock.accept()[0].close()


class _Api(http.server.BaseHTTPRequestHandler):
    """HAProxy and an API server behind it: /readyz, and /api for a client with a certificate."""

    ready = True

    def do_GET(self) -> None:
        if self.path == "/readyz":
            status, body = (200, "ok") if _Api.ready else (500, "[-]etcd failed: reason withheld\nreadyz check failed")
        elif self.path == "/api":
            status, body = (200, '{"kind":"APIVersions"}') if self.connection.getpeercert() else (401, "{}")
        else:
            status, body = 404, "{}"
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def test_the_box_kubectl_on_the_cli_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_tool("openssl")
    monkeypatch.syspath_prepend(str(box_kubectl.TESTS))
    monkeypatch.syspath_prepend(str(box_kubectl.STANDIN_MAIN.parent))
    import box_cluster  # type: ignore[import-not-found]  # the stand-ins' own layout, as main.py has it

    store = tmp_path / "store"
    store.mkdir()
    ips = {M1: "127.0.0.11", M2: "127.0.0.12", M3: "127.0.0.13"}
    listeners = {name: [_listen(ip, 2380), _listen(ip, 10250)] for name, ip in ips.items()}
    cluster = box_cluster.BoxCluster(store, local="labs-k8s-cli")
    with cluster.locked():
        s = cluster.s
        s["cni"] = True
        for name, ip in ips.items():
            s["hosts"][name] = {"ip": ip, "role": "control-plane", "root": "/", "up": True, "kubelet": True}
            s["members"].append(
                {"id": MEMBER_IDS[name], "name": name, "peer": f"https://{ip}:2380", "learner": False, "data": "d"}
            )
            etcd_pod = {"phase": "Running", "image": "registry.k8s.io/etcd:3.6.6-0"}
            s["nodes"][name] = {"labels": {}, "heartbeat": time.time(), "static_pods": {"etcd": etcd_pod}}
        crt, key = ks.ensure_ca(cluster)
        kubeconfig = ks.kubeconfig_text(cluster, "https://127.0.0.1:1", "kubernetes-admin")  # nothing there
    cert, private = box_cluster.serving_cert(crt, key, "kube-apiserver", [], ["127.0.0.1"])
    (tmp_path / "api.crt").write_text(cert)
    (tmp_path / "api.key").write_text(private)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(tmp_path / "api.crt"), str(tmp_path / "api.key"))
    context.load_verify_locations(str(crt))
    context.verify_mode = ssl.CERT_OPTIONAL
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    launcher = box_kubectl.write_launcher(tmp_path / "kubectl", store)
    try:
        with KubectlCluster(
            kubeconfig, f"https://127.0.0.1:{server.server_port}", kubectl=str(launcher), etcd_timeout_s=2
        ) as kc:
            assert kc.api_answers() is True  # the kubeconfig's server refuses: --server it is
            _Api.ready = False
            assert kc.api_answers() is False  # /readyz's 500 is kubectl's error
            _Api.ready = True
            assert kc.node_ready(M1)
            assert kc.etcd_status() == EtcdStatus(members=3, healthy=3, leaders=1, leader_ip=ips[M1])
            for sock in listeners[M3]:
                sock.close()  # M3 powered off: its kubelet and its member stop answering
            started = time.monotonic()
            assert kc.etcd_status() == EtcdStatus(members=3, healthy=2, leaders=1, leader_ip=ips[M1])
            assert time.monotonic() - started >= 2, "etcdctl waits --command-timeout for the dead member, twice"
            with box_cluster.BoxCluster(store, local="labs-k8s-cli").locked() as c:
                c.s["nodes"][M3]["heartbeat"] = time.time() - NODE_GRACE_S - 1
            assert not kc.node_ready(M3)
            assert kc.node_ready(M2)
    finally:
        server.shutdown()
        server.server_close()
        for socks in listeners.values():
            for sock in socks:
                sock.close()
