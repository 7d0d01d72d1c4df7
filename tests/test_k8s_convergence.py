"""The cluster steps converge: each scenario runs the real scripts twice against one modelled
cluster (tests/kube_standin.py: kubeadm's real phase order, TTLs, etcd membership) and asserts
that the second run finishes the job and which commands it issued.

Cluster-wide steps (refresh, flannel, verify, kubeconfig, leave, teardown guard) run where the
VIP's SSH port lands them: the first control plane whose API server answers (ClusterLab.cluster_node,
HAProxy's `balance first`). Which host a step connects to is asserted on the graph in
tests/test_program.py.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from components.config import LabConfig, Node, Role
from components.rendering import k8s
from tests.labs import make_lab_config, make_lab_config_with
from tests.requirements import require_tool, unavailable
from tests.shell_harness import (
    STANDIN,
    TEST_CERTIFICATE_KEY,
    TEST_ENCRYPTION_KEY,
    TEST_TOKEN,
    ClusterLab,
    ShellHarness,
    modes,
)

KUBELET_PEM = "/var/lib/kubelet/pki/kubelet-client-current.pem"  # the kubelet's certificate store

VIP = "10.3.60.100"
LB01_MAC, LB02_MAC = "00:50:56:00:00:50", "00:50:56:00:00:56"


def with_hosts(role: str, hosts: list[tuple[str, str]]) -> LabConfig:
    """The stack's config with `nodes.<role>.hosts` replaced."""

    def change(raw: dict) -> None:
        raw["nodes"][role]["hosts"] = [{"name": name, "ip": ip} for name, ip in hosts]

    return make_lab_config_with(change)


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def failed(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode != 0, f"expected a failure\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


# Every join token a Scenario drew (cluster.py _join_token: one per node and join generation).
DRAWN_JOIN_TOKENS: set[str] = set()


def join_token(node: str, generation: int) -> str:
    """The token `node` joins with in its join generation `generation`, as cluster.py draws one
    (22 characters of [a-z0-9], split 6 + 16); deterministic, so a copied scenario agrees."""
    token = k8s.drawn_token(hashlib.sha256(f"{node} join-attempt:{generation}".encode()).hexdigest()[:22])
    DRAWN_JOIN_TOKENS.add(token)
    return token


def no_secrets(*texts: str) -> None:
    joins = [part for token in DRAWN_JOIN_TOKENS for part in (token, token.split(".")[1])]
    for text in texts:
        for secret in (TEST_TOKEN, TEST_TOKEN.split(".")[1], TEST_CERTIFICATE_KEY, *joins):
            assert secret not in text


class Scenario:
    """The lab of one LabConfig over the model: balancers, control planes, workers."""

    @classmethod
    def copy_of(cls, template: Scenario, tmp_path: Path) -> Scenario:
        """A copy of another scenario's lab (its nodes' disks and the cluster), under tmp_path:
        bringing a cluster up costs seconds of stand-in calls, copying it does not."""
        shutil.copytree(template.lab.base, tmp_path, symlinks=True, dirs_exist_ok=True)
        state = tmp_path / "cluster" / "cluster.json"
        state.write_text(state.read_text().replace(str(template.lab.base), str(tmp_path)))
        copy = cls.__new__(cls)
        copy.cfg = template.cfg
        copy.first = template.first
        copy.join_generations = dict(template.join_generations)
        copy.lab = ClusterLab.__new__(ClusterLab)
        copy.lab.base, copy.lab.dir = tmp_path, tmp_path / "cluster"
        copy.lab.nodes = {
            name: ShellHarness(tmp_path / h.base.name, node=name, ip=h.ip, cluster=copy.lab.dir)
            for name, h in template.lab.nodes.items()
        }
        return copy

    def __init__(self, tmp_path: Path, cfg: LabConfig) -> None:
        require_tool("bash", "openssl", "jq", "timeout")
        self.cfg = cfg
        self.lab = ClusterLab(tmp_path, vip=str(cfg.load_balancer.vip))
        self.lab.add_balancer("labs-k8s-lb01", LB01_MAC, holds_vip=True)
        self.lab.add_balancer("labs-k8s-lb02", LB02_MAC, holds_vip=False)
        for node in cfg.kubernetes_nodes:
            harness = self.lab.add_node(node.name, str(node.ip), node.role.value)
            if harness.missing_tools:
                unavailable(f"the shell harness needs {', '.join(harness.missing_tools)} on PATH")
        self.first = cfg.control_planes[0]
        # node -> its join generation (cluster.py: a new VM or a join attempt after an unfinished one).
        self.join_generations: dict[str, int] = {}

    def join_token(self, name: str) -> str:
        return join_token(name, self.join_generations.setdefault(name, 1))

    def new_join_generation(self, name: str) -> str:
        """A replaced VM, or a join retried after an unfinished one: the node draws a new token."""
        self.join_generations[name] = self.join_generations.get(name, 1) + 1
        return self.join_token(name)

    def token_ids(self) -> list[str]:
        """What verify-cluster gets: init's token ID, then each node's join token ID (cluster.py)."""
        ids = [k8s.token_id(TEST_TOKEN)]
        return ids + [k8s.token_id(self.join_token(node.name)) for node in self.cfg.kubernetes_nodes]

    def node(self, name: str) -> Node:
        return next(n for n in self.cfg.kubernetes_nodes if n.name == name)

    def h(self, name: str) -> ShellHarness:
        return self.lab.nodes[name]

    # -------------------------------------------------------------- the steps, as cluster.py wires them
    def init(self) -> subprocess.CompletedProcess[str]:
        h = self.h(self.first.name)
        h.install_step(k8s.init_files(self.cfg, TEST_TOKEN, TEST_CERTIFICATE_KEY, TEST_ENCRYPTION_KEY))
        return h.run(k8s.INIT_ENTRYPOINT)

    def refresh(self, joining: str) -> subprocess.CompletedProcess[str]:
        h = self.lab.cluster_node()
        node = self.node(joining)
        key = k8s.refresh_certificate_key(node, TEST_CERTIFICATE_KEY)
        h.install_step(k8s.refresh_files(self.cfg, self.join_token(joining), key, node))
        return h.run(k8s.REFRESH_ENTRYPOINT)

    def join(self, name: str, ca_hash: str) -> subprocess.CompletedProcess[str]:
        node = self.node(name)
        h = self.h(name)
        if node.role is Role.CONTROL_PLANE:
            token = self.join_token(name)
            h.install_step(
                k8s.control_plane_join_files(self.cfg, node, token, TEST_CERTIFICATE_KEY, TEST_ENCRYPTION_KEY)
            )
            return h.run(k8s.CONTROL_PLANE_JOIN_ENTRYPOINT, ca_hash)
        h.install_step(k8s.worker_join_files(self.cfg, node, self.join_token(name)))
        return h.run(k8s.WORKER_JOIN_ENTRYPOINT, ca_hash)

    def refresh_and_join(self, name: str) -> subprocess.CompletedProcess[str]:
        return self.join(name, ok(self.refresh(name)).stdout.strip())

    def cluster_step(self, files: dict[str, str], entrypoint: str, *args: str) -> subprocess.CompletedProcess[str]:
        h = self.lab.cluster_node()
        h.install_step(files)
        return h.run(entrypoint, *args)

    def leave(self, node: Node) -> subprocess.CompletedProcess[str]:
        return self.cluster_step(k8s.leave_files(node), k8s.LEAVE_ENTRYPOINT)

    def flannel(self) -> subprocess.CompletedProcess[str]:
        return self.cluster_step(k8s.flannel_files(self.cfg), k8s.FLANNEL_ENTRYPOINT)

    def verify(self, timeout: int = 20) -> subprocess.CompletedProcess[str]:
        files = k8s.verify_files(self.cfg)
        files[k8s.PARAMS_FILE] = files[k8s.PARAMS_FILE].replace(
            f"VERIFY_TIMEOUT_SECONDS={k8s.VERIFY_TIMEOUT_SECONDS}", f"VERIFY_TIMEOUT_SECONDS={timeout}"
        )
        return self.cluster_step(files, k8s.VERIFY_ENTRYPOINT)

    def bring_up(self) -> None:
        """The first `up`: init, every control plane in turn (the first one included), workers, Flannel."""
        assert ok(self.init()).stdout == "initialized\n"
        for node in self.cfg.control_planes:
            ok(self.refresh_and_join(node.name))
        for node in self.cfg.workers:
            ok(self.refresh_and_join(node.name))
        ok(self.flannel())
        for h in self.lab.nodes.values():
            h.reset_log()

    def voting_members(self) -> list[str]:
        return sorted(m["name"] for m in self.lab.members() if not m["learner"] and m["name"])

    def node_objects(self) -> list[str]:
        return sorted(self.lab.state()["nodes"])


def kubeadm_calls(h: ShellHarness) -> list[list[str]]:
    """kubeadm invocations without the step-directory paths: what was run, in order."""
    return [[arg for arg in call[1:] if not arg.startswith(str(h.base))] for call in h.calls("kubeadm")]


@pytest.fixture
def lab(tmp_path: Path, lab_config: LabConfig) -> Iterator[Scenario]:
    yield Scenario(tmp_path, lab_config)


@pytest.fixture(scope="session")
def brought_up(tmp_path_factory: pytest.TempPathFactory, lab_config: LabConfig) -> Scenario:
    """The stack's lab after a first `up`, made once; each test gets its own copy (`up`)."""
    template = Scenario(tmp_path_factory.mktemp("brought-up"), lab_config)
    template.bring_up()
    return template


@pytest.fixture
def up(brought_up: Scenario, tmp_path: Path) -> Scenario:
    return Scenario.copy_of(brought_up, tmp_path / "lab")


# ------------------------------------------------------------------ kubeadm-init.sh


def test_first_up_creates_the_cluster_and_every_control_plane_is_a_voting_member(lab: Scenario) -> None:
    m01 = lab.h("labs-k8s-m01")
    result = ok(lab.init())
    assert result.stdout == "initialized\n"
    assert kubeadm_calls(m01) == [
        ["init", "--config", "--upload-certs", "--skip-token-print", "--skip-certificate-key-print"]
    ]
    no_secrets(result.stdout, result.stderr, *(p.read_text() for p in m01.step.glob("*.log")))
    assert (m01.root / "root/.kube/config").read_text() == (m01.root / "etc/kubernetes/admin.conf").read_text()
    assert modes(m01.root / "root/.kube/config") == 0o600

    # m01's own join step finds it a voting member already.
    m01.reset_log()
    assert ok(lab.refresh_and_join("labs-k8s-m01")).stdout == "already-joined\n"
    assert not any(call[1] == "join" for call in m01.calls("kubeadm"))
    for node in ("labs-k8s-m02", "labs-k8s-m03", "labs-k8s-w01", "labs-k8s-w02"):
        assert ok(lab.refresh_and_join(node)).stdout == "joined\n"
    assert lab.voting_members() == ["labs-k8s-m01", "labs-k8s-m02", "labs-k8s-m03"]
    ok(lab.flannel())
    assert ok(lab.verify()).stdout == "cluster-ok\n"

    # A second `up` (every step re-run): nothing is created again.
    for h in lab.lab.nodes.values():
        h.reset_log()
    assert ok(lab.init()).stdout == "already-initialized\n"
    for node in lab.cfg.kubernetes_nodes:
        assert ok(lab.refresh_and_join(node.name)).stdout == "already-joined\n"
    for h in lab.lab.nodes.values():
        assert not [c for c in h.calls("kubeadm") if c[1] in ("init", "join", "reset") and c[2:3] != ["phase"]]


# kubeadm init dies after each of these phases; what it leaves behind differs (it never rolls back).
FINISH_AFTER = {
    # Only pki/ and the *.conf files exist: everything from the etcd manifest on is missing.
    "kubeconfig": ["etcd", "control-plane", "kubelet-start", "upload-config", "upload-certs", "mark-control-plane",
                   "bootstrap-token", "kubelet-finalize", "addon", "addon"],
    # The API answers, so the old guard ("admin.conf and the local API") called this initialised.
    "wait-control-plane": ["upload-config", "upload-certs", "mark-control-plane", "bootstrap-token",
                           "kubelet-finalize", "addon", "addon"],
    "bootstrap-token": ["kubelet-finalize", "addon", "addon"],
    # Between TryStopKubelet and TryStartKubelet: the kubelet's files are there, the kubelet is
    # stopped, so nothing starts the static pods until kubelet-start runs again.
    "kubelet-start/written": ["kubelet-start", "upload-config", "upload-certs", "mark-control-plane",
                              "bootstrap-token", "kubelet-finalize", "addon", "addon"],
}  # fmt: skip


@pytest.mark.parametrize("died_after", list(FINISH_AFTER))
def test_a_half_finished_init_is_finished_on_the_next_run(lab: Scenario, died_after: str) -> None:
    m01 = lab.h("labs-k8s-m01")
    lab.lab.die_after("labs-k8s-m01", "init", died_after)
    first = failed(lab.init())
    assert "the next 'pulumi up' finishes the phases that are missing" in first.stderr
    assert (m01.root / "etc/kubernetes/admin.conf").exists(), "kubeadm writes admin.conf early and keeps it"

    m01.reset_log()
    second = ok(lab.init())
    assert second.stdout == "initialized\n"
    phases = [call[2] for call in kubeadm_calls(m01) if call[:2] == ["init", "phase"]]
    assert phases == FINISH_AFTER[died_after]
    assert not [c for c in kubeadm_calls(m01) if c[:1] == ["init"] and c[1:2] != ["phase"]], "no second kubeadm init"
    if "upload-certs" in FINISH_AFTER[died_after]:
        assert [
            "init",
            "phase",
            "upload-certs",
            "--upload-certs",
            "--skip-certificate-key-print",
            "--config",
        ] in kubeadm_calls(m01)
    no_secrets(second.stdout, second.stderr, *(p.read_text() for p in m01.step.glob("*.log")))
    objects = lab.lab.objects()
    for key in (
        "configmap/kube-system/kubeadm-config",
        "configmap/kube-public/cluster-info",
        "clusterrolebinding/kubeadm:kubelet-bootstrap",
        "secret/kube-system/kubeadm-certs",
        "deployment/kube-system/coredns",
        "daemonset/kube-system/kube-proxy",
        f"secret/kube-system/bootstrap-token-{TEST_TOKEN.split('.')[0]}",
    ):
        assert key in objects, key

    m01.reset_log()
    assert ok(lab.init()).stdout == "already-initialized\n"
    assert [c for c in kubeadm_calls(m01) if c[:1] == ["init"]] == []
    # And the cluster it finished takes joins.
    assert ok(lab.refresh_and_join("labs-k8s-m02")).stdout == "joined\n"


@pytest.mark.parametrize(
    ("balancers", "message"),
    [
        ({"labs-k8s-lb01": {"holds_vip": False}}, "nothing accepts connections on 10.3.60.100:6443 (curl exit 28)"),
        ({"labs-k8s-lb02": {"holds_vip": True}}, "2 machines answer ARP for the VIP 10.3.60.100"),
        ({"labs-k8s-lb01": {"haproxy": False}}, "nothing accepts connections on 10.3.60.100:6443"),
    ],
    ids=["no-holder", "split-brain", "haproxy-down"],
)
def test_init_refuses_to_start_behind_a_broken_balancer_pair(lab: Scenario, balancers: dict, message: str) -> None:
    with lab.lab.edit() as state:
        for name, change in balancers.items():
            state["balancers"][name].update(change)
    result = failed(lab.init())
    assert message in result.stderr
    assert "labs-k8s-lb01-lb-setup labs-k8s-lb02-lb-setup" in result.stderr
    assert lab.h("labs-k8s-m01").calls("kubeadm") == []


# ------------------------------------------------------------------ joins


@pytest.mark.parametrize("died_after", ["kubelet-start", "etcd-join/learner", "control-plane-prepare"])
def test_a_half_finished_control_plane_join_is_reset_and_joined_again(lab: Scenario, died_after: str) -> None:
    ok(lab.init())
    ok(lab.refresh_and_join("labs-k8s-m01"))
    m02 = lab.h("labs-k8s-m02")
    lab.lab.die_after("labs-k8s-m02", "join", died_after)
    first = failed(lab.refresh_and_join("labs-k8s-m02"))
    assert "The next 'pulumi up' refreshes the join material, resets this node" in first.stderr
    if died_after == "kubelet-start":
        # admin.conf, the control-plane manifests and bootstrap-kubelet.conf exist; no etcd member,
        # no etcd manifest, and (ControlPlaneKubeletLocalMode) no client certificate and no Node yet:
        # the kubelet wrote its certificate-less kubelet.conf as it started (bootstrap.go
        # LoadClientConfig) and waits for its own API server.
        assert (m02.root / "etc/kubernetes/admin.conf").exists()
        assert (m02.root / "etc/kubernetes/bootstrap-kubelet.conf").exists()
        assert KUBELET_PEM in (m02.root / "etc/kubernetes/kubelet.conf").read_text()
        assert not (m02.root / KUBELET_PEM.lstrip("/")).exists()
        assert not (m02.root / "etc/kubernetes/manifests/etcd.yaml").exists()
        assert "labs-k8s-m02" not in lab.node_objects()
        assert lab.voting_members() == ["labs-k8s-m01"]
    if died_after == "etcd-join/learner":
        assert [m for m in lab.lab.members() if m["learner"]], "a learner member is left behind"

    for h in lab.lab.nodes.values():
        h.reset_log()
    second = ok(lab.refresh_and_join("labs-k8s-m02"))
    assert second.stdout == "joined\n"
    calls = kubeadm_calls(m02)
    assert calls == [["reset", "-f"], ["join", "--config"]]
    removals = lab.h("labs-k8s-m02").calls_matching("kubectl", "member", "remove")
    assert len(removals) == (1 if died_after == "etcd-join/learner" else 0)
    assert lab.voting_members() == ["labs-k8s-m01", "labs-k8s-m02"]
    assert len(lab.lab.members()) == 2, "no stale member left"
    no_secrets(second.stdout, second.stderr)

    m02.reset_log()
    assert ok(lab.refresh_and_join("labs-k8s-m02")).stdout == "already-joined\n"
    assert kubeadm_calls(m02) == []


# A control-plane join that died after its etcd member was promoted: the member votes, but the
# kubelet's TLS bootstrap (kubelet-wait-bootstrap) or the control-plane label and taint
# (control-plane-join) are missing. The next run finishes those phases; a reset would take a
# healthy, voting member out of etcd.
FINISH_JOIN_AFTER = {
    "etcd-join": [["join", "phase", "kubelet-wait-bootstrap", "--config"],
                  ["join", "phase", "control-plane-join", "mark-control-plane", "--config"]],
    "kubelet-wait-bootstrap": [["join", "phase", "control-plane-join", "mark-control-plane", "--config"]],
}  # fmt: skip


@pytest.mark.parametrize("died_after", list(FINISH_JOIN_AFTER))
def test_a_control_plane_join_that_died_after_etcd_join_is_finished_not_reset(lab: Scenario, died_after: str) -> None:
    ok(lab.init())
    ok(lab.refresh_and_join("labs-k8s-m01"))
    ok(lab.flannel())
    m02 = lab.h("labs-k8s-m02")
    lab.lab.die_after("labs-k8s-m02", "join", died_after)
    failed(lab.refresh_and_join("labs-k8s-m02"))
    assert lab.voting_members() == ["labs-k8s-m01", "labs-k8s-m02"], "its member was promoted"
    node = lab.lab.state()["nodes"].get("labs-k8s-m02")
    assert node is None or "node-role.kubernetes.io/control-plane" not in node["labels"], "not marked yet"

    # A retry hours later: the token and the certificates expired; the retry is a new join
    # generation (a new token), and the refresh uploads the certificates again.
    lab.lab.advance(hours=25)
    lab.new_join_generation("labs-k8s-m02")
    m02.reset_log()
    second = ok(lab.refresh_and_join("labs-k8s-m02"))
    assert second.stdout == "joined\n"
    assert kubeadm_calls(m02) == FINISH_JOIN_AFTER[died_after], "no reset, no second kubeadm join"
    assert lab.lab.cluster_node().calls_matching("kubectl", "member", "remove") == []
    assert lab.voting_members() == ["labs-k8s-m01", "labs-k8s-m02"]
    assert "node-role.kubernetes.io/control-plane" in lab.lab.state()["nodes"]["labs-k8s-m02"]["labels"]
    assert (m02.root / "etc/kubernetes/kubelet.conf").exists()
    assert not (m02.root / "etc/kubernetes/bootstrap-kubelet.conf").exists()
    no_secrets(second.stdout, second.stderr, *(p.read_text() for p in m02.step.glob("*.log")))

    m02.reset_log()
    assert ok(lab.refresh_and_join("labs-k8s-m02")).stdout == "already-joined\n"
    assert kubeadm_calls(m02) == []
    assert ok(lab.refresh_and_join("labs-k8s-m03")).stdout == "joined\n"


def test_a_worker_whose_node_never_registered_is_reset_and_joined_again(lab: Scenario) -> None:
    ok(lab.init())
    w01 = lab.h("labs-k8s-w01")
    lab.lab.die_after("labs-k8s-w01", "join", "kubelet-start")
    failed(lab.refresh_and_join("labs-k8s-w01"))
    # The kubelet wrote kubelet.conf, then its Node was deleted (e.g. by a leave step) before the
    # join finished: kubelet.conf alone is not "joined".
    with lab.lab.edit() as state:
        del state["nodes"]["labs-k8s-w01"]
    w01.reset_log()
    assert ok(lab.refresh_and_join("labs-k8s-w01")).stdout == "joined\n"
    assert kubeadm_calls(w01) == [["reset", "-f"], ["join", "--config"]]
    assert "labs-k8s-w01" in lab.node_objects()


def test_a_worker_whose_kubelet_registers_its_node_after_the_join_returns_is_joined(lab: Scenario) -> None:
    """kubeadm join returns once the kubelet has its certificate; the kubelet registers its Node a
    moment later. The step judged the join right away, found no Node and failed "not joined
    (partial)" (the box's 10-worker bench, 2026-12-06): it waits for the registration instead."""
    ok(lab.init())
    w01 = lab.h("labs-k8s-w01")
    lab.lab.lag_node_registration("labs-k8s-w01", 3)
    result = ok(lab.refresh_and_join("labs-k8s-w01"))
    assert result.stdout == "joined\n"
    assert kubeadm_calls(w01) == [["join", "--config"]], "no reset"
    assert "waiting up to 60s for the kubelet to register Node labs-k8s-w01" in result.stderr
    assert "labs-k8s-w01" in lab.node_objects()
    w01.reset_log()
    assert ok(lab.refresh_and_join("labs-k8s-w01")).stdout == "already-joined\n"
    assert kubeadm_calls(w01) == []


def test_a_worker_whose_node_is_never_registered_fails_after_the_wait(lab: Scenario) -> None:
    """A bounded wait: a kubelet that never registers its Node leaves the step failed, saying so."""
    ok(lab.init())
    lab.lab.lag_node_registration("labs-k8s-w01", 10_000)
    result = failed(lab.refresh_and_join("labs-k8s-w01"))
    assert "kubeadm join finished but this node is not joined (partial)" in result.stderr
    assert "labs-k8s-w01" not in lab.node_objects()


def bootstrap_stalled(lab: Scenario, name: str) -> ShellHarness:
    """`name` joins while its kubelet's TLS bootstrap stalls: kubeadm's wait gives up and removes
    bootstrap-kubelet.conf; the kubelet's certificate-less kubelet.conf stays."""
    h = lab.h(name)
    lab.lab.stall_bootstrap(name, True)
    result = failed(lab.refresh_and_join(name))
    assert "error execution phase kubelet-wait-bootstrap" in result.stderr
    conf = (h.root / "etc/kubernetes/kubelet.conf").read_text()
    assert f"client-certificate: {KUBELET_PEM}" in conf and "client-certificate-data" not in conf
    assert not (h.root / KUBELET_PEM.lstrip("/")).exists()
    assert not (h.root / "etc/kubernetes/bootstrap-kubelet.conf").exists(), "kubeadm's defer os.Remove"
    assert name not in lab.node_objects()
    no_secrets(result.stdout, result.stderr)
    return h


@pytest.mark.parametrize("kubelet", ["restarted in the window", "still stalled", "finished on its own"])
def test_a_worker_whose_tls_bootstrap_did_not_finish_is_reset_and_joined_again(lab: Scenario, kubelet: str) -> None:
    """A worker with kubelet.conf but no client certificate can never bootstrap again on its own
    once its kubelet restarts (bootstrap-kubelet.conf is gone): it is `partial`, reset and joined,
    while the control plane answers. A kubelet that got its certificate after all is left alone."""
    ok(lab.init())
    w01 = bootstrap_stalled(lab, "labs-k8s-w01")
    if kubelet == "restarted in the window":
        lab.lab.restart_kubelet("labs-k8s-w01")
        assert lab.lab.state()["hosts"]["labs-k8s-w01"]["kubelet_crashloop"]
    if kubelet != "still stalled":
        lab.lab.stall_bootstrap("labs-k8s-w01", False)
    w01.reset_log()
    if kubelet == "still stalled":
        second = failed(lab.refresh_and_join("labs-k8s-w01"))
        assert kubeadm_calls(w01) == [["reset", "-f"], ["join", "--config"]]
        assert "cannot tell whether this node finished joining" not in second.stderr
        return
    second = ok(lab.refresh_and_join("labs-k8s-w01"))
    if kubelet == "finished on its own":
        assert second.stdout == "already-joined\n"
        assert kubeadm_calls(w01) == []
    else:
        assert second.stdout == "joined\n"
        assert "no usable client certificate" in second.stderr
        assert kubeadm_calls(w01) == [["reset", "-f"], ["join", "--config"]]
    assert (w01.root / KUBELET_PEM.lstrip("/")).is_file()
    assert "labs-k8s-w01" in lab.node_objects()
    no_secrets(second.stdout, second.stderr)


def test_a_control_plane_whose_kubelet_never_bootstrapped_gets_new_bootstrap_credentials_not_a_reset(
    lab: Scenario,
) -> None:
    """Its etcd member votes, its kubelet has no client certificate and no bootstrap-kubelet.conf
    (and restarted meanwhile): kubelet-start, kubelet-wait-bootstrap, mark-control-plane; no reset."""
    ok(lab.init())
    ok(lab.refresh_and_join("labs-k8s-m01"))
    ok(lab.flannel())
    m02 = bootstrap_stalled(lab, "labs-k8s-m02")
    assert lab.voting_members() == ["labs-k8s-m01", "labs-k8s-m02"]
    lab.lab.restart_kubelet("labs-k8s-m02")
    lab.lab.stall_bootstrap("labs-k8s-m02", False)
    lab.lab.advance(hours=25)
    m02.reset_log()
    second = ok(lab.refresh_and_join("labs-k8s-m02"))
    assert second.stdout == "joined\n"
    assert kubeadm_calls(m02) == [
        ["join", "phase", "kubelet-start", "--config"],
        ["join", "phase", "kubelet-wait-bootstrap", "--config"],
        ["join", "phase", "control-plane-join", "mark-control-plane", "--config"],
    ]
    assert lab.lab.cluster_node().calls_matching("kubectl", "member", "remove") == []
    assert lab.voting_members() == ["labs-k8s-m01", "labs-k8s-m02"]
    assert "node-role.kubernetes.io/control-plane" in lab.lab.state()["nodes"]["labs-k8s-m02"]["labels"]
    assert (m02.root / KUBELET_PEM.lstrip("/")).is_file()
    assert not (m02.root / "etc/kubernetes/bootstrap-kubelet.conf").exists()
    no_secrets(second.stdout, second.stderr, *(p.read_text() for p in m02.step.glob("*.log")))

    m02.reset_log()
    assert ok(lab.refresh_and_join("labs-k8s-m02")).stdout == "already-joined\n"
    assert kubeadm_calls(m02) == []


def test_the_kubectl_stand_in_refuses_a_certificate_less_kubelet_conf_like_the_real_kubectl(
    lab: Scenario, tmp_path: Path
) -> None:
    """What tells "credentials kubectl cannot load" from "the API does not answer": the real kubectl
    validates the kubeconfig before it dials (exit 1, "Error in configuration"); so does the stand-in.
    The real one runs against a closed loopback port it never reaches."""
    require_tool("kubectl")
    ok(lab.init())
    w01 = bootstrap_stalled(lab, "labs-k8s-w01")
    conf = w01.root / "etc/kubernetes/kubelet.conf"
    standin = subprocess.run(
        [sys.executable, str(STANDIN), "kubectl", "--kubeconfig", str(conf), "--request-timeout=5s",
         "get", "node", "labs-k8s-w01", "--ignore-not-found", "-o", "name"],
        env={"HARNESS_CLUSTER": str(lab.lab.dir), "HARNESS_NODE": "labs-k8s-w01", "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    local = tmp_path / "kubelet.conf"
    local.write_text(
        re.sub(r"server: \S+", "server: https://127.0.0.1:9", conf.read_text()).replace(
            KUBELET_PEM, str(w01.root) + KUBELET_PEM
        )
    )
    real = subprocess.run(
        ["kubectl", "--kubeconfig", str(local), "--request-timeout=5s", "get", "node", "labs-k8s-w01",
         "--ignore-not-found", "-o", "name"],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    for result in (standin, real):
        assert result.returncode == 1, result.stderr
        assert result.stderr.startswith("Error in configuration: \n* unable to read client-cert "), result.stderr
        assert "connection refused" not in result.stderr, "it never dials"
    assert standin.stderr.splitlines()[1].replace(KUBELET_PEM, "PEM") == real.stderr.splitlines()[1].replace(
        str(w01.root) + KUBELET_PEM, "PEM"
    )


def test_a_join_that_cannot_tell_its_state_is_not_reset_on_a_guess(up: Scenario) -> None:
    w02 = up.h("labs-k8s-w02")
    hash_ = ok(up.refresh("labs-k8s-w02")).stdout.strip()
    for name in ("labs-k8s-m01", "labs-k8s-m02", "labs-k8s-m03"):
        up.lab.set_up(name, False)
    result = failed(up.join("labs-k8s-w02", hash_))
    assert "cannot tell whether this node finished joining" in result.stderr
    assert kubeadm_calls(w02) == []


def test_a_join_retried_after_the_join_material_expired_needs_a_fresh_refresh(up: Scenario) -> None:
    """The refresh before a join is what makes a retried join work: 3 h later the kubeadm-certs
    Secret is gone, 25 h later the token too. (That a retried join gets a fresh refresh in the same
    `up` is the graph's job: tests/test_program.py.)"""
    new = make_lab_config()
    ca_hash = ok(up.refresh("labs-k8s-m03")).stdout.strip()
    m03 = up.h("labs-k8s-m03")
    # m03 was wiped and must join again (say its first join failed), 3 h after the last refresh.
    m03_fresh = up.lab.replace_vm("labs-k8s-m03")
    with up.lab.edit() as state:
        state["members"] = [m for m in state["members"] if not m["peer"].startswith("https://10.3.60.53:")]
    up.lab.advance(hours=3)
    assert "secret/kube-system/kubeadm-certs" not in up.lab.objects(), "the 2 h owner token took the Secret"
    stale = failed(up.join("labs-k8s-m03", ca_hash))
    assert 'secrets "kubeadm-certs" not found' in stale.stderr
    assert m03 is not m03_fresh
    up.new_join_generation("labs-k8s-m03")  # a new VM: a new join generation (cluster.py _join_token)
    ok(up.leave(new.control_planes[2]))  # what the retried up's dependency chain does before the join
    assert ok(up.refresh_and_join("labs-k8s-m03")).stdout == "joined\n"

    up.lab.advance(hours=25)
    fresh = up.lab.replace_vm("labs-k8s-w02")
    up.new_join_generation("labs-k8s-w02")
    ok(up.leave(up.node("labs-k8s-w02")))
    assert f"secret/kube-system/bootstrap-token-{TEST_TOKEN.split('.')[0]}" not in up.lab.objects()
    assert ok(up.refresh_and_join("labs-k8s-w02")).stdout == "joined\n"
    assert fresh.calls_matching("kubeadm", "join")


def test_two_workers_added_at_once_when_the_token_is_nearly_expired(tmp_path: Path) -> None:
    """A day after init its token has minutes left. Two workers added at once each draw a token
    of their own (cluster.py _join_token), which their refreshes create with a full 24 h (`kubeadm
    init phase bootstrap-token`, never `token create`); both joins work, and init's token is left
    to verify-cluster."""
    cfg = make_lab_config()
    grown = with_hosts(
        "workers",
        [
            ("labs-k8s-w01", "10.3.60.54"),
            ("labs-k8s-w02", "10.3.60.55"),
            ("labs-k8s-w03", "10.3.60.57"),
            ("labs-k8s-w04", "10.3.60.58"),
        ],
    )
    lab = Scenario(tmp_path, grown)
    lab.cfg = cfg
    lab.bring_up()
    lab.cfg = grown
    lab.lab.advance(hours=23.5)
    cluster = lab.lab.cluster_node()
    hashes = {name: ok(lab.refresh(name)).stdout.strip() for name in ("labs-k8s-w03", "labs-k8s-w04")}
    for name in ("labs-k8s-w03", "labs-k8s-w04"):
        assert ok(lab.join(name, hashes[name])).stdout == "joined\n"
    assert cluster.calls_matching("kubeadm", "token", "create") == []
    assert len(cluster.calls_matching("kubeadm", "init", "phase", "bootstrap-token", "--skip-token-print")) == 2
    assert cluster.calls_matching("kubeadm", "init", "phase", "upload-certs") == [], "workers need no certificates"
    objects = lab.lab.objects()
    for name in ("labs-k8s-w03", "labs-k8s-w04"):
        token = objects[f"secret/kube-system/bootstrap-token-{k8s.token_id(lab.join_token(name))}"]
        assert token["expires"] - lab.lab.state()["now"] == pytest.approx(24 * 3600), name
    assert k8s.token_id(lab.join_token("labs-k8s-w03")) != k8s.token_id(lab.join_token("labs-k8s-w04"))
    init_token = objects[f"secret/kube-system/bootstrap-token-{k8s.token_id(TEST_TOKEN)}"]
    assert init_token["expires"] - lab.lab.state()["now"] == pytest.approx(1800), "init's token is not refreshed"


def test_refresh_prints_the_ca_hash_and_keeps_secrets_out_of_its_logs(up: Scenario) -> None:
    result = ok(up.refresh("labs-k8s-m02"))
    cluster = up.lab.cluster_node()
    ca = (cluster.root / "etc/kubernetes/pki/ca.crt").read_text()
    assert result.stdout == spki_sha256(ca) + "\n"
    assert cluster.calls_matching("kubeadm", "init", "phase", "upload-certs", "--skip-certificate-key-print")
    no_secrets(result.stdout, result.stderr, *(p.read_text() for p in cluster.step.glob("*.log")))


# ------------------------------------------------------------------ Secrets at rest and the audit log (issue 50)

ENCRYPTION_CONFIG = "etc/kubernetes/encryption/config.yaml"
AUDIT_POLICY = "etc/kubernetes/audit/policy.yaml"
AUDIT_LOG_DIR = "var/log/kubernetes/audit"


def test_init_installs_the_encryption_config_root_only_before_kubeadm_starts_an_api_server(lab: Scenario) -> None:
    m01 = lab.h("labs-k8s-m01")
    result = ok(lab.init())
    assert (m01.root / ENCRYPTION_CONFIG).read_text() == k8s.render_encryption_config(TEST_ENCRYPTION_KEY)
    assert (m01.root / AUDIT_POLICY).read_text() == k8s.audit_policy()
    assert modes(m01.root / ENCRYPTION_CONFIG) == modes(m01.root / AUDIT_POLICY) == 0o600
    for directory in (ENCRYPTION_CONFIG.rsplit("/", 1)[0], AUDIT_POLICY.rsplit("/", 1)[0], AUDIT_LOG_DIR):
        assert modes(m01.root / directory) == 0o700, directory
    stderr = result.stderr
    assert stderr.index(f"wrote /{ENCRYPTION_CONFIG}") < stderr.index("kubeadm init for labs-k8s-m01")
    # The key never leaves the file: not on stdout or stderr, not in kubeadm's logs.
    for text in (result.stdout, stderr, *(p.read_text() for p in m01.step.glob("*.log"))):
        assert TEST_ENCRYPTION_KEY not in text


def test_every_control_plane_holds_the_same_encryption_config_and_a_rerun_rewrites_nothing(up: Scenario) -> None:
    """Each control plane's join installs the stack's configuration (the joining API server reads
    what the others encrypted); workers get none; init and the joins again leave every file as it was."""
    expected = k8s.render_encryption_config(TEST_ENCRYPTION_KEY)
    for node in up.cfg.kubernetes_nodes:
        path = up.h(node.name).root / ENCRYPTION_CONFIG
        if node.role is Role.CONTROL_PLANE:
            assert path.read_text() == expected and modes(path) == 0o600, node.name
        else:
            assert not path.exists() and not (up.h(node.name).root / AUDIT_POLICY).exists(), node.name
    planes = [up.h(node.name) for node in up.cfg.control_planes]
    before = {(h.node, f): os.stat(h.root / f) for h in planes for f in (ENCRYPTION_CONFIG, AUDIT_POLICY)}
    outputs = [ok(up.init()).stderr] + [ok(up.refresh_and_join(node.name)).stderr for node in up.cfg.control_planes]
    assert not [line for text in outputs for line in text.splitlines() if "wrote /etc/kubernetes/" in line]
    after = {(h.node, f): os.stat(h.root / f) for h in planes for f in (ENCRYPTION_CONFIG, AUDIT_POLICY)}
    assert {k: (s.st_ino, s.st_mtime_ns) for k, s in after.items()} == {
        k: (s.st_ino, s.st_mtime_ns) for k, s in before.items()
    }


def test_a_control_plane_holding_another_encryption_key_is_refused_not_overwritten(up: Scenario) -> None:
    """The API server would lose every Secret written under the old key at its next start: the
    join refuses to replace it (there is no key rotation yet) and says so, without a key in the text."""
    m02 = up.h("labs-k8s-m02")
    other = k8s.render_encryption_config(base64.b64encode(b"another-key-another-key-another!").decode())
    (m02.root / ENCRYPTION_CONFIG).write_text(other)
    result = failed(up.refresh_and_join("labs-k8s-m02"))
    assert "holds another encryption key than the stack's secrets-encryption-key" in result.stderr
    assert (m02.root / ENCRYPTION_CONFIG).read_text() == other
    assert not m02.calls_matching("kubeadm", "join")
    assert TEST_ENCRYPTION_KEY not in result.stdout + result.stderr


# ------------------------------------------------------------------ control planes come and go


def test_a_replaced_first_control_plane_joins_and_leaves_no_stale_member(up: Scenario) -> None:
    m01 = up.node("labs-k8s-m01")
    # Before the old VM goes: its leave step (through the VIP: here m01 itself is still the first
    # healthy control plane) deletes its Node and removes its etcd member through another member.
    assert up.lab.cluster_node().node == "labs-k8s-m01"
    assert ok(up.leave(m01)).stdout == "left\n"
    assert up.voting_members() == ["labs-k8s-m02", "labs-k8s-m03"]
    assert "labs-k8s-m01" not in up.node_objects()
    removal = up.h("labs-k8s-m01").calls_matching("kubectl", "member", "remove")
    assert removal and "etcd-labs-k8s-m01" not in removal[0], "removed through another member's etcd"

    fresh = up.lab.replace_vm("labs-k8s-m01")
    assert ok(up.init()).stdout == "cluster-exists\n"
    assert fresh.calls("kubeadm") == []
    assert up.lab.cluster_node().node == "labs-k8s-m02"
    assert ok(up.refresh_and_join("labs-k8s-m01")).stdout == "joined\n"
    assert up.voting_members() == ["labs-k8s-m01", "labs-k8s-m02", "labs-k8s-m03"]
    assert len(up.lab.members()) == 3
    assert ok(up.verify()).stdout == "cluster-ok\n"

    fresh.reset_log()
    assert ok(up.init()).stdout == "already-initialized\n"
    assert ok(up.refresh_and_join("labs-k8s-m01")).stdout == "already-joined\n"
    assert [c for c in kubeadm_calls(fresh) if c[:1] in (["init"], ["join"], ["reset"]) and c[1:2] != ["phase"]] == []


def test_first_control_plane_down_while_a_worker_is_removed(up: Scenario) -> None:
    up.lab.set_up("labs-k8s-m01", False)
    cluster = up.lab.cluster_node()
    assert cluster.node == "labs-k8s-m02"
    assert ok(up.leave(up.node("labs-k8s-w02"))).stdout == "left\n"
    assert cluster.calls_matching("kubectl", "drain", "labs-k8s-w02")
    assert "labs-k8s-w02" not in up.node_objects()
    assert up.h("labs-k8s-m01").calls() == []
    assert ok(up.leave(up.node("labs-k8s-w02"))).stdout == "already-gone\n"


def test_control_planes_five_to_three(tmp_path: Path) -> None:
    five = with_hosts("controlPlanes", [(f"labs-k8s-m0{i}", f"10.3.60.{60 + i}") for i in range(1, 6)])
    lab = Scenario(tmp_path, five)
    lab.bring_up()
    assert len(lab.voting_members()) == 5
    # The leave steps are chained: m05's goes first, then m04's (cluster.py).
    for name in ("labs-k8s-m05", "labs-k8s-m04"):
        assert ok(lab.leave(lab.node(name))).stdout == "left\n"
    assert lab.voting_members() == ["labs-k8s-m01", "labs-k8s-m02", "labs-k8s-m03"]
    assert "labs-k8s-m04" not in lab.node_objects() and "labs-k8s-m05" not in lab.node_objects()
    for name in ("labs-k8s-m04", "labs-k8s-m05"):
        lab.lab.set_up(name, False)  # their VMs go
    lab.cfg = with_hosts("controlPlanes", [(f"labs-k8s-m0{i}", f"10.3.60.{60 + i}") for i in range(1, 4)])
    assert ok(lab.verify()).stdout == "cluster-ok\n"
    # Running the leave again (a retried up) changes nothing.
    assert ok(lab.leave(five.control_planes[4])).stdout == "already-gone\n"


def test_a_control_plane_added_while_another_is_down_joins_once_it_is_back(up: Scenario) -> None:
    """kubeadm's check-etcd asks every started member for its status: one dead member fails a
    control-plane join even with a quorum. The join fails before adding a member; once the member
    is back, the next run resets the half-prepared node and joins it."""
    up.cfg = with_hosts(
        "controlPlanes",
        [
            ("labs-k8s-m01", "10.3.60.51"),
            ("labs-k8s-m02", "10.3.60.52"),
            ("labs-k8s-m03", "10.3.60.53"),
            ("labs-k8s-m04", "10.3.60.57"),
            ("labs-k8s-m05", "10.3.60.58"),
        ],
    )
    m04 = up.lab.add_node("labs-k8s-m04", "10.3.60.57", "control-plane")
    up.lab.add_node("labs-k8s-m05", "10.3.60.58", "control-plane")
    up.lab.set_up("labs-k8s-m03", False)
    first = failed(up.refresh_and_join("labs-k8s-m04"))
    assert "etcd cluster is not healthy: failed to dial endpoint https://10.3.60.53:2379" in first.stderr
    assert len(up.lab.members()) == 3, "no member added"

    up.lab.set_up("labs-k8s-m03", True)
    m04.reset_log()
    assert ok(up.refresh_and_join("labs-k8s-m04")).stdout == "joined\n"
    assert kubeadm_calls(m04) == [["reset", "-f"], ["join", "--config"]]
    assert ok(up.refresh_and_join("labs-k8s-m05")).stdout == "joined\n"
    assert up.voting_members() == [f"labs-k8s-m0{i}" for i in range(1, 6)]


def test_leave_refuses_to_break_quorum(up: Scenario) -> None:
    up.lab.set_up("labs-k8s-m03", False)
    result = failed(up.leave(up.node("labs-k8s-m02")))
    assert "would leave etcd without quorum" in result.stderr
    assert up.voting_members() == ["labs-k8s-m01", "labs-k8s-m02", "labs-k8s-m03"]


def test_a_replaced_worker_is_drained_and_deleted_before_it_joins_again(up: Scenario) -> None:
    w01 = up.node("labs-k8s-w01")
    assert ok(up.leave(w01)).stdout == "left\n"
    cluster = up.lab.cluster_node()
    drains = cluster.calls_matching("kubectl", "drain", "labs-k8s-w01")
    assert drains and "--ignore-daemonsets" in drains[0] and "--timeout=180s" in drains[0]
    assert "labs-k8s-w01" not in up.node_objects()
    fresh = up.lab.replace_vm("labs-k8s-w01")
    assert ok(up.refresh_and_join("labs-k8s-w01")).stdout == "joined\n"
    assert kubeadm_calls(fresh) == [["join", "--config"]]
    assert "labs-k8s-w01" in up.node_objects()
    fresh.reset_log()
    assert ok(up.refresh_and_join("labs-k8s-w01")).stdout == "already-joined\n"
    assert kubeadm_calls(fresh) == []


def test_leave_falls_back_to_deleting_pods_when_eviction_is_blocked(up: Scenario) -> None:
    with up.lab.edit() as state:
        state["drain_exit"] = {"evict": 1}
    assert ok(up.leave(up.node("labs-k8s-w02"))).stdout == "left\n"
    drains = up.lab.cluster_node().calls_matching("kubectl", "drain", "labs-k8s-w02")
    assert len(drains) == 2 and "--disable-eviction" in drains[1]
    assert "labs-k8s-w02" not in up.node_objects()


def test_teardown_guard_makes_every_leave_a_no_op_and_clears_on_create(up: Scenario) -> None:
    files = k8s.teardown_guard_files()
    assert ok(up.cluster_step(files, k8s.TEARDOWN_ENTRYPOINT, "set")).stdout == "teardown-marked\n"
    assert ok(up.cluster_step(files, k8s.TEARDOWN_ENTRYPOINT, "set")).stdout == "teardown-marked\n"
    for node in up.cfg.kubernetes_nodes:
        assert ok(up.leave(node)).stdout == "skipped-teardown\n"
    assert up.lab.cluster_node().calls_matching("kubectl", "drain") == []
    assert len(up.voting_members()) == 3
    assert ok(up.cluster_step(files, k8s.TEARDOWN_ENTRYPOINT, "clear")).stdout == "teardown-cleared\n"
    assert ok(up.leave(up.node("labs-k8s-w02"))).stdout == "left\n"


def test_leave_fails_clearly_when_no_control_plane_answers(up: Scenario) -> None:
    cluster = up.lab.cluster_node()
    cluster.install_step(k8s.leave_files(up.node("labs-k8s-w02")))
    for name in ("labs-k8s-m01", "labs-k8s-m02", "labs-k8s-m03"):
        up.lab.set_up(name, False)
    result = failed(cluster.run(k8s.LEAVE_ENTRYPOINT))
    assert "whether the lab is being destroyed" in result.stderr
    assert cluster.calls_matching("kubectl", "drain") == []


# ------------------------------------------------------------------ verify, flannel, kubeconfig


def test_verify_names_stale_and_unhealthy_members(up: Scenario) -> None:
    ok(up.verify())
    with up.lab.edit() as state:
        # A member left by a VM deleted outside Pulumi (3 of 4 voting members still make a quorum),
        # and one whose join never got as far as starting etcd.
        state["members"].append(
            {
                "id": 0x8E9E05C52164694D,
                "name": "labs-k8s-m09",
                "peer": "https://10.3.60.59:2380",
                "learner": False,
                "data": "gone",
            }
        )
        state["members"].append(
            {"id": 0x1D2C3B4A59687766, "name": "", "peer": "https://10.3.60.60:2380", "learner": True, "data": None}
        )
    up.lab.set_up("labs-k8s-w02", False)
    result = failed(up.verify(timeout=10))
    for line in (
        "etcd has 5 members, expected 3 (one per control plane: labs-k8s-m01 labs-k8s-m02 labs-k8s-m03)",
        "etcd member labs-k8s-m09 (8e9e05c52164694d, https://10.3.60.59:2380) is stale: labs-k8s-m09 is not a "
        "control plane in the config (remove it: etcdctl member remove 8e9e05c52164694d)",
        "etcd member 1d2c3b4a59687766 (https://10.3.60.60:2380) never started",
        "etcd member labs-k8s-m09 (https://10.3.60.59:2379) is not healthy",
        # A powered-off node's kubelet posts nothing: the node lifecycle controller says Unknown.
        "node labs-k8s-w02 is not Ready (Ready=Unknown)",
    ):
        assert f"  - {line}" in result.stderr, line


def test_verify_names_a_node_that_is_not_at_the_configured_version(up: Scenario) -> None:
    """The final verification of an upgrade: every kubelet at labs-k8s:kubernetes.version."""
    with up.lab.edit() as state:
        state["nodes"]["labs-k8s-w01"]["kubelet_version"] = "v1.35.2"
    result = failed(up.verify(timeout=10))
    assert (
        "  - node labs-k8s-w01 runs kubelet v1.35.2, not v1.36.0 (labs-k8s:kubernetes.version; its upgrade "
        "steps move it)"
    ) in result.stderr
    assert "labs-k8s-w02 runs kubelet" not in result.stderr


def test_verify_catches_leader_disagreement(up: Scenario) -> None:
    ids = (10276657743932975437, 10276657743932975438)  # equal as doubles: jq must not see them as numbers
    status = ",".join(
        f'{{"Endpoint":"https://10.3.60.5{i + 1}:2379","Status":{{"header":{{"member_id":{member}}},'
        f'"leader":{member},"raftTerm":{4 + i}}}}}'
        for i, member in enumerate(ids)
    )
    with up.lab.edit() as state:
        state["status_override"] = f"[{status}]"
    result = failed(up.verify(timeout=10))
    for line in (
        "etcd has 2 members that are leader, expected exactly 1",
        "etcd members disagree on the leader (2 different leaders reported)",
        "etcd members are on 2 different raft terms",
    ):
        assert line in result.stderr


def test_flannel_rollout_is_bounded(up: Scenario) -> None:
    with up.lab.edit() as state:
        state["rollout_exit"] = 1
    result = failed(up.flannel())
    assert "did not roll out within 300s" in result.stderr


@pytest.mark.parametrize("days_left", [365, 10])
def test_kubeconfig_says_until_when_it_is_valid_and_renews_before_it_lapses(tmp_path: Path, days_left: int) -> None:
    lab = Scenario(tmp_path, make_lab_config())
    with lab.lab.edit() as state:
        state["cert_days"] = days_left
    lab.bring_up()
    with lab.lab.edit() as state:
        state["cert_days"] = 365
    result = ok(lab.cluster_step(k8s.kubeconfig_files(lab.cfg, TRANSPORT_KEY), k8s.KUBECONFIG_ENTRYPOINT))
    cluster = lab.lab.cluster_node()
    valid_until = k8s.kubeconfig_valid_until(result.stdout)
    assert valid_until is not None and result.stdout.startswith("# labs-k8s: client certificate valid until ")
    opened = k8s.unseal_kubeconfig(result.stdout, TRANSPORT_KEY)
    assert opened.split("\n", 1)[1] == (cluster.root / "etc/kubernetes/admin.conf").read_text()
    renewed = cluster.calls_matching("kubeadm", "certs", "renew", "admin.conf")
    assert bool(renewed) == (days_left < k8s.KUBECONFIG_RENEW_BEFORE_DAYS)
    expires_in_days = (
        int(subprocess.run(["date", "-u", "-d", valid_until, "+%s"], capture_output=True, text=True, check=True).stdout)
        - int(subprocess.run(["date", "-u", "+%s"], capture_output=True, text=True, check=True).stdout)
    ) / 86400
    assert expires_in_days == pytest.approx(365 if renewed or days_left == 365 else days_left, abs=1)


TRANSPORT_KEY = "9f" * 32


def test_the_kubeconfig_leaves_the_node_only_sealed(up: Scenario) -> None:
    """pulumi-command puts a failed step's stdout into its error text: a session cut after the
    script printed would have shown the cluster-admin key there (issue 50). Nothing it prints
    holds a credential; the transport key, and only it, opens it."""
    result = ok(up.cluster_step(k8s.kubeconfig_files(up.cfg, TRANSPORT_KEY), k8s.KUBECONFIG_ENTRYPOINT))
    admin = (up.lab.cluster_node().root / "etc/kubernetes/admin.conf").read_text()
    for line in admin.splitlines():
        if ":" in line and len(line.split(":", 1)[1].strip()) > 20:
            assert line.split(":", 1)[1].strip() not in result.stdout + result.stderr, line
    assert "client-key-data" not in result.stdout + result.stderr
    assert k8s.unseal_kubeconfig(result.stdout, TRANSPORT_KEY).split("\n", 1)[1] == admin
    with pytest.raises(ValueError):
        k8s.unseal_kubeconfig(result.stdout, "00" * 32)


def test_kubeconfig_refuses_an_admin_conf_that_does_not_point_at_the_vip(up: Scenario) -> None:
    cluster = up.lab.cluster_node()
    admin = cluster.root / "etc/kubernetes/admin.conf"
    admin.write_text(admin.read_text().replace(VIP, "10.3.60.51"))
    cluster.install_step(k8s.kubeconfig_files(up.cfg, TRANSPORT_KEY))
    result = failed(cluster.run(k8s.KUBECONFIG_ENTRYPOINT))
    assert result.stdout == ""
    assert "expected https://10.3.60.100:6443" in result.stderr


# ------------------------------------------------------------------ the CA pin, computed independently


def _der_header(der: bytes, offset: int) -> tuple[int, int]:
    """(header length, content length) of the DER element at offset."""
    first = der[offset + 1]
    if first < 0x80:
        return 2, first
    count = first & 0x7F
    return 2 + count, int.from_bytes(der[offset + 2 : offset + 2 + count], "big")


def spki_sha256(pem: str) -> str:
    """kubeadm's CA pin computed without openssl: sha256 of the certificate's SubjectPublicKeyInfo."""
    der = base64.b64decode("".join(line for line in pem.splitlines() if not line.startswith("-----")))
    header, _ = _der_header(der, 0)  # Certificate
    position = header
    header, _ = _der_header(der, position)  # tbsCertificate
    position += header
    if der[position] == 0xA0:  # [0] version
        header, length = _der_header(der, position)
        position += header + length
    for _ in range(5):  # serialNumber, signature, issuer, validity, subject
        header, length = _der_header(der, position)
        position += header + length
    header, length = _der_header(der, position)  # subjectPublicKeyInfo
    assert re.fullmatch(r"[0-9a-f]*", der[position : position + 1].hex())
    return "sha256:" + hashlib.sha256(der[position : position + header + length]).hexdigest()


# ------------------------------------------------------------------ the bootstrap token after the joins (issue #30, 5)


def test_verify_deletes_every_bootstrap_token_once_every_node_joined_and_a_later_join_draws_its_own(
    up: Scenario,
) -> None:
    """A token lets whoever has it join a node: with no join pending, verify-cluster.sh deletes
    init's and every node's join token (`kubeadm token delete`). A node that joins later (a
    replaced VM: a new join generation) joins with a token of its own, never an old one: an old
    token, seen on a node or in a log, is worth nothing (issue #30 §5)."""
    ids = up.token_ids()
    assert len(set(ids)) == len(up.cfg.kubernetes_nodes) + 1, ids
    tokens = [f"secret/kube-system/bootstrap-token-{token_id}" for token_id in ids]
    assert all(token in up.lab.objects() for token in tokens), "each join's refresh created its node's token"
    files = k8s.verify_files(up.cfg)
    first = ok(up.cluster_step(files, k8s.VERIFY_ENTRYPOINT, *ids))
    assert first.stdout == "cluster-ok\n"
    assert all(f"deleted bootstrap token {token_id}" in first.stderr for token_id in ids), first.stderr
    assert not [token for token in tokens if token in up.lab.objects()]
    again = ok(up.cluster_step(files, k8s.VERIFY_ENTRYPOINT, *ids))  # nothing left to delete
    assert again.stdout == "cluster-ok\n" and "deleted bootstrap token" not in again.stderr

    # A replaced worker: a new join generation, whose refresh creates the new token only.
    old_token = up.join_token("labs-k8s-w02")
    up.lab.replace_vm("labs-k8s-w02")
    ok(up.leave(up.node("labs-k8s-w02")))
    new_token = up.new_join_generation("labs-k8s-w02")
    assert k8s.token_id(new_token) != k8s.token_id(old_token)
    ca_hash = ok(up.refresh("labs-k8s-w02")).stdout.strip()
    assert f"secret/kube-system/bootstrap-token-{k8s.token_id(new_token)}" in up.lab.objects()
    # A bundle with the old token (a stale copy, a log): kubeadm's discovery refuses it.
    up.join_generations["labs-k8s-w02"] = 1
    stale = failed(up.join("labs-k8s-w02", ca_hash))
    assert f'token id "{k8s.token_id(old_token)}" is invalid for this cluster' in stale.stderr, stale.stderr
    up.join_generations["labs-k8s-w02"] = 2
    assert ok(up.join("labs-k8s-w02", ca_hash)).stdout == "joined\n"
    final = ok(up.cluster_step(files, k8s.VERIFY_ENTRYPOINT, *up.token_ids()))
    assert f"deleted bootstrap token {k8s.token_id(new_token)}" in final.stderr
    refused = failed(up.cluster_step(files, k8s.VERIFY_ENTRYPOINT, ids[0], "NOT-AN-ID"))
    assert "is no bootstrap token ID" in refused.stderr
    assert "deleted bootstrap token" not in refused.stderr, "an ID is checked before any token is deleted"
