"""The real Pulumi CLI (built from Go modules by tests/tools/build_toolchain.sh) runs this program.

What runs for real here: the CLI and its engine, the `file://` backend, passphrase secrets, the
stack set up the README's way, the Makefile's checks (`make preview`/`make destroy` call
`python -m components check` and then the CLI), our dynamic providers started by the CLI through
`pulumi-resource-pulumi-python`, and vcsim for every vCenter call, all in a network namespace of
their own (tests/pulumi_engine.py). What cannot run here, and why (the Go module proxy refuses
the modules): the Python language host (the program runs through the SDK's Automation API
language server instead, tests/engine_driver.py) and the vsphere, command and random providers
(tests/tools/toolchain/manifest.json). docs/testing.md says which proofs run where.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.pulumi_engine import EngineLab, manifest, readme_setup, start_lab, stop_lab, toolchain_bin
from tests.requirements import require_root, require_tool
from tests.standin_iso import build_standin_netinst
from tests.vcsim import vcsim_binary

pytestmark = pytest.mark.integration

ISO_NAME = "debian-12.12.0-amd64-netinst.iso"
REFUSED = {entry["name"] for entry in manifest()["binaries"] if entry["status"] == "refused"}


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
    """Each binary at the version its entry names; each refused module says why and what instead."""
    bin_dir = toolchain_bin()
    entries = {entry["name"]: entry for entry in manifest()["binaries"]}
    import subprocess

    reported = subprocess.run([str(bin_dir / "pulumi"), "version"], capture_output=True, text=True, check=True)
    assert reported.stdout.strip() == entries["pulumi"]["version"]
    for name in ("pulumi-language-python-exec", "pulumi-resource-pulumi-python"):
        assert (bin_dir / name).stat().st_mode & 0o111, f"{name} is not executable"
    for entry in entries.values():
        assert entry["status"] in {"exact", "substitute", "refused"}, entry
        assert entry["why"] and (entry["status"] != "refused" or entry["instead"]), entry
        assert entry["status"] == "refused" or entry.get("version"), entry
    assert {"pulumi-language-python", "pulumi-resource-vsphere", "pulumi-resource-command"} <= REFUSED


def test_a_new_stack_on_a_file_backend_previews_without_crashing_the_cli(engine_lab) -> None:
    """README steps 2, 3 and 5 on a `file://` backend, then `make preview`, then the program.

    The CLI dies with a nil-pointer panic when `pulumi:pulumi:readStackResourceOutputs` reads a
    stack whose checkpoint has no deployment (pkg/backend/backend.go GetStackResourceOutputs ranges
    over a nil snapshot). The program must not ask it on a stack that was never deployed."""
    lab = engine_lab()
    readme_setup(lab, iso_sha256=lab_iso_sha(lab), iso_name=ISO_NAME)
    for target in ("preview", "up"):
        made = lab.make(target)
        # The Makefile's checks pass on the real CLI (`make up`'s gives a self-managed stack its
        # initial deployment, with `pulumi stack import`); then the CLI needs the Python language
        # host, which the Go module proxy refuses (manifest): the one step that cannot run here.
        assert made.ok or "no language plugin 'pulumi-language-python' found" in made.output, lab.transcript()
        assert "panic" not in made.output, lab.transcript()
    run = lab.engine("preview")
    assert "panic" not in run.output and "nil pointer" not in run.output, lab.transcript()
    assert_stops_only_at_a_refused_plugin(lab, run.engine_result(), run.output)
    assert_no_clear_secret(lab, run.output, "the CLI's output")


def test_a_deployment_less_checkpoint_does_not_crash_the_cli(engine_lab) -> None:
    """The checkpoint diy's CreateStack saves first (an empty TypedDeployment: no `latest`), which
    a stack keeps when what follows never ran: the program's first invoke must not panic on it."""
    lab = engine_lab()
    readme_setup(lab, iso_sha256=lab_iso_sha(lab), iso_name=ISO_NAME)
    checkpoint = lab.root / "backend" / ".pulumi" / "stacks" / "labs-k8s" / f"{lab.stack}.json"
    assert checkpoint.is_file(), sorted(p.name for p in checkpoint.parent.iterdir())
    checkpoint.write_text(json.dumps({"version": 3, "checkpoint": {"stack": f"organization/labs-k8s/{lab.stack}"}}))
    run = lab.engine("preview")
    assert "panic" not in run.output and "nil pointer" not in run.output, lab.transcript()
    assert_stops_only_at_a_refused_plugin(lab, run.engine_result(), run.output)


def lab_iso_sha(lab: EngineLab) -> str:
    del lab
    return _ISO_SHA[0]


_ISO_SHA: list[str] = []


@pytest.fixture(autouse=True)
def _iso_sha(iso: tuple[Path, str]) -> None:
    _ISO_SHA[:] = [iso[1]]


def assert_stops_only_at_a_refused_plugin(lab: EngineLab, result: dict[str, Any], output: str) -> None:
    """The run succeeded, or it failed only where the engine asked for a provider plugin that the
    Go module proxy refuses (the manifest's `refused` entries), not anywhere before."""
    if result["ok"]:
        return
    missing = re.findall(r"no resource plugin '(?:pulumi-resource-)?([a-z-]+)'", output)
    assert missing, f"the run failed before any provider plugin was asked for:\n{lab.transcript()}"
    assert {f"pulumi-resource-{name}" for name in missing} <= REFUSED, lab.transcript()


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

    first = lab.engine("up", program="template")
    assert first.engine_result()["ok"], lab.transcript()
    assert first.engine_result()["changes"] == {"create": 3}, lab.transcript()
    assert len(vcsim_templates(lab)) == 1
    assert_no_clear_secret(lab, first.output, "the CLI's output")

    again = lab.engine("preview", program="template", expect_no_changes=True)
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
    recorded = lab.engine("refresh", program="template")
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
        f"si = vs.connect({host!r}, 'labs', password, port={port}, insecure=True)\n"
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
    import os
    import signal
    import subprocess
    import time

    lab = engine_lab()
    readme_setup(lab, iso_sha256=lab_iso_sha(lab), iso_name=ISO_NAME)
    hold = lab.root / "installer-hold"  # the installer is still at work: the builder stays on
    hold.touch()
    log = lab.root / "killed-up.log"
    with log.open("w") as out:
        driver = subprocess.Popen(
            ["ip", "netns", "exec", lab.netns, "python", "-m", "tests.engine_driver", "--stack", lab.stack,
             "--pulumi-root", str(lab.bin_dir.parent), "--op", "up", "--program", "template"],
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

    locked = lab.engine("up", program="template")
    assert not locked.engine_result()["ok"]
    assert "the stack is currently locked" in locked.output and "pulumi cancel" in locked.output, lab.transcript()
    lab.pulumi("cancel", "--stack", lab.stack, "--yes")
    resumed = lab.engine("up", program="template")
    assert resumed.engine_result()["ok"], lab.transcript()
    assert "pending operations from previous deployment" in resumed.output, lab.transcript()
    machines = vcsim_machines(lab)
    assert [template for _, template in machines] == [True], f"one template and nothing else: {machines}"
    again = lab.engine("preview", program="template", expect_no_changes=True)
    assert again.engine_result()["ok"], lab.transcript()
