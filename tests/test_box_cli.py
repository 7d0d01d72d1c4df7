"""`make box` and `make box-down` as a user meets them (tests/box_cli.py, issue #51): what the
terminal shows, the order of the checks, Ctrl-C, and what the build scripts assume of the machine.
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from components.tools.offline import REPO_ROOT
from tests import box_cli
from tests.requirements import require_root, require_tool


def test_no_tracked_file_names_a_directory_of_one_machine() -> None:
    """The third-party snapshots are found from the checkout (../shared/third_party) or
    LABS_K8S_THIRD_PARTY: an absolute path of one machine means nothing on a user's. Not even its
    root, where the checkouts of this project's own machines live (a fallback once hid there)."""
    found = subprocess.run(
        ["git", "grep", "-nIF", "/work/", "--", ".", ":!tests/test_box_cli.py"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert found.stdout == "", f"machine-specific paths:\n{found.stdout}"


def test_make_box_refuses_a_user_without_root_before_it_installs_or_builds(tmp_path: Path) -> None:
    """Not being root was found after pip, vcsim and ten minutes of Go: the check comes first, and
    nothing is installed or compiled before it."""
    require_root()  # to become an unprivileged user
    home = tmp_path / "home"
    home.mkdir()
    tmp_path.chmod(0o755)
    home.chmod(0o777)
    run = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "make", "--no-print-directory", "box",
         f"BOX={home / 'box'}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(home)},
    )  # fmt: skip
    output = run.stdout + run.stderr
    assert run.returncode != 0, output
    assert output.splitlines()[0].startswith("make box: needs root"), output
    for build in ("pip", "install-test-deps", "build_vcsim", "build_toolchain", "go build"):
        assert build not in output, f"{build} ran before the root check:\n{output}"


def test_the_plugins_source_snapshots_are_a_prerequisite_checked_first(tmp_path: Path) -> None:
    """Without ../shared/third_party (or LABS_K8S_THIRD_PARTY) and no toolchain built, the plugin
    build fails after pip, apt and vcsim: the check names the directory before any of them."""
    repo = tmp_path / "labs-k8s"
    repo.mkdir()
    problem = box_cli.third_party_problem(repo, {})
    assert problem is not None and str(tmp_path / "shared" / "third_party") in problem, problem
    assert "LABS_K8S_THIRD_PARTY" in problem, problem
    snapshots = tmp_path / "snapshots"
    snapshots.mkdir()
    (snapshots / "MANIFEST.json").write_text("[]")
    assert box_cli.third_party_problem(repo, {"LABS_K8S_THIRD_PARTY": str(snapshots)}) is None
    built = repo / ".cache" / "toolchain" / "0123"  # build_toolchain.sh's output: plugins.json beside bin/
    built.mkdir(parents=True)
    (built / "plugins.json").write_text("{}")
    assert box_cli.third_party_problem(repo, {}) is None


def test_a_second_make_box_says_the_box_is_up_and_where(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    require_root()
    root = tmp_path / "box"
    root.mkdir()
    (root / "holder.pid").write_text(str(os.getpid()))  # a live holder
    kubeconfig = root / "kubeconfig"
    (root / "status.json").write_text(json.dumps({
        "ok": True, "log": "up.log", "artifacts": "artifacts", "netns": "lk8s-engine-1-0", "workspace": "ws",
        "kubeconfig": str(kubeconfig), "kubectl": f"KUBECONFIG={kubeconfig} kubectl get --raw /readyz",
    }))  # fmt: skip
    assert box_cli.up(root) == 0
    out = capsys.readouterr().out
    assert "the box is up already" in out, out
    assert f"KUBECONFIG={kubeconfig} kubectl" in out, out
    assert str(root / "holder.log") in out, out
    assert (root / "holder.pid").exists(), "a second make box touched the running box"


def test_box_down_says_what_it_leaves_and_how_to_remove_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(box_cli, "INSTALLED", tmp_path / "box-installed-packages")
    assert box_cli.down(tmp_path / "box") == 0
    out = capsys.readouterr().out
    for left in ("~/.cache/labs-k8s", "apt-get purge", "install-test-deps.sh", ".cache/", "rm -rf", "pulumi"):
        assert left in out, f"box-down does not mention {left!r}:\n{out}"
    # The packages a box's build installed are named, for the one command that removes them.
    (tmp_path / "box-installed-packages").write_text("keepalived haproxy\n")
    assert box_cli.down(tmp_path / "box") == 0
    assert "sudo apt-get purge haproxy keepalived" in capsys.readouterr().out


def test_each_build_prints_one_line_and_keeps_its_detail_in_the_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A successful `make box` printed 38 `go: upgraded` lines and git's whitespace warnings."""
    chatter = "import sys; print('go: upgraded golang.org/x/net v0.1.0 => v0.2.0', file=sys.stderr)"
    builds = [box_cli.Build("vcsim", (sys.executable, "-c", chatter)),
              box_cli.Build("the Pulumi CLI", (sys.executable, "-c", chatter))]  # fmt: skip
    monkeypatch.setattr(box_cli, "BUILDS", builds)
    log = tmp_path / "build.log"
    assert box_cli.build_all(log, started=0.0) is True
    out = capsys.readouterr().out
    assert "go: upgraded" not in out, out
    assert len(out.splitlines()) == 2, out
    assert "vcsim" in out and "the Pulumi CLI" in out, out
    assert log.read_text().splitlines().count("go: upgraded golang.org/x/net v0.1.0 => v0.2.0") == 2

    failing = "import sys; print('the error', file=sys.stderr); sys.exit(3)"
    monkeypatch.setattr(box_cli, "BUILDS", [box_cli.Build("vcsim", (sys.executable, "-c", failing))])
    assert box_cli.build_all(log, started=0.0) is False
    captured = capsys.readouterr()
    assert "vcsim failed" in captured.err and "the error" in captured.err and str(log) in captured.err, captured


def box_processes(pid: int) -> list[str]:
    """What a holder `pid` made that is still there: its namespaces, and the holder itself."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    left = [line.split()[0] for line in listed.splitlines() if f"-{pid}-" in line]
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 0)
        left.append(f"the holder, pid {pid}")
    return left


def interrupt_when(proc: subprocess.Popen[str], wanted: str, timeout: float) -> list[str]:
    """Read `proc`'s output until a line holds `wanted`, then Ctrl-C it as a terminal does (SIGINT
    to its whole process group); the lines read."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        lines.append(line)
        if wanted in line:
            os.killpg(proc.pid, signal.SIGINT)
            return lines
        assert time.monotonic() < deadline, f"no {wanted!r} in {timeout:g}s:\n{''.join(lines)}"
    raise AssertionError(f"ended before {wanted!r}:\n{''.join(lines)}")


def test_ctrl_c_during_the_builds_says_so_in_one_line(tmp_path: Path) -> None:
    script = (
        "import sys; from tests import box_cli\n"
        "box_cli.BUILDS = [box_cli.Build('a slow build', ('sleep', '60'))]\n"
        "sys.exit(box_cli.main(['up', sys.argv[1]]))\n"
    )
    require_root()
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "box")], cwd=REPO_ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    lines = interrupt_when(proc, "a slow build", timeout=60)
    rest, _ = proc.communicate(timeout=30)
    output = "".join(lines) + rest
    assert proc.returncode == 130, output
    assert "Traceback" not in output, output
    assert rest.strip().splitlines() == [
        "make box: Ctrl-C during the builds; no box was started (the next make box builds what did not finish)"
    ], output


@pytest.mark.integration
@pytest.mark.timeout(3600)
@pytest.mark.parametrize(
    "phase",
    # the cached builds (not cut: the holder stops at the next phase), vcsim starting, make up running
    ["the sealed template rootfs", "vcsim, the CLI's namespace", "make up: "],
)
def test_ctrl_c_mid_way_tears_the_box_down(tmp_path: Path, phase: str) -> None:
    """Ctrl-C while the box comes up (its holder runs in a session of its own): the box is torn down
    as `make box-down` does, without a traceback, and nothing of it is left."""
    require_root()
    root = tmp_path / "box"
    proc = subprocess.Popen(
        ["make", "--no-print-directory", "box", f"BOX={root}"], cwd=REPO_ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    lines = interrupt_when(proc, phase, timeout=3000)
    holder = int((root / "holder.pid").read_text())
    rest, _ = proc.communicate(timeout=600)
    output = "".join(lines) + rest
    assert "Traceback" not in output, output
    assert "make box: Ctrl-C: tearing the box down" in output, output
    assert "make box: the box is gone" in output, output
    assert box_processes(holder) == [], output
    assert not root.exists(), output


EXAMPLE_NETWORK = ipaddress.ip_network("10.3.60.0/24")  # Pulumi.labs.yaml's node network: the box's


@pytest.fixture(scope="module")
def made_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, subprocess.CompletedProcess[str]]]:
    """`make box` as a user types it (in a directory of the test's own), then `make box-down`."""
    require_root()
    root = tmp_path_factory.mktemp("made-box") / "box"
    run = subprocess.run(
        ["make", "--no-print-directory", "box", f"BOX={root}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=3500, check=False,
    )  # fmt: skip
    try:
        yield root, run
    finally:
        subprocess.run(["make", "--no-print-directory", "box-down", f"BOX={root}"], cwd=REPO_ROOT, check=False)


def printed(run: subprocess.CompletedProcess[str], label: str) -> str:
    lines = [line.split(label, 1)[1].strip() for line in run.stdout.splitlines() if label in line]
    assert lines, f"no {label!r} line:\n{run.stdout}{run.stderr}"
    return lines[0]


@pytest.mark.integration
@pytest.mark.timeout(3600)
def test_make_box_prints_each_phase_and_one_line_per_build(
    made_box: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    root, run = made_box
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == f"make box: logs: {root}/build.log (the builds), {root}/holder.log (the box)", run.stdout
    for phase in ("the virtualenv", "system packages", "vcsim (Go", "the Pulumi CLI and plugins", "sealed template",
                  "package mirror", "vcsim, the CLI's namespace", "make up --yes", "the lab is up"):  # fmt: skip
        assert any(phase in line for line in lines), f"no {phase!r} line:\n{run.stdout}"
    assert all(re.match(r"make box: \[ ?\d+:\d\d\] ", line) for line in lines[1:9]), run.stdout
    done = [int(n) for n in re.findall(r"make up: (\d+) resources done", run.stdout)]
    assert done and max(done) > 0, f"make up's progress counted nothing:\n{run.stdout}"
    assert f"remove it:   make box-down BOX={root}" in run.stdout, run.stdout
    for chatter in ("go: upgraded", "could not be built", "warning:"):
        assert chatter not in run.stdout + run.stderr, run.stdout + run.stderr


@pytest.mark.integration
@pytest.mark.timeout(3600)
def test_the_printed_kubectl_line_works_from_the_machine_over_loopback(
    made_box: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    """Major 1: the kubeconfig's server is a loopback port forwarded into the box's VIP, and a real
    kubectl verifies the API server's certificate through it."""
    root, run = made_box
    line = printed(run, "try it:")
    assert line.startswith(f"KUBECONFIG={root}/kubeconfig kubectl "), line
    config = yaml.safe_load((root / "kubeconfig").read_text())
    cluster = config["clusters"][0]["cluster"]
    server = urllib.parse.urlsplit(cluster["server"])
    assert server.hostname == "127.0.0.1", cluster
    assert "insecure-skip-tls-verify" not in (root / "kubeconfig").read_text()
    assert cluster["certificate-authority-data"] and cluster["tls-server-name"], cluster
    listening = subprocess.run(["ss", "-Hltn", f"sport = :{server.port}"], capture_output=True, text=True, check=True)
    assert [row.split()[3] for row in listening.stdout.splitlines()] == [f"127.0.0.1:{server.port}"], listening.stdout
    done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr
    # And a certificate it does not name is refused: the check is real.
    config["clusters"][0]["cluster"]["tls-server-name"] = "not-the-api-server.example"
    (root / "wrong-name").write_text(yaml.safe_dump(config))
    (root / "wrong-name").chmod(0o600)
    refused = subprocess.run(["kubectl", "--kubeconfig", str(root / "wrong-name"), "get", "--raw", "/readyz"],
                             capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert refused.returncode != 0 and "certificate" in refused.stderr, refused.stderr


@pytest.mark.integration
@pytest.mark.timeout(3600)
def test_the_machine_has_no_route_or_socket_to_the_example_addresses(
    made_box: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    """The example's addresses live only inside the box's namespaces: nothing the box does may send
    traffic to them on the machine's own network (the user's network may have them)."""
    _, run = made_box
    subprocess.run(["bash", "-c", printed(run, "try it:")], capture_output=True, timeout=60, check=False)
    found = []
    addresses = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
    routes = subprocess.run(["ip", "route", "show", "table", "all"], capture_output=True, text=True, check=True).stdout
    sockets = subprocess.run(["ss", "-Htanu"], capture_output=True, text=True, check=True).stdout
    for kind, text in (("address", addresses), ("route", routes), ("socket", sockets)):
        for line in text.splitlines():
            for word in re.findall(r"\d+\.\d+\.\d+\.\d+", line):
                if ipaddress.ip_address(word) in EXAMPLE_NETWORK:
                    found.append(f"{kind}: {line}")
    assert found == [], "\n".join(found)


@pytest.mark.integration
@pytest.mark.timeout(3600)
def test_make_box_shell_reaches_the_boxs_stack(made_box: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    root, run = made_box
    assert f"make box-shell BOX={root}" in printed(run, "the stack:"), run.stdout
    shell = subprocess.run(
        ["make", "--no-print-directory", "box-shell", f"BOX={root}"], cwd=REPO_ROOT, capture_output=True, text=True,
        input="pulumi stack output --stack mysite apiEndpoint\n", timeout=300, check=False,
    )  # fmt: skip
    assert shell.returncode == 0, shell.stdout + shell.stderr
    assert "10.3.60.100" in shell.stdout, shell.stdout + shell.stderr


@pytest.mark.integration
@pytest.mark.timeout(3600)
def test_a_second_make_box_with_the_box_up_repeats_where_things_are(
    made_box: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    root, run = made_box
    again = subprocess.run(
        ["make", "--no-print-directory", "box", f"BOX={root}"], cwd=REPO_ROOT, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert "the box is up already" in again.stdout, again.stdout
    assert printed(again, "try it:") == printed(run, "try it:")


READYZ_SERVER = """
import http.server, ssl, sys
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Type", "text/plain"); self.end_headers()
        self.wfile.write(b"ok")
server = http.server.HTTPServer(("10.3.60.100", 6443), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(sys.argv[1], sys.argv[2])
server.socket = context.wrap_socket(server.socket, server_side=True)
print("READY", flush=True)
server.serve_forever()
"""


def test_the_loopback_kubeconfig_reaches_a_server_only_inside_a_namespace(tmp_path: Path) -> None:
    """The forwarder without the box: a TLS server on the example's VIP inside a namespace of the
    test's own, the stack's kind of kubeconfig (server the VIP, the CA's data) rewritten for a
    loopback port, and the machine's real kubectl through it, the certificate checked."""
    require_root()
    require_tool("openssl", "kubectl")
    pki = tmp_path / "pki"
    pki.mkdir()

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=pki, capture_output=True, check=True)

    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
            "-subj", "/CN=box test CA", "-keyout", "ca.key", "-out", "ca.crt")  # fmt: skip
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=kube-apiserver",
            "-keyout", "server.key", "-out", "server.csr")  # fmt: skip
    (pki / "ext").write_text("subjectAltName=DNS:kubernetes,IP:10.3.60.100\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "1", "-extfile", "ext", "-out", "server.crt")  # fmt: skip
    netns = f"lk8s-boxtest-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    server = None
    try:
        subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True)
        subprocess.run(["ip", "-n", netns, "addr", "add", "10.3.60.100/32", "dev", "lo"], check=True)
        server = subprocess.Popen(
            ["ip", "netns", "exec", netns, sys.executable, "-c", READYZ_SERVER, str(pki / "server.crt"),
             str(pki / "server.key")], stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert server.stdout is not None and server.stdout.readline().strip() == "READY"
        ca = base64.b64encode((pki / "ca.crt").read_bytes()).decode()
        stack_kubeconfig = yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "labs",
            "clusters": [{"name": "labs", "cluster": {"server": "https://10.3.60.100:6443",
                                                      "certificate-authority-data": ca}}],
            "users": [{"name": "admin", "user": {"token": "not-checked-by-this-server"}}],
            "contexts": [{"name": "labs", "context": {"cluster": "labs", "user": "admin"}}],
        })  # fmt: skip
        text, port = box_cli.loopback_kubeconfig(stack_kubeconfig, netns)
        config = yaml.safe_load(text)
        assert config["clusters"][0]["cluster"]["server"] == f"https://127.0.0.1:{port}"
        assert "insecure-skip-tls-verify" not in text
        (tmp_path / "kubeconfig").write_text(text)
        kubectl = ["kubectl", "--kubeconfig", str(tmp_path / "kubeconfig"), "get", "--raw", "/readyz"]
        done = subprocess.run(kubectl, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr
        config["clusters"][0]["cluster"]["tls-server-name"] = "not-the-api-server.example"
        (tmp_path / "kubeconfig").write_text(yaml.safe_dump(config))
        refused = subprocess.run(kubectl, capture_output=True, text=True, timeout=60, check=False)
        assert refused.returncode != 0 and "certificate" in refused.stderr, refused.stdout + refused.stderr
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(["ip", "netns", "del", netns], check=False)


# A daemon whose init script returns once it signalled it, as Debian's keepalived script does
# (start-stop-daemon --stop without --retry), that takes a second to exit, and has no status action.
SLOW_DAEMON = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: (time.sleep(1), sys.exit(0)))\n"
INIT_SCRIPT = """#!/bin/sh
case "$1" in
start) pidof box-slowd >/dev/null || { setsid {daemon} -c '{code}' </dev/null >/dev/null 2>&1 & } ;;
stop) kill $(pidof box-slowd) 2>/dev/null; exit 0 ;;
*) echo "Usage: /etc/init.d/box-slowd {start|stop|restart}" >&2; exit 3 ;;
esac
"""


def host_systemctl(tmp_path: Path, script: str) -> subprocess.CompletedProcess[str]:
    """`script` with the box's systemctl stand-in as `systemctl`, its /etc/init.d, /etc/systemd and
    /var/log the test's own (a mount namespace of its own)."""
    for sub in ("init.d", "systemd", "log", "bin"):
        (tmp_path / sub).mkdir(exist_ok=True)
    (tmp_path / "bin" / "box-slowd").symlink_to(os.path.realpath(sys.executable))
    init = tmp_path / "init.d" / "box-slowd"
    code = SLOW_DAEMON + "time.sleep(600)\n"
    init.write_text(INIT_SCRIPT.replace("{daemon}", str(tmp_path / "bin" / "box-slowd")).replace("{code}", code))
    init.chmod(0o755)
    (tmp_path / "bin" / "systemctl").symlink_to(REPO_ROOT / "tests/tools/box/sbin/systemctl.sh")
    mounts = " && ".join(f"mount --bind {tmp_path / sub} {target}" for sub, target in
                         (("init.d", "/etc/init.d"), ("systemd", "/etc/systemd"), ("log", "/var/log")))  # fmt: skip
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", f"{mounts} && {script}"],
        capture_output=True, text=True, timeout=120, check=False,
        env={"PATH": f"{tmp_path / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
    )  # fmt: skip


def test_the_boxs_systemctl_stop_returns_once_the_daemon_is_gone(tmp_path: Path) -> None:
    require_root()
    try:
        run = host_systemctl(tmp_path, "systemctl start box-slowd && sleep 0.5 && systemctl stop box-slowd && "
                                       "{ pidof box-slowd && echo STILL-RUNNING; true; } && systemctl start box-slowd "
                                       "&& sleep 0.5 && pidof box-slowd >/dev/null && echo RESTARTED")  # fmt: skip
        assert "STILL-RUNNING" not in run.stdout, run.stdout + run.stderr
        assert "RESTARTED" in run.stdout, run.stdout + run.stderr
    finally:
        subprocess.run(["pkill", "-KILL", "-x", "box-slowd"], check=False)


def test_the_boxs_systemctl_status_answers_as_systemd_does(tmp_path: Path) -> None:
    require_root()
    try:
        run = host_systemctl(tmp_path, "systemctl start box-slowd; sleep 0.5; systemctl status box-slowd; "
                                       "echo EXIT=$?; systemctl stop box-slowd; systemctl status box-slowd; "
                                       "echo EXIT=$?")  # fmt: skip
    finally:
        subprocess.run(["pkill", "-KILL", "-x", "box-slowd"], check=False)
    output = run.stdout + run.stderr
    assert "Usage" not in output, output
    running, stopped = run.stdout.split("EXIT=0\n")
    assert "● box-slowd.service - " in running and "Active: active (running)" in running, output
    assert "Active: inactive (dead)" in stopped and stopped.rstrip().endswith("EXIT=3"), output
