"""Preflight before anything is registered: the config's vSphere placement checked against vCenter.

`pulumi preview` in a pull request fails here, early and clearly, instead of half-way through
an `up`. The checks themselves (pyvmomi) live in components/vsphere/preflight.py; this module only turns
the lab config into a PreflightSpec and the report into a Pulumi error or warnings.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import pulumi

from components import releases
from components.config import LabConfig, Role
from components.fleet import PROJECT, anti_affinity_rule_name
from components.previous_state import PreviousState
from components.rendering.template import template_vm_name
from components.stack_config import StackInputs

if TYPE_CHECKING:  # imported where used: pyVmomi loads only when preflight runs
    from components.vsphere import PreflightSpec


def state_uuids(lab: LabConfig, previous: PreviousState | None) -> dict[str, str] | None:
    """Node name -> the UUID its VM has in the stack's state ("" when the state has no such VM);
    None when the state is unknown. A VM resource without a uuid output is left out (unknown)."""
    if previous is None or not previous.available:
        return None
    uuids: dict[str, str] = {}
    for node in lab.all_nodes:
        outputs = previous.resources.get(node.name)
        if outputs is None:
            uuids[node.name] = ""
        elif outputs.get("uuid"):
            uuids[node.name] = str(outputs["uuid"])
    return uuids


def vms_to_create(lab: LabConfig, previous: PreviousState | None) -> list[str] | None:
    """Names of the nodes whose VM the state lacks, so this run clones them; None when unknown."""
    if previous is None or not previous.available:
        return None
    return [node.name for node in lab.all_nodes if node.name not in previous.resources]


def clone_sources(lab: LabConfig, stack: str, previous: PreviousState | None) -> dict[str, tuple[str, str]]:
    """Nodes this run clones (no VM in the state) whose clone source stays (same identity):
    node -> (the template UUID that source keeps, its URN for `pulumi up --replace`)."""
    from components.rendering.node import instance_id

    created = vms_to_create(lab, previous) or []
    found: dict[str, tuple[str, str]] = {}
    for node in lab.all_nodes:
        source = (previous.resources.get(f"{node.name}-clone-source") if previous else None) or {}
        if node.name in created and source.get("template") and source.get("identity") == instance_id(lab, node):
            found[node.name] = (str(source["template"]), clone_source_urn(stack, node.name))
    return found


def clone_source_urn(stack: str, node: str) -> str:
    """The URN of a node's clone source (components/fleet.py: NodeFleet under Lab)."""
    return (
        f"urn:pulumi:{stack}::{PROJECT}::labs-k8s:lab:Lab$labs-k8s:fleet:NodeFleet$pulumi-python:dynamic:"
        f"Resource::{node}-clone-source"
    )


def preflight_spec(lab: LabConfig, stack: str, previous: PreviousState | None = None) -> PreflightSpec:
    from components import vsphere

    rules = tuple(
        vsphere.AntiAffinityRule(
            name=anti_affinity_rule_name(stack, role),
            vm_names=tuple(node.name for node in lab.nodes_of(role)),
            mandatory=lab.anti_affinity.for_role(role) == "mandatory",
        )
        for role in Role
        if lab.anti_affinity.for_role(role) != "off" and len(lab.nodes_of(role)) > 1
    )
    nodes = tuple(
        vsphere.PlannedVm(
            name=node.name,
            ip_addresses=(str(node.ip),),
            disk_gib=(lab.template.disk_gib, node.data_disk_gib) if node.data_disk_gib else (lab.template.disk_gib,),
            memory_mib=node.memory_mib,
        )
        for node in lab.all_nodes
    )
    # The golden template: its disk, and its builder VM's swap while the installer runs.
    template = vsphere.PlannedVm(
        name=template_vm_name(lab, stack),
        ip_addresses=(str(lab.template.build_ip),) if lab.template.build_ip else (),
        disk_gib=(lab.template.disk_gib,),
        memory_mib=lab.template.memory_mib,
    )
    vms = (template, *nodes)
    return vsphere.PreflightSpec(
        datacenter=lab.vsphere.datacenter,
        cluster=lab.vsphere.compute_cluster,
        datastore=lab.vsphere.datastore,
        network=lab.vsphere.network,
        vm_folder=lab.vsphere.folder,
        resource_pool=lab.vsphere.resource_pool,
        stack=stack,
        vms=vms,
        extra_ips=(str(lab.load_balancer.vip),),
        anti_affinity_rules=rules,
        drs_required=lab.preflight.drs_disabled == "fail",
        state_uuids=state_uuids(lab, previous),
        clone_sources=clone_sources(lab, stack, previous),
        free_space_margin=lab.preflight.datastore_margin_percent / 100,
        node_cidr=str(lab.network.cidr),
    )


def vcenter_session(inputs: StackInputs) -> AbstractContextManager[Any]:
    """A pyvmomi session with the stack's vCenter login (VSphereError when it is refused)."""
    from components import vsphere

    credentials = inputs.vcenter
    address = vsphere.parse_server(credentials.server)
    return vsphere.session(
        address.host,
        credentials.user,
        credentials.plain_password,
        port=address.port,
        insecure=credentials.allow_unverified_ssl,
    )


def release_findings(lab: LabConfig) -> list[releases.ReleaseFinding]:
    """Does kubernetes.version exist where the nodes install it from (labs-k8s:preflight.kubernetesPackagesUrl,
    by default labs-k8s:mirrors.kubernetesRepository.url)?"""
    if not lab.release_check_url:
        return []
    finding = releases.check_release(lab.kubernetes.version, lab.release_check_url)
    return [finding] if finding else []


def run_preflight(inputs: StackInputs, previous: PreviousState | None = None) -> None:
    lab = inputs.lab
    if not lab.preflight.enabled:
        pulumi.log.info("preflight: off (labs-k8s:preflight.enabled is false)")
        return
    from components import vsphere

    release = release_findings(lab)
    try:
        with vcenter_session(inputs) as si:
            report = vsphere.preflight(si, preflight_spec(lab, inputs.stack, previous))
    except vsphere.VSphereError as error:
        also = "".join(f"\n{'ERROR' if f.error else 'WARNING'} [kubernetes] {f.message}" for f in release)
        raise pulumi.RunError(f"preflight could not check vCenter: {error}{also}") from None
    for finding in release:
        (report.error if finding.error else report.warn)("kubernetes", finding.message)
    for note in report.notes:
        pulumi.log.info(f"preflight: {note}")
    if report.existing_vms:
        pulumi.log.info(
            f"preflight: {len(report.existing_vms)} of the stack's VMs exist already; the datastore check "
            "counts only what is still to be created"
        )
    for warning in report.warnings:
        pulumi.log.warn(f"preflight: {warning}")
    if not report.ok:
        raise pulumi.RunError(
            report.render()
            + "\nNothing was created. Fix the above, or turn preflight off with labs-k8s:preflight.enabled: false."
        )


def check_rules_after_up(inputs: StackInputs, rule_ids: list[pulumi.Output[str]]) -> None:
    """Once this `up` has made (or kept) its anti-affinity rules: do they hold? A warning per
    violated rule, naming its VMs and their host.

    The rules need the VMs' ids, so the VMs are placed first; a DRS that is not fully automated
    never moves them apart afterwards (preflight warns about that too). Runs in an apply on the
    rules' ids, so after their steps; not in a preview (the ids are unknown) and not with
    preflight off (the offline render and the mock-engine tests).
    """
    lab = inputs.lab
    if not lab.preflight.enabled or not rule_ids or pulumi.runtime.is_dry_run():
        return
    names = {
        anti_affinity_rule_name(inputs.stack, role)
        for role in Role
        if lab.anti_affinity.for_role(role) != "off" and len(lab.nodes_of(role)) > 1
    }

    def check(_ids: list[str]) -> None:
        from components import vsphere

        try:
            with vcenter_session(inputs) as si:
                violations = vsphere.check_rules(si, lab.vsphere.datacenter, lab.vsphere.compute_cluster, names)
        except vsphere.VSphereError as error:
            pulumi.log.warn(f"after up: could not check the anti-affinity rules: {error}")
            return
        for violation in violations:
            pulumi.log.warn(f"after up: {violation}")

    pulumi.Output.all(*rule_ids).apply(check)
