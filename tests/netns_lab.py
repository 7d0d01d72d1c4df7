"""A network-namespace lab of the balancer pair (tests/test_lb_netns.py, bench/lb_failover.py).

Everything lives in network namespaces this module creates, named `lk8slb<pid>-<host>`, joined
by a bridge in a namespace of its own; nothing is routed out of them, so the lab's 10.3.60.x
addresses never leave this machine. The hosts use the rendered lab's own addresses and the
nodes' interface name (`network.interface`), and the balancers run the configs of
components/rendering/lb.py unchanged but for two paths (stats socket, check script) and the
pid files given on the command line:

    <tag>-br        bridge br0, one veth port per host
    <tag>-lb1/lb2   real HAProxy + Keepalived in the foreground
    <tag>-mNN       apiserver stand-ins: TLS on :6443, GET /healthz -> 200 "ok <name>"
    <tag>-client    a prober: TLS GET https://VIP:6443/healthz every 100 ms; it verifies the
                    stand-ins' certificate (SAN = VIP), which only works if HAProxy passes TLS
                    through untouched

Namespaces share one process table, so every process check here is per namespace: the lab
keeps the PIDs it started and checks /proc/PID/ns/net against the namespace before it signals.

`python tests/netns_lab.py apiserver|probe ...` are the helper processes the lab starts inside
the namespaces (standard library only).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from components.config import LabConfig

PREFIX = "lk8slb"
# `lk8slb<pid>_<n>-<host>`: the pid tells whether the run that made it is still alive.
_TAG_RE = re.compile(rf"^{PREFIX}(\d+)_\d+-")
_LAB_COUNTER = itertools.count(1)
APISERVER_PORT = 6443
TOOLS = ("ip", "haproxy", "keepalived", "openssl", "ss")

TEST_VRRP_PASSWORD = "labsk8sVRRPsecret"


# --------------------------------------------------------------------------- small helpers


def run(*cmd: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def ensure_script_user(name: str) -> None:
    """The unprivileged user Keepalived runs check scripts as (as setup-balancer.sh creates it)."""
    if run("getent", "passwd", name, check=False).returncode != 0:
        run(
            "useradd",
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            name,
        )


def netns_list() -> list[str]:
    return [line.split()[0] for line in run("ip", "netns", "list").stdout.splitlines() if line.strip()]


def netns_pids(ns: str) -> list[int]:
    result = run("ip", "netns", "pids", ns, check=False)
    return [int(p) for p in result.stdout.split()] if result.returncode == 0 else []


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _destroy_namespace(ns: str) -> None:
    pids = netns_pids(ns)
    _signal_all(pids, signal.SIGCONT)
    _signal_all(pids, signal.SIGKILL)
    run("ip", "netns", "del", ns, check=False)


def cleanup_leftovers() -> list[str]:
    """Remove namespaces and work dirs of earlier lab runs whose process is gone (a crash)."""
    removed = []
    for ns in netns_list():
        match = _TAG_RE.match(ns)
        if match and int(match.group(1)) != os.getpid() and not _pid_alive(int(match.group(1))):
            _destroy_namespace(ns)
            removed.append(ns)
    for path in Path(tempfile.gettempdir()).glob(f"{PREFIX}*-*"):
        match = _TAG_RE.match(path.name)
        if match and int(match.group(1)) != os.getpid() and not _pid_alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed


def _ns_inode(ns: str) -> int:
    return os.stat(f"/run/netns/{ns}").st_ino


def pid_in_netns(pid: int, ns: str) -> bool:
    try:
        link = os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return False
    return link == f"net:[{_ns_inode(ns)}]"


def _children(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Field 4 (ppid) follows the parenthesised command name, which may contain spaces.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            kids.append(int(entry.name))
    return kids


def process_tree(pid: int) -> list[int]:
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(_children(current))
    return tree


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class ProbeRecord:
    start: float  # time.monotonic() when the request started (same clock in every process)
    end: float
    ok: bool
    backend: str | None
    error: str | None


@dataclass(frozen=True)
class VipSample:
    at: float
    holders: frozenset[str]


@dataclass
class ScenarioResult:
    name: str
    fault_at: float
    window_end: float
    recovered_after: float | None  # s from the fault until the VIP answered again; None: never
    failed: int
    requests: int
    backends: collections.Counter[str]
    dual_vip_samples: int
    vip_samples: int
    bound: float | None = None
    goal: float | None = None
    notes: list[str] = field(default_factory=list)
    failback_failed: int | None = None
    failback_after: float | None = None
    # Samples with the VIP on both while lb1 was frozen: a stopped Keepalived cannot remove it.
    frozen_dual_samples: int = 0
    observed: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        rec = "n/a" if self.recovered_after is None else f"{self.recovered_after:.2f}s"
        return (
            f"{self.name}: recovered after {rec}, {self.failed}/{self.requests} failed, "
            f"VIP on both in {self.dual_vip_samples}/{self.vip_samples} samples, backends {dict(self.backends)}"
            + (f", failback: {self.failback_failed} failed" if self.failback_failed is not None else "")
            + ("; " + "; ".join(self.notes) if self.notes else "")
        )


def analyse(
    name: str,
    records: list[ProbeRecord],
    samples: list[VipSample],
    fault_at: float,
    window_end: float,
    in_flight: float = 0.1,
) -> ScenarioResult:
    """Requests started from `in_flight` s before the fault (the one in flight when it struck)
    up to window_end. Older requests belong to the period before, even if they end later."""
    window = [r for r in records if r.start >= fault_at - in_flight and r.start <= window_end]
    failures = [r for r in window if not r.ok]
    if not failures:
        recovered: float | None = 0.0
    else:
        last_failure = max(r.start for r in failures)
        after = [r for r in window if r.ok and r.start > last_failure]
        recovered = min(r.end for r in after) - fault_at if after else None
    vip = [s for s in samples if fault_at <= s.at <= window_end]
    return ScenarioResult(
        name=name,
        fault_at=fault_at,
        window_end=window_end,
        recovered_after=recovered,
        failed=len(failures),
        requests=len(window),
        backends=collections.Counter(r.backend for r in window if r.ok and r.backend),
        dual_vip_samples=sum(1 for s in vip if len(s.holders) > 1),
        vip_samples=len(vip),
    )


# --------------------------------------------------------------------------- the lab


@dataclass
class Host:
    key: str  # short name inside the lab: lb1, lb2, m01.., client
    ns: str
    ip: str
    iface: str
    port: str  # the bridge-side veth


class NetnsLab:
    """Build with `with NetnsLab(cfg) as lab:`; everything is torn down on exit, even on failure."""

    def __init__(
        self,
        cfg: LabConfig,
        vrrp_password: str = TEST_VRRP_PASSWORD,
        *,
        script_weight: int | None = None,
        probe_interval: float = 0.1,
        probe_timeout: float = 1.0,
        max_duration: float = 600,
    ) -> None:
        self.cfg = cfg
        self.vrrp_password = vrrp_password
        self.script_weight = script_weight
        self.probe_interval = probe_interval
        self.probe_timeout = probe_timeout
        self.max_duration = max_duration
        self.tag = f"{PREFIX}{os.getpid()}_{next(_LAB_COUNTER)}"
        self.vip = str(cfg.load_balancer.vip)
        self.prefix = cfg.prefix_length
        self.workdir = Path()
        self.hosts: dict[str, Host] = {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.samples: list[VipSample] = []
        self._sampler_stop = threading.Event()
        self._sampler: threading.Thread | None = None
        self._namespaces: list[str] = []
        self._logs: list[Any] = []
        self.balancer_keys = [f"lb{i + 1}" for i in range(len(cfg.balancers))]
        self.apiserver_keys = [f"m{i + 1:02d}" for i in range(len(cfg.control_planes))]
        self.apiserver_names = {
            key: node.name for key, node in zip(self.apiserver_keys, cfg.control_planes, strict=True)
        }

    # ---------------------------------------------------------------- lifecycle

    def __enter__(self) -> NetnsLab:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        from components.rendering import lb

        cleanup_leftovers()
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{self.tag}-"))
        # Keepalived runs the check script as the unprivileged script user: it must reach it.
        self.workdir.chmod(0o755)
        ensure_script_user(lb.SCRIPT_USER)
        self._build_network()
        self._make_certificate()
        paths = {
            key: lb.BalancerPaths(
                stats_socket=str(self.workdir / key / "admin.sock"),
                check_script=str(self.workdir / "check_apiserver.sh"),
            )
            for key in self.balancer_keys
        }
        check = self.workdir / "check_apiserver.sh"
        check.write_text(lb.render_check_script(self.cfg))
        check.chmod(0o755)
        for key, node in zip(self.balancer_keys, self.cfg.balancers, strict=True):
            (self.workdir / key).mkdir(mode=0o755)
            (self.workdir / key / "haproxy.cfg").write_text(lb.render_haproxy_cfg(self.cfg, paths=paths[key]))
            conf = self.workdir / key / "keepalived.conf"
            conf.write_text(
                lb.render_keepalived_conf(
                    self.cfg, node, self.vrrp_password, paths=paths[key], script_weight=self.script_weight
                )
            )
            conf.chmod(0o640)
        for key in self.apiserver_keys:
            self.start_apiserver(key)
        for key in self.balancer_keys:
            self.start_haproxy(key)
        for key in self.balancer_keys:
            self.start_keepalived(key)
        self._sampler = threading.Thread(target=self._sample_vip, name="vip-sampler", daemon=True)
        self._sampler.start()
        self._start_prober()
        if not self.wait_steady(timeout=20):
            raise RuntimeError(f"the lab did not settle: VIP on {sorted(self.vip_holders())}\n{self.log_tail()}")

    def close(self) -> None:
        self._sampler_stop.set()
        if self._sampler is not None:
            self._sampler.join(timeout=5)
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        deadline = time.monotonic() + 3
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=5)
        # Whatever else runs in the lab's namespaces (Keepalived children, check scripts).
        for ns in reversed(self._namespaces):
            _destroy_namespace(ns)
        self._namespaces.clear()
        for handle in self._logs:
            handle.close()
        self._logs.clear()
        if self.workdir != Path() and self.workdir.exists() and not os.environ.get("LK8S_LAB_KEEP"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    # ---------------------------------------------------------------- network

    def _add_ns(self, key: str) -> str:
        ns = f"{self.tag}-{key}"
        run("ip", "netns", "add", ns)
        self._namespaces.append(ns)
        run("ip", "-n", ns, "link", "set", "lo", "up")
        return ns

    def _build_network(self) -> None:
        bridge_ns = self._add_ns("br")
        self.bridge_ns = bridge_ns
        run("ip", "-n", bridge_ns, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", bridge_ns, "link", "set", "br0", "up")
        plan: list[tuple[str, str, str]] = []
        plan += [
            (key, str(node.ip), self.cfg.network.interface)
            for key, node in zip(self.balancer_keys, self.cfg.balancers, strict=True)
        ]
        plan += [
            (key, str(node.ip), "eth0") for key, node in zip(self.apiserver_keys, self.cfg.control_planes, strict=True)
        ]
        plan.append(("client", self._client_ip(), "eth0"))
        for index, (key, ip, iface) in enumerate(plan):
            ns = self._add_ns(key)
            port = f"p{index}-{key}"[:15]
            run("ip", "-n", bridge_ns, "link", "add", port, "type", "veth", "peer", "name", iface, "netns", ns)
            run("ip", "-n", bridge_ns, "link", "set", port, "master", "br0", "up")
            run("ip", "-n", ns, "addr", "add", f"{ip}/{self.prefix}", "dev", iface)
            run("ip", "-n", ns, "link", "set", iface, "up")
            self.hosts[key] = Host(key, ns, ip, iface, port)
        for key in self.balancer_keys:
            # What setup-balancer.sh persists on a balancer; per network namespace here.
            run("ip", "netns", "exec", self.hosts[key].ns, "sysctl", "-q", "-w", "net.ipv4.ip_nonlocal_bind=1")

    def _client_ip(self) -> str:
        if self.cfg.workers:
            return str(self.cfg.workers[0].ip)  # the client stands in for a worker's kubelet
        used = {str(n.ip) for n in self.cfg.all_nodes} | {self.vip, str(self.cfg.network.gateway)}
        return next(str(h) for h in self.cfg.network.cidr.hosts() if str(h) not in used)

    def _make_certificate(self) -> None:
        # One certificate for every stand-in, like kubeadm's apiserver cert with the VIP in its SANs.
        run(
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(self.workdir / "apiserver.key"),
            "-out",
            str(self.workdir / "apiserver.crt"),
            "-days",
            "1",
            "-subj",
            "/CN=kube-apiserver",
            "-addext",
            f"subjectAltName=IP:{self.vip},DNS:kubernetes",
        )
        (self.workdir / "apiserver.key").chmod(0o600)

    # ---------------------------------------------------------------- processes

    def _spawn(self, name: str, key: str, *cmd: str) -> subprocess.Popen[bytes]:
        old = self.procs.get(name)
        if old is not None and old.poll() is None:
            raise RuntimeError(f"{name} is already running")
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - closed in close()
        self._logs.append(log)
        # `ip netns exec` execs the command: the Popen PID is the daemon's own PID.
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.hosts[key].ns, *cmd],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs[name] = proc
        return proc

    def _helper(self, *args: str) -> list[str]:
        return [sys.executable, str(Path(__file__).resolve()), *args]

    def start_apiserver(self, key: str) -> None:
        self._spawn(
            f"apiserver-{key}",
            key,
            *self._helper(
                "apiserver",
                "--name",
                self.apiserver_names[key],
                "--port",
                str(APISERVER_PORT),
                "--cert",
                str(self.workdir / "apiserver.crt"),
                "--key",
                str(self.workdir / "apiserver.key"),
            ),
        )
        ns = self.hosts[key].ns
        if not wait_until(
            lambda: bool(run("ip", "netns", "exec", ns, "ss", "-Hltn", f"sport = :{APISERVER_PORT}").stdout.strip()), 10
        ):
            raise RuntimeError(f"apiserver stand-in {key} did not listen\n{self.log_tail()}")

    def start_ssh_banner(self, key: str) -> None:
        """A stand-in for the control plane's sshd on port 22: it greets with its node's name."""
        if self.procs.get(f"ssh-{key}") is not None and self.procs[f"ssh-{key}"].poll() is None:
            return
        self._spawn(f"ssh-{key}", key, *self._helper("banner", "--name", self.apiserver_names[key], "--port", "22"))
        ns = self.hosts[key].ns
        listening = lambda: bool(run("ip", "netns", "exec", ns, "ss", "-Hltn", "sport = :22").stdout.strip())  # noqa: E731
        if not wait_until(listening, 10):
            raise RuntimeError(f"ssh banner stand-in {key} did not listen\n{self.log_tail()}")

    def stop_ssh_banner(self, key: str) -> None:
        """The control plane's sshd dies (its apiserver keeps running)."""
        self._signal_proc(f"ssh-{key}", key, signal.SIGKILL)
        self.procs[f"ssh-{key}"].wait(timeout=10)

    def ssh_banner_via_vip(self, port: int) -> str:
        """The greeting a client on the node network gets from VIP:port ('' when nothing answers)."""
        code = (
            "import socket,sys\ntry:\n s=socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)\n"
            " s.settimeout(2)\n print(s.recv(200).decode().strip())\nexcept OSError:\n print('')"
        )
        return run(
            "ip", "netns", "exec", self.hosts["client"].ns, sys.executable, "-c", code, self.vip, str(port), check=False
        ).stdout.strip()

    def start_daemon(self, name: str, key: str, *cmd: str) -> subprocess.Popen[bytes]:
        """A test's own process in host `key`'s namespace (output: workdir/<name>.log), stopped
        with the lab if the test does not stop it (tests/test_real_ssh.py's sshd's)."""
        return self._spawn(name, key, *cmd)

    def stop_daemon(self, name: str, key: str) -> None:
        self._signal_proc(name, key, signal.SIGTERM)
        self.procs[name].wait(timeout=10)

    def stop_apiserver(self, key: str, sig: int = signal.SIGTERM) -> None:
        """SIGTERM: the stand-in closes its listener and finishes in-flight requests (as the real
        apiserver drains on shutdown); SIGKILL: it vanishes mid-request."""
        self._signal_proc(f"apiserver-{key}", key, sig)
        self.procs[f"apiserver-{key}"].wait(timeout=10)

    def start_haproxy(self, key: str) -> None:
        d = self.workdir / key
        self._spawn(f"haproxy-{key}", key, "haproxy", "-db", "-f", str(d / "haproxy.cfg"), "-p", str(d / "haproxy.pid"))
        if not wait_until(lambda: (d / "admin.sock").exists() and self._stats_ok(key), 10):
            raise RuntimeError(f"haproxy in {key} did not start\n{self.log_tail()}")

    def kill_haproxy(self, key: str) -> None:
        self._signal_proc(f"haproxy-{key}", key, signal.SIGKILL)
        self.procs[f"haproxy-{key}"].wait(timeout=10)
        (self.workdir / key / "admin.sock").unlink(missing_ok=True)

    def start_keepalived(self, key: str) -> None:
        d = self.workdir / key
        self._spawn(
            f"keepalived-{key}",
            key,
            "keepalived",
            "--dont-fork",
            "--log-console",
            "--log-detail",
            "--no-syslog",
            "--vrrp",
            "--use-file",
            str(d / "keepalived.conf"),
            "--pid",
            str(d / "keepalived.pid"),
            "--vrrp_pid",
            str(d / "vrrp.pid"),
        )

    def _signal_proc(self, name: str, key: str, sig: int) -> None:
        proc = self.procs[name]
        if proc.poll() is not None:
            raise RuntimeError(f"{name} is not running")
        if not pid_in_netns(proc.pid, self.hosts[key].ns):
            raise RuntimeError(f"PID {proc.pid} ({name}) is not in namespace {self.hosts[key].ns}")
        os.kill(proc.pid, sig)

    def daemon_pids(self, key: str) -> list[int]:
        """Every process of this balancer's HAProxy and Keepalived (with Keepalived's children)."""
        pids = []
        for name in (f"haproxy-{key}", f"keepalived-{key}"):
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                pids += [p for p in process_tree(proc.pid) if pid_in_netns(p, self.hosts[key].ns)]
        return pids

    def running_in(self, key: str, command: str) -> list[int]:
        """PIDs in this host's namespace whose command is `command` (a per-namespace `pidof`)."""
        found = []
        for pid in netns_pids(self.hosts[key].ns):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().strip() == command:
                    found.append(pid)
        return found

    def freeze(self, key: str) -> list[int]:
        pids = self.daemon_pids(key)
        _signal_all(pids, signal.SIGSTOP)
        return pids

    def thaw(self, pids: list[int]) -> None:
        _signal_all(pids, signal.SIGCONT)

    def link(self, key: str, up: bool) -> None:
        """Cable pull: the bridge side of the host's veth goes down, so the host sees no carrier."""
        run("ip", "-n", self.bridge_ns, "link", "set", self.hosts[key].port, "up" if up else "down")

    # ---------------------------------------------------------------- observation

    def vip_holders(self) -> frozenset[str]:
        holders = []
        for key in self.balancer_keys:
            host = self.hosts[key]
            out = run("ip", "-n", host.ns, "-4", "-o", "addr", "show", check=False).stdout
            if re.search(rf"\sinet {re.escape(self.vip)}/", out):
                holders.append(key)
        return frozenset(holders)

    def _sample_vip(self) -> None:
        # One sample reads lb1 then lb2; a VIP moving lb2 -> lb1 is added on lb1 before lb2 drops
        # it (sub-millisecond), so reading the gainer first cannot report a false overlap.
        while not self._sampler_stop.is_set():
            holders = self.vip_holders()
            self.samples.append(VipSample(time.monotonic(), holders))
            self._sampler_stop.wait(0.02)

    def _start_prober(self) -> None:
        self.probe_file = self.workdir / "probe.jsonl"
        self._spawn(
            "prober",
            "client",
            *self._helper(
                "probe",
                "--vip",
                self.vip,
                "--port",
                str(APISERVER_PORT),
                "--ca",
                str(self.workdir / "apiserver.crt"),
                "--interval",
                str(self.probe_interval),
                "--timeout",
                str(self.probe_timeout),
                "--duration",
                str(self.max_duration),
                "--out",
                str(self.probe_file),
            ),
        )

    def records(self) -> list[ProbeRecord]:
        if not self.probe_file.exists():
            return []
        records = []
        for line in self.probe_file.read_text().splitlines():
            with contextlib.suppress(ValueError):
                records.append(ProbeRecord(**json.loads(line)))
        return sorted(records, key=lambda r: r.start)

    def recent_ok(self, since: float, count: int = 5) -> bool:
        recent = [r for r in self.records() if r.start >= since]
        return len(recent) >= count and all(r.ok for r in recent[-count:])

    def _stats(self, key: str) -> list[dict[str, str]]:
        sock_path = self.workdir / key / "admin.sock"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(2)
            sock.connect(str(sock_path))
            sock.sendall(b"show stat\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        lines = data.decode().splitlines()
        header = lines[0].lstrip("# ").split(",")
        return [dict(zip(header, line.split(","), strict=False)) for line in lines[1:] if line]

    def _stats_ok(self, key: str) -> bool:
        try:
            self._stats(key)
        except OSError:
            return False
        return True

    def server_states(self, key: str, proxy: str = "kube-apiserver") -> dict[str, str]:
        """Server -> HAProxy status (UP, DOWN, `UP 1/2`...) of one proxy, through the admin stats socket."""
        return {
            row["svname"]: row["status"]
            for row in self._stats(key)
            if row["pxname"] == proxy and row["svname"] not in ("FRONTEND", "BACKEND")
        }

    def wait_steady(self, timeout: float = 20) -> bool:
        """VIP on the first balancer only, every backend UP there, the client succeeding."""
        first = self.balancer_keys[0]

        def steady() -> bool:
            try:
                states = self.server_states(first)
            except OSError:
                return False
            return (
                self.vip_holders() == {first}
                and all(s == "UP" for s in states.values())
                and self.recent_ok(time.monotonic() - 1.0, 5)
            )

        return wait_until(steady, timeout, 0.1)

    def log_tail(self, lines: int = 15) -> str:
        parts = []
        for log in sorted(self.workdir.glob("*.log")) if self.workdir != Path() else []:
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.name}\n" + "\n".join(tail))
        return "\n".join(parts)

    def analyse(self, name: str, fault_at: float, window_end: float) -> ScenarioResult:
        return analyse(name, self.records(), list(self.samples), fault_at, window_end, self.probe_interval)

    def settle_requests(self) -> None:
        """Wait until every request started so far has finished (each ends within its timeout)."""
        time.sleep(self.probe_timeout + 0.2)


# --------------------------------------------------------------------------- scenarios
# Each starts from the steady state (VIP on lb1, all backends UP) and restores it before it returns.


def vrrp_bound(cfg: LabConfig) -> float:
    from components.rendering import lb

    return lb.vrrp_failover_bound(cfg.load_balancer.advert_int_seconds)


def haproxy_dead_bound(cfg: LabConfig) -> float:
    """FAULT mode: `fall` failed checks, then the BACKUP waits its skew time after the priority-0 advert."""
    from components.rendering import lb

    skew = (256 - lb.BACKUP_PRIORITY) / 256
    return lb.CHECK_FALL * lb.CHECK_INTERVAL_SECONDS + skew


def _require_steady(lab: NetnsLab, scenario: str) -> None:
    if not lab.wait_steady(timeout=20):
        raise RuntimeError(
            f"{scenario}: the lab is not in its steady state (VIP on {sorted(lab.vip_holders())})\n{lab.log_tail()}"
        )


def _observe_processes(lab: NetnsLab) -> dict[str, Any]:
    """Per-namespace process census: which balancer runs which daemon right now."""
    return {
        f"{cmd}@{key}": len(lab.running_in(key, cmd)) for key in lab.balancer_keys for cmd in ("haproxy", "keepalived")
    }


def _fail_over_and_back(
    lab: NetnsLab,
    name: str,
    inject: Callable[[], Any],
    restore: Callable[[Any], None],
    bound: float | None,
    goal: float | None,
    *,
    frozen: bool = False,
    hold: float = 1.0,
) -> ScenarioResult:
    _require_steady(lab, name)
    fault_at = time.monotonic()
    token = inject()
    ok = wait_until(lambda: "lb2" in lab.vip_holders() and lab.recent_ok(fault_at, 5), timeout=15)
    time.sleep(hold)
    window_end = time.monotonic()
    result = lab.analyse(name, fault_at, window_end)
    result.bound, result.goal = bound, goal
    result.observed = {**_observe_processes(lab), "vip_on": sorted(lab.vip_holders())}
    if frozen:
        result.frozen_dual_samples, result.dual_vip_samples = result.dual_vip_samples, 0
    if not ok:
        result.notes.append("lb2 never served the VIP")
    back_at = time.monotonic()
    restore(token)
    if not lab.wait_steady(timeout=20):
        result.notes.append(f"did not return to lb1 (VIP on {sorted(lab.vip_holders())})")
    lab.settle_requests()  # a request broken by the failback may fail only at its timeout
    back = lab.analyse(name + " (failback)", back_at, time.monotonic())
    result.failback_failed = back.failed
    result.failback_after = back.window_end - back_at
    result.vip_samples += back.vip_samples
    if frozen:
        # The thawed Keepalived still holds the VIP it had when it stopped, until its first advert
        # makes lb2 step down: that is the end of the stale state, not a new double holding.
        after = [s for s in lab.samples if back_at <= s.at <= back.window_end]
        resolved = next((s.at for s in after if len(s.holders) <= 1), back.window_end)
        result.frozen_dual_samples += sum(1 for s in after if s.at < resolved and len(s.holders) > 1)
        result.dual_vip_samples += sum(1 for s in after if s.at >= resolved and len(s.holders) > 1)
        result.observed["stale_vip_after_thaw_s"] = round(resolved - back_at, 3)
    else:
        result.dual_vip_samples += back.dual_vip_samples
    return result


def scenario_baseline(lab: NetnsLab, duration: float = 1.5) -> ScenarioResult:
    _require_steady(lab, "baseline")
    start = time.monotonic()
    time.sleep(duration)
    return lab.analyse("baseline: VIP on lb1, round robin", start, time.monotonic())


def scenario_haproxy_dead(lab: NetnsLab) -> ScenarioResult:
    def inject() -> None:
        lab.kill_haproxy("lb1")

    def restore(_: None) -> None:
        lab.start_haproxy("lb1")

    return _fail_over_and_back(lab, "HAProxy killed on lb1", inject, restore, haproxy_dead_bound(lab.cfg), 2.5)


def scenario_frozen(lab: NetnsLab) -> ScenarioResult:
    frozen: list[int] = []

    def inject() -> list[int]:
        frozen.extend(lab.freeze("lb1"))
        return frozen

    result = _fail_over_and_back(lab, "lb1 frozen (SIGSTOP)", inject, lab.thaw, vrrp_bound(lab.cfg), 3.7, frozen=True)
    result.notes.append(f"froze {len(frozen)} processes")
    return result


def scenario_link_down(lab: NetnsLab) -> ScenarioResult:
    def inject() -> None:
        lab.link("lb1", up=False)

    def restore(_: None) -> None:
        lab.link("lb1", up=True)

    return _fail_over_and_back(lab, "lb1 link down", inject, restore, vrrp_bound(lab.cfg), 3.7)


def scenario_apiserver_dead(lab: NetnsLab, key: str = "m01", sig: int = signal.SIGTERM) -> ScenarioResult:
    _require_steady(lab, "apiserver dead")
    name = lab.apiserver_names[key]
    fault_at = time.monotonic()
    lab.stop_apiserver(key, sig)
    marked = wait_until(lambda: lab.server_states("lb1").get(name, "").startswith("DOWN"), timeout=15, interval=0.1)
    marked_at = time.monotonic()
    time.sleep(1.5)
    window_end = time.monotonic()
    signame = signal.Signals(sig).name
    result = lab.analyse(f"apiserver {name} killed ({signame})", fault_at, window_end)
    result.goal = 0
    after_down = lab.analyse("after DOWN", marked_at, window_end)
    result.notes.append(f"marked DOWN after {marked_at - fault_at:.1f}s" if marked else "never marked DOWN")
    result.notes.append(f"served by it after DOWN: {after_down.backends.get(name, 0)}")
    back_at = time.monotonic()
    lab.start_apiserver(key)
    if not lab.wait_steady(timeout=20):
        result.notes.append("did not come back UP")
    lab.settle_requests()
    back = lab.analyse("failback", back_at, time.monotonic())
    result.failback_failed = back.failed
    result.failback_after = time.monotonic() - back_at
    return result


SCENARIOS: list[Callable[[NetnsLab], ScenarioResult]] = [
    scenario_baseline,
    scenario_haproxy_dead,
    scenario_frozen,
    scenario_link_down,
    scenario_apiserver_dead,
]


# --------------------------------------------------------------------------- helper processes


class _HealthzHandler(BaseHTTPRequestHandler):
    server_version = "apiserver-stand-in"
    name = "unnamed"

    def do_GET(self) -> None:
        if self.path.split("?")[0] in ("/healthz", "/livez", "/readyz"):
            body, code = f"ok {self.name}\n".encode(), 200
        else:
            body, code = b"not found\n", 404
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Stop(Exception):
    pass


def apiserver_main(args: argparse.Namespace) -> int:
    """Serve until SIGTERM, then close the listener at once and finish the requests in flight.

    The accept loop blocks in accept(), and SIGTERM interrupts it there: nothing waits unaccepted
    in the backlog when the listener closes (the kernel would reset those connections after the
    balancer had already forwarded the client's bytes, which no retry can save). A polling loop
    (http.server's serve_forever) leaves such a window open for up to one poll interval."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert, args.key)
    _HealthzHandler.name = args.name

    def on_term(signum: int, frame: object) -> None:
        raise _Stop

    signal.signal(signal.SIGTERM, on_term)
    listener = socket.create_server(("0.0.0.0", args.port), backlog=128)
    workers: list[threading.Thread] = []

    def serve(conn: socket.socket, address: Any) -> None:
        conn.settimeout(5)
        # The TLS handshake in the connection's own thread, never in the accept loop.
        with contextlib.suppress(OSError, ssl.SSLError), context.wrap_socket(conn, server_side=True) as tls:
            _HealthzHandler(tls, address, None)  # type: ignore[arg-type]

    try:
        while True:
            conn, address = listener.accept()
            worker = threading.Thread(target=serve, args=(conn, address))
            worker.start()
            workers = [w for w in workers if w.is_alive()] + [worker]
    except _Stop:
        pass
    finally:
        listener.close()
    for worker in workers:
        worker.join(timeout=5)
    return 0


def _probe_once(vip: str, port: int, context: ssl.SSLContext, timeout: float) -> tuple[bool, str | None, str | None]:
    try:
        with (
            socket.create_connection((vip, port), timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=vip) as tls,
        ):
            tls.sendall(f"GET /healthz HTTP/1.1\r\nHost: {vip}\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := tls.recv(4096):
                data += chunk
    except (OSError, ssl.SSLError) as error:
        return False, None, f"{type(error).__name__}: {error}"
    head, _, body = data.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].decode(errors="replace")
    if " 200 " not in status + " ":
        return False, None, f"status {status!r}"
    text = body.decode(errors="replace").strip()
    return True, text.removeprefix("ok ").strip(), None


def probe_main(args: argparse.Namespace) -> int:
    """Poll the VIP every `interval` s (each request on its own thread, so a hanging request does
    not delay the next one) until SIGTERM or `duration` s; one JSON line per request."""
    context = ssl.create_default_context(cafile=args.ca)  # verifies the chain and the VIP SAN
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    lock = threading.Lock()
    out = open(args.out, "a", buffering=1)  # noqa: SIM115 - closed below
    threads: list[threading.Thread] = []

    def one() -> None:
        start = time.monotonic()
        ok, backend, error = _probe_once(args.vip, args.port, context, args.timeout)
        record = {"start": start, "end": time.monotonic(), "ok": ok, "backend": backend, "error": error}
        with lock:
            out.write(json.dumps(record) + "\n")

    begin = time.monotonic()
    count = 0
    max_count = int(args.duration / args.interval) + 1
    while not stop.is_set() and count < max_count:
        thread = threading.Thread(target=one, daemon=True)
        thread.start()
        threads = [t for t in threads if t.is_alive()] + [thread]
        count += 1
        stop.wait(max(0.0, begin + count * args.interval - time.monotonic()))
    for thread in threads:
        thread.join(timeout=args.timeout + 1)
    out.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    api = sub.add_parser("apiserver", help="apiserver stand-in: TLS GET /healthz -> 200 'ok NAME'")
    api.add_argument("--name", required=True)
    api.add_argument("--port", type=int, default=APISERVER_PORT)
    api.add_argument("--cert", required=True)
    api.add_argument("--key", required=True)
    banner = sub.add_parser("banner", help="sshd stand-in: greet every connection with SSH-2.0-NAME")
    banner.add_argument("--name", required=True)
    banner.add_argument("--port", type=int, default=22)
    probe = sub.add_parser("probe", help="poll https://VIP:PORT/healthz, one JSON line per request")
    probe.add_argument("--vip", required=True)
    probe.add_argument("--port", type=int, default=APISERVER_PORT)
    probe.add_argument("--ca", required=True)
    probe.add_argument("--interval", type=float, default=0.1)
    probe.add_argument("--timeout", type=float, default=1.0)
    probe.add_argument("--duration", type=float, default=600)
    probe.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.mode == "banner":
        return banner_main(args)
    return apiserver_main(args) if args.mode == "apiserver" else probe_main(args)


def banner_main(args: argparse.Namespace) -> int:
    listener = socket.create_server(("0.0.0.0", args.port), backlog=64)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        conn, _ = listener.accept()
        with conn:
            conn.sendall(f"SSH-2.0-{args.name}\r\n".encode())


@contextlib.contextmanager
def lab(cfg: LabConfig, **kwargs: Any) -> Iterator[NetnsLab]:
    with NetnsLab(cfg, **kwargs) as running:
        yield running


if __name__ == "__main__":
    sys.exit(main())
