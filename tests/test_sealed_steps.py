"""Host identity and deadlines of the remote steps, run as the node's bash would run them.

The bundles are the program's own (registered under the mock engine); they run with `bash -s` on
stdin, as `sudo -n bash -s` runs them over SSH, with the step root moved into a scratch directory
and a stand-in `vmware-rpctool` on PATH. The stand-in models open-vm-tools' rpctool
(open-vm-tools/rpctool/rpctool.c `RpcToolCommand`): it sends its one argument as an RPC, prints the
reply and exits 0, or prints the reply ("No value found") on stderr and exits 1.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from components import remote as remote_steps
from components.rendering import STEP_ROOT, sealed, step_bundle

RPCTOOL = """#!/bin/bash
# stand-in for open-vm-tools' vmware-rpctool (tests/test_sealed_steps.py)
printf '%s\\n' "$*" >>"$RPC_LOG"
if [[ $1 == "info-get guestinfo.labs-k8s.node-key" && -n ${RPC_NODE_KEY:-} ]]; then
    printf '%s\\n' "$RPC_NODE_KEY"
    exit 0
fi
echo "No value found" >&2
exit 1
"""


def _tools(tmp_path: Path, with_rpctool: bool = True) -> Path:
    """A PATH directory: the stand-in rpctool and links to the few real tools the front uses."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("bash", "base64", "cat", "hostname", "install", "openssl", "rm", "sha256sum", "sleep", "echo"):
        found = shutil.which(tool)
        assert found, tool
        link = bin_dir / tool
        if not link.exists():
            link.symlink_to(found)
    if with_rpctool:
        (bin_dir / "vmware-rpctool").write_text(RPCTOOL)
        (bin_dir / "vmware-rpctool").chmod(0o755)
    return bin_dir


def _run_bundle(
    tmp_path: Path, bundle: str, node_key: str | None, *, with_rpctool: bool = True, args: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    steps = tmp_path / "steps"
    env = {
        "PATH": str(_tools(tmp_path, with_rpctool)),
        "RPC_LOG": str(tmp_path / "rpc.log"),
        "RPC_NODE_KEY": node_key or "",
        "LABS_K8S_ROOT": str(tmp_path / "root"),
    }
    return subprocess.run(
        ["bash", "-s", "--", *args],
        input=bundle.replace(STEP_ROOT, str(steps)),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _everything_written(tmp_path: Path) -> str:
    steps = tmp_path / "steps"
    return "\n".join(p.read_text(errors="replace") for p in steps.rglob("*") if p.is_file())


def _secrets(run) -> list[str]:
    return [
        run.by_name("bootstrap-token-secret").plain_outputs["result"],
        run.by_name("certificate-key").plain_outputs["hex"],
    ]


def _key(run, node: str) -> str:
    return run.by_name(f"{node}-node-key").plain_outputs["result"]


@pytest.mark.parametrize(
    ("impostor", "reason"),
    [
        ("no-vmware", "it has no vmware-rpctool, so it is no VMware VM of this lab"),
        ("no-key", "its guestinfo has no guestinfo.labs-k8s.node-key"),
        ("other-node", "is none of theirs"),
        ("random-key", "is none of theirs"),
    ],
)
def test_a_host_at_the_nodes_address_without_its_key_gets_nothing_secret(offline_run, tmp_path, impostor, reason):
    """m02's join carries the token and the certificate key. A host that answers for m02's address
    but is not m02's VM (another lab node, a laptop with the address, an ARP spoofer running the
    bundle) cannot open it: the step fails naming m02 and why, and no secret lands on the host."""
    join = offline_run.by_name("labs-k8s-m02-kubeadm-join")
    key = {
        "no-vmware": lambda: None,
        "no-key": lambda: None,
        "other-node": lambda: _key(offline_run, "labs-k8s-m01"),
        "random-key": lambda: "Z" * sealed.NODE_KEY_LENGTH,
    }[impostor]()
    result = _run_bundle(tmp_path, join.plain_inputs["stdin"], key, with_rpctool=impostor != "no-vmware")
    assert result.returncode != 0
    assert "refusing to run: this host" in result.stderr and "is not labs-k8s-m02" in result.stderr, result.stderr
    assert reason in result.stderr, result.stderr
    assert "nothing secret" in result.stderr
    written = _everything_written(tmp_path)
    assert written  # the plain front was written (and ran)
    for value in _secrets(offline_run):
        assert value not in written and value not in result.stderr and value not in result.stdout
    assert not list((tmp_path / "steps").rglob("kubeadm-join.yaml"))


def test_a_step_through_the_vip_opens_on_every_control_plane_and_no_other_host(offline_run, tmp_path):
    """A refresh lands on whichever control plane HAProxy picks: sealed to all three, to no worker."""
    refresh = offline_run.by_name("labs-k8s-m03-refresh-join-material")
    stdin = refresh.plain_inputs["stdin"]
    assert sealed.recipients_of(stdin) == ["labs-k8s-m01", "labs-k8s-m02", "labs-k8s-m03"]
    result = _run_bundle(tmp_path, stdin, _key(offline_run, "labs-k8s-w01"))
    assert result.returncode != 0
    assert "is not any of labs-k8s-m01, labs-k8s-m02, labs-k8s-m03" in result.stderr, result.stderr
    for value in _secrets(offline_run):
        assert value not in _everything_written(tmp_path)


def test_the_right_vm_opens_its_bundle_and_runs_it_with_its_arguments(offline_run, tmp_path):
    """The same front, on the VM that holds the key: the real bundle runs, files and arguments intact."""
    key = _key(offline_run, "labs-k8s-m02")
    inner = step_bundle("probe", {"run.sh": 'cat secret; echo "args: $*"\n', "secret": "s3cret\n"}, "run.sh", ("a",))
    inner = inner.replace(STEP_ROOT, str(tmp_path / "steps"))  # sealed: _run_bundle cannot move it
    result = _run_bundle(tmp_path, sealed.seal("probe", inner, {"labs-k8s-m02": key}), key, args=("b",))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "s3cret\nargs: a b\n"
    # The decrypted bundle itself is not left behind; its files are, root-only, as for any step.
    assert not (tmp_path / "steps" / "probe" / "sealed-bundle.sh").exists()
    assert (tmp_path / "steps" / "probe" / "secret").stat().st_mode & 0o077 == 0
    # The key was read from guestinfo, never passed on a command line.
    assert (tmp_path / "rpc.log").read_text() == "info-get guestinfo.labs-k8s.node-key\n"
    # And the program's own m02 bundle opens the same way in Python (its key is the one in the VM's guestinfo).
    join = offline_run.by_name("labs-k8s-m02-kubeadm-join").plain_inputs["stdin"]
    assert "kubeadm-join.yaml" in sealed.unseal(join, key)


def test_a_proving_front_ends_the_answer_with_a_proof_the_program_accepts(offline_run, tmp_path):
    """What pulumi-command hands back (stdout, its last newline trimmed) from the real VM's front
    passes the program's check; the same answer without the bundle key cannot be proven."""
    key = _key(offline_run, "labs-k8s-m01")
    inner = step_bundle("probe", {"run.sh": 'printf "sha256:abc\\n\\n"\n'}, "run.sh")
    inner = inner.replace(STEP_ROOT, str(tmp_path / "steps"))
    bundle = sealed.seal(
        "probe", inner, {"labs-k8s-m01": key, "labs-k8s-m02": _key(offline_run, "labs-k8s-m02")}, prove=True
    )
    result = _run_bundle(tmp_path, bundle, key)
    assert result.returncode == 0, result.stderr
    stdout = result.stdout.removesuffix("\n")  # pulumi-command: strings.TrimSuffix(stdout, "\n")
    assert sealed.verified_answer("probe", bundle, _key(offline_run, "labs-k8s-m02"), stdout) == "sha256:abc"
    # A script that fails gets no proof: the step fails on its exit code, nothing is proven.
    failing = step_bundle("probe2", {"run.sh": "echo half; exit 4\n"}, "run.sh").replace(
        STEP_ROOT, str(tmp_path / "steps")
    )
    result = _run_bundle(tmp_path, sealed.seal("probe2", failing, {"labs-k8s-m01": key}, prove=True), key)
    assert result.returncode == 4 and sealed.PROOF_PREFIX not in result.stdout


def test_openssl_on_the_node_and_the_program_agree_on_the_format(tmp_path):
    """The program encrypts in Python; the node decrypts with `openssl enc` (and back)."""
    text = "x" * 1000 + "\n"
    ciphertext = sealed.encrypt("K" * 32, text.encode())
    (tmp_path / "pass").write_text("K" * 32 + "\n")
    out = subprocess.run(
        [
            "openssl",
            "enc",
            "-d",
            "-aes-256-cbc",
            "-pbkdf2",
            "-iter",
            str(sealed.PBKDF2_ITERATIONS),
            "-md",
            "sha256",
            "-a",
            "-A",
            "-pass",
            f"file:{tmp_path / 'pass'}",
        ],
        input=ciphertext,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == text
    theirs = subprocess.run(
        [
            "openssl",
            "enc",
            "-aes-256-cbc",
            "-pbkdf2",
            "-iter",
            str(sealed.PBKDF2_ITERATIONS),
            "-md",
            "sha256",
            "-a",
            "-A",
            "-pass",
            f"file:{tmp_path / 'pass'}",
        ],
        input=text,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert sealed.decrypt("K" * 32, theirs.strip()).decode() == text
    # Deterministic: the same bundle seals to the same text (no change in `pulumi preview`).
    assert sealed.encrypt("K" * 32, text.encode()) == ciphertext


# --------------------------------------------------------------------------- deadlines


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def test_a_hung_script_is_stopped_on_the_node_at_its_deadline_with_what_it_started(tmp_path):
    """pulumi-command waits for the remote command however long it takes (session.Run has no
    context): the command's own `timeout` ends it, and the processes it started, and says so."""
    bin_dir = _tools(tmp_path, with_rpctool=False)
    for tool in ("timeout", "sleep"):
        target = bin_dir / tool
        if not target.exists():
            target.symlink_to(shutil.which(tool))
    # sudo -n as the node's sudoers allows it: here a stand-in that runs its arguments.
    (bin_dir / "sudo").write_text('#!/bin/bash\n[[ $1 == -n ]] && shift\nexec "$@"\n')
    (bin_dir / "sudo").chmod(0o755)
    command = remote_steps.bounded_run("hang-probe", 2)
    bundle = f"sleep 300 & echo $! > {tmp_path}/child\nsleep 300\necho never\n"
    started = time.monotonic()
    result = subprocess.run(
        ["bash", "-c", command], input=bundle, env={"PATH": str(bin_dir)}, capture_output=True, text=True, timeout=60
    )
    elapsed = time.monotonic() - started
    assert result.returncode in remote_steps.TIMED_OUT_CODES
    assert elapsed < 2 + remote_steps.KILL_AFTER_SECONDS + 5
    assert "never" not in result.stdout
    assert "labs-k8s[hang-probe]: stopped after 2s" in result.stderr, result.stderr
    child = int((tmp_path / "child").read_text())
    deadline = time.monotonic() + 5
    while _pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _pid_alive(child):
        os.kill(child, signal.SIGKILL)
        pytest.fail("the script's background child survived the deadline")


def test_a_step_that_finishes_in_time_keeps_its_exit_code_and_output(tmp_path):
    bin_dir = _tools(tmp_path, with_rpctool=False)
    (bin_dir / "timeout").symlink_to(shutil.which("timeout"))
    (bin_dir / "sudo").write_text('#!/bin/bash\n[[ $1 == -n ]] && shift\nexec "$@"\n')
    (bin_dir / "sudo").chmod(0o755)
    command = remote_steps.bounded_run("quick", 30, ("set",))
    result = subprocess.run(
        ["bash", "-c", command],
        input='echo "ran $1"; exit 3\n',
        env={"PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (result.returncode, result.stdout, result.stderr) == (3, "ran set\n", "")
