"""pytest fixtures that run govmomi's vCenter simulator (vcsim) on 127.0.0.1.

Register with ``pytest_plugins = ["tests.vcsim"]``; ``vcsim_factory(hosts=2, ...)``
takes Topology's fields. Each fixture starts its
own vcsim (about 0.2 s) on a port the kernel picks, so tests never share state
and never collide on ports; teardown stops it and vcsim removes its temporary
datastore directories.

The binary comes from tests/tools/build_vcsim.sh: a small main of ours
(tests/tools/vcsim/main.go) over govmomi's simulator library at the version
tests/tools/go.mod pins, built from the Go module proxy. As root the fixture
runs that script, which is a no-op when the binary is cached; otherwise a
missing binary skips the test on a laptop and fails it in CI.

What this simulator does not do, so tests must not rely on it:
- DRS rules are stored but never enforced (no placement, no vMotion);
- the /folder datastore HTTP interface does not check the session cookie;
- guest IPs only change through extraConfig ``SET.guest.ipAddress``;
- no guest runs: a powered-on VM stays on until someone powers it off.
The password is read from ``LABS_K8S_VCSIM_PASSWORD_FILE`` at every login
(main.go, over the simulator's SessionManager.ValidLogin hook), so
``Vcsim.rotate_password`` changes it while the inventory lives on.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tests.requirements import unavailable

REPO = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO / "tests" / "tools" / "build_vcsim.sh"
CACHED_BINARY = REPO / ".cache" / "vcsim" / "vcsim"
USER = "labs"
PASSWORD = "labs-secret"
START_TIMEOUT_S = 20.0
_URL_LINE = re.compile(r"GOVC_URL=(\S+)")


@dataclass(frozen=True)
class Topology:
    """vcsim inventory flags (see vcsim -h); defaults: one 3-host cluster, no VMs."""

    clusters: int = 1
    hosts: int = 3
    vms: int = 0
    datastores: int = 1
    portgroups: int = 1
    standalone_hosts: int = 0

    def flags(self) -> list[str]:
        return [
            "-dc", "1",
            "-cluster", str(self.clusters),
            "-host", str(self.hosts),
            "-vm", str(self.vms),
            "-ds", str(self.datastores),
            "-pg", str(self.portgroups),
            "-standalone-host", str(self.standalone_hosts),
        ]  # fmt: skip


@dataclass(frozen=True)
class Vcsim:
    """How to reach one running simulator, and the names its model creates."""

    host: str
    port: int
    user: str
    password: str
    pid: int
    topology: Topology
    datacenter: str = "DC0"
    cluster: str = "DC0_C0"
    datastore: str = "LocalDS_0"
    network: str = "VM Network"
    dvs_portgroup: str = "DC0_DVPG0"
    password_file: Path | None = None

    @property
    def server(self) -> str:
        """What `vsphere:vsphereServer` says for this simulator: host:port."""
        return f"{self.host}:{self.port}"

    def rotate_password(self, new_password: str) -> Vcsim:
        """Change the password vcsim accepts from now on; returns the updated handle.

        Every login reads LABS_K8S_VCSIM_PASSWORD_FILE (tests/tools/vcsim/main.go): a login with
        the old password fails from now on, sessions already open stay valid.
        """
        assert self.password_file is not None, "started without a password file"
        self.password_file.write_text(new_password + "\n")
        return replace(self, password=new_password)


def vcsim_binary() -> str:
    """Path of a usable vcsim, building it first when we are root."""
    if os.geteuid() == 0:
        proc = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=1800, check=False)
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.splitlines()[-15:])
            unavailable(f"tests/tools/build_vcsim.sh failed ({proc.returncode}):\n{tail}")
        return proc.stdout.strip().splitlines()[-1]
    if CACHED_BINARY.is_file() and os.access(CACHED_BINARY, os.X_OK):
        return str(CACHED_BINARY)
    unavailable(f"no vcsim at {CACHED_BINARY}; run `sudo bash tests/tools/build_vcsim.sh`")
    raise AssertionError("unreachable")  # unavailable() always raises


def _read_url(proc: subprocess.Popen[str], stderr: tempfile._TemporaryFileWrapper[bytes], timeout_s: float) -> str:
    """The GOVC_URL line vcsim prints once it is listening (or fail with its stderr)."""
    found: list[str] = []

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            match = _URL_LINE.search(line)
            if match:
                found.append(match.group(1))
                return

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not found:
        proc.kill()
        proc.wait(timeout=5)
        stderr.seek(0)
        err = stderr.read().decode("utf-8", "replace")
        raise RuntimeError(f"vcsim did not start within {timeout_s:g}s (exit {proc.returncode}): {err[-2000:]}")
    return found[0]


def _wait_port(host: str, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


def _stop(proc: subprocess.Popen[str], stderr: tempfile._TemporaryFileWrapper[bytes]) -> None:
    if proc.poll() is None:
        # SIGTERM lets vcsim remove its temp datastore dirs (model.Remove()).
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()
    stderr.close()


@pytest.fixture
def vcsim_factory(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., Vcsim]]:
    """Start any number of simulators: ``vcsim_factory(hosts=2)`` (Topology fields)."""
    # Our client code must not see this machine's CA bundle variable: vcsim's
    # certificate is self-signed and the tests choose their TLS trust explicitly.
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    binary = vcsim_binary()
    running: list[tuple[subprocess.Popen[str], tempfile._TemporaryFileWrapper[bytes]]] = []

    def start(*, tls: tuple[Path, Path] | None = None, netns: str | None = None, **fields: int) -> Vcsim:
        """``tls=(cert, key)`` serves that certificate instead of vcsim's built-in one; ``netns``
        runs it on the loopback of that network namespace (the real-engine tests' sandbox)."""
        topology = Topology(**fields)
        cmd = [
            *(["ip", "netns", "exec", netns] if netns else []),
            binary, "-l", "127.0.0.1:0",
            "-username", USER, "-password", PASSWORD,
            *topology.flags(),
            *(["-tlscert", str(tls[0]), "-tlskey", str(tls[1])] if tls else []),
        ]  # fmt: skip
        # stderr goes to a file, not a pipe: vcsim logs there and an unread
        # pipe would fill up and block it mid-test.
        stderr = tempfile.NamedTemporaryFile(prefix="vcsim-", suffix=".log")  # noqa: SIM115 - closed in _stop
        password_file = tmp_path_factory.mktemp("vcsim-password") / "password"
        password_file.write_text(PASSWORD + "\n")
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,
            env={**os.environ, "LABS_K8S_VCSIM_PASSWORD_FILE": str(password_file)},
        )
        running.append((proc, stderr))
        url = _read_url(proc, stderr, START_TIMEOUT_S)
        match = re.search(r"@([^:/]+):(\d+)/", url)
        if match is None:
            raise RuntimeError(f"cannot parse vcsim URL {url!r}")
        host, port = match.group(1), int(match.group(2))
        if netns is None:  # inside a namespace it listens before it prints the URL (NewServer)
            _wait_port(host, port, START_TIMEOUT_S)
        return Vcsim(
            host=host,
            port=port,
            user=USER,
            password=PASSWORD,
            pid=proc.pid,
            topology=topology,
            password_file=password_file,
        )

    yield start
    for proc, stderr in running:
        _stop(proc, stderr)


@pytest.fixture
def vcsim(vcsim_factory: Callable[..., Vcsim]) -> Vcsim:
    """One datacenter, one cluster of 3 hosts, one datastore, no VMs."""
    return vcsim_factory(hosts=3)


@pytest.fixture
def vcsim_2hosts(vcsim_factory: Callable[..., Vcsim]) -> Vcsim:
    """Like ``vcsim`` but the cluster has only 2 hosts."""
    return vcsim_factory(hosts=2)
