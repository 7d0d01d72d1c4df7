"""Stand-ins for kubeadm, kubectl, etcdctl, crictl, curl and arping over one modelled cluster.

tests/shell_harness.py puts a wrapper for each of these commands on PATH; the wrapper logs the
call and runs `python kube_standin.py <command> <args>`. Every node of a scenario shares one
state file (`cluster.json` in HARNESS_CLUSTER); what is on a node's disk lives under that node's
fake root (LABS_K8S_ROOT). The model follows kubeadm's real behaviour, phase by phase, so that a
script can be killed half-way and its guard judged on what kubeadm really leaves behind:

- `kubeadm init` runs its phases in the order of kubernetes/kubernetes
  cmd/kubeadm/app/cmd/init.go (newCmdInit, AppendPhase list, 1.31+): preflight, certs,
  kubeconfig, etcd, control-plane, kubelet-start, wait-control-plane, upload-config,
  upload-certs, mark-control-plane, bootstrap-token, kubelet-finalize, addon,
  show-join-command. It does not roll back: dying after `kubeconfig` leaves pki/ and every
  *.conf (admin.conf included) and nothing else.
- `kubeadm join` follows cmd/kubeadm/app/cmd/join.go (newCmdJoin): preflight,
  control-plane-prepare (download-certs, certs, kubeconfig: admin.conf, controller-manager.conf and
  scheduler.conf, never kubelet.conf; control-plane), check-etcd, kubelet-start, etcd-join (adds the
  member as a learner, writes the etcd manifest, promotes it: phases/join/controlplanejoin.go,
  util/etcd/etcd.go addMember/MemberPromote), kubelet-wait-bootstrap, control-plane-join
  (mark-control-plane), wait-control-plane. addMember skips the add when a member with the same
  peer URL exists (util/etcd/etcd.go: "Skipping etcd member addition"). kubelet-start refuses a
  name whose Node is Ready (phases/join/kubelet.go). Kubernetes 1.35+ always runs
  ControlPlaneKubeletLocalMode (GA and locked, kubernetes/kubernetes#134106): a control plane's
  kubelet bootstraps against its own API server, so its kubelet.conf and its Node appear only in
  kubelet-wait-bootstrap, after etcd-join; a worker's kubelet-start still waits for both.
  `kubeadm join phase kubelet-wait-bootstrap` and `join phase control-plane-join
  mark-control-plane` run one phase each (discovery first: the phases read InitCfg()).
- `kubeadm init phase upload-certs` stores the kubeadm-certs Secret owned by a bootstrap token
  with a 2 h TTL (constants.DefaultCertTokenDuration, phases/copycerts/copycerts.go
  createShortLivedBootstrapToken): when the token expires the token cleaner deletes it and the
  garbage collector takes the Secret with it. Bootstrap tokens live 24 h
  (constants.DefaultTokenDuration).
- `kubeadm token create` fails with `a token with id "<id>" already exists`
  (phases/bootstraptoken/node/token.go CreateNewTokens -> UpdateOrCreateTokens(failIfExists=true));
  `kubeadm init phase bootstrap-token` updates an existing token in place (failIfExists=false)
  and recreates the bootstrapper RBAC and the cluster-info ConfigMap (phases/init/bootstraptoken.go).
- `kubeadm reset` removes this node's etcd member when it can (phases/reset/removeetcdmember.go),
  then cleans /etc/kubernetes, /var/lib/kubelet and /var/lib/etcd (phases/reset/cleanupnode.go).
  It does not delete the Node object.
- The kubelet (Cluster.start_kubelet, Cluster.bootstrap_kubelets) starts as
  cmd/kubelet/app/server.go buildKubeletClientConfig does ("Client rotation is on, will bootstrap
  in background"): pkg/kubelet/certificate/bootstrap/bootstrap.go LoadClientConfig keeps a
  kubelet.conf whose client certificate is present and unexpired (isClientConfigStillValid), else
  loads bootstrap-kubelet.conf and *writes kubelet.conf at once*, pointing at
  /var/lib/kubelet/pki/kubelet-client-current.pem, which exists only once its CSR is signed; with
  neither it cannot start (systemd restarts it, forever: `kubelet_crashloop`). It bootstraps in the
  background with the bootstrap credentials it loaded at start, whenever the API server they name
  answers, unless a test stalls it (`bootstrap_stalls`: its CSR is never signed, or it crash-loops
  before it sends one), and registers its Node once it has a certificate. Its exit after five
  minutes without a certificate (server.go: UpdateTransport's exitAfter) and systemd's restart are
  a scenario of their own (`restart_kubelet`). Since Kubernetes 1.35 (ControlPlaneKubeletLocalMode
  GA) kubelet-start never waits, on a worker either: kubelet-wait-bootstrap does
  (cmd/kubeadm/app/cmd/phases/join/kubelet.go runKubeletStartJoinPhase, runKubeletWaitBootstrapPhase),
  and removes bootstrap-kubelet.conf whether the wait succeeds or fails (`defer os.Remove`), so a
  kubelet that restarts after a failed wait, before it has a certificate, never bootstraps again.

The kubectl the failure drills run (components/tools/drills/cluster.py `KubectlCluster`) is
modelled whole: `--server` overriding the kubeconfig's server, `get --raw` of /readyz, Nodes and
pods (the API's JSON, its NotFound as kubectl prints it), `apply -f` (a file or stdin, JSON or
YAML: Flannel's manifest brings the pod network, a Deployment goes to the workloads model),
`delete deployment`, `cordon`/`drain`/`uncordon`, and `exec` into an etcd pod, through the pod's
kubelet, running etcdctl with its v3.5/v3.6 JSON output. The controllers behind them (node
lifecycle, taint eviction, Deployment/ReplicaSet, garbage collection, scheduler, the kubelets'
pod starts) run when asked, on the store's clock: see the workloads section.

Tests tell the model to die after a phase (`die` in the state), to let time pass (`now`), to
take a host down, or which balancers hold the VIP; `node_grace_s` is the node monitor grace period
(0 unless a test sets it: a Node whose kubelet stops posting is NotReady at once). Certificates
are real (openssl), so the CA hash and certificate expiry are computed by the scripts as on a node.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HOUR = 3600.0
# certificate.NewFileStore("kubelet-client", certDir).CurrentPath()
KUBELET_PEM = "/var/lib/kubelet/pki/kubelet-client-current.pem"
KUBELET_VERSION = "v1.36.0"
# The directory of the real kubeadm-<minor> binaries (tests/kubeadm_real.py REAL_KUBEADM_DIR_ENV).
REAL_KUBEADM_DIR_ENV = "HARNESS_REAL_KUBEADM_DIR"
CERT_TOKEN_TTL = 2 * HOUR  # constants.DefaultCertTokenDuration
TOKEN_TTL = 24 * HOUR  # constants.DefaultTokenDuration

INIT_PHASES = (
    "preflight", "certs", "kubeconfig", "etcd", "control-plane", "kubelet-start", "wait-control-plane",
    "upload-config", "upload-certs", "mark-control-plane", "bootstrap-token", "kubelet-finalize", "addon",
    "show-join-command",
)  # fmt: skip
JOIN_PHASES = (
    "preflight", "control-plane-prepare", "check-etcd", "kubelet-start", "etcd-join", "kubelet-wait-bootstrap",
    "control-plane-join", "wait-control-plane",
)  # fmt: skip
# Phases that need the API server (everything after wait-control-plane in init).
API_PHASES = {"upload-config", "upload-certs", "mark-control-plane", "bootstrap-token", "addon"}
# How long kubeadm waits (v1beta4 `timeouts`, cmd/kubeadm/app/constants): controlPlaneComponentHealthCheck
# 4 min, kubernetesAPICall 1 min, etcdAPICall 2 min; the lab in a box's cluster waits these for real.
CONTROL_PLANE_WAIT_S = 240.0
API_CALL_WAIT_S = 60.0
ETCD_JOIN_WAIT_S = 120.0


def parse_duration(text: str) -> float:
    """Seconds of a Go duration as kubeadm and kubectl take them ("4m0s", "20s", "1h")."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", text)
    if not parts:
        return float(text) if re.fullmatch(r"\d+(\.\d+)?", text) else 0.0
    return sum(float(number) * units[unit] for number, unit in parts)


def images_for(version: str) -> list[str]:
    """`kubeadm config images list --kubernetes-version VERSION`: the images kubeadm of that minor
    deploys (what prepare-node.sh reads the pause image from)."""
    version = "v" + version.lstrip("v")
    return [
        f"registry.k8s.io/kube-apiserver:{version}",
        f"registry.k8s.io/kube-controller-manager:{version}",
        f"registry.k8s.io/kube-scheduler:{version}",
        f"registry.k8s.io/kube-proxy:{version}",
        "registry.k8s.io/coredns/coredns:v1.13.1",
        "registry.k8s.io/pause:3.10.1",
        f"registry.k8s.io/etcd:{etcd_image_tag(version)}",
    ]


def _older(a: str, b: str) -> bool:
    """Is version a older than b (v1.35.4 < v1.36.0)?"""

    def key(version: str) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", version))

    return key(a) < key(b)


def etcd_image_tag(version: str) -> str:
    """The etcd release kubeadm of `version`'s minor deploys (constants.SupportedEtcdVersion)."""
    minor = int(version.lstrip("v").split(".")[1])
    return "3.6.6-0" if minor >= 34 else "3.5.24-0"


CONFS = ("admin.conf", "super-admin.conf", "kubelet.conf", "controller-manager.conf", "scheduler.conf")
# The kubeconfigs kubeadm points at the node's own API server (localAPIEndpoint), not the VIP.
LOCAL_CONFS = ("controller-manager.conf", "scheduler.conf")
CONTROL_PLANE_MANIFESTS = ("kube-apiserver.yaml", "kube-controller-manager.yaml", "kube-scheduler.yaml")
BOOTSTRAP_RBAC = (
    "clusterrolebinding/kubeadm:kubelet-bootstrap",
    "clusterrolebinding/kubeadm:node-autoapprove-bootstrap",
    "clusterrolebinding/kubeadm:node-autoapprove-certificate-rotation",
    "clusterrolebinding/kubeadm:get-nodes",
    "role/kube-public/kubeadm:bootstrap-signer-clusterinfo",
    "rolebinding/kube-public/kubeadm:bootstrap-signer-clusterinfo",
)


class Fail(Exception):
    """A command failure: message to stderr, exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------------------------------- state


def empty_state() -> dict[str, Any]:
    return {
        "now": 1_800_000_000.0,
        "vip": "10.3.60.100",
        "cert_days": 365,
        # name -> {ip, role, root, up, kubelet; kubelet_bootstrap, kubelet_crashloop, bootstrap_stalls,
        # registration_lag, registers_in}
        "hosts": {},
        "balancers": {},  # name -> {mac, holds_vip, haproxy}
        "nodes": {},  # Node objects: name -> {labels, unschedulable}
        "objects": {},  # "kind/ns/name" -> {...}: configmaps, secrets, deployments, daemonsets, rbac
        "members": [],  # etcd: {id, name, peer, learner}
        "die": {},  # host -> {"init"|"join"|"reset": phase}
        "cni": False,
        "status_override": None,  # canned `endpoint status` JSON for leader/term edge cases
        # The workloads' pods (the Deployment controller's): "namespace/name" -> the model's facts
        # of one pod (see the workloads section); the static pods' mirror pods are `Cluster.pods`.
        "pods": {},
        # kube-controller-manager --node-monitor-grace-period: how long a Node whose kubelet stopped
        # posting status stays Ready. 0 here (NotReady at once, what the install scenarios assume);
        # the drill scenarios set the real 50 s, the lab in a box always has it (box_cluster.NODE_GRACE_S).
        "node_grace_s": 0.0,
    }


class Cluster:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.path = directory / "cluster.json"
        self.s: dict[str, Any] = {}

    @contextlib.contextmanager
    def locked(self) -> Iterator[Cluster]:
        with open(self.dir / "cluster.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.s = json.loads(self.path.read_text()) if self.path.exists() else empty_state()
            self.collect_garbage()
            self.background()
            self.run_controllers()
            try:
                yield self
            finally:
                self.save()

    def save(self) -> None:
        """Write the state whole, by rename: a reader without the lock sees the old state or the new."""
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        temporary.write_text(json.dumps(self.s, indent=1, sort_keys=True))
        os.replace(temporary, self.path)

    def background(self) -> None:
        """What happens in the cluster between two commands: here the kubelets' TLS bootstraps and
        their node status reports (the lab in a box's kubelets are daemons of their own and do both
        themselves). The controllers run after it (`run_controllers`)."""
        self.register_nodes()
        self.bootstrap_kubelets()
        self.post_node_status()

    def register_nodes(self) -> None:
        """A kubelet registers its Node after it has its certificate, from its own sync loop
        (pkg/kubelet/kubelet_node_status.go registerWithAPIServer, retried with a backoff up to
        7 s), not in the same instant: kubeadm join has returned by then (kubelet-wait-bootstrap
        waits for the certificate only). A test sets `registration_lag` (how many commands later,
        the model having no clock of its own); the box's kubelets register on their 2 s loop."""
        for name, host in self.s["hosts"].items():
            if "registers_in" in host:
                host["registers_in"] -= 1
                if host["registers_in"] <= 0:
                    del host["registers_in"]
                    self.s["nodes"].setdefault(name, {"labels": {}})

    def wait(self, condition: Callable[[], bool], seconds: float) -> bool:
        """Where the real tool waits (up to `seconds`) for something another process does: here the
        model's state is all there is, so the answer is the condition's now (the lab in a box's
        cluster polls, letting the others work meanwhile)."""
        return condition()

    def elapse(self, seconds: float) -> None:
        """Where the real tool spends `seconds` on something that does not answer (etcdctl's
        --command-timeout on a dead member): the model's clock moves only when a test moves it; the
        lab in a box's cluster sleeps, the store unlocked meanwhile."""

    # -------------------------------------------------------------- time and garbage collection
    @property
    def now(self) -> float:
        return float(self.s["now"])

    def collect_garbage(self) -> None:
        """The token cleaner deletes expired bootstrap tokens; the GC deletes what they owned."""
        objects = self.s["objects"]
        for key in [k for k, v in objects.items() if v.get("expires") and v["expires"] <= self.now]:
            del objects[key]
        for key in [k for k, v in objects.items() if v.get("owner") and v["owner"] not in objects]:
            del objects[key]

    # -------------------------------------------------------------- the kubelet's TLS bootstrap
    def kubelet_has_client_cert(self, name: str) -> bool:
        """bootstrap.go isClientConfigStillValid: kubelet.conf loads and holds a client certificate,
        embedded (kubeadm init's, before kubelet-finalize) or in the file it names (the kubelet's).
        The model's certificates do not expire while a test runs; the scripts' own check reads the
        real certificate with openssl."""
        conf = self.root(name) / "etc/kubernetes/kubelet.conf"
        if not conf.exists():
            return False
        text = conf.read_text()
        if re.search(r"^\s*client-certificate-data:\s*\S", text, re.M):
            return True
        match = re.search(r"^\s*client-certificate:\s*(\S+)", text, re.M)
        return bool(match) and (self.root(name) / match.group(1).lstrip("/")).is_file()

    def start_kubelet(self, name: str) -> None:
        """The kubelet (re)starts: server.go buildKubeletClientConfig -> bootstrap.LoadClientConfig."""
        host = self.host(name)
        root = self.root(name)
        host.update(kubelet=True, kubelet_crashloop=False, kubelet_bootstrap=None)
        if self.kubelet_has_client_cert(name):
            return  # "Current kubeconfig file contents are still valid, no bootstrap necessary"
        bootstrap = root / "etc/kubernetes/bootstrap-kubelet.conf"
        if not bootstrap.exists():
            # "unable to load bootstrap kubeconfig: stat /etc/kubernetes/bootstrap-kubelet.conf: no such
            # file or directory": the kubelet exits; systemd restarts it, and it exits again. Containers
            # it started (static pods) keep running: containerd owns them.
            host["kubelet_crashloop"] = True
            return
        server = re.search(r"server:\s*(\S+)", bootstrap.read_text()).group(1)
        # writeKubeconfigFromBootstrapping: the certificate-less kubelet.conf, written before the CSR.
        write(root, "/etc/kubernetes/kubelet.conf", kubelet_conf_text(self, server))
        host["kubelet_bootstrap"] = server  # the bootstrap credentials it holds in memory

    def stop_kubelet(self, name: str) -> None:
        """kubeadm's TryStopKubelet (`systemctl stop kubelet`): its bootstrap in memory is gone."""
        self.host(name).update(kubelet=False, kubelet_crashloop=False, kubelet_bootstrap=None)

    def restart_kubelet(self, name: str) -> None:
        """systemd restarts the kubelet (a package upgrade, `systemctl restart`, or its own exit after
        five minutes without a client certificate)."""
        if self.host(name)["kubelet"]:
            self.start_kubelet(name)

    def bootstrap_kubelet(self, name: str) -> None:
        """One kubelet's background TLS bootstrap (bootstrap.go LoadClientCert/requestNodeCertificate,
        kubeadm's auto-approval): the CSR is signed once the API server its bootstrap credentials name
        answers; the certificate lands at kubelet-client-current.pem and the kubelet registers its Node."""
        host = self.host(name)
        server = host.get("kubelet_bootstrap")
        if not (host["up"] and host["kubelet"] and server) or host.get("kubelet_crashloop"):
            return
        if host.get("bootstrap_stalls") or self.kubelet_has_client_cert(name):
            return
        address = server.split("//")[1].split(":")[0]
        if not self.api_answers(address, name):
            return
        if address == host["ip"] and not self.etcd_running(name):
            # Its own API server (ControlPlaneKubeletLocalMode) reads the local etcd member
            # (--etcd-servers=https://127.0.0.1:2379, kubeadm's stacked etcd), which runs only after
            # etcd-join: before that the kubelet's CSR goes nowhere.
            return
        cert, key = client_cert(self, f"system:node:{name}", org="system:nodes")
        pem = base64.b64decode(cert).decode() + base64.b64decode(key).decode()
        write(self.root(name), KUBELET_PEM, pem)
        host["kubelet_bootstrap"] = None
        if host.get("registration_lag"):
            host["registers_in"] = host["registration_lag"]  # register_nodes
        else:
            self.s["nodes"].setdefault(name, {"labels": {}})

    def bootstrap_kubelets(self) -> None:
        for name in list(self.s["hosts"]):
            self.bootstrap_kubelet(name)

    # -------------------------------------------------------------- hosts
    def host(self, name: str) -> dict[str, Any]:
        if name not in self.s["hosts"]:
            raise Fail(f"unknown host {name}")
        return self.s["hosts"][name]

    def host_by_ip(self, ip: str) -> str | None:
        for name, host in self.s["hosts"].items():
            if host["ip"] == ip:
                return name
        return None

    def root(self, name: str) -> Path:
        return Path(self.host(name)["root"])

    def has(self, name: str, relative: str) -> bool:
        return (self.root(name) / relative.lstrip("/")).exists()

    def peer_url(self, name: str) -> str:
        return f"https://{self.host(name)['ip']}:2380"

    def member_of(self, name: str) -> dict[str, Any] | None:
        peer = self.peer_url(name)
        return next((m for m in self.s["members"] if m["peer"] == peer), None)

    def etcd_running(self, name: str) -> bool:
        host = self.host(name)
        member = self.member_of(name)
        return bool(
            host["up"]
            and host["kubelet"]
            and self.has(name, "/etc/kubernetes/manifests/etcd.yaml")
            and member is not None
            and member.get("data") == self.data_id(name)
        )

    def data_id(self, name: str) -> str | None:
        """What is in /var/lib/etcd/member on that host (a wiped disk is not the old member)."""
        path = self.root(name) / "var/lib/etcd/member/id"
        return path.read_text().strip() if path.exists() else None

    def voting(self) -> list[dict[str, Any]]:
        return [m for m in self.s["members"] if not m["learner"]]

    def running_member(self, member: dict[str, Any]) -> bool:
        host = self.host_by_ip(member["peer"].split("//")[1].split(":")[0])
        return host is not None and self.etcd_running(host)

    def etcd_quorum(self) -> bool:
        voting = self.voting()
        healthy = [m for m in voting if self.running_member(m)]
        return bool(voting) and len(healthy) >= len(voting) // 2 + 1

    def apiserver_running(self, name: str) -> bool:
        host = self.host(name)
        return bool(
            host["up"]
            and host["kubelet"]
            and self.has(name, "/etc/kubernetes/manifests/kube-apiserver.yaml")
            and self.etcd_quorum()
        )

    def control_plane_hosts(self) -> list[str]:
        return [n for n, h in self.s["hosts"].items() if h["role"] == "control-plane"]

    def vip_answers(self) -> bool:
        """HAProxy on the VIP forwards to any control plane whose apiserver is healthy."""
        return self.vip_held() and any(self.apiserver_running(n) for n in self.control_plane_hosts())

    def vip_holders(self) -> list[str]:
        return [n for n, b in self.s["balancers"].items() if b["holds_vip"]]

    def vip_held(self) -> bool:
        return any(self.s["balancers"][n]["haproxy"] for n in self.vip_holders())

    def api_answers(self, address: str, local: str) -> bool:
        if address in (self.s["vip"],):
            return self.vip_answers()
        if address in ("127.0.0.1", "localhost"):
            return self.apiserver_running(local)
        host = self.host_by_ip(address)
        return host is not None and self.apiserver_running(host)

    # -------------------------------------------------------------- what the API reports
    def pods(self) -> list[dict[str, Any]]:
        """The control planes' static pods (their mirror pods), as the kubelets report them."""
        items = []
        for name in self.control_plane_hosts():
            host = self.host(name)
            for component in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd"):
                manifest = "etcd.yaml" if component == "etcd" else f"{component}.yaml"
                if not self.has(name, f"/etc/kubernetes/manifests/{manifest}") or name not in self.s["nodes"]:
                    continue
                running = (
                    self.etcd_running(name)
                    if component == "etcd"
                    else (
                        self.apiserver_running(name)
                        if component == "kube-apiserver"
                        else host["up"] and host["kubelet"]
                    )
                )
                items.append(
                    {
                        "metadata": {
                            "name": f"{component}-{name}",
                            "namespace": "kube-system",
                            "labels": {"component": component},
                        },
                        "spec": {"nodeName": name},
                        "status": {"phase": "Running" if running else "Pending"},
                    }
                )
        return items

    def kubelet_posting(self, name: str) -> bool:
        """The node's kubelet runs and posts its status: its host is up, the kubelet neither stopped nor
        crash-looping, and it has a client certificate (a kubelet without one posts nothing)."""
        host = self.s["hosts"].get(name)
        return bool(
            host
            and host["up"]
            and host["kubelet"]
            and not host.get("kubelet_crashloop")
            and self.kubelet_has_client_cert(name)
        )

    def post_node_status(self) -> None:
        """Each registered Node's kubelet posts its status (nodeStatusUpdateFrequency, 10 s: between
        two commands, in the model): `heartbeat` is the last report, `posting_since` the first of the
        current run of reports (a kubelet back after a stop starts a new one)."""
        for name, node in self.s["nodes"].items():
            posting = self.kubelet_posting(name)
            if posting and not node.get("posting"):
                node["posting_since"] = self.now
            if posting:
                node["heartbeat"] = self.now
            node["posting"] = posting

    def node_grace(self) -> float:
        return float(self.s.get("node_grace_s", 0.0))

    def node_status(self, name: str) -> str:
        """The Node's Ready condition: "True"; "False" when its kubelet reports it not ready (no CNI
        yet: NetworkReady=false); "Unknown" once its kubelet has not posted for the node monitor
        grace period (pkg/controller/nodelifecycle tryUpdateNodeHealth: "Kubelet stopped posting
        node status")."""
        node = self.s["nodes"].get(name) or {}
        beat = node.get("heartbeat")
        if not (self.kubelet_posting(name) or (beat is not None and self.now - float(beat) < self.node_grace())):
            return "Unknown"
        return "True" if self.s["cni"] else "False"

    def node_ready(self, name: str) -> bool:
        """A kubelet that cannot start, or has no client certificate, posts no status: NotReady."""
        return self.node_status(name) == "True"

    def kube_clock(self) -> float:
        """The clock of the kubelets' reports and of the controllers (the lab in a box's is real time)."""
        return self.now

    def run_controllers(self) -> None:
        """The node lifecycle, taint eviction, Deployment/ReplicaSet and garbage collection
        controllers, the scheduler and the kubelets' pod starts, replayed up to now (the workloads
        section). They run whenever a command reads the store under its lock."""
        run_controllers(self)

    def kubelet_answers(self, name: str, timeout: float) -> bool:
        """The API server reaches the node's kubelet (port 10250: exec, logs): its host is up and the
        kubelet runs."""
        host = self.s["hosts"].get(name)
        return bool(host and host["up"] and host["kubelet"] and not host.get("kubelet_crashloop"))

    def all_pods(self) -> list[dict[str, Any]]:
        """Every pod the API lists: the static pods' mirror pods and the workloads' pods."""
        return [*self.pods(), *(pod_view(self, p) for _, p in sorted(self.s.get("pods", {}).items()))]

    def node_info(self, name: str) -> dict[str, str]:
        """.status.nodeInfo: the model's kubelets run the version its kubeadm lists images for
        (`config images`); a test sets another with the node's "kubelet_version"."""
        return {"kubeletVersion": self.s["nodes"].get(name, {}).get("kubelet_version", KUBELET_VERSION)}

    # -------------------------------------------------------------- objects
    def get(self, key: str) -> dict[str, Any] | None:
        return self.s["objects"].get(key)

    def put(self, key: str, value: dict[str, Any] | None = None) -> None:
        self.s["objects"][key] = value or {}


# ---------------------------------------------------------------------------------------- helpers


def run_openssl(*args: str, stdin: bytes | None = None) -> bytes:
    import subprocess  # kubeadm's certificates only: the other stand-ins start faster without it

    return subprocess.run(["openssl", *args], input=stdin, capture_output=True, check=True).stdout


def ensure_ca(cluster: Cluster) -> tuple[Path, Path]:
    pki = cluster.dir / "pki"
    crt, key = pki / "ca.crt", pki / "ca.key"
    if not crt.exists():
        pki.mkdir(exist_ok=True)
        run_openssl(
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(crt),
            "-days",
            "3650",
            "-subj",
            "/CN=kubernetes",
        )
    return crt, key


def ca_hash(crt: Path) -> str:
    pub = run_openssl("x509", "-in", str(crt), "-noout", "-pubkey")
    der = run_openssl("pkey", "-pubin", "-outform", "DER", stdin=pub)
    digest = run_openssl("dgst", "-sha256", "-hex", stdin=der).decode().split()[-1]
    return f"sha256:{digest}"


def client_cert(cluster: Cluster, cn: str, org: str = "kubeadm:cluster-admins") -> tuple[str, str]:
    """A real client certificate (base64 PEM) signed by the cluster CA, valid `cert_days`."""
    import tempfile

    crt, key = ensure_ca(cluster)
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        run_openssl(
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            str(t / "k"),
            "-out",
            str(t / "csr"),
            "-subj",
            f"/O={org}/CN={cn}",
        )
        run_openssl(
            "x509",
            "-req",
            "-in",
            str(t / "csr"),
            "-CA",
            str(crt),
            "-CAkey",
            str(key),
            "-CAcreateserial",
            "-out",
            str(t / "c"),
            "-days",
            str(cluster.s["cert_days"]),
        )
        return base64.b64encode((t / "c").read_bytes()).decode(), base64.b64encode((t / "k").read_bytes()).decode()


def write(root: Path, relative: str, text: str, mode: int = 0o600) -> None:
    path = root / relative.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def kubeconfig_text(cluster: Cluster, server: str, user: str) -> str:
    ca, _ = ensure_ca(cluster)
    cert, key = client_cert(cluster, user)
    import yaml

    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "labs-k8s",
                    "cluster": {
                        "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode(),
                        "server": server,
                    },
                }
            ],
            "users": [{"name": user, "user": {"client-certificate-data": cert, "client-key-data": key}}],
            "contexts": [{"name": f"{user}@labs-k8s", "context": {"cluster": "labs-k8s", "user": user}}],
            "current-context": f"{user}@labs-k8s",
        },
        sort_keys=False,
    )


def kubelet_conf_text(cluster: Cluster, server: str, embedded: bool = False, name: str = "") -> str:
    """kubelet.conf as its writers lay it out: the kubelet's (bootstrap.go writeKubeconfigFromBootstrapping:
    default-cluster, default-auth naming KUBELET_PEM for certificate and key), or kubeadm init's
    kubeconfig phase (the node's client certificate embedded, until kubelet-finalize)."""
    import yaml

    ca, _ = ensure_ca(cluster)
    if embedded:
        cert, key = client_cert(cluster, f"system:node:{name}", org="system:nodes")
        user = {"client-certificate-data": cert, "client-key-data": key}
    else:
        user = {"client-certificate": KUBELET_PEM, "client-key": KUBELET_PEM}
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "default-cluster",
                    "cluster": {
                        "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode(),
                        "server": server,
                    },
                }
            ],
            "users": [{"name": "default-auth", "user": user}],
            "contexts": [
                {"name": "default-context", "context": {"cluster": "default-cluster", "user": "default-auth"}}
            ],
            "current-context": "default-context",
        },
        sort_keys=False,
    )


def flag(args: list[str], name: str) -> str | None:
    for index, arg in enumerate(args):
        if arg == name and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def load_documents(path: str) -> dict[str, dict[str, Any]]:
    import yaml  # only kubeadm reads YAML: kubectl, crictl and curl start faster without it

    try:
        docs = [d for d in yaml.safe_load_all(Path(path).read_text()) if d]
    except FileNotFoundError:
        raise Fail(f"unable to read config from {path!r}") from None
    return {d["kind"]: d for d in docs}


def real_kubeadm_validate(path: str, documents: dict[str, dict[str, Any]]) -> None:
    """Refuse what the real kubeadm refuses: `kubeadm config validate` of the same file, by the
    real kubeadm of the config's minor (ClusterConfiguration.kubernetesVersion; a JoinConfiguration
    has none: the minor of this model's kubeadm, KUBELET_VERSION). The harness names the directory of
    the built binaries (tests/kubeadm_real.py) in REAL_KUBEADM_DIR_ENV; under CI=true it must."""
    import subprocess

    directory = os.environ.get(REAL_KUBEADM_DIR_ENV, "")
    if not directory:
        if os.environ.get("CI", "").lower() == "true":
            raise Fail(
                f"stand-in kubeadm: CI=true and no real kubeadm to validate {path} with "
                f"({REAL_KUBEADM_DIR_ENV} is empty: tests/kube_programs.py could not build kubeadm)"
            )
        return
    version = str(documents.get("ClusterConfiguration", {}).get("kubernetesVersion") or KUBELET_VERSION)
    match = re.match(r"^v?(1\.\d+)\.\d+$", version)
    if match is None:
        raise Fail(f"stand-in kubeadm: kubernetesVersion {version!r} is not v1.MINOR.PATCH")
    binary = Path(directory) / f"kubeadm-{match.group(1)}"
    if not binary.exists():
        raise Fail(
            f"stand-in kubeadm: no real kubeadm {match.group(1)} in {directory} (tests/tools/kube/manifest.json)"
        )
    proc = subprocess.run(
        [str(binary), "config", "validate", "--config", path], capture_output=True, text=True, timeout=60, check=False
    )
    if proc.returncode != 0:
        raise Fail(proc.stderr.strip() or f"kubeadm config validate exited {proc.returncode}", proc.returncode)


def kubeconfig_server(path: str) -> str:
    if not Path(path).exists():
        raise Fail(f"error: stat {path}: no such file or directory")
    text = Path(path).read_text()
    match = re.search(r"server:\s*(\S+)", text)
    if not match:
        raise Fail(f"error: no server in {path}")
    return match.group(1)


# ---------------------------------------------------------------------------------------- kubeadm


class Kubeadm:
    def __init__(self, cluster: Cluster, host: str, args: list[str]) -> None:
        self.c = cluster
        self.host = host
        self.args = args

    @property
    def root(self) -> Path:
        return self.c.root(self.host)

    def die_after(self, workflow: str, phase: str) -> None:
        plan = self.c.s["die"].get(self.host, {})
        if plan.get(workflow) == phase:
            del plan[workflow]
            phases = INIT_PHASES if workflow == "init" else JOIN_PHASES
            if phase in phases and phase != phases[-1]:
                following = phases[phases.index(phase) + 1]
            else:
                following = phase.split("/")[0]
            raise Fail(f"error execution phase {following}: the stand-in was told to die after {phase}")

    def config(self) -> dict[str, dict[str, Any]]:
        path = flag(self.args, "--config")
        if path is None:
            raise Fail("this stand-in needs --config")
        documents = load_documents(path)
        real_kubeadm_validate(path, documents)
        return documents

    # -------------------------------------------------------------- init phases
    def require_api(self, phase: str) -> None:
        if not self.c.apiserver_running(self.host):
            raise Fail(
                f"error execution phase {phase}: unable to create a new client: "
                f'Get "https://127.0.0.1:6443/version": dial tcp 127.0.0.1:6443: connect: connection refused'
            )

    def init_phase(self, phase: str, cfg: dict[str, dict[str, Any]]) -> None:
        init = cfg.get("InitConfiguration", {})
        cluster_cfg = cfg.get("ClusterConfiguration", {})
        if phase in API_PHASES:
            self.require_api(phase)
        if phase == "preflight":
            problems = [
                f"[ERROR FileAvailable--etc-kubernetes-manifests-{m}]: /etc/kubernetes/manifests/{m} already exists"
                for m in (*CONTROL_PLANE_MANIFESTS, "etcd.yaml")
                if self.c.has(self.host, f"/etc/kubernetes/manifests/{m}")
            ]
            if any((self.root / "var/lib/etcd").glob("*")):
                problems.append("[ERROR DirAvailable--var-lib-etcd]: /var/lib/etcd is not empty")
            if problems:
                raise Fail(
                    "error execution phase preflight: [preflight] Some fatal errors occurred:\n" + "\n".join(problems)
                )
        elif phase == "certs":
            ensure_ca(self.c)
            pki = self.root / "etc/kubernetes/pki"
            pki.mkdir(parents=True, exist_ok=True)
            for name in ("ca.crt", "ca.key"):
                if not (pki / name).exists():
                    shutil.copy(self.c.dir / "pki" / name, pki / name)
            for name in (
                "sa.key",
                "sa.pub",
                "front-proxy-ca.crt",
                "etcd/ca.crt",
                "apiserver.crt",
                "etcd/healthcheck-client.crt",
                "etcd/server.crt",
            ):
                if not (pki / name).exists():
                    write(pki, name, f"{name}\n")
        elif phase == "kubeconfig":
            endpoint = "https://" + cluster_cfg.get("controlPlaneEndpoint", "127.0.0.1:6443")
            for conf in CONFS:
                path = self.root / "etc/kubernetes" / conf
                if path.exists():
                    continue
                if conf == "admin.conf":  # the only one whose certificate the scripts read
                    write(
                        self.root, "/etc/kubernetes/admin.conf", kubeconfig_text(self.c, endpoint, "kubernetes-admin")
                    )
                elif conf == "kubelet.conf":
                    # The node's own client certificate, embedded, against its own API server
                    # (ControlPlaneKubeletLocalMode); kubelet-finalize points it at the rotated file.
                    write(
                        self.root,
                        "/etc/kubernetes/kubelet.conf",
                        kubelet_conf_text(self.c, self.local_endpoint(), embedded=True, name=self.host),
                    )
                else:
                    # The controller manager and the scheduler talk to this node's own API server,
                    # the admins to controlPlaneEndpoint (phases/kubeconfig/kubeconfig.go
                    # getKubeConfigSpecsBase: localAPIEndpoint for those two).
                    server = self.local_endpoint() if conf in LOCAL_CONFS else endpoint
                    write(self.root, f"/etc/kubernetes/{conf}", f"clusters:\n- cluster:\n    server: {server}\n")
        elif phase == "etcd":
            self.write_manifest("etcd", cluster_cfg)
            if not self.c.s["members"]:  # a new single-member cluster (initial-cluster-state new)
                self.add_member(learner=False)
        elif phase == "control-plane":
            for manifest in CONTROL_PLANE_MANIFESTS:
                self.write_manifest(manifest.removesuffix(".yaml"), cluster_cfg)
        elif phase == "kubelet-start":
            self.kubelet_start()
            # The kubelet registers its Node as soon as the API server it just started answers.
            self.register_node()
        elif phase == "wait-control-plane":
            # timeouts.controlPlaneComponentHealthCheck, 4 min by default (v1beta4).
            if not self.c.wait(lambda: self.c.apiserver_running(self.host), CONTROL_PLANE_WAIT_S):
                raise Fail("error execution phase wait-control-plane: the control plane did not come up")
            self.register_node()
        elif phase == "upload-config":
            version = str(cluster_cfg.get("kubernetesVersion") or KUBELET_VERSION)
            self.c.put(
                "configmap/kube-system/kubeadm-config", {"version": version, "cluster_configuration": cluster_cfg}
            )
            self.c.put("configmap/kube-system/kubelet-config")
        elif phase == "upload-certs":
            if "--upload-certs" not in self.args:
                return  # kubeadm skips the phase without --upload-certs
            key = init.get("certificateKey") or secrets.token_hex(32)
            owner = f"secret/kube-system/bootstrap-token-{secrets.token_hex(3)}"
            self.c.put(
                owner,
                {
                    "expires": self.c.now + CERT_TOKEN_TTL,
                    "description": "Proxy for managing TTL for the kubeadm-certs secret",
                },
            )
            self.c.put("secret/kube-system/kubeadm-certs", {"owner": owner, "key": key})
            if "--skip-certificate-key-print" not in self.args:
                print(f"[upload-certs] Using certificate key:\n{key}")
        elif phase == "mark-control-plane":
            # phases/markcontrolplane: the label and the taint (kubeadm's default control-plane taint,
            # constants.ControlPlaneTaint), which keeps ordinary pods off control planes.
            node = self.c.s["nodes"].setdefault(self.host, {"labels": {}})
            node["labels"]["node-role.kubernetes.io/control-plane"] = ""
            taints = node.setdefault("taints", [])
            if not any(t["key"] == CONTROL_PLANE_TAINT for t in taints):
                taints.append({"key": CONTROL_PLANE_TAINT, "effect": "NoSchedule"})
        elif phase == "bootstrap-token":
            for token in init.get("bootstrapTokens", []):
                self.update_or_create_token(token, fail_if_exists=False)
            for name in BOOTSTRAP_RBAC:
                self.c.put(name)
            info = self.c.s["objects"].setdefault("configmap/kube-public/cluster-info", {})
            if cluster_cfg.get("controlPlaneEndpoint"):
                info["server"] = "https://" + cluster_cfg["controlPlaneEndpoint"]
            if "--skip-token-print" not in self.args:
                for token in init.get("bootstrapTokens", []):
                    print(f"[bootstrap-token] Using token: {token['token']}")
        elif phase == "kubelet-finalize":
            # phases/init/kubeletfinalize.go: the kubelet's certificate manager stored the embedded
            # certificate as kubelet-client-current.pem; kubelet.conf now names that file.
            conf = self.root / "etc/kubernetes/kubelet.conf"
            if conf.exists() and "kubelet-client-current.pem" not in conf.read_text():
                import yaml

                user = yaml.safe_load(conf.read_text())["users"][0]["user"]
                pem = base64.b64decode(user["client-certificate-data"]) + base64.b64decode(user["client-key-data"])
                write(self.root, KUBELET_PEM, pem.decode())
                write(self.root, "/etc/kubernetes/kubelet.conf", kubelet_conf_text(self.c, self.local_endpoint()))
        elif phase == "addon":
            which = self.args[self.args.index("addon") + 1] if "addon" in self.args[:3] else "all"
            if which in ("all", "coredns"):
                self.c.put("deployment/kube-system/coredns")
            if which in ("all", "kube-proxy"):
                self.c.put("daemonset/kube-system/kube-proxy")
        elif phase == "show-join-command":
            pass
        else:
            raise Fail(f"unknown phase {phase}")

    def write_manifest(self, component: str, cluster_cfg: dict[str, Any] | None = None) -> None:
        """A static pod manifest: a Pod whose one container runs `component`'s image at the cluster's
        version (etcd at the release kubeadm pins for it, constants.SupportedEtcdVersion)."""
        version = str((cluster_cfg or {}).get("kubernetesVersion") or self.cluster_version())
        image = (
            f"registry.k8s.io/etcd:{etcd_image_tag(version)}"
            if component == "etcd"
            else (f"registry.k8s.io/{component}:{version}")
        )
        write(
            self.root,
            f"/etc/kubernetes/manifests/{component}.yaml",
            f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: {component}\n  namespace: kube-system\n"
            f"  labels:\n    component: {component}\nspec:\n  containers:\n  - name: {component}\n"
            f"    image: {image}\n",
        )

    def cluster_version(self) -> str:
        """The kubernetesVersion of the ClusterConfiguration uploaded to kubeadm-config (what a join
        reads), else this kubeadm's own."""
        stored = (self.c.get("configmap/kube-system/kubeadm-config") or {}).get("version")
        return str(stored or KUBELET_VERSION)

    def add_member(self, learner: bool) -> None:
        data = secrets.token_hex(8)
        member_id = int(secrets.token_hex(8), 16)
        self.c.s["members"].append(
            {
                "id": member_id,
                "name": self.host if not learner else "",
                "peer": self.c.peer_url(self.host),
                "learner": learner,
                "data": data,
            }
        )
        write(self.root, "/var/lib/etcd/member/id", data + "\n")

    def kubelet_start(self, workflow: str = "init") -> None:
        """kubelet-start, in kubeadm's order (cmd/kubeadm/app/cmd/phases/init/kubelet.go
        runKubeletStart, join/kubelet.go runKubeletStartJoinPhase): TryStopKubelet, then the flags
        file and the configuration, then TryStartKubelet. Dying between the two ("kubelet-start/written")
        leaves the files in place and the kubelet stopped."""
        self.c.stop_kubelet(self.host)
        write(self.root, "/var/lib/kubelet/kubeadm-flags.env", "KUBELET_KUBEADM_ARGS=\n")
        write(self.root, "/var/lib/kubelet/config.yaml", "kind: KubeletConfiguration\n")
        self.die_after(workflow, "kubelet-start/written")
        self.c.start_kubelet(self.host)

    def register_node(self) -> None:
        self.c.s["nodes"].setdefault(self.host, {"labels": {}})

    def update_or_create_token(self, token: dict[str, Any], fail_if_exists: bool) -> None:
        token_id = token["token"].split(".")[0]
        key = f"secret/kube-system/bootstrap-token-{token_id}"
        if fail_if_exists and self.c.get(key) is not None:
            raise Fail(
                f"failed to create or update bootstrap token with name bootstrap-token-{token_id}: "
                f'a token with id "{token_id}" already exists'
            )
        ttl = token.get("ttl", "24h0m0s")
        hours = float(re.match(r"(\d+)h", ttl).group(1)) if re.match(r"(\d+)h", ttl) else 24.0
        self.c.put(
            key,
            {
                "expires": self.c.now + hours * HOUR if hours else None,
                "secret": token["token"],
                "description": token.get("description", ""),
            },
        )

    def init(self) -> None:
        cfg = self.config()
        for phase in INIT_PHASES:
            self.init_phase(phase, cfg)
            self.die_after("init", phase)

    def phase(self) -> None:
        index = self.args.index("phase")
        name = self.args[index + 1]
        if self.args[0] != "init":
            raise Fail("this stand-in models `kubeadm init phase` only")
        self.init_phase(name, self.config())

    # -------------------------------------------------------------- join
    def discover(self, discovery: dict[str, Any]) -> Path:
        """Token discovery (discovery/token/token.go): cluster-info through the endpoint, the token
        valid, the CA matching the pinned hash. Returns the CA certificate."""
        endpoint = discovery["apiServerEndpoint"].split(":")[0]
        if not self.c.api_answers(endpoint, self.host):
            raise Fail(
                f"error execution phase preflight: couldn't validate the identity of the API Server: "
                f'Get "https://{discovery["apiServerEndpoint"]}/api/v1/namespaces/kube-public/configmaps/'
                'cluster-info": dial tcp: connect: connection refused'
            )
        token_id = discovery["token"].split(".")[0]
        token = self.c.get(f"secret/kube-system/bootstrap-token-{token_id}")
        if token is None or token.get("secret") != discovery["token"]:
            raise Fail(
                "error execution phase preflight: couldn't validate the identity of the API Server: "
                f'token id "{token_id}" is invalid for this cluster or it has expired. Use "kubeadm token '
                'create" on the control-plane node to create a new valid token'
            )
        crt, _ = ensure_ca(self.c)
        if ca_hash(crt) not in discovery.get("caCertHashes", []):
            raise Fail(
                "error execution phase preflight: couldn't validate the identity of the API Server: "
                "cluster CA found in cluster-info ConfigMap is invalid: none of the public keys match the pins"
            )
        return crt

    def local_endpoint(self) -> str:
        return f"https://{self.c.host(self.host)['ip']}:6443"

    def wait_bootstrap(self) -> None:
        """kubelet-wait-bootstrap (phases/join/kubelet.go runKubeletWaitBootstrapPhase): waits for the
        kubelet's /healthz, then for a kubelet.conf a client can be built from (its certificate file
        included: waitForTLSBootstrappedClient), and removes bootstrap-kubelet.conf either way
        (`defer os.Remove`). A control plane's kubelet bootstraps against its own API server, which
        serves only once its etcd member runs."""
        try:
            self.c.bootstrap_kubelet(self.host)
            host = self.c.host(self.host)
            if not host["kubelet"] or host.get("kubelet_crashloop"):
                raise Fail(
                    "error execution phase kubelet-wait-bootstrap: The HTTP call equal to 'curl -sSL "
                    "http://127.0.0.1:10248/healthz' returned error: dial tcp 127.0.0.1:10248: connect: "
                    "connection refused"
                )
            if not self.c.kubelet_has_client_cert(self.host):
                raise Fail(
                    "error execution phase kubelet-wait-bootstrap: error waiting for the kubelet to perform the "
                    "TLS Bootstrap: context deadline exceeded"
                )
        finally:
            (self.root / "etc/kubernetes/bootstrap-kubelet.conf").unlink(missing_ok=True)

    def join(self) -> None:
        if self.args[1:2] == ["phase"]:
            self.join_phase()
            return
        cfg = self.config()["JoinConfiguration"]
        control_plane = "controlPlane" in cfg
        discovery = cfg["discovery"]["bootstrapToken"]
        node_name = cfg["nodeRegistration"]["name"]
        if node_name != self.host:
            raise Fail(f"nodeRegistration.name {node_name} is not this host {self.host}")
        # preflight (phases/join/preflight.go, RunJoinNodeChecks)
        problems = [
            f"[ERROR FileAvailable--etc-kubernetes-{f}]: /etc/kubernetes/{f} already exists"
            for f in ("kubelet.conf", "bootstrap-kubelet.conf")
            if self.c.has(self.host, f"/etc/kubernetes/{f}")
        ]
        problems += [
            f"[ERROR FileAvailable--etc-kubernetes-manifests-{m}]: already exists"
            for m in (*CONTROL_PLANE_MANIFESTS, "etcd.yaml")
            if control_plane and self.c.has(self.host, f"/etc/kubernetes/manifests/{m}")
        ]
        if control_plane and any((self.root / "var/lib/etcd").glob("*")):
            problems.append("[ERROR DirAvailable--var-lib-etcd]: /var/lib/etcd is not empty")
        if problems:
            raise Fail(
                "error execution phase preflight: [preflight] Some fatal errors occurred:\n" + "\n".join(problems)
            )
        crt = self.discover(discovery)
        self.die_after("join", "preflight")
        if control_plane:
            certs = self.c.get("secret/kube-system/kubeadm-certs")
            if certs is None:
                raise Fail(
                    "error execution phase control-plane-prepare/download-certs: error downloading certs: "
                    'error downloading the secret: secrets "kubeadm-certs" not found'
                )
            if certs.get("key") != cfg["controlPlane"].get("certificateKey"):
                raise Fail(
                    "error execution phase control-plane-prepare/download-certs: error downloading certs: "
                    "error decoding certificate key: cipher: message authentication failed"
                )
            self.init_phase("certs", {})
            # control-plane-prepare/kubeconfig writes admin.conf, controller-manager.conf and
            # scheduler.conf, never kubelet.conf: that one is the kubelet's TLS bootstrap's
            # (phases/kubeconfig/kubeconfig.go CreateJoinControlPlaneKubeConfigFiles).
            endpoint = "https://" + discovery["apiServerEndpoint"]
            write(self.root, "/etc/kubernetes/admin.conf", kubeconfig_text(self.c, endpoint, "kubernetes-admin"))
            for conf in LOCAL_CONFS:  # this node's own API server, as in init (getKubeConfigSpecsBase)
                write(
                    self.root,
                    f"/etc/kubernetes/{conf}",
                    f"clusters:\n- cluster:\n    server: {self.local_endpoint()}\n",
                )
            for manifest in CONTROL_PLANE_MANIFESTS:
                self.write_manifest(manifest.removesuffix(".yaml"))
        self.die_after("join", "control-plane-prepare")
        if control_plane:
            # check-etcd (phases/join/checketcd.go -> etcd CheckClusterHealth, util/etcd/etcd.go): the
            # status of every endpoint the member list names (started members) must answer; one
            # dead member fails the join even with a quorum.
            dead = [m for m in self.c.s["members"] if m["name"] and not self.c.running_member(m)]
            if dead or not self.c.etcd_quorum():
                endpoint = dead[0]["peer"].replace(":2380", ":2379") if dead else "https://127.0.0.1:2379"
                raise Fail(
                    "error execution phase check-etcd: etcd cluster is not healthy: failed to dial endpoint "
                    f"{endpoint} with maintenance client: context deadline exceeded"
                )
        self.die_after("join", "check-etcd")
        # kubelet-start (phases/join/kubelet.go runKubeletStartJoinPhase): it refuses to go on while
        # a Ready Node has this name, writes bootstrap-kubelet.conf and the kubelet's config, starts
        # the kubelet. ControlPlaneKubeletLocalMode (beta and on in 1.33, GA and locked on in 1.35,
        # kubernetes/kubernetes#134106): a control plane's bootstrap-kubelet.conf points at its own
        # API server, and kubelet-start does not wait for the TLS bootstrap there: that API server
        # cannot serve before this node's etcd member runs, so kubelet-wait-bootstrap, after
        # etcd-join, waits. A worker's kubelet-start still waits for it (kubelet.conf, its Node).
        if self.host in self.c.s["nodes"] and self.c.node_ready(self.host):
            raise Fail(
                f'error execution phase kubelet-start: a Node with name "{self.host}" and status "Ready" already '
                "exists in the cluster. You must delete the existing Node or change the name of this new joining Node"
            )
        if not (self.root / "etc/kubernetes/pki/ca.crt").exists():
            write(self.root, "/etc/kubernetes/pki/ca.crt", crt.read_text(), 0o644)
        self.write_bootstrap_conf(control_plane, discovery)
        self.kubelet_start("join")
        self.die_after("join", "kubelet-start")
        if control_plane:
            member = self.c.member_of(self.host)
            if member is None:
                self.add_member(learner=True)
            else:
                print(
                    f"[etcd] The peer URL {member['peer']} for the added etcd member already exists. "
                    "Skipping etcd member addition"
                )
            self.write_manifest("etcd")
            # The kubelet starts the new member's static pod; kubeadm waits for it to join
            # (util/etcd.go addMember/MemberPromote retry until the learner is in sync).
            self.c.wait(lambda: self.c.etcd_running(self.host), ETCD_JOIN_WAIT_S)
            member = self.c.member_of(self.host)
            if member is not None and member.get("data") == self.c.data_id(self.host):
                member["name"] = self.host  # etcd started: the member publishes its name
            # "etcd-join/learner": died waiting to promote the started learner (util/etcd MemberPromote).
            self.die_after("join", "etcd-join/learner")
            member = self.c.member_of(self.host)
            if member is None or member.get("data") != self.c.data_id(self.host):
                raise Fail(
                    "error execution phase etcd-join: error creating local etcd static pod manifest file: "
                    "timeout waiting for etcd cluster to be available"
                )
            member.update(learner=False, name=self.host)  # MemberPromote
        self.die_after("join", "etcd-join")
        self.wait_bootstrap()
        self.die_after("join", "kubelet-wait-bootstrap")
        if control_plane:
            self.mark_control_plane()
            self.die_after("join", "control-plane-join")
            if not self.c.wait(lambda: self.c.apiserver_running(self.host), CONTROL_PLANE_WAIT_S):
                raise Fail("error execution phase wait-control-plane: the control plane did not come up")
        self.die_after("join", "wait-control-plane")

    def write_bootstrap_conf(self, control_plane: bool, discovery: dict[str, Any]) -> None:
        """kubelet-start's bootstrap-kubelet.conf: the discovered cluster and the bootstrap token; a
        control plane's points at its own API server (ControlPlaneKubeletLocalMode)."""
        server = self.local_endpoint() if control_plane else "https://" + discovery["apiServerEndpoint"]
        write(self.root, "/etc/kubernetes/bootstrap-kubelet.conf", f"clusters:\n- cluster:\n    server: {server}\n")

    def mark_control_plane(self) -> None:
        """phases/markcontrolplane: label and taint the Node, which must be registered (PatchNode
        waits for it, then gives up)."""
        # PatchNode polls for the Node (apiclient.PatchNodeOnce, constants.KubernetesAPICallTimeout).
        if not self.c.wait(lambda: self.host in self.c.s["nodes"], API_CALL_WAIT_S):
            raise Fail(
                "error execution phase control-plane-join/mark-control-plane: error applying control-plane label "
                f'and taints: timed out waiting for the condition (nodes "{self.host}" not found)'
            )
        self.init_phase("mark-control-plane", {})

    def join_phase(self) -> None:
        """`kubeadm join phase <phase> --config`: the phases a join that stopped after etcd-join
        still owes. Their data comes from the JoinConfiguration, discovery included (InitCfg)."""
        name = self.args[2:4]
        cfg = self.config()["JoinConfiguration"]
        control_plane = "controlPlane" in cfg
        if name[:1] == ["kubelet-start"]:
            # runKubeletStartJoinPhase on its own: discovery (TLSBootstrapCfg), the Ready-Node check,
            # bootstrap-kubelet.conf, the kubelet restarted; no wait (ControlPlaneKubeletLocalMode).
            discovery = cfg["discovery"]["bootstrapToken"]
            crt = self.discover(discovery)
            if self.host in self.c.s["nodes"] and self.c.node_ready(self.host):
                raise Fail(
                    f'error execution phase kubelet-start: a Node with name "{self.host}" and status "Ready" '
                    "already exists in the cluster. You must delete the existing Node or change the name of this "
                    "new joining Node"
                )
            if not (self.root / "etc/kubernetes/pki/ca.crt").exists():
                write(self.root, "/etc/kubernetes/pki/ca.crt", crt.read_text(), 0o644)
            self.write_bootstrap_conf(control_plane, discovery)
            self.kubelet_start("join")
        elif name[:1] == ["kubelet-wait-bootstrap"]:
            self.discover(cfg["discovery"]["bootstrapToken"])
            self.wait_bootstrap()
        elif name == ["control-plane-join", "mark-control-plane"]:
            self.discover(cfg["discovery"]["bootstrapToken"])
            if not self.c.has(self.host, "/etc/kubernetes/admin.conf"):
                raise Fail("couldn't create Kubernetes client: /etc/kubernetes/admin.conf: no such file or directory")
            self.mark_control_plane()
        else:
            raise Fail(f"unmodelled: kubeadm join phase {' '.join(name)}")

    # -------------------------------------------------------------- reset
    def reset(self) -> None:
        if "-f" not in self.args and "--force" not in self.args:
            raise Fail("this stand-in needs -f")
        # remove-etcd-member: only from a control plane whose admin.conf reaches the API.
        if self.c.has(self.host, "/etc/kubernetes/manifests/etcd.yaml"):
            member = self.c.member_of(self.host)
            if member is not None:
                if (
                    self.c.has(self.host, "/etc/kubernetes/admin.conf")
                    and self.c.vip_answers()
                    and self.c.etcd_quorum()
                ):
                    self.c.s["members"].remove(member)
                    print(f"[reset] Removing member {member['id']:x} from the etcd cluster")
                else:
                    print(
                        "[reset] WARNING: failed to remove etcd member: the etcd member of this node stays",
                        file=sys.stderr,
                    )
        for relative in ("etc/kubernetes/manifests", "etc/kubernetes/pki", "var/lib/kubelet", "var/lib/etcd"):
            shutil.rmtree(self.root / relative, ignore_errors=True)
        for conf in (*CONFS, "bootstrap-kubelet.conf"):
            (self.root / "etc/kubernetes" / conf).unlink(missing_ok=True)
        host = self.c.host(self.host)
        host.update(kubelet=False, kubelet_crashloop=False, kubelet_bootstrap=None)

    # -------------------------------------------------------------- token, certs
    def token(self) -> None:
        verb = self.args[1]
        if verb == "list":
            for key, obj in sorted(self.c.s["objects"].items()):
                if key.startswith("secret/kube-system/bootstrap-token-") and obj.get("secret"):
                    print(f"{obj['secret']}   23h   expires   authentication,signing   {obj.get('description', '')}")
        elif verb == "create":
            init = self.config().get("InitConfiguration", {})
            self.require_api("token create")
            for token in init.get("bootstrapTokens", []):
                self.update_or_create_token(token, fail_if_exists=True)
                print(token["token"])
        elif verb == "delete":
            # kubeadm token delete <id>: deletes the token's Secret, or fails when there is none.
            self.require_api("token delete")
            key = f"secret/kube-system/bootstrap-token-{self.args[2]}"
            if self.c.s["objects"].pop(key, None) is None:
                raise Fail(f"bootstrap token {self.args[2]!r} not found")
            print(f"bootstrap token {self.args[2]!r} deleted")
        else:
            raise Fail(f"unmodelled: kubeadm token {verb}")

    def certs(self) -> None:
        if self.args[1:3] != ["renew", "admin.conf"]:
            raise Fail(f"unmodelled: kubeadm {' '.join(self.args)}")
        text = Path(self.root / "etc/kubernetes/admin.conf").read_text()
        server = re.search(r"server:\s*(\S+)", text).group(1)
        write(self.root, "/etc/kubernetes/admin.conf", kubeconfig_text(self.c, server, "kubernetes-admin"))
        print("certificate embedded in the kubeconfig file for the admin to use and for kubeadm itself renewed")

    # -------------------------------------------------------------- upgrade
    # cmd/kubeadm/app/cmd/upgrade/{plan,apply,node}.go and cmd/kubeadm/app/phases/upgrade/*.go, as
    # tests/standins/kubeadm.bash models them for the shell harness: the configuration from the
    # kubeadm-config ConfigMap; preflight health (every control-plane Node Ready, every static pod
    # manifest on disk); the version policy (one minor at a time, never above kubeadm's own minor;
    # a patch above kubeadm's own only with --force; --yes or nobody to answer); then each static
    # pod in turn, its old manifest backed up under /etc/kubernetes/tmp, rolled back with every one
    # moved so far when it does not come back within 5 min; admin.conf's certificate renewed; the
    # ClusterConfiguration's version uploaded; the kubelet's configuration written.
    def own_version(self) -> str:
        return KUBELET_VERSION

    def component_back(self, component: str, version: str) -> bool:
        """Did the kubelet restart `component` on the new manifest (its mirror pod's hash changed)?
        The model's kubelet does at once; the lab in a box's is a daemon and is waited for."""
        return True

    def upgrade_health_checks(self) -> None:
        not_ready = sorted(
            n for n, node in self.c.s["nodes"].items()
            if "node-role.kubernetes.io/control-plane" in node.get("labels", {}) and not self.c.node_ready(n)
        )  # fmt: skip
        if not_ready:
            raise Fail(f"[ERROR ControlPlaneNodesReady]: there are NotReady control-planes in the cluster: {not_ready}")
        for component in ("etcd", *(m.removesuffix(".yaml") for m in CONTROL_PLANE_MANIFESTS)):
            if not self.c.has(self.host, f"/etc/kubernetes/manifests/{component}.yaml"):
                raise Fail(
                    "[ERROR StaticPodManifest]: The control plane seems to be Static Pod-hosted, but some of the "
                    "manifests don't seem to exist on disk."
                )

    def manifest_tag(self, component: str) -> str:
        path = self.root / f"etc/kubernetes/manifests/{component}.yaml"
        match = re.search(r"^\s*image:\s*\S+:(\S+)", path.read_text(), re.M) if path.exists() else None
        return match.group(1) if match else ""

    def static_pod_upgrade(self, version: str) -> None:
        stamp = time.strftime("%Y-%m-%d-%H-%M-%S")
        backup = self.root / f"etc/kubernetes/tmp/kubeadm-backup-manifests-{stamp}"
        moved: list[str] = []
        for component in ("etcd", *(m.removesuffix(".yaml") for m in CONTROL_PLANE_MANIFESTS)):
            tag = etcd_image_tag(version) if component == "etcd" else version
            if self.manifest_tag(component) == tag:
                print(f"[upgrade/staticpods] Current and new manifests of {component} are equal, skipping upgrade")
                continue
            manifest = self.root / f"etc/kubernetes/manifests/{component}.yaml"
            backup.mkdir(parents=True, exist_ok=True)
            shutil.copy2(manifest, backup / manifest.name)
            moved.append(component)
            self.write_manifest(component, {"kubernetesVersion": version})
            print(f'[upgrade/staticpods] Moved new manifest to "/etc/kubernetes/manifests/{component}.yaml"')
            if not self.c.wait(lambda c=component, t=tag: self.component_back(c, t), 300.0):
                for name in moved:
                    shutil.copy2(backup / f"{name}.yaml", self.root / f"etc/kubernetes/manifests/{name}.yaml")
                raise Fail(
                    "[upgrade/apply] FATAL: couldn't upgrade control plane. kubeadm has tried to recover everything "
                    f"into the earlier state. Errors faced: static Pod hash for component {component} on Node "
                    f"{self.host} did not change after 5m0s: timed out waiting for the condition"
                )
            print(f'[upgrade/staticpods] Component "{component}" upgraded successfully!')
        admin = self.root / "etc/kubernetes/admin.conf"
        if admin.exists():
            server = re.search(r"server:\s*(\S+)", admin.read_text()).group(1)
            write(self.root, "/etc/kubernetes/admin.conf", kubeconfig_text(self.c, server, "kubernetes-admin"))
            print("[upgrade/staticpods] Renewing admin.conf certificate")

    def upgrade(self) -> None:
        verb = self.args[1] if len(self.args) > 1 else ""
        positional = [a for a in self.args[2:] if not a.startswith("-")]
        force = "--force" in self.args or "-f" in self.args
        yes = "--yes" in self.args or "-y" in self.args
        if verb in ("plan", "apply"):
            self.require_api(f"upgrade/{verb}")
            current, mine = self.cluster_version(), self.own_version()
            target = positional[0] if positional else mine
            print("[upgrade/preflight] Running preflight checks\n[upgrade] Running cluster health checks")
            self.upgrade_health_checks()
            print(f"[upgrade/versions] Cluster version: {current}\n[upgrade/versions] kubeadm version: {mine}")
            if verb == "plan":
                print(f"COMPONENT   NODE   CURRENT   TARGET\nkube-apiserver   {self.host}   {current}   {target}\n")
                print("API GROUP                 CURRENT VERSION   PREFERRED VERSION   MANUAL UPGRADE REQUIRED")
                print("kubeproxy.config.k8s.io   v1alpha1          v1alpha1            no")
                print("kubelet.config.k8s.io     v1beta1           v1beta1             no\n")
                return
            minor = lambda v: int(v.lstrip("v").split(".")[1])  # noqa: E731
            if minor(target) > minor(current) + 1:
                raise Fail(
                    f'[upgrade/preflight] FATAL: Specified version to upgrade to "{target}" is too high; kubeadm can '
                    "upgrade only 1 minor version at a time"
                )
            if minor(target) > minor(mine):
                raise Fail(
                    f'[upgrade/preflight] FATAL: Specified version to upgrade to "{target}" is at least one minor '
                    "release higher than the kubeadm minor release. Such an upgrade is not supported"
                )
            if _older(mine, target) and not force:
                raise Fail(
                    f'[upgrade/preflight] FATAL: Specified version to upgrade to "{target}" is higher than the kubeadm '
                    f'version "{mine}". Upgrade kubeadm first using the tool you used to install kubeadm'
                )
            if not (yes or force):
                raise Fail("[upgrade] Are you sure you want to proceed? [y/N]: won't proceed; the user didn't answer")
            print(f'[upgrade/control-plane] Upgrading your static Pod-hosted control plane to version "{target}"')
            self.static_pod_upgrade(target)
            self.die_after("upgrade", "control-plane")
            stored = self.c.get("configmap/kube-system/kubeadm-config") or {}
            cluster_cfg = {**stored.get("cluster_configuration", {}), "kubernetesVersion": target}
            self.c.put(
                "configmap/kube-system/kubeadm-config", {"version": target, "cluster_configuration": cluster_cfg}
            )
            print('[upgrade/upload-config] Storing the configuration used in ConfigMap "kubeadm-config"')
            write(self.root, "/var/lib/kubelet/config.yaml", f"kind: KubeletConfiguration # {target}\n")
            print(f'[upgrade] SUCCESS! A control plane node of your cluster was upgraded to "{target}".')
        elif verb == "node":
            self.require_api("upgrade/node")
            version = self.cluster_version()
            print("[upgrade/preflight] Running pre-flight checks")
            if self.c.has(self.host, "/etc/kubernetes/manifests/kube-apiserver.yaml"):
                print(f'[upgrade/control-plane] Upgrading your Static Pod-hosted control plane instance to "{version}"')
                self.static_pod_upgrade(version)
            else:
                print("[upgrade/control-plane] Skipping phase. Not a control plane node.")
            write(self.root, "/var/lib/kubelet/config.yaml", f"kind: KubeletConfiguration # {version}\n")
            print("[upgrade] The upgrade for this node was successfully completed!")
        else:
            raise Fail(f"unmodelled: kubeadm upgrade {verb}")

    def run(self) -> None:
        verb = self.args[0] if self.args else ""
        if verb == "upgrade":
            self.upgrade()
        elif verb == "config" and self.args[1:3] == ["images", "list"]:
            print("\n".join(images_for(flag(self.args, "--kubernetes-version") or KUBELET_VERSION)))
        elif verb == "init" and len(self.args) > 1 and self.args[1] == "phase":
            self.phase()
        elif verb == "init":
            self.init()
        elif verb == "join":
            self.join()
        elif verb == "reset":
            self.reset()
        elif verb == "token":
            self.token()
        elif verb == "certs":
            self.certs()
        else:
            raise Fail(f"unmodelled: kubeadm {' '.join(self.args)}")


# ---------------------------------------------------------------------------------------- workloads
# What kube-controller-manager, kube-scheduler and the kubelets do with a Deployment's pods, as the
# failure drills watch them (components/tools/drills). The model's controllers run when asked, on
# the store's clock (`Cluster.kube_clock`): `run_controllers` runs whenever a stand-in command reads
# the store under its lock, and replays in time order what the real controllers would have done
# since it last ran, so what a command observes is the real timeline, not the moment it asked:
#
# - the node lifecycle controller (pkg/controller/nodelifecycle/node_lifecycle_controller.go): a
#   Node whose kubelet stopped posting for the grace period gets Ready=Unknown, the taints
#   node.kubernetes.io/unreachable:NoSchedule (doNoScheduleTaintingPass, TaintNodesByCondition) and
#   :NoExecute with its timeAdded (doNoExecuteTaintingPass), and its pods Ready=False at once
#   (controllerutil.MarkPodsNotReady); a kubelet that reports NotReady gives not-ready instead of
#   unreachable. Back to Ready, the taints go; nothing moves back. Zone disruption states (no
#   eviction when most nodes of a zone are down) are not modelled;
# - the taint eviction controller (pkg/controller/tainteviction/taint_eviction.go processPodOnNode):
#   a pod on a NoExecute-tainted node is deleted at once unless it tolerates every such taint, else
#   when the shortest tolerationSeconds of the tolerations used has passed since the taint (or the
#   pod's binding, if later). The DefaultTolerationSeconds admission plugin gives every pod 300 s
#   for unreachable and not-ready unless it says otherwise (the drill's say 30 s);
# - the Deployment and ReplicaSet controllers (pkg/controller/deployment, pkg/controller/replicaset
#   manageReplicas): one ReplicaSet per pod template, named <deployment>-<pod-template-hash>; pods
#   <replicaset>-<5 random characters> (utilrand.String over apimachinery's alphanumerics) created
#   as soon as fewer than `replicas` are active (a pod being deleted is not), the surplus deleted
#   (unscheduled, then not started, then not ready first: controller.ActivePods). A changed
#   template replaces every old pod at once: rolling update bounds (maxSurge/maxUnavailable) are
#   not modelled. A deleted Deployment's pods go with it (the garbage collector, background
#   propagation); pods bound to a Node that is gone are deleted (pkg/controller/podgc gcOrphaned);
# - the scheduler (pkg/scheduler): a pod goes to a Node that is Ready, not cordoned, and whose
#   NoSchedule and NoExecute taints it tolerates (plugins/tainttoleration, nodeunschedulable); among
#   those, PodTopologySpread's score (whenUnsatisfiable ScheduleAnyway is a preference) picks the
#   node with the fewest pods of the constraint's selector, ties by name (the real one picks at
#   random among equal scores);
# - the kubelet: a pod bound to a node whose kubelet runs starts CONTAINER_START_S later (image
#   present: sandbox and container) and is Ready one readiness probe period after that (the prober
#   probes once per periodSeconds from the container's start: pkg/kubelet/prober/worker.go), or at
#   once without a probe; a deleted pod on a live kubelet is gone at once (nginx exits on SIGTERM
#   long before terminationGracePeriodSeconds), on a dead one it stays Terminating. A node back
#   from NotReady restarts its pods' containers (a power-off killed them).
#
# Not modelled: resources, affinity, PodDisruptionBudgets (the drain knobs `drain_exit` stand for a
# blocking one), DaemonSet pods (Flannel's, kube-proxy's: drain --ignore-daemonsets skips them).

CONTROL_PLANE_TAINT = "node-role.kubernetes.io/control-plane"  # kubeadm constants.ControlPlaneTaint
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
DEFAULT_TOLERATION_S = 300  # plugin/pkg/admission/defaulttolerationseconds
CONTAINER_START_S = 1.0  # pod sandbox and container started, the image already on the node
DEFAULT_PROBE_PERIOD_S = 10.0  # a probe's default periodSeconds
KUBELET_PORT = 10250  # the kubelet's API (exec, logs), which the API server dials
ALPHANUMS = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery/pkg/util/rand: no vowels, no 0 1 3


def safe_encode(text: str) -> str:
    """rand.SafeEncodeString: each byte as one of ALPHANUMS (the pod-template-hash's alphabet)."""
    return "".join(ALPHANUMS[byte % len(ALPHANUMS)] for byte in text.encode())


def template_hash(template: dict[str, Any]) -> str:
    """controller.ComputeHash: FNV-32a of the pod template, printed in decimal, SafeEncodeString'd.
    (The real one hashes the template's deep-print, the model its JSON: one template, one hash.)"""
    value = 0x811C9DC5
    for byte in json.dumps(template, sort_keys=True).encode():
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return safe_encode(str(value))


def rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> list[dict[str, Any]]:
    """The tolerations that tolerate `taint` (k8s.io/api core/v1 Toleration.ToleratesTaint)."""
    found = []
    for tol in tolerations:
        if tol.get("effect") and tol["effect"] != taint["effect"]:
            continue
        if tol.get("key") and tol["key"] != taint["key"]:
            continue
        operator = tol.get("operator") or "Equal"
        if operator == "Exists" or (operator == "Equal" and tol.get("value", "") == taint.get("value", "")):
            found.append(tol)
    return found


def with_default_tolerations(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod's tolerations after DefaultTolerationSeconds admission."""
    tolerations = list(spec.get("tolerations") or [])
    for key in (NOT_READY_TAINT, UNREACHABLE_TAINT):
        if not tolerates(tolerations, {"key": key, "effect": "NoExecute"}):
            tolerations.append(
                {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": DEFAULT_TOLERATION_S}
            )
    return tolerations


def selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector's matchLabels (matchExpressions are not modelled)."""
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def node_taints(c: Cluster, name: str) -> list[dict[str, Any]]:
    """The Node's taints: its own, the node lifecycle controller's, and unschedulable's for a
    cordoned node (TaintNodesByCondition)."""
    node = c.s["nodes"].get(name) or {}
    taints = [dict(t) for t in node.get("taints") or []]
    if node.get("unschedulable") and not any(t["key"] == UNSCHEDULABLE_TAINT for t in taints):
        taints.append({"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"})
    return taints


def node_condition(c: Cluster, name: str) -> str:
    """The Ready condition as the node lifecycle controller last set it ("True" before it has seen
    the node: a Node starts with the kubelet's own report)."""
    return str((c.s["nodes"].get(name, {}).get("condition") or {}).get("status", "True"))


def set_node_condition(c: Cluster, name: str, status: str, t: float) -> None:
    """The node lifecycle controller sees the Node's Ready condition change to `status` at `t`."""
    node = c.s["nodes"][name]
    node["condition"] = {"status": status, "since": t}
    taints = [x for x in node.get("taints") or [] if x["key"] not in (UNREACHABLE_TAINT, NOT_READY_TAINT)]
    if status != "True":
        key = UNREACHABLE_TAINT if status == "Unknown" else NOT_READY_TAINT
        taints += [{"key": key, "effect": "NoSchedule"}, {"key": key, "effect": "NoExecute", "timeAdded": t}]
    node["taints"] = taints
    for key, pod in list(c.s["pods"].items()):
        if pod["node"] != name:
            continue
        if status != "True":
            pod["ready"] = None  # MarkPodsNotReady
        elif pod["deleted"] is not None:
            del c.s["pods"][key]  # the kubelet is back: it kills the container and confirms the deletion
        elif pod["started"] is not None:
            # The node was down: its kubelet restarts the pod's containers.
            pod["restarts"] = int(pod.get("restarts", 0)) + 1
            pod["ready"] = t + CONTAINER_START_S + probe_period(pod)


def node_transitions(c: Cluster, since: float, now: float) -> list[tuple[float, str, str]]:
    """When each Node's Ready condition changed in (since, now], as the node lifecycle controller
    saw it: NotReady (Unknown) the grace period after the last status its kubelet posted, Ready
    again with the first status of its new run of reports (`posting_since`). A Node that went down
    and came back between two evaluations is not seen (commands come every few seconds in a drill)."""
    changes = []
    for name, node in c.s["nodes"].items():
        status = c.node_status(name)
        if node.get("condition") is None:
            set_node_condition(c, name, status, since)
            continue
        if node["condition"]["status"] == status:
            continue
        if status == "Unknown" and node.get("heartbeat") is not None:
            at = float(node["heartbeat"]) + c.node_grace()
        elif status == "True":
            at = float(node.get("posting_since") or since)
        else:
            at = since
        changes.append((min(max(at, since), now), name, status))
    return sorted(changes)


def probe_period(pod: dict[str, Any]) -> float:
    """Seconds from a container's start to the pod's Ready: one readiness probe period, none without a probe."""
    periods = [
        float((container.get("readinessProbe") or {}).get("periodSeconds", DEFAULT_PROBE_PERIOD_S))
        for container in pod["spec"].get("containers") or []
        if container.get("readinessProbe")
    ]
    return max(periods, default=0.0)


def eviction_time(c: Cluster, pod: dict[str, Any]) -> float | None:
    """When the taint eviction controller deletes `pod`, given its node's NoExecute taints (None: never)."""
    if pod["node"] is None or pod["deleted"] is not None:
        return None
    due = None
    tolerations = pod["spec"].get("tolerations") or []
    for taint in node_taints(c, pod["node"]):
        if taint["effect"] != "NoExecute":
            continue
        start = max(float(taint.get("timeAdded", pod["bound"])), float(pod["bound"]))
        used = tolerates(tolerations, taint)
        if not used:
            return start
        seconds = [float(t["tolerationSeconds"]) for t in used if t.get("tolerationSeconds") is not None]
        if len(seconds) < len(used):
            continue  # a toleration without tolerationSeconds: tolerated for ever
        at = start + max(0.0, min(seconds))
        due = at if due is None else min(due, at)
    return due


def schedulable(c: Cluster, name: str, pod: dict[str, Any]) -> bool:
    """The scheduler's filters: NodeUnschedulable, TaintToleration (NoSchedule and NoExecute), and a
    Ready Node (its not-ready/unreachable NoSchedule taints say so)."""
    tolerations = pod["spec"].get("tolerations") or []
    if node_condition(c, name) != "True":
        return False
    return all(
        tolerates(tolerations, taint)
        for taint in node_taints(c, name)
        if taint["effect"] in ("NoSchedule", "NoExecute")
    )


def schedule(c: Cluster, t: float) -> None:
    """Bind each pending pod, oldest first (the scheduling queue), to the best feasible Node."""
    pending = sorted(
        (p for p in c.s["pods"].values() if p["node"] is None and p["deleted"] is None), key=lambda p: p["created"]
    )
    for pod in pending:
        feasible = [n for n in sorted(c.s["nodes"]) if schedulable(c, n, pod)]
        if not feasible:
            pod["unschedulable"] = f"0/{len(c.s['nodes'])} nodes are available"
            continue
        constraints = pod["spec"].get("topologySpreadConstraints") or [{}]
        selector = constraints[0].get("labelSelector") or {"matchLabels": pod["labels"]}

        def skew(node: str, selector: dict[str, Any] = selector) -> int:
            return sum(
                1
                for other in c.s["pods"].values()
                if other["node"] == node and other["deleted"] is None and selector_matches(selector, other["labels"])
            )

        pod["node"] = min(feasible, key=lambda n: (skew(n), n))
        pod["bound"] = t
        pod.pop("unschedulable", None)


def new_pod(c: Cluster, deployment: str, manifest: dict[str, Any], replicaset: str, t: float) -> None:
    template = manifest["spec"]["template"]
    labels = {**(template.get("metadata", {}).get("labels") or {}), "pod-template-hash": replicaset.rsplit("-", 1)[1]}
    namespace = deployment.split("/")[1]
    while True:
        name = f"{replicaset}-{''.join(secrets.choice(ALPHANUMS) for _ in range(5))}"
        if f"{namespace}/{name}" not in c.s["pods"]:
            break
    spec = json.loads(json.dumps(template.get("spec") or {}))
    spec["tolerations"] = with_default_tolerations(spec)
    c.s["pods"][f"{namespace}/{name}"] = {
        "name": name,
        "namespace": namespace,
        "uid": secrets.token_hex(16),
        "deployment": deployment,
        "replicaset": replicaset,
        "labels": labels,
        "spec": spec,
        "created": t,
        "node": None,
        "bound": None,
        "started": None,
        "ready": None,
        "restarts": 0,
        "deleted": None,
    }


def active_rank(pod: dict[str, Any], now: float) -> tuple[int, int, int, float]:
    """controller.ActivePods' order, the first deleted first: unscheduled, not started, not ready, newest."""
    started = pod["started"] is not None and pod["started"] <= now
    ready = pod["ready"] is not None and pod["ready"] <= now
    return (pod["node"] is not None, started, ready, -float(pod["created"]))


def manage_replicas(c: Cluster, t: float) -> None:
    """The Deployment and ReplicaSet controllers, and the garbage collector for a deleted Deployment."""
    deployments = {k: v for k, v in c.s["objects"].items() if k.startswith("deployment/") and v.get("manifest")}
    for pod in c.s["pods"].values():
        if pod["deleted"] is None and pod["deployment"] not in deployments:
            pod["deleted"] = t
    for key, deployment in sorted(deployments.items()):
        manifest = deployment["manifest"]
        replicaset = f"{key.split('/')[2]}-{template_hash(manifest['spec']['template'])}"
        owned = [p for p in c.s["pods"].values() if p["deployment"] == key and p["deleted"] is None]
        for pod in owned:
            if pod["replicaset"] != replicaset:
                pod["deleted"] = t
        active = sorted((p for p in owned if p["replicaset"] == replicaset), key=lambda p: active_rank(p, t))
        wanted = int(manifest["spec"].get("replicas", 1))
        for pod in active[: max(0, len(active) - wanted)]:
            pod["deleted"] = t
        for _ in range(wanted - len(active)):
            new_pod(c, key, manifest, replicaset, t)


def reconcile(c: Cluster, t: float) -> None:
    """Every controller once, at `t`."""
    for key, pod in list(c.s["pods"].items()):
        if pod["node"] is not None and pod["node"] not in c.s["nodes"]:
            del c.s["pods"][key]  # PodGC: its Node is gone
            continue
        due = eviction_time(c, pod)
        if due is not None and due <= t:
            pod["deleted"] = due
        if pod["deleted"] is not None and (
            pod["node"] is None or (node_condition(c, pod["node"]) == "True" and c.kubelet_posting(pod["node"]))
        ):
            del c.s["pods"][key]  # terminated by a live kubelet, or never scheduled
    manage_replicas(c, t)
    schedule(c, t)


def run_controllers(c: Cluster) -> None:
    """Replay the controllers from their last run to now (the section's comment)."""
    now = c.kube_clock()
    state = c.s.setdefault("controllers", {})
    c.s.setdefault("pods", {})
    t = min(float(state.get("at", now)), now)
    changes = node_transitions(c, t, now)
    while True:
        reconcile(c, t)
        evictions = [e for e in (eviction_time(c, p) for p in c.s["pods"].values()) if e is not None]
        upcoming = [at for at in [*(ch[0] for ch in changes), *evictions] if at > t]
        due = [ch for ch in changes if ch[0] <= t]
        if due:
            for at, name, status in due:
                if name in c.s["nodes"]:
                    set_node_condition(c, name, status, at)
            changes = [ch for ch in changes if ch[0] > t]
            continue
        if not upcoming or min(upcoming) > now:
            break
        t = min(upcoming)
    # The kubelets start what was bound to them, once they run.
    for pod in c.s["pods"].values():
        if pod["node"] is None or pod["deleted"] is not None or pod["started"] is not None:
            continue
        if node_condition(c, pod["node"]) == "True" and c.kubelet_posting(pod["node"]):
            back = float(c.s["nodes"][pod["node"]].get("posting_since") or pod["bound"])
            started = max(float(pod["bound"]), back) + CONTAINER_START_S
            pod["started"], pod["ready"] = started, started + probe_period(pod)
    state["at"] = now


# What the API returns for these objects.


def node_view(c: Cluster, name: str) -> dict[str, Any]:
    """The v1 Node as the API returns it (what the scripts and the drills read of it)."""
    node = c.s["nodes"][name]
    status = c.node_status(name)
    condition: dict[str, Any] = {"type": "Ready", "status": status}
    since = (node.get("condition") or {}).get("since")
    if since is not None:
        condition["lastTransitionTime"] = rfc3339(float(since))
    if node.get("heartbeat") is not None:
        condition["lastHeartbeatTime"] = rfc3339(float(node["heartbeat"]))
    condition.update(
        {
            "True": {"reason": "KubeletReady", "message": "kubelet is posting ready status"},
            "False": {
                "reason": "KubeletNotReady",
                "message": "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady "
                "message:Network plugin returns error: cni plugin not initialized",
            },
            "Unknown": {"reason": "NodeStatusUnknown", "message": "Kubelet stopped posting node status."},
        }[status]
    )
    spec: dict[str, Any] = {}
    taints = [
        {k: (rfc3339(float(v)) if k == "timeAdded" else v) for k, v in taint.items()} for taint in node_taints(c, name)
    ]
    if taints:
        spec["taints"] = taints
    if node.get("unschedulable"):
        spec["unschedulable"] = True
    ip = (c.s["hosts"].get(name) or {}).get("ip")
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **(node.get("labels") or {})},
            "annotations": node.get("annotations", {}),
        },
        "spec": spec,
        "status": {
            "conditions": [condition],
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}]
            if ip
            else [{"type": "Hostname", "address": name}],
            "nodeInfo": c.node_info(name),
        },
    }


def pod_view(c: Cluster, pod: dict[str, Any]) -> dict[str, Any]:
    """A workload pod as the API returns it."""
    now = c.kube_clock()
    started = pod["started"] is not None and pod["started"] <= now
    ready = pod["ready"] is not None and pod["ready"] <= now
    metadata: dict[str, Any] = {
        "name": pod["name"],
        "generateName": pod["replicaset"] + "-",
        "namespace": pod["namespace"],
        "uid": pod["uid"],
        "labels": pod["labels"],
        "creationTimestamp": rfc3339(pod["created"]),
        "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": pod["replicaset"], "controller": True,
             "blockOwnerDeletion": True}
        ],
    }  # fmt: skip
    if pod["deleted"] is not None:
        metadata["deletionTimestamp"] = rfc3339(pod["deleted"])
        metadata["deletionGracePeriodSeconds"] = int(pod["spec"].get("terminationGracePeriodSeconds", 30))
    spec = {**pod["spec"], "schedulerName": "default-scheduler"}
    conditions: list[dict[str, Any]] = []
    status: dict[str, Any] = {
        "phase": "Running" if started else "Pending",
        "conditions": conditions,
        "qosClass": "Burstable",
    }
    if pod["node"] is None:
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": pod.get("unschedulable", ""),
            }
        )
        return {"metadata": metadata, "spec": spec, "status": status}
    spec["nodeName"] = pod["node"]
    flag_ = "True" if ready else "False"
    conditions += [
        {"type": "PodReadyToStartContainers", "status": "True" if started else "False"},
        {"type": "Initialized", "status": "True"},
        {"type": "Ready", "status": flag_},
        {"type": "ContainersReady", "status": flag_},
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": rfc3339(pod["bound"])},
    ]
    host_ip = (c.s["hosts"].get(pod["node"]) or {}).get("ip")
    if host_ip:
        status["hostIP"] = host_ip
    if started:
        status["startTime"] = rfc3339(pod["started"] - CONTAINER_START_S)
        status["containerStatuses"] = [
            {"name": ct["name"], "image": ct.get("image", ""), "ready": ready, "started": True,
             "restartCount": int(pod.get("restarts", 0)), "state": {"running": {"startedAt": rfc3339(pod["started"])}}}
            for ct in pod["spec"].get("containers") or []
        ]  # fmt: skip
    return {"metadata": metadata, "spec": spec, "status": status}


def deployment_status(c: Cluster, key: str) -> dict[str, Any]:
    manifest = c.s["objects"][key]["manifest"]
    now = c.kube_clock()
    pods = [p for p in c.s["pods"].values() if p["deployment"] == key and p["deleted"] is None]
    ready = [p for p in pods if p["ready"] is not None and p["ready"] <= now]
    wanted = int(manifest["spec"].get("replicas", 1))
    available = "True" if len(ready) >= wanted else "False"
    return {
        "observedGeneration": int(c.s["objects"][key].get("generation", 1)),
        "replicas": len(pods),
        "updatedReplicas": len(pods),
        "readyReplicas": len(ready),
        "availableReplicas": len(ready),
        "conditions": [{"type": "Available", "status": available}],
    }


# ---------------------------------------------------------------------------------------- etcdctl


ETCD_CLUSTER_ID = 17237436991929493444


def go_duration(seconds: float) -> str:
    """Go's time.Duration.String() ("9.412ms", "5.000873s", "2m0s")."""
    if seconds < 1:
        return f"{seconds * 1000:.6f}".rstrip("0").rstrip(".") + "ms"
    hours, rest = divmod(seconds, 3600)
    minutes, rest = divmod(rest, 60)
    text = f"{rest:.9f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{int(hours)}h{int(minutes)}m{text}"
    return f"{int(minutes)}m{text}" if minutes else text


def go_json(value: Any) -> str:
    """encoding/json.Marshal's layout: no spaces."""
    return json.dumps(value, separators=(",", ":"))


def etcd_raft(c: Cluster) -> tuple[int, int]:
    """The leader's member ID and the raft term. A leader keeps the lead while it runs; when it is
    lost and a quorum of voting members runs, one of them wins an election in a new term (the old
    leader, back, is a follower); without a quorum there is no leader (0)."""
    raft = c.s.setdefault("etcd_raft", {"leader": 0, "term": 1})
    running = [m for m in c.voting() if c.running_member(m)]
    if raft["leader"] not in {m["id"] for m in running}:
        if running and len(running) >= len(c.voting()) // 2 + 1:
            raft["leader"] = min(m["id"] for m in running)
            raft["term"] += 1
        else:
            raft["leader"] = 0
    return int(raft["leader"]), int(raft["term"])


def etcd_version(c: Cluster) -> str:
    """The etcd release kubeadm deploys for the cluster's version (3.6.6 for 1.34+, 3.5.x before)."""
    stored = (c.get("configmap/kube-system/kubeadm-config") or {}).get("version") or KUBELET_VERSION
    return etcd_image_tag(str(stored)).split("-")[0]


def etcdctl(cluster: Cluster, on_host: str, args: list[str]) -> None:
    """etcdctl (v3.5/v3.6, etcdctl/ctlv3/command) run inside the etcd container of `on_host` (kubectl
    exec or crictl exec), against that member's client URL. `-w json` prints what printer_json.go
    prints: encoding/json of the gRPC responses (MemberListResponse; []epHealth; []epStatus of
    StatusResponse), 64-bit IDs as JSON integers (no --hex), omitempty fields left out. With
    --cluster the endpoints are the members' client URLs (endpointsFromCluster): a member that does
    not answer costs --command-timeout and is reported as etcdctl reports it (ep_command.go): health
    lists it with health false and exits 1 ("Error: unhealthy cluster"), status leaves it out, says
    "Failed to get the status of endpoint" on stderr and exits 1."""
    c = cluster
    if not c.etcd_running(on_host):
        raise Fail(f'error: unable to upgrade connection: container not found ("etcd" on {on_host})')
    words = [a for a in args if not a.startswith("--")]
    if not c.etcd_quorum():
        raise Fail("Error: context deadline exceeded")
    json_out = (flag(args, "-w") or flag(args, "--write-out")) == "json"
    timeout = parse_duration(flag(args, "--command-timeout") or "5s") or 5.0
    named = [m for m in c.s["members"] if m["name"]]  # started members: the ones with client URLs

    def client_url(member: dict[str, Any]) -> str:
        return str(member["peer"]).replace(":2380", ":2379")

    if words[:2] == ["member", "list"] and json_out:
        leader_term = etcd_raft(c)[1]
        own = c.member_of(on_host) or {}
        members = []
        for m in c.s["members"]:
            entry: dict[str, Any] = {"ID": m["id"]}
            if m["name"]:
                entry["name"] = m["name"]
            entry["peerURLs"] = [m["peer"]]
            if m["name"]:
                entry["clientURLs"] = [client_url(m)]
            if m["learner"]:
                entry["isLearner"] = True
            members.append(entry)
        header = {"cluster_id": ETCD_CLUSTER_ID, "member_id": own.get("id", 0), "raft_term": leader_term}
        print(go_json({"header": header, "members": members}))
    elif words[:2] == ["member", "list"]:
        # etcdctl printer_simple.go MemberList: ID, status, name, peer URLs, client URLs, is learner.
        for m in c.s["members"]:
            client = client_url(m) if m["name"] else ""
            status = "started" if m["name"] else "unstarted"
            print(f"{m['id']:x}, {status}, {m['name']}, {m['peer']}, {client}, {str(m['learner']).lower()}")
    elif words[:2] == ["member", "remove"]:
        member_id = int(words[2], 16)
        member = next((m for m in c.s["members"] if m["id"] == member_id), None)
        if member is None:
            raise Fail(f"Error: etcdserver: member not found ({words[2]})")
        remaining = [m for m in c.voting() if m is not member]
        started = [m for m in remaining if c.running_member(m)]
        # --strict-reconfig-check (default on): the removal must leave a quorum of started members.
        if remaining and len(started) < len(remaining) // 2 + 1:
            raise Fail("Error: etcdserver: re-configuration failed due to not enough started members")
        c.s["members"].remove(member)
        print(f"Member {member_id:x} removed from cluster 1c7c1f3c2d5b4a6e")
    elif words[:2] == ["endpoint", "status"]:
        if c.s.get("status_override"):
            print(c.s["status_override"])
            return
        leader, term = etcd_raft(c)
        version = etcd_version(c)
        statuses, failed = [], []
        for m in named:
            if not c.running_member(m):
                failed.append(client_url(m))
                continue
            answer: dict[str, Any] = {
                "header": {"cluster_id": ETCD_CLUSTER_ID, "member_id": m["id"], "revision": 4821, "raft_term": term},
                "version": version,
                "dbSize": 5644288,
                "leader": leader,
                "raftIndex": 6310 + term,
                "raftTerm": term,
                "raftAppliedIndex": 6310 + term,
                "dbSizeInUse": 2752512,
            }
            if m["learner"]:
                answer["isLearner"] = True
            if not version.startswith("3.5"):
                answer.update(storageVersion="3.6.0", dbSizeQuota=2147483648)
            statuses.append({"Endpoint": client_url(m), "Status": answer})
        for _ in failed:
            c.elapse(timeout)  # one endpoint after the other
        if not json_out:
            raise Fail("unmodelled: endpoint status without -w json")
        print(go_json(statuses))
        if failed:
            lines = [f"Failed to get the status of endpoint {ep} (context deadline exceeded)" for ep in failed]
            raise Fail("\n".join(lines))
    elif words[:2] == ["snapshot", "save"]:
        # client/v3/snapshot/v3_snapshot.go SaveWithVersion: exactly one endpoint; <path>.part,
        # renamed once the whole snapshot and its trailing sha256 are in (hasChecksum: 32 bytes past
        # a multiple of 512). The pod's /var/lib/etcd is its node's (kubeadm's etcd-data hostPath).
        endpoints = (flag(args, "--endpoints") or "").split(",")
        if len(endpoints) != 1:
            raise Fail(f"Error: snapshot must be requested to one selected node, not multiple {endpoints}")
        target = c.root(on_host) / words[2].lstrip("/")
        if not target.parent.is_dir():
            raise Fail(f"Error: could not open {words[2]}.part (open {words[2]}.part: no such file or directory)")
        part = target.with_name(target.name + ".part")
        part.write_bytes(bytes(4096) + hashlib.sha256(bytes(4096)).digest())
        part.rename(target)
        print(f"Snapshot saved at {words[2]}")
    elif words[:2] == ["endpoint", "health"]:
        health = []
        for m in named:
            ok = c.running_member(m)
            checked: dict[str, Any] = {"endpoint": client_url(m), "health": ok}
            checked["took"] = go_duration(0.009412 if ok else timeout + 0.000873)
            if not ok:
                checked["error"] = "context deadline exceeded"
            health.append(checked)
        if not all(h["health"] for h in health):
            c.elapse(timeout)  # the endpoints are checked in parallel: one timeout
        print(go_json(health))
        if not all(h["health"] for h in health):
            raise Fail("Error: unhealthy cluster")
    else:
        raise Fail(f"unmodelled: etcdctl {' '.join(args)}")


# ---------------------------------------------------------------------------------------- kubectl


def check_client_files(c: Cluster, local: str, kubeconfig: str) -> None:
    """kubectl validates the kubeconfig before it dials (client-go clientcmd validation.go
    validateAuthInfo): a client-certificate or client-key file it cannot read is "Error in
    configuration", exit 1, no connection attempted; what the real kubectl prints is checked
    against this in tests/test_k8s_convergence.py."""
    text = Path(kubeconfig).read_text()
    problems = []
    for key, what in (("client-certificate", "client-cert"), ("client-key", "client-key")):
        match = re.search(rf"^\s*{key}:\s*(\S+)", text, re.M)
        if match and not (c.root(local) / match.group(1).lstrip("/")).is_file():
            path = match.group(1)
            problems.append(
                f"* unable to read {what} {path} for default-auth due to open {path}: no such file or directory"
            )
    if problems:
        raise Fail("Error in configuration: \n" + "\n".join(problems))


def wait_out_blocked_evictions(c: Cluster, node: str, timeout: float) -> None:
    """A PodDisruptionBudget that allows no disruption covers a pod on `node` (`pdb_blocks`, a
    test's plan): kubectl drain retries each refused eviction (429) every 5 s until its --timeout,
    then fails (k8s.io/kubectl/pkg/drain drain.go evictPods: "global timeout reached"). When the
    eviction is first refused, `evictions_refused[node]` records the time (what a test waits for).
    A budget lifted meanwhile lets the drain finish. (No --timeout: kubectl waits for ever; the
    model, for a day.)"""
    c.s.setdefault("evictions_refused", {})[node] = c.now
    if not c.wait(lambda: node not in c.s.get("pdb_blocks", []), timeout or 86400.0):
        raise Fail(
            f'error when evicting pods/"held-{node}" -n "default" (will retry after 5s): Cannot evict pod as it '
            f'would violate the pod\'s disruption budget.\nThere are pending pods in node "{node}" when an error '
            f"occurred: global timeout reached: {timeout:g}s",
            1,
        )


# kubectl's flags that take a value: the value is not a positional word.
KUBECTL_VALUE_FLAGS = (
    "-n", "--namespace", "--kubeconfig", "-o", "--output", "-c", "--container", "-l", "--selector",
    "--request-timeout", "--timeout", "--grace-period", "--from-literal", "-f", "--filename", "--server", "-s",
    "--raw", "--field-selector",
)  # fmt: skip
KUBECTL_KINDS = {
    "nodes": "node", "no": "node", "pods": "pod", "po": "pod", "configmaps": "configmap", "cm": "configmap",
    "deployments": "deployment", "deploy": "deployment", "deployment.apps": "deployment",
    "daemonsets": "daemonset", "ds": "daemonset", "daemonset.apps": "daemonset",
}  # fmt: skip
HEALTH_PATHS = ("/readyz", "/livez", "/healthz")


def parse_selector(text: str) -> Callable[[dict[str, str]], bool]:
    """An equality-based label selector (k8s.io/apimachinery/pkg/labels Parse): a=b, a==b, a!=b,
    a, !a, comma-separated (set-based ones are not modelled)."""
    wanted: list[tuple[str, str, str]] = []  # (key, operator, value)
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "!=" in part:
            key, value = part.split("!=", 1)
            wanted.append((key, "!=", value))
        elif "=" in part:
            key, value = part.replace("==", "=").split("=", 1)
            wanted.append((key, "=", value))
        elif part.startswith("!"):
            wanted.append((part[1:], "!", ""))
        else:
            wanted.append((part, "exists", ""))

    def matches(labels: dict[str, str]) -> bool:
        for key, operator, value in wanted:
            if operator == "=" and labels.get(key) != value:
                return False
            if operator == "!=" and labels.get(key) == value:
                return False
            if operator == "!" and key in labels:
                return False
            if operator == "exists" and key not in labels:
                return False
        return True

    return matches


def select_pods(c: Cluster, namespace: str | None, labels: str | None, fields: str | None) -> list[dict[str, Any]]:
    """The pods of `namespace` (None: every namespace) matching a label and a field selector
    (spec.nodeName=NODE is the one field selector modelled)."""
    items = [p for p in c.all_pods() if namespace is None or p["metadata"].get("namespace") == namespace]
    if labels:
        matches = parse_selector(labels)
        items = [p for p in items if matches(p["metadata"].get("labels") or {})]
    if fields:
        key, _, value = fields.partition("=")
        if key != "spec.nodeName":
            raise Fail(f"Error from server (BadRequest): field label not supported: {key}")
        items = [p for p in items if p["spec"].get("nodeName") == value]
    return items


def raw_get(c: Cluster, uri: str) -> str:
    """`kubectl get --raw URI`: the API's JSON for the paths the drills read (nodes, pods), "ok" for
    the health endpoints; an API error as kubectl prints it (exit 1)."""
    import urllib.parse

    path, _, query = uri.partition("?")
    params = {k: v[-1] for k, v in urllib.parse.parse_qs(query).items()}
    if path in HEALTH_PATHS:
        return "ok"
    parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/")]
    if parts[:2] == ["api", "v1"]:
        rest = parts[2:]
        if rest == ["nodes"]:
            items = [node_view(c, n) for n in sorted(c.s["nodes"])]
            return go_json({"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": items})
        if len(rest) == 2 and rest[0] == "nodes":
            if rest[1] not in c.s["nodes"]:
                raise Fail(f'Error from server (NotFound): nodes "{rest[1]}" not found')
            return go_json(node_view(c, rest[1]))
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if rest[:1] == ["pods"] and len(rest) <= 2:
            items = select_pods(c, namespace, params.get("labelSelector"), params.get("fieldSelector"))
            if len(rest) == 2:
                found = [p for p in items if p["metadata"]["name"] == rest[1]]
                if not found:
                    raise Fail(f'Error from server (NotFound): pods "{rest[1]}" not found')
                return go_json({"kind": "Pod", "apiVersion": "v1", **found[0]})
            return go_json({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})
    raise Fail("Error from server (NotFound): the server could not find the requested resource")


def read_manifests(args: list[str]) -> list[dict[str, Any]]:
    """The objects of `apply -f FILE` or `-f -` (stdin): JSON, or YAML documents; a List's items."""
    source = flag(args, "-f") or flag(args, "--filename")
    if source is None:
        raise Fail("error: must specify one of -f and -k")
    if source == "-":
        text = sys.stdin.read()
    else:
        try:
            text = Path(source).read_text()
        except OSError:
            raise Fail(f'error: the path "{source}" does not exist') from None
    try:
        documents = [json.loads(text)]
    except ValueError:
        import yaml

        try:
            documents = [d for d in yaml.safe_load_all(text) if d]
        except yaml.YAMLError as error:
            raise Fail(f"error: error parsing {source}: {error}") from None
    objects: list[dict[str, Any]] = []
    for document in documents:
        objects += document.get("items") or [] if document.get("kind") == "List" else [document]
    if not objects:
        raise Fail("error: no objects passed to apply")
    return objects


CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "Node", "PersistentVolume", "StorageClass"}


def apply(c: Cluster, args: list[str], namespace: str) -> None:
    """`kubectl apply -f`: create or update each object, printing `<resource>/<name> created |
    configured | unchanged` as kubectl does. A Deployment is the workloads model's (its controllers
    take it from there); Flannel's DaemonSet brings the pod network (the nodes' CNI), the rest is
    kept as it is."""
    for obj in read_manifests(args):
        kind = str(obj.get("kind", ""))
        name = str((obj.get("metadata") or {}).get("name", ""))
        if not kind or not name:
            raise Fail("error: error validating data: kind or metadata.name not set")
        group = str(obj.get("apiVersion", "v1")).rpartition("/")[0]
        resource = kind.lower() + (f".{group}" if group else "")
        ns = None if kind in CLUSTER_SCOPED else str(obj["metadata"].get("namespace") or namespace)
        key = f"{kind.lower()}/{ns}/{name}" if ns else f"{kind.lower()}/{name}"
        old = c.s["objects"].get(key)
        if old is not None and old.get("manifest") == obj:
            print(f"{resource}/{name} unchanged")
            continue
        generation = int((old or {}).get("generation", 0)) + 1
        c.s["objects"][key] = {**(old or {}), "manifest": obj, "generation": generation}
        if kind == "DaemonSet" and name == "kube-flannel-ds":
            c.s["cni"] = True  # flannel's pods write the CNI config on every node: NetworkReady
        print(f"{resource}/{name} {'configured' if old is not None else 'created'}")
    c.run_controllers()


def drain(c: Cluster, name: str, timeout_s: float) -> None:
    """kubectl drain's evictions (k8s.io/kubectl/pkg/drain): every pod on the node but mirror and
    DaemonSet pods is evicted, then drain waits for each to be gone, up to --timeout; a node whose
    kubelet is dead never confirms and the drain times out."""
    now = c.kube_clock()
    # Pods already terminating are evicted (and waited for) again (drain.go skipDeletedFilter skips
    # them only with --skip-wait-for-delete-timeout).
    evicted = sorted(k for k, p in c.s["pods"].items() if p["node"] == name)
    for key in evicted:
        print(f"evicting pod {key}")
        if c.s["pods"][key]["deleted"] is None:
            c.s["pods"][key]["deleted"] = now
    c.run_controllers()  # the kubelet stops them, the ReplicaSet controller replaces them
    if not c.wait(lambda: not any(k in c.s["pods"] for k in evicted), timeout_s or 86400.0):
        left = next(k for k in evicted if k in c.s["pods"])
        namespace, pod = left.split("/")
        raise Fail(
            f'There are pending nodes to be drained:\n {name}\nerror: unable to drain node "{name}" due to error: '
            f'error when waiting for pod "{pod}" in namespace "{namespace}" to terminate: global timeout reached: '
            f"{go_duration(timeout_s)}, continuing command..."
        )
    for key in evicted:
        print(f"pod/{key.split('/')[1]} evicted")


def kubectl(c: Cluster, local: str, args: list[str]) -> None:
    kubeconfig = flag(args, "--kubeconfig")
    if kubeconfig is None:
        raise Fail("error: this stand-in needs --kubeconfig")
    server = kubeconfig_server(kubeconfig)
    # --server overrides the kubeconfig's cluster server (clientcmd's ConfigOverrides).
    server = flag(args, "--server") or flag(args, "-s") or server
    check_client_files(c, local, kubeconfig)
    address = server.split("//")[1].split(":")[0]
    if not c.api_answers(address, local):
        raise Fail(
            f"The connection to the server {server.split('//')[1]} was refused - did you specify the right "
            "host or port?"
        )
    request_timeout = parse_duration(flag(args, "--request-timeout") or "0") or 30.0
    namespace = flag(args, "-n") or flag(args, "--namespace") or "default"
    if "--" in args:
        words, tail = args[: args.index("--")], args[args.index("--") + 1 :]
    else:
        words, tail = args, []
    words = [
        w for i, w in enumerate(words) if not w.startswith("-") and not (i > 0 and words[i - 1] in KUBECTL_VALUE_FLAGS)
    ]
    output = flag(args, "-o")
    verb = words[0]
    if verb == "get" and flag(args, "--raw") is not None:
        print(raw_get(c, str(flag(args, "--raw"))))
    elif verb == "exec":
        pod_name = words[1]
        pod = next(
            (p for p in c.all_pods() if p["metadata"]["name"] == pod_name and p["metadata"]["namespace"] == namespace),
            None,
        )
        if pod is None:
            raise Fail(f'Error from server (NotFound): pods "{pod_name}" not found')
        node = str(pod["spec"].get("nodeName", ""))
        # The API server opens the exec stream to the pod's kubelet (apimachinery util/proxy
        # UpgradeAwareHandler: "error dialing backend"): a dead node's kubelet does not answer.
        if not c.kubelet_answers(node, request_timeout):
            ip = (c.s["hosts"].get(node) or {}).get("ip", node)
            raise Fail(f"Error from server: error dialing backend: dial tcp {ip}:{KUBELET_PORT}: i/o timeout")
        if tail[:1] != ["etcdctl"] or not pod_name.startswith("etcd-"):
            raise Fail("unmodelled exec")
        etcdctl(c, node, tail[1:])
    elif verb == "get":
        kind, name = words[1], (words[2] if len(words) > 2 else None)
        kind = KUBECTL_KINDS.get(kind, kind)
        if kind == "node":
            items = [node_view(c, n) for n in sorted(c.s["nodes"])]
        elif kind == "pod":
            every = "-A" in args or "--all-namespaces" in args
            items = select_pods(c, None if every else namespace, flag(args, "-l"), flag(args, "--field-selector"))
        else:
            ns_part = "" if kind.startswith("cluster") or kind == "node" else f"{namespace}/"
            prefix = f"{kind}/{ns_part}"
            items = [
                {"metadata": {"name": k[len(prefix) :]}, **v} for k, v in c.s["objects"].items() if k.startswith(prefix)
            ]
            if kind == "deployment":
                for item in items:
                    if item.get("manifest"):
                        item["status"] = deployment_status(c, f"deployment/{namespace}/{item['metadata']['name']}")
                        continue
                    ready = any(c.node_ready(n) for n in c.s["nodes"])
                    item["status"] = {"conditions": [{"type": "Available", "status": "True" if ready else "False"}]}
        if name is not None:
            items = [i for i in items if i["metadata"]["name"] == name]
            if not items:
                if "--ignore-not-found" in args:
                    return
                raise Fail(f'Error from server (NotFound): {kind}s "{name}" not found')
        if output and output.startswith("jsonpath="):
            # The one JSONPath the scripts ask: the ClusterConfiguration of kubeadm-config
            # (upgrade-lib.sh cluster_version), as kubeadm stores it (YAML).
            if output != "jsonpath={.data.ClusterConfiguration}" or not items:
                raise Fail(f"unmodelled: kubectl -o {output}")
            print(f"kind: ClusterConfiguration\nkubernetesVersion: {items[0].get('version', '')}", end="")
        elif output == "name":
            for item in items:
                print(f"{kind}/{item['metadata']['name']}")
        elif output == "json":
            print(json.dumps(items[0] if name is not None else {"items": items}))
        else:
            for item in items:
                print(item["metadata"]["name"])
    elif verb in ("drain", "cordon"):
        name = words[1]
        if name not in c.s["nodes"]:
            raise Fail(f'Error from server (NotFound): nodes "{name}" not found')
        already = bool(c.s["nodes"][name].get("unschedulable"))
        c.s["nodes"][name]["unschedulable"] = True
        print(f"node/{name} {'already cordoned' if already else 'cordoned'}")
        if verb == "drain" and "--disable-eviction" not in args and name in c.s.get("pdb_blocks", []):
            wait_out_blocked_evictions(c, name, parse_duration(flag(args, "--timeout") or "0s"))
        if verb == "drain":
            code = c.s.get("drain_exit", {}).get("force" if "--disable-eviction" in args else "evict", 0)
            if code:
                raise Fail(
                    "error when evicting pods: Cannot evict pod as it would violate the pod's disruption budget", code
                )
            drain(c, name, parse_duration(flag(args, "--timeout") or "0"))
            print(f"node/{name} drained")
    elif verb == "uncordon":
        name = words[1]
        if name not in c.s["nodes"]:
            raise Fail(f'Error from server (NotFound): nodes "{name}" not found')
        already = not c.s["nodes"][name].get("unschedulable")
        c.s["nodes"][name]["unschedulable"] = False
        print(f"node/{name} {'already uncordoned' if already else 'uncordoned'}")
    elif verb == "annotate":
        # kubectl annotate: KEY=VALUE sets (an existing key only with --overwrite), KEY- removes.
        kind, name, change = words[1], words[2], words[3]
        if kind != "node" or name not in c.s["nodes"]:
            raise Fail(f'Error from server (NotFound): {kind}s "{name}" not found')
        annotations = c.s["nodes"][name].setdefault("annotations", {})
        if change.endswith("-"):
            annotations.pop(change[:-1], None)
        else:
            key, value = change.split("=", 1)
            if key in annotations and "--overwrite" not in args:
                raise Fail(
                    f"error: --overwrite is false but found the following declared annotation(s): "
                    f"'{key}' already has a value ({annotations[key]})"
                )
            annotations[key] = value
        print(f"node/{name} annotated")
    elif verb == "delete":
        kind, name = KUBECTL_KINDS.get(words[1], words[1]), words[2]
        if kind == "node":
            if c.s["nodes"].pop(name, None) is None and "--ignore-not-found" not in args:
                raise Fail(f'Error from server (NotFound): nodes "{name}" not found')
        else:
            key = f"{kind}/{namespace}/{name}"
            gone = c.s["objects"].pop(key, None)
            if gone is None and "--ignore-not-found" not in args:
                resource = f"{kind}s.apps" if kind in ("deployment", "daemonset") else f"{kind}s"
                raise Fail(f'Error from server (NotFound): {resource} "{name}" not found')
            if gone is not None and gone.get("manifest") and kind == "deployment":
                # Background propagation: the Deployment is gone at once (what kubectl waits for),
                # the garbage collector deletes its ReplicaSet's pods after it.
                print(f'deployment.apps "{name}" deleted')
                c.run_controllers()
    elif verb == "create":
        kind, name = words[1], words[2]
        key = f"{kind}/{namespace}/{name}"
        if key in c.s["objects"]:
            raise Fail(f'Error from server (AlreadyExists): {kind}s "{name}" already exists')
        c.put(key)
    elif verb == "apply":
        apply(c, args, namespace)
    elif verb == "rollout":
        code = c.s.get("rollout_exit", 0)
        if code:
            raise Fail("error: timed out waiting for the condition", code)
    else:
        raise Fail(f"unmodelled: kubectl {' '.join(args)}")


# ---------------------------------------------------------------------------------------- others


def crictl(c: Cluster, local: str, args: list[str]) -> None:
    if args[:1] == ["ps"]:
        if c.etcd_running(local) and flag(args, "--name") == "etcd":
            print(f"etcd{c.data_id(local)}")
    elif args[:1] == ["exec"]:
        rest = [a for a in args[1:] if a not in ("-i", "-t")]
        if not rest or not rest[0].startswith("etcd") or not c.etcd_running(local):
            raise Fail("FATA[0000] execing command in container: container not found")
        if rest[1] != "etcdctl":
            raise Fail("unmodelled crictl exec")
        etcdctl(c, local, rest[2:])
    else:
        raise Fail(f"unmodelled: crictl {' '.join(args)}")


def curl(c: Cluster, local: str, args: list[str]) -> None:
    quiet = any(a.startswith("-") and not a.startswith("--") and "s" in a and "S" not in a for a in args)
    try:
        _curl(c, local, args)
    except Fail as failure:
        raise Fail("" if quiet else str(failure), failure.code) from None


def _curl(c: Cluster, local: str, args: list[str]) -> None:
    url = next(a for a in args if a.startswith("https://"))
    address = url.split("//")[1].split(":")[0]
    if address == c.s["vip"] and not c.vip_held():
        raise Fail("curl: (28) Connection timed out", 28)
    if c.api_answers(address, local):
        print("ok")
        return
    if address == c.s["vip"]:
        # HAProxy accepts and closes when no apiserver is healthy: the TLS handshake fails.
        raise Fail("curl: (35) OpenSSL SSL_connect: SSL_ERROR_SYSCALL", 35)
    raise Fail("curl: (7) Failed to connect", 7)


def arping(c: Cluster, args: list[str]) -> None:
    target = args[-1]
    if target != c.s["vip"]:
        raise Fail("unmodelled arping target")
    holders = c.vip_holders()
    for name in holders:
        print(f"Unicast reply from {target} [{c.s['balancers'][name]['mac']}]  0.712ms")
    print(f"Sent 3 probes (1 broadcast(s))\nReceived {len(holders) * 3} response(s)")
    if not holders:
        raise Fail("", 1)


def main(argv: list[str]) -> int:
    command, args = argv[1], argv[2:]
    cluster = Cluster(Path(os.environ["HARNESS_CLUSTER"]))
    local = os.environ["HARNESS_NODE"]
    try:
        with cluster.locked():
            if command == "kubeadm":
                Kubeadm(cluster, local, args).run()
            elif command == "kubectl":
                kubectl(cluster, local, args)
            elif command == "crictl":
                crictl(cluster, local, args)
            elif command == "curl":
                curl(cluster, local, args)
            elif command == "arping":
                arping(cluster, args)
            else:
                raise Fail(f"no stand-in for {command}")
    except Fail as failure:
        if str(failure):
            print(str(failure), file=sys.stderr)
        return failure.code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
