"""Issue #30's impostor proof on the real pulumi-command: a step's pinned host key refuses an sshd
that presents another key, at a node's address and behind the real HAProxy on the VIP's SSH port.

The real Pulumi CLI, the real Python language host and the real pulumi-command 1.2.1 plugin
(tests/pulumi_engine.py) run a small program of its own, tests/engine_programs/pinned_step, whose
one step connects through the project's own `components.remote.connection` or
`cluster_connection` and is made by `components.remote.command`: the proof covers our code. The
hosts are real OpenSSH 9.2 sshd's (Debian 12's openssh-server, installed by
scripts/install-test-deps.sh with its service disabled), in the control planes' network namespaces
of tests/netns_lab.py, at the rendered lab's addresses, behind the real HAProxy and Keepalived with
the project's rendered haproxy.cfg (`listen control-plane-ssh`, VIP:2222, `balance first`). The CLI
runs in the lab's client namespace. Nothing listens outside those namespaces.

Each sshd presents host keys made by components/rendering/host_keys.py from a seed: a node its
Ed25519 key, a control plane also the cluster's shared ECDSA P-256 key. An impostor has the same
kinds of keys from other seeds. pulumi-command pins `hostKey` with `ssh.FixedHostKey` and offers
only that key's algorithm (provider/pkg/provider/remote/connection.go:85-98 at v1.2.1), whose
check answers `ssh: host key mismatch` (golang.org/x/crypto v0.48.0, the provider's go.mod:
ssh/client.go:262-263). That callback runs inside the key exchange, before the client sends any
user authentication: so the impostor's log (LogLevel DEBUG1) shows the key exchange and no
accepted key, no session, and the step's command never runs (the file it would write from its
stdin, a secret, does not exist). The control cases (the right keys) open the session and write
the file, so each check can fail; with the pin removed from `connection()` the impostor case
succeeds and its test fails.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import secrets
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from components.rendering.host_keys import HostKey, ecdsa_host_key, ed25519_host_key
from tests import netns_lab
from tests.labs import make_lab_config
from tests.netns_lab import NetnsLab
from tests.pulumi_engine import EngineLab, Result, toolchain_bin, workspace_copy
from tests.requirements import require_root, require_tool, unavailable

pytestmark = pytest.mark.integration

SSHD = "/usr/sbin/sshd"  # sshd re-executes itself and refuses to run from a relative path
PROGRAM = Path("tests") / "engine_programs" / "pinned_step"
# The step user's ids, only in each sshd's private /etc/passwd and /etc/group (bind-mounted in its
# own mount namespace): no account is added to this machine.
STEP_UID = 40000
# Enough to show that every dial is refused (pulumi-command dials dialErrorLimit + 1 times:
# connection.go:150-187), few enough to keep the failing cases short.
DIAL_ATTEMPTS = 2
MISMATCH = "ssh: host key mismatch"  # golang.org/x/crypto v0.48.0 ssh/client.go:263
MARKER = "step-ran"  # what the program's step writes, from its stdin, into the user's home
# sshd's own log lines (OpenSSH 9.2p1): the key exchange with the host key algorithm chosen
# (kex.c kex_choose_conf), the client's first user authentication request, which carries the user
# name (auth2.c input_userauth_request), a key accepted (auth2-pubkey.c, auth.c auth_log), a
# command run (session.c do_exec).
KEX = "kex: host key algorithm: {algorithm}"
USERAUTH = "userauth-request for user"
ACCEPTED = "Accepted "
SESSION = "Starting session: command"


def seed(*words: str) -> str:
    """A 32-byte host key seed (hex, as the stack's `random.RandomId.hex`), fixed per name."""
    return hashlib.sha256(" ".join(["labs-k8s test_real_ssh", *words]).encode()).hexdigest()


@dataclass
class Sshd:
    """One sshd run: the lab host it serves, its daemon name (tests/netns_lab.py), its files."""

    host: str  # m01, m02, m03 (tests/netns_lab.py)
    name: str
    directory: Path

    @property
    def log(self) -> Path:
        return self.directory / "sshd.log"

    @property
    def home(self) -> Path:
        return self.directory / "home"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def marker(self) -> Path:
        return self.home / MARKER


@dataclass
class SshLab:
    net: NetnsLab
    engine: EngineLab
    work: Path
    client_key: Path
    user: str

    def __post_init__(self) -> None:
        self._runs = itertools.count(1)
        self.running: list[Sshd] = []

    def node_key(self, host: str) -> HostKey:
        return ed25519_host_key(seed("node", host))

    @property
    def cluster_key(self) -> HostKey:
        return ecdsa_host_key(seed("cluster"))

    def serve(self, host: str, *, ed25519: HostKey, ecdsa: HostKey | None = None) -> Sshd:
        """A real sshd at host's address, port 22, presenting these keys (cloud-init writes a control
        plane's the same way: /etc/ssh/ssh_host_{ed25519,ecdsa}_key)."""
        run = next(self._runs)
        sshd = Sshd(host, f"sshd-{run:02d}-{host}", self.work / f"{run:02d}-{host}")
        sshd.directory.mkdir(mode=0o755)
        sshd.home.mkdir(mode=0o755)
        # The step user can write only its home (it is no root: `cat > "$HOME/step-ran"`).
        subprocess.run(["chown", f"{STEP_UID}:{STEP_UID}", str(sshd.home)], check=True)
        host_keys = []
        for key in (ed25519, ecdsa):
            if key is not None:
                path = sshd.directory / f"ssh_host_{key.kind}_key"
                path.write_text(key.private_openssh)
                path.chmod(0o600)  # sshd refuses a host key others can read
                host_keys.append(f"HostKey {path}")
        passwd = sshd.directory / "passwd"
        passwd.write_text(
            Path("/etc/passwd").read_text() + f"{self.user}:x:{STEP_UID}:{STEP_UID}::{sshd.home}:/bin/sh\n"
        )
        group = sshd.directory / "group"
        group.write_text(Path("/etc/group").read_text() + f"{self.user}:x:{STEP_UID}:\n")
        config = sshd.directory / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"ListenAddress {self.net.hosts[host].ip}:22",
                    *host_keys,
                    f"PidFile {sshd.directory / 'sshd.pid'}",
                    # No PAM stack of this machine's; the account checks sshd does itself remain.
                    "UsePAM no",
                    f"AllowUsers {self.user}",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    f"AuthorizedKeysFile {self.work / 'authorized_keys'}",
                    # The authorized keys live under /tmp (mode 1777), which StrictModes refuses as a
                    # parent directory (auth.c auth_secure_path): they are root's and not writable.
                    "StrictModes no",
                    "LogLevel DEBUG1",
                    "",
                ]
            )
        )
        # In a mount namespace of its own: the step user exists only there, and /run/sshd (the
        # privilege separation directory Debian's ssh.service makes) is on a private tmpfs.
        script = " && ".join(
            [
                f"mount --bind {shlex.quote(str(passwd))} /etc/passwd",
                f"mount --bind {shlex.quote(str(group))} /etc/group",
                "mount -t tmpfs -o mode=0755 labs-k8s-sshd /run",
                "mkdir -m 0755 /run/sshd",
                f"exec {SSHD} -D -f {shlex.quote(str(config))} -E {shlex.quote(str(sshd.log))}",
            ]
        )
        self.net.start_daemon(sshd.name, host, "unshare", "--mount", "--propagation", "private", "sh", "-c", script)
        self.running.append(sshd)
        ns = self.net.hosts[host].ns
        listening = lambda: bool(netns_lab.run("ip", "netns", "exec", ns, "ss", "-Hltn", "sport = :22").stdout.strip())  # noqa: E731
        if not netns_lab.wait_until(listening, 10):
            raise AssertionError(f"{sshd.name} did not listen:\n{sshd.log_text()[-3000:]}\n{self.net.log_tail()}")
        return sshd

    def stop_all(self) -> None:
        for sshd in self.running:
            if self.net.procs[sshd.name].poll() is None:
                self.net.stop_daemon(sshd.name, sshd.host)
        self.running.clear()

    def step(self, via: str, host_key: str, step_secret: str, create: str = "writes") -> Result:
        """`pulumi up` of the program on a new stack: one step through `via` pinned to `host_key`
        (`create`: the program's docstring)."""
        stack = f"{via}-{next(self._runs):02d}"
        cwd = ("--cwd", str(self.engine.workspace / PROGRAM))
        self.engine.pulumi("stack", "init", stack, *cwd)
        settings = {"via": via, "hostKey": host_key, "dialAttempts": str(DIAL_ATTEMPTS), "create": create}
        for key, value in settings.items():
            self.engine.pulumi("config", "set", *cwd, "--stack", stack, key, value)
        self.engine.pulumi(
            "config", "set", *cwd, "--stack", stack, "--secret", "privateKey", stdin=self.client_key.read_text()
        )
        self.engine.pulumi("config", "set", *cwd, "--stack", stack, "--secret", "stepSecret", stdin=step_secret)
        up = ("up", *cwd, "--stack", stack, "--yes", "--skip-preview", "--non-interactive", "--color", "never")
        return self.engine.run(f"pulumi-up-{stack}", "pulumi", *up, timeout=300)

    def explain(self, *sshds: Sshd) -> str:
        logs = "\n".join(f"--- {s.name} sshd.log\n{s.log_text()[-2500:]}" for s in sshds)
        return f"{self.engine.transcript(1)}\n{logs}"


def install_command_plugin(engine: EngineLab) -> None:
    """The pulumi-command plugin built from ../shared/third_party (the only one the program asks for)."""
    for plugin in json.loads((engine.bin_dir.parent / "plugins.json").read_text()):
        if plugin["name"] == "command":
            engine.pulumi(
                "plugin", "install", plugin["kind"], plugin["name"], plugin["version"], "--file", plugin["path"]
            )


@pytest.fixture(scope="module")
def ssh_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshLab]:
    require_root()
    require_tool(*netns_lab.TOOLS, "setpriv", "ssh-keygen", "unshare")
    if not os.access(SSHD, os.X_OK):
        unavailable(f"needs Debian's openssh-server ({SSHD}; scripts/install-test-deps.sh installs it)")
    bin_dir = toolchain_bin()
    cfg = make_lab_config()
    with NetnsLab(cfg) as net:
        root = tmp_path_factory.mktemp("real-ssh")
        workspace_copy(root / "workspace")
        (root / "home").mkdir()
        (root / "backend").mkdir()
        engine = EngineLab(root=root, netns=net.hosts["client"].ns, bin_dir=bin_dir)
        install_command_plugin(engine)
        engine.pulumi("login", f"file://{root / 'backend'}")
        # The sshd's files go under the lab's workdir (mode 0755): the step user must reach its home.
        work = net.workdir / "sshd"
        work.mkdir(mode=0o755)
        client_key = root / "client_ed25519"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "labs-k8s", "-f", str(client_key)], check=True
        )
        (work / "authorized_keys").write_text(client_key.with_suffix(".pub").read_text())
        (work / "authorized_keys").chmod(0o644)
        lab = SshLab(net, engine, work, client_key, cfg.ssh.user)
        try:
            yield lab
        finally:
            lab.stop_all()


@pytest.fixture
def ssh(ssh_lab: SshLab) -> Iterator[SshLab]:
    yield ssh_lab
    ssh_lab.stop_all()


def assert_refused(ssh: SshLab, up: Result, impostor: Sshd, algorithm: str) -> None:
    """The step failed with the provider's host key mismatch; the impostor saw a key exchange with
    the pinned algorithm, and no key accepted, no session, no command (no file from the stdin)."""
    explain = ssh.explain(impostor)
    assert not up.ok, f"the step succeeded against an impostor presenting another key:\n{explain}"
    assert MISMATCH in up.output, f"the step failed, but not with the provider's {MISMATCH!r}:\n{explain}"
    log = impostor.log_text()
    assert KEX.format(algorithm=algorithm) in log, f"no key exchange reached the impostor:\n{explain}"
    assert USERAUTH not in log, f"the client asked the impostor to authenticate it:\n{explain}"
    assert ACCEPTED not in log and SESSION not in log, f"the impostor opened a session:\n{explain}"
    assert not impostor.marker().exists(), f"the step's command ran on the impostor:\n{explain}"
    # Every dial the provider made met the same refusal (dialErrorLimit + 1 attempts), each one
    # closed by the client after the key exchange, before any authentication (`[preauth]`).
    assert log.count(KEX.format(algorithm=algorithm)) == DIAL_ATTEMPTS + 1, explain
    assert len(re.findall(r"Connection closed by \S+ port \d+ \[preauth\]", log)) == DIAL_ATTEMPTS + 1, explain


def assert_ran_on(ssh: SshLab, up: Result, sshd: Sshd, step_secret: str) -> None:
    explain = ssh.explain(sshd)
    assert up.ok, f"the step failed against the host with the pinned key:\n{explain}"
    log = sshd.log_text()
    assert USERAUTH in log and ACCEPTED in log and SESSION in log, f"no session in the host's log:\n{explain}"
    assert sshd.marker().read_text() == step_secret, explain


def test_a_node_step_refuses_an_sshd_at_the_nodes_address_with_another_host_key(ssh: SshLab) -> None:
    node = "m01"
    impostor = ssh.serve(node, ed25519=ed25519_host_key(seed("impostor", node)))
    step_secret = secrets.token_hex(16)
    up = ssh.step("node", ssh.node_key(node).public_openssh, step_secret)
    assert_refused(ssh, up, impostor, "ssh-ed25519")


def test_a_node_step_runs_on_the_sshd_with_the_pinned_host_key(ssh: SshLab) -> None:
    node = "m01"
    right = ssh.serve(node, ed25519=ssh.node_key(node))
    step_secret = secrets.token_hex(16)
    up = ssh.step("node", ssh.node_key(node).public_openssh, step_secret)
    assert_ran_on(ssh, up, right, step_secret)
    assert KEX.format(algorithm="ssh-ed25519") in right.log_text()


def serve_control_planes(ssh: SshLab, impostor: str | None = None) -> dict[str, Sshd]:
    """An sshd on every control plane with its own Ed25519 key and the cluster's ECDSA key, but
    `impostor`'s ECDSA key from another seed; returns once HAProxy's `control-plane-ssh` has them all UP."""
    served = {}
    for host in ssh.net.apiserver_keys:
        ecdsa = ecdsa_host_key(seed("impostor cluster")) if host == impostor else ssh.cluster_key
        served[host] = ssh.serve(host, ed25519=ssh.node_key(host), ecdsa=ecdsa)
    balancer = ssh.net.balancer_keys[0]
    names = list(ssh.net.apiserver_names.values())

    def all_up() -> bool:
        states = ssh.net.server_states(balancer, proxy="control-plane-ssh")
        return all(states.get(name) == "UP" for name in names)

    assert netns_lab.wait_until(all_up, 20, 0.2), ssh.net.log_tail()
    assert ssh.net.vip_holders() == {balancer}, ssh.net.log_tail()
    return served


def test_a_step_through_the_vip_runs_on_the_first_control_plane_with_the_cluster_key(ssh: SshLab) -> None:
    served = serve_control_planes(ssh)
    step_secret = secrets.token_hex(16)
    up = ssh.step("vip", ssh.cluster_key.public_openssh, step_secret)
    first, *others = served.values()
    assert_ran_on(ssh, up, first, step_secret)
    assert KEX.format(algorithm="ecdsa-sha2-nistp256") in first.log_text()
    # Through HAProxy: the session comes from the balancer that holds the VIP.
    balancer = ssh.net.hosts[ssh.net.balancer_keys[0]].ip
    assert f"Accepted publickey for {ssh.user} from {balancer} " in first.log_text(), ssh.explain(first)
    for sshd in others:
        assert not sshd.marker().exists() and ACCEPTED not in sshd.log_text(), ssh.explain(sshd)


def test_a_step_through_the_vip_refuses_the_control_plane_haproxy_picks_when_it_has_another_key(
    ssh: SshLab,
) -> None:
    first = ssh.net.apiserver_keys[0]  # `balance first`: HAProxy sends every session to it
    served = serve_control_planes(ssh, impostor=first)
    step_secret = secrets.token_hex(16)
    up = ssh.step("vip", ssh.cluster_key.public_openssh, step_secret)
    assert_refused(ssh, up, served[first], "ecdsa-sha2-nistp256")
    # HAProxy sent the sessions to the impostor, and no other control plane ran the step either.
    for host, sshd in served.items():
        if host != first:
            assert not sshd.marker().exists() and ACCEPTED not in sshd.log_text(), ssh.explain(sshd)


def test_a_leave_guards_no_op_create_reads_its_bundle_so_the_step_does_not_end_in_eof(ssh: SshLab) -> None:
    """A leave guard's create does nothing, but pulumi-command sends the bundle (for the delete) on
    every run, and x/crypto/ssh reports the stdin copy's error when the command exits first
    (components/remote.py NO_OP_CREATE). The control: a command that ends without reading a bundle
    larger than the server's window fails the step with a bare `EOF`, the failure the lab in a box
    met through the VIP in about one `up` of two while the no-op create was `true` (there the
    race was the client's copy starting after sshd had closed the channel; here it is certain).
    NO_OP_CREATE reads the same bundle to its end, and the step succeeds."""
    served = serve_control_planes(ssh)
    first = next(iter(served.values()))
    control = ssh.step("vip", ssh.cluster_key.public_openssh, secrets.token_hex(16), create="ignores-stdin")
    assert not control.ok and 'error: EOF: running "sleep 2"' in control.output, ssh.explain(first)
    up = ssh.step("vip", ssh.cluster_key.public_openssh, secrets.token_hex(16), create="no-op")
    explain = ssh.explain(first)
    assert up.ok, f"the no-op create of a step with a bundle failed:\n{explain}"
    assert first.log_text().count(SESSION) == 2, explain
    assert not first.marker().exists(), explain
