"""The real Pulumi CLI, in a network namespace of its own, on a user's copy of this checkout.

`toolchain_bin()` builds (or finds cached) what tests/tools/build_toolchain.sh builds from Go
modules. `EngineLab` is one user's machine as the README sets it up:
- a copy of the checkout's tracked files (the workspace) with the project's `.venv`;
- a private PULUMI_HOME and HOME, a `file://` backend logged into with `pulumi login`, passphrase
  secrets, and a stack made the README's way (`cp Pulumi.labs.yaml Pulumi.$STACK.yaml`,
  `pulumi stack init`, `pulumi config set`);
- a network namespace with only a loopback, holding vcsim, the ISO server and the installer's
  power-off (tests/engine_box.py): every CLI, provider and program process runs inside it, so the
  run is offline by construction, and the CLI is also told never to fetch anything
  (PULUMI_SKIP_UPDATE_CHECK, PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION,
  PULUMI_DISABLE_REGISTRY_RESOLVE);
- vcsim's certificate, from a CA of the lab's own, trusted the runbook's way ("Trusting the vCenter
  certificate": the CA into the local CA directory, `update-ca-certificates`), into a trust store of
  the lab's (`trust_store`), which each command sees at /etc/ssl/certs through a bind mount in its
  own mount namespace: the machine's store is never touched.
Every command's output is appended to `artifacts/NN-name.log` under the lab's directory, and
`EngineLab.transcript()` is added to failure messages.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.tools.offline import REPO_ROOT
from components.tools.targets import layer_targets
from tests.requirements import unavailable
from tests.vcenter_pki import make_vcenter_pki

BUILD_SCRIPT = REPO_ROOT / "tests" / "tools" / "build_toolchain.sh"
MANIFEST = REPO_ROOT / "tests" / "tools" / "toolchain" / "manifest.json"
PASSPHRASE = "labs-k8s engine test passphrase"  # a test stack's, not a secret of anything real
_built: list[Path] = []


def manifest() -> dict[str, Any]:
    return json.loads(MANIFEST.read_text())


def toolchain_bin() -> Path:
    """The directory holding the built `pulumi` and its bundled plugin scripts."""
    if _built:
        return _built[0]
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=3000, check=False)
    if proc.returncode != 0:
        unavailable(f"tests/tools/build_toolchain.sh failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    _built.append(Path(proc.stdout.strip().splitlines()[-1]))
    return _built[0]


def workspace_copy(destination: Path) -> Path:
    """The checkout's tracked files, as a user's clone has them, plus the project's virtualenv."""
    files = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO_ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, files):
        source = REPO_ROOT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    (destination / ".venv").symlink_to(REPO_ROOT / ".venv")
    return destination


@dataclass
class Result:
    name: str
    returncode: int
    output: str  # stdout, then stderr
    log: Path
    stdout: str = ""
    events: Path | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def engine_result(self) -> dict[str, Any]:
        """ok (the CLI's exit status) and the engine's resource changes (its summaryEvent)."""
        return {"ok": self.ok, "changes": self.summary()}

    def summary(self) -> dict[str, int]:
        """The last summaryEvent's changes: `make up` (no --skip-preview) logs its preview's first."""
        for event in reversed(self.event_log()):
            if "summaryEvent" in event:
                return {op: n for op, n in (event["summaryEvent"].get("resourceChanges") or {}).items() if op != "same"}
        return {}

    def event_log(self) -> list[dict[str, Any]]:
        if self.events is None or not self.events.exists():
            return []
        return [json.loads(line) for line in self.events.read_text().splitlines() if line.strip()]


@dataclass
class EngineLab:
    root: Path
    netns: str
    bin_dir: Path
    stack: str = "mysite"
    results: list[Result] = field(default_factory=list)
    box: subprocess.Popen[str] | None = None
    vcsim: str = ""
    iso_url: str = ""
    password_file: Path | None = None
    # The lab's /etc/ssl/certs (lab_trust_store): the system CAs and the lab's vCenter CA.
    trust_store: Path | None = None

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    def env(self, **extra: str) -> dict[str, str]:
        home = self.root / "home"
        venv_bin = self.workspace / ".venv" / "bin"
        env = {
            "PATH": f"{self.bin_dir}:{venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(home),
            "PULUMI_HOME": str(home / ".pulumi"),
            "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE,
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
            "PULUMI_DISABLE_REGISTRY_RESOLVE": "true",
            "PULUMI_SKIP_CONFIRMATIONS": "true",
            # The engine's --event-log (what the tests read the resource changes from, as the
            # Automation API does) exists only with it (pkg/cmd/pulumi/operations/up.go).
            "PULUMI_DEBUG_COMMANDS": "true",
            "LABS_K8S_CACHE": str(self.root / "labs-k8s-cache"),
            "LANG": "C.UTF-8",
            **extra,
        }
        if "CI" in os.environ:
            env["CI"] = os.environ["CI"]
        return env

    def in_lab(self, *cmd: str, trusted: bool = True) -> list[str]:
        """`cmd` inside the namespace, and (`trusted`) with the lab's trust store over /etc/ssl/certs.
        `ip netns exec` runs each command in a mount namespace of its own, its mounts slaved to the
        machine's (iproute2 lib/namespace.c netns_switch: unshare(CLONE_NEWNS), then / remounted
        MS_SLAVE|MS_REC), so the bind mount is seen by that command and its children only (the CLI,
        the language host, the plugins, the program) and never propagates to the machine."""
        if not trusted or self.trust_store is None:
            return ["ip", "netns", "exec", self.netns, *cmd]
        mount = 'mount --bind "$1" /etc/ssl/certs && shift && exec "$@"'
        return ["ip", "netns", "exec", self.netns, "sh", "-c", mount, "sh", str(self.trust_store), *cmd]

    def run(
        self,
        name: str,
        *cmd: str,
        stdin: str | None = None,
        timeout: float = 600,
        env: dict[str, str] | None = None,
        trusted: bool = True,
    ) -> Result:
        """`cmd` inside the namespace (`in_lab`), from the workspace; output kept as an artifact."""
        self.artifacts.mkdir(parents=True, exist_ok=True)
        log = self.artifacts / f"{len(self.results):02d}-{name}.log"
        started = time.monotonic()
        try:
            proc = subprocess.run(
                self.in_lab(*cmd, trusted=trusted),
                cwd=self.workspace,
                env=env or self.env(),
                input=stdin,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
            returncode, stdout, output = proc.returncode, proc.stdout, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as expired:
            returncode, stdout = -1, ""
            output = f"{expired.stdout or ''}{expired.stderr or ''}\nTIMED OUT after {timeout:g}s"
        log.write_text(f"$ {' '.join(cmd)}\n{output}\n[exit {returncode}, {time.monotonic() - started:.1f}s]\n")
        result = Result(name, returncode, output, log, stdout)
        self.results.append(result)
        return result

    def pulumi(self, *args: str, stdin: str | None = None, check: bool = True) -> Result:
        result = self.run("pulumi-" + (args[0] if args else ""), "pulumi", *args, stdin=stdin)
        if check:
            assert result.ok, f"pulumi {' '.join(args)} failed:\n{result.output[-4000:]}"
        return result

    def engine(
        self,
        op: str,
        *targets: str,
        layers: str = "",
        expect_no_changes: bool = False,
        refresh: bool = False,
        timeout: float = 900,
        extra: tuple[str, ...] = (),
    ) -> Result:
        """`pulumi preview|up|refresh|destroy` of the workspace's program, as a user runs it: the CLI
        spawns the real Python language host, which runs `__main__.py` in the project's .venv.

        `layers`: a layer of components/tools/targets.py, whose `--target` globs are passed (what
        `make up LAYER=...` passes; the tests use `make` wherever it offers what they need). The result's
        `changes` is the engine's own summary, from its `--event-log` (the summaryEvent the
        Automation API reads too)."""
        events = self.artifacts / f"{len(self.results):02d}-events-{op}.jsonl"
        self.artifacts.mkdir(parents=True, exist_ok=True)
        args = [
            "pulumi",
            op,
            "--stack",
            self.stack,
            "--non-interactive",
            "--color",
            "never",
            "--event-log",
            str(events),
        ]
        args += VCSIM_PARALLEL
        if op == "preview":
            args.append("--diff")
        else:
            args += ["--yes", "--skip-preview"] if op == "up" else ["--yes"]
        if op in ("refresh", "destroy") and layers:
            args.append("--run-program")
        targets = (*targets, *(layer_targets(self.stack, layers) if layers else ()))
        args += [f"--target={t}" for t in targets]
        if expect_no_changes:
            args.append("--expect-no-changes")
        if refresh:
            args.append("--refresh")
        result = self.run(f"pulumi-{op}", *args, *extra, timeout=timeout)
        result.events = events
        return result

    def next_make_events(self, *targets: str) -> Path:
        """Where the next `make(*targets)` has the engine write its `--event-log` (bench/lab_box.py
        follows it while the CLI runs)."""
        return self.artifacts / f"{len(self.results):02d}-events-make-{'-'.join(targets)}.jsonl"

    def make(
        self,
        *targets: str,
        args: str = "",
        layer: str = "",
        timeout: float = 900,
        trusted: bool = True,
        cli_parallel: bool = False,
    ) -> Result:
        """`make TARGET` as a user types it, with ARGS (the Makefile passes them to the CLI) holding
        VCSIM_PARALLEL (none with `cli_parallel`: make's default, PULUMI_PARALLEL=64, as a user's `make up`) and
        `args`, and LAYER=`layer` when given. The engine's `--event-log` goes through ARGS too (its
        path holds no character make or the shell would expand), so the result's `changes` is the
        engine's own summary, as for `engine`."""
        events = self.next_make_events(*targets)
        self.artifacts.mkdir(parents=True, exist_ok=True)
        parallel = () if cli_parallel else VCSIM_PARALLEL
        passed = " ".join([*parallel, "--event-log", str(events), args]).strip()
        result = self.run(
            "make-" + "-".join(targets),
            "make",
            *targets,
            f"ARGS={passed}",
            *([f"LAYER={layer}"] if layer else []),
            timeout=timeout,
            env=self.env(STACK=self.stack),
            trusted=trusted,
        )
        result.events = events
        return result

    def stack_export(self) -> dict[str, Any]:
        return json.loads(self.pulumi("stack", "export", "--stack", self.stack).stdout)

    def transcript(self, last: int = 3) -> str:
        shown = "\n".join(f"--- {r.log.name}\n{r.output[-3000:]}" for r in self.results[-last:])
        vcsim_log = self.root / "vcsim.log"
        if vcsim_log.exists() and "panic" in (text := vcsim_log.read_text(errors="replace")):
            shown += f"\n--- vcsim.log (it panicked)\n{text[text.index('panic') :][:3000]}"
        return shown


# Runs against vcsim go one resource at a time unless a test asks for make's default (PULUMI_PARALLEL)
# (`make(cli_parallel=True)`). At the default, the simulator's own property collector hung the
# real vSphere provider's concurrent clones for 17 minutes and more: the provider's task waits share
# the session's collector (govmomi Task.WaitForResultEx), and the simulator handed its updates to
# whichever wait polled first. Our vcsim's collector answers each wait by its own version
# (tests/tools/vcsim/collector.go, tests/test_vcsim_collector.py), and the lab in a box's up after
# destroy and its bench run at make's default; the staged scenarios keep one step at a time, so
# each stage's order of events is the same on every run (docs/testing.md).
VCSIM_PARALLEL = ("--parallel", "1")


def install_plugins(lab: EngineLab) -> None:
    """The provider plugins built from ../shared/third_party (plugins.json beside the CLI), into the
    lab's private PULUMI_HOME, the documented way for a plugin binary at hand."""
    for plugin in json.loads((lab.bin_dir.parent / "plugins.json").read_text()):
        lab.pulumi("plugin", "install", plugin["kind"], plugin["name"], plugin["version"], "--file", plugin["path"])


_namespaces: list[str] = []


def start_lab(
    root: Path, vcsim_binary: str, iso_dir: Path, stack: str = "mysite", watch_clones: bool = False
) -> EngineLab:
    """The namespace, the workspace and the box (tests/engine_box.py); stop it with `stop_lab`.
    `watch_clones`: the box also reports each clone's power changes (the lab in a box, tests/lab_box.py)."""
    bin_dir = toolchain_bin()
    netns = f"lk8s-engine-{os.getpid()}-{len(_namespaces)}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    _namespaces.append(netns)
    subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True)
    workspace_copy(root / "workspace")
    (root / "home").mkdir()
    (root / "backend").mkdir()
    lab = EngineLab(root=root, netns=netns, bin_dir=bin_dir, stack=stack)
    install_plugins(lab)
    lab.password_file = root / "vcenter-password"
    lab.password_file.write_text("labs-secret\n")
    pki = make_vcenter_pki(root / "pki")
    lab.trust_store = lab_trust_store(root / "trust", pki["ca"])
    lab.box = subprocess.Popen(
        ["ip", "netns", "exec", netns, str(lab.workspace / ".venv" / "bin" / "python"), "-m", "tests.engine_box",
         "--vcsim", vcsim_binary, "--user", "labs", "--password-file", str(lab.password_file),
         "--iso-dir", str(iso_dir), "--folder", "labs-k8s",
         "--tls-cert", str(pki["cert"]), "--tls-key", str(pki["key"]),
         *(["--watch-clones"] if watch_clones else [])],
        cwd=lab.workspace, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=open(root / "box.log", "w"),  # noqa: SIM115
        text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(root / "home")},
    )  # fmt: skip
    assert lab.box.stdout is not None
    line = lab.box.stdout.readline()
    if not line.startswith("BOX "):
        stop_lab(lab)
        raise AssertionError(f"the engine box did not start: {(root / 'box.log').read_text()[-3000:]}")
    box = json.loads(line.removeprefix("BOX "))
    lab.vcsim, lab.iso_url = box["vcsim"], box["iso_url"]
    return lab


def lab_trust_store(trust: Path, ca: Path) -> Path:
    """docs/runbook.md "Trusting the vCenter certificate" on Debian, into the lab's directories
    instead of the machine's: the CA into a local CA directory (the runbook's
    /usr/local/share/ca-certificates), then `update-ca-certificates` with --localcertsdir and
    --etccertsdir pointing there, on a copy of the machine's /etc/ssl/certs (what the runbook's
    command starts from), so the bundle is the system CAs plus the lab's. --hooksdir names a
    directory that does not exist: the packages' hooks (ca-certificates-java's) would record the
    change for the machine (/usr/sbin/update-ca-certificates runs hooks only `if [ -d "$HOOKSDIR" ]`).
    Returns the lab's /etc/ssl/certs."""
    local = trust / "local-ca-certificates"
    etc_certs = trust / "etc-ssl-certs"
    local.mkdir(parents=True)
    shutil.copy2(ca, local / "labs-k8s-vcenter-ca.crt")
    subprocess.run(["cp", "-a", "/etc/ssl/certs", str(etc_certs)], check=True)
    subprocess.run(
        ["update-ca-certificates", "--localcertsdir", str(local), "--etccertsdir", str(etc_certs),
         "--hooksdir", str(trust / "no-hooks")],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    bundle = (etc_certs / "ca-certificates.crt").read_text()
    assert ca.read_text().strip() in bundle, "update-ca-certificates left the lab's CA out of the bundle"
    return etc_certs


def stop_lab(lab: EngineLab) -> None:
    if lab.box is not None and lab.box.poll() is None:
        lab.box.terminate()
        try:
            lab.box.wait(timeout=20)
        except subprocess.TimeoutExpired:
            lab.box.kill()
    pids = subprocess.run(["ip", "netns", "pids", lab.netns], capture_output=True, text=True, check=False)
    for pid in pids.stdout.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), 9)
    subprocess.run(["ip", "netns", "del", lab.netns], check=False)


def readme_setup(lab: EngineLab, iso_sha256: str, iso_name: str) -> None:
    """README "Your first lab" steps 2, 3 and 5 as written, for a self-managed `file://` backend, then
    the site's settings (step 4) for vcsim's inventory and the loopback ISO server."""
    lab.pulumi("login", f"file://{lab.root / 'backend'}")
    shutil.copy2(lab.workspace / "Pulumi.labs.yaml", lab.workspace / f"Pulumi.{lab.stack}.yaml")
    lab.pulumi("stack", "init", lab.stack)
    stack = ["--stack", lab.stack]
    lab.pulumi("config", "set", *stack, "vsphere:vsphereServer", lab.vcsim)
    lab.pulumi("config", "set", *stack, "vsphere:user", "labs")
    assert lab.password_file is not None
    lab.pulumi("config", "set", *stack, "--secret", "vsphere:password", stdin=lab.password_file.read_text())
    key = lab.root / "home" / ".ssh" / "labs-k8s"
    key.parent.mkdir(mode=0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "labs-k8s", "-f", str(key)], check=True)
    lab.pulumi("config", "set", *stack, "--secret", "labs-k8s:sshPrivateKey", stdin=key.read_text())
    lab.pulumi("config", "set", *stack, "--path", "labs-k8s:ssh.publicKey", key.with_suffix(".pub").read_text().strip())
    # vcsim's certificate is trusted the README's way (step 5: its CA in the system store, runbook
    # "Trusting the vCenter certificate"): start_lab's trust store. No vsphere:allowUnverifiedSsl.
    site = {
        "vsphere.datacenter": "DC0",
        "vsphere.computeCluster": "DC0_C0",
        "vsphere.datastore": "LocalDS_0",
        "vsphere.network": "VM Network",
        "vsphere.folder": "labs-k8s",
        "template.isoUrl": f"{lab.iso_url}/{iso_name}",
        "template.isoSha256": iso_sha256,
    }
    for key_path, value in site.items():
        lab.pulumi("config", "set", *stack, "--path", f"labs-k8s:{key_path}", value)
