"""The cluster side of a drill: one small interface, and its kubectl implementation.

`Cluster` is everything a drill asks Kubernetes. `KubectlCluster` shells out to
`kubectl --kubeconfig <temp file, 0600, deleted on close>` (kubectl is a prerequisite for
drills); every call is bounded (`--request-timeout` and a subprocess timeout) and every
call goes to the API through the VIP (`--server` is the stack's apiEndpoint), so an answer
proves the VIP path, not a direct route to one control plane.

The test double lives in tests/test_drill.py (`ClusterTestDouble`).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

# The test workload. Labels identify it; everything the drill creates carries MANAGED_BY.
TEST_NAMESPACE = "default"
TEST_DEPLOYMENT = "labs-k8s-drill-nginx"
TEST_APP_LABEL = "app.kubernetes.io/name"
MANAGED_BY = {"app.kubernetes.io/managed-by": "labs-k8s-drill"}
TEST_IMAGE = "nginx:1.27-alpine"
# Kubernetes adds these NoExecute taints to a dead node; a pod without its own toleration
# gets a default one of 300 s (DefaultTolerationSeconds admission), i.e. the seed's
# "5 minutes before eviction". The drill's pods tolerate them for 30 s only, so the worker
# drill measures rescheduling in about a minute instead of six.
EVICTION_TOLERATION_S = 30
ETCD_PKI = "/etc/kubernetes/pki/etcd"
DRAIN_FLAGS = ("--ignore-daemonsets", "--delete-emptydir-data")  # seed 000, "Cordon и Drain"


class ClusterError(RuntimeError):
    """The cluster did not answer a question (API down, command failed); the message says which."""


@dataclass(frozen=True)
class EtcdStatus:
    """What `etcdctl member list` / `endpoint health --cluster` / `endpoint status --cluster` say."""

    members: int  # members in the member list
    healthy: int  # members whose endpoint reports healthy
    leaders: int  # answering members that say they are the leader (1 when all is well)
    leader_ip: str | None = None  # client address of the leader, when one answered

    @property
    def quorum(self) -> int:
        return self.members // 2 + 1

    @property
    def has_quorum(self) -> bool:
        """Enough healthy members to commit; a moment without a leader (an election) is not a loss."""
        return self.healthy >= self.quorum


class Cluster(Protocol):
    """Everything a drill asks Kubernetes; ClusterError when it cannot tell."""

    def api_answers(self) -> bool:
        """GET /readyz through the VIP answers 'ok' (False, never an error, when it does not)."""
        ...

    def node_ready(self, name: str) -> bool:
        """The node's Ready condition is True."""
        ...

    def node_schedulable(self, name: str) -> bool:
        """The node is not cordoned (spec.unschedulable unset)."""
        ...

    def etcd_status(self) -> EtcdStatus:
        """etcdctl run inside one of the etcd static pods, with the pki certs."""
        ...

    def create_test_deployment(self, replicas: int) -> None:
        """Create (or update) the drill's nginx deployment."""
        ...

    def delete_test_deployment(self) -> None:
        """Remove the drill's deployment; no error when it is absent."""
        ...

    def pods_of_test_deployment(self) -> list[str]:
        """Node names of the test pods that are Running, Ready and not being deleted."""
        ...

    def cordon(self, name: str) -> None: ...

    def drain(self, name: str, timeout_s: float) -> None:
        """kubectl drain with the seed's flags, bounded by ``timeout_s``."""
        ...

    def uncordon(self, name: str) -> None: ...


# --------------------------------------------------------------------------- pure helpers


def deployment_manifest(replicas: int) -> dict[str, Any]:
    """The drill's workload: small nginx pods spread over the workers, quick to evict."""
    labels = {TEST_APP_LABEL: TEST_DEPLOYMENT, **MANAGED_BY}
    tolerations = [
        {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": EVICTION_TOLERATION_S}
        for key in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
    ]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": TEST_DEPLOYMENT, "namespace": TEST_NAMESPACE, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {TEST_APP_LABEL: TEST_DEPLOYMENT}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "tolerations": tolerations,
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            # Anyway, not DoNotSchedule: with one worker gone all pods must fit on the rest.
                            "whenUnsatisfiable": "ScheduleAnyway",
                            "labelSelector": {"matchLabels": {TEST_APP_LABEL: TEST_DEPLOYMENT}},
                        }
                    ],
                    "containers": [
                        {
                            "name": "nginx",
                            "image": TEST_IMAGE,
                            "ports": [{"containerPort": 80}],
                            "readinessProbe": {"httpGet": {"path": "/", "port": 80}, "periodSeconds": 2},
                            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                        }
                    ],
                },
            },
        },
    }


def node_is_ready(node: dict[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def ready_pod_nodes(pod_list: dict[str, Any]) -> list[str]:
    """Node names of Running, Ready pods without a deletionTimestamp (Terminating ones are gone)."""
    nodes: list[str] = []
    for pod in pod_list.get("items") or []:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        status = pod.get("status") or {}
        if status.get("phase") != "Running":
            continue
        if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []):
            continue
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            nodes.append(str(node))
    return sorted(nodes)


def _json_prefix(text: str) -> Any:
    """The JSON document at the start of ``text`` (etcdctl may print errors after it)."""
    text = text.strip()
    if not text:
        return None
    try:
        return json.JSONDecoder().raw_decode(text)[0]
    except json.JSONDecodeError:
        return None


def parse_etcd_status(member_list: str, health: str, status: str) -> EtcdStatus:
    """Combine `member list -w json`, `endpoint health --cluster -w json`, `endpoint status --cluster -w json`.

    With a member down, health and status still print JSON for the others and exit 1, so
    the caller passes stdout regardless of the exit code. Member IDs are 64-bit integers;
    Python's json keeps them exact.
    """
    members_doc = _json_prefix(member_list) or {}
    members = len(members_doc.get("members") or []) if isinstance(members_doc, dict) else 0
    health_doc = _json_prefix(health) or []
    healthy = sum(1 for h in health_doc if isinstance(h, dict) and h.get("health") is True)
    status_doc = _json_prefix(status) or []
    leaders = 0
    leader_ip = None
    for entry in status_doc if isinstance(status_doc, list) else []:
        st = entry.get("Status") or {}
        member_id = (st.get("header") or {}).get("member_id")
        if member_id is not None and st.get("leader") == member_id:
            leaders += 1
            leader_ip = urllib.parse.urlsplit(str(entry.get("Endpoint", ""))).hostname
    return EtcdStatus(members=members, healthy=healthy, leaders=leaders, leader_ip=leader_ip)


# --------------------------------------------------------------------------- kubectl


class KubectlCluster:
    """`Cluster` over kubectl. Use as a context manager: the kubeconfig file is removed on exit."""

    def __init__(
        self,
        kubeconfig: str,
        api_endpoint: str,
        kubectl: str = "kubectl",
        request_timeout_s: float = 5,
        etcd_timeout_s: float = 10,
    ) -> None:
        self.api_endpoint = api_endpoint
        self.kubectl = kubectl
        self.request_timeout_s = request_timeout_s
        self.etcd_timeout_s = etcd_timeout_s
        fd, path = tempfile.mkstemp(prefix="labs-k8s-drill-", suffix=".kubeconfig")
        try:
            os.fchmod(fd, 0o600)  # mkstemp already creates 0600; say so explicitly
            os.write(fd, kubeconfig.encode())
        finally:
            os.close(fd)
        self.kubeconfig_path = path
        self._last_etcd_pod = ""

    def close(self) -> None:
        if self.kubeconfig_path and os.path.exists(self.kubeconfig_path):
            os.unlink(self.kubeconfig_path)

    def __enter__(self) -> KubectlCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ plumbing

    def _run(
        self, args: Sequence[str], request_s: float | None = None, wall_s: float | None = None, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """kubectl ``args``; each API request is bounded by ``request_s``, the whole call by ``wall_s``."""
        request = request_s if request_s is not None else self.request_timeout_s
        wall = wall_s if wall_s is not None else request + 15
        cmd = [
            self.kubectl,
            f"--kubeconfig={self.kubeconfig_path}",
            f"--server={self.api_endpoint}",
            f"--request-timeout={request:g}s",
            *args,
        ]
        try:
            # Own session: a terminal Ctrl-C reaches the drill only, never a kubectl call of the restore.
            return subprocess.run(
                cmd, input=stdin, capture_output=True, text=True, timeout=wall, check=False, start_new_session=True
            )
        except FileNotFoundError:
            raise ClusterError(f"{self.kubectl} not found: kubectl is a prerequisite for drills") from None
        except subprocess.TimeoutExpired:
            raise ClusterError(f"kubectl {' '.join(args[:3])} did not return within {wall:g}s") from None

    def _ok(self, args: Sequence[str], wall_s: float | None = None, stdin: str | None = None) -> str:
        proc = self._run(args, wall_s=wall_s, stdin=stdin)
        if proc.returncode != 0:
            tail = " ".join(proc.stderr.strip().splitlines()[-2:])
            raise ClusterError(f"kubectl {' '.join(args[:3])} failed ({proc.returncode}): {tail}")
        return proc.stdout

    def _get_json(self, path: str) -> dict[str, Any]:
        text = self._ok(["get", "--raw", path])
        try:
            return dict(json.loads(text))
        except (json.JSONDecodeError, TypeError, ValueError):
            raise ClusterError(f"GET {path} did not return a JSON object") from None

    # ------------------------------------------------------------------ Cluster

    def api_answers(self) -> bool:
        try:
            proc = self._run(["get", "--raw", "/readyz"], request_s=3, wall_s=5)
        except ClusterError:
            return False
        return proc.returncode == 0 and proc.stdout.strip() == "ok"

    def _node(self, name: str) -> dict[str, Any]:
        return self._get_json(f"/api/v1/nodes/{urllib.parse.quote(name)}")

    def node_ready(self, name: str) -> bool:
        return node_is_ready(self._node(name))

    def node_schedulable(self, name: str) -> bool:
        return not (self._node(name).get("spec") or {}).get("unschedulable")

    def _etcd_pods(self) -> list[str]:
        pods = self._get_json("/api/v1/namespaces/kube-system/pods?labelSelector=component%3Detcd")
        running = []
        for pod in pods.get("items") or []:
            if (pod.get("status") or {}).get("phase") == "Running":
                running.append((str((pod.get("spec") or {}).get("nodeName", "")), pod["metadata"]["name"]))
        # Skip pods on NotReady nodes: exec through a dead kubelet only times out. The pod that
        # answered last goes first, so a member that was just powered off (still "Ready" for the
        # node-monitor grace period) costs at most one timed-out exec, not one per poll.
        ready = []
        for node, pod in sorted(running, key=lambda item: (item[1] != self._last_etcd_pod, item)):
            try:
                if self.node_ready(node):
                    ready.append(pod)
            except ClusterError:
                continue
        return ready

    def _etcdctl(self, pod: str, *args: str) -> subprocess.CompletedProcess[str]:
        return self._run(
            [
                "-n", "kube-system", "exec", pod, "-c", "etcd", "--",
                "etcdctl", "--endpoints=https://127.0.0.1:2379",
                f"--cacert={ETCD_PKI}/ca.crt", f"--cert={ETCD_PKI}/server.crt", f"--key={ETCD_PKI}/server.key",
                f"--command-timeout={self.etcd_timeout_s / 2:g}s",
                *args,
            ],
            request_s=self.etcd_timeout_s,
            wall_s=self.etcd_timeout_s + 5,
        )  # fmt: skip

    def etcd_status(self) -> EtcdStatus:
        errors: list[str] = []
        for pod in self._etcd_pods():
            members = self._etcdctl(pod, "member", "list", "-w", "json")
            if members.returncode != 0:
                errors.append(f"{pod}: {members.stderr.strip()[-200:]}")
                continue
            health = self._etcdctl(pod, "endpoint", "health", "--cluster", "-w", "json")
            if not isinstance(_json_prefix(health.stdout), list):
                # No report at all (the exec broke, or etcdctl died before checking) says nothing
                # about the members: read as "0 healthy" it failed a drill whose quorum held.
                errors.append(f"{pod}: endpoint health printed no report: {health.stderr.strip()[-200:]}")
                continue
            status = self._etcdctl(pod, "endpoint", "status", "--cluster", "-w", "json")
            self._last_etcd_pod = pod
            return parse_etcd_status(members.stdout, health.stdout, status.stdout)
        raise ClusterError("no etcd pod answered etcdctl" + (f" ({'; '.join(errors)})" if errors else ""))

    def create_test_deployment(self, replicas: int) -> None:
        self._ok(["apply", "-f", "-"], stdin=json.dumps(deployment_manifest(replicas)))

    def delete_test_deployment(self) -> None:
        self._ok(
            ["-n", TEST_NAMESPACE, "delete", "deployment", TEST_DEPLOYMENT, "--ignore-not-found", "--timeout=60s"],
            wall_s=90,
        )

    def pods_of_test_deployment(self) -> list[str]:
        selector = urllib.parse.quote(f"{TEST_APP_LABEL}={TEST_DEPLOYMENT}")
        return ready_pod_nodes(self._get_json(f"/api/v1/namespaces/{TEST_NAMESPACE}/pods?labelSelector={selector}"))

    def cordon(self, name: str) -> None:
        self._ok(["cordon", name])

    def drain(self, name: str, timeout_s: float) -> None:
        self._ok(["drain", name, *DRAIN_FLAGS, f"--timeout={timeout_s:g}s"], wall_s=timeout_s + 30)

    def uncordon(self, name: str) -> None:
        self._ok(["uncordon", name])
