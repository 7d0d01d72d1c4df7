"""The golden template's dynamic provider through Pulumi's own dynamic-provider host, against vcsim.

Nothing here calls the provider's Python methods. Each test runs the real program under the mock
engine (components/tools/offline.py) to get the inputs it registers, then plays the engine
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
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from pyVmomi import vim, vmodl

from components import vsphere as vs
from components.template import TemplateBuildProvider
from components.tools.offline import REPO_ROOT, OfflineRun, run_program
from tests.labs import namespace
from tests.provider_host import EngineResource, ProviderError, Step, from_struct, proxy_free_environment, to_struct
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
    pools: list[str] = field(default_factory=list)  # resource pool of each builder (a template has none)
    # What the CLI had shown when the installer finished: read through `watch` at each power-off.
    watch: Callable[[], list[str]] | None = None
    shown_while_installing: list[list[str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Installer:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Before vcsim stops: a call in flight would fail against a closed simulator."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

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
                        self.pools.append(machine.resourcePool.name)
                        self.isos += [
                            d.backing.fileName
                            for d in machine.config.hardware.device
                            if isinstance(d, vim.vm.device.VirtualCdrom)
                            and isinstance(d.backing, vim.vm.device.VirtualCdrom.IsoBackingInfo)
                        ]
                        time.sleep(0.3)
                        if self.watch is not None:
                            self.shown_while_installing.append(self.watch())
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


def program(
    sim: Vcsim,
    iso: Netinst,
    *,
    stack: str = "labs",
    vsphere: dict[str, Any] | None = None,
    template: dict[str, Any] | None = None,
    password: str | None = None,
) -> OfflineRun:
    """The real program, as stack `stack` made from Pulumi.labs.yaml, pointed at `sim`.

    Only what must differ from the committed stack is overridden: vCenter address and login, the
    placement names vcsim has, and the ISO URL. `labs-k8s:vsphere.resourcePool` stays unset, as
    in Pulumi.labs.yaml.
    """
    committed = namespace()
    placement = {
        "datacenter": sim.datacenter,
        "computeCluster": sim.cluster,
        "datastore": sim.datastore,
        "network": sim.network,
        "folder": FOLDER,
        **(vsphere or {}),
    }
    overrides = {
        "vsphere:vsphereServer": sim.server,
        "vsphere:user": sim.user,
        "vsphere:password": password or sim.password,
        "vsphere:allowUnverifiedSsl": "true",
        "labs-k8s:vsphere": placement,
        "labs-k8s:template": {**committed["template"], "isoUrl": iso.url, "isoSha256": iso.sha256, **(template or {})},
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


def make_pool(si: vim.ServiceInstance, sim: Vcsim, name: str) -> vim.ResourcePool:
    dc = vs.find_datacenter(si, sim.datacenter)
    root = vs.find_cluster(si, dc, sim.cluster).resourcePool
    allocation = vim.ResourceAllocationInfo(
        reservation=0, expandableReservation=True, limit=-1, shares=vim.SharesInfo(level="normal")
    )
    return root.CreateResourcePool(name, vim.ResourceConfigSpec(cpuAllocation=allocation, memoryAllocation=allocation))


# ---------------------------------------------------------------------------- lifecycle


def test_lifecycle_through_the_dynamic_provider_host(lab_vcsim, netinst, host_env, installer):
    """First up, a re-run with no change, an in-place update, a replacement, refresh and destroy."""
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
        assert outs["guestId"] == template.config.guestId == "debian12_64Guest"
        assert not {"server", "user", "password"} & set(outs), "the vCenter login is not kept in the state"
        assert vs.verify_template_hardware(template) == []
        assert vs.vm_stack(template) == "labs"
        # The ISO went to a stack-scoped path, and is gone once the template exists.
        assert built.isos == [f"[{sim.datastore}] labs-k8s-iso/labs/{registered['name']}.iso"]
        assert not (datastore_dir(si, sim) / "labs-k8s-iso" / "labs" / f"{registered['name']}.iso").exists()
        # So is the stack's directory, empty now (issue 23: it was left behind).
        assert not (datastore_dir(si, sim) / "labs-k8s-iso" / "labs").exists()
        # And the shared parent, once no stack has a directory in it (#29: the real engine's
        # destroy left an empty labs-k8s-iso/ behind).
        assert not (datastore_dir(si, sim) / "labs-k8s-iso").exists()
    finally:
        vs.disconnect(si)
    assert len(built.builds) == 1

    # 2. A second `up` with no change: Diff says nothing changes, in the preview and in the up.
    again = program(sim, netinst)
    assert engine.preview(again.by_name(TEMPLATE).wire_inputs, again.config, again.secret_keys).op == "same"
    assert up(engine, again).op == "same"
    assert len(built.builds) == 1

    # 3. A change that updates in place: the build VM's size only matters to the next build.
    bigger = program(sim, netinst, template={"vcpu": 4})
    old_id = engine.state.id
    assert up(engine, bigger) == Step("update")
    assert engine.state.id == old_id and engine.state.plain_outputs["vcpu"] == 4
    assert len(built.builds) == 1

    # 4. A change that replaces: another folder and resource pool make another template.
    si = connect(sim)
    try:
        vs.find_datacenter(si, sim.datacenter).vmFolder.CreateFolder("labs-k8s-b")
        make_pool(si, sim, "k8s")
    finally:
        vs.disconnect(si)
    moved = program(sim, netinst, template={"vcpu": 4}, vsphere={"folder": "labs-k8s-b", "resourcePool": "k8s"})
    step = up(engine, moved)
    assert step.op == "replace" and {"folder", "resourcePool"} <= set(step.replaces)
    assert not step.delete_before_replace, "the lab keeps a template while the new one is built"
    new_name = from_struct(moved.by_name(TEMPLATE).wire_inputs)["name"]
    assert new_name != registered["name"], "placement is part of the template's identity"
    si = connect(sim)
    try:
        assert vs.find_vm_by_uuid(si, old_id) is None, "the old template is deleted after the new one exists"
        new = vs.find_vm_by_uuid(si, engine.state.id)
        assert new is not None and new.name == new_name and new.config.template
        assert vs.inventory_path(si, new) == f"{sim.datacenter}/vm/labs-k8s-b/{new_name}"
    finally:
        vs.disconnect(si)
    assert len(built.builds) == 2
    assert built.pools == ["Resources", "k8s"], "built in the cluster's root pool, then in the configured one"

    # 5. Refresh reads it back unchanged.
    before = engine.state.plain_outputs
    assert engine.refresh().op == "refresh"
    assert engine.state.plain_outputs == before

    # 6. Destroy: nothing of the stack's template is left (template, builder VM, ISO).
    assert engine.destroy().op == "delete"
    si = connect(sim)
    try:
        assert vms_named(si, "labs-k8s-debian12") == {}
        assert not (datastore_dir(si, sim) / "labs-k8s-iso" / "labs").exists()
    finally:
        vs.disconnect(si)


def test_the_first_up_shows_each_build_phase_as_it_happens(lab_vcsim, netinst, host_env, installer):
    """The 15-30 minute build showed only the engine's spinner (issue 33). Each phase is now an
    info line on the host's stderr, which the engine shows as it reads it: the download with its
    size and rate, the remaster, the upload, the install with the builder VM's name and where to
    watch it, the seal, the verification. Checked while the installer still runs, and after."""
    sim = lab_vcsim
    run = program(sim, netinst)
    name = from_struct(run.by_name(TEMPLATE).wire_inputs)["name"]
    engine = engine_for(run, host_env)
    built = installer(sim)
    built.watch = lambda: engine.current_host.diagnostics() if engine.current_host else []
    assert up(engine, run).op == "create"
    assert engine.current_host is not None
    shown = engine.current_host.shown
    prefix = f"info: golden template {name}: "
    phases = [line.removeprefix(prefix) for line in shown if line.startswith(prefix)]
    expected = [
        r"downloading http://127\.0\.0\.1:\d+/debian-12\.12\.0-amd64-netinst\.iso \(\d+ MiB\) into .*",
        r"downloaded .*: \d+ MiB in \d+ s, [\d.]+ MiB/s, SHA-256 checked",
        r"remastering the installer ISO with xorriso: .*",
        r"remastered .* in \d+ s",
        r"uploading labs-k8s-debian12-\w+\.iso \(\d+ MiB\) to"
        rf" \[{sim.datastore}\] labs-k8s-iso/labs/{name}\.iso",
        r"uploaded: \d+ MiB in \d+ s, [\d.]+ MiB/s",
        rf"creating the builder VM {name} .*",
        rf"the unattended Debian install is running on the builder VM {name} "
        rf"\({sim.datacenter}/vm/{FOLDER}/{name}\); watch it in the vSphere Client: .*Launch Web Console.*",
        r"installed and sealed in [\d.]+ min \(the seal script ran, the VM powered off\).*",
        r"verifying the hardware .*",
        r"verified and marked as a template",
    ]
    assert len(phases) == len(expected), "\n".join(shown)
    for line, pattern in zip(phases, expected, strict=True):
        assert re.fullmatch(pattern, line), f"{line!r} !~ {pattern!r}"
    # As it happens: while the builder still ran, the CLI already showed the install line, not the seal.
    (while_installing,) = built.shown_while_installing
    assert any("the unattended Debian install is running" in line for line in while_installing)
    assert not any("installed and sealed" in line for line in while_installing)
    assert not any(sim.password in line for line in shown)

    # A second build from the machine's cache says so instead of downloading again.
    si = connect(sim)
    try:
        vs.destroy_vm(vs.find_vm_by_uuid(si, engine.state.id))
    finally:
        vs.disconnect(si)
    assert engine.refresh().op == "gone"
    assert up(engine, run).op == "create"
    again = engine.current_host.shown
    assert any(line.startswith(f"{prefix}the Debian ISO is already in ") for line in again), "\n".join(again)
    assert not any(line.startswith(f"{prefix}downloading") for line in again)


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
    assert engine.refresh().op == "gone"
    assert engine.state is None


def test_two_stacks_never_touch_each_others_template(lab_vcsim, netinst, host_env, installer):
    """Same config, same vCenter, two stacks: two templates, two ISO directories, and neither
    stack's destroy touches the other's template, even from a state that points at it."""
    sim = lab_vcsim
    built = installer(sim)
    runs = {stack: program(sim, netinst, stack=stack) for stack in ("labs", "other")}
    names = {stack: from_struct(run.by_name(TEMPLATE).wire_inputs)["name"] for stack, run in runs.items()}
    assert names["labs"] != names["other"]
    engines = {stack: engine_for(run, host_env) for stack, run in runs.items()}
    # A third stack's upload under way: its directory, and so the shared parent, must stay.
    si = connect(sim)
    try:
        uploading = datastore_dir(si, sim) / "labs-k8s-iso" / "third" / "uploading.iso"
    finally:
        vs.disconnect(si)
    uploading.parent.mkdir(parents=True)
    uploading.write_bytes(b"partial")
    for stack in ("labs", "other"):
        assert up(engines[stack], runs[stack]).op == "create"
    assert uploading.read_bytes() == b"partial", "another stack's ISO directory was touched"
    assert len(built.builds) == 2, "neither adopted the other's template"
    assert sorted(built.isos) == sorted(
        f"[{sim.datastore}] labs-k8s-iso/{stack}/{names[stack]}.iso" for stack in ("labs", "other")
    )
    labs_state, other_state = engines["labs"].state, engines["other"].state
    assert labs_state is not None and other_state is not None and labs_state.id != other_state.id
    si = connect(sim)
    try:
        for stack, engine in engines.items():
            assert engine.state is not None
            assert vs.vm_stack(vs.find_vm_by_uuid(si, engine.state.id)) == stack
    finally:
        vs.disconnect(si)

    # A state of `other` that points at labs' template (what the old adoption by name left behind):
    # destroying it leaves labs' template alone.
    confused = engine_for(runs["other"], host_env)
    confused.state = replace(other_state, id=labs_state.id)
    confused.provider_config = engines["other"].provider_config  # recorded by other's `up`
    confused.destroy()

    assert engines["other"].destroy().op == "delete"
    assert engines["labs"].refresh().op == "refresh"
    si = connect(sim)
    try:
        assert set(vms_named(si, "labs-k8s-debian12")) == {names["labs"]}
    finally:
        vs.disconnect(si)


@pytest.mark.parametrize("owner", ["other", None], ids=["another-stack", "untagged"])
def test_a_vm_with_our_name_that_is_not_ours_is_never_adopted_or_deleted(
    lab_vcsim, netinst, host_env, installer, owner
):
    sim = lab_vcsim
    built = installer(sim)
    run = program(sim, netinst)
    name = from_struct(run.by_name(TEMPLATE).wire_inputs)["name"]
    si = connect(sim)
    try:
        dc = vs.find_datacenter(si, sim.datacenter)
        pool = vs.find_cluster(si, dc, sim.cluster).resourcePool
        folder = vs.find_vm_folder(si, dc, FOLDER)
        extra = vs.stack_tag(owner) if owner else {}
        spec = vim.vm.ConfigSpec(
            name=name,
            guestId="otherGuest64",
            numCPUs=1,
            memoryMB=64,
            files=vim.vm.FileInfo(vmPathName=f"[{sim.datastore}]"),
            extraConfig=[vim.option.OptionValue(key=k, value=v) for k, v in extra.items()],
        )
        foreign = vs.wait_for_task(folder.CreateVM_Task(config=spec, pool=pool), "create a foreign VM")
        foreign.MarkAsTemplate()  # even a finished template is not adopted
        uuid = foreign.config.uuid
    finally:
        vs.disconnect(si)
    engine = engine_for(run, host_env)
    with pytest.raises(ProviderError) as refused:
        up(engine, run)
    whose = "stack 'other'" if owner else "no labs-k8s stack (it has no stack tag)"
    assert f"VM named {name!r} ({sim.datacenter}/vm/{FOLDER}/{name}) that belongs to {whose}" in refused.value.details
    assert "never adopts, rebuilds over or deletes" in refused.value.details
    assert engine.state is None and built.builds == []
    si = connect(sim)
    try:
        assert vs.find_vm_by_uuid(si, uuid) is not None, "the foreign VM is untouched"
    finally:
        vs.disconnect(si)


def test_a_failed_install_keeps_the_builder_for_inspection_and_the_next_up_cleans_it(
    lab_vcsim, netinst, host_env, installer
):
    """The installer hangs (a question the preseed does not answer): the build times out, the
    builder VM stays, powered off, and the error names it; the next `up` deletes it and builds."""
    sim = lab_vcsim
    built = installer(sim)
    built.stuck = True
    run = program(sim, netinst, template={"buildTimeoutMinutes": 1})
    name = from_struct(run.by_name(TEMPLATE).wire_inputs)["name"]
    engine = engine_for(run, host_env)
    with pytest.raises(ProviderError) as failed:
        up(engine, run)
    message = failed.value.details
    assert "the unattended install did not finish" in message
    assert f"The builder VM {sim.datacenter}/vm/{FOLDER}/{name} is kept, powered off, for inspection" in message
    assert "The next `pulumi up` deletes it and builds the template again" in message
    assert engine.state is None
    si = connect(sim)
    try:
        kept = vs.find_vm(si, name)
        assert kept is not None and not kept.config.template
        assert vs.power_state(kept) == "poweredOff"
        assert vs.vm_stack(kept) == "labs"
        kept_moid = kept._moId
    finally:
        vs.disconnect(si)

    built.stuck = False
    assert up(engine, run).op == "create"
    assert engine.state is not None
    si = connect(sim)
    try:
        # vcsim derives the BIOS UUID from the name, so the managed object id tells the VMs apart.
        template = vs.find_vm(si, name)  # one VM of that name, or an AmbiguousError
        assert template is not None and template.config.template and template._moId != kept_moid
        assert template.config.uuid == engine.state.id
    finally:
        vs.disconnect(si)


def rotate_password(sim: Vcsim, new_password: str) -> Vcsim:
    """vcsim with its login changed to `new_password`, once the old one is seen refused."""
    rotated = sim.rotate_password(new_password)
    try:
        vs.disconnect(connect(sim))  # the old password
    except vs.VSphereError:
        return rotated
    raise AssertionError(
        "vcsim still accepts the old password: its login no longer reads "
        "LABS_K8S_VCSIM_PASSWORD_FILE (tests/tools/vcsim/main.go)"
    )


def test_a_rotated_vcenter_password_is_no_change_and_one_up_hands_it_to_refresh_and_destroy(
    lab_vcsim, netinst, host_env, installer
):
    """vcsim starts with one password, then accepts only another. The provider logs in with the
    config it was configured with, at every call: an `up` or a preview (they run the program, so
    the engine configures the provider with the stack config now) changes nothing. `refresh` and
    `destroy` do not run the program: every CLI configures them with the inputs recorded at the
    last `up` (providers/registry.go Registry.Same; pulumi/pulumi#18740 was reverted by #18756),
    the old password among them. They fail naming the rejected login until one `up` has recorded
    the new one: what `make destroy` checks (components/tools/first_run.py) and docs/runbook.md says."""
    sim = lab_vcsim
    built = installer(sim)
    run = program(sim, netinst)
    engine = engine_for(run, host_env)
    assert up(engine, run).op == "create"
    assert engine.state is not None
    first_id = engine.state.id

    rotated = rotate_password(sim, "rotated-secret-2")
    after = program(rotated, netinst)  # the stack config now carries the new password
    with pytest.raises(ProviderError) as stale:
        engine.refresh()
    assert f"rejected the login for user '{sim.user}'" in stale.value.details
    assert engine.state is not None and engine.state.id == first_id, "a failed refresh changes nothing"
    assert engine.preview(after.by_name(TEMPLATE).wire_inputs, after.config, after.secret_keys).op == "same"
    assert up(engine, after).op == "same"  # the `make up` the runbook asks for
    assert engine.refresh().op == "refresh"
    assert engine.state is not None and engine.state.id == first_id
    assert len(built.builds) == 1

    # Rotated again: destroy, too, needs that `up` first.
    again = sim.rotate_password("rotated-secret-3")
    last = program(again, netinst)
    with pytest.raises(ProviderError) as stale:
        engine.destroy()
    assert f"rejected the login for user '{sim.user}'" in stale.value.details
    assert up(engine, last).op == "same"
    assert engine.destroy().op == "delete"
    si = connect(again)
    try:
        assert vms_named(si, "labs-k8s-debian12") == {}
    finally:
        vs.disconnect(si)
    assert len(built.builds) == 1


def test_the_login_comes_from_the_environment_when_the_config_has_none(lab_vcsim, netinst, host_env, installer):
    """A CLI older than 3.139 configures dynamic providers without the stack config: the provider
    then reads VSPHERE_* (the engine passes its environment on), or says exactly what is missing."""
    sim = lab_vcsim
    installer(sim)
    run = program(sim, netinst)
    bare = {key: value for key, value in run.config.items() if not key.startswith("vsphere:")}
    registered = run.by_name(TEMPLATE).wire_inputs
    no_login = EngineResource(run.by_name(TEMPLATE).urn, environment=host_env)
    with pytest.raises(ProviderError) as missing:
        no_login.up(registered, bare, [])
    assert "no vCenter login for the golden template: set vsphere:vsphereServer" in missing.value.details
    assert "VSPHERE_PASSWORD" in missing.value.details
    login_env = {
        **host_env,
        "VSPHERE_SERVER": sim.server,
        "VSPHERE_USER": sim.user,
        "VSPHERE_PASSWORD": sim.password,
        "VSPHERE_ALLOW_UNVERIFIED_SSL": "true",
    }
    from_env = EngineResource(run.by_name(TEMPLATE).urn, environment=login_env)
    assert from_env.up(registered, bare, []).op == "create"


def test_an_older_state_is_brought_up_to_date_in_place(lab_vcsim, netinst, host_env, installer):
    """States written before the template reported its guest id, and while the vCenter login was
    one of its inputs: the next `up` fills the guest id in and drops the login, in place."""
    sim = lab_vcsim
    built = installer(sim)
    run = program(sim, netinst)
    engine = engine_for(run, host_env)
    up(engine, run)
    assert engine.state is not None
    old = {k: v for k, v in from_struct(engine.state.outputs).items() if k != "guestId"}
    old.update(server=sim.server, user=sim.user, password="a-password-from-long-ago")
    engine.state = replace(engine.state, outputs=to_struct(old))
    assert up(engine, run) == Step("update")
    outputs = engine.state.plain_outputs
    assert outputs["guestId"] == "debian12_64Guest"
    assert not {"server", "user", "password"} & set(outputs)
    assert len(built.builds) == 1


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
    result = subprocess.run(
        [sys.executable, "-c", code],
        input=first,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["components.template", "['name']"]
