"""Layer 2: the seven VMs (full clones of the golden template) and their DRS anti-affinity rules."""

from __future__ import annotations

import pulumi
import pulumi_random as random
import pulumi_vsphere as vsphere
from pulumi_command import remote

from components import remote as steps
from components import vsphere as vsphere_api
from components.clone_source import CloneSource
from components.clone_timing import clone_timeout_minutes
from components.config import LabConfig, Node, Role
from components.rendering import node as node_rendering
from components.rendering import read_file, sealed

# Host time sync fully off: NTP (timesyncd) keeps time, and etcd hates a clock stepped under it.
# sync_time_with_host*=False only stops the periodic sync (tools.syncTime, and on vSphere 7.0.1+
# syncTimeWithHostAllowed); VMware Tools still steps the clock once on these events unless
# their keys are off: VMware KB 1189 "Disabling Time Synchronization" and the VMware Tools
# documentation "Disable Time Synchronization" (set these .vmx options to FALSE). Written as
# "FALSE", the spelling vSphere itself uses, so what vCenter reports back equals what we set.
HOST_TIME_SYNC_OFF = {
    "time.synchronize.continue": "FALSE",  # after a snapshot or another stun of the VM (vMotion)
    "time.synchronize.restore": "FALSE",  # after reverting to a snapshot
    "time.synchronize.resume.disk": "FALSE",  # after resuming from suspend
    "time.synchronize.resume.host": "FALSE",  # after the host resumes
    "time.synchronize.shrink": "FALSE",  # after shrinking a disk
    "time.synchronize.tools.startup": "FALSE",  # when VMware Tools starts (every boot)
    "time.synchronize.tools.enable": "FALSE",  # when VMware Tools is enabled
}
# How long the readiness script waits for cloud-init once SSH answers; the SSH dials before that
# are bounded by remote.BOOT_DIAL_ATTEMPTS.
READINESS_TIMEOUT_SECONDS = 900
ROLE_RULE_NAMES = {Role.BALANCER: "balancers", Role.CONTROL_PLANE: "control-planes", Role.WORKER: "workers"}


PROJECT = "labs-k8s"  # Pulumi.yaml's name


def resource_pool_path(lab: LabConfig) -> str:
    """labs-k8s:vsphere.resourcePool as the provider's finder wants it: <cluster>/Resources/<pool>."""
    return f"{lab.vsphere.compute_cluster.strip('/')}/Resources/{(lab.vsphere.resource_pool or '').strip('/')}"


def anti_affinity_rule_name(stack: str, role: Role) -> str:
    """Carries the stack name, so two labs in one vSphere cluster do not collide."""
    return f"{PROJECT}-{stack}-{ROLE_RULE_NAMES[role]}"


def ownership_annotation(stack: str) -> str:
    """Written on every VM: preflight tells this stack's VMs from anyone else's by it."""
    return f"Managed by Pulumi: {PROJECT}/{stack}. Changes made in vCenter are overwritten."


class NodeFleet(pulumi.ComponentResource):
    """Clones, readiness and anti-affinity for every node of the lab."""

    vms: dict[str, vsphere.VirtualMachine]
    ready: dict[str, remote.Command]
    node_keys: dict[str, pulumi.Output[str]]

    def __init__(
        self,
        name: str,
        lab: LabConfig,
        template_uuid: pulumi.Input[str],
        template_guest_id: pulumi.Input[str],
        private_key: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("labs-k8s:fleet:NodeFleet", name, None, opts)
        invoke = pulumi.InvokeOptions(parent=self)
        datacenter = vsphere.get_datacenter_output(name=lab.vsphere.datacenter, opts=invoke)
        cluster = vsphere.get_compute_cluster_output(
            name=lab.vsphere.compute_cluster, datacenter_id=datacenter.id, opts=invoke
        )
        datastore = vsphere.get_datastore_output(name=lab.vsphere.datastore, datacenter_id=datacenter.id, opts=invoke)
        network = vsphere.get_network_output(name=lab.vsphere.network, datacenter_id=datacenter.id, opts=invoke)
        if lab.vsphere.resource_pool:
            # One meaning for labs-k8s:vsphere.resourcePool: a path below the cluster's root pool,
            # as the template builder resolves it (vsphere/inventory.py find_resource_pool). The
            # provider's finder takes a path relative to the datacenter's host folder
            # (resourcepool.FromPathOrDefault -> govmomi find.Finder.ResourcePool), so the
            # cluster's path and its root pool ("Resources") go in front; a bare pool name there
            # would be searched in every cluster of the datacenter.
            pool_id = vsphere.get_resource_pool_output(
                name=resource_pool_path(lab), datacenter_id=datacenter.id, opts=invoke
            ).id
        else:
            pool_id = cluster.resource_pool_id

        self.vms = {}
        self.ready = {}
        wait_script = read_file("fleet/wait-for-cloud-init.sh")
        boot_dials = steps.dial_budget_seconds(steps.BOOT_DIAL_ATTEMPTS)
        self.settings: dict[str, remote.Command] = {}
        remote_steps = steps.RemoteSteps(lab, private_key, self)
        self.node_keys = {}
        for node in lab.all_nodes:
            identity = node_rendering.instance_id(lab, node)
            source = CloneSource(
                f"{node.name}-clone-source",
                node.name,
                identity,
                template_uuid,
                template_guest_id,
                opts=pulumi.ResourceOptions(parent=self),
            )
            # The node's proof of identity for the steps that carry secrets (rendering/sealed.py):
            # generated once per stack, kept in state as a secret, reaching the VM only through
            # vCenter (its guestinfo), never over the node network that an impostor could answer on.
            node_key = random.RandomPassword(
                f"{node.name}-node-key",
                length=sealed.NODE_KEY_LENGTH,
                special=False,
                opts=pulumi.ResourceOptions(parent=self),
            )
            self.node_keys[node.name] = pulumi.Output.secret(node_key.result)
            vm = self._clone(lab, node, source, identity, pool_id, datastore.id, network.id, self.node_keys[node.name])
            self.vms[node.name] = vm
            self.ready[node.name] = remote_steps.on_node(
                f"{node.name}-ready",
                node,
                steps.Script(
                    lambda: {"wait-for-cloud-init.sh": wait_script},
                    "wait-for-cloud-init.sh",
                    args=(str(READINESS_TIMEOUT_SECONDS), node.name),
                ),
                # The host is the static IP from config, not a VM output, so order explicitly.
                after=[vm],
                dial_attempts=steps.BOOT_DIAL_ATTEMPTS,
                timeout=f"{(READINESS_TIMEOUT_SECONDS + boot_dials) // 60 + 5}m",
            )
            # What changes without a new VM (SSH keys, NTP, DNS, apt proxy) reaches the running
            # node here. Nothing depends on it: re-running it re-runs nothing else.
            self.settings[node.name] = remote_steps.on_node(
                f"{node.name}-node-settings",
                node,
                steps.Script(
                    lambda node=node: node_rendering.node_settings_files(lab, node),
                    node_rendering.SETTINGS_ENTRYPOINT,
                    args=(lab.ssh.user, node_rendering.interface_name(lab)),
                ),
                after=[self.ready[node.name]],
                timeout="10m",
            )

        self.rules: dict[Role, vsphere.ComputeClusterVmAntiAffinityRule] = {}
        for role in Role:
            policy = lab.anti_affinity.for_role(role)
            members = [self.vms[n.name] for n in lab.nodes_of(role)]
            if policy == "off" or len(members) < 2:
                continue
            self.rules[role] = vsphere.ComputeClusterVmAntiAffinityRule(
                f"{ROLE_RULE_NAMES[role]}-anti-affinity",
                name=anti_affinity_rule_name(pulumi.get_stack(), role),
                compute_cluster_id=cluster.id,
                virtual_machine_ids=[vm.id for vm in members],
                mandatory=policy == "mandatory",
                enabled=True,
                opts=pulumi.ResourceOptions(
                    parent=self,
                    # A rule follows its members: a replaced VM gets a new id, and the rule is remade.
                    replace_on_changes=["virtualMachineIds"],
                    delete_before_replace=True,
                ),
            )
        self.register_outputs(
            {
                "vmIds": {name: vm.id for name, vm in self.vms.items()},
                "ruleNames": [rule.name for rule in self.rules.values()],
            }
        )

    def _clone(
        self,
        lab: LabConfig,
        node: Node,
        source: CloneSource,
        identity: str,
        pool_id: pulumi.Input[str],
        datastore_id: pulumi.Input[str],
        network_id: pulumi.Input[str],
        node_key: pulumi.Output[str],
    ) -> vsphere.VirtualMachine:
        # The OS disk is exactly the template's: a clone's grown disk comes out lazy-zeroed
        # (terraform-provider-vsphere #2123). Extra room goes on a separate eager-zeroed disk.
        disks = [
            vsphere.VirtualMachineDiskArgs(
                label="os", unit_number=0, size=lab.template.disk_gib, eagerly_scrub=True, thin_provisioned=False
            )
        ]
        if node.data_disk_gib:
            disks.append(
                vsphere.VirtualMachineDiskArgs(
                    label="data", unit_number=1, size=node.data_disk_gib, eagerly_scrub=True, thin_provisioned=False
                )
            )
        return vsphere.VirtualMachine(
            node.name,
            name=node.name,
            folder=lab.vsphere.folder,
            resource_pool_id=pool_id,
            datastore_id=datastore_id,
            num_cpus=node.vcpu,
            memory=node.memory_mib,
            # The template's own guest id (kept by the clone source with its UUID): the builder
            # falls back to an older one on vSphere without debian12_64Guest, and vCenter refuses
            # a clone that names an id it does not know.
            guest_id=source.guest_id,
            firmware=lab.template.firmware,
            scsi_type="pvscsi",
            enable_disk_uuid=True,
            # A static MAC (VMware's manual range): cloud-init finds the NIC by it and names it
            # network.interface, whatever PCI slot, and so kernel name, vSphere gives it.
            network_interfaces=[
                vsphere.VirtualMachineNetworkInterfaceArgs(
                    network_id=network_id,
                    adapter_type="vmxnet3",
                    use_static_mac=True,
                    mac_address=node_rendering.node_mac(node),
                )
            ],
            disks=disks,
            # The template of the node's creation; a new one only with a new VM (clone_source.py).
            # The bound follows the disks (clone_timeout_minutes); only a create uses it.
            clone=vsphere.VirtualMachineCloneArgs(template_uuid=source.template, timeout=clone_timeout_minutes(lab)),
            # Identity and network through cloud-init's VMware datasource, never guest
            # customization (unreliable on Debian: packer-examples-for-vsphere#815, #848).
            # The stack tag lets preflight tell this stack's VMs from anyone else's on the next run.
            # The node key changes in place like the rest (no reboot): a running node reads the new
            # value at its next sealed step.
            extra_config={
                **node_rendering.guestinfo_extra_config(lab, node),
                **vsphere_api.stack_tag(pulumi.get_stack()),
                **HOST_TIME_SYNC_OFF,
                sealed.NODE_KEY_GUESTINFO: node_key,
            },
            # guestinfo changes in place (new SSH keys, NTP or DNS servers for a future replacement):
            # never power-cycle a node for that (the provider's default for any extra_config change).
            extra_config_reboot_required=False,
            # ForceNew: a new cloud-init identity, or a new clone source, is a new VM; every other
            # change is applied in place (docs/runbook.md, "What a config change does").
            replace_trigger=pulumi.Output.concat(identity, " ", source.id),
            annotation=ownership_annotation(pulumi.get_stack()),
            # Static IPs: the provider's guest-network waiter would only wait for what we already
            # know (pulumi/pulumi-vsphere#182). Readiness is the cloud-init step below.
            wait_for_guest_net_timeout=0,
            wait_for_guest_ip_timeout=0,
            # Nodes keep time with NTP (timesyncd); two clocks fighting upsets etcd.
            sync_time_with_host=False,
            sync_time_with_host_periodically=False,
            opts=pulumi.ResourceOptions(
                parent=self,
                # The new VM has the same name in the same folder (vCenter: DuplicateName) and the
                # same static IP that the readiness step dials: the old one must go first.
                delete_before_replace=True,
                # ept_rvi_mode and hv_mode are left unset: terraform-provider-vsphere made them
                # Optional+Computed (#2172, #2194, #2230) because vSphere 8 reports "" for them
                # (#1902, #2202), and both are on its reboot-required list, so a configured value
                # would power-cycle every node on every `up`. Ignored so a value vCenter reports
                # never turns into a change either.
                # clone.timeout only bounds the create, and follows the node count
                # (clone_timeout_minutes): a new node must not show an update on every other VM.
                ignore_changes=["eptRviMode", "hvMode", "clone.timeout"],
            ),
        )
