"""Reading the stack's configuration: Pulumi config in, a validated LabConfig and secret Outputs out.

This is the only place that knows the config keys' storage: `labs-k8s:<key>` structured values,
the `labs-k8s:sshPrivateKey` secret, and the vSphere provider's own `vsphere:*` keys (or the
VSPHERE_* environment variables the provider also reads).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import pulumi

from components.config import (
    NAMESPACE,
    TOP_LEVEL_KEYS,
    ConfigProblem,
    LabConfig,
    LabConfigError,
    load_lab_config,
)

SSH_PRIVATE_KEY = "sshPrivateKey"


@dataclass(frozen=True)
class VcenterCredentials:
    """What pyvmomi (preflight, template build) needs.

    `password` is the secret Output handed to resources. `plain_password` exists only for the
    in-process preflight before any resource is registered; it is kept out of repr and logs.
    """

    server: str
    user: str
    password: pulumi.Output[str]
    allow_unverified_ssl: bool
    plain_password: str = field(default="", repr=False)


@dataclass(frozen=True)
class StackInputs:
    lab: LabConfig
    ssh_private_key: pulumi.Output[str]
    vcenter: VcenterCredentials
    stack: str = "labs"


def _raw_namespace(config: pulumi.Config) -> dict[str, Any]:
    raw: dict[str, Any] = {}
    for key in TOP_LEVEL_KEYS:
        try:
            value = config.get_object(key)
        except (json.JSONDecodeError, pulumi.ConfigTypeError) as error:
            raise LabConfigError([ConfigProblem(key, f"is not valid structured YAML/JSON ({error})")]) from None
        if value is not None:
            raw[key] = value
    return raw


def _provider_setting(vsphere: pulumi.Config, key: str, env: str) -> str | None:
    return vsphere.get(key) or os.environ.get(env)


def read_stack_inputs() -> StackInputs:
    """Validate everything before a single resource is registered.

    Raises pulumi.RunError (printed without a stack trace) listing every problem.
    """
    config = pulumi.Config(NAMESPACE)
    vsphere = pulumi.Config("vsphere")
    try:
        lab = load_lab_config(_raw_namespace(config))
    except LabConfigError as error:
        raise pulumi.RunError(str(error)) from None

    missing: list[str] = []
    # Read raw only to check its shape; the value itself stays inside a secret Output.
    raw_private_key = str(pulumi.runtime.config.get_config(f"{NAMESPACE}:{SSH_PRIVATE_KEY}") or "")
    private_key = config.get_secret(SSH_PRIVATE_KEY)
    if not raw_private_key.strip():
        missing.append(
            f"{NAMESPACE}:{SSH_PRIVATE_KEY}: not set; the remote steps log in with it: "
            f"pulumi config set --secret {NAMESPACE}:{SSH_PRIVATE_KEY} < ~/.ssh/id_ed25519"
        )
    elif "PRIVATE KEY-----" not in raw_private_key:
        missing.append(
            f"{NAMESPACE}:{SSH_PRIVATE_KEY}: not a private key (no '-----BEGIN ... PRIVATE KEY-----' block); "
            f"set the key file's contents: pulumi config set --secret {NAMESPACE}:{SSH_PRIVATE_KEY} < ~/.ssh/id_ed25519"
        )
    server = _provider_setting(vsphere, "vsphereServer", "VSPHERE_SERVER")
    user = _provider_setting(vsphere, "user", "VSPHERE_USER")
    # The provider's own precedence: stack config first, then the environment.
    plain_password = str(pulumi.runtime.config.get_config("vsphere:password") or os.environ.get("VSPHERE_PASSWORD", ""))
    password = pulumi.Output.secret(plain_password) if plain_password else None
    if not server:
        missing.append("vsphere:vsphereServer: not set; pulumi config set vsphere:vsphereServer <vcenter host>")
    if not user:
        missing.append("vsphere:user: not set; pulumi config set vsphere:user <user@vsphere.local>")
    if password is None:
        missing.append("vsphere:password: not set; pulumi config set --secret vsphere:password (or VSPHERE_PASSWORD)")
    if missing:
        raise pulumi.RunError(
            f"the {NAMESPACE} config has {len(missing)} problem(s); nothing was created:\n"
            + "\n".join(f"  - {line}" for line in missing)
        )
    assert private_key is not None and password is not None and server and user
    insecure = (_provider_setting(vsphere, "allowUnverifiedSsl", "VSPHERE_ALLOW_UNVERIFIED_SSL") or "false")
    return StackInputs(
        lab=lab,
        ssh_private_key=private_key,
        vcenter=VcenterCredentials(
            server=server,
            user=user,
            password=password,
            allow_unverified_ssl=insecure.strip().lower() in ("true", "1", "yes"),
            plain_password=plain_password,
        ),
        stack=pulumi.get_stack(),
    )
