"""TEST ONLY: the daemons of the lab in a box's Kubernetes stand-ins, on a node host.

- `kubelet` (kubelet.service, run by the box's systemctl from the unit our kubelet package ships):
  loads its client configuration as cmd/kubelet/app/server.go and
  pkg/kubelet/certificate/bootstrap/bootstrap.go do (kubelet.conf with a valid client certificate;
  else bootstrap-kubelet.conf, writing a certificate-less kubelet.conf at once; else it exits, and
  systemd restarts it), bootstraps with a CSR to the API server its bootstrap credentials name
  (and exits after 5 minutes without a certificate, as server.go's exitAfter), serves /healthz on
  127.0.0.1:10248, accepts connections on its API port 10250 (what `kubectl exec` reaches through
  the API server; the stand-in kubectl runs the command itself), runs the static pods of
  /etc/kubernetes/manifests while containerd's socket answers, and reports its Node and those
  pods to the API server its kubelet.conf names every 10 s (nodeStatusUpdateFrequency),
  re-registering a Node that was deleted, as the kubelet does.
- the static pods, each a process of its own session (containerd's, not the kubelet's: they outlive
  a kubelet restart): `etcd` (peer port 2380 while it is a member, client port 2379 whose /health
  says whether a quorum of the voting members answers on their peer ports), `kube-apiserver`
  (TLS on 6443 with the certificate kubeadm wrote; /readyz answers 200 only while the local etcd is
  healthy; cluster-info for token discovery, CSRs signed with the cluster CA, the kubelets'
  reports), and the controller manager and scheduler, which only run.
- `containerd` (containerd.service): its socket, `--version`, `config dump`.
See box_cluster.py for what is shared through the store and what crosses the network.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import os
import re
import signal
import socket
import socketserver
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import box_cluster as box
import kube_standin as model
import net

MANIFESTS = Path("/etc/kubernetes/manifests")
KUBELET_CONF = Path("/etc/kubernetes/kubelet.conf")
BOOTSTRAP_CONF = Path("/etc/kubernetes/bootstrap-kubelet.conf")
KUBELET_CONFIG = Path("/var/lib/kubelet/config.yaml")
KUBELET_PEM = Path(model.KUBELET_PEM)
CONTAINERD_SOCKET = Path("/run/containerd/containerd.sock")
CONTAINERD_CONFIG = Path("/etc/containerd/config.toml")
PODS = box.RUN / "pods"
HEARTBEAT_S = 10.0  # nodeStatusUpdateFrequency
BOOTSTRAP_EXIT_S = 300.0  # server.go: the kubelet exits when its bootstrap has not finished in 5 min
MAIN = Path(__file__).resolve().parent / "main.py"


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


# The daemons' listeners. Go's net.Listen asks for the kernel's somaxconn (net/sock_linux.go
# maxListenerBacklog; 4096 since Linux 5.4); socketserver listens with 5, so a host whose daemon
# is starved for a second would drop SYNs that the real etcd, kubelet or API server queues, and a
# 1 s dial (an etcd peer probe) would see a live member as down.
class _TCPServer(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = socket.SOMAXCONN


class _HTTPServer(http.server.ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = socket.SOMAXCONN


# ----------------------------------------------------------------------------------------- containerd


def containerd_main(args: list[str]) -> int:
    upstream = box.release()["upstream_version"]
    if args[:1] in (["--version"], ["-v"]):
        print(f"containerd containerd.io {upstream} labs-k8s-standin")
        return 0
    if args[:2] == ["config", "dump"]:
        # The real dump is the file merged over the defaults; the stand-in prints what is in force:
        # the file, or containerd.io's default one, which disables the CRI plugin.
        if CONTAINERD_CONFIG.is_file():
            print(CONTAINERD_CONFIG.read_text(), end="")
        else:
            print('version = 3\ndisabled_plugins = ["cri"]')
        return 0
    if args:
        print(f"containerd (labs-k8s stand-in): {' '.join(args)} is not modelled", file=sys.stderr)
        return 1
    CONTAINERD_SOCKET.parent.mkdir(parents=True, exist_ok=True)
    CONTAINERD_SOCKET.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(CONTAINERD_SOCKET))
    server.listen(16)
    log(f"containerd {upstream} serving on {CONTAINERD_SOCKET}")

    def stop(*_: Any) -> None:
        CONTAINERD_SOCKET.unlink(missing_ok=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    while True:
        connection, _ = server.accept()
        connection.close()


def containerd_answers() -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(CONTAINERD_SOCKET))
            return True
        except OSError:
            return False


def runtime_version() -> str:
    out = subprocess.run(["containerd", "--version"], capture_output=True, text=True, check=False).stdout.split()
    return f"containerd://{out[2]}" if len(out) >= 3 else ""


# ------------------------------------------------------------------------------------------- kubelet


class _Healthz(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"ok"
        self.send_response(200 if self.path == "/healthz" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


class _Accept(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        pass


def client_credentials() -> tuple[str, net.Credentials] | None:
    """kubelet.conf's server and its client certificate, when it has a valid one
    (bootstrap.go isClientConfigStillValid)."""
    if not KUBELET_CONF.is_file():
        return None
    with contextlib.suppress(Exception):
        server, creds = box.kubeconfig_credentials(KUBELET_CONF)
        if creds.cert_pem and creds.key_pem:
            end = subprocess.run(["openssl", "x509", "-noout", "-checkend", "0"], input=creds.cert_pem,
                                 capture_output=True, text=True, check=False)  # fmt: skip
            if end.returncode == 0:
                return server, creds
    return None


def kubelet_main(args: list[str]) -> int:
    node = socket.gethostname()
    if not KUBELET_CONFIG.is_file():
        log(f'"command failed" err="failed to load kubelet config file, path: {KUBELET_CONFIG}, error: open '
            f'{KUBELET_CONFIG}: no such file or directory"')  # fmt: skip
        return 1
    bootstrap: tuple[str, net.Credentials] | None = None
    if client_credentials() is None:
        if not BOOTSTRAP_CONF.is_file():
            log('"command failed" err="failed to run Kubelet: unable to load bootstrap kubeconfig: stat '
                f'{BOOTSTRAP_CONF}: no such file or directory"')  # fmt: skip
            return 1
        bootstrap = box.kubeconfig_credentials(BOOTSTRAP_CONF)
        # writeKubeconfigFromBootstrapping: kubelet.conf names the certificate file it does not have yet.
        ca = bootstrap[1].ca_pem or ""
        model.write(Path("/"), str(KUBELET_CONF), bootstrap_kubeconfig(bootstrap[0], ca))
        log(f"Client rotation is on, will bootstrap in background (server {bootstrap[0]})")
    healthz = _HTTPServer(("127.0.0.1", net.KUBELET_HEALTHZ_PORT), _Healthz)
    threading.Thread(target=healthz.serve_forever, daemon=True).start()
    # The kubelet's API port, which the API server dials for `kubectl exec` (the stand-in kubectl
    # runs etcdctl itself: here a connection is only accepted, so a live kubelet answers and a
    # powered-off host does not).
    api = _TCPServer(("0.0.0.0", model.KUBELET_PORT), _Accept)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    started = time.monotonic()
    last_report = 0.0
    last_pods: dict[str, dict[str, str]] = {}
    # The kubelet registers its Node once per start (kubelet_node_status.go registerWithAPIServer
    # returns at once after `registrationCompleted`); after that it only updates it, so a Node
    # deleted under a running kubelet stays deleted ("error getting node ... not found") until the
    # kubelet starts again. A leave guard deletes the Node of a VM that still runs for a moment.
    registered = False
    log(f"kubelet {box.version()} started on {node}")
    while True:
        pods = sync_static_pods()
        if bootstrap is not None:
            if request_certificate(node, *bootstrap):
                bootstrap = None
            elif time.monotonic() - started > BOOTSTRAP_EXIT_S:
                log('"Failed to run kubelet" err="failed to run Kubelet: timed out waiting for the condition"')
                return 1
        # Node status every 10 s; a pod's status as soon as it changes (the status manager).
        due = time.monotonic() - last_report >= HEARTBEAT_S or pods != last_pods
        if bootstrap is None and due and report(node, pods, register=not registered):
            last_report, last_pods, registered = time.monotonic(), pods, True
        time.sleep(2.0)


def bootstrap_kubeconfig(server: str, ca_pem: str) -> str:
    import base64

    return (
        "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n"
        f"    certificate-authority-data: {base64.b64encode(ca_pem.encode()).decode()}\n"
        f"    server: {server}\n  name: default-cluster\ncontexts:\n- context:\n    cluster: default-cluster\n"
        "    namespace: default\n    user: default-auth\n  name: default-context\n"
        "current-context: default-context\nusers:\n- name: default-auth\n  user:\n"
        f"    client-certificate: {KUBELET_PEM}\n    client-key: {KUBELET_PEM}\n"
    )


def request_certificate(node: str, server: str, creds: net.Credentials) -> bool:
    """The TLS bootstrap: a key of its own, a CSR for system:node:NODE, signed by the API server
    (kubeadm's auto-approval); the pair lands in kubelet-client-current.pem."""
    host, port = box.split_server(server)
    with tempfile.TemporaryDirectory() as tmp:
        key, csr = Path(tmp) / "key", Path(tmp) / "csr"
        box.openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key),
                    "-out", str(csr), "-subj", f"/O=system:nodes/CN=system:node:{node}")  # fmt: skip
        try:
            status, body = net.request(
                host, port, "POST", "/standin/csr", creds, {"node": node, "csr": csr.read_text()}
            )
        except net.Unreachable as error:
            log(f"certificate signing request to {server} failed: {error}")
            return False
        if status != 201:
            log(f"certificate signing request to {server}: {status} {body.strip()[:200]}")
            return False
        KUBELET_PEM.parent.mkdir(parents=True, exist_ok=True)
        model.write(Path("/"), str(KUBELET_PEM), json.loads(body)["certificate"] + key.read_text())
    log(f"client certificate for system:node:{node} issued by {server}")
    return True


def report(node: str, pods: dict[str, dict[str, str]], register: bool) -> bool:
    """The Node's status and its mirror pods, to kubelet.conf's server with the node's certificate;
    `register`: create the Node if it is not there (the kubelet's first report after its start)."""
    found = client_credentials()
    if found is None:
        return False
    server, creds = found
    host, port = box.split_server(server)
    body = {
        "node": node,
        "ip": box.local_ip(),
        "kubelet_version": box.version(),
        "runtime": runtime_version() if containerd_answers() else "",
        "static_pods": pods,
        "register": register,
    }
    try:
        status, text = net.request(host, port, "POST", "/standin/heartbeat", creds, body)
    except net.Unreachable as error:
        log(f'"Error updating node status, will retry" err="{error}" server="{server}"')
        return False
    if status != 200:
        log(f'"Error updating node status, will retry" status={status} body="{text.strip()[:200]}"')
    return status == 200


# ---------------------------------------------------------------------------------------- static pods


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
            return False
    return True


def _kill(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGTERM)
    for _ in range(30):
        if not _alive(pid):
            return
        time.sleep(0.1)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def sync_static_pods() -> dict[str, dict[str, str]]:
    """Run what /etc/kubernetes/manifests holds: a new or changed manifest (re)starts its pod, a
    removed one stops it; pods start only while containerd answers. Returns each pod's status."""
    PODS.mkdir(parents=True, exist_ok=True)
    runtime = containerd_answers()
    status: dict[str, dict[str, str]] = {}
    wanted = {}
    for manifest in sorted(MANIFESTS.glob("*.yaml")) if MANIFESTS.is_dir() else []:
        text = manifest.read_text()
        image = re.search(r"^\s*image:\s*(\S+)", text, re.M)
        wanted[manifest.stem] = (hashlib.sha256(text.encode()).hexdigest(), image.group(1) if image else "")
    for pidfile in PODS.glob("*.json"):
        pod = json.loads(pidfile.read_text())
        if pidfile.stem not in wanted or pod["hash"] != wanted[pidfile.stem][0]:
            _kill(int(pod["pid"]))
            pidfile.unlink(missing_ok=True)
            log(f"static pod {pidfile.stem}: stopped ({'changed' if pidfile.stem in wanted else 'removed'})")
    for component, (digest, image) in wanted.items():
        pidfile = PODS / f"{component}.json"
        pod = json.loads(pidfile.read_text()) if pidfile.is_file() else None
        if pod is not None and not _alive(int(pod["pid"])):
            pod = None
        if pod is None and runtime:
            logfile = open(f"/var/log/labs-k8s-standin-{component}.log", "ab")  # noqa: SIM115
            proc = subprocess.Popen([sys.executable, str(MAIN), "static-pod", component, image],
                                    stdin=subprocess.DEVNULL, stdout=logfile, stderr=logfile,
                                    start_new_session=True)  # fmt: skip
            logfile.close()
            pod = {"pid": proc.pid, "hash": digest, "image": image}
            pidfile.write_text(json.dumps(pod))
            log(f"static pod {component}: started ({image}, pid {proc.pid})")
        status[component] = {"phase": "Running" if pod is not None else "Pending", "image": image}
    return status


def static_pod_main(args: list[str]) -> int:
    component, image = args[0], (args[1] if len(args) > 1 else "")
    if component == "etcd":
        return etcd_main()
    if component == "kube-apiserver":
        return apiserver_main(image.rsplit(":", 1)[-1])
    log(f"{component} {image}: running (the stand-in does no work of its own)")
    while True:
        time.sleep(3600)


# -------------------------------------------------------------------------------------------- etcd


def etcd_main() -> int:
    ip = box.local_ip()
    peer = f"https://{ip}:{net.ETCD_PEER_PORT}"
    data_file = Path("/var/lib/etcd/member/id")
    health = {"health": False, "reason": "starting"}
    me_seen = False

    def member() -> dict[str, Any] | None:
        try:
            state = json.loads((box.STORE / "cluster.json").read_text())
        except (OSError, ValueError):
            return None
        data = data_file.read_text().strip() if data_file.is_file() else None
        found = next((m for m in state.get("members", []) if m["peer"] == peer), None)
        if found is None or found.get("data") != data:
            return None
        found["_voting"] = [m for m in state["members"] if not m["learner"]]
        return found

    # Wait to be a member (kubeadm adds it before the manifest; a wiped disk is not the old member).
    while (me := member()) is None:
        log(f"etcd: no member with peer URL {peer} and this data dir in the cluster; waiting")
        time.sleep(2.0)

    class Peer(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            with contextlib.suppress(OSError):
                self.request.sendall(f"labs-k8s-standin etcd peer {me['id']:x}\n".encode())

    class Client(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"health": "true" if health["health"] else "false", "reason": health["reason"]}).encode()
            self.send_response(200 if self.path.startswith("/health") else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    servers: list[socketserver.TCPServer] = [_TCPServer((ip, net.ETCD_PEER_PORT), Peer)]
    for address in ("127.0.0.1", ip):
        client = _HTTPServer((address, net.ETCD_CLIENT_PORT), Client)
        servers.append(client)
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    log(f"etcd member {me['id']:x} ({peer}) serving")
    while True:
        current = member()
        if current is None:
            if me_seen:
                log("etcd: the member has been permanently removed from the cluster; exiting")
                return 1
            health.update(health=False, reason="not a member")
        else:
            me_seen = True
            voting = current["_voting"]
            reached = [m for m in voting if m["peer"] == peer or peer_answers(m["peer"])]
            quorum = len(voting) // 2 + 1
            ok = bool(voting) and len(reached) >= quorum
            health.update(health=ok, reason="" if ok else f"{len(reached)} of {len(voting)} voting members reachable")
        time.sleep(1.0)


def peer_answers(peer_url: str) -> bool:
    return net.tcp_open(peer_url.split("//")[1].split(":")[0], net.ETCD_PEER_PORT)


# ---------------------------------------------------------------------------------------- apiserver


def apiserver_main(version: str) -> int:
    pki = Path("/etc/kubernetes/pki")
    node = socket.gethostname()
    etcd: dict[str, Any] = {"at": 0.0, "ok": False}

    def etcd_healthy() -> bool:
        if time.monotonic() - etcd["at"] > 0.5:
            answer = net.plain_get("127.0.0.1", net.ETCD_CLIENT_PORT, "/health", timeout=1.0)
            etcd["ok"] = bool(answer and answer[0] == 200 and json.loads(answer[1]).get("health") == "true")
            etcd["at"] = time.monotonic()
        return bool(etcd["ok"])

    def store() -> dict[str, Any]:
        return dict(json.loads((box.STORE / "cluster.json").read_text()))

    def token_valid(token: str) -> bool:
        if not re.fullmatch(r"[a-z0-9]{6}\.[a-z0-9]{16}", token or ""):
            return False
        state = store()
        secret = state["objects"].get(f"secret/kube-system/bootstrap-token-{token.split('.')[0]}")
        now = time.time() + float(state.get("clock_offset", 0.0))
        return bool(secret and secret.get("secret") == token and (not secret.get("expires") or secret["expires"] > now))

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def reply(self, status: int, body: str | dict[str, Any], kind: str = "application/json") -> None:
            data = (json.dumps(body) if isinstance(body, dict) else body).encode()
            self.send_response(status)
            self.send_header("Content-Type", kind if isinstance(body, dict) else "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def identity(self) -> str | None:
            """The client certificate's CN, verified against the cluster CA by the TLS handshake."""
            cert = self.connection.getpeercert()  # type: ignore[attr-defined]
            if not cert:
                return None
            for rdn in cert.get("subject", ()):
                for key, value in rdn:
                    if key == "commonName":
                        return str(value)
            return None

        def body(self) -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            return dict(json.loads(self.rfile.read(length) or b"{}"))

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path in ("/readyz", "/healthz", "/livez"):
                if etcd_healthy():
                    self.reply(200, "ok")
                else:
                    self.reply(500, "[-]etcd failed: reason withheld\nreadyz check failed")
            elif path == "/version":
                self.reply(200, {"major": "1", "minor": version.split(".")[1], "gitVersion": version})
            elif not etcd_healthy():
                time.sleep(1.0)  # the apiserver's etcd client retries before it gives up
                self.reply(503, "etcdserver: request timed out")
            elif path == "/api":
                if self.identity() is None and not token_valid(self.bearer()):
                    self.reply(401, {"kind": "Status", "status": "Failure", "reason": "Unauthorized", "code": 401})
                else:
                    self.reply(200, {"kind": "APIVersions", "versions": ["v1"]})
            elif path == box.CLUSTER_INFO:
                self.cluster_info()
            else:
                self.reply(404, {"kind": "Status", "code": 404})

        def bearer(self) -> str:
            header = self.headers.get("Authorization", "")
            return header.removeprefix("Bearer ") if header.startswith("Bearer ") else ""

        def cluster_info(self) -> None:
            """kube-public/cluster-info, readable by anyone (kubeadm's bootstrap-signer RBAC): the
            CA and the server, signed for each signing bootstrap token (the bootstrap signer)."""
            state = store()
            info = state["objects"].get("configmap/kube-public/cluster-info")
            if info is None:
                self.reply(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
                return
            kubeconfig = box.cluster_info_kubeconfig((pki / "ca.crt").read_text(), str(info.get("server", "")))
            data = {"kubeconfig": kubeconfig}
            now = time.time() + float(state.get("clock_offset", 0.0))
            for key, secret in state["objects"].items():
                if key.startswith("secret/kube-system/bootstrap-token-") and secret.get("secret"):
                    if secret.get("expires") and secret["expires"] <= now:
                        continue
                    token_id, token_secret = secret["secret"].split(".")
                    data[f"jws-kubeconfig-{token_id}"] = box.jws_signature(kubeconfig, token_id, token_secret)
            self.reply(200, {"kind": "ConfigMap", "data": data})

        def do_POST(self) -> None:
            path = self.path.split("?")[0]
            if not etcd_healthy():
                time.sleep(1.0)
                self.reply(503, "etcdserver: request timed out")
            elif path == "/standin/csr":
                self.sign()
            elif path == "/standin/heartbeat":
                self.heartbeat()
            else:
                self.reply(404, {"kind": "Status", "code": 404})

        def sign(self) -> None:
            """A kubelet's CSR with a bootstrap token: kubeadm's auto-approval, the controller
            manager's signer (the CA on this control plane's disk), 1 year."""
            request = self.body()
            if not token_valid(self.bearer()):
                self.reply(401, {"kind": "Status", "reason": "Unauthorized", "code": 401})
                return
            with tempfile.TemporaryDirectory() as tmp:
                csr, crt = Path(tmp) / "csr", Path(tmp) / "crt"
                csr.write_text(request["csr"])
                box.openssl("x509", "-req", "-in", str(csr), "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"),
                            "-CAcreateserial", "-out", str(crt), "-days", "365")  # fmt: skip
                self.reply(201, {"certificate": crt.read_text()})

        def heartbeat(self) -> None:
            request = self.body()
            name = request.get("node", "")
            if self.identity() != f"system:node:{name}":
                self.reply(403, {"kind": "Status", "reason": "Forbidden", "code": 403})
                return
            with box.BoxCluster(local=node).locked() as cluster:
                if name not in cluster.s["nodes"] and not request.get("register"):
                    # An update of a Node that is gone: the kubelet's GET fails (kubelet_node_status.go
                    # tryUpdateNodeStatus), nothing is created.
                    self.reply(404, {"kind": "Status", "reason": "NotFound", "code": 404,
                                     "message": f'nodes "{name}" not found'})  # fmt: skip
                    return
                entry = cluster.s["nodes"].setdefault(name, {"labels": {}})
                now = time.time()
                # The first report after the grace period without one starts a new run of reports:
                # the node lifecycle controller sees the Node Ready again from then (`posting_since`).
                last = entry.get("heartbeat")
                if last is None or now - float(last) >= box.NODE_GRACE_S:
                    entry["posting_since"] = now
                entry.update(
                    heartbeat=now,
                    kubelet_version=request.get("kubelet_version", ""),
                    runtime=request.get("runtime", ""),
                    static_pods=request.get("static_pods", {}),
                )
                host = cluster.s["hosts"].setdefault(name, {"role": "node", "root": "/", "up": True, "kubelet": True})
                host["ip"] = request.get("ip", host.get("ip"))
            self.reply(200, {"kind": "Node", "metadata": {"name": name}})

        def log_message(self, *_: object) -> None:
            pass

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(pki / "apiserver.crt"), str(pki / "apiserver.key"))
    context.load_verify_locations(str(pki / "ca.crt"))
    context.verify_mode = ssl.CERT_OPTIONAL  # a client certificate, or a token, or anonymous

    class TLSServer(_HTTPServer):
        def get_request(self) -> tuple[socket.socket, Any]:
            raw, address = super().get_request()
            raw.settimeout(10.0)
            return context.wrap_socket(raw, server_side=True, do_handshake_on_connect=False), address

        def finish_request(self, request: Any, client_address: Any) -> None:
            try:
                request.do_handshake()
            except (ssl.SSLError, OSError):
                return  # HAProxy's TCP checks and clients that give up: no request
            super().finish_request(request, client_address)

    server = TLSServer(("0.0.0.0", net.API_PORT), Handler)
    log(f"kube-apiserver {version} serving on :{net.API_PORT}")
    server.serve_forever()
    return 0
