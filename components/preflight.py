"""Preflight before anything is registered: the config's vSphere placement checked against vCenter.

`pulumi preview` in a pull request fails here, early and clearly, instead of half-way through
an `up`. The checks themselves (pyvmomi) live in components/vsphere/preflight.py; this module only turns
the lab config into a PreflightSpec and the report into a Pulumi error or warnings.
"""

from __future__ import annotations

import pulumi

from components import releases
from components.config import LabConfig, Role
from components.fleet import anti_affinity_rule_name
from components.rendering.template import template_vm_name
from components.stack_config import StackInputs


def preflight_spec(lab: LabConfig, stack: str) -> object:
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
        free_space_margin=lab.preflight.datastore_margin_percent / 100,
        node_cidr=str(lab.network.cidr),
    )


def release_findings(lab: LabConfig) -> list[releases.ReleaseFinding]:
    """Does kubernetes.version exist where the nodes install it from (labs-k8s:preflight.kubernetesPackagesUrl)?"""
    if not lab.preflight.kubernetes_packages_url:
        return []
    finding = releases.check_release(lab.kubernetes.version, lab.preflight.kubernetes_packages_url)
    return [finding] if finding else []


def run_preflight(inputs: StackInputs) -> None:
    lab = inputs.lab
    if not lab.preflight.enabled:
        pulumi.log.info("preflight: off (labs-k8s:preflight.enabled is false)")
        return
    from components import vsphere

    release = release_findings(lab)
    credentials = inputs.vcenter
    try:
        address = vsphere.parse_server(credentials.server)
        with vsphere.session(
            address.host, credentials.user, credentials.plain_password, port=address.port,
            insecure=credentials.allow_unverified_ssl,
        ) as si:
            report = vsphere.preflight(si, preflight_spec(lab, inputs.stack))
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
