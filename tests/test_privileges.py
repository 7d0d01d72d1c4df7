"""The vCenter privileges (components/tools/privileges.py) against the code, pyVmomi, vcsim and the runbook.

One list makes the runbook's tables and its govc snippet; these tests keep that list honest:
every pyvmomi call in components/ is accounted for with at least the privileges pyVmomi's own
type information requires, every granted privilege has a call that needs it, the IDs are ones
a vCenter knows, and the runbook shows exactly what the list renders.
"""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from pyVmomi import VmomiSupport

from components import vsphere as vs
from components.tools import privileges as priv
from components.tools.offline import REPO_ROOT

RUNBOOK = REPO_ROOT / "docs" / "runbook.md"
# Plain functions of pyVim that stand for SOAP calls.
PYVIM_CALLS = {"SmartConnect": "vim.SessionManager.Login", "Disconnect": "vim.SessionManager.Logout"}


def _vmodl_methods() -> dict[str, list[tuple[str, object]]]:
    """Every SOAP method name (WSDL and Python spelling) -> [(vmodl type, method info)]."""
    methods: dict[str, list[tuple[str, object]]] = defaultdict(list)
    for type_name in list(VmomiSupport._managedDefMap):
        if not type_name.startswith(("vim.", "vmodl.")):
            continue
        for py_name, info in VmomiSupport.GetVmodlType(type_name)._methodInfo.items():
            methods[info.wsdlName].append((type_name, info))
            methods[py_name].append((type_name, info))
    return methods


METHODS = _vmodl_methods()


def _listed_call(call: priv.ApiCall) -> tuple[str, str] | None:
    """(vmodl type, method) of a listed SOAP call, None for provider/HTTP entries."""
    match = re.match(r"^((?:vim|vmodl)\.[\w.]+)\.(\w+)", call.call)
    return (match.group(1), match.group(2)) if match else None


def calls_in_code() -> dict[str, set[str]]:
    """Method name -> files, for every pyvmomi call made anywhere under components/."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in sorted((REPO_ROOT / "components").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Attribute) and node.func.attr in METHODS:
                found[node.func.attr].add(path.name)
            elif isinstance(node.func, ast.Name) and node.func.id in PYVIM_CALLS:
                found[node.func.id].add(path.name)
    return found


def test_the_scan_sees_the_calls_it_must():
    # Guards the scanner itself: these calls exist in components/vsphere today.
    found = calls_in_code()
    assert {"CreateVM_Task", "MarkAsTemplate", "PowerOnVM_Task", "RetrievePropertiesEx", "SmartConnect"} <= set(found)


def test_every_pyvmomi_call_in_the_code_is_listed():
    listed_methods = {parsed[1] for call in priv.API_CALLS if (parsed := _listed_call(call))}
    missing = []
    for name, files in calls_in_code().items():
        wanted = PYVIM_CALLS.get(name, name)
        method = wanted.rsplit(".", 1)[-1]
        # A Python spelling (vm.PowerOn) counts for its WSDL name (PowerOnVM_Task) and back.
        spellings = {method} | {info.wsdlName for _, info in METHODS.get(method, [])}
        if not spellings & listed_methods:
            missing.append(f"{name} (in {', '.join(sorted(files))})")
    assert not missing, f"pyvmomi calls without an entry in components/tools/privileges.API_CALLS: {missing}"


def test_listed_calls_carry_the_privileges_pyvmomi_declares():
    granted = priv.granted(r.name for r in priv.ROLES)
    checked = 0
    for call in priv.API_CALLS:
        parsed = _listed_call(call)
        if parsed is None:
            continue
        type_name, method = parsed
        infos = [info for owner, info in METHODS.get(method, []) if owner == type_name]
        assert infos, f"{call.call}: pyVmomi has no method {method} on {type_name}"
        for info in infos:
            declared = {info.privId} | {p.privId for p in info.params}  # type: ignore[attr-defined]
            declared.discard(None)
            assert declared <= set(call.privileges), f"{call.call}: pyVmomi requires {declared}"
            assert declared <= granted, f"{call.call}: {declared - granted} is granted by no role"
            checked += 1
    assert checked >= 15


def test_roles_grant_exactly_what_the_calls_need():
    every_role = priv.granted(r.name for r in priv.ROLES)
    assert priv.privileges_for("up") == every_role, (
        f"unused: {every_role - priv.privileges_for('up')}, missing: {priv.privileges_for('up') - every_role}"
    )
    assert priv.privileges_for("preview") == priv.granted(priv.PREVIEW_ROLES)
    # pulumi preview changes nothing: its role holds read privileges only.
    assert priv.granted(priv.PREVIEW_ROLES) == {*priv.READ_ONLY, "StorageProfile.View"}
    assert {p.id for p in priv.PRIVILEGES} == every_role


def test_what_the_issue_found_missing_is_granted_and_what_it_found_extra_is_not():
    every_role = priv.granted(r.name for r in priv.ROLES)
    assert {
        "StorageProfile.View",
        "VirtualMachine.Config.Resource",
        "VirtualMachine.Config.DiskExtend",
        "VirtualMachine.Config.SwapPlacement",
    } <= every_role
    for not_needed in (
        "VirtualMachine.Provisioning.Clone",
        "VirtualMachine.Provisioning.CloneTemplate",
        "VirtualMachine.Config.ChangeTracking",
        "Datastore.UpdateVirtualMachineFiles",
    ):
        assert not_needed not in every_role
    # Modify cluster only on the lab's cluster; storage policies and root lookups at the root, not propagated.
    assert {(g.target, g.propagate) for g in priv.GRANTS if g.role == "labs-k8s-drs"} == {("cluster", False)}
    assert priv.Grant("labs-k8s-read", "root", propagate=False) in priv.GRANTS


def test_the_privilege_ids_are_ones_vcenter_knows(vcsim):
    # vcsim's role list was captured from a real vCenter/ESXi (simulator/esx/authorization_manager.go).
    with vs.session(vcsim.host, vcsim.user, vcsim.password, port=vcsim.port, insecure=True) as si:
        manager = si.RetrieveContent().authorizationManager
        known = {p for r in manager.roleList for p in r.privilege}
        assert len(known) > 200
        assert {p.id for p in priv.PRIVILEGES} <= known, {p.id for p in priv.PRIVILEGES} - known
        # Every grant's path, filled in for vcsim's inventory, names an object that exists.
        placement = {
            "datacenter": vcsim.datacenter,
            "computeCluster": vcsim.cluster,
            "datastore": vcsim.datastore,
            "network": vcsim.network,
            "folder": "labs-k8s",
            "resourcePool": "",
        }
        vs.find_datacenter(si, vcsim.datacenter).vmFolder.CreateFolder("labs-k8s")
        index = si.RetrieveContent().searchIndex
        for grant in priv.GRANTS:
            path = priv._target_path(grant.target, placement)
            found = si.RetrieveContent().rootFolder if path == "/" else index.FindByInventoryPath(path.lstrip("/"))
            assert found is not None, f"{grant.role} on {path}: no such object"


def generated_block(text: str, name: str) -> str:
    match = re.search(rf"<!-- generated: {name} -->\n(.*?)\n<!-- end: {name} -->", text, flags=re.S)
    assert match, f"docs/runbook.md has no generated block {name!r}"
    return match.group(1)


@pytest.mark.parametrize("phase", ["up", "preview"])
def test_the_runbook_shows_what_the_list_renders(phase):
    text = RUNBOOK.read_text()
    regenerate = "python -m components privileges --write-docs"
    assert generated_block(text, f"privileges-{phase}") == priv.render_privilege_table(phase), regenerate
    assert generated_block(text, f"grants-{phase}") == priv.render_grant_table(phase), regenerate
    snippet = generated_block(text, f"govc-{phase}")
    assert snippet == f"```sh\n{priv.render_govc(phase=phase)}\n```", regenerate
    if phase == "up":
        assert generated_block(text, "not-needed") == priv.render_not_needed(), regenerate


def test_the_govc_snippet_creates_each_role_with_its_privileges_and_grants_it_where_the_list_says():
    commands = [shlex.split(line) for line in priv.render_govc().splitlines()]
    created = {c[2]: set(c[3:]) for c in commands if c[1] == "role.create"}
    for role in priv.ROLES:
        assert created[role.name] | set(priv.READ_ONLY) == set(role.privileges)
    grants = [(c[c.index("-role") + 1], c[-1], c[c.index("-role") + 2]) for c in commands if c[1] == "permissions.set"]
    assert len(grants) == len(priv.GRANTS)


def test_privileges_command_fills_in_the_stack(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "components", "privileges", "--stack", "labs"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "-role labs-k8s-vms -propagate=true /Datacenter/vm/labs-k8s" in result.stdout
    assert "-role labs-k8s-drs -propagate=false /Datacenter/host/Cluster" in result.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "components", "privileges", "--stack", "nope"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 2 and "Pulumi.nope.yaml" in missing.stderr


def test_calls_name_real_places(tmp_path):
    # Every "source" that names a file of this repository points at one that exists.
    for call in priv.API_CALLS:
        for name in re.findall(r"components/[\w/]+\.py", call.source):
            assert Path(REPO_ROOT / name).exists(), name
