"""The golden template's dynamic provider through Pulumi's own dynamic-provider host, against vcsim.

Nothing here calls the provider's Python methods. Each test runs the real program under the mock
engine (components/offline.py) to get the inputs it registers, then plays the engine
(tests/provider_host.py): `python -m pulumi.dynamic` started from the repository with the .venv
interpreter, Configure with the stack config, and Check/Diff/Create/Update/Read/Delete over gRPC
with the pickled provider in `__provider`, exactly as the SDK serialized it.

vcsim runs no guest, so the installer's last step (power-off once the seal script has run) is
played by a thread that powers each running builder VM off. The ISO is a small stand-in
netinst (tests/standin_iso.py) served over loopback HTTP: the provider host really downloads,
checks and remasters it, and uploads the result to vcsim's datastore.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pyVmomi import vim, vmodl

from components import vsphere as vs
from components.offline import REPO_ROOT, OfflineRun, run_program
from components.template import TemplateBuildProvider
from tests.labs import namespace
from tests.provider_host import EngineResource, Step, from_struct, proxy_free_environment
from tests.standin_iso import build_standin_netinst, serve_directory
from tests.vcsim import Vcsim

FOLDER = "labs-k8s"
TEMPLATE = "golden-template"


# ---------------------------------------------------------------------------- fixtures


@dataclass(frozen=True)
class Netinst:
    url: str
    sha256: str


@pytest.fixture(scope="module")
def netinst(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Netinst]:
    """The stand-in netinst ISO on a loopback HTTP server, as labs-k8s:template.isoUrl points to."""
    served = tmp_path_factory.mktemp("served")
    iso = build_standin_netinst(tmp_path_factory.mktemp("standin"))
    (served / "debian-12.12.0-amd64-netinst.iso").write_bytes(iso.read_bytes())
    with serve_directory(served) as url:
        yield Netinst(f"{url}/debian-12.12.0-amd64-netinst.iso", hashlib.sha256(iso.read_bytes()).hexdigest())


@pytest.fixture
def host_env(tmp_path: Path) -> dict[str, str]:
    """The provider host's environment: this one's (as the engine passes it), its own ISO cache."""
    return {**proxy_free_environment(), "LABS_K8S_CACHE": str(tmp_path / "cache")}


def connect(sim: Vcsim) -> vim.ServiceInstance:
    return vs.connect(sim.host, sim.user, sim.password, port=sim.port, insecure=True)


@pytest.fixture
def lab_vcsim(vcsim_factory: Callable[..., Vcsim]) -> Iterator[Vcsim]:
    """A 3-host vcsim with the lab's VM folder."""
    sim = vcsim_factory(hosts=3)
    si = connect(sim)
    try:
        vs.find_datacenter(si, sim.datacenter).vmFolder.CreateFolder(FOLDER)
    finally:
        vs.disconnect(si)
    yield sim


@dataclass
class Installer:
    """Plays the Debian installer's last step: powers each running builder VM off.

    `stuck = True` plays an installer waiting at a question: nothing is powered off.
    """

    sim: Vcsim
    stuck: bool = False
    isos: list[str] = field(default_factory=list)
    builds: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Installer:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        si = connect(self.sim)
        try:
            while not self._stop.wait(0.2):
                if self.stuck:
                    continue
                for machine, _ in vs.collect_properties(si, si.content.rootFolder, vim.VirtualMachine, ["name"]):
                    try:
                        if machine.config.template or vs.power_state(machine) != "poweredOn":
                            continue
                        self.builds.append(machine.name)
                        self.isos += [
                            d.backing.fileName for d in machine.config.hardware.device
                            if isinstance(d, vim.vm.device.VirtualCdrom)
                            and isinstance(d.backing, vim.vm.device.VirtualCdrom.IsoBackingInfo)
                        ]
                        time.sleep(0.3)
                        vs.power_off(machine)
                    except vmodl.fault.ManagedObjectNotFound:
                        continue  # deleted while we looked
        finally:
            vs.disconnect(si)


@pytest.fixture
def installer() -> Iterator[Callable[[Vcsim], Installer]]:
    started: list[Installer] = []

    def start(sim: Vcsim) -> Installer:
        started.append(Installer(sim).start())
        return started[-1]

    yield start
    for one in started:
        one.stop()


def program(sim: Vcsim, iso: Netinst, *, stack: str = "labs", vsphere: dict[str, Any] | None = None,
            template: dict[str, Any] | None = None, password: str | None = None) -> OfflineRun:
    """The real program, as stack `stack` made from Pulumi.labs.yaml, pointed at `sim`.

    Only what must differ from the committed stack is overridden: vCenter address and login, the
    placement names vcsim has, and the ISO URL. `labs-k8s:vsphere.resourcePool` stays unset, as
    in Pulumi.labs.yaml.
    """
    committed = namespace()
    placement = {"datacenter": sim.datacenter, "computeCluster": sim.cluster, "datastore": sim.datastore,
                 "network": sim.network, "folder": FOLDER, **(vsphere or {})}
    overrides = {
        "vsphere:vsphereServer": sim.server,
        "vsphere:user": sim.user,
        "vsphere:password": password or sim.password,
        "vsphere:allowUnverifiedSsl": "true",
        "labs-k8s:vsphere": placement,
        "labs-k8s:template": {**committed["template"], "isoUrl": iso.url, "isoSha256": iso.sha256,
                              **(template or {})},
    }
    return run_program(stack, overrides=overrides, stack_file="labs")


def up(engine: EngineResource, run: OfflineRun) -> Step:
    return engine.up(run.by_name(TEMPLATE).wire_inputs, run.config, run.secret_keys)


def engine_for(run: OfflineRun, host_env: dict[str, str]) -> EngineResource:
    return EngineResource(run.by_name(TEMPLATE).urn, environment=host_env)


def vms_named(si: vim.ServiceInstance, prefix: str) -> dict[str, vim.VirtualMachine]:
    rows = vs.collect_properties(si, si.content.rootFolder, vim.VirtualMachine, ["name"])
    return {props["name"]: vm for vm, props in rows if str(props.get("name", "")).startswith(prefix)}


def datastore_dir(si: vim.ServiceInstance, sim: Vcsim) -> Path:
    """vcsim keeps each datastore in a local directory."""
    dc = vs.find_datacenter(si, sim.datacenter)
    return Path(vs.find_datastore(si, dc, sim.datastore).info.url)


# ---------------------------------------------------------------------------- lifecycle


def test_lifecycle_through_the_dynamic_provider_host(lab_vcsim, netinst, host_env, installer):
    """First up, a re-run with no change, refresh and destroy, as the engine drives them."""
    sim = lab_vcsim
    built = installer(sim)
    first = program(sim, netinst)
    registered = from_struct(first.by_name(TEMPLATE).wire_inputs)
    assert "resourcePool" not in registered, "the SDK drops the unset resource pool (serialize_properties)"
    engine = engine_for(first, host_env)

    # 1. First `up`: downloaded, remastered, uploaded, installed, sealed, converted, verified.
    assert up(engine, first).op == "create"
    assert engine.state is not None
    outs = engine.state.plain_outputs
    si = connect(sim)
    try:
        template = vs.find_vm_by_uuid(si, engine.state.id)
        assert template is not None and template.name == registered["name"] and template.config.template
        assert outs["uuid"] == engine.state.id and outs["moid"] == template._moId
        assert vs.verify_template_hardware(template) == []
        assert vs.vm_stack(template) == "labs"
    finally:
        vs.disconnect(si)
    assert len(built.builds) == 1

    # 2. A second `up` with no change: Diff says nothing changes, in the preview and in the up.
    again = program(sim, netinst)
    assert engine.preview(again.by_name(TEMPLATE).wire_inputs, again.config, again.secret_keys).op == "same"
    assert up(engine, again).op == "same"
    assert len(built.builds) == 1

    # 3. Refresh reads it back unchanged.
    before = engine.state.plain_outputs
    assert engine.refresh(again.config, again.secret_keys).op == "refresh"
    assert engine.state.plain_outputs == before

    # 4. Destroy: the template is gone.
    assert engine.destroy(again.config, again.secret_keys).op == "delete"
    si = connect(sim)
    try:
        assert vms_named(si, "labs-k8s-debian12") == {}
    finally:
        vs.disconnect(si)


def test_an_up_that_lost_its_state_adopts_our_template(lab_vcsim, netinst, host_env, installer):
    """An `up` interrupted after the build but before the engine saved the state: the next `up`
    creates again and takes the finished template (ours: it carries this stack's tag)."""
    sim = lab_vcsim
    built = installer(sim)
    run = program(sim, netinst)
    first = engine_for(run, host_env)
    assert up(first, run).op == "create"
    lost = engine_for(run, host_env)  # the same stack, with no record of the template
    assert up(lost, run).op == "create"
    assert lost.state is not None and first.state is not None
    assert lost.state.id == first.state.id
    assert len(built.builds) == 1, "adopted, not built twice"


def test_refresh_forgets_a_template_deleted_in_vcenter(lab_vcsim, netinst, host_env, installer):
    sim = lab_vcsim
    installer(sim)
    run = program(sim, netinst)
    engine = engine_for(run, host_env)
    up(engine, run)
    assert engine.state is not None
    si = connect(sim)
    try:
        vs.destroy_vm(vs.find_vm_by_uuid(si, engine.state.id))
    finally:
        vs.disconnect(si)
    assert engine.refresh(run.config, run.secret_keys).op == "gone"
    assert engine.state is None


def test_provider_survives_the_dynamic_provider_host():
    """Pulumi pickles the provider (dill) into the state and unpickles it in another process:
    the bytes must be stable (else every run shows a diff) and load in a fresh interpreter."""
    from pulumi.dynamic.dynamic import serialize_provider

    first, second = serialize_provider(TemplateBuildProvider()), serialize_provider(TemplateBuildProvider())
    assert first == second
    code = (
        "import base64, sys, dill; p = dill.loads(base64.b64decode(sys.stdin.read())); "
        "print(type(p).__module__, p.diff('id', {'name': 'a'}, {'name': 'b'}).replaces)"
    )
    result = subprocess.run([sys.executable, "-c", code], input=first, cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["components.template", "['name']"]

