"""The change -> effect model (components/tools/changes.py) and the runbook table it generates.

The model's rules are the engine's and the providers' (cited in the module); these tests pin
them on small hand-made graphs where the engine's answer is known, then run the real program
before and after each runbook case and require the committed table to be exactly the result.
"""

from __future__ import annotations

from typing import Any

import pytest

from components.tools import changes
from components.tools.changes import (
    COMMAND,
    VM,
    apply_ignore_changes,
    changed_paths,
    parse_property_path,
    path_contains,
    plan_changes,
)
from components.tools.offline import REPO_ROOT, OfflineRun, Registration

RUNBOOK = REPO_ROOT / "docs" / "runbook.md"


# --------------------------------------------------------------------------- property paths


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("extraConfig", ("extraConfig",)),
        ('extraConfig["guestinfo.userdata"]', ("extraConfig", "guestinfo.userdata")),
        ("disks[1].size", ("disks", 1, "size")),
        ("clone.templateUuid", ("clone", "templateUuid")),
        ("networkInterfaces[*].macAddress", ("networkInterfaces", "*", "macAddress")),
        ("*", ("*",)),
    ],
)
def test_property_paths_parse_like_pulumis(text, parsed):
    assert parse_property_path(text) == parsed


def test_contains_is_go_s_property_path_contains():
    # sdk/go/common/resource/properties_path.go: `foo["bar"][1]` contains `foo.bar[1].baz`.
    assert path_contains(parse_property_path('foo["bar"][1]'), parse_property_path("foo.bar[1].baz"))
    assert path_contains(("foo", "*", "baz"), ("foo", "bar", "baz", "bam"))
    assert not path_contains(("extraConfig", "guestinfo.userdata"), ("extraConfig",))  # a shallower change
    assert not path_contains(("disks", 1), ("disks", 0, "size"))


def test_changed_paths_reach_the_leaves():
    old = {"a": 1, "m": {"x": "1", "y": "2"}, "l": [{"s": 1}, {"s": 2}], "gone": 0}
    new = {"a": 1, "m": {"x": "1", "y": "3", "z": "4"}, "l": [{"s": 1}, {"s": 5}], "l2": []}
    assert changed_paths(old, new) == [("gone",), ("l", 1, "s"), ("l2",), ("m", "y"), ("m", "z")]
    assert changed_paths({"l": [1]}, {"l": [1, 2]}) == [("l",)]


def test_ignore_changes_puts_the_old_value_back():
    old = {"clone": {"templateUuid": "old"}, "extraConfig": {"a": "1", "b": "2"}, "n": 1}
    new = {"clone": {"templateUuid": "new"}, "extraConfig": {"a": "9", "b": "9"}, "n": 2}
    assert apply_ignore_changes(old, new, ["clone", 'extraConfig["a"]']) == {
        "clone": {"templateUuid": "old"},
        "extraConfig": {"a": "1", "b": "9"},
        "n": 2,
    }


# --------------------------------------------------------------------------- engine rules on small graphs


def _reg(
    name: str,
    type_: str,
    inputs: dict[str, Any],
    *,
    deps: dict[str, list[str]] | None = None,
    depends_on: list[str] | None = None,
    replace_on_changes: tuple[str, ...] = (),
    ignore_changes: tuple[str, ...] = (),
    dbr: bool = False,
) -> Registration:
    reg = Registration(
        type=type_,
        name=name,
        urn=f"urn:{name}",
        parent="",
        custom=True,
        dependencies=[f"urn:{d}" for d in [*(depends_on or []), *[x for v in (deps or {}).values() for x in v]]],
        property_dependencies={k: [f"urn:{d}" for d in v] for k, v in (deps or {}).items()},
        replace_on_changes=replace_on_changes,
        ignore_changes=ignore_changes,
        delete_before_replace=dbr,
    )
    reg.__dict__["plain_inputs"] = inputs  # cached_property: what the wire form would decode to
    reg.__dict__["plain_outputs"] = {}
    return reg


def _run(*regs: Registration) -> OfflineRun:
    return OfflineRun({r.urn: r for r in regs}, {}, [])


def _vm(name: str, **inputs: Any) -> dict[str, Any]:
    return {"name": name, "numCpus": 2, "memory": 4096, "extraConfig": {"guestinfo.userdata": "u"}, **inputs}


def test_replace_on_changes_path_and_the_dependents_it_renews():
    def graph(userdata: str) -> OfflineRun:
        vm = _reg(
            "vm",
            VM,
            _vm("vm", extraConfig={"guestinfo.userdata": userdata, "k": "1"}),
            replace_on_changes=('extraConfig["guestinfo.userdata"]',),
            dbr=True,
        )
        ready = _reg("ready", COMMAND, {"create": "x", "triggers": ["h", "vm-id"]}, deps={"triggers": ["vm"]})
        after = _reg("after", COMMAND, {"create": "y", "triggers": ["h2", "ready-id"]}, deps={"triggers": ["ready"]})
        other = _reg("other", COMMAND, {"create": "z"}, depends_on=["vm"])  # no data from the VM: untouched
        return _run(vm, ready, after, other)

    plan = plan_changes(graph("u1"), graph("u2"))
    # In execution order: the delete-first halves come first, dependents before the VM.
    assert [(e.name, e.action) for e in plan.effects] == [("after", "replace"), ("ready", "replace"), ("vm", "replace")]
    vm = plan.effect("vm")
    assert vm is not None and vm.delete_before_replace and vm.inputs == ("extraConfig",)
    ready = plan.effect("ready")
    assert ready is not None and ready.cause == "replaced: vm"
    # Delete-before-replace: the dependents it renews are deleted before it, dependents first.
    assert [(s.kind, s.names) for s in plan.steps[:3]] == [
        ("delete first (replaced)", ("after",)),
        ("delete first (replaced)", ("ready",)),
        ("delete first (replaced)", ("vm",)),
    ]
    assert [s.kind for s in plan.steps[3:]] == ["create replacement"] * 3


def test_a_change_outside_the_replace_path_is_an_update_without_reboot_when_told_so():
    def graph(value: str, reboot_flag: bool | None) -> OfflineRun:
        inputs = _vm("vm", extraConfig={"guestinfo.userdata": "u", "guestinfo.other": value})
        if reboot_flag is not None:
            inputs["extraConfigRebootRequired"] = reboot_flag
        return _run(_reg("vm", VM, inputs, replace_on_changes=('extraConfig["guestinfo.userdata"]',)))

    quiet = plan_changes(graph("a", False), graph("b", False))
    assert [(e.action, e.inputs, e.reboots) for e in quiet.effects] == [("update", ("extraConfig",), False)]
    # terraform-provider-vsphere: extra_config_reboot_required defaults to true.
    loud = plan_changes(graph("a", None), graph("b", None))
    assert [(e.action, e.reboots) for e in loud.effects] == [("update", True)]
    assert [s.kind for s in loud.steps] == ["update, power-cycles"]


def test_vm_force_new_and_reboot_rules():
    before = _run(_reg("vm", VM, _vm("vm", replaceTrigger="a", clone={"templateUuid": "t1", "timeout": 30})))
    trigger = _run(_reg("vm", VM, _vm("vm", replaceTrigger="b", clone={"templateUuid": "t1", "timeout": 30})))
    timeout = _run(_reg("vm", VM, _vm("vm", replaceTrigger="a", clone={"templateUuid": "t1", "timeout": 60})))
    template = _run(_reg("vm", VM, _vm("vm", replaceTrigger="a", clone={"templateUuid": "t2", "timeout": 30})))
    ignored = _run(
        _reg(
            "vm",
            VM,
            _vm("vm", replaceTrigger="a", clone={"templateUuid": "t2", "timeout": 30}),
            ignore_changes=("clone",),
        )
    )
    cpus = _run(_reg("vm", VM, _vm("vm", replaceTrigger="a", numCpus=4, clone={"templateUuid": "t1", "timeout": 30})))
    assert [e.action for e in plan_changes(before, trigger).effects] == ["replace"]
    assert [e.action for e in plan_changes(before, timeout).effects] == ["update"]
    assert [e.action for e in plan_changes(before, template).effects] == ["replace"]
    assert plan_changes(before, ignored).effects == []
    assert [(e.action, e.reboots) for e in plan_changes(before, cpus).effects] == [("update", True)]


def test_an_ignored_input_is_not_renewed_by_its_replaced_source():
    def graph(uuid: str) -> OfflineRun:
        template = _reg("template", changes.RANDOM_ID, {"byteLength": 8, "keepers": {"v": uuid}})
        vm = _reg(
            "vm", VM, _vm("vm", clone={"templateUuid": "x"}), deps={"clone": ["template"]}, ignore_changes=("clone",)
        )
        return _run(template, vm)

    plan = plan_changes(graph("1"), graph("2"))
    assert [(e.name, e.action) for e in plan.effects] == [("template", "replace")]


def test_commands_replace_on_triggers_and_update_otherwise():
    before = _run(_reg("step", COMMAND, {"create": "a", "triggers": ["1"], "connection": {"host": "h"}}))
    rerun = _run(_reg("step", COMMAND, {"create": "a", "triggers": ["2"], "connection": {"host": "h"}}))
    rekey = _run(_reg("step", COMMAND, {"create": "a", "triggers": ["1"], "connection": {"host": "h2"}}))
    assert [(e.action, e.inputs) for e in plan_changes(before, rerun).effects] == [("replace", ("triggers",))]
    assert [(e.action, e.inputs) for e in plan_changes(before, rekey).effects] == [("update", ("connection",))]


def test_removed_resources_are_deleted_dependents_first():
    vm = _reg("vm", VM, _vm("vm"))
    ready = _reg("ready", COMMAND, {"create": "x", "triggers": ["vm-id"]}, deps={"triggers": ["vm"]})
    drain = _reg("drain", COMMAND, {"create": "y", "delete": "drain"}, depends_on=["ready"])
    keep = _reg("keep", COMMAND, {"create": "z"})
    plan = plan_changes(_run(vm, ready, drain, keep), _run(keep))
    assert [(s.kind, s.names) for s in plan.steps] == [
        ("delete", ("drain",)),
        ("delete", ("ready",)),
        ("delete", ("vm",)),
    ]


def test_unknown_resource_types_are_refused_not_guessed():
    before = _run(_reg("x", "aws:s3/bucket:Bucket", {"a": 1}))
    after = _run(_reg("x", "aws:s3/bucket:Bucket", {"a": 2}))
    with pytest.raises(ValueError, match="no provider rule for aws:s3/bucket:Bucket"):
        plan_changes(before, after)


# --------------------------------------------------------------------------- the real program


def test_a_second_up_changes_nothing(offline_run):
    from components.tools.offline import run_program

    assert plan_changes(offline_run, run_program("labs")).effects == []


def test_the_template_provider_diff_is_the_one_that_runs(offline_run):
    """The dynamic provider's own diff() decides: a new vCenter password changes nothing about
    the template (the provider reads the login at each call; it is not an input). A new ISO
    replaces it: test_a_rebuilt_template_leaves_the_nodes_alone."""
    from components.tools.offline import run_program

    rotated = run_program("labs", overrides={"vsphere:password": "another-password"})
    assert rotated.config["vsphere:password"] == "another-password"  # the config really changed
    assert "password" not in rotated.by_name("golden-template").plain_inputs
    assert plan_changes(offline_run, rotated).effects == []


@pytest.fixture(scope="module")
def case_plans() -> dict[str, changes.Plan]:
    """Every runbook case's plan, computed once for this module."""
    return {case.title: plan for case, plan in changes.case_plans()}


def test_runbook_table_is_computed_from_the_program(case_plans):
    text = RUNBOOK.read_text()
    assert changes.TABLE_BEGIN in text and changes.TABLE_END in text
    committed = text.split(changes.TABLE_BEGIN, 1)[1].split(changes.TABLE_END, 1)[0].lstrip("\n")
    table = changes.render_table((case, case_plans[case.title]) for case in changes.CHANGE_CASES)
    assert committed == table, (
        "docs/runbook.md's change table is stale: python -m components.tools.changes --write docs/runbook.md"
    )


# --------------------------------------------------------------------------- what the program decides


def _plan_for(title_part: str, case_plans: dict[str, changes.Plan]) -> changes.Plan:
    (plan,) = [plan for title, plan in case_plans.items() if title_part in title]
    return plan


@pytest.mark.parametrize(
    "title_part", ["ssh.extraPublicKeys", "ssh.publicKey` +", "network.ntpServers", "network.dnsServers"]
)
def test_in_place_changes_rebuild_and_reboot_nothing(case_plans, title_part):
    """A key rotation or new NTP/DNS servers: guestinfo updated in place (no power cycle), the
    node-settings step re-runs; no VM is replaced."""
    plan = _plan_for(title_part, case_plans)
    vms = [e for e in plan.effects if e.type == VM]
    assert len(vms) == 7
    assert {(e.action, e.inputs, e.reboots) for e in vms} == {("update", ("extraConfig",), False)}
    settings = {e.name for e in plan.effects if e.name.endswith("-node-settings")}
    assert len(settings) == 7
    assert not [e for e in plan.effects if e.type == changes.ANTI_AFFINITY_RULE]
    # Nothing else re-runs: the kubeadm steps carry no NTP or DNS, and the template only records the
    # new install media for its next build (the build environment is not what the template is).
    template = plan.effect("golden-template")
    assert template is None or template.action == "update"
    assert {e.name for e in plan.effects if e.type == COMMAND and e.action == "replace"} == settings


def test_a_key_rotation_hands_the_new_key_to_the_steps_whose_delete_runs_later(case_plans):
    """The leave guards and teardown-guard are updated in place with the new connection (never
    replaced: that would run their delete), so removing a node or destroying the lab after a
    rotation logs in with the key the nodes trust now."""
    plan = _plan_for("ssh.publicKey` +", case_plans)
    guards = {
        e.name: (e.action, e.inputs)
        for e in plan.effects
        if e.name.endswith("-leave-cluster") or e.name == "teardown-guard"
    }
    assert len(guards) == 6
    assert set(guards.values()) == {("update", ("connection",))}


def test_a_new_identity_replaces_the_vm_delete_first(case_plans):
    plan = _plan_for("A worker's address", case_plans)
    vm = plan.effect("labs-k8s-w01")
    assert vm is not None and vm.action == "replace" and vm.delete_before_replace
    assert {"replaceTrigger", "clone"} <= set(vm.inputs)
    kinds = [(s.kind, s.names) for s in plan.steps]
    delete_vm = kinds.index(("delete first (replaced)", ("labs-k8s-w01",)))
    create_vm = next(i for i, (k, n) in enumerate(kinds) if k == "create replacement" and "labs-k8s-w01" in n)
    # Everything on the node that reads the VM goes before the VM, and comes back after it.
    # The leave guard among them: its delete drains the node and deletes its Node before the VM goes.
    for step_name in ("labs-k8s-w01-ready", "labs-k8s-w01-leave-cluster", "labs-k8s-w01-kubeadm-join"):
        gone = next(i for i, (k, n) in enumerate(kinds) if k == "delete first (replaced)" and step_name in n)
        back = next(i for i, (k, n) in enumerate(kinds) if k == "create replacement" and step_name in n)
        assert gone < delete_vm < create_vm < back
    assert all(e.name.startswith(("labs-k8s-w01", "workers-", "verify-cluster")) for e in plan.effects)


def test_no_vm_is_ever_replaced_create_before_delete(case_plans):
    replaced = 0
    for title, plan in case_plans.items():
        for effect in plan.effects:
            if effect.type == VM and effect.action == "replace":
                assert effect.delete_before_replace, (title, effect.name)
                replaced += 1
    assert replaced >= 3  # the cases do replace VMs (an address, data disks)


def test_a_balancer_setting_re_runs_the_balancers_and_nothing_after_them(case_plans):
    """`kubeadm init` waits for the balancers but is not re-run by theirs, nor through it is every
    later step of the cluster (a one-line HAProxy change used to replace 14 steps)."""
    plan = _plan_for("loadBalancer.advertIntSeconds", case_plans)
    assert {(e.name, e.action) for e in plan.effects} == {
        ("labs-k8s-lb01-lb-setup", "replace"),
        ("labs-k8s-lb02-lb-setup", "replace"),
    }


def test_a_rebuilt_template_leaves_the_nodes_alone(case_plans):
    plan = _plan_for("isoUrl", case_plans)
    assert [(e.name, e.action) for e in plan.effects] == [("golden-template", "replace")]


def test_a_node_replaced_after_a_template_rebuild_is_cloned_from_the_current_template(offline_run, lab_namespace):
    """The engine keeps an ignored input's old value on a replacement too (processIgnoreChanges):
    with `ignore_changes=["clone"]`, a node replaced after a rebuild would be cloned from the
    template the rebuild deleted, after its old VM was deleted (delete-before-replace)."""
    from components.tools.offline import run_program

    worker = "labs-k8s-w01"
    case = next(c for c in changes.CHANGE_CASES if "isoUrl" in c.title)
    case.change(lab_namespace)
    overrides = {f"labs-k8s:{k}": v for k, v in lab_namespace.items()}
    rebuild = plan_changes(offline_run, run_program("labs", overrides=overrides))
    assert rebuild.after is not None
    # What the engine records for the VM after the rebuild (its inputs, ignored paths kept old).
    vm = rebuild.after.by_name(worker)
    recorded = apply_ignore_changes(offline_run.by_name(worker).plain_inputs, vm.plain_inputs, vm.ignore_changes)
    assert recorded["clone"] == offline_run.by_name(worker).plain_inputs["clone"]  # the node was left alone

    lab_namespace["nodes"]["workers"]["hosts"][0]["ip"] = "10.3.60.64"
    overrides = {f"labs-k8s:{k}": v for k, v in lab_namespace.items()}
    move = plan_changes(rebuild.after, run_program("labs", overrides=overrides))
    assert move.after is not None
    effect = move.effect(worker)
    assert effect is not None and effect.action == "replace" and effect.delete_before_replace
    moved = move.after.by_name(worker)
    replacement = apply_ignore_changes(recorded, moved.plain_inputs, moved.ignore_changes)
    current = move.after.by_name("golden-template").plain_outputs["uuid"]
    assert current != recorded["clone"]["templateUuid"]
    assert replacement["clone"]["templateUuid"] == current


def test_a_run_that_cannot_be_rerun_plans_the_same(offline_run, case_plans):
    """A run read back from a document has no `rerun`: the by-hand correction gives the same plan."""
    case = next(c for c in changes.CHANGE_CASES if "ntpServers" in c.title)
    before, after = changes.case_runs(case, before=offline_run)
    after.rerun = None
    plan = plan_changes(before, after)
    assert plan.effects == case_plans[case.title].effects
    assert plan.steps == case_plans[case.title].steps
