"""`python -m components logs --stack STACK NODE [STEP]`: a failed step's logs, from its node.

A remote step runs its bundle in /var/lib/labs-k8s/steps/<step>/ on the node (rendering
STEP_ROOT) and keeps kubeadm's and its own output there as `*.log` (root-only). This command
logs in as the steps do, with the stack's key (`labs-k8s:sshPrivateKey`, read through the
Pulumi CLI into a private temporary file, never argv or the environment), and only to a host
whose key the stack pinned (its `sshKnownHosts` output): without one it refuses to connect.
It prints the step's logs (every step's newest, with no STEP) and the kubelet's and cloud-init's
last lines. Join tokens and certificate keys in kubeadm's output are shown as [secret].
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from components.rendering import STEP_ROOT

PULUMI_TIMEOUT_S = 120
SSH_TIMEOUT_S = 120
KNOWN_HOSTS_OUTPUT = "sshKnownHosts"
Runner = Callable[..., "subprocess.CompletedProcess[str]"]


class LogsError(RuntimeError):
    """Why the logs cannot be collected; the message says what to do."""


def remote_script(step: str | None) -> str:
    """What runs on the node (as root, through sudo -n): read-only, secrets masked. `step` is one
    of the stack's steps (node_steps), and still goes in as quoted words only."""
    mask = r"sed -E 's/(--token|--certificate-key|--discovery-token-ca-cert-hash)([ =])[^ ]+/\1\2[secret]/g'"
    if step:
        directory = shlex.quote(f"{STEP_ROOT}/{step}")
        missing = shlex.quote(
            f"no step directory {STEP_ROOT}/{step} on this node: the step never ran here "
            f"(ls {STEP_ROOT} lists those that did)"
        )
        no_logs = shlex.quote(f"no *.log in {STEP_ROOT}/{step}: its output is in the pulumi up output above")
        logs = (
            f"if [ ! -d {directory} ]; then echo {missing}; ls {STEP_ROOT} 2>/dev/null; "
            f'else found=0; for f in {directory}/*.log; do [ -f "$f" ] || continue; found=1; '
            f'echo "==> $f <=="; {mask} "$f"; done; '
            f"[ $found = 1 ] || echo {no_logs}; fi"
        )
    else:
        logs = (
            f'for d in {STEP_ROOT}/*/; do f=$(ls -t "$d"*.log 2>/dev/null | head -n 1); '
            f'[ -n "$f" ] || continue; echo "==> $f (last 40 lines) <=="; tail -n 40 "$f" | {mask}; done'
        )
    return (
        f"{logs}\n"
        "echo '==> journalctl -u kubelet (last 50 lines) <=='; journalctl -u kubelet --no-pager -n 50 2>&1 | "
        f"{mask}\n"
        "echo '==> cloud-init status --long <=='; cloud-init status --long 2>&1 || true\n"
    )


def _pulumi(run: Runner, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return run(["pulumi", *args], capture_output=True, text=True, timeout=PULUMI_TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise LogsError(
            "the Pulumi CLI is not on PATH; logs reads the stack's key and pinned host keys with it"
        ) from None


def node_steps(stack: str, address: str, vip: str | None) -> list[str]:
    """The remote steps of the stack that run on the node at `address`, and those through `vip`
    (a control plane's: they land on one). From the program under mocks, as `render` runs it."""
    from components.stack_config import REMOTE_COMMAND_TYPES
    from components.tools.offline import run_program

    run = run_program(stack)
    hosts = {address, vip} - {None}
    return sorted(
        reg.name
        for type_token in REMOTE_COMMAND_TYPES
        for reg in run.of_type(type_token)
        if (reg.plain_inputs.get("connection") or {}).get("host") in hosts
    )


def collect(stack: str, node: str, step: str | None, run: Runner = subprocess.run) -> int:
    from components.config import Role
    from components.tools.offline import lab_config_from_stack

    lab = lab_config_from_stack(stack)
    names = {n.name: n for n in lab.all_nodes}
    if node not in names:
        raise LogsError(f"no node {node!r} in stack {stack!r}: {', '.join(names)}")
    if step is not None:
        # STEP reaches a root shell on the node: only a name of the stack's own steps on that node.
        vip = str(lab.load_balancer.vip) if names[node].role == Role.CONTROL_PLANE else None
        steps = node_steps(stack, str(names[node].ip), vip)
        if step not in steps:
            raise LogsError(f"no step {step!r} of stack {stack!r} runs on {node}; its steps: {', '.join(steps)}")
    outputs = _pulumi(run, "stack", "output", "--json", "--show-secrets", "--stack", stack)
    if outputs.returncode != 0:
        raise LogsError(f"`pulumi stack output --stack {stack}` failed: {outputs.stderr.strip()}")
    known_hosts = str(json.loads(outputs.stdout or "{}").get(KNOWN_HOSTS_OUTPUT) or "")
    if not known_hosts.strip():
        raise LogsError(
            f"stack {stack!r} has no {KNOWN_HOSTS_OUTPUT} output, the nodes' pinned SSH host keys: refusing to "
            "connect to a host whose key nothing pinned. Run `make up` with this version first (it records them)"
        )
    key = _pulumi(run, "config", "get", "--stack", stack, "labs-k8s:sshPrivateKey")
    if key.returncode != 0 or "PRIVATE KEY" not in key.stdout:
        raise LogsError(f"cannot read labs-k8s:sshPrivateKey of stack {stack!r} (is the stack selected and logged in?)")
    address = str(names[node].ip)
    with tempfile.TemporaryDirectory(prefix="labs-k8s-logs-") as private:
        key_file = Path(private) / "key"
        key_file.touch(mode=0o600)
        key_file.write_text(key.stdout if key.stdout.endswith("\n") else key.stdout + "\n")
        hosts_file = Path(private) / "known_hosts"
        hosts_file.write_text(known_hosts if known_hosts.endswith("\n") else known_hosts + "\n")
        command: Sequence[str] = [
            "ssh",
            "-F",
            "/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={hosts_file}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "IdentityAgent=none",
            "-i",
            str(key_file),
            f"{lab.ssh.user}@{address}",
            "sudo -n bash -s",
        ]
        done = run(
            command, input=remote_script(step), capture_output=True, text=True, timeout=SSH_TIMEOUT_S, check=False
        )
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        raise LogsError(f"ssh {lab.ssh.user}@{address} failed (exit {done.returncode}): {done.stderr.strip()}")
    return 0


def cli(stack: str | None, node: str, step: str | None) -> int:
    if not stack:
        print("logs: which stack? --stack <your site's stack> (or export STACK)", file=sys.stderr)
        return 2
    try:
        return collect(stack, node, step)
    except LogsError as error:
        print(f"logs: {error}", file=sys.stderr)
        return 2
