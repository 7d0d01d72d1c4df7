"""The Pulumi engine's side of a Python dynamic provider, for tests.

`pulumi up` does not call a dynamic provider's Python methods itself. The engine starts the
`pulumi-python` resource plugin, `pulumi-resource-pulumi-python`, a shell script shipped with the
CLI that runs `<program dir>/.venv/bin/python -u -m pulumi.dynamic <engine address>` from the
program's directory (PULUMI_RUNTIME_VIRTUALENV comes from Pulumi.yaml's `virtualenv` option). That
process prints its gRPC port on stdout and serves pulumirpc.ResourceProvider; the engine sends it
the inputs the program registered, after its own marshalling, and the host unpickles the provider
from the `__provider` input and calls it.

`ProviderHost` runs that same host process the same way and speaks the same gRPC interface.
`EngineResource` plays the engine's step logic for one resource across runs (what
pkg/resource/deploy/step_generator.go and sdk/go/common/resource/plugin/provider_plugin.go do):

- Handshake (the Python host does not implement it: UNIMPLEMENTED, and the engine carries on),
  then Configure with the stack's whole configuration, namespaces kept, secrets marked (for the
  pulumi-python and pulumi-nodejs packages the engine passes every key: deploy/target.go
  GetPackageConfig, pulumi/pulumi#17673). The host answers acceptSecrets=false, so from then on
  every property map is sent with its secrets unwrapped (MarshalOptions.KeepSecrets).
- first `up`: Check(olds={}, news=registered) then Create(checked inputs);
- later `up`: Check(olds=old inputs, news=registered), Diff(olds=old *outputs*, news=checked,
  old_inputs); DIFF_NONE is a same step, replaces are a replace (create-then-delete unless the
  provider asks for deleteBeforeReplace), other changes an Update;
- `preview`: Check and Diff only (the Python host declares no preview support, so the engine
  never calls Create/Update during a preview);
- `refresh`: Read(properties=old outputs, inputs=old inputs); an empty id means the resource is
  gone and leaves the state;
- `destroy`: Delete(properties=old outputs, old_inputs).

`refresh` and `destroy` do not run the program, so no default provider is registered: the engine
rehydrates the one in the state and configures it with the inputs recorded at the last `up`
(pkg/resource/deploy/providers/registry.go Registry.Same: Configure(res.Inputs)), whatever the
stack config says now. Every CLI does: pulumi/pulumi#18740, which used the current config, was
reverted the same day by #18756. So `refresh` and `destroy` here take no config: they use the one
the last `up` recorded (EngineResource.provider_config).

The registered inputs come from the program itself run under the mock engine
(components/tools/offline.py: Registration.wire_inputs is the RegisterResource request's `object`,
serialized by pulumi.runtime.rpc.serialize_properties, which drops every None), never from a dict
written by hand.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format, struct_pb2
from pulumi.runtime import rpc
from pulumi.runtime.proto import provider_pb2, provider_pb2_grpc

from tests.requirements import unavailable

REPO = Path(__file__).resolve().parent.parent
PROVIDER_KEY = "__provider"
PYTHON_DYNAMIC_PACKAGE = "pulumi-python"
START_TIMEOUT_S = 60.0
DEFAULT_CALL_TIMEOUT_S = 300.0
# The engine passes its own gRPC address as the only argument; the Python host ignores it.
ENGINE_ADDRESS_ARG = "127.0.0.1:0"


class ProviderError(RuntimeError):
    """A provider call failed; `details` is what the host sent back (the Python traceback)."""

    def __init__(self, operation: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{operation} failed ({code.name}):\n{details}")
        self.operation = operation
        self.code = code
        self.details = details


def to_struct(value: Mapping[str, Any]) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    json_format.ParseDict(dict(value), struct)
    return struct


def from_struct(struct: struct_pb2.Struct) -> dict[str, Any]:
    return json_format.MessageToDict(struct)


def _without_secrets(value: Any) -> Any:
    """What MarshalProperties(KeepSecrets=false) sends: each secret replaced by its plain element."""
    if isinstance(value, dict):
        if value.get(rpc._special_sig_key) == rpc._special_secret_sig:
            return _without_secrets(value.get("value"))
        return {k: _without_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_secrets(v) for v in value]
    return value


def _secret(value: Any) -> dict[str, Any]:
    return {rpc._special_sig_key: rpc._special_secret_sig, "value": value}


def plain(properties: struct_pb2.Struct) -> dict[str, Any]:
    """A property map as a provider that accepts no secrets sees it (for assertions)."""
    return _without_secrets(from_struct(properties))


class ProviderHost:
    """One `python -m pulumi.dynamic` process, started and configured as the engine does it."""

    def __init__(
        self,
        config: Mapping[str, str],
        secret_keys: list[str] | tuple[str, ...] = (),
        *,
        program_dir: Path = REPO,
        project: str = "labs-k8s",
        environment: Mapping[str, str] | None = None,
    ) -> None:
        self.program_dir = program_dir
        venv = program_dir / ".venv"
        self.python = venv / "bin" / "python"
        if not self.python.is_file():
            unavailable(f"no virtualenv at {venv}: `make venv-dev` creates it (the engine runs the host with it)")
        env = dict(os.environ if environment is None else environment)
        # What NewProvider adds (provider_plugin.go) and the plugin script does with it.
        env.update(
            PULUMI_RUNTIME_VIRTUALENV=".venv",
            PULUMI_RUNTIME_TOOLCHAIN="pip",
            PULUMI_PROJECT=project,
            PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        )
        env.pop("PYTHONHOME", None)
        self.shown: list[str] = []  # diagnostics() as the host closed
        self._stderr = tempfile.NamedTemporaryFile(prefix="pulumi-dynamic-", suffix=".log")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [str(self.python), "-u", "-m", "pulumi.dynamic", ENGINE_ADDRESS_ARG],
            cwd=program_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            start_new_session=True,
        )
        try:
            self.port = self._read_port()
            self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
            grpc.channel_ready_future(self.channel).result(timeout=START_TIMEOUT_S)
            self.stub = provider_pb2_grpc.ResourceProviderStub(self.channel)
            self._handshake()
            self.accept_secrets = self._configure(config, secret_keys)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ process

    def _read_port(self) -> int:
        """The engine reads the plugin's first stdout line as its port (plugin.go newPlugin)."""
        line: list[bytes] = []
        reader = threading.Thread(target=lambda: line.append(self.process.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(START_TIMEOUT_S)
        text = line[0].decode().strip() if line else ""
        if not text.isdigit():
            raise RuntimeError(f"the dynamic provider host printed {text!r}, not a port:\n{self.stderr_tail()}")
        return int(text)

    def stderr_tail(self, lines: int = 40) -> str:
        self._stderr.flush()
        self._stderr.seek(0)
        return "\n".join(self._stderr.read().decode("utf-8", "replace").splitlines()[-lines:])

    def diagnostics(self) -> list[str]:
        """What the engine shows of this host so far: each non-empty stderr line is one info
        diagnostic (sdk/go/common/resource/plugin/plugin.go newPlugin runtrace)."""
        self._stderr.flush()
        with open(self._stderr.name, "rb") as written:
            return [line for line in written.read().decode("utf-8", "replace").splitlines() if line.strip()]

    def close(self) -> None:
        channel = getattr(self, "channel", None)
        if channel is not None:
            channel.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.shown = self.diagnostics()
        self._stderr.close()

    def __enter__(self) -> ProviderHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ protocol

    def _call(self, operation: str, method: Any, request: Any, timeout_s: float) -> Any:
        try:
            return method(request, timeout=timeout_s)
        except grpc.RpcError as error:
            raise ProviderError(operation, error.code(), error.details() or "") from None

    def _handshake(self) -> None:
        request = provider_pb2.ProviderHandshakeRequest(
            engine_address=ENGINE_ADDRESS_ARG,
            root_directory=str(self.program_dir),
            program_directory=str(self.program_dir),
            configure_with_urn=True,
            supports_views=True,
        )
        try:
            self.stub.Handshake(request, timeout=START_TIMEOUT_S)
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise ProviderError("Handshake", error.code(), error.details() or "") from None

    def _configure(self, config: Mapping[str, str], secret_keys: list[str] | tuple[str, ...]) -> bool:
        args = {key: _secret(value) if key in secret_keys else value for key, value in config.items()}
        # provider_plugin.go Configure: variables use the old "<pkg>:config:<key>" spelling, secrets removed.
        variables = {f"{PYTHON_DYNAMIC_PACKAGE}:config:{key}": value for key, value in config.items()}
        response = self._call(
            "Configure",
            self.stub.Configure,
            provider_pb2.ConfigureRequest(
                variables=variables,
                args=to_struct(args),
                acceptSecrets=True,
                acceptResources=True,
                sends_old_inputs=True,
                sends_old_inputs_to_delete=True,
            ),
            START_TIMEOUT_S,
        )
        return bool(response.acceptSecrets)

    def marshal(self, properties: struct_pb2.Struct) -> struct_pb2.Struct:
        """Properties as the engine sends them to this provider."""
        if self.accept_secrets:
            return properties
        return to_struct(_without_secrets(from_struct(properties)))

    def check(self, urn: str, olds: struct_pb2.Struct, news: struct_pb2.Struct) -> provider_pb2.CheckResponse:
        request = provider_pb2.CheckRequest(
            urn=urn,
            name=urn.rsplit("::", 1)[-1],
            type=urn.split("::")[2].rsplit("$", 1)[-1],
            olds=self.marshal(olds),
            news=self.marshal(news),
        )
        response = self._call("Check", self.stub.Check, request, DEFAULT_CALL_TIMEOUT_S)
        if response.failures:
            reasons = "; ".join(f"{f.property}: {f.reason}" for f in response.failures)
            raise ProviderError("Check", grpc.StatusCode.INVALID_ARGUMENT, reasons)
        return response

    def diff(
        self, urn: str, id_: str, old_outputs: struct_pb2.Struct, news: struct_pb2.Struct, old_inputs: struct_pb2.Struct
    ) -> provider_pb2.DiffResponse:
        request = provider_pb2.DiffRequest(
            id=id_,
            urn=urn,
            olds=self.marshal(old_outputs),
            news=self.marshal(news),
            old_inputs=self.marshal(old_inputs),
        )
        return self._call("Diff", self.stub.Diff, request, DEFAULT_CALL_TIMEOUT_S)

    def create(self, urn: str, properties: struct_pb2.Struct, timeout_s: float) -> provider_pb2.CreateResponse:
        request = provider_pb2.CreateRequest(urn=urn, properties=self.marshal(properties), timeout=timeout_s)
        return self._call("Create", self.stub.Create, request, timeout_s)

    def update(
        self,
        urn: str,
        id_: str,
        old_outputs: struct_pb2.Struct,
        news: struct_pb2.Struct,
        old_inputs: struct_pb2.Struct,
        timeout_s: float,
    ) -> provider_pb2.UpdateResponse:
        request = provider_pb2.UpdateRequest(
            id=id_,
            urn=urn,
            olds=self.marshal(old_outputs),
            news=self.marshal(news),
            old_inputs=self.marshal(old_inputs),
            timeout=timeout_s,
        )
        return self._call("Update", self.stub.Update, request, timeout_s)

    def read(
        self, urn: str, id_: str, outputs: struct_pb2.Struct, inputs: struct_pb2.Struct
    ) -> provider_pb2.ReadResponse:
        request = provider_pb2.ReadRequest(
            id=id_, urn=urn, properties=self.marshal(outputs), inputs=self.marshal(inputs)
        )
        return self._call("Read", self.stub.Read, request, DEFAULT_CALL_TIMEOUT_S)

    def delete(
        self, urn: str, id_: str, outputs: struct_pb2.Struct, old_inputs: struct_pb2.Struct, timeout_s: float
    ) -> None:
        request = provider_pb2.DeleteRequest(
            id=id_, urn=urn, properties=self.marshal(outputs), old_inputs=self.marshal(old_inputs), timeout=timeout_s
        )
        self._call("Delete", self.stub.Delete, request, timeout_s)


@dataclass
class ResourceState:
    """One resource in the engine's checkpoint: its id, inputs and outputs."""

    id: str
    inputs: struct_pb2.Struct
    outputs: struct_pb2.Struct

    @property
    def plain_outputs(self) -> dict[str, Any]:
        return plain(self.outputs)


@dataclass(frozen=True)
class Step:
    """What one engine operation did to the resource, and the Diff behind it."""

    op: str  # create, same, update, replace, refresh, gone, delete
    replaces: tuple[str, ...] = ()
    delete_before_replace: bool = False


class EngineResource:
    """The engine's view of one dynamic resource across `up`, `preview`, `refresh` and `destroy`.

    Each operation starts a fresh host, as each `pulumi` command does (the host process lives as
    long as the command), configured with that command's stack config.
    """

    def __init__(
        self, urn: str, timeout_s: float = DEFAULT_CALL_TIMEOUT_S, environment: Mapping[str, str] | None = None
    ) -> None:
        self.urn = urn
        self.timeout_s = timeout_s
        self.environment = environment
        self.state: ResourceState | None = None
        self.steps: list[Step] = []
        # The default provider's inputs in the state: the stack config of the last `up`.
        self.provider_config: tuple[dict[str, str], tuple[str, ...]] | None = None
        # The host of the command running now (or last): what the CLI shows of it, as it happens.
        self.current_host: ProviderHost | None = None

    def host(self, config: Mapping[str, str], secret_keys: list[str] | tuple[str, ...]) -> ProviderHost:
        self.current_host = ProviderHost(config, secret_keys, environment=self.environment)
        return self.current_host

    def _record(self, step: Step) -> Step:
        self.steps.append(step)
        return step

    def _plan(self, host: ProviderHost, registered: struct_pb2.Struct) -> tuple[struct_pb2.Struct, Step]:
        if self.state is None:
            checked = host.check(self.urn, struct_pb2.Struct(), registered).inputs
            return checked, Step("create")
        checked = host.check(self.urn, self.state.inputs, registered).inputs
        diff = host.diff(self.urn, self.state.id, self.state.outputs, checked, self.state.inputs)
        if diff.changes == provider_pb2.DiffResponse.DIFF_NONE:
            return checked, Step("same")
        if diff.changes == provider_pb2.DiffResponse.DIFF_UNKNOWN:
            # The engine then compares old and new inputs itself (step_generator.go diff()).
            same = plain(self.state.inputs) == plain(checked)
            return checked, Step("same" if same else "update")
        if diff.replaces:
            return checked, Step("replace", tuple(diff.replaces), bool(diff.deleteBeforeReplace))
        return checked, Step("update")

    def preview(
        self, registered: struct_pb2.Struct, config: Mapping[str, str], secret_keys: list[str] | tuple[str, ...]
    ) -> Step:
        with self.host(config, secret_keys) as host:
            return self._plan(host, registered)[1]

    def up(
        self, registered: struct_pb2.Struct, config: Mapping[str, str], secret_keys: list[str] | tuple[str, ...]
    ) -> Step:
        with self.host(config, secret_keys) as host:
            checked, step = self._plan(host, registered)
            old = self.state
            if step.op == "create":
                created = host.create(self.urn, checked, self.timeout_s)
                self.state = ResourceState(created.id, checked, created.properties)
            elif step.op == "update":
                assert old is not None
                updated = host.update(self.urn, old.id, old.outputs, checked, old.inputs, self.timeout_s)
                self.state = ResourceState(old.id, checked, updated.properties)
            elif step.op == "replace":
                assert old is not None
                if step.delete_before_replace:
                    host.delete(self.urn, old.id, old.outputs, old.inputs, self.timeout_s)
                    self.state = None
                created = host.create(self.urn, checked, self.timeout_s)
                self.state = ResourceState(created.id, checked, created.properties)
                if not step.delete_before_replace:
                    host.delete(self.urn, old.id, old.outputs, old.inputs, self.timeout_s)
            self.provider_config = (dict(config), tuple(secret_keys))
            return self._record(step)

    def _recorded(self) -> tuple[Mapping[str, str], list[str] | tuple[str, ...]]:
        """The config the provider of a command that does not run the program is configured with."""
        assert self.provider_config is not None, "no `up` recorded a provider configuration"
        return self.provider_config

    def refresh(self) -> Step:
        assert self.state is not None, "nothing to refresh"
        config, secret_keys = self._recorded()
        with self.host(config, secret_keys) as host:
            read = host.read(self.urn, self.state.id, self.state.outputs, self.state.inputs)
        if not read.id:
            self.state = None
            return self._record(Step("gone"))
        inputs = read.inputs if read.HasField("inputs") and read.inputs.fields else self.state.inputs
        self.state = ResourceState(read.id, inputs, read.properties)
        return self._record(Step("refresh"))

    def destroy(self) -> Step:
        assert self.state is not None, "nothing to destroy"
        config, secret_keys = self._recorded()
        with self.host(config, secret_keys) as host:
            host.delete(self.urn, self.state.id, self.state.outputs, self.state.inputs, self.timeout_s)
        self.state = None
        return self._record(Step("delete"))


def proxy_free_environment() -> dict[str, str]:
    """This process's environment without proxies: the host must reach 127.0.0.1 directly."""
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    env["no_proxy"] = env["NO_PROXY"] = "127.0.0.1,localhost"
    return env


__all__ = [
    "EngineResource",
    "ProviderError",
    "ProviderHost",
    "ResourceState",
    "Step",
    "from_struct",
    "plain",
    "proxy_free_environment",
    "to_struct",
]
