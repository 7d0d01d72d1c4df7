"""The golden template's dynamic provider (components/template.py) end to end against a real vcsim.

vcsim runs no guest, so the Debian installer's final power-off is simulated: a thread powers the
builder VM off once it is running. The ISO is a small stand-in file (the real download and
remaster are tested in tests/test_iso.py); everything else is the provider's real code path:
upload, builder VM, power-on, wait, detach, MarkAsTemplate, hardware verification, delete.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyVmomi import vim

from components import iso
from components import vsphere as vs
from components.config import LabConfig
from components.template import REPLACE_KEYS, TemplateBuildProvider

FOLDER = "labs-k8s"


@pytest.fixture
def si(vcsim) -> Iterator[vim.ServiceInstance]:
    with vs.session(vcsim.host, vcsim.user, vcsim.password, port=vcsim.port, insecure=True) as service:
        dc = vs.find_datacenter(service, vcsim.datacenter)
        dc.vmFolder.CreateFolder(FOLDER)  # test setup: the lab's folder exists (preflight checks it)
        yield service


@pytest.fixture
def stand_in_iso(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "labs-k8s-debian12-stand-in.iso"
    path.write_bytes(b"\0" * 4096)
    monkeypatch.setattr(iso, "build_install_media", lambda url, sha256, files, name, cache_dir: path)
    return path


def props_for(vcsim, lab_config: LabConfig, *, timeout_s: float = 30) -> dict[str, Any]:
    lab = lab_config.model_copy(
        update={
            "vsphere": lab_config.vsphere.model_copy(
                update={
                    "datacenter": vcsim.datacenter,
                    "compute_cluster": vcsim.cluster,
                    "datastore": vcsim.datastore,
                    "network": vcsim.network,
                    "folder": FOLDER,
                }
            )
        }
    )
    return {
        "name": "labs-k8s-debian12-test",
        "stack": "labs",
        "datacenter": lab.vsphere.datacenter,
        "cluster": lab.vsphere.compute_cluster,
        "datastore": lab.vsphere.datastore,
        "network": lab.vsphere.network,
        "folder": lab.vsphere.folder,
        "resourcePool": None,
        "firmware": "bios",
        "vcpu": 1,
        "memoryMib": 512,
        "diskGib": 1,
        "isoUrl": lab.template.iso_url,
        "isoSha256": lab.template.iso_sha256,
        "isoFiles": {"/preseed.cfg": "stand-in"},
        "buildTimeoutSeconds": timeout_s,
        "server": f"{vcsim.host}:{vcsim.port}",
        "user": vcsim.user,
        "password": vcsim.password,
        "allowUnverifiedSsl": True,
    }


def simulate_installer_power_off(si: vim.ServiceInstance, name: str, delay_s: float = 1.0) -> threading.Thread:
    """Power the builder off once it runs, as the preseed's last step does."""

    def run() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            vm = vs.find_vm(si, name)
            if vm is not None and vs.power_state(vm) == "poweredOn":
                time.sleep(delay_s)
                vs.power_off(vm)
                return
            time.sleep(0.2)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_build_converts_and_verifies_the_template(vcsim, si, lab_config, stand_in_iso):
    props = props_for(vcsim, lab_config)
    simulate_installer_power_off(si, props["name"])
    result = TemplateBuildProvider().create(props)

    vm = vs.find_vm_by_uuid(si, result.id)
    assert vm is not None and vm.name == props["name"]
    assert vm.config.template is True
    assert result.outs["uuid"] == result.id and result.outs["moid"] == vm._moId
    assert vs.verify_template_hardware(vm) == []
    # The ISO went to the datastore, and the CD-ROM is gone from the template.
    assert not [d for d in vm.config.hardware.device if isinstance(d, vim.vm.device.VirtualCdrom)]
    extra = {o.key: o.value for o in vm.config.extraConfig}
    assert extra[vs.STACK_TAG_KEY] == "labs"


def test_rerun_adopts_a_finished_template(vcsim, si, lab_config, stand_in_iso):
    props = props_for(vcsim, lab_config)
    simulate_installer_power_off(si, props["name"])
    first = TemplateBuildProvider().create(props)
    # As after an interrupted `up` that never recorded the template: no second build.
    second = TemplateBuildProvider().create(props)
    assert second.id == first.id
    assert len([v for v in si.content.viewManager.CreateContainerView(
        si.content.rootFolder, [vim.VirtualMachine], True).view if v.name == props["name"]]) == 1


def test_installer_timeout_fails_clearly_and_removes_the_builder(vcsim, si, lab_config, stand_in_iso):
    props = props_for(vcsim, lab_config, timeout_s=2)  # nobody powers it off
    with pytest.raises(vs.VSphereTimeoutError, match="unattended install did not finish"):
        TemplateBuildProvider().create(props)
    assert vs.find_vm(si, props["name"]) is None


def test_delete_removes_the_template(vcsim, si, lab_config, stand_in_iso):
    props = props_for(vcsim, lab_config)
    simulate_installer_power_off(si, props["name"])
    result = TemplateBuildProvider().create(props)
    TemplateBuildProvider().delete(result.id, result.outs)
    assert vs.find_vm_by_uuid(si, result.id) is None
    TemplateBuildProvider().delete(result.id, result.outs)  # already gone: no error


def test_read_reports_a_template_deleted_outside_pulumi(vcsim, si, lab_config, stand_in_iso):
    props = props_for(vcsim, lab_config)
    simulate_installer_power_off(si, props["name"])
    result = TemplateBuildProvider().create(props)
    assert TemplateBuildProvider().read(result.id, result.outs).id == result.id
    vs.destroy_vm(vs.find_vm_by_uuid(si, result.id))
    assert TemplateBuildProvider().read(result.id, result.outs).id == ""


def test_diff_replaces_only_for_template_inputs():
    olds = {key: f"old-{key}" for key in REPLACE_KEYS} | {"password": "a", "user": "u1"}
    same = TemplateBuildProvider().diff("id", olds, dict(olds, password="b", user="u2"))
    assert same.changes is False and not same.replaces
    renamed = TemplateBuildProvider().diff("id", olds, dict(olds, name="labs-k8s-debian12-new"))
    assert renamed.changes is True and renamed.replaces == ["name"]


def test_provider_survives_the_dynamic_provider_host():
    """Pulumi pickles the provider (dill) into the state and unpickles it in another process:
    the bytes must be stable (else every run shows a diff) and load in a fresh interpreter."""
    import subprocess
    import sys

    from pulumi.dynamic.dynamic import serialize_provider

    from components.offline import REPO_ROOT

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
