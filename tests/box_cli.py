"""`make box` and `make box-down`: the lab in a box for a user without a vCenter (README, "Try it
without a vCenter"; docs/testing.md, "The lab in a box", says what is real and what is simulated).

`up` starts a holder process in the background that opens the box (tests/test_lab_box.py
`open_box`: vcsim, the package mirror, a host per clone) under `.box/`, runs `make up` against it
as a user would, writes the kubeconfig output to `.box/kubeconfig`, its server a port on 127.0.0.1
forwarded into the box's VIP (`loopback_kubeconfig`), and keeps the box running; the
foreground follows its log and prints where the kubeconfig and the logs are. `down` stops the
holder, which tears down everything it made (hosts, namespaces, vcsim, the mirror), and removes
`.box/`. Linux and root only: the box is network and mount namespaces.

`up` runs under the machine's python3 (stdlib only): it checks the prerequisites before anything is
installed or compiled, then runs the builds (each one line on the terminal, its detail in
`.box/build.log`), then starts the holder in the virtualenv.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import NamedTuple

from tests import installed_toolchain

REPO = Path(__file__).resolve().parents[1]
BOX_ROOT = REPO / ".box"
UP_TIMEOUT_S = 3600
VENV_PYTHON = REPO / ".venv" / "bin" / "python"


class Build(NamedTuple):
    """One thing `make box` installs or compiles before the box: a name for the terminal, a command."""

    name: str
    argv: tuple[str, ...]


# In make's order for `make test`; the first run compiles the Pulumi CLI and plugins (~10 min on
# 2 cores), later runs find each cached and take seconds.
BUILDS = [
    Build("the virtualenv (pinned Python packages)", ("make", "--no-print-directory", "venv-dev")),
    Build("system packages (apt: haproxy, keepalived, cloud-init, debootstrap, ...)",
          ("bash", "scripts/install-test-deps.sh")),
    Build("vcsim (Go, from the module proxy)", ("bash", "tests/tools/build_vcsim.sh")),
    Build("the Pulumi CLI and plugins (Go; about 10 minutes the first time)",
          ("bash", "tests/tools/build_toolchain.sh")),
]  # fmt: skip
# What `make box` leaves on the machine and `make box-down` does not remove: said by box-down.
# The packages install-test-deps.sh installed for a box ("installed ..." lines), kept across boxes
# so box-down can name them: the box's own log goes with the box.
INSTALLED = Path(os.environ.get("LABS_K8S_CACHE", Path.home() / ".cache" / "labs-k8s")) / "box-installed-packages"
LEFT_BEHIND = """make box-down: left on this machine (shared with `make test`, kept so the next `make box` is fast):
  system packages make box installed  {packages}
  the box's cache (about 2-3 GB)      ~/.cache/labs-k8s (rootfs, package mirror): sudo rm -rf ~/.cache/labs-k8s
  the built tools and Go's caches     .cache/ in this checkout and ~/go: rm -rf .cache; go clean -cache -modcache
  Pulumi's own logs, if it wrote any  /tmp/pulumi.*.log (glog files): sudo rm -f /tmp/pulumi.*.log"""


def third_party_problem(repo: Path, environ: dict[str, str]) -> str | None:
    """The provider plugins are compiled from source snapshots (tests/tools/build_plugins.sh): a
    machine without them and without a built toolchain would find out after pip, apt and vcsim."""
    if any((repo / ".cache" / "toolchain").glob("*/plugins.json")):
        return None  # built before; build_toolchain.sh says if its inputs changed
    for place in (environ.get("LABS_K8S_THIRD_PARTY", ""), str(repo.parent / "shared" / "third_party")):
        if place and (Path(place) / "MANIFEST.json").is_file():
            return None
    # A Pulumi installed at exactly the pinned versions needs no snapshot (nothing is compiled).
    manifest = json.loads((REPO / "tests" / "tools" / "toolchain" / "manifest.json").read_text())
    installed, why = installed_toolchain.find(manifest, environ)
    if installed is not None:
        return None
    cli, _, plugins = installed_toolchain.pins(manifest)
    named = ", ".join(f"{name} {version}" for name, version in plugins.items())
    return (f"needs the provider plugins' source snapshots (MANIFEST.json and the archives) in "
            f"{repo.parent / 'shared' / 'third_party'} or the directory LABS_K8S_THIRD_PARTY names, or Pulumi "
            f"{cli} installed with the resource plugins {named} (here: {why}; "
            f'README, "Try it without a vCenter")')  # fmt: skip


def problems() -> list[str]:
    """What stops the box on this machine, found before anything is installed or compiled."""
    if sys.platform != "linux":
        return ["needs Linux (the box is network and mount namespaces)"]
    if os.geteuid() != 0:
        return ["needs root (network and mount namespaces, apt): sudo make box"]
    found = []
    for tool, why in (("apt-get", "Debian or Ubuntu, for the system packages"), ("git", "to copy the checkout"),
                      ("unshare", "util-linux"), ("ip", "iproute2")):  # fmt: skip
        if shutil.which(tool) is None:
            found.append(f"needs {tool} ({why})")
    go = subprocess.run(["bash", "-c", f"source {REPO}/tests/tools/go_env.sh && go_binary"],
                        capture_output=True, text=True, check=False)  # fmt: skip
    if go.returncode != 0:
        found.append(go.stderr.strip() or "needs Go 1.25 or newer")
    snapshots = third_party_problem(REPO, dict(os.environ))
    if snapshots is not None:
        found.append(snapshots)
    if sys.version_info < (3, 11) and not VENV_PYTHON.exists():
        found.append(f"needs Python 3.11+ (python3 here is {sys.version.split()[0]}): make box PYTHON=python3.11")
    if not found and shutil.which("unshare") is not None:
        tried = subprocess.run(["unshare", "--net", "--mount", "true"], capture_output=True, text=True, check=False)
        if tried.returncode != 0:
            found.append(f"cannot make network namespaces here ({tried.stderr.strip()}): a container without them?")
    return found


def elapsed(started: float) -> str:
    seconds = int(time.monotonic() - started)
    return f"[{seconds // 60:2d}:{seconds % 60:02d}]"


def build_all(log: Path, started: float) -> bool:
    """Each build's output into `log`, one line each on the terminal; a failure prints its tail."""
    for build in BUILDS:
        print(f"make box: {elapsed(started)} {build.name}", flush=True)
        with open(log, "a") as out:
            out.write(f"\n=== {build.name}: {' '.join(build.argv)}\n")
            out.flush()
            done = subprocess.run(build.argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                  check=False)  # fmt: skip
        installed = [line.removeprefix("install-test-deps: installed ").strip()
                     for line in log.read_text(errors="replace").splitlines()
                     if line.startswith("install-test-deps: installed ")]  # fmt: skip
        if installed:
            INSTALLED.parent.mkdir(parents=True, exist_ok=True)
            known = set(INSTALLED.read_text().split()) if INSTALLED.is_file() else set()
            INSTALLED.write_text(" ".join(sorted(known | {p for line in installed for p in line.split()})) + "\n")
        if done.returncode != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            print(f"{tail}\nmake box: {build.name} failed (exit {done.returncode}); its whole output: {log}",
                  file=sys.stderr)  # fmt: skip
            return False
    return True


def _pid(root: Path) -> int | None:
    try:
        pid = int((root / "holder.pid").read_text())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    return pid


CLONE_NEWNET = 0x40000000  # <sched.h>; os.setns is Python 3.12+


def netns_connect(netns: str, address: tuple[str, int]) -> socket.socket:
    """A TCP connection made from inside `netns`: this thread joins it for the connect only (a
    network namespace is per thread, and a socket keeps the namespace it was made in)."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(f"/run/netns/{netns}") as target, open("/proc/thread-self/ns/net") as own:
        if libc.setns(target.fileno(), CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {netns}")
        try:
            connection = socket.create_connection(address, timeout=10)
        finally:
            if libc.setns(own.fileno(), CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back")  # this thread ends; no socket of it is used
    connection.settimeout(None)
    return connection


def pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def forward(listener: socket.socket, netns: str, address: tuple[str, int]) -> None:
    """Each connection to `listener` (127.0.0.1 on the machine) relayed to `address` inside `netns`,
    byte for byte: TLS is the API server's, end to end, and the machine never routes to `address`."""

    def relay(client: socket.socket) -> None:
        try:
            upstream = netns_connect(netns, address)
        except OSError:
            client.close()
            return
        threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
        pump(client, upstream)

    while True:
        client, _ = listener.accept()
        threading.Thread(target=relay, args=(client,), daemon=True).start()


def loopback_kubeconfig(text: str, netns: str) -> tuple[str, int]:
    """The stack's kubeconfig (its server the VIP, only inside the box) for the machine: the server
    a loopback port forwarded to the VIP, the certificate still checked against the cluster CA
    under the VIP's name (tls-server-name: the API server's certificate names the VIP)."""
    import yaml

    config = yaml.safe_load(text)
    (cluster,) = config["clusters"]
    server = urllib.parse.urlsplit(cluster["cluster"]["server"])
    assert server.hostname is not None
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))  # loopback only: nothing off the machine reaches the box
    listener.listen(64)
    port = listener.getsockname()[1]
    threading.Thread(target=forward, args=(listener, netns, (server.hostname, server.port or 443)), daemon=True).start()
    cluster["cluster"]["server"] = f"https://127.0.0.1:{port}"
    cluster["cluster"]["tls-server-name"] = server.hostname
    return yaml.safe_dump(config, sort_keys=False), port


class BoxStopped(Exception):
    """SIGTERM (`make box-down`, or Ctrl-C in `make box`) before the box was up: unwind and tear down."""


def sweep(pid: int) -> None:
    """What a holder `pid` may have made and not yet undone when it was stopped mid-way (before
    open_box's own teardown covered it): its namespaces, their processes, its hosts' CPU cgroup."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    for name in (line.split()[0] for line in listed.splitlines() if line.strip()):
        if name.startswith((f"lk8s-engine-{pid}-", f"lk8s-box-{pid}-")):
            pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, check=False)
            for member in pids.stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(member), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
    for group in (*Path("/sys/fs/cgroup").glob(f"labs-k8s-box-{pid}-*"),
                  *Path("/sys/fs/cgroup/cpu").glob(f"labs-k8s-box-{pid}-*")):  # fmt: skip
        with contextlib.suppress(OSError):
            group.rmdir()


def say(kind: str, text: str) -> None:
    """A line for the foreground to print (PHASE: a phase starts; PROGRESS: how far `make up` is)."""
    print(f"{kind} {text}", flush=True)


def count_done(events: Path, done: threading.Event) -> None:
    """`make up`'s progress from the engine's --event-log: resources finished, every 15 s."""
    shown = -1
    while not done.wait(15):
        try:
            finished = events.read_text(errors="replace").count('"resOutputsEvent"')  # the engine's own name
        except OSError:
            continue
        if finished != shown:
            say("PROGRESS", f"make up: {finished} resources done (the example has about 100)")
            shown = finished


def hold(root: Path) -> int:
    """The holder: open the box, `make up`, then wait for `down` (SIGTERM). A SIGTERM before the box
    is up unwinds open_box (its own teardown), then `sweep` takes what was made before that."""
    from tests.test_lab_box import open_box

    # The cached builds (debootstrap's rootfs, the recorded mirror) run in the machine's mount
    # namespace and are not cut: a SIGTERM then waits for the next phase (`pending`); from vcsim on,
    # everything the box makes is in its namespaces, and a SIGTERM unwinds at once.
    state = {"up": False, "stop": False, "cuttable": False, "pending": False}

    def stop_now() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one unwind; the teardown is not cut short
        raise BoxStopped

    def on_term(*_: object) -> None:
        if state["up"]:
            state["stop"] = True
        elif state["cuttable"]:
            stop_now()
        else:
            state["pending"] = True

    def phase(text: str) -> None:
        if state["pending"]:
            stop_now()
        say("PHASE", text)
        state["cuttable"] = state["cuttable"] or text.startswith("vcsim")

    signal.signal(signal.SIGTERM, on_term)
    status = root / "status.json"
    try:
        with open_box(root / "run", progress=phase) as box:
            lab = box.lab
            phase(f"make up --yes against the box (the CLI's output: {lab.artifacts})")
            done = threading.Event()
            threading.Thread(target=count_done, args=(lab.next_make_events("up"), done), daemon=True).start()
            up = lab.make("up", args="--yes", timeout=UP_TIMEOUT_S, cli_parallel=True)
            done.set()
            facts: dict[str, object] = {"ok": up.ok, "log": str(up.log), "artifacts": str(lab.artifacts),
                                        "netns": lab.netns, "workspace": str(lab.workspace)}  # fmt: skip
            if up.ok:
                shown = lab.pulumi("stack", "output", "--stack", lab.stack, "--show-secrets", "kubeconfig")
                text, port = loopback_kubeconfig(shown.stdout, lab.netns)
                kubeconfig = root / "kubeconfig"
                kubeconfig.touch(mode=0o600)
                kubeconfig.write_text(text)
                # The box's API servers are stand-ins: /readyz, /version and /api answer, not yet `get nodes`.
                facts |= {"kubeconfig": str(kubeconfig), "port": port,
                          "kubectl": f"KUBECONFIG={kubeconfig} kubectl get --raw /readyz"}  # fmt: skip
            # What `make box-shell` needs: the namespace, the trust store, the environment make up had.
            shell_facts = {"netns": lab.netns, "trust_store": str(lab.trust_store), "workspace": str(lab.workspace),
                           "env": lab.env(STACK=lab.stack)}  # fmt: skip
            (root / "shell.json").touch(mode=0o600)
            (root / "shell.json").write_text(json.dumps(shell_facts))
            state["up"] = True
            status.write_text(json.dumps(facts))
            while not state["stop"]:
                time.sleep(1)
            print("box: stopping", flush=True)
    except BoxStopped:
        print("box: stopped before it was up; tearing down", flush=True)
    finally:
        sweep(os.getpid())
    return 0


def follow(log: Path, offset: int, started: float) -> int:
    """Print the holder's PHASE and PROGRESS lines written since `offset`; the new offset."""
    with open(log, "rb") as text:
        text.seek(offset)
        chunk = text.read()
    complete = chunk[: chunk.rfind(b"\n") + 1]
    for line in complete.decode(errors="replace").splitlines():
        kind, _, rest = line.partition(" ")
        if kind in ("PHASE", "PROGRESS"):
            print(f"make box: {elapsed(started)} {rest}", flush=True)
    return offset + len(complete)


def interrupted(root: Path, holder: subprocess.Popen[bytes]) -> int:
    """Ctrl-C after the holder started: tear the box down as box-down does; a second Ctrl-C leaves
    that to the holder, in one line."""
    print("make box: Ctrl-C: tearing the box down, as make box-down does (Ctrl-C again: leave it to finish "
          "in the background)", file=sys.stderr, flush=True)  # fmt: skip
    try:
        holder.send_signal(signal.SIGTERM)
        try:
            # A first run's rootfs build (debootstrap, minutes) finishes before the holder stops.
            holder.wait(timeout=1800)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(holder.pid, signal.SIGKILL)
            sweep(holder.pid)
    except KeyboardInterrupt:
        print(f"make box: the box goes on tearing itself down in the background (pid {holder.pid}); "
              f"`make box-down` waits for it and removes {root}", file=sys.stderr)  # fmt: skip
        return 130
    shutil.rmtree(root, ignore_errors=True)
    print("make box: the box is gone", file=sys.stderr)
    return 130


def up(root: Path) -> int:
    found = problems()
    if found:
        print("\n".join(f"make box: {problem}" for problem in found), file=sys.stderr)
        return 2
    if _pid(root) is not None:
        return already_up(root)
    started = time.monotonic()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    log = root / "holder.log"
    print(f"make box: logs: {root}/build.log (the builds), {log} (the box)", flush=True)
    try:
        if not build_all(root / "build.log", started):
            return 1
    except KeyboardInterrupt:
        print("make box: Ctrl-C during the builds; no box was started (the next make box builds what did not "
              "finish)", file=sys.stderr)  # fmt: skip
        return 130
    with open(log, "w") as out:
        holder = subprocess.Popen(
            [str(VENV_PYTHON), "-m", "tests.box_cli", "hold", str(root)],
            cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    (root / "holder.pid").write_text(str(holder.pid))
    status = root / "status.json"
    deadline = time.monotonic() + UP_TIMEOUT_S + 600
    offset = 0
    try:
        while not status.exists():
            offset = follow(log, offset, started)
            if holder.poll() is not None or time.monotonic() > deadline:
                print(f"make box: the box stopped before `make up` finished; see {log}", file=sys.stderr)
                print(log.read_text()[-3000:], file=sys.stderr)
                return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        return interrupted(root, holder)
    follow(log, offset, started)
    facts = json.loads(status.read_text())
    if not facts["ok"]:
        print(f"make box: `make up` failed in the box; its output: {facts['log']}; `make box-down` removes the box",
              file=sys.stderr)  # fmt: skip
        return 1
    print("make box: the lab is up.")
    report(root, facts)
    return 0


def already_up(root: Path) -> int:
    """A second `make box`: the box is running; where its kubeconfig and logs are."""
    status = root / "status.json"
    if not status.exists():
        print(f"make box: the box is coming up already (log: {root / 'holder.log'}); `make box-down` removes it")
        return 0
    facts = json.loads(status.read_text())
    if not facts["ok"]:
        print(f"make box: the box is running but its `make up` failed ({facts['log']}); `make box-down` removes it",
              file=sys.stderr)  # fmt: skip
        return 1
    print("make box: the box is up already; nothing was changed.")
    report(root, facts)
    return 0


def report(root: Path, facts: dict[str, str]) -> None:
    if facts.get("kubectl"):
        print(f"  try it:      {facts['kubectl']}")
    shell = "make box-shell" if root.resolve() == BOX_ROOT else f"make box-shell BOX={root}"
    print(f"""  box log:     {root / "holder.log"}
  kubeconfig:  {facts["kubeconfig"]}   (server 127.0.0.1:{facts.get("port")}, forwarded into the box's VIP;
               the API server's certificate is checked. The box's API servers are stand-ins: /readyz,
               /version and /api answer, `kubectl get nodes` waits for the real Kubernetes)
  CLI output:  {facts["artifacts"]}
  host logs:   {root}/run/hosts/<VM>-<uuid>/upper/var/log/labs-k8s-* (boot, sshd, units), and the
               steps' own logs under upper/var/lib/labs-k8s/steps/ (root-only, as on a node)
  the stack:   {shell}   (a shell in the box's namespace, in {facts["workspace"]},
               with its pulumi, PULUMI_HOME and passphrase: pulumi stack output, make preview)
  remove it:   {shell.replace("box-shell", "box-down")}""")


def shell(root: Path) -> int:
    """`make box-shell`: bash in the box's namespace, the workspace and environment `make up` had."""
    try:
        facts = json.loads((root / "shell.json").read_text())
    except OSError:
        print(f"make box-shell: no box is up in {root}: make box", file=sys.stderr)
        return 2
    print(f"make box-shell: the box's stack ({facts['env']['STACK']}) in its namespace; `exit` leaves",
          file=sys.stderr, flush=True)  # fmt: skip
    env = {**facts["env"], "PS1": "(box) \\w\\$ ", "TERM": os.environ.get("TERM", "dumb")}
    mount = 'mount --bind "$1" /etc/ssl/certs && shift && exec "$@"'  # tests/pulumi_engine.py in_lab
    interactive = ["-i"] if sys.stdin.isatty() else []
    os.chdir(facts["workspace"])
    os.execvpe("ip", ["ip", "netns", "exec", facts["netns"], "sh", "-c", mount, "sh", facts["trust_store"],
                      "bash", "--norc", *interactive], env)  # fmt: skip


def down(root: Path) -> int:
    pid = _pid(root)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 1800  # a first run's rootfs build finishes before the holder stops
        while _pid(root) is not None and time.monotonic() < deadline:
            time.sleep(1)
        if _pid(root) is not None:
            os.killpg(pid, signal.SIGKILL)
    shutil.rmtree(root, ignore_errors=True)
    print("make box-down: the box is gone" if pid is not None else "make box-down: no box was running")
    installed = sorted(set(INSTALLED.read_text().split())) if INSTALLED.is_file() else []
    packages = (
        f"sudo apt-get purge {' '.join(installed)}"
        if installed
        else "none recorded (those scripts/install-test-deps.sh lists that you did not have: sudo apt-get purge ...)"
    )
    print(LEFT_BEHIND.format(packages=packages))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.box_cli")
    parser.add_argument("action", choices=("up", "down", "hold", "shell"))
    parser.add_argument("root", nargs="?", type=Path, default=BOX_ROOT)
    args = parser.parse_args(argv)
    try:
        return {"up": up, "down": down, "hold": hold, "shell": shell}[args.action](args.root)
    except KeyboardInterrupt:  # before anything started, or in box-down: a line, not a traceback
        print("make box: Ctrl-C; nothing more was done (a box already running stays: make box-down)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
