"""TEST ONLY: the Kubernetes stand-ins of the lab in a box, as they run on a node host.

They are the shell harnesses' model (kube_standin.py: kubeadm's phases, what each leaves on disk,
where each fails) with its shortcuts replaced by the real thing wherever the real tools cross the
network. What is shared, and what is not:

- The cluster's store (what etcd's replication makes one) is one directory the box bind-mounts
  into every host (tests/lab_box.py `store`): the API objects, the etcd membership, the bootstrap
  tokens, the cluster CA. Daemons read it without the lock (it is replaced whole, by rename) and
  write it under the lock; a command holds the lock only between its waits (`BoxCluster.wait`).
- Everything else is on the host's own disk (certificates, kubeconfigs, manifests, etcd's member
  data) or goes over the box's network, as in a cluster: kubectl and kubeadm make a real HTTPS
  request to the API server their kubeconfig or discovery names (the VIP: HAProxy on a balancer,
  then some control plane's API server), checking its certificate against the cluster CA and
  presenting their client certificate or bootstrap token; token discovery fetches cluster-info
  through the VIP and checks its JWS signature with the token and the CA against the pinned hash;
  an API server answers (/readyz, HAProxy's health check included) only while its local etcd
  reports health, and an etcd member is healthy only while a quorum of the voting members answers
  on their peer ports; the kubelet bootstraps with a CSR to the API server and reports its Node and
  its static pods there every 10 s (daemons.py); a Node whose reports stop turns NotReady after
  the node controller's grace period. The controllers behind the drills' workload (node
  lifecycle and its taints, taint eviction, Deployment/ReplicaSet, the scheduler, the kubelets'
  pod starts: kube_standin's workloads section) run on real time, whenever a command or a kubelet
  report reads the store under the lock (`BoxCluster._acquire`), replaying what happened since.
- kubectl also runs on the CLI's machine, for the drills (tests/box_kubectl.py): there it reads no
  host's files, only the kubeconfig it is given, makes its request to --server (the VIP), and
  dials a pod's kubelet (port 10250) for `exec`, as the API server does.

So a host powered off, a balancer killed or an etcd without quorum is seen by the scripts as the
real tools see it: connection refused or timed out, TLS cut off (HAProxy with no backend up),
HTTP 500 from /readyz, a NotReady Node whose static pods still say Running.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import kube_standin as model
import net

HERE = Path(__file__).resolve().parent
STORE = Path(os.environ.get("LABS_K8S_BOX_STORE", "/var/lib/labs-k8s-box/cluster"))
RUN = Path("/run/labs-k8s-standin")
# kube-controller-manager --node-monitor-grace-period (40 s before 1.32, 50 s since: kubernetes#125477):
# a Node that has not reported for this long is NotReady.
NODE_GRACE_S = 50.0
# A kubelet reports every 10 s (daemons.HEARTBEAT_S): one whose last report is older than this is
# not running (it starts no pods).
KUBELET_ALIVE_S = 15.0
# kubeadm's retry of token discovery (constants.DiscoveryRetryInterval).
DISCOVERY_RETRY_S = 5.0
CLUSTER_INFO = "/api/v1/namespaces/kube-public/configmaps/cluster-info"
# The waits of kubelet-wait-bootstrap (v1beta4 timeouts.kubeletHealthCheck, timeouts.tlsBootstrap).
KUBELET_HEALTH_WAIT_S = 240.0
TLS_BOOTSTRAP_WAIT_S = 300.0


def release() -> dict[str, str]:
    """Which package and version this copy of the stand-ins came in (tests/box_repo.py writes it)."""
    path = HERE / "release.json"
    if path.is_file():
        return dict(json.loads(path.read_text()))
    return {"package": "source", "version": "", "upstream_version": model.KUBELET_VERSION.lstrip("v")}


def version() -> str:
    return "v" + release()["upstream_version"]


def local_ip() -> str:
    """The host's node address: the first global IPv4 address of its NIC (a balancer's VIP never
    is on a Kubernetes node)."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        match = re.search(r"\binet (\d+\.\d+\.\d+\.\d+)/", line)
        if match:
            return match.group(1)
    raise model.Fail("labs-k8s box: this host has no global IPv4 address")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------- kubeconfigs


def kubeconfig_credentials(path: str | Path, root: Path = Path("/")) -> tuple[str, net.Credentials]:
    """The server and the client identity of a kubeconfig's current context, as client-go loads it."""
    import yaml

    config = yaml.safe_load(Path(path).read_text()) or {}
    context_name = config.get("current-context")
    contexts = {c["name"]: c["context"] for c in config.get("contexts") or []}
    context = contexts.get(context_name) or (next(iter(contexts.values())) if contexts else {})
    clusters = {c["name"]: c["cluster"] for c in config.get("clusters") or []}
    users = {u["name"]: u["user"] for u in config.get("users") or []}
    cluster = clusters.get(context.get("cluster")) or (next(iter(clusters.values())) if clusters else {})
    user = users.get(context.get("user")) or (next(iter(users.values())) if users else {})

    def pem(data_key: str, file_key: str, where: dict[str, Any]) -> str | None:
        if where.get(data_key):
            return base64.b64decode(where[data_key]).decode()
        if where.get(file_key):
            return (root / str(where[file_key]).lstrip("/")).read_text()
        return None

    creds = net.Credentials(
        ca_pem=pem("certificate-authority-data", "certificate-authority", cluster),
        cert_pem=pem("client-certificate-data", "client-certificate", user),
        key_pem=pem("client-key-data", "client-key", user),
        token=user.get("token"),
    )
    return str(cluster.get("server", "")), creds


def split_server(server: str) -> tuple[str, int]:
    host_port = server.split("//", 1)[-1].split("/", 1)[0]
    host, _, port = host_port.rpartition(":")
    return (host, int(port)) if host else (host_port, 443)


def cluster_ca(store: Path = STORE) -> str:
    return (store / "pki" / "ca.crt").read_text()


# --------------------------------------------------------------------------------------- the cluster


class BoxCluster(model.Cluster):
    """kube_standin's Cluster in a node host of the box (module docstring)."""

    def __init__(self, store: Path = STORE, local: str | None = None) -> None:
        if not store.is_dir():
            raise model.Fail(f"labs-k8s stand-in: no cluster store at {store} (it runs in the lab in a box only)")
        super().__init__(store)
        self.local = local or socket.gethostname()
        self._lock: Any = None
        self._answers: dict[str, tuple[float, bool]] = {}

    # -------------------------------------------------------------- the store
    @contextlib.contextmanager
    def locked(self) -> Iterator[BoxCluster]:
        self._acquire()
        try:
            yield self
        finally:
            self.save()
            self._release()

    def _acquire(self) -> None:
        self._lock = open(self.dir / "cluster.lock", "w")  # noqa: SIM115 (held across waits)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        self.s = json.loads(self.path.read_text()) if self.path.exists() else model.empty_state()
        self.collect_garbage()
        self.run_controllers()

    def _release(self) -> None:
        self._lock.close()
        self._lock = None

    @property
    def now(self) -> float:
        """Real time, moved on by a test (`clock_offset`) to let hours pass for the tokens' TTLs."""
        return time.time() + float(self.s.get("clock_offset", 0.0))

    def kube_clock(self) -> float:
        """The kubelets' reports and the controllers run on real time: a test's `clock_offset` moves
        the tokens' TTLs, not the nodes' heartbeats."""
        return time.time()

    def background(self) -> None:
        """The kubelets are daemons of their own (daemons.py); the controllers run in `_acquire`,
        whenever the store is read under the lock (kube_standin's workloads section)."""

    def elapse(self, seconds: float) -> None:
        """The store unlocked while the time passes; the state is read again after it."""
        self.save()
        self._release()
        time.sleep(seconds)
        self._acquire()

    def wait(self, condition: Callable[[], bool], seconds: float) -> bool:
        """Poll `condition` every second for up to `seconds`, the store unlocked in between, so the
        daemons and the other stand-ins go on meanwhile. The state is read again after each pause:
        a caller must not keep objects of the state across a wait."""
        deadline = time.monotonic() + seconds
        while True:
            self._answers.clear()
            if condition():
                return True
            if time.monotonic() >= deadline:
                return False
            self.save()
            self._release()
            time.sleep(1.0)
            self._acquire()

    # -------------------------------------------------------------- hosts
    def root(self, name: str) -> Path:
        if name != self.local:
            raise model.Fail(f"labs-k8s stand-in: {self.local} cannot read {name}'s disk (the box has no such path)")
        return Path("/")

    def host(self, name: str) -> dict[str, Any]:
        if name == self.local:
            entry = dict(self.s["hosts"].get(name) or {"role": "node"})
            entry.update(ip=local_ip(), root="/", up=True, kubelet=kubelet_healthy())
            return entry
        return super().host(name)

    def register(self, role: str) -> None:
        """This host in the model's host list, with the role kubeadm init or join gives it."""
        self.s["hosts"][self.local] = {"ip": local_ip(), "role": role, "root": "/", "up": True, "kubelet": True}

    def ip_of(self, name: str) -> str:
        return local_ip() if name == self.local else str(super().host(name)["ip"])

    # -------------------------------------------------------------- what answers on the network
    def _probe(self, key: str, probe: Callable[[], bool]) -> bool:
        seen = self._answers.get(key)
        if seen is not None and time.monotonic() - seen[0] < 1.0:
            return seen[1]
        answer = probe()
        self._answers[key] = (time.monotonic(), answer)
        return answer

    def mark_answered(self, address: str) -> None:
        """A command's own request to `address` just succeeded (kubectl's)."""
        self._answers[f"api:{address}"] = (time.monotonic(), True)

    def api_answers(self, address: str, local: str = "") -> bool:
        """GET https://ADDRESS:6443/readyz, the server's certificate checked against the cluster CA."""

        def probe() -> bool:
            try:
                status, _ = net.request(address, net.API_PORT, "GET", "/readyz", net.Credentials(cluster_ca(self.dir)))
            except (net.Unreachable, OSError):
                return False
            return status == 200

        return self._probe(f"api:{address}", probe)

    def apiserver_running(self, name: str) -> bool:
        return self.api_answers(self.ip_of(name))

    def vip_answers(self) -> bool:
        return self.api_answers(str(self.s["vip"]))

    def vip_held(self) -> bool:
        return self._probe(f"tcp:{self.s['vip']}", lambda: net.tcp_open(str(self.s["vip"]), net.API_PORT))

    def etcd_running(self, name: str) -> bool:
        """The member's etcd answers on its peer port (it listens only while it is a member)."""
        ip = self.ip_of(name)
        return self._probe(f"etcd:{ip}", lambda: net.tcp_open(ip, net.ETCD_PEER_PORT))

    def running_member(self, member: dict[str, Any]) -> bool:
        ip = member["peer"].split("//")[1].split(":")[0]
        return self._probe(f"etcd:{ip}", lambda: net.tcp_open(ip, net.ETCD_PEER_PORT))

    def etcd_quorum(self) -> bool:
        voting = self.voting()
        with ThreadPoolExecutor(max_workers=max(1, len(voting))) as pool:
            healthy = sum(pool.map(self.running_member, voting))
        return bool(voting) and healthy >= len(voting) // 2 + 1

    # -------------------------------------------------------------- the kubelets
    def kubelet_has_client_cert(self, name: str) -> bool:
        if name == self.local:
            return super().kubelet_has_client_cert(name)
        return bool(self.s["nodes"].get(name, {}).get("heartbeat"))

    def start_kubelet(self, name: str) -> None:
        """kubeadm's TryStartKubelet: `systemctl restart kubelet` (initsystem.go)."""
        subprocess.run(["systemctl", "restart", "kubelet"], check=False)

    def stop_kubelet(self, name: str) -> None:
        """kubeadm's TryStopKubelet: `systemctl stop kubelet` (initsystem.go)."""
        subprocess.run(["systemctl", "stop", "kubelet"], check=False)

    def restart_kubelet(self, name: str) -> None:
        self.start_kubelet(name)

    def bootstrap_kubelet(self, name: str) -> None:
        """The kubelet daemon bootstraps itself (daemons.py)."""

    def node_grace(self) -> float:
        return NODE_GRACE_S

    def node_status(self, name: str) -> str:
        """Ready from the kubelet's reports: "Unknown" once none came for the grace period."""
        beat = (self.s["nodes"].get(name) or {}).get("heartbeat")
        if not (beat and time.time() - float(beat) < NODE_GRACE_S):
            return "Unknown"
        return "True" if self.s["cni"] else "False"

    def kubelet_posting(self, name: str) -> bool:
        beat = (self.s["nodes"].get(name) or {}).get("heartbeat")
        return bool(beat and time.time() - float(beat) < KUBELET_ALIVE_S)

    def kubelet_answers(self, name: str, timeout: float) -> bool:
        """The node's kubelet accepts a connection on its API port (daemons.py listens there), as
        the API server dials it for an exec: a powered-off host does not answer."""
        ip = (self.s["hosts"].get(name) or {}).get("ip")
        if not ip:
            return False
        # The dial may take the whole timeout: the store is unlocked meanwhile, read again after it.
        self.save()
        self._release()
        try:
            return net.tcp_open(str(ip), model.KUBELET_PORT, timeout=timeout)
        finally:
            self._acquire()

    def node_info(self, name: str) -> dict[str, str]:
        node = self.s["nodes"].get(name) or {}
        return {
            "kubeletVersion": str(node.get("kubelet_version", "")),
            "containerRuntimeVersion": str(node.get("runtime", "")),
        }

    def pods(self) -> list[dict[str, Any]]:
        """The static pods' mirror pods, as each kubelet last reported them: a dead node's stay
        Running until it reports again (the node controller marks them NotReady, not their phase)."""
        items = []
        for name, node in sorted(self.s["nodes"].items()):
            for component, pod in sorted((node.get("static_pods") or {}).items()):
                items.append(
                    {
                        "metadata": {
                            "name": f"{component}-{name}",
                            "namespace": "kube-system",
                            "labels": {"component": component, "tier": "control-plane"},
                        },
                        "spec": {"nodeName": name, "containers": [{"name": component, "image": pod["image"]}]},
                        "status": {"phase": pod["phase"]},
                    }
                )
        return items


def kubelet_healthy() -> bool:
    return net.plain_get("127.0.0.1", net.KUBELET_HEALTHZ_PORT, "/healthz", timeout=1.0) is not None


# ------------------------------------------------------------------------------------- certificates


def openssl(*args: str, stdin: bytes | None = None) -> bytes:
    return subprocess.run(["openssl", *args], input=stdin, capture_output=True, check=True).stdout


def serving_cert(ca_crt: Path, ca_key: Path, cn: str, dns: list[str], ips: list[str]) -> tuple[str, str]:
    """A server certificate from the cluster CA with these subject alternative names (PEM cert, key)."""
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        ext = ",".join([*(f"DNS:{d}" for d in dns), *(f"IP:{i}" for i in ips)])
        (t / "ext").write_text(f"subjectAltName={ext}\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature\n")
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(t / "k"),
                "-out", str(t / "csr"), "-subj", f"/CN={cn}")  # fmt: skip
        openssl("x509", "-req", "-in", str(t / "csr"), "-CA", str(ca_crt), "-CAkey", str(ca_key), "-CAcreateserial",
                "-out", str(t / "c"), "-days", "365", "-extfile", str(t / "ext"))  # fmt: skip
        return (t / "c").read_text(), (t / "k").read_text()


def apiserver_alt_names(node: str, advertise: str, cluster_cfg: dict[str, Any]) -> tuple[list[str], list[str]]:
    """kubeadm's apiserver certificate names (pkiutil.GetAPIServerAltNames): the node name,
    kubernetes.default.svc..., the service network's first address, the advertise address, the
    controlPlaneEndpoint's host, then apiServer.certSANs."""
    import ipaddress

    domain = (cluster_cfg.get("networking") or {}).get("dnsDomain", "cluster.local")
    service = (cluster_cfg.get("networking") or {}).get("serviceSubnet", "10.96.0.0/12").split(",")[0]
    dns = [node, "kubernetes", "kubernetes.default", "kubernetes.default.svc", f"kubernetes.default.svc.{domain}"]
    ips = [str(next(ipaddress.ip_network(service).hosts())), advertise]
    endpoint = str(cluster_cfg.get("controlPlaneEndpoint", "")).rsplit(":", 1)[0]
    for name in [endpoint, *((cluster_cfg.get("apiServer") or {}).get("certSANs") or [])]:
        if not name:
            continue
        try:
            ipaddress.ip_address(name)
            ips.append(name)
        except ValueError:
            dns.append(name)
    return list(dict.fromkeys(dns)), list(dict.fromkeys(ips))


def jws_signature(kubeconfig: str, token_id: str, token_secret: str) -> str:
    """The detached JWS (HS256, kid = token ID) kubeadm's bootstrap signer puts into cluster-info for
    each signing token (k8s.io/cluster-bootstrap/token/jws ComputeDetachedSignature)."""

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    header = b64(json.dumps({"alg": "HS256", "kid": token_id}, separators=(",", ":")).encode())
    signed = f"{header}.{b64(kubeconfig.encode())}".encode()
    return f"{header}..{b64(hmac.new(token_secret.encode(), signed, hashlib.sha256).digest())}"


def cluster_info_kubeconfig(ca_pem: str, server: str) -> str:
    return (
        "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n"
        f"    certificate-authority-data: {base64.b64encode(ca_pem.encode()).decode()}\n"
        f"    server: {server}\n  name: ''\ncontexts: null\ncurrent-context: ''\nusers: null\n"
    )


# ----------------------------------------------------------------------------------------- kubeadm


class BoxKubeadm(model.Kubeadm):
    """kube_standin's kubeadm, its API calls, discovery and waits made over the box's network."""

    c: BoxCluster

    def __init__(self, cluster: BoxCluster, args: list[str]) -> None:
        super().__init__(cluster, cluster.local, args)
        self.join_cfg: dict[str, Any] = {}

    def client_kubeconfig(self) -> Path:
        """admin.conf, but `kubeadm upgrade node` on a node without an API server manifest (a worker,
        which has no admin.conf) uses the kubelet's kubelet.conf (cmd/kubeadm/app/cmd/upgrade/node.go
        newNodeData: isControlPlaneNode from the kube-apiserver manifest)."""
        given = model.flag(self.args, "--kubeconfig")
        if given:
            return Path(given)
        if self.args[:2] == ["upgrade", "node"] and not Path("/etc/kubernetes/manifests/kube-apiserver.yaml").exists():
            return Path("/etc/kubernetes/kubelet.conf")
        return Path("/etc/kubernetes/admin.conf")

    def require_api(self, phase: str) -> None:
        """kubeadm's client is built from admin.conf, whose server is controlPlaneEndpoint (the VIP);
        client-go retries a refused call until the API call timeout."""
        kubeconfig = self.client_kubeconfig()
        if not kubeconfig.is_file():
            raise model.Fail(
                f"error execution phase {phase}: couldn't create a Kubernetes client from file {str(kubeconfig)!r}"
            )
        server, creds = kubeconfig_credentials(kubeconfig)
        host, port = split_server(server)
        problem: list[str] = []

        def answers() -> bool:
            try:
                status, body = net.request(host, port, "GET", "/api", creds)
            except net.Unreachable as error:
                problem[:] = [str(error)]
                return False
            problem[:] = [f"the server answered {status}: {body.strip()[:200]}"]
            return status == 200

        if not self.c.wait(answers, model.API_CALL_WAIT_S):
            raise model.Fail(
                f'error execution phase {phase}: unable to create a new client: Get "{server}/api": {problem[0]}'
            )
        self.c.mark_answered(host)

    # -------------------------------------------------------------- init
    def init(self) -> None:
        self.c.register("control-plane")
        super().init()

    def init_phase(self, phase: str, cfg: dict[str, dict[str, Any]]) -> None:
        super().init_phase(phase, cfg)
        if phase == "certs":
            self.write_apiserver_cert(cfg)
        elif phase == "kubelet-start":
            self.c.save()  # the kubelet's first reports read the store

    def write_apiserver_cert(self, cfg: dict[str, dict[str, Any]]) -> None:
        pki = self.root / "etc/kubernetes/pki"
        if (pki / "apiserver.key").is_file() and "BEGIN CERTIFICATE" in (pki / "apiserver.crt").read_text():
            return  # kubeadm keeps a certificate that is there (certs phase: "Using existing ...")
        if cfg.get("InitConfiguration"):
            advertise = cfg["InitConfiguration"]["localAPIEndpoint"]["advertiseAddress"]
            cluster_cfg = cfg.get("ClusterConfiguration", {})
        else:  # a joining control plane: its own address, the cluster's uploaded configuration
            advertise = self.join_cfg["controlPlane"]["localAPIEndpoint"]["advertiseAddress"]
            stored = self.c.get("configmap/kube-system/kubeadm-config") or {}
            cluster_cfg = stored.get("cluster_configuration", {})
        dns, ips = apiserver_alt_names(self.host, advertise, cluster_cfg)
        cert, key = serving_cert(pki / "ca.crt", pki / "ca.key", "kube-apiserver", dns, ips)
        model.write(self.root, "/etc/kubernetes/pki/apiserver.crt", cert, 0o644)
        model.write(self.root, "/etc/kubernetes/pki/apiserver.key", key)

    def register_node(self) -> None:
        """The kubelet registers its Node itself, once it has a certificate (daemons.py)."""

    # -------------------------------------------------------------- join
    def join(self) -> None:
        if self.args[1:2] != ["phase"]:
            self.join_cfg = self.config()["JoinConfiguration"]
            self.c.register("control-plane" if "controlPlane" in self.join_cfg else "worker")
        super().join()

    def join_phase(self) -> None:
        self.join_cfg = self.config()["JoinConfiguration"]
        self.c.register("control-plane" if "controlPlane" in self.join_cfg else "worker")
        super().join_phase()

    def discover(self, discovery: dict[str, Any]) -> Path:
        """Token discovery (cmd/kubeadm/app/discovery/token/token.go): cluster-info fetched without
        trusting the server yet, retried every 5 s until timeouts.discovery; its signature for this
        token ID checked with the token; the CA it names pinned by caCertHashes."""
        endpoint = discovery["apiServerEndpoint"]
        host, port = split_server("https://" + endpoint)
        token_id, token_secret = discovery["token"].split(".")
        answer: dict[str, Any] = {}
        problem: list[str] = []

        def fetched() -> bool:
            try:
                status, body = net.request(host, port, "GET", CLUSTER_INFO, net.Credentials())
            except net.Unreachable as error:
                problem[:] = [str(error)]
                return False
            if status != 200:
                problem[:] = [f"the server answered {status}"]
                return False
            answer.update(json.loads(body))
            return True

        timeout = model.parse_duration(str((self.join_cfg.get("timeouts") or {}).get("discovery", "5m0s")))
        if not self.c.wait(fetched, timeout):
            raise model.Fail(
                "error execution phase preflight: couldn't validate the identity of the API Server: "
                f'Get "https://{endpoint}{CLUSTER_INFO}": {problem[0] if problem else "no answer"}'
            )
        data = answer.get("data", {})
        kubeconfig = data.get("kubeconfig", "")
        signature = data.get(f"jws-kubeconfig-{token_id}")
        if not signature or not hmac.compare_digest(signature, jws_signature(kubeconfig, token_id, token_secret)):
            raise model.Fail(
                "error execution phase preflight: couldn't validate the identity of the API Server: "
                f'token id "{token_id}" is invalid for this cluster or it has expired. Use "kubeadm token '
                'create" on the control-plane node to create a new valid token'
            )
        ca_pem = base64.b64decode(re.search(r"certificate-authority-data:\s*(\S+)", kubeconfig).group(1)).decode()
        RUN.mkdir(parents=True, exist_ok=True)
        crt = RUN / "discovered-ca.crt"
        crt.write_text(ca_pem)
        if model.ca_hash(crt) not in discovery.get("caCertHashes", []):
            raise model.Fail(
                "error execution phase preflight: couldn't validate the identity of the API Server: "
                "cluster CA found in cluster-info ConfigMap is invalid: none of the public keys match the pins"
            )
        return crt

    def write_bootstrap_conf(self, control_plane: bool, discovery: dict[str, Any]) -> None:
        """bootstrap-kubelet.conf as kubeadm writes it: the discovered CA, the token, and the server
        (a control plane's own API server, ControlPlaneKubeletLocalMode)."""
        server = self.local_endpoint() if control_plane else "https://" + discovery["apiServerEndpoint"]
        ca = (self.root / "etc/kubernetes/pki/ca.crt").read_text()
        text = (
            "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n"
            f"    certificate-authority-data: {base64.b64encode(ca.encode()).decode()}\n"
            f"    server: {server}\n  name: default-cluster\ncontexts:\n- context:\n    cluster: default-cluster\n"
            "    user: tls-bootstrap-token-user\n  name: tls-bootstrap-token-user@kubernetes\n"
            "current-context: tls-bootstrap-token-user@kubernetes\nusers:\n- name: tls-bootstrap-token-user\n"
            f"  user:\n    token: {discovery['token']}\n"
        )
        model.write(self.root, "/etc/kubernetes/bootstrap-kubelet.conf", text)

    def wait_bootstrap(self) -> None:
        """kubelet-wait-bootstrap: the kubelet's /healthz, then its client certificate; the
        bootstrap kubeconfig removed either way (`defer os.Remove`)."""
        try:
            if not self.c.wait(kubelet_healthy, KUBELET_HEALTH_WAIT_S):
                raise model.Fail(
                    "error execution phase kubelet-wait-bootstrap: The HTTP call equal to 'curl -sSL "
                    "http://127.0.0.1:10248/healthz' returned error: dial tcp 127.0.0.1:10248: connect: "
                    "connection refused"
                )
            if not self.c.wait(lambda: self.c.kubelet_has_client_cert(self.host), TLS_BOOTSTRAP_WAIT_S):
                raise model.Fail(
                    "error execution phase kubelet-wait-bootstrap: error waiting for the kubelet to perform the "
                    "TLS Bootstrap: context deadline exceeded"
                )
        finally:
            (self.root / "etc/kubernetes/bootstrap-kubelet.conf").unlink(missing_ok=True)

    # -------------------------------------------------------------- upgrade
    def own_version(self) -> str:
        return version()

    def component_back(self, component: str, tag: str) -> bool:
        """The kubelet restarted the pod on its new manifest and reported it (its mirror pod), and
        the component answers: an API server its /readyz, etcd its health."""
        pod = (self.c.s["nodes"].get(self.host, {}).get("static_pods") or {}).get(component) or {}
        if pod.get("phase") != "Running" or not str(pod.get("image", "")).endswith(f":{tag}"):
            return False
        if component == "kube-apiserver":
            return self.c.api_answers("127.0.0.1")
        if component == "etcd":
            answer = net.plain_get("127.0.0.1", net.ETCD_CLIENT_PORT, "/health")
            return bool(answer and '"health": "true"' in answer[1])
        return True

    # -------------------------------------------------------------- reset and the rest
    def reset(self) -> None:
        """kubeadm reset: the member removed if it can be, the kubelet stopped, its containers
        removed through the CRI (phases/reset/cleanupnode.go), then the directories."""
        subprocess.run(["systemctl", "stop", "kubelet"], check=False)
        super().reset()
        remove_pods()

    def run(self) -> None:
        verb = self.args[0] if self.args else ""
        if verb == "version":
            print(
                version()
                if model.flag(self.args, "-o") == "short"
                else f'kubeadm version: &version.Info{{GitVersion:"{version()}"}}'
            )
        elif verb == "config" and self.args[1:3] == ["images", "list"]:
            wanted = model.flag(self.args, "--kubernetes-version") or version()
            print("\n".join(model.images_for(wanted)))
        else:
            super().run()


def remove_pods() -> None:
    """Every static pod's process, as `crictl rmp -af` (daemons.py keeps their pid files)."""
    for pidfile in (RUN / "pods").glob("*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            os.kill(int(json.loads(pidfile.read_text())["pid"]), 9)
        pidfile.unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------- commands


def kubectl_main(args: list[str]) -> int:
    """kubectl: the request goes to the kubeconfig's server (or --server's, which overrides it, as
    clientcmd's ConfigOverrides do) with the kubeconfig's CA and credentials; `get --raw` of a health
    endpoint (/readyz, /livez, /healthz) is that very request, its answer printed as kubectl prints
    it; anything else is answered from the store once the server answered GET /api.

    It runs on a node host (the install scripts, with admin.conf or kubelet.conf) and on the CLI's
    machine (the drills, tests/box_kubectl.py), where the kubeconfig is the stack's `kubeconfig`
    output: its credentials are embedded, so no file of a host is read."""
    if model.flag(args, "--kubeconfig") is None:
        args = [*args, "--kubeconfig", os.environ.get("KUBECONFIG") or "/root/.kube/config"]
    kubeconfig = str(model.flag(args, "--kubeconfig"))
    timeout = model.parse_duration(model.flag(args, "--request-timeout") or "30s") or 30.0
    local = socket.gethostname()
    raw = model.flag(args, "--raw") if "get" in args else None
    try:
        # client-go validates the kubeconfig before it dials (clientcmd validation.go).
        model.check_client_files(BoxCluster(local=local), local, kubeconfig)
        server, creds = kubeconfig_credentials(kubeconfig)
        server = model.flag(args, "--server") or model.flag(args, "-s") or server
        host, port = split_server(server)
        path = raw if raw in model.HEALTH_PATHS else "/api"
        try:
            status, body = net.request(host, port, "GET", str(path), creds, timeout=timeout)
        except net.Unreachable as error:
            if error.kind == "refused":
                raise model.Fail(
                    f"The connection to the server {host}:{port} was refused - did you specify the right host or port?"
                ) from None
            raise model.Fail(f"Unable to connect to the server: {error}") from None
        if status == 401:
            raise model.Fail("error: You must be logged in to the server (Unauthorized)")
        if status != 200:
            raise model.Fail(
                "Error from server (InternalError): an error on the server "
                f'("{body.strip()[:200]}") has prevented the request from succeeding'
            )
        if path != "/api":
            print(body)
            return 0
        with BoxCluster(local=local).locked() as cluster:
            cluster.mark_answered(host)
            model.kubectl(cluster, local, args)
    except model.Fail as failure:
        if str(failure):
            print(str(failure), file=sys.stderr)
        return failure.code
    return 0


def kubeadm_main(args: list[str]) -> int:
    try:
        with BoxCluster().locked() as cluster:
            BoxKubeadm(cluster, args).run()
    except model.Fail as failure:
        if str(failure):
            print(str(failure), file=sys.stderr)
        return failure.code
    return 0


def crictl_main(args: list[str]) -> int:
    """crictl over the static pods the kubelet runs (its pid files): `ps`, `exec ID etcdctl ...`
    into the local etcd, `rmp`/`stopp` (kubeadm reset). It needs containerd's socket, as crictl
    needs the CRI."""
    import daemons

    if not daemons.containerd_answers():
        print(
            'validate service connection: validate CRI v1 runtime API for endpoint "unix:///run/containerd/'
            'containerd.sock": rpc error: code = Unavailable desc = connection error: desc = "transport: Error '
            'while dialing: dial unix /run/containerd/containerd.sock: connect: no such file or directory"',
            file=sys.stderr,
        )
        return 1
    pods = {}
    for pidfile in sorted((RUN / "pods").glob("*.json")):
        pod = json.loads(pidfile.read_text())
        if daemons._alive(int(pod["pid"])):
            pods[pidfile.stem] = hashlib.sha256(f"{pidfile.stem}{pod['pid']}".encode()).hexdigest()[:13]
    words = [a for a in args if not a.startswith("-")]
    verb = words[0] if words else ""
    if verb == "ps":
        name = model.flag(args, "--name")
        chosen = {c: i for c, i in pods.items() if name is None or name in c}
        for component, container in chosen.items():
            print(container if "-q" in args else f"{container}  Running  {component}")
        return 0
    if verb == "exec":
        rest = [a for a in args[1:] if a not in ("-i", "-t", "-it", "-ti")]
        container, command = rest[0], rest[1:]
        if pods.get("etcd") != container or command[:1] != ["etcdctl"]:
            print(f'FATA[0000] execing command in container: container "{container}" not found', file=sys.stderr)
            return 1
        try:
            with BoxCluster().locked() as cluster:
                model.etcdctl(cluster, cluster.local, command[1:])
        except model.Fail as failure:
            if str(failure):
                print(str(failure), file=sys.stderr)
            return failure.code
        return 0
    if verb in ("rmp", "stopp", "rm", "stop"):
        remove_pods()
        return 0
    print(f"crictl (labs-k8s stand-in): {' '.join(args)} is not modelled", file=sys.stderr)
    return 1
