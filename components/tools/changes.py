"""What `pulumi up` does after a config change, computed from the program itself.

Two runs of the real program under the mock engine (components/tools/offline.py), before and after a
change, go in; for every custom resource the effect comes out: created, deleted, updated (which
inputs; whether a VM power-cycles) or replaced (which inputs force it; delete-before-replace or
not), in the order the engine runs them. The rules are the real engine's and providers', not a
guess from the inputs alone:

- engine (pulumi/pulumi pkg/resource/deploy/step_generator.go): `ignoreChanges` resets the new
  inputs at those paths to the old values before anything is compared (`processIgnoreChanges`,
  which also holds on a replacement); `replaceOnChanges` turns a change at or below one of its
  property paths into a replacement (`applyReplaceOnChanges`, `PropertyPath.Contains`); a
  replaced resource gets a new id, so every resource whose inputs read its outputs sees those
  inputs change and is diffed again; a delete-before-replace replacement first deletes the
  dependents that this makes replace (`calculateDependentReplacements`); deletions of removed
  resources and of the old halves of create-before-delete replacements come last;
- providers, by type (`PROVIDER_RULES`): which inputs force a new resource (ForceNew or
  `replaceOnChanges` in the provider's schema) and, for vSphere VMs, which updates power-cycle
  the VM. The dynamic template provider's own `diff()` is called, unpickled from the inputs as
  the dynamic-provider host does.

API (stable; `python -m components diff` is built on it):

    plan = plan_changes(before, after)        # two OfflineRun from components.tools.offline.run_program
    plan.effects                              # list[Effect], in execution order
    plan.steps                                # list[Step]: the effects grouped as the engine runs them
    plan.after                                # the `after` run as the engine would record it
    plan.counts()                             # {"create": n, "update": n, "replace": n, "delete": n}
    render_steps(plan) -> str                 # a markdown table of the steps ("" when nothing changes)

    Effect: name, type, urn, action ("create" | "update" | "replace" | "delete"), inputs (the
            top-level inputs that change; for a replacement, first those that force it),
            delete_before_replace, reboots (a VM update that powers the VM off and on), cause
            (why: "inputs", or "replaced: <name>" when only a replaced dependency's outputs changed)

`CHANGE_CASES`, `case_plans()` and `change_table()` give the table in docs/runbook.md ("you change X -> ..."),
which tests/test_changes.py recomputes from the program. `python -m components.tools.changes` prints
it; `--write docs/runbook.md` puts it in place between its markers.
"""

from __future__ import annotations

import argparse
import base64
import copy
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pulumi.runtime import rpc

from components.tools.offline import REPO_ROOT, OfflineRun, Registration, _private_key_placeholder, run_program

PathPart = str | int
PropertyPath = tuple[PathPart, ...]

VM = "vsphere:index/virtualMachine:VirtualMachine"
ANTI_AFFINITY_RULE = "vsphere:index/computeClusterVmAntiAffinityRule:ComputeClusterVmAntiAffinityRule"
COMMAND = "command:remote:Command"
DYNAMIC = "pulumi-python:dynamic:Resource"
RANDOM_PASSWORD = "random:index/randomPassword:RandomPassword"
RANDOM_ID = "random:index/randomId:RandomId"

# --------------------------------------------------------------------------- property paths


def parse_property_path(text: str) -> PropertyPath:
    """Pulumi's property path syntax: `a.b[0]["c.d"]`, `*` as a wildcard element."""
    parts: list[PathPart] = []
    for match in re.finditer(r'\["((?:[^"\\]|\\.)*)"\]|\[(\d+)\]|\[\*\]|([^.\[\]]+)', text):
        quoted, index, plain = match.groups()
        if quoted is not None:
            parts.append(quoted.replace('\\"', '"'))
        elif index is not None:
            parts.append(int(index))
        elif plain is not None:
            parts.append(plain)
        else:
            parts.append("*")
    return tuple(parts)


def path_contains(outer: PropertyPath, inner: PropertyPath) -> bool:
    """Go's PropertyPath.Contains: `outer` is a prefix of `inner`, `*` matching any element."""
    if len(inner) < len(outer):
        return False
    return all(o == "*" or o == i for o, i in zip(outer, inner, strict=False))


def changed_paths(old: Any, new: Any, prefix: PropertyPath = ()) -> list[PropertyPath]:
    """Leaf paths where `new` differs from `old` (a list of another length counts as one change)."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        paths: list[PropertyPath] = []
        for key in sorted(set(old) | set(new)):
            if key not in old or key not in new:
                paths.append((*prefix, key))
            else:
                paths += changed_paths(old[key], new[key], (*prefix, key))
        return paths
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [p for i, (o, n) in enumerate(zip(old, new, strict=True)) for p in changed_paths(o, n, (*prefix, i))]
    return [] if old == new else [prefix]


def _reset(old: Any, new: Any, path: PropertyPath) -> Any:
    """`new` with the value at `path` put back to `old`'s (processIgnoreChanges' PropertyPath.Reset)."""
    if not path:
        return copy.deepcopy(old)
    head, rest = path[0], path[1:]
    if isinstance(new, dict) and isinstance(old, Mapping):
        keys = [k for k in new if head in ("*", k)] if head == "*" else [head]
        result = dict(new)
        for key in keys:
            if key in old and key in new:
                result[key] = _reset(old[key], new[key], rest)
            elif key in old and not rest:
                result[key] = copy.deepcopy(old[key])
            elif key in new and key not in old and not rest:
                del result[key]
        return result
    if isinstance(new, list) and isinstance(old, list):
        indexes = range(min(len(old), len(new))) if head == "*" else [head]
        result_list = list(new)
        for index in indexes:
            if isinstance(index, int) and index < len(old) and index < len(new):
                result_list[index] = _reset(old[index], new[index], rest)
        return result_list
    return new


def apply_ignore_changes(old: Mapping[str, Any], new: Mapping[str, Any], ignore: Iterable[str]) -> dict[str, Any]:
    result: Any = dict(new)
    for text in ignore:
        result = _reset(old, result, parse_property_path(text))
    return dict(result)


# --------------------------------------------------------------------------- provider rules


@dataclass(frozen=True)
class ProviderDiff:
    """What a provider says about one resource's change."""

    replaces: tuple[str, ...] = ()  # top-level inputs that force a new resource
    delete_before_replace: bool = False
    reboots: bool = False
    changes: bool = True  # False: the provider sees no change although inputs differ


def _top(paths: Iterable[PropertyPath]) -> list[str]:
    return sorted({str(p[0]) for p in paths if p})


# terraform-provider-vsphere's virtual_machine (the version pulumi-vsphere 4.18 wraps: v2.16.1 plus
# #2730/#2732; read at vmware/terraform-provider-vsphere@b45b5b41): ForceNew are `replace_trigger`,
# `datastore_path`, every `ovf_deploy` field, a network interface's `ovf_mapping`, and (CustomizeDiff)
# every changed key under `clone.0` but `clone.0.timeout` and `clone.0.customize.0.network_interface`.
_VM_FORCE_NEW_TOP = {"replaceTrigger", "datastorePath", "ovfDeploy"}
# Updates of these arguments set reboot_required (getWithRestart / getBoolWithRestart in
# virtual_machine_config_structure.go; hardware_version and pci_device_id in the resource).
_VM_REBOOT_KEYS = {
    "alternateGuestName",
    "cpuHotAddEnabled",
    "cpuHotRemoveEnabled",
    "cpuPerformanceCountersEnabled",
    "efiSecureBootEnabled",
    "enableDiskUuid",
    "enableLogging",
    "eptRviMode",
    "firmware",
    "guestId",
    "hvMode",
    "memoryHotAddEnabled",
    "nestedHvEnabled",
    "numCoresPerNumaNode",
    "numCoresPerSocket",
    "runToolsScriptsAfterPowerOn",
    "runToolsScriptsAfterResume",
    "runToolsScriptsBeforeGuestReboot",
    "runToolsScriptsBeforeGuestShutdown",
    "runToolsScriptsBeforeGuestStandby",
    "swapPlacementPolicy",
    "toolsUpgradePolicy",
    "vbsEnabled",
    "vvtdEnabled",
    "hardwareVersion",
    "pciDeviceIds",
}


def _vm_diff(
    reg: Registration, old: Mapping[str, Any], new: Mapping[str, Any], paths: list[PropertyPath]
) -> ProviderDiff:
    forced = set()
    for path in paths:
        head = str(path[0])
        # The SDK sends `clone` as one object: its fields sit right under it.
        clone_field = head == "clone" and path[1:2] != ("timeout",) and path[1:3] != ("customize", "networkInterfaces")
        ovf_mapping = head == "networkInterfaces" and path[2:3] == ("ovfMapping",)
        if head in _VM_FORCE_NEW_TOP or clone_field or ovf_mapping:
            forced.add(head)
    top = set(_top(paths))
    reboots = bool(top & _VM_REBOOT_KEYS)
    if "extraConfig" in top and new.get("extraConfigRebootRequired", True) is not False:
        reboots = True  # the provider's default: any extra_config change power-cycles the VM
    for key in ("numCpus", "memory"):  # no CPU/memory hot add on the clones: a change needs a power cycle
        if key in top:
            reboots = True
    return ProviderDiff(replaces=tuple(sorted(forced)), reboots=reboots)


def _anti_affinity_rule_diff(
    reg: Registration, old: Mapping[str, Any], new: Mapping[str, Any], paths: list[PropertyPath]
) -> ProviderDiff:
    # resource_vsphere_compute_cluster_vm_anti_affinity_rule.go: only compute_cluster_id is ForceNew.
    return ProviderDiff(replaces=tuple(k for k in _top(paths) if k == "computeClusterId"))


def _every_input_forces_new(
    reg: Registration, old: Mapping[str, Any], new: Mapping[str, Any], paths: list[PropertyPath]
) -> ProviderDiff:
    # terraform-provider-random: every attribute of random_password and random_id is RequiresReplace.
    return ProviderDiff(replaces=tuple(_top(paths)))


def _command_diff(
    reg: Registration, old: Mapping[str, Any], new: Mapping[str, Any], paths: list[PropertyPath]
) -> ProviderDiff:
    # pulumi-command 1.2.1 provider/pkg/provider/common/inputs.go: `triggers` is replaceOnChanges;
    # any other change is an update (which runs `update`, or `create` again when there is none).
    return ProviderDiff(replaces=tuple(k for k in _top(paths) if k == "triggers"))


def _dynamic_diff(
    reg: Registration, old: Mapping[str, Any], new: Mapping[str, Any], paths: list[PropertyPath]
) -> ProviderDiff:
    """The dynamic provider's own diff(), unpickled from `__provider` as `python -m pulumi.dynamic` does."""
    import dill

    serialized = rpc.deserialize_properties(reg.wire_inputs).get("__provider")
    if rpc.is_rpc_secret(serialized):  # the SDK marks it secret when a secret input is in the resource
        serialized = rpc.unwrap_rpc_secret(serialized)
    provider = dill.loads(base64.b64decode(serialized))
    result = provider.diff(reg.name, dict(old), dict(new))
    if result.changes is False:
        return ProviderDiff(changes=False)
    return ProviderDiff(replaces=tuple(result.replaces or ()), delete_before_replace=bool(result.delete_before_replace))


ProviderRule = Callable[[Registration, Mapping[str, Any], Mapping[str, Any], list[PropertyPath]], ProviderDiff]
PROVIDER_RULES: dict[str, ProviderRule] = {
    VM: _vm_diff,
    ANTI_AFFINITY_RULE: _anti_affinity_rule_diff,
    RANDOM_PASSWORD: _every_input_forces_new,
    RANDOM_ID: _every_input_forces_new,
    COMMAND: _command_diff,
    DYNAMIC: _dynamic_diff,
}


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Effect:
    name: str
    type: str
    urn: str
    action: str  # create | update | replace | delete
    inputs: tuple[str, ...] = ()
    delete_before_replace: bool = False
    reboots: bool = False
    cause: str = "inputs"


@dataclass(frozen=True)
class Step:
    """Resources the engine handles at the same point (in parallel, as far as the graph allows)."""

    order: int
    kind: str  # "delete first (replaced)", "create", "replace", "update", "update, power-cycles", "delete"
    names: tuple[str, ...]
    types: tuple[str, ...]
    inputs: tuple[str, ...]


@dataclass
class Plan:
    effects: list[Effect]
    steps: list[Step] = field(default_factory=list)
    # The `after` run as the engine would record it (resources left as they are keep their old
    # outputs): the `before` of the next change.
    after: OfflineRun | None = field(default=None, repr=False)

    def counts(self) -> dict[str, int]:
        counts = {"create": 0, "update": 0, "replace": 0, "delete": 0}
        for effect in self.effects:
            counts[effect.action] += 1
        return counts

    def effect(self, name: str) -> Effect | None:
        matches = [e for e in self.effects if e.name == name]
        return matches[0] if matches else None


def _custom(run: OfflineRun) -> dict[str, Registration]:
    return {urn: reg for urn, reg in run.registrations.items() if reg.custom}


def _topological(regs: Mapping[str, Registration]) -> list[str]:
    order: list[str] = []
    seen: set[str] = set()

    def visit(urn: str) -> None:
        if urn in seen:
            return
        seen.add(urn)
        for dep in regs[urn].dependencies:
            if dep in regs:
                visit(dep)
        order.append(urn)

    for urn in sorted(regs):
        visit(urn)
    return order


def _olds(reg: Registration) -> dict[str, Any]:
    """What the engine holds for a resource: its inputs and what its provider returned."""
    return {**reg.plain_inputs, **reg.plain_outputs}


def _decide(before: Registration, after: Registration, extra_changed: set[str]) -> Effect | None:
    old = before.plain_inputs
    new = apply_ignore_changes(old, after.plain_inputs, after.ignore_changes)
    paths = changed_paths(old, new) + [(key,) for key in sorted(extra_changed)]
    if not paths:
        return None
    rule = PROVIDER_RULES.get(after.type)
    if rule is None:
        raise ValueError(f"no provider rule for {after.type} ({after.name}): add one to components.tools.changes")
    provider_olds = _olds(before) if after.type == DYNAMIC else old
    verdict = rule(after, provider_olds, new, paths)
    if not verdict.changes:  # the provider's word, even when a renewed dependency fed it new values
        return None
    replace_paths = [parse_property_path(p) for p in after.replace_on_changes]
    forced = set(verdict.replaces) | {
        str(path[0]) for path in paths if any(path_contains(r, path) for r in replace_paths)
    }
    top = _top(paths)
    cause = "inputs" if not extra_changed or set(top) - extra_changed else "dependency"
    if forced:
        inputs = tuple(sorted(forced)) + tuple(k for k in top if k not in forced)
        dbr = after.delete_before_replace or verdict.delete_before_replace
        return Effect(after.name, after.type, after.urn, "replace", inputs, dbr, cause=cause)
    return Effect(after.name, after.type, after.urn, "update", tuple(top), reboots=verdict.reboots, cause=cause)


def plan_changes(before: OfflineRun, after: OfflineRun, forced: frozenset[str] = frozenset()) -> Plan:
    """The effect of going from `before` to `after` on every custom resource, in execution order.

    A resource the engine leaves as it is (a "same" step) keeps its old outputs even when its
    inputs changed (the CloneSource keeps the template of its creation), while the mock
    providers compute outputs from the new inputs. So when such a resource's outputs differ
    between the runs, `after` is run again with the old outputs kept for it (OfflineRun.rerun)
    until the plan settles. A run that cannot be re-run (one read back from a document) gets the
    same correction by hand: each input that reads only such resources takes its old value.
    `forced`: the names of resources `pulumi up --replace` replaces, whatever their inputs.
    """
    kept: dict[tuple[str, str], dict[str, Any]] = {}
    for _ in range(8):
        plan = _plan_once(before, after, forced)
        olds, news = _custom(before), _custom(after)
        touched = {e.urn for e in plan.effects}
        stale = {
            urn
            for urn in news
            if urn in olds and urn not in touched and olds[urn].plain_outputs != news[urn].plain_outputs
        }
        if not stale:
            plan.after = after
            return plan
        if after.rerun is not None:
            kept.update({(news[urn].type, news[urn].name): olds[urn].plain_outputs for urn in stale})
            after = after.rerun(kept)
        else:
            after = _keep_outputs(before, after, stale)
    raise RuntimeError("the plan did not settle after 8 runs of the program")


def _keep_outputs(before: OfflineRun, after: OfflineRun, kept: set[str]) -> OfflineRun:
    """`after` with the outputs of `kept` as in `before`, and every input that reads nothing but
    `kept` resources back to its old value (what a re-run with those outputs would register)."""
    registrations = dict(after.registrations)
    for urn, reg in after.registrations.items():
        old = before.registrations.get(urn)
        if old is None:
            continue
        patched = copy.copy(reg)
        patched.__dict__["plain_outputs"] = old.plain_outputs if urn in kept else reg.plain_outputs
        inputs = dict(reg.plain_inputs)
        for key, deps in reg.property_dependencies.items():
            if deps and set(deps) <= kept and key in old.plain_inputs:
                inputs[key] = old.plain_inputs[key]
        patched.__dict__["plain_inputs"] = inputs
        registrations[urn] = patched
    return OfflineRun(registrations, after.stack_outputs, after.calls, after.config, after.secret_keys)


def _plan_once(before: OfflineRun, after: OfflineRun, forced: frozenset[str] = frozenset()) -> Plan:
    olds, news = _custom(before), _custom(after)
    effects: dict[str, Effect] = {}
    renewed: set[str] = set()  # resources whose id and outputs are new: created or replaced
    for urn in _topological(news):
        reg = news[urn]
        if urn not in olds:
            effects[urn] = Effect(reg.name, reg.type, urn, "create")
            renewed.add(urn)
            continue
        ignored = [parse_property_path(p) for p in reg.ignore_changes]
        # A renewed dependency changes the inputs that read its outputs, unless they are ignored.
        extra = {
            key
            for key, deps in reg.property_dependencies.items()
            if set(deps) & renewed and not any(path_contains(i, (key,)) for i in ignored)
        }
        effect = _decide(olds[urn], reg, extra)
        if reg.name in forced:  # `--replace`: new outputs, whatever the inputs
            effect = Effect(reg.name, reg.type, urn, "replace", ("--replace",), reg.delete_before_replace)
        if effect is None:
            continue
        if effect.cause == "dependency":
            culprits = sorted(news[d].name for deps in reg.property_dependencies.values() for d in deps if d in renewed)
            effect = Effect(**{**effect.__dict__, "cause": "replaced: " + ", ".join(dict.fromkeys(culprits))})
        effects[urn] = effect
        if effect.action == "replace":
            renewed.add(urn)
    for urn in reversed(_topological(olds)):
        if urn not in news:
            reg = olds[urn]
            effects[urn] = Effect(reg.name, reg.type, urn, "delete")
    plan = Plan(effects=[])
    plan.steps, plan.effects = _schedule(effects, olds, news)
    return plan


def _levels(regs: Mapping[str, Registration], members: set[str], reverse: bool = False) -> dict[str, int]:
    """1-based level of each member: after every member it depends on (before, when `reverse`)."""
    order = _topological(regs)
    level: dict[str, int] = {}
    if not reverse:
        for urn in order:
            deps = [level[d] for d in regs[urn].dependencies if d in level]
            level[urn] = max(deps, default=0) + (1 if urn in members else 0)
    else:
        dependents: dict[str, list[str]] = {u: [] for u in regs}
        for urn in regs:
            for dep in regs[urn].dependencies:
                if dep in dependents:
                    dependents[dep].append(urn)
        for urn in reversed(order):
            after = [level[d] for d in dependents[urn] if d in level]
            level[urn] = max(after, default=0) + (1 if urn in members else 0)
    return {urn: lvl for urn, lvl in level.items() if urn in members}


def _delete_first_set(effects: Mapping[str, Effect], news: Mapping[str, Registration]) -> set[str]:
    """Delete-before-replace replacements and the replacements they cause downstream."""
    first = {urn for urn, e in effects.items() if e.action == "replace" and e.delete_before_replace}
    changed = True
    while changed:
        changed = False
        for urn, effect in effects.items():
            if urn in first or effect.action != "replace" or urn not in news:
                continue
            if any(set(deps) & first for deps in news[urn].property_dependencies.values()):
                first.add(urn)
                changed = True
    return first


def _cascade_roots(
    delete_first: set[str], effects: Mapping[str, Effect], news: Mapping[str, Registration]
) -> dict[str, set[str]]:
    """For each member of the delete-first set, the delete-before-replace roots it is deleted for."""
    roots = {u for u in delete_first if effects[u].delete_before_replace}
    dependents: dict[str, set[str]] = {u: set() for u in news}
    for urn, reg in news.items():
        for deps in reg.property_dependencies.values():
            for dep in deps:
                if dep in dependents:
                    dependents[dep].add(urn)
    owner: dict[str, set[str]] = {u: set() for u in delete_first}
    for root in roots:
        todo, seen = [root], {root}
        while todo:
            urn = todo.pop()
            owner[urn].add(root)
            for nxt in dependents.get(urn, ()):
                if nxt in delete_first and nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
    return owner


def _schedule(
    effects: Mapping[str, Effect], olds: Mapping[str, Registration], news: Mapping[str, Registration]
) -> tuple[list[Step], list[Effect]]:
    """Order the effects as the engine runs them, as steps numbered from 1.

    Forward steps (create, update, replace) follow the new graph: a resource after everything it
    depends on. A delete-before-replace replacement deletes itself and the dependents it renews
    when the engine reaches it, so right before its own creation, dependents first. Deletions of
    removed resources follow, dependents first, and the old halves of create-before-delete
    replacements come last.
    """
    delete_first = _delete_first_set(effects, news)
    forward = {u for u, e in effects.items() if e.action in ("create", "update", "replace")}
    forward_levels = _levels(news, forward)
    last_forward = max(forward_levels.values(), default=0)
    keyed: list[tuple[tuple[int, int, int], str, Effect]] = []
    owners = _cascade_roots(delete_first, effects, news)
    cascade_levels = _levels(olds, delete_first, reverse=True)  # 1: nothing in the set depends on it
    for urn in delete_first:
        at = min(forward_levels[root] for root in owners[urn])
        keyed.append(((at, 0, cascade_levels[urn]), "delete first (replaced)", effects[urn]))
    for urn, lvl in forward_levels.items():
        effect = effects[urn]
        if effect.action == "replace":
            kind = "create replacement" if urn in delete_first else "replace"
        elif effect.action == "update":
            kind = "update, power-cycles" if effect.reboots else "update"
        else:
            kind = "create"
        keyed.append(((lvl, 1, 0), kind, effect))
    removed = {u for u, e in effects.items() if e.action == "delete"}
    for urn, lvl in _levels(olds, removed, reverse=True).items():
        keyed.append(((last_forward + 1, 2, lvl), "delete", effects[urn]))
    # Only a step with a `delete` command does anything when its old half goes.
    for urn, effect in effects.items():
        if effect.action == "replace" and urn not in delete_first:
            keyed.append(((last_forward + 2, 3, 0), "delete the replaced ones", effect))
    keyed.sort(key=lambda row: (row[0], row[1], row[2].name))
    number = {key: index for index, key in enumerate(dict.fromkeys(k for k, _, _ in keyed), start=1)}
    grouped: dict[tuple[int, str, tuple[str, ...]], list[Effect]] = {}
    for key, kind, effect in keyed:
        inputs = () if kind.startswith("delete") else effect.inputs
        grouped.setdefault((number[key], kind, inputs), []).append(effect)
    steps = [
        Step(order, kind, tuple(e.name for e in group), tuple(dict.fromkeys(e.type for e in group)), inputs)
        for (order, kind, inputs), group in grouped.items()
    ]
    ordered = list(dict.fromkeys(effect.urn for _, _, effect in keyed))
    return steps, [effects[urn] for urn in ordered]


# --------------------------------------------------------------------------- rendering

_SHORT_TYPES = {
    VM: "VM",
    ANTI_AFFINITY_RULE: "DRS rule",
    COMMAND: "step",
    DYNAMIC: "dynamic resource",
    RANDOM_PASSWORD: "random password",
    RANDOM_ID: "random id",
}


def render_steps(plan: Plan) -> str:
    """A markdown table of the plan's steps; "" when nothing changes."""
    if not plan.steps:
        return ""
    lines = ["| # | what happens | resources | inputs that change |", "|---|---|---|---|"]
    for step in plan.steps:
        kinds = ", ".join(_SHORT_TYPES.get(t, t) for t in step.types)
        names = ", ".join(f"`{n}`" for n in step.names)
        inputs = ", ".join(f"`{i}`" for i in step.inputs) or "—"
        lines.append(f"| {step.order} | {step.kind} | {kinds}: {names} | {inputs} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- the runbook table


@dataclass(frozen=True)
class ChangeCase:
    """One config change of the runbook table: `change(namespace)` edits the `labs-k8s:` keys."""

    title: str
    change: Callable[[dict[str, Any]], None]
    overrides: Mapping[str, Any] = field(default_factory=dict)  # other config keys, e.g. secrets
    # What a resource `pulumi up --replace`d answers this time: (type, name) -> `before` outputs -> new.
    replaced: Mapping[tuple[str, str], Callable[[Mapping[str, Any]], Mapping[str, Any]]] = field(default_factory=dict)


def _hosts(ns: dict[str, Any], role: str) -> list[dict[str, Any]]:
    hosts: list[dict[str, Any]] = ns["nodes"][role]["hosts"]
    return hosts


def _set(section: str, **values: Any) -> Callable[[dict[str, Any]], None]:
    def change(ns: dict[str, Any]) -> None:
        ns[section] = {**ns.get(section, {}), **values}

    return change


def _add_worker(ns: dict[str, Any]) -> None:
    _hosts(ns, "workers").append({"name": "labs-k8s-w03", "ip": "10.3.60.57"})


def _remove_worker(ns: dict[str, Any]) -> None:
    _hosts(ns, "workers").pop()
    # The example has two: one left needs the opt-in (components/config.py, domain_problems); it renders nothing.
    ns["kubernetes"]["allowSingleWorker"] = True


def _move_worker(ns: dict[str, Any]) -> None:
    _hosts(ns, "workers")[0]["ip"] = "10.3.60.64"


def _grow_workers(ns: dict[str, Any]) -> None:
    ns["nodes"]["workers"]["memoryMib"] = 8192


def _bigger_data_disks(ns: dict[str, Any]) -> None:
    ns["nodes"]["workers"]["dataDiskGib"] = ns["nodes"]["workers"].get("dataDiskGib", 0) + 10


def _new_debian(ns: dict[str, Any]) -> None:
    ns["template"] = {
        **ns["template"],
        "isoUrl": ns["template"]["isoUrl"].replace("12.12.0", "12.13.0"),
        "isoSha256": "0" * 64,
    }


def _next_public_key() -> str:
    from components.tools.offline import PLACEHOLDER_PUBLIC_KEY

    kind, body, _ = PLACEHOLDER_PUBLIC_KEY.split(" ", 2)
    blob = bytearray(base64.b64decode(body))
    blob[-1] ^= 1  # another well-formed ed25519 key
    return f"{kind} {base64.b64encode(bytes(blob)).decode()} rotated"


def _trust_next_key(ns: dict[str, Any]) -> None:
    ns["ssh"] = {**ns["ssh"], "extraPublicKeys": [_next_public_key()]}


def _swap_to_next_key(ns: dict[str, Any]) -> None:
    ns["ssh"] = {**ns["ssh"], "publicKey": _next_public_key(), "extraPublicKeys": []}


def _new_seed(outputs: Mapping[str, Any]) -> Mapping[str, Any]:
    """A replaced RandomId's answer: another seed."""
    return {**outputs, "hex": "".join("0123456789abcdef"[(int(c, 16) + 1) % 16] for c in outputs["hex"])}


# Another private key in form (offline runs carry no real key): what the steps' connection holds.
_ROTATED_PRIVATE_KEY = _private_key_placeholder(" (rotated)")

CHANGE_CASES: tuple[ChangeCase, ...] = (
    ChangeCase("Nothing changed (a second `up`)", lambda ns: None),
    ChangeCase("`ssh.extraPublicKeys` (the first `up` of a key rotation)", _trust_next_key),
    ChangeCase(
        "`ssh.publicKey` + `sshPrivateKey` (the second `up` of a key rotation)",
        _swap_to_next_key,
        {"labs-k8s:sshPrivateKey": _ROTATED_PRIVATE_KEY},
    ),
    # The login is read at each call and is in no resource's inputs; the runbook's "Rotating the
    # vCenter password" says why one `up` still matters: refresh and destroy use the provider
    # config recorded at the last `up` (providers/registry.go Registry.Same; #18740 reverted by #18756).
    ChangeCase(
        "`vsphere:password` (a vCenter password rotation)",
        lambda ns: None,
        {"vsphere:password": "a-rotated-vcenter-password"},
    ),
    # docs/cluster.md "Host identity": the new key goes in over a session pinned to the old one.
    ChangeCase(
        "`pulumi up --replace` of `labs-k8s-w01-host-key-seed` (a host key rotation)",
        lambda ns: None,
        replaced={("random:index/randomId:RandomId", "labs-k8s-w01-host-key-seed"): _new_seed},
    ),
    # The control planes' shared key on VIP:2222: each control plane installs it over its own pin;
    # every step through the VIP is ordered after all of them (remote.HostPins.cluster_presented).
    ChangeCase(
        "`pulumi up --replace` of `control-plane-host-key-seed` (the VIP's shared host key)",
        lambda ns: None,
        replaced={("random:index/randomId:RandomId", "control-plane-host-key-seed"): _new_seed},
    ),
    ChangeCase("`network.ntpServers`", _set("network", ntpServers=["ntp1.labs.local"])),
    ChangeCase("`network.dnsServers`", _set("network", dnsServers=["10.3.60.2"])),
    ChangeCase("`loadBalancer.advertIntSeconds` (a balancer setting)", _set("loadBalancer", advertIntSeconds=2)),
    ChangeCase("`nodes.workers.memoryMib`", _grow_workers),
    ChangeCase("`nodes.workers.dataDiskGib`", _bigger_data_disks),
    ChangeCase("A worker's address (`nodes.workers.hosts[0].ip`)", _move_worker),
    ChangeCase("A worker added to `nodes.workers.hosts`", _add_worker),
    ChangeCase("A worker removed from `nodes.workers.hosts`", _remove_worker),
    ChangeCase("`antiAffinity.workers` (`preferred` → `mandatory`)", _set("antiAffinity", workers="mandatory")),
    ChangeCase("`template.isoUrl` + `isoSha256` (a new Debian point release)", _new_debian),
    ChangeCase("`kubernetes.version` (a patch release)", _set("kubernetes", version="1.36.1")),
    ChangeCase("`kubernetes.containerdVersion` (a new containerd pin)", _set("kubernetes", containerdVersion="2.1.5")),
)

TABLE_BEGIN = "<!-- change-table:begin (generated by `python -m components.tools.changes`; tests/test_changes.py) -->"
TABLE_END = "<!-- change-table:end -->"


def _namespace(stack: str) -> dict[str, Any]:
    import json

    from components.config import NAMESPACE
    from components.tools.offline import stack_config

    config, _ = stack_config(stack)
    prefix = f"{NAMESPACE}:"
    return {
        key[len(prefix) :]: json.loads(value) if value[:1] in "{[" else value
        for key, value in config.items()
        if key.startswith(prefix) and key != f"{prefix}sshPrivateKey"
    }


def case_runs(case: ChangeCase, stack: str = "labs", before: OfflineRun | None = None) -> tuple[OfflineRun, OfflineRun]:
    """The program before (the committed stack file) and after `case`'s change, under the mock engine.
    The run after reads the run before as its previous state, as the engine's checkpoint would give it
    (what the program decides from it: an upgrade chain, a refresh due, a kubeconfig to re-export)."""
    before = before or run_program(stack)
    namespace = _namespace(stack)
    case.change(namespace)
    overrides = {f"labs-k8s:{key}": value for key, value in namespace.items()}
    answers = {key: dict(new(before.by_name(key[1]).plain_outputs)) for key, new in case.replaced.items()}
    return before, run_program(
        stack, overrides={**overrides, **case.overrides}, previous=before.previous_state(), kept=answers or None
    )


def summary(plan: Plan) -> str:
    """ "2 replaced, 1 updated" or "no change"."""
    words = {"create": "created", "update": "updated", "replace": "replaced", "delete": "deleted"}
    return ", ".join(f"{n} {words[action]}" for action, n in plan.counts().items() if n) or "no change"


def case_plans(stack: str = "labs", cases: Iterable[ChangeCase] = CHANGE_CASES) -> list[tuple[ChangeCase, Plan]]:
    """Every case's plan, computed from the program (one `before` run shared by all)."""
    before = run_program(stack)
    return [
        (case, plan_changes(*case_runs(case, stack, before), forced=frozenset(name for _, name in case.replaced)))
        for case in cases
    ]


def render_table(plans: Iterable[tuple[ChangeCase, Plan]]) -> str:
    parts = []
    for case, plan in plans:
        parts.append(f"#### {case.title} → {summary(plan)}\n")
        parts.append(render_steps(plan) or "Nothing is created, updated, replaced or deleted; nothing reboots.\n")
    return "\n".join(parts)


def change_table(stack: str = "labs", cases: Iterable[ChangeCase] = CHANGE_CASES) -> str:
    """The runbook's "you change X -> these resources ..." section, computed from the program."""
    return render_table(case_plans(stack, cases))


def write_table(path: Path, table: str) -> bool:
    """Put `table` between the markers in `path`; True when the file changed."""
    text = path.read_text()
    if TABLE_BEGIN not in text or TABLE_END not in text:
        raise ValueError(f"{path} has no {TABLE_BEGIN!r} ... {TABLE_END!r} markers")
    head, rest = text.split(TABLE_BEGIN, 1)
    _, tail = rest.split(TABLE_END, 1)
    updated = f"{head}{TABLE_BEGIN}\n{table}{TABLE_END}{tail}"
    if updated != text:
        path.write_text(updated)
        return True
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m components.tools.changes", description=__doc__.splitlines()[0])
    parser.add_argument("--stack", default="labs")
    parser.add_argument("--write", type=Path, help="put the table in this file, between its markers")
    args = parser.parse_args(argv)
    table = change_table(args.stack)
    if args.write:
        changed = write_table(args.write if args.write.is_absolute() else REPO_ROOT / args.write, table)
        print(f"{args.write}: {'updated' if changed else 'already up to date'}")
    else:
        sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
