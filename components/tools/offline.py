"""Run the real program under Pulumi's mock engine: no vCenter, no network, no Pulumi CLI.

`render` and the test suite both use this. A recording MockMonitor keeps what the plain
MockResourceArgs lacks (parent, dependencies, property dependencies, secretness), so tests
assert on the dependency graph rather than on registration order.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import hashlib
import hmac
import json
import os
import re
import runpy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pulumi
import yaml
from google.protobuf import json_format, struct_pb2
from pulumi.runtime import rpc
from pulumi.runtime.mocks import MockMonitor

from components.rendering import bundle_files
from components.ssh_keys import RENDER_PLACEHOLDER_MARK

REPO_ROOT = Path(__file__).resolve().parents[2]
PROJECT = "labs-k8s"
SECRET_MARK = "[secret]"

# Placeholders for what a fresh clone does not have. They are valid in form (so validation
# passes) and say plainly what they are, so nobody mistakes a rendered file for a real one.
PLACEHOLDER_SECRET = "[placeholder: not set on this machine]"
_ED25519_BLOB = b"\x00\x00\x00\x0bssh-ed25519" + b"\x00\x00\x00\x20" + bytes(32)
PLACEHOLDER_PUBLIC_KEY = (
    "ssh-ed25519 " + base64.b64encode(_ED25519_BLOB).decode() + " RENDER-PLACEHOLDER-set-labs-k8s:ssh.publicKey"
)


def _private_key_placeholder(note: str = "") -> str:
    return (
        f"-----BEGIN OPENSSH PRIVATE KEY-----\n{RENDER_PLACEHOLDER_MARK}: set labs-k8s:sshPrivateKey{note}\n"
        "-----END OPENSSH PRIVATE KEY-----\n"
    )


PLACEHOLDER_PRIVATE_KEY = _private_key_placeholder()
REQUIRED_SECRETS = {"labs-k8s:sshPrivateKey": PLACEHOLDER_PRIVATE_KEY, "vsphere:password": PLACEHOLDER_SECRET}
# The example stack file names no vCenter (README, "Secrets and settings"); `render` needs one in form only.
# `.invalid` never resolves (RFC 2606).
PLACEHOLDER_VCENTER = {
    "vsphere:vsphereServer": ("VSPHERE_SERVER", "vcenter.placeholder.invalid"),
    "vsphere:user": ("VSPHERE_USER", "placeholder"),
}


def encrypted_placeholder(key: str, ciphertext: str) -> str:
    """The stand-in for a `secure:` value, which cannot be decrypted here.

    It names a digest of the ciphertext (public: the ciphertext is in the stack file), so a rotated
    secret still changes the inputs of the resources that take it, as under the real engine, and
    `diff` can say which ones. It has the form validation expects (a private key stays a key block).
    """
    note = f"encrypted, ciphertext sha256 {hashlib.sha256(ciphertext.encode()).hexdigest()[:12]}"
    if key == "labs-k8s:sshPrivateKey":
        return _private_key_placeholder(f" ({note})")
    return f"[placeholder: {note}]"


@dataclass
class Registration:
    """One resource as the engine saw it. Inputs are decoded on first use: decoding every
    resource's protobuf eagerly would cost more than evaluating the program itself."""

    type: str
    name: str
    urn: str
    parent: str
    dependencies: list[str]
    property_dependencies: dict[str, list[str]]
    custom: bool = True
    additional_secret_outputs: tuple[str, ...] = ()
    replace_on_changes: tuple[str, ...] = ()
    ignore_changes: tuple[str, ...] = ()
    retain_on_delete: bool = False
    delete_before_replace: bool = False
    # The resource option's timeouts as Pulumi duration strings ("" where unset).
    custom_timeouts: dict[str, str] = field(default_factory=dict)
    wire_inputs: Any = field(default=None, repr=False)
    wire_outputs: Any = field(default=None, repr=False)

    @functools.cached_property
    def inputs(self) -> dict[str, Any]:
        """Inputs with every secret replaced by "[secret]": what plan.json shows."""
        return _redact(json_format.MessageToDict(self.wire_inputs, preserving_proto_field_name=True))

    @functools.cached_property
    def outputs(self) -> dict[str, Any]:
        return _redact(json_format.MessageToDict(self.wire_outputs))

    @functools.cached_property
    def plain_inputs(self) -> dict[str, Any]:
        """For tests only, never written out: the inputs with secrets unwrapped."""
        return _unwrap(rpc.deserialize_properties(self.wire_inputs))

    @functools.cached_property
    def plain_outputs(self) -> dict[str, Any]:
        """For tests only: what the mock provider computed, secrets unwrapped."""
        return _unwrap(rpc.deserialize_properties(self.wire_outputs))

    @functools.cached_property
    def secret_input_keys(self) -> frozenset[str]:
        return frozenset(k for k, v in self.inputs.items() if v == SECRET_MARK)


def _redact(value: Any) -> Any:
    """Replace Pulumi's wire form of a secret with a visible marker, recursively."""
    if isinstance(value, dict):
        if value.get(rpc._special_sig_key) == rpc._special_secret_sig:
            return SECRET_MARK
        if value.get(rpc._special_sig_key) == rpc._special_resource_sig:
            return value.get("urn", "[resource]")
        return {k: _redact(v) for k, v in value.items() if k != "__provider"}
    if isinstance(value, list):
        return [_redact(v) for v in value]
    return value


def _unwrap(value: Any) -> Any:
    if rpc.is_rpc_secret(value):
        return _unwrap(rpc.unwrap_rpc_secret(value))
    if isinstance(value, dict):
        return {k: _unwrap(v) for k, v in value.items() if k != "__provider"}
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    return value


def _urn_name(urn: str) -> str:
    return urn.rsplit("::", 1)[-1] if urn else ""


class RecordingMonitor(MockMonitor):
    """MockMonitor that records parent, dependencies and redacted inputs of every resource."""

    def __init__(self, mocks: pulumi.runtime.Mocks) -> None:
        super().__init__(mocks)
        self.registrations: dict[str, Registration] = {}
        self.stack_outputs: dict[str, Any] = {}

    def RegisterResource(self, request: Any) -> Any:
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            self.registrations[response.urn] = Registration(
                type=request.type,
                name=request.name,
                urn=response.urn,
                parent=request.parent,
                dependencies=list(request.dependencies),
                property_dependencies={k: list(v.urns) for k, v in request.propertyDependencies.items()},
                custom=bool(request.custom),
                additional_secret_outputs=tuple(request.additionalSecretOutputs),
                replace_on_changes=tuple(request.replaceOnChanges),
                ignore_changes=tuple(request.ignoreChanges),
                retain_on_delete=bool(request.retainOnDelete),
                delete_before_replace=bool(request.deleteBeforeReplace),
                custom_timeouts={
                    "create": request.customTimeouts.create,
                    "update": request.customTimeouts.update,
                    "delete": request.customTimeouts.delete,
                },
                wire_inputs=request.object,
                wire_outputs=response.object,
            )
        return response

    def RegisterResourceOutputs(self, request: Any) -> Any:
        if request.urn.split("::")[2] == "pulumi:pulumi:Stack":
            self.stack_outputs = _redact(json_format.MessageToDict(request.outputs))
        return super().RegisterResourceOutputs(request)


def _bundle_param(bundle: str, name: str) -> str | None:
    """A parameter of a step bundle's params.env."""
    params = bundle_files(bundle).get("params.env")
    if params is None:
        return None
    found = re.search(rf"^{name}=(\S+)$", params, re.M)
    return found.group(1).strip("'") if found else None


def _bundle_file(bundle: str, name: str) -> str | None:
    """A file of a step bundle."""
    return bundle_files(bundle).get(name)


def _fake_hex(seed: str, length: int) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:length]


def _draw(args: pulumi.runtime.MockResourceArgs) -> str:
    """What a random resource's value is drawn from here: its name, and its keepers when it has
    any. pulumi-random replaces the resource when its keepers change (every input RequiresReplace),
    and the replacement draws a new value: new keepers, a new value, as in the engine."""
    keepers = args.inputs.get("keepers")
    return f"{args.name} {json.dumps(keepers, sort_keys=True)}" if keepers else args.name


SELF_MANAGED_ORGANIZATION = "organization"


class EnginePanic(BaseException):
    """The Pulumi CLI died (a Go panic): the whole run ends, whatever the program catches.

    A BaseException, so the program's `except Exception` cannot turn it into a warning, as nothing
    in the program can catch the real CLI's crash.
    """


class InvokeFailed(grpc.RpcError):
    """A builtin invoke that returned an error, as the resource monitor reports it: a gRPC error
    (pulumi/pulumi pkg/resource/deploy/source_eval.go Invoke: "invocation of %v returned an
    error"). The SDK hands it to the program as an exception it can catch; a plain exception
    raised in a mock would instead fail the whole run (pulumi/runtime/rpc_manager.py)."""

    def __init__(self, token: str, message: str) -> None:
        super().__init__(message)
        self._details = f"invocation of {token} returned an error: {message}"

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNKNOWN

    def details(self) -> str:
        return self._details


class LabMocks(pulumi.runtime.Mocks):
    """Provider stand-ins: what each resource type computes, and the vSphere data sources.

    Outputs use the providers' camelCase property names, as the real engine returns them.
    """

    def __init__(
        self,
        vip: str = "10.3.60.100",
        kept: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
        previous: Mapping[str, Any] | None = None,
        organization: str = SELF_MANAGED_ORGANIZATION,
        unknown_outputs: bool = False,
    ) -> None:
        self.vip = vip
        # A new stack's preview: the engine knows nothing a provider computes (a create previewed by
        # pulumi-random or pulumi-command answers unknowns), so every such output stays unknown.
        self.unknown_outputs = unknown_outputs
        self.calls: list[tuple[str, dict[str, Any]]] = []
        # (type, name) -> outputs: resources the engine would leave as they are (a "same" step
        # keeps the outputs in the state, whatever the new inputs), see components/tools/changes.py.
        self.kept = dict(kept or {})
        # The stack's last deployment as {urn: {type, outputs}} (OfflineRun.previous_state of an
        # earlier run; {} a deployment without resources), or None: a stack with no deployment at
        # all, what `pulumi stack init` leaves (pulumi/pulumi pkg/backend/diy/backend.go CreateStack).
        self.previous = None if previous is None else dict(previous)
        self.self_managed = organization == SELF_MANAGED_ORGANIZATION

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict[str, Any]]:
        if self.unknown_outputs:
            return "", {}  # in a preview the SDK reads an empty id and every missing output as unknown
        if (args.typ, args.name) in self.kept:
            kept = dict(self.kept[(args.typ, args.name)])
            return f"{args.name}-id", kept
        # Only what providers compute: echoing every input back (stdin bundles, guestinfo) would make
        # the mock, not the program, dominate evaluation time.
        outputs: dict[str, Any] = {"name": args.inputs["name"]} if "name" in args.inputs else {}
        resource_id = f"{args.name}-id"
        if args.typ == "vsphere:index/virtualMachine:VirtualMachine":
            outputs.update(uuid=f"4200{_fake_hex(args.name, 28)}", moid=f"vm-{_fake_hex(args.name, 4)}")
        elif args.typ == "random:index/randomPassword:RandomPassword":
            outputs["result"] = _fake_hex(_draw(args), int(args.inputs.get("length", 16)))
        elif args.typ == "random:index/randomId:RandomId":
            size = int(args.inputs.get("byteLength", 32))
            outputs.update(hex=_fake_hex(_draw(args), size * 2), b64Std="", b64Url="", dec="")
        elif args.typ == "command:remote:Command":
            outputs.update(stdout=self._command_stdout(args.name, args.inputs), stderr="")
        elif args.typ == "pulumi-python:dynamic:Resource":
            # Both dynamic providers return their inputs as outputs (few, small); the template
            # build adds the UUID, managed object id and guest id of the template it made.
            outputs.update({k: v for k, v in args.inputs.items() if k != "__provider"})
            if "isoUrl" in args.inputs:
                # Keyed by the template's name (content hash included): a rebuilt template is a new VM.
                built = str(args.inputs.get("name", args.name))
                outputs.update(
                    uuid=f"4201{_fake_hex(built, 28)}", moid=f"vm-{_fake_hex(built, 4)}", guestId="debian12_64Guest"
                )
        return resource_id, outputs

    def _command_stdout(self, name: str, inputs: Mapping[str, Any]) -> str:
        if name.endswith("-host-key"):
            # install-host-keys.sh prints the Ed25519 key the node now presents: the one in its bundle.
            stdin = str(_unwrap(inputs.get("stdin", "")))  # a secret input arrives in its wire form
            return (_bundle_file(stdin, "ssh_host_ed25519_key.pub") or "").strip()
        if name.endswith("-kubeadm-join"):
            return "joined"
        if name.endswith("-upgrade"):
            # What the upgrade step prints when its node is at the version of its bundle: the record
            # the next run reads back (components/upgrade.py).
            stdin = str(inputs.get("stdin", ""))
            version = _bundle_param(stdin, "K8S_VERSION")
            containerd = _bundle_param(stdin, "CONTAINERD_VERSION")
            return f"{name.removesuffix('-upgrade')} already at v{version}, containerd {containerd}" if version else ""
        if "refresh-join" in name:
            return "sha256:" + _fake_hex(name, 64)
        if "kubeconfig" in name:
            # print-kubeconfig.sh's output: sealed with the transport key its bundle carries.
            from components.rendering.k8s import KUBECONFIG_TRANSPORT_KEY_FILE, seal_kubeconfig

            key = _bundle_file(str(_unwrap(inputs.get("stdin", ""))), KUBECONFIG_TRANSPORT_KEY_FILE) or ""
            kubeconfig = (
                "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    server: https://"
                f"{self.vip}:6443\n  name: labs-k8s"
            )
            sealed = seal_kubeconfig(kubeconfig, key.strip(), _fake_hex(name, 16).encode()[:8])
            return (
                "# labs-k8s: client certificate valid until 2099-01-01T00:00:00Z\n"
                f"# labs-k8s: sealed kubeconfig {sealed}\n"
            )
        return ""

    def _read_stack_outputs(self, name: str) -> dict[str, Any]:
        """pkg/resource/deploy/builtins.go readStackReference -> backendClient.GetStackOutputs: the
        root stack resource's outputs; {} for a stack with no deployment (diy/state.go
        getSnapshotStackOutputs: `checkpoint.Latest == nil`) or none registered yet."""
        outputs: dict[str, Any] = {}
        for entry in (self.previous or {}).values():
            if entry.get("type") == "pulumi:pulumi:Stack":
                outputs = dict(entry.get("outputs") or {})
        return {"name": name, "outputs": outputs, "secretOutputNames": []}

    def _read_stack_resource_outputs(self, name: str) -> dict[str, Any]:
        """pkg/backend/backend.go backendClient.GetStackResourceOutputs: `for _, r := range
        snap.Resources` with no nil check. A self-managed stack with no deployment has a nil
        snapshot (stack.DeserializeCheckpoint): the CLI panics. Pulumi Cloud answers an empty
        deployment for a new stack."""
        if self.previous is None and self.self_managed:
            raise EnginePanic(
                "panic: runtime error: invalid memory address or nil pointer dereference "
                "(backendClient.GetStackResourceOutputs of a self-managed stack with no deployment)"
            )
        return {"name": name, "outputs": dict(self.previous or {})}

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        self.calls.append((args.token, dict(args.args)))
        if args.token == "pulumi:pulumi:readStackOutputs":
            return self._read_stack_outputs(str(args.args.get("name", ""))), []
        if args.token == "pulumi:pulumi:readStackResourceOutputs":
            return self._read_stack_resource_outputs(str(args.args.get("stackName", ""))), []
        name = str(args.args.get("name", ""))
        ids = {
            "vsphere:index/getDatacenter:getDatacenter": {"id": f"datacenter-{_fake_hex(name, 4)}"},
            "vsphere:index/getComputeCluster:getComputeCluster": {
                "id": f"domain-c{_fake_hex(name, 4)}",
                "name": name,
                "resourcePoolId": f"resgroup-{_fake_hex(name, 4)}",
            },
            "vsphere:index/getDatastore:getDatastore": {"id": f"datastore-{_fake_hex(name, 4)}", "name": name},
            "vsphere:index/getNetwork:getNetwork": {
                "id": f"network-{_fake_hex(name, 4)}",
                "name": name,
                "type": "Network",
            },
            "vsphere:index/getResourcePool:getResourcePool": {"id": f"resgroup-{_fake_hex(name, 4)}"},
        }
        return ids.get(args.token, {"id": f"mock-{_fake_hex(args.token + name, 8)}"}), []


# --------------------------------------------------------------------------- stack files


class StackFileError(ValueError):
    """The stack file is missing or is not YAML; the message says what to do."""


def stack_file_path(stack: str) -> Path:
    return REPO_ROOT / f"Pulumi.{stack}.yaml"


def read_stack_file(stack: str) -> dict[str, Any]:
    """The parsed Pulumi.<stack>.yaml, or StackFileError naming the file and the fix."""
    path = stack_file_path(stack)
    if not path.is_file():
        others = sorted(p.name for p in REPO_ROOT.glob("Pulumi.*.yaml"))
        raise StackFileError(
            f"no stack file {path.name} in {REPO_ROOT}: stack {stack!r} has no settings here. "
            f"Make it from the example: cp Pulumi.labs.yaml {path.name}, then edit it "
            f'(README, "What to change for your site"). Stack files here: {", ".join(others) or "none"}'
        )
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise StackFileError(f"{path.name} is not valid YAML: {error}") from None
    if not isinstance(document, dict) or not isinstance(document.get("config") or {}, dict):
        raise StackFileError(f"{path.name}: expected a mapping with a `config:` mapping (see Pulumi.labs.yaml)")
    return document


def _config_value(value: Any) -> str:
    """Pulumi hands structured config to programs as JSON strings, scalars as strings."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def stack_config(
    stack: str = "labs", overrides: Mapping[str, Any] | None = None, stack_file: str | None = None
) -> tuple[dict[str, str], list[str]]:
    """Config and secret keys as the engine would pass them, from Pulumi.<stack>.yaml
    (or Pulumi.<stack_file>.yaml: a second stack made from the same file).

    Encrypted values (`secure:`) and required secrets that are not set become clearly marked
    placeholders; so does a missing SSH public key. Preflight is off: there is no vCenter here.
    """
    document = read_stack_file(stack_file or stack)
    raw: dict[str, Any] = dict(document.get("config") or {})
    secret_keys: list[str] = []
    for key, value in list(raw.items()):
        if isinstance(value, dict) and set(value) == {"secure"}:
            raw[key] = encrypted_placeholder(key, str(value["secure"]))
            secret_keys.append(key)
    for key, placeholder in REQUIRED_SECRETS.items():
        if key not in raw:
            raw[key] = placeholder
            if key not in secret_keys:
                secret_keys.append(key)
    for key, (variable, placeholder) in PLACEHOLDER_VCENTER.items():
        if key not in raw and not os.environ.get(variable):  # the program reads the variable itself
            raw[key] = placeholder
    ssh = dict(raw.get("labs-k8s:ssh") or {})
    ssh.setdefault("publicKey", PLACEHOLDER_PUBLIC_KEY)
    raw["labs-k8s:ssh"] = ssh
    preflight = dict(raw.get("labs-k8s:preflight") or {})
    preflight["enabled"] = False
    raw["labs-k8s:preflight"] = preflight
    for key, value in (overrides or {}).items():
        raw[key] = value
    return {k: _config_value(v) for k, v in raw.items()}, secret_keys


def default_provider_inputs(config: Mapping[str, Any], secret_keys: set[str] | frozenset[str]) -> dict[str, Any]:
    """The inputs the engine records for the default providers of a run with this stack config
    (pulumi/pulumi pkg/resource/deploy/target.go Target.GetPackageConfig): the `vsphere` provider
    gets its own namespace's keys without the namespace; a dynamic provider (`pulumi-python`, the
    template's and the clone sources') gets every key, namespace kept. Values are strings; a
    secret is {"secret": value}. `VSPHERE_*` variables are no config: they are in no input."""

    def value(key: str, raw: Any) -> Any:
        text = ("true" if raw else "false") if isinstance(raw, bool) else _config_value(raw)
        return {"secret": text} if key in secret_keys else text

    return {
        "vsphere": {k.split(":", 1)[1]: value(k, v) for k, v in config.items() if k.startswith("vsphere:")},
        "pulumi-python": {k: value(k, v) for k, v in config.items()},
    }


# --------------------------------------------------------------------------- running


@dataclass
class OfflineRun:
    registrations: dict[str, Registration]
    stack_outputs: dict[str, Any]
    calls: list[tuple[str, dict[str, Any]]]
    # The stack configuration the program ran with (values as the engine passes them) and which
    # keys of it are secret: what the engine would also hand a dynamic provider's Configure.
    config: dict[str, str] = field(default_factory=dict)
    secret_keys: list[str] = field(default_factory=list)
    # The same program and config again, with some resources' outputs kept (LabMocks.kept).
    rerun: Callable[[Mapping[tuple[str, str], Mapping[str, Any]]], OfflineRun] | None = field(
        default=None, repr=False, compare=False
    )

    def by_name(self, name: str) -> Registration:
        matches = [r for r in self.registrations.values() if r.name == name]
        if len(matches) != 1:
            raise KeyError(f"{len(matches)} resources named {name!r}")
        return matches[0]

    def of_type(self, type_token: str) -> list[Registration]:
        return [r for r in self.registrations.values() if r.type == type_token]

    def depends_on(self, name: str, other: str) -> bool:
        """True when `name` depends on `other`, directly or through the graph."""
        target = self.by_name(other).urn
        seen: set[str] = set()
        stack = list(self.by_name(name).dependencies)
        while stack:
            urn = stack.pop()
            if urn == target:
                return True
            if urn in seen or urn not in self.registrations:
                continue
            seen.add(urn)
            stack.extend(self.registrations[urn].dependencies)
        return False

    def parent_name(self, name: str) -> str:
        return _urn_name(self.by_name(name).parent)

    def previous_state(self) -> dict[str, Any]:
        """This run as the next run's `readStackResourceOutputs` sees it: every resource's state
        (a Command's state holds its inputs too) and the stack's outputs."""
        state: dict[str, Any] = {}
        for urn, reg in self.registrations.items():
            state[urn] = {
                "type": reg.type,
                "outputs": {**reg.plain_inputs, **_unwrap(rpc.deserialize_properties(reg.wire_outputs))}
                if reg.custom
                else {},
            }
        state[f"urn:pulumi:stack::{PROJECT}::pulumi:pulumi:Stack::{PROJECT}-stack"] = {
            "type": "pulumi:pulumi:Stack",
            "outputs": dict(self.stack_outputs),
        }
        return state


def run_program(
    stack: str = "labs",
    overrides: Mapping[str, Any] | None = None,
    program: Callable[[], None] | None = None,
    preview: bool = False,
    monitor_sink: list[RecordingMonitor] | None = None,
    stack_file: str | None = None,
    kept: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
    previous: Mapping[str, Any] | None = None,
    organization: str = SELF_MANAGED_ORGANIZATION,
    unknown_outputs: bool = False,
) -> OfflineRun:
    """Run `__main__.py` (or `program`) as the engine would, under mocks, and return what it registered.

    `stack_file` runs stack `stack` with the configuration of Pulumi.<stack_file>.yaml. `kept`
    gives the outputs of resources that the mock providers return unchanged (LabMocks.kept).
    `previous` is the stack's last deployment (None: a new stack with none, LabMocks.previous);
    `organization` "organization" is a self-managed backend, any other Pulumi Cloud.
    `unknown_outputs` (with `preview`): a new stack's preview, no provider output known (LabMocks).
    """
    config, secret_keys = stack_config(stack, overrides, stack_file)
    vip = (
        json.loads(config["labs-k8s:loadBalancer"]).get("vip", "10.3.60.100")
        if ("labs-k8s:loadBalancer" in config)
        else "10.3.60.100"
    )
    mocks = LabMocks(
        vip=str(vip), kept=kept, previous=previous, organization=organization, unknown_outputs=unknown_outputs
    )
    monitor = RecordingMonitor(mocks)
    if monitor_sink is not None:
        monitor_sink.append(monitor)  # lets a caller see what was registered before a failure
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        # A self-managed backend's organization is "organization" (the engine passes it).
        pulumi.runtime.set_mocks(
            mocks, project=PROJECT, stack=stack, preview=preview, monitor=monitor, organization=organization
        )
        pulumi.runtime.set_all_config(config, secret_keys)
        # Outputs or RPCs left by earlier code in this process (another run, a test that made an
        # Output outside any engine) belong to another event loop: waiting for them would hang.
        pulumi.runtime.settings.SETTINGS.rpc_manager.clear()
        pulumi.runtime.settings.SETTINGS.outputs.clear()
        # set_mocks made a root stack of its own; the program gets a fresh one, as under the engine,
        # so that its exports are registered as stack outputs.
        pulumi.runtime.settings.ROOT.set(None)

        def run_main() -> None:
            runpy.run_path(str(REPO_ROOT / "__main__.py"), run_name="__main__")

        main = program or run_main
        loop.run_until_complete(pulumi.runtime.stack.run_in_stack(main))
    finally:
        loop.close()
        asyncio.set_event_loop(None)

    def rerun(keep: Mapping[tuple[str, str], Mapping[str, Any]]) -> OfflineRun:
        # What this run's providers were told to answer (a seed `--replace`d) stays as it was.
        keep = {**keep, **(kept or {})}
        return run_program(stack, overrides, program, preview, None, stack_file, keep, previous, organization)

    return OfflineRun(monitor.registrations, monitor.stack_outputs, mocks.calls, config, secret_keys, rerun)


def lab_config_from_stack(stack: str = "labs", overrides: Mapping[str, Any] | None = None) -> Any:
    """The validated LabConfig of a stack file (with the same placeholders as `run_program`)."""
    from components.config import NAMESPACE, load_lab_config

    config, _ = stack_config(stack, overrides)
    prefix = f"{NAMESPACE}:"
    structured = {k[len(prefix) :]: v for k, v in config.items() if k.startswith(prefix)}
    structured.pop("sshPrivateKey", None)
    return load_lab_config({k: json.loads(v) if v[:1] in "{[" else v for k, v in structured.items()})


# --------------------------------------------------------------------------- run documents

RUN_DOCUMENT_FORMAT = 1
_SECRET_FINGERPRINT = "[secret:"


def _fingerprint(value: Any, key: bytes) -> Any:
    """Like _redact, but a secret becomes "[secret:<HMAC-SHA256 of its value>]": two runs compare
    equal where a secret did not change, and without the key nothing about the value can be learnt
    (`diff` makes the key per run and never writes it out)."""
    if isinstance(value, dict):
        if value.get(rpc._special_sig_key) == rpc._special_secret_sig:
            inner = json.dumps(value.get("value"), sort_keys=True).encode()
            return f"{_SECRET_FINGERPRINT}{hmac.new(key, inner, hashlib.sha256).hexdigest()[:32]}]"
        if value.get(rpc._special_sig_key) == rpc._special_resource_sig:
            return value.get("urn", "[resource]")
        return {k: _fingerprint(v, key) for k, v in value.items() if k != "__provider"}
    if isinstance(value, list):
        return [_fingerprint(v, key) for v in value]
    return value


def _fingerprints_hidden(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(_SECRET_FINGERPRINT) and value.endswith("]"):
        return SECRET_MARK
    if isinstance(value, dict):
        return {k: _fingerprints_hidden(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_fingerprints_hidden(v) for v in value]
    return value


def run_document(run: OfflineRun, key: bytes) -> dict[str, Any]:
    """Everything the engine was told about each resource, as JSON, with secrets fingerprinted.

    `diff` has each side's own code write this (in a subprocess, from that side's checkout) and
    rebuilds the runs from it with `run_from_document`, so two versions of the program compare
    without sharing a process. Every Registration field is kept, whatever fields it gains.
    """
    resources = []
    for reg in sorted(run.registrations.values(), key=lambda r: r.urn):
        entry = {f.name: getattr(reg, f.name) for f in dataclasses.fields(reg) if not f.name.startswith("wire_")}
        inputs = json_format.MessageToDict(reg.wire_inputs, preserving_proto_field_name=True)
        entry["inputs"] = _fingerprint(inputs, key)
        entry["outputs"] = _fingerprint(json_format.MessageToDict(reg.wire_outputs), key)
        provider = rpc.deserialize_properties(reg.wire_inputs).get("__provider") if reg.wire_inputs else None
        if provider is not None:
            # A dynamic resource's pickled provider (code, not data; the SDK marks it secret when a
            # secret input sits beside it): its own diff() decides what changes for it.
            entry["dynamic_provider"] = rpc.unwrap_rpc_secret(provider) if rpc.is_rpc_secret(provider) else provider
        resources.append(entry)
    return {"format": RUN_DOCUMENT_FORMAT, "resources": resources}


def run_from_document(document: Mapping[str, Any]) -> OfflineRun:
    """The OfflineRun a run document describes, for components.tools.changes. `plain_inputs` and
    `plain_outputs` hold the secrets' fingerprints (equal fingerprints, equal values); `inputs` and
    `outputs` show them as "[secret]", as everywhere else; `wire_inputs` holds only `__provider`."""
    if document.get("format") != RUN_DOCUMENT_FORMAT:
        raise ValueError(f"run document format {document.get('format')!r}, expected {RUN_DOCUMENT_FORMAT}")
    fields = {f.name: f for f in dataclasses.fields(Registration) if not f.name.startswith("wire_")}
    registrations: dict[str, Registration] = {}
    for entry in document["resources"]:
        kwargs: dict[str, Any] = {
            name: tuple(value) if str(fields[name].type).startswith("tuple") else value
            for name, value in entry.items()
            if name in fields
        }
        if "dynamic_provider" in entry:
            # The wire form of what the provider host is handed besides the inputs: `__provider`.
            kwargs["wire_inputs"] = struct_pb2.Struct()
            kwargs["wire_inputs"].update({"__provider": entry["dynamic_provider"]})
        reg = Registration(**kwargs)
        # Seed the cached properties: there is no full wire form to decode.
        reg.__dict__["plain_inputs"] = entry["inputs"]
        reg.__dict__["inputs"] = _fingerprints_hidden(entry["inputs"])
        reg.__dict__["plain_outputs"] = entry.get("outputs", {})
        reg.__dict__["outputs"] = _fingerprints_hidden(entry.get("outputs", {}))
        registrations[reg.urn] = reg
    return OfflineRun(registrations, {}, [])
