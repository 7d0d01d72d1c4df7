"""What a drill needs from the stack: its outputs and the vCenter login.

`load_inputs(stack)` asks the Pulumi CLI; `parse_inputs(...)` turns already-fetched data into
`DrillInputs`, so tests inject outputs without a Pulumi CLI. Secrets (kubeconfig, vCenter
password) are kept out of every repr and message: nothing here prints them.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from components.stack_config import VSPHERE_SETTINGS, provider_bool, vsphere_settings
from components.vsphere import VSphereError, parse_server

ROLES = ("balancer", "control-plane", "worker")
REQUIRED_OUTPUTS = ("apiEndpoint", "kubeconfig", "nodes")
PULUMI_TIMEOUT_S = 120

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


class InputsError(RuntimeError):
    """The stack cannot be drilled as it is (missing outputs or login); the message says why."""


@dataclass(frozen=True)
class NodeInfo:
    name: str
    role: str  # "balancer", "control-plane" or "worker" (components.config.Role values)
    ip: str


@dataclass(frozen=True)
class VcenterLogin:
    server: str
    user: str
    password: str = field(repr=False)
    insecure: bool = False
    port: int = 443


@dataclass(frozen=True)
class DrillInputs:
    stack: str
    api_endpoint: str  # https://<VIP>:6443
    nodes: tuple[NodeInfo, ...]
    kubeconfig: str = field(repr=False)
    vcenter: VcenterLogin | None = None
    datacenter: str | None = None  # scopes VM lookups when known

    @property
    def vip(self) -> str:
        return urllib.parse.urlsplit(self.api_endpoint).hostname or ""

    def of_role(self, role: str) -> list[NodeInfo]:
        return [n for n in self.nodes if n.role == role]

    @property
    def kubernetes_nodes(self) -> list[NodeInfo]:
        return [n for n in self.nodes if n.role != "balancer"]

    def node(self, name: str) -> NodeInfo:
        for n in self.nodes:
            if n.name == name:
                return n
        raise InputsError(f"no node {name!r} in the stack's nodes output ({', '.join(n.name for n in self.nodes)})")


def parse_inputs(
    stack: str,
    outputs: Mapping[str, Any],
    config: Mapping[str, str | None] | None = None,
    env: Mapping[str, str] | None = None,
    need_vcenter: bool = True,
) -> DrillInputs:
    """Validate stack outputs and the vCenter login; every problem is listed at once.

    ``config`` maps `vsphere:<key>` (and optionally `labs-k8s:vsphere`) to values as
    `pulumi config get` prints them; ``env`` supplies the VSPHERE_* fallbacks.
    """
    config = config or {}
    env = os.environ if env is None else env
    problems: list[str] = []
    missing = [key for key in REQUIRED_OUTPUTS if not outputs.get(key)]
    if missing:
        problems.append(f"stack {stack!r} has no output {', '.join(missing)}: is it up? (`pulumi up --stack {stack}`)")
    nodes: list[NodeInfo] = []
    for row in outputs.get("nodes") or []:
        try:
            node = NodeInfo(name=str(row["name"]), role=str(row["role"]), ip=str(row["ip"]))
        except (KeyError, TypeError):
            problems.append(f"nodes output row {row!r} lacks name, role or ip")
            continue
        if node.role not in ROLES:
            problems.append(f"node {node.name!r} has unknown role {node.role!r} (expected one of {', '.join(ROLES)})")
        nodes.append(node)
    endpoint = str(outputs.get("apiEndpoint") or "")
    if endpoint and not urllib.parse.urlsplit(endpoint).hostname:
        problems.append(f"apiEndpoint output {endpoint!r} is not a URL like https://10.3.60.100:6443")
    kubeconfig = outputs.get("kubeconfig") or ""
    if kubeconfig and not isinstance(kubeconfig, str):
        problems.append("kubeconfig output is not a string")

    login: VcenterLogin | None = None
    if need_vcenter:
        values = vsphere_settings(config.get, env)
        absent = [
            f"vsphere:{k} (or {VSPHERE_SETTINGS[k]})" for k in ("vsphereServer", "user", "password") if not values[k]
        ]
        try:
            insecure = provider_bool(values["allowUnverifiedSsl"])
        except ValueError as error:
            insecure = False
            problems.append(
                f"vsphere:allowUnverifiedSsl (or VSPHERE_ALLOW_UNVERIFIED_SSL): {error}; write true or false"
            )
        if absent:
            problems.append(f"vCenter login incomplete, not set: {', '.join(absent)}")
        else:
            try:
                address = parse_server(str(values["vsphereServer"]))
            except VSphereError as error:
                problems.append(str(error))
            else:
                login = VcenterLogin(
                    server=address.host,
                    user=str(values["user"]),
                    password=str(values["password"]),
                    insecure=insecure,
                    port=address.port,
                )
    datacenter = None
    raw_vsphere = config.get("labs-k8s:vsphere")
    if raw_vsphere:
        try:
            datacenter = json.loads(raw_vsphere).get("datacenter")
        except (json.JSONDecodeError, AttributeError):
            datacenter = None
    if problems:
        raise InputsError(f"cannot drill stack {stack!r}:\n" + "\n".join(f"  - {p}" for p in problems))
    return DrillInputs(
        stack=stack,
        api_endpoint=endpoint,
        nodes=tuple(nodes),
        kubeconfig=str(kubeconfig),
        vcenter=login,
        datacenter=datacenter,
    )


def _run(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=PULUMI_TIMEOUT_S, check=False)


def load_inputs(stack: str, run: Runner = _run, env: Mapping[str, str] | None = None) -> DrillInputs:
    """`pulumi stack output --json --show-secrets` and `pulumi config get vsphere:*` of ``stack``.

    The CLI's stdout holds secrets: it is parsed, never echoed. Its stderr (which does not)
    is quoted when a call fails.
    """
    try:
        proc = run(["pulumi", "stack", "output", "--json", "--show-secrets", "--stack", stack])
    except FileNotFoundError:
        raise InputsError("the Pulumi CLI is not on PATH; drills read the stack's outputs with it") from None
    if proc.returncode != 0:
        raise InputsError(f"`pulumi stack output --stack {stack}` failed ({proc.returncode}): {proc.stderr.strip()}")
    try:
        outputs = json.loads(proc.stdout or "{}")
    except json.JSONDecodeError:
        raise InputsError(f"`pulumi stack output --json --stack {stack}` did not print JSON") from None
    config: dict[str, str | None] = {}
    for key in [*(f"vsphere:{k}" for k in VSPHERE_SETTINGS), "labs-k8s:vsphere"]:
        got = run(["pulumi", "config", "get", key, "--stack", stack])
        # A key that is not set exits non-zero; the VSPHERE_* fallback then applies.
        config[key] = got.stdout.strip() if got.returncode == 0 and got.stdout.strip() else None
    return parse_inputs(stack, outputs, config, env)
