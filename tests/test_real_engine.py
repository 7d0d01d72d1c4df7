"""The real Pulumi CLI, the real Python language host and the real pulumi-vsphere, pulumi-command and
pulumi-random plugins (tests/tools/build_toolchain.sh and build_plugins.sh: the CLI from Go
modules, the plugins and the language host from ../shared/third_party) run this program.

What runs for real here: `make preview`, `make up`, `make destroy` and the CLI's own commands on a
user's copy of this checkout, set up the README's way (`file://` backend, passphrase secrets); the
CLI spawns the language host, which runs `__main__.py` in the project's .venv; the vSphere
provider clones, reconfigures and deletes VMs and DRS rules in vcsim; our dynamic providers build
the template through `pulumi-resource-pulumi-python`. All of it in a network namespace of its own
(tests/pulumi_engine.py), with vcsim and the ISO server on its loopback. The scenario here runs the
vSphere half by `make up LAYER=vsphere` (components/tools/targets.py: the `--target` list a user
gets too); the remote steps on SSH hosts run in the lab in a box (tests/test_lab_box.py).
docs/testing.md says which proofs run where.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from components.tools.targets import layer_targets
from tests.pulumi_engine import EngineLab, manifest, readme_setup, start_lab, stop_lab, toolchain_bin
from tests.requirements import require_root, require_tool, unavailable
from tests.standin_iso import build_standin_netinst
from tests.vcsim import vcsim_binary

pytestmark = pytest.mark.integration

ISO_NAME = "debian-12.12.0-amd64-netinst.iso"


@pytest.fixture(scope="module")
def iso(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    served = tmp_path_factory.mktemp("engine-iso")
    built = build_standin_netinst(tmp_path_factory.mktemp("engine-standin"))
    shutil.copy2(built, served / ISO_NAME)
    return served, hashlib.sha256((served / ISO_NAME).read_bytes()).hexdigest()


@pytest.fixture
def engine_lab(tmp_path: Path, iso: tuple[Path, str]) -> Iterator[Callable[..., EngineLab]]:
    require_root()
    require_tool("ip", "make", "jq", "ssh-keygen")
    labs: list[EngineLab] = []

    def start(stack: str = "mysite") -> EngineLab:
        lab = start_lab(tmp_path / f"lab{len(labs)}", vcsim_binary(), iso[0], stack=stack)
        labs.append(lab)
        return lab

    yield start
    for lab in labs:
        stop_lab(lab)


def secret_values(lab: EngineLab) -> list[str]:
    """Every secret this lab's stack holds, in clear: none may appear in state or output."""
    assert lab.password_file is not None
    key = (lab.root / "home" / ".ssh" / "labs-k8s").read_text()
    body = [line for line in key.splitlines() if line and not line.startswith("-----")]
    return [lab.password_file.read_text().strip(), *body]


def assert_no_clear_secret(lab: EngineLab, text: str, where: str) -> None:
    for value in secret_values(lab):
        assert value not in text, f"a secret of the stack is in clear in {where}"


def test_the_toolchain_is_what_the_manifest_says() -> None:
    """The CLI at the version its entry names; each plugin built from ../shared/third_party answers
    the version its entry names (the engine asks for exactly the versions the SDKs pin)."""
    bin_dir = toolchain_bin()
    entries = {entry["name"]: entry for entry in manifest()["binaries"]}
    reported = subprocess.run([str(bin_dir / "pulumi"), "version"], capture_output=True, text=True, check=True)
    assert reported.stdout.strip() == entries["pulumi"]["version"]
    for name in ("pulumi-language-python-exec", "pulumi-resource-pulumi-python", "pulumi-language-python"):
        assert (bin_dir / name).stat().st_mode & 0o111, f"{name} is not executable"
    plugins = json.loads((bin_dir.parent / "plugins.json").read_text())
    assert {p["name"] for p in plugins} == {"vsphere", "command", "random"}
    for plugin in plugins:
        entry = entries[f"pulumi-resource-{plugin['name']}"]
        assert plugin["version"] == entry["version"]
        assert plugin_info_version(plugin["path"]) == entry["version"], plugin
        # The SDK the program imports asks the engine for this very version.
        assert f"pulumi-{plugin['name']}=={entry['version']}" in REQUIREMENTS
    for entry in entries.values():
        assert entry["status"] in {"exact", "substitute"}, entry
        assert entry["why"] and entry.get("version"), entry
        for archive in entry.get("archives", []):
            assert len(archive["sha256"]) == 64 and len(archive["commit"]) == 40, archive


def plugin_info_version(binary: str) -> str:
    """The version the plugin answers to the engine's GetPluginInfo (what the engine compares with
    the version the SDK asked for): the plugin is started as the engine starts it, prints its port,
    and is asked over gRPC on loopback."""
    import grpc
    from google.protobuf import empty_pb2
    from pulumi.runtime.proto import provider_pb2_grpc

    proc = subprocess.Popen([binary], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        port = proc.stdout.readline().strip()
        assert port.isdigit(), f"{binary} printed {port!r}, not its port"
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            info = provider_pb2_grpc.ResourceProviderStub(channel).GetPluginInfo(empty_pb2.Empty(), timeout=30)
        return str(info.version).removeprefix("v")
    finally:
        proc.kill()
        proc.wait()


REQUIREMENTS = (Path(__file__).resolve().parents[1] / "requirements.in").read_text()


def test_an_altered_archive_is_refused_before_anything_is_extracted(tmp_path: Path) -> None:
    """build_plugins.sh checks each archive's sha256 against our pin and the snapshot's manifest."""
    from tests.pulumi_engine import REPO_ROOT

    require_tool("jq")
    spec = next(e for e in manifest()["binaries"] if e["name"] == "pulumi-resource-command")
    third_party = tmp_path / "third_party"
    third_party.mkdir()
    real = third_party_dir()
    shutil.copy2(real / "MANIFEST.json", third_party / "MANIFEST.json")
    for archive in spec["archives"]:
        shutil.copy2(real / archive["file"], third_party / archive["file"])
    altered = third_party / spec["archives"][0]["file"]
    altered.write_bytes(altered.read_bytes() + b"\0")
    cache = tmp_path / "cache-probe"
    run = subprocess.run(
        ["bash", str(REPO_ROOT / "tests" / "tools" / "build_plugins.sh"), "pulumi-resource-command"],
        env={**os.environ, "LABS_K8S_THIRD_PARTY": str(third_party), "LABS_K8S_PLUGIN_CACHE": str(cache)},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode != 0
    assert "refusing to build from an altered or unlisted archive" in run.stderr, run.stderr
    assert not list(cache.glob("*/src/*")), "something was extracted from the altered archive"
    assert not [p for p in cache.rglob("*") if p.is_file()], "something was extracted from the altered archive"


def third_party_dir() -> Path:
    """Where tests/kube_programs.py and build_plugins.sh find the snapshots; without them the test cannot run."""
    from tests import kube_programs

    try:
        return kube_programs.third_party()
    except kube_programs.BuildError as error:
        unavailable(str(error))
        raise AssertionError("unreachable") from error


def planned(lab: EngineLab, *args: str) -> list[dict[str, Any]]:
    """The steps of `pulumi preview --json`: what the real engine would do."""
    run = lab.run(
        "pulumi-preview-json", "pulumi", "preview", "--stack", lab.stack, "--json", "--non-interactive", *args
    )
    assert run.ok, lab.transcript()
    return list(json.loads(run.stdout).get("steps") or [])


def by_type(steps: list[dict[str, Any]], op: str | None = None) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for step in steps:
        if op is None or step["op"] == op:
            found.setdefault(step["urn"].split("::")[2].rsplit("$", 1)[-1], []).append(step["urn"].rsplit("::", 1)[-1])
    return found


VM = "vsphere:index/virtualMachine:VirtualMachine"
RULE = "vsphere:index/computeClusterVmAntiAffinityRule:ComputeClusterVmAntiAffinityRule"
TEMPLATE_RESOURCE = "pulumi-python:dynamic:Resource"
NODES = {
    "labs-k8s-lb01",
    "labs-k8s-lb02",
    "labs-k8s-m01",
    "labs-k8s-m02",
    "labs-k8s-m03",
    "labs-k8s-w01",
    "labs-k8s-w02",
}


def test_make_preview_of_a_new_stack_plans_the_whole_lab(engine_lab) -> None:
    """README steps 2, 3 and 5, then `make preview` as a user runs it. Found on the real engine:
    pulumi-command 1.2.1 answered a step's secret trigger, still unknown in a preview, as a secret
    without a value, and the CLI refused the whole preview (`triggers[0]: malformed secret:
    missing value`), so `pulumi up` failed in its own preview and created nothing."""
    lab = engine_lab()
    readme_setup(lab, iso_sha256=lab_iso_sha(lab), iso_name=ISO_NAME)
    made = lab.make("preview")
    assert made.ok, lab.transcript()
    assert "malformed secret" not in made.output and "panic" not in made.output, lab.transcript()
    assert_no_clear_secret(lab, made.output, "`make preview`'s output")
    creates = by_type(planned(lab), "create")
    assert set(creates.get(VM, [])) == NODES, creates
    assert len(creates.get(RULE, [])) == 3, creates
    assert creates.get("labs-k8s:template:GoldenTemplate") == ["template"], creates
    assert "command:remote:Command" in creates, "the remote steps are planned too"


def test_an_untrusted_vcenter_certificate_stops_make_preview_with_the_fix(engine_lab) -> None:
    """vcsim serves a certificate from the lab's own CA and the stack does not set
    vsphere:allowUnverifiedSsl. Without the lab's trust store (the CA not added the runbook's way),
    `make preview` is refused on vcsim's certificate by the preflight (pyvmomi), naming the fix, and
    with preflight off by the real vSphere provider; the other tests, with the store, pass:
    verification is on, and what makes them pass is the trust store."""
    lab = engine_lab()
    readme_setup(lab, iso_sha256=lab_iso_sha(lab), iso_name=ISO_NAME)
    system_bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    before = hashlib.sha256(system_bundle.read_bytes()).hexdigest()
    assert lab.trust_store is not None
    refused = lab.make("preview", trusted=False)
    assert not refused.ok, lab.transcript()
    assert "does not trust the CA that signed it" in refused.output, lab.transcript()
    assert "docs/runbook.md#trusting-the-vcenter-certificate" in refused.output, lab.transcript()
    import yaml

    settings = yaml.safe_load((lab.workspace / f"Pulumi.{lab.stack}.yaml").read_text())["config"]
    assert settings.get("vsphere:allowUnverifiedSsl") == "false", "verification is on (the example's value)"
    # The real vSphere provider (Go) verifies too: with preflight off, the first to reach vcsim is
    # its data source invoke (components/fleet.py get_datacenter), refused by Go's crypto/x509.
    lab.pulumi("config", "set", "--stack", lab.stack, "--path", "labs-k8s:preflight.enabled", "false")
    by_provider = lab.make("preview", trusted=False)
    assert not by_provider.ok, lab.transcript()
    assert "certificate signed by unknown authority" in by_provider.output, lab.transcript()
    # The lab's store held the CA all along, and the machine's store was never changed.
    assert (lab.root / "pki" / "vcenter-ca.crt").read_text().strip() in (
        lab.trust_store / "ca-certificates.crt"
    ).read_text()
    assert hashlib.sha256(system_bundle.read_bytes()).hexdigest() == before


def lab_iso_sha(lab: EngineLab) -> str:
    del lab
    return _ISO_SHA[0]


_ISO_SHA: list[str] = []


@pytest.fixture(autouse=True)
def _iso_sha(iso: tuple[Path, str]) -> None:
    _ISO_SHA[:] = [iso[1]]


def test_a_deployment_less_checkpoint_does_not_crash_the_cli(engine_lab) -> None:
    """The checkpoint diy's CreateStack saves first (an empty TypedDeployment: no `latest`), which
    a stack keeps when what follows never ran: the program's first invoke must not panic on it."""
    lab = engine_lab()
    readme_setup(lab, iso_sha256=lab_iso_sha(lab), iso_name=ISO_NAME)
    checkpoint = lab.root / "backend" / ".pulumi" / "stacks" / "labs-k8s" / f"{lab.stack}.json"
    assert checkpoint.is_file(), sorted(p.name for p in checkpoint.parent.iterdir())
    checkpoint.write_text(json.dumps({"version": 3, "checkpoint": {"stack": f"organization/labs-k8s/{lab.stack}"}}))
    # The CLI directly: make's checks read this very checkpoint first (components/tools/first_run.py).
    run = lab.engine("preview")
    assert "panic" not in run.output and "nil pointer" not in run.output, lab.transcript()
    assert run.ok, lab.transcript()


def test_a_checkpoint_torn_by_the_engines_save_is_read_again(engine_lab) -> None:
    """Seen on the real engine: a template-layer `up` of a new stack died in its first second with
    "failed to load checkpoint: EOF". The engine saves the checkpoint for the root stack's step while
    the program reads it, and gocloud's fileblob rewrites the `.attrs` sidecar in place
    (blob/fileblob/attrs.go setAttrs: os.Create, then encode), which every read decodes first. The
    race is too short to hit on demand, so the sidecar is held truncated from the engine's prelude
    (the snapshot is loaded; the language host is starting) until the program says it reads again."""
    lab = engine_lab()
    readme_setup(lab, iso_sha256=lab_iso_sha(lab), iso_name=ISO_NAME)
    attrs = lab.root / "backend" / ".pulumi" / "stacks" / "labs-k8s" / f"{lab.stack}.json.attrs"
    assert attrs.is_file(), "fileblob writes a sidecar beside each checkpoint"
    saved = attrs.read_bytes()
    events = lab.artifacts / f"{len(lab.results):02d}-events-preview.jsonl"
    seen: list[str] = []

    def tear_then_mend() -> None:
        deadline = time.monotonic() + 600
        for wanted in ('"preludeEvent"', "was saving the checkpoint"):
            while time.monotonic() < deadline and not (events.is_file() and wanted in events.read_text()):
                time.sleep(0.02)
            seen.append(wanted)
            attrs.write_bytes(b"" if wanted == '"preludeEvent"' else saved)
        attrs.write_bytes(saved)

    watcher = threading.Thread(target=tear_then_mend, daemon=True)
    watcher.start()
    # The CLI directly: the tear is timed on this preview's own event log, from its prelude on, and
    # make's checks read the checkpoint before it.
    run = lab.engine("preview", layers="template")
    watcher.join(timeout=30)
    assert "was saving the checkpoint" in events.read_text(), lab.transcript()
    assert run.ok, lab.transcript()


def vcsim_templates(lab: EngineLab) -> list[str]:
    """Names of the templates vcsim holds."""
    return [name for name, template in vcsim_machines(lab) if template]


def test_the_template_layer_on_the_real_engine(engine_lab) -> None:
    """The golden template through the real engine and our dynamic provider's real host: `up`, a
    preview with no change, no secret in clear in the state, a vCenter password rotated under it
    (refresh and destroy use the provider config the last `up` recorded: pulumi/pulumi#18740 was
    reverted by #18756), then `make destroy`."""
    lab = engine_lab()
    readme_setup(lab, iso_sha256=lab_iso_sha(lab), iso_name=ISO_NAME)

    first = lab.make("up", layer="template", args="--yes")
    assert first.engine_result()["ok"], lab.transcript()
    # The Lab component, the template layer's component and its dynamic resource; the stack itself
    # came with make up's check, the initial deployment of a self-managed backend's new stack
    # (components/tools/first_run.py initial_deployment).
    assert first.engine_result()["changes"] == {"create": 3}, lab.transcript()
    assert len(vcsim_templates(lab)) == 1
    assert_no_clear_secret(lab, first.output, "the CLI's output")
    # The build's phases reach the user as the CLI shows them (issue #33: the longest step was
    # silent): our provider's stderr lines, as info diagnostics (components/template.py
    # report_progress), in the order the build runs them.
    phases = [
        "creating the builder VM",
        "the unattended Debian install is running on the builder VM",
        "installed and sealed",
        "verifying the hardware",
        "verified and marked as a template",
    ]
    found = [
        re.search(rf"info: golden template labs-k8s-debian12\S*: {re.escape(phase)}", first.output) for phase in phases
    ]
    shown = [match.start() if match else -1 for match in found]
    assert -1 not in shown and shown == sorted(shown), (dict(zip(phases, shown, strict=True)), lab.transcript())

    again = lab.make("preview", layer="template", args="--expect-no-changes")
    assert again.engine_result()["ok"], f"a perpetual diff on the real engine:\n{lab.transcript()}"

    state = json.dumps(lab.stack_export())
    assert_no_clear_secret(lab, state, "`pulumi stack export`")
    # The dynamic provider's inputs carry the stack's secrets (the login it was configured with):
    # encrypted, as every secret in the state.
    assert '"4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270"' in state

    # A vCenter password rotation: vcsim takes only the new one, the stack config says it.
    assert lab.password_file is not None
    lab.password_file.write_text("rotated-vcenter-secret\n")
    lab.pulumi("config", "set", "--stack", lab.stack, "--secret", "vsphere:password", stdin="rotated-vcenter-secret\n")
    stale = lab.make("destroy")
    assert not stale.ok, f"destroy with the recorded (old) login cannot succeed:\n{lab.transcript()}"
    assert len(vcsim_templates(lab)) == 1, "a failed destroy removed the template"
    assert_no_clear_secret(lab, stale.output, "`make destroy`'s output")
    # What the runbook says to do: one `up` (or `pulumi refresh --run-program`) records the new
    # login; then destroy works.
    # `pulumi refresh --run-program` itself: make has no refresh target.
    recorded = lab.engine("refresh", layers="template")
    assert recorded.engine_result()["ok"], lab.transcript()
    destroyed = lab.make("destroy")
    assert destroyed.ok, lab.transcript()
    assert vcsim_templates(lab) == []
    assert_no_clear_secret(lab, json.dumps(lab.stack_export()), "`pulumi stack export` after destroy")


def vcsim_machines(lab: EngineLab) -> list[tuple[str, bool]]:
    """(name, is a template) of every VM vcsim holds."""
    assert lab.password_file is not None
    host, port = lab.vcsim.split(":")
    script = (
        "import json\nfrom pyVmomi import vim\nfrom components import vsphere as vs\n"
        f"password = open({str(lab.password_file)!r}).read().strip()\n"
        # Verified: lab.run trusts vcsim's CA as the program does (tests/pulumi_engine.py in_lab).
        f"si = vs.connect({host!r}, 'labs', password, port={port})\n"
        "print(json.dumps(sorted((m.name, bool(m.config.template)) for m, _ in"
        " vs.collect_properties(si, si.content.rootFolder, vim.VirtualMachine, ['name']))))\n"
    )
    listed = lab.run("vcsim-machines", "python", "-c", script)
    assert listed.ok, listed.output
    return [(name, template) for name, template in json.loads(listed.stdout)]


def test_an_up_whose_cli_is_killed_mid_build_converges_after_the_printed_fix(engine_lab) -> None:
    """SIGKILL the CLI while the template's builder VM runs. The next `up` is refused with the
    stack's lock and the command that clears it (the `file://` backend keeps the dead CLI's lock
    file); after `pulumi cancel`, `up` converges on one template (the provider adopts the builder
    the dead run left: no second one), warns of the interrupted create, and a preview then has
    no change."""
    import signal
    import time

    lab = engine_lab()
    readme_setup(lab, iso_sha256=lab_iso_sha(lab), iso_name=ISO_NAME)
    hold = lab.root / "installer-hold"  # the installer is still at work: the builder stays on
    hold.touch()
    log = lab.root / "killed-up.log"
    with log.open("w") as out:
        # The CLI itself, not make: the test kills that very process (make would be killed instead).
        targets = [f"--target={urn}" for urn in layer_targets(lab.stack, "template")]
        driver = subprocess.Popen(
            lab.in_lab(str(lab.bin_dir / "pulumi"), "up", "--stack", lab.stack, "--yes", "--skip-preview",
                       "--non-interactive", *targets),
            cwd=lab.workspace, env=lab.env(), stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 240
        while not [m for m in vcsim_machines(lab) if not m[1]]:
            assert time.monotonic() < deadline and driver.poll() is None, log.read_text()[-3000:]
            time.sleep(1)
        cli = subprocess.run(["pgrep", "-f", f"^{lab.bin_dir}/pulumi .*\\bup\\b"], capture_output=True, text=True)
        assert cli.stdout.split(), f"no running `pulumi up`:\n{log.read_text()[-3000:]}"
        for pid in cli.stdout.split():
            os.kill(int(pid), signal.SIGKILL)
        driver.wait(timeout=60)
    hold.unlink()

    # The CLI directly, as the killed run was: the lock is the CLI's to refuse (make's checks do not
    # take it), and what it prints is what this test reads.
    locked = lab.engine("up", layers="template")
    assert not locked.engine_result()["ok"]
    assert "the stack is currently locked" in locked.output and "pulumi cancel" in locked.output, lab.transcript()
    lab.pulumi("cancel", "--stack", lab.stack, "--yes")
    resumed = lab.engine("up", layers="template")
    assert resumed.engine_result()["ok"], lab.transcript()
    assert "pending operations from previous deployment" in resumed.output, lab.transcript()
    machines = vcsim_machines(lab)
    assert [template for _, template in machines] == [True], f"one template and nothing else: {machines}"
    again = lab.engine("preview", layers="template", expect_no_changes=True)
    assert again.engine_result()["ok"], lab.transcript()


def vcsim_inventory(lab: EngineLab) -> dict[str, Any]:
    """What vCenter holds, read back with pyVmomi: each clone's hardware and guestinfo keys, the DRS
    rules, and the datastore's top-level entries."""
    assert lab.password_file is not None
    host, port = lab.vcsim.split(":")
    script = f"""
import json
from pyVmomi import vim
from components import vsphere as vs
si = vs.connect({host!r}, "labs", open({str(lab.password_file)!r}).read().strip(), port={port})
machines = {{}}
def kind(obj):
    return type(obj).__name__.rsplit(".", 1)[-1]
for vm, _ in vs.collect_properties(si, si.content.rootFolder, vim.VirtualMachine, ["name"]):
    devices = vm.config.hardware.device
    machines[vm.name] = {{
        "template": bool(vm.config.template),
        "cpus": vm.config.hardware.numCPU,
        "memoryMiB": vm.config.hardware.memoryMB,
        "controllers": sorted(kind(d) for d in devices if isinstance(d, vim.vm.device.VirtualSCSIController)),
        "nics": [[kind(d), d.macAddress, d.addressType] for d in devices
                 if isinstance(d, vim.vm.device.VirtualEthernetCard)],
        "disks": [[d.capacityInKB // 1048576, bool(d.backing.eagerlyScrub), bool(d.backing.thinProvisioned)]
                  for d in devices if isinstance(d, vim.vm.device.VirtualDisk)],
        "guestinfo": sorted(o.key for o in vm.config.extraConfig if o.key.startswith("guestinfo.")),
        "power": str(vm.runtime.powerState),
    }}
rules = []
for cluster, _ in vs.collect_properties(si, si.content.rootFolder, vim.ClusterComputeResource, ["name"]):
    for rule in cluster.configurationEx.rule or []:
        rules.append([rule.name, kind(rule), sorted(vm.name for vm in rule.vm)])
datastore = {{}}
for ds, _ in vs.collect_properties(si, si.content.rootFolder, vim.Datastore, ["name"]):
    spec = vim.host.DatastoreBrowser.SearchSpec(matchPattern=["*"], query=[vim.host.DatastoreBrowser.FolderQuery()])
    task = ds.browser.SearchDatastore_Task(datastorePath=f"[{{ds.name}}]", searchSpec=spec)
    datastore[ds.name] = sorted(f.path for f in (vs.wait_for_task(task, "listing", 60).file or []))
print(json.dumps({{"machines": machines, "rules": sorted(rules), "datastore": datastore}}))
"""
    listed = lab.run("vcsim-inventory", "python", "-c", script)
    assert listed.ok, listed.output
    return json.loads(listed.stdout)


def assert_the_clones_are_what_the_plan_says(lab: EngineLab, inventory: dict[str, Any]) -> None:
    from components.rendering import node as node_rendering
    from components.tools.offline import lab_config_from_stack

    # The site's stack is the example's (README step 3) with placement keys: the same nodes.
    lab_config = lab_config_from_stack("labs")
    clones = {name: m for name, m in inventory["machines"].items() if not m["template"]}
    assert set(clones) == NODES, sorted(clones)
    for node in lab_config.all_nodes:
        vm = clones[node.name]
        assert vm["controllers"] == ["ParaVirtualSCSIController"], (node.name, vm)
        assert vm["nics"] == [["VirtualVmxnet3", node_rendering.node_mac(node), "manual"]], (node.name, vm)
        assert vm["disks"] and all(eager and not thin for _, eager, thin in vm["disks"]), (node.name, vm)
        assert vm["cpus"] == node.vcpu and vm["memoryMiB"] == node.memory_mib, (node.name, vm)
        assert {"guestinfo.metadata", "guestinfo.metadata.encoding", "guestinfo.userdata",
                "guestinfo.userdata.encoding"} <= set(vm["guestinfo"]), (node.name, vm)  # fmt: skip
        assert vm["power"] == "poweredOn", (node.name, vm)
    rules = {name: (kind, members) for name, kind, members in inventory["rules"]}
    assert len(rules) == 3 and all(kind == "AntiAffinityRuleSpec" for kind, _ in rules.values()), rules
    assert sorted(m for _, members in rules.values() for m in members) == sorted(NODES), rules


def test_the_vsphere_half_up_no_change_rotation_and_destroy(engine_lab) -> None:
    """`make up LAYER=vsphere` (the remote steps need SSH hosts): the template by our
    dynamic provider, seven clones and three rules by the real vSphere provider, read back from
    vcsim; a preview right after shows no change (every perpetual diff of the real provider is a
    defect); a vCenter password rotation; `make destroy` leaves vCenter and the datastore empty;
    no secret in clear in `pulumi stack export` at any point."""
    lab = engine_lab()
    readme_setup(lab, iso_sha256=lab_iso_sha(lab), iso_name=ISO_NAME)
    first = lab.make("up", layer="vsphere", args="--yes", timeout=1200)
    assert first.ok, lab.transcript()
    # Only creates (the engine's own count, from make up's --event-log): the VMs, rules, clone
    # sources and keys, the template and the components.
    made = first.summary()
    assert set(made) == {"create"} and made["create"] >= 3 * len(NODES) + 3, (made, lab.transcript())
    assert_no_clear_secret(lab, first.output, "the CLI's output")
    assert_no_clear_secret(lab, json.dumps(lab.stack_export()), "`pulumi stack export` after up")
    assert_the_clones_are_what_the_plan_says(lab, vcsim_inventory(lab))

    again = lab.make("preview", layer="vsphere", args="--expect-no-changes")
    assert again.ok, f"a perpetual diff on the real engine:\n{lab.transcript()}"

    assert_the_change_table_holds_on_the_real_plan(lab)

    # A vCenter password rotation: vcsim takes only the new one; one `up` records the new login.
    assert lab.password_file is not None
    lab.password_file.write_text("rotated-vcenter-secret\n")
    lab.pulumi("config", "set", "--stack", lab.stack, "--secret", "vsphere:password", stdin="rotated-vcenter-secret\n")
    recorded = lab.make("up", layer="vsphere", args="--yes")
    assert recorded.ok, lab.transcript()
    assert_no_clear_secret(lab, json.dumps(lab.stack_export()), "`pulumi stack export` after the rotation")

    destroyed = lab.make("destroy", timeout=1200)
    assert destroyed.ok, lab.transcript()
    inventory = vcsim_inventory(lab)
    assert inventory["machines"] == {} and inventory["rules"] == [], inventory
    assert all("labs-k8s-iso" not in entries for entries in inventory["datastore"].values()), inventory["datastore"]
    assert_no_clear_secret(lab, json.dumps(lab.stack_export()), "`pulumi stack export` after destroy")


def plan_steps(lab: EngineLab) -> list[tuple[str, str, str]]:
    """(type, name, op) of each step of the real engine's plan for the vSphere half, in the order
    the engine emits them, `same` left out. With --show-replacement-steps the plan lists a
    replacement's `create-replacement` and `delete-replaced` beside its logical `replace`: the JSON
    display shows the non-logical replacement steps only when asked (pkg/backend/display/display.go
    shouldShow, v3.274.1), and its steps are the ResourcePreEvents in order (json.go)."""
    # `pulumi preview --json` itself: make's checks print to the same stdout as the plan's JSON.
    targets = [f"--target={urn}" for urn in layer_targets(lab.stack, "vsphere")]
    steps = planned(lab, "--show-replacement-steps", *targets)
    return [
        (step["urn"].split("::")[2].rsplit("$", 1)[-1], step["urn"].rsplit("::", 1)[-1], step["op"])
        for step in steps
        if step["op"] != "same"
    ]


def vm_ops(lab: EngineLab, steps: list[tuple[str, str, str]] | None = None) -> dict[str, set[str]]:
    """VM name -> the logical ops of the real engine's plan for it (vSphere layers)."""
    ops: dict[str, set[str]] = {}
    for kind, name, op in plan_steps(lab) if steps is None else steps:
        if kind == VM and op not in ("create-replacement", "delete-replaced"):
            ops.setdefault(name, set()).add(op)
    return ops


def step_index(steps: list[tuple[str, str, str]], kind: str, name: str, op: str) -> int:
    found = [i for i, step in enumerate(steps) if step == (kind, name, op)]
    assert len(found) == 1, (kind, name, op, steps)
    return found[0]


def assert_the_change_table_holds_on_the_real_plan(lab: EngineLab) -> None:
    """docs/runbook.md "What a config change does", against the real engine's plan: an SSH public
    key rotation updates every VM's guestinfo in place; a node's address change replaces that VM
    alone, the old one deleted before the new one is created; a template input change (a new
    Debian point release) replaces the template alone, the new one first; a worker added is one
    clone more; a worker removed is that VM deleted. Each change is undone before the next."""
    stack = ["--stack", lab.stack]
    stack_file = lab.workspace / f"Pulumi.{lab.stack}.yaml"
    original = stack_file.read_text()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(lab.root / "rotated")], check=True)
    rotated = (lab.root / "rotated.pub").read_text().strip()
    # Both halves, as the runbook's rotation sets them (the program refuses a pair that does not match).
    rotated_key = (lab.root / "rotated").read_text()
    lab.pulumi("config", "set", *stack, "--secret", "labs-k8s:sshPrivateKey", stdin=rotated_key)
    lab.pulumi("config", "set", *stack, "--path", "labs-k8s:ssh.publicKey", rotated)
    assert vm_ops(lab) == {name: {"update"} for name in NODES}, lab.transcript()
    stack_file.write_text(original)

    lab.pulumi("config", "set", *stack, "--path", "labs-k8s:nodes.workers.hosts[1].ip", "10.3.60.57")
    # That VM alone is replaced, the old one deleted first (same name, same folder, same address):
    # for a delete-before-replace the engine emits delete-replaced, then replace, then
    # create-replacement (pkg/resource/deploy/step_generator.go, the `deleteBeforeReplace` branch,
    # v3.274.1); a create-before-delete would list create-replacement first.
    steps = plan_steps(lab)
    plan = vm_ops(lab, steps)
    assert plan == {"labs-k8s-w02": {"replace"}}, plan
    deleted = step_index(steps, VM, "labs-k8s-w02", "delete-replaced")
    created = step_index(steps, VM, "labs-k8s-w02", "create-replacement")
    assert deleted < created, f"the new labs-k8s-w02 is created before the old one is deleted: {steps}"
    stack_file.write_text(original)

    # A new Debian point release (the runbook's row "template.isoUrl + isoSha256"): the template
    # alone is replaced, a new one made before the old is deleted, and no clone changes (a clone
    # is a copy: it keeps running on what it was cloned from).
    lab.pulumi(
        "config", "set", *stack, "--path", "labs-k8s:template.isoUrl", f"{lab.iso_url}/debian-12.13.0-amd64-netinst.iso"
    )
    lab.pulumi("config", "set", *stack, "--path", "labs-k8s:template.isoSha256", "ab" * 32)
    steps = plan_steps(lab)
    assert [(kind, name, op) for kind, name, op in steps if op == "replace"] == [
        (TEMPLATE_RESOURCE, "golden-template", "replace")
    ], steps
    assert vm_ops(lab, steps) == {}, steps
    assert step_index(steps, TEMPLATE_RESOURCE, "golden-template", "create-replacement") < step_index(
        steps, TEMPLATE_RESOURCE, "golden-template", "delete-replaced"
    ), f"the old template is deleted before its replacement is made: {steps}"
    assert {op for _, _, op in steps} <= {"replace", "create-replacement", "delete-replaced"}, steps
    stack_file.write_text(original)

    lab.pulumi("config", "set", *stack, "--path", "labs-k8s:nodes.workers.hosts[2].name", "labs-k8s-w03")
    lab.pulumi("config", "set", *stack, "--path", "labs-k8s:nodes.workers.hosts[2].ip", "10.3.60.57")
    assert vm_ops(lab) == {"labs-k8s-w03": {"create"}}, lab.transcript()
    stack_file.write_text(original)

    import yaml

    settings = yaml.safe_load(original)
    hosts = settings["config"]["labs-k8s:nodes"]["workers"]["hosts"]
    assert [h["name"] for h in hosts] == ["labs-k8s-w01", "labs-k8s-w02"], "the example changed: update this test"
    del hosts[1]
    # One worker left: the program asks for the explicit consent to that (kubernetes.allowSingleWorker).
    settings["config"].setdefault("labs-k8s:kubernetes", {})["allowSingleWorker"] = True
    stack_file.write_text(yaml.safe_dump(settings))
    assert vm_ops(lab) == {"labs-k8s-w02": {"delete"}}, lab.transcript()
    stack_file.write_text(original)
