"""Layer 2: the seven VMs (full clones of the golden template) and their DRS anti-affinity rules."""

from __future__ import annotations

import functools
from typing import Any

import pulumi
import pulumi_random as random
import pulumi_vsphere as vsphere
from pulumi_command import remote

from components import remote as steps
from components import vsphere as vsphere_api
from components.clone_source import CloneSource
from components.clone_timing import clone_timeout_minutes
from components.config import LabConfig, Node, Role
from components.previous_state import PreviousState
from components.rendering import host_keys as keys
from components.rendering import node as node_rendering
from components.rendering import read_file
from components.rendering.lb import CONTROL_PLANE_SSH_PORT

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
HOST_KEY_SCRIPT = "node/install-host-keys.sh"
HOST_KEY_ENTRYPOINT = "install-host-keys.sh"
# All of a RandomId's results are its seed in other encodings: every one a secret.
_SEED_OUTPUTS = ["hex", "b64Std", "b64Url", "dec"]


CLUSTER_HOST_KEY_SEED = "control-plane-host-key-seed"


def host_key_step_name(node: Node) -> str:
    return f"{node.name}-host-key"


def host_key_seed_name(node: Node) -> str:
    """The RandomId whose `--replace` rotates the node's key (docs/runbook.md)."""
    return f"{node.name}-host-key-seed"


def host_key_files(node_key: keys.HostKey, cluster_key: keys.HostKey | None) -> dict[str, str]:
    """The bundle of a node's host-key step (cloudinit/node/install-host-keys.sh)."""
    present = [node_key, *([cluster_key] if cluster_key else [])]
    files = {HOST_KEY_ENTRYPOINT: read_file(HOST_KEY_SCRIPT), "hostkeys.conf": node_rendering.host_key_config(present)}
    for key in present:
        files[f"ssh_host_{key.kind}_key"] = key.private_openssh
        files[f"ssh_host_{key.kind}_key.pub"] = key.public_openssh + "\n"
    return files


def _pin_of(previous: PreviousState, node: Node, values: list[Any]) -> str:
    return rotation_pin(previous, node, str(values[0]), str(values[1]))


def rotation_pin(previous: PreviousState, node: Node, vm_id: str, new_key: str) -> str:
    """The key the host-key step pins: the one the node presented when the last `up` left it (that
    step's stdout), while it is the same VM (its id among that step's triggers); a new VM has the
    new key from cloud-init. So a rotated key is installed over a session pinned to the old one."""
    last = previous.resources.get(host_key_step_name(node)) or {}
    installed = previous.stdout(host_key_step_name(node))
    if installed and vm_id in [str(t) for t in last.get("triggers") or []]:
        return installed
    return new_key


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

    def __init__(
        self,
        name: str,
        lab: LabConfig,
        template_uuid: pulumi.Input[str],
        template_guest_id: pulumi.Input[str],
        private_key: pulumi.Input[str],
        previous: PreviousState | None = None,
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
        self.host_key_steps: dict[str, remote.Command] = {}
        previous = previous or PreviousState(available=False)
        secret_seed = pulumi.ResourceOptions(parent=self, additional_secret_outputs=_SEED_OUTPUTS)
        # The key of the triggers' HMAC (remote.trigger_digest): one per stack, secret in the state.
        trigger_key = random.RandomId("step-trigger-key", byte_length=32, opts=secret_seed)
        # The control planes' shared key on the VIP's SSH port (rendering/host_keys.py).
        cluster_seed = random.RandomId(CLUSTER_HOST_KEY_SEED, byte_length=keys.SEED_BYTES, opts=secret_seed)
        cluster_key = cluster_seed.hex.apply(keys.ecdsa_host_key)
        self.node_host_keys: dict[str, pulumi.Output[str]] = {}
        self.pins = steps.HostPins(
            nodes=self.node_host_keys,
            cluster=pulumi.Output.unsecret(cluster_key.apply(lambda key: key.public_openssh)),
            trigger_key=pulumi.Output.secret(trigger_key.hex),
        )
        remote_steps = steps.RemoteSteps(lab, private_key, self, self.pins)
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
            # The node's SSH host key (rendering/host_keys.py): its seed a secret in the state, made
            # once per VM (a new VM identity or clone source, the keepers, is a new key; a rotation
            # is `--replace` of this resource: docs/runbook.md), reaching the VM only through
            # vCenter (its user-data), never over the node network.
            replace_trigger = pulumi.Output.concat(identity, " ", source.id)
            seed = random.RandomId(
                host_key_seed_name(node),
                byte_length=keys.SEED_BYTES,
                keepers={"vm": replace_trigger},
                opts=secret_seed,
            )
            node_key = seed.hex.apply(keys.ed25519_host_key)
            present = (
                pulumi.Output.all(node_key, cluster_key)
                if node.role is Role.CONTROL_PLANE
                else pulumi.Output.all(node_key)
            )
            public_key = pulumi.Output.unsecret(node_key.apply(lambda key: key.public_openssh))
            self.node_host_keys[node.name] = public_key
            vm = self._clone(lab, node, source, pool_id, datastore.id, network.id, replace_trigger, present)
            self.vms[node.name] = vm
            # First after the clone's boot: the node presents the keys pinned from here on. On a new
            # VM cloud-init installed them; on a running VM whose key was rotated this installs them
            # over a session pinned to the old key (rotation_pin), and every later step pins the new.
            self.host_key_steps[node.name] = remote_steps.host_key(
                host_key_step_name(node),
                node,
                steps.Script(
                    lambda node_key, cluster_key=None: host_key_files(node_key, cluster_key),
                    HOST_KEY_ENTRYPOINT,
                    secrets=[node_key, cluster_key] if node.role is Role.CONTROL_PLANE else [node_key],
                ),
                after=[vm],
                presented=pulumi.Output.all(vm.id, public_key).apply(functools.partial(_pin_of, previous, node)),
            )
            if node.role is Role.CONTROL_PLANE:
                self.pins.cluster_presented.append(self.host_key_steps[node.name])
            self.ready[node.name] = remote_steps.on_node(
                f"{node.name}-ready",
                node,
                steps.Script(
                    lambda: {"wait-for-cloud-init.sh": wait_script},
                    "wait-for-cloud-init.sh",
                    args=(str(READINESS_TIMEOUT_SECONDS), node.name),
                ),
                # The host is the static IP from config, not a VM output, so order explicitly. After
                # the host key is in place; a rotation is no reason to re-run the steps (order only).
                after=[vm],
                order_after=[self.host_key_steps[node.name]],
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
        # What the operator's ssh trusts (the stack output sshKnownHosts, docs/runbook.md).
        lines = [
            self.node_host_keys[node.name].apply(functools.partial(keys.known_hosts_line, str(node.ip), 22))
            for node in lab.all_nodes
        ]
        lines.append(
            pulumi.Output.from_input(self.pins.cluster).apply(
                lambda key: keys.known_hosts_line(str(lab.load_balancer.vip), CONTROL_PLANE_SSH_PORT, key)
            )
        )
        self.known_hosts: pulumi.Output[str] = pulumi.Output.all(*lines).apply(lambda ls: "".join(f"{x}\n" for x in ls))
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
        pool_id: pulumi.Input[str],
        datastore_id: pulumi.Input[str],
        network_id: pulumi.Input[str],
        replace_trigger: pulumi.Output[str],
        host_keys: pulumi.Output[list[Any]],
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
            # The user-data carries the host keys (a secret, then); a rotated key changes it in place
            # (no reboot, no new instance-id) for a future replacement, while the host-key step
            # installs it on the running node.
            extra_config={
                **node_rendering.guestinfo_extra_config(lab, node),
                **guestinfo_with_keys(lab, node, host_keys),
                **vsphere_api.stack_tag(pulumi.get_stack()),
                **HOST_TIME_SYNC_OFF,
            },
            # guestinfo changes in place (new SSH keys, NTP or DNS servers for a future replacement):
            # never power-cycle a node for that (the provider's default for any extra_config change).
            extra_config_reboot_required=False,
            # ForceNew: a new cloud-init identity, or a new clone source, is a new VM; every other
            # change is applied in place (docs/runbook.md, "What a config change does").
            replace_trigger=replace_trigger,
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


def guestinfo_with_keys(
    lab: LabConfig, node: Node, host_keys: pulumi.Output[list[Any]]
) -> dict[str, pulumi.Output[str]]:
    """The user-data guestinfo keys rendered with the node's host keys: secret Outputs (the private
    keys are in them). The metadata, and so the instance-id, stay without them."""
    rendered = host_keys.apply(lambda present: node_rendering.guestinfo_extra_config(lab, node, present))
    return {
        "guestinfo.userdata": pulumi.Output.secret(rendered.apply(lambda values: values["guestinfo.userdata"])),
        # base64 or gzip+base64: says nothing about the keys.
        "guestinfo.userdata.encoding": pulumi.Output.unsecret(
            rendered.apply(lambda values: values["guestinfo.userdata.encoding"])
        ),
    }
