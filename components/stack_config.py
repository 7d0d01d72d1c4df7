"""Reading the stack's configuration: Pulumi config in, a validated LabConfig and secret Outputs out.

This is the only place that knows the config keys' storage: `labs-k8s:<key>` structured values,
the `labs-k8s:sshPrivateKey` secret, and the vSphere provider's own `vsphere:*` keys (or the
VSPHERE_* environment variables the provider also reads).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
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
from components.ssh_keys import private_key_problem

SSH_PRIVATE_KEY = "sshPrivateKey"
# The preview job's path without the SSH private key (docs/runbook.md, "The preview job's
# approval gate"): a preview runs no remote command (pulumi-command's Create/Update return at
# once when DryRun is set, provider/pkg/provider/remote/commandController.go), so it does not need
# the key that gives root on every node. Set to "true" for `pulumi preview` only; `up` refuses it.
PREVIEW_WITHOUT_SSH_KEY = "LABS_K8S_PREVIEW_WITHOUT_SSH_KEY"
PREVIEW_PLACEHOLDER_PRIVATE_KEY = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    f"preview without the SSH key ({PREVIEW_WITHOUT_SSH_KEY}): never used to connect\n"
    "-----END OPENSSH PRIVATE KEY-----\n"
)
REMOTE_COMMAND_TYPES = ("command:remote:Command", "command:remote:CopyToRemote")
# What the vSphere provider (Go, strconv.ParseBool) accepts for a boolean setting such as
# vsphere:allowUnverifiedSsl; pyvmomi must read the same value the same way.
_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_FALSE = ("0", "f", "F", "FALSE", "false", "False")


def provider_bool(value: str | None, default: bool = False) -> bool:
    """A vSphere provider boolean (config or environment); ValueError for anything else."""
    if value is None or value.strip() == "":
        return default
    if value.strip() in _TRUE:
        return True
    if value.strip() in _FALSE:
        return False
    raise ValueError(f"{value!r} is neither true nor false")


# The vSphere provider's own settings (`vsphere:<key>`) and the environment variables it also reads.
VSPHERE_SETTINGS = {
    "vsphereServer": "VSPHERE_SERVER",
    "user": "VSPHERE_USER",
    "password": "VSPHERE_PASSWORD",
    "allowUnverifiedSsl": "VSPHERE_ALLOW_UNVERIFIED_SSL",
}


# Every `vsphere:` key the provider reads (pulumi-vsphere 4.x sdk config/vars.py). Anything else in
# the namespace is a typo the provider ignores silently: `vsphere:usr` left vsphere:user unset.
VSPHERE_PROVIDER_KEYS = (
    "allowUnverifiedSsl",
    "apiTimeout",
    "clientDebug",
    "clientDebugPath",
    "clientDebugPathRun",
    "password",
    "persistSession",
    "restSessionPath",
    "user",
    "vcenterServer",
    "vimKeepAlive",
    "vimSessionPath",
    "vsphereServer",
)


def unknown_vsphere_keys(keys: Iterable[str]) -> list[str]:
    """A problem, with "did you mean", for each `vsphere:<key>` the provider does not read."""
    import difflib

    problems = []
    for full in sorted(keys):
        namespace, _, key = full.partition(":")
        if namespace != "vsphere" or key in VSPHERE_PROVIDER_KEYS:
            continue
        close = difflib.get_close_matches(key, VSPHERE_PROVIDER_KEYS, n=1, cutoff=0.5)
        camel = "".join(part.capitalize() if i else part for i, part in enumerate(key.split("_")))
        if camel in VSPHERE_PROVIDER_KEYS:
            close = [camel]
        guess = f"Did you mean vsphere:{close[0]}? " if close else ""
        problems.append(
            f"{full}: unknown key; the vSphere provider ignores it. {guess}Its keys are camelCase: "
            f"{', '.join(VSPHERE_PROVIDER_KEYS)}"
        )
    return problems


def vsphere_settings(
    get: Callable[[str], str | None], environ: Mapping[str, str] | None = None
) -> dict[str, str | None]:
    """The vCenter login with the provider's precedence: stack config first, then VSPHERE_*.

    `get` reads a full config key ("vsphere:password"). The program, the template's dynamic
    provider (from the config the engine hands it at Configure) and the drills all use this.
    """
    env = os.environ if environ is None else environ
    return {key: (get(f"vsphere:{key}") or env.get(variable) or None) for key, variable in VSPHERE_SETTINGS.items()}


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


def _with_public_key_command(error: LabConfigError, stack: str) -> LabConfigError:
    """A missing ssh.publicKey gets the exact command that sets it."""
    problems = [
        ConfigProblem(
            p.key,
            f"not set; the nodes trust this key for the remote steps: pulumi config set --stack {stack} "
            f"--path '{NAMESPACE}:ssh.publicKey' \"$(cat ~/.ssh/labs-k8s.pub)\"",
        )
        if p.key == "ssh.publicKey" and "required" in p.message
        else p
        for p in error.problems
    ]
    return LabConfigError(problems)


def read_stack_inputs() -> StackInputs:
    """Validate everything before a single resource is registered.

    Raises pulumi.RunError (printed without a stack trace) listing every problem.
    """
    config = pulumi.Config(NAMESPACE)
    stack = pulumi.get_stack()
    try:
        lab = load_lab_config(_raw_namespace(config))
    except LabConfigError as error:
        raise pulumi.RunError(str(_with_public_key_command(error, stack))) from None

    missing: list[str] = unknown_vsphere_keys(pulumi.runtime.config.CONFIG.get())
    # Read raw only to check its shape; the value itself stays inside a secret Output.
    raw_private_key = str(pulumi.runtime.config.get_config(f"{NAMESPACE}:{SSH_PRIVATE_KEY}") or "")
    private_key = config.get_secret(SSH_PRIVATE_KEY)
    set_private_key = f"pulumi config set --stack {stack} --secret {NAMESPACE}:{SSH_PRIVATE_KEY} < ~/.ssh/labs-k8s"
    without_key = preview_without_ssh_key(os.environ, pulumi.runtime.is_dry_run())
    if without_key is not None:
        missing.append(without_key)
    elif os.environ.get(PREVIEW_WITHOUT_SSH_KEY) == "true":
        private_key = pulumi.Output.secret(PREVIEW_PLACEHOLDER_PRIVATE_KEY)
        pulumi.runtime.register_stack_transformation(keep_recorded_connections)
    elif not raw_private_key.strip():
        missing.append(f"{NAMESPACE}:{SSH_PRIVATE_KEY}: not set; the remote steps log in with it: {set_private_key}")
    elif "PRIVATE KEY-----" not in raw_private_key:
        missing.append(
            f"{NAMESPACE}:{SSH_PRIVATE_KEY}: not a private key (no '-----BEGIN ... PRIVATE KEY-----' block); "
            f"set the key file's contents: {set_private_key}"
        )
    else:
        key_problem = private_key_problem(raw_private_key, lab.ssh.public_key, stack)
        if key_problem:
            missing.append(f"{NAMESPACE}:{SSH_PRIVATE_KEY}: {key_problem}")
    # Raw reads: pulumi.Config.get would warn about reading the secret password in plain.
    settings = vsphere_settings(pulumi.runtime.config.get_config)
    server, user = settings["vsphereServer"], settings["user"]
    plain_password = str(settings["password"] or "")
    password = pulumi.Output.secret(plain_password) if plain_password else None
    if not server:
        missing.append(
            f"vsphere:vsphereServer: not set (nor VSPHERE_SERVER); "
            f"pulumi config set --stack {stack} vsphere:vsphereServer <vcenter host name>"
        )
    else:
        from components.vsphere import VSphereError, parse_server

        try:
            parse_server(server)
        except VSphereError as error:
            missing.append(str(error))
    if not user:
        missing.append(
            f"vsphere:user: not set (nor VSPHERE_USER); "
            f"pulumi config set --stack {stack} vsphere:user <user@vsphere.local>"
        )
    if password is None:
        missing.append(
            f"vsphere:password: not set (nor VSPHERE_PASSWORD); "
            f"pulumi config set --stack {stack} --secret vsphere:password"
        )
    insecure = False
    try:
        insecure = provider_bool(settings["allowUnverifiedSsl"])
    except ValueError as error:
        in_config = pulumi.runtime.config.get_config("vsphere:allowUnverifiedSsl")
        source = "vsphere:allowUnverifiedSsl" if in_config else "VSPHERE_ALLOW_UNVERIFIED_SSL"
        missing.append(
            f"{source}: {error}; write true or false: "
            f"pulumi config set --stack {stack} vsphere:allowUnverifiedSsl false "
            "(true skips vCenter's certificate check: a lab without a trusted vCenter CA only, see "
            "docs/runbook.md#trusting-the-vcenter-certificate)"
        )
    if missing:
        raise pulumi.RunError(
            f"the {NAMESPACE} config has {len(missing)} problem(s); nothing was created:\n"
            + "\n".join(f"  - {line}" for line in missing)
        )
    assert private_key is not None and password is not None and server and user
    return StackInputs(
        lab=lab,
        ssh_private_key=private_key,
        vcenter=VcenterCredentials(
            server=server,
            user=user,
            password=password,
            allow_unverified_ssl=insecure,
            plain_password=plain_password,
        ),
        stack=stack,
    )


def preview_without_ssh_key(environ: Mapping[str, str], dry_run: bool) -> str | None:
    """The problem with $LABS_K8S_PREVIEW_WITHOUT_SSH_KEY, or None (unset, or "true" in a preview)."""
    value = environ.get(PREVIEW_WITHOUT_SSH_KEY)
    if value is None or (value == "true" and dry_run):
        return None
    if value != "true":
        return f"{PREVIEW_WITHOUT_SSH_KEY}={value!r}: write true (a preview without the SSH key) or unset it"
    return (
        f"{PREVIEW_WITHOUT_SSH_KEY}=true is for `pulumi preview` only, and this run changes the lab: "
        f"unset it and set the key ({NAMESPACE}:{SSH_PRIVATE_KEY}) for `pulumi up` or `destroy`"
    )


def keep_recorded_connections(
    args: pulumi.ResourceTransformationArgs,
) -> pulumi.ResourceTransformationResult | None:
    """In a preview without the SSH key, every remote step's `connection` holds the placeholder
    key: compare the recorded connection instead, so the preview does not show every step as an
    update. The cost, said in docs/runbook.md: such a preview does not show a connection change."""
    if args.type_ not in REMOTE_COMMAND_TYPES:
        return None
    # ResourceOptions.merge appends lists: the step's own ignore_changes stay.
    return pulumi.ResourceTransformationResult(
        args.props, pulumi.ResourceOptions.merge(args.opts, pulumi.ResourceOptions(ignore_changes=["connection"]))
    )


def check_api_timeout(inputs: StackInputs, created: list[str] | None) -> None:
    """Refuse, before anything is registered, a vsphere:apiTimeout too short for the VMs this run
    creates (``created``: their names; None = every node). components/fleet.py says why."""
    from components.clone_timing import api_timeout_problem

    in_config = pulumi.runtime.config.get_config("vsphere:apiTimeout")
    problem = api_timeout_problem(
        inputs.lab,
        in_config or os.environ.get("VSPHERE_API_TIMEOUT"),
        "vsphere:apiTimeout" if in_config else "vsphere:apiTimeout (or VSPHERE_API_TIMEOUT)",
        inputs.stack,
        created,
    )
    if problem is None:
        return
    error, text = problem
    if error:
        raise pulumi.RunError(f"the {NAMESPACE} config has 1 problem(s); nothing was created:\n  - {text}")
    pulumi.log.warn(text)
