"""The whole program under Pulumi's mock engine: components, hardware, graph and secrets.

Assertions are on the recorded parent/dependency graph (RecordingMonitor), never on the order
in which resources happened to be registered.
"""

from __future__ import annotations

import base64
import copy
import itertools
import re

import pulumi
import pytest
import yaml
from google.protobuf import json_format
from pulumi.runtime import rpc

from components import remote as remote_steps
from components.rendering import LIBRARY_ROOT, bundle_files, host_keys, k8s
from components.tools.offline import RecordingMonitor, run_program

VM = "vsphere:index/virtualMachine:VirtualMachine"
RULE = "vsphere:index/computeClusterVmAntiAffinityRule:ComputeClusterVmAntiAffinityRule"
COMMAND = "command:remote:Command"
K8S_NODES = [f"labs-k8s-m0{i}" for i in (1, 2, 3)] + [f"labs-k8s-w0{i}" for i in (1, 2)]
COMPONENTS = {
    "labs-k8s:lab:Lab": "labs-k8s",
    "labs-k8s:template:GoldenTemplate": "template",
    "labs-k8s:fleet:NodeFleet": "fleet",
    "labs-k8s:lb:LoadBalancerPair": "balancers",
    "labs-k8s:k8s:KubeadmCluster": "cluster",
}
NODES = {
    "labs-k8s-lb01": "10.3.60.50",
    "labs-k8s-lb02": "10.3.60.56",
    "labs-k8s-m01": "10.3.60.51",
    "labs-k8s-m02": "10.3.60.52",
    "labs-k8s-m03": "10.3.60.53",
    "labs-k8s-w01": "10.3.60.54",
    "labs-k8s-w02": "10.3.60.55",
}


CLUSTER_ENDPOINT = ("10.3.60.100", 2222)  # the VIP's SSH port: the first healthy control plane


def host_of(reg) -> str:
    return reg.plain_inputs["connection"]["host"]


def endpoint_of(reg) -> tuple[str, int]:
    connection = reg.plain_inputs["connection"]
    return connection["host"], int(connection.get("port", 22))


# --------------------------------------------------------------------------- structure


def test_one_component_per_layer_with_its_type_token(offline_run):
    components = {r.type: r.name for r in offline_run.registrations.values() if not r.custom}
    assert components == COMPONENTS
    for layer in ("template", "fleet", "balancers", "cluster"):
        assert offline_run.parent_name(layer) == "labs-k8s"


def test_every_resource_is_parented_to_its_component(offline_run):
    component_names = set(COMPONENTS.values())
    for reg in offline_run.registrations.values():
        if reg.custom:
            assert offline_run.parent_name(reg.name) in component_names - {"labs-k8s"}, reg.name
    by_parent = {
        "template": {"pulumi-python:dynamic:Resource"},
        # The random resources: the host key seeds and the triggers' HMAC key (rendering/host_keys.py).
        "fleet": {VM, RULE, COMMAND, "pulumi-python:dynamic:Resource", "random:index/randomId:RandomId"},
        "balancers": {COMMAND, "random:index/randomPassword:RandomPassword"},
    }
    for parent, types in by_parent.items():
        children = {r.type for r in offline_run.registrations.values() if offline_run.parent_name(r.name) == parent}
        assert children == types


def test_stack_outputs(offline_run):
    outputs = offline_run.stack_outputs
    assert outputs["apiEndpoint"] == "https://10.3.60.100:6443"
    assert outputs["kubeconfig"] == "[secret]"
    assert {(n["name"], n["ip"]) for n in outputs["nodes"]} == set(NODES.items())
    assert {n["role"] for n in outputs["nodes"]} == {"balancer", "control-plane", "worker"}
    assert outputs["templateUuid"].startswith("4201")


def test_bad_config_registers_nothing():
    monitors: list[RecordingMonitor] = []
    with pytest.raises(pulumi.RunError) as caught:
        run_program("labs", overrides={"labs-k8s:loadBalancer": {"vip": "10.3.60.51"}}, monitor_sink=monitors)
    assert "labs-k8s:loadBalancer.vip" in str(caught.value)
    assert monitors[0].registrations == {}


def test_a_repository_key_that_is_no_fingerprint_registers_nothing():
    monitors: list[RecordingMonitor] = []
    mirrors = {"kubernetesRepository": {"url": "https://nexus.lab.local/k8s", "keyFingerprint": "234654DA9A296436"}}
    with pytest.raises(pulumi.RunError) as caught:
        run_program("labs", overrides={"labs-k8s:mirrors": mirrors}, monitor_sink=monitors)
    assert "labs-k8s:mirrors.kubernetesRepository.keyFingerprint: '234654DA9A296436' is not a key fingerprint" in str(
        caught.value
    )
    assert monitors[0].registrations == {}


def test_missing_ssh_private_key_is_a_clear_error_before_registration():
    monitors: list[RecordingMonitor] = []
    with pytest.raises(pulumi.RunError) as caught:
        run_program("labs", overrides={"labs-k8s:sshPrivateKey": ""}, monitor_sink=monitors)
    assert "pulumi config set --stack labs --secret labs-k8s:sshPrivateKey" in str(caught.value)
    assert monitors[0].registrations == {}


@pytest.mark.parametrize(
    ("server", "complaint"),
    [
        ("https://vcenter.labs.local/sdk", "is a URL"),
        ("vcenter.labs.local:44x3", "has no valid port"),
        ("fd00::10", "is an IPv6 address without brackets"),
    ],
)
def test_a_bad_vcenter_address_is_a_clear_error_before_registration(server, complaint):
    monitors: list[RecordingMonitor] = []
    with pytest.raises(pulumi.RunError) as caught:
        run_program("labs", overrides={"vsphere:vsphereServer": server}, monitor_sink=monitors)
    assert f"vsphere:vsphereServer {server!r} {complaint}" in str(caught.value)
    assert monitors[0].registrations == {}


def test_a_vcenter_on_another_port_is_accepted():
    run = run_program("labs", overrides={"vsphere:vsphereServer": "vcenter.labs.local:8443"})
    assert run.config["vsphere:vsphereServer"] == "vcenter.labs.local:8443"
    assert run.by_name("golden-template")


# --------------------------------------------------------------------------- template


def test_template_inputs_carry_the_hardware(offline_run):
    template = offline_run.by_name("golden-template")
    inputs = template.inputs
    assert (inputs["scsiType"], inputs["nicType"]) == ("pvscsi", "vmxnet3")
    assert inputs["eagerlyScrub"] is True and inputs["thinProvisioned"] is False
    assert inputs["firmware"] == "bios"
    assert inputs["name"].startswith("labs-k8s-debian12-")
    # The provider reads the vCenter login from the stack config at each call: not an input, so
    # never in the state, and a rotation or another account is no change (docs/template.md).
    assert not {"server", "user", "password", "allowUnverifiedSsl"} & set(inputs)


def test_clones_take_the_templates_guest_id(offline_run):
    """Not a constant: the guest id the builder used (an older one on vSphere without
    debian12_64Guest), through each node's clone source, so a rebuilt template moves no running node."""
    template = offline_run.by_name("golden-template")
    for node in NODES:
        vm, source = offline_run.by_name(node), offline_run.by_name(f"{node}-clone-source")
        assert source.property_dependencies["guestId"] == [template.urn]
        assert vm.property_dependencies["guestId"] == [source.urn]
        assert vm.plain_inputs["guestId"] == "debian12_64Guest"  # what the mock template reports


def test_template_is_deleted_on_destroy_unless_retained(offline_run, run_with, lab_namespace):
    assert offline_run.by_name("golden-template").retain_on_delete is False
    kept = run_with(template=dict(lab_namespace["template"], retainOnDestroy=True))
    assert kept.by_name("golden-template").retain_on_delete is True


def test_template_uuid_feeds_every_clone_through_its_clone_source(offline_run, lab_config):
    """The template reaches a VM through the node's CloneSource (components/clone_source.py)."""
    from components.rendering.node import instance_id

    template = offline_run.by_name("golden-template")
    vms = offline_run.of_type(VM)
    assert len(vms) == 7
    nodes = {n.name: n for n in lab_config.all_nodes}
    for vm in vms:
        source = offline_run.by_name(f"{vm.name}-clone-source")
        assert template.urn in source.property_dependencies["template"]
        assert source.plain_inputs == {
            "node": vm.name,
            "identity": instance_id(lab_config, nodes[vm.name]),
            "template": source.plain_inputs["template"],
            "guestId": "debian12_64Guest",
        }
        assert source.plain_inputs["template"].startswith("4201")
        assert vm.property_dependencies["clone"] == [source.urn]
        assert vm.plain_inputs["clone"]["templateUuid"] == source.plain_inputs["template"]
        # A new clone source (identity changed, or replaced by hand) is a new VM.
        assert source.urn in vm.property_dependencies["replaceTrigger"]
        assert vm.plain_inputs["replaceTrigger"].startswith(instance_id(lab_config, nodes[vm.name]) + " ")


def test_node_changes_do_not_rebuild_the_template(offline_run, run_with, lab_namespace):
    nodes = lab_namespace["nodes"]
    nodes["workers"]["hosts"].append({"name": "labs-k8s-w03", "ip": "10.3.60.57"})
    nodes["workers"]["memoryMib"] = 8192
    changed = run_with(nodes=nodes)
    assert changed.by_name("golden-template").inputs["name"] == offline_run.by_name("golden-template").inputs["name"]


def test_template_inputs_change_the_template_name(offline_run, run_with, lab_namespace):
    template = dict(lab_namespace["template"], diskGib=24)
    changed = run_with(template=template)
    assert changed.by_name("golden-template").inputs["name"] != offline_run.by_name("golden-template").inputs["name"]


# --------------------------------------------------------------------------- fleet


def test_clones_have_the_template_hardware_and_role_sizes(offline_run, lab_config):
    sizes = {n.name: n for n in lab_config.all_nodes}
    for vm in offline_run.of_type(VM):
        inputs = vm.plain_inputs
        node = sizes[inputs["name"]]
        assert inputs["scsiType"] == "pvscsi"
        assert [nic["adapterType"] for nic in inputs["networkInterfaces"]] == ["vmxnet3"]
        assert all(d["eagerlyScrub"] is True and d["thinProvisioned"] is False for d in inputs["disks"])
        # The OS disk is never grown beyond the template (provider #2123).
        assert inputs["disks"][0]["size"] == lab_config.template.disk_gib
        assert [d["size"] for d in inputs["disks"][1:]] == ([node.data_disk_gib] if node.data_disk_gib else [])
        assert (inputs["numCpus"], inputs["memory"]) == (node.vcpu, node.memory_mib)
        assert inputs["folder"] == "labs-k8s"
        assert inputs["waitForGuestNetTimeout"] == 0 and inputs["waitForGuestIpTimeout"] == 0


def test_clones_leave_what_vcenter_normalizes_alone_and_never_reboot_for_guestinfo(offline_run):
    """ept_rvi_mode / hv_mode: unset and ignored (vSphere 8 reports "", both reboot the VM:
    terraform-provider-vsphere #1902, #2202). guestinfo updates in place without a power cycle."""
    for vm in offline_run.of_type(VM):
        inputs = vm.plain_inputs
        assert "eptRviMode" not in inputs and "hvMode" not in inputs
        assert {"eptRviMode", "hvMode"} <= set(vm.ignore_changes)
        assert "clone" not in vm.ignore_changes  # a replacement must clone the current source
        assert inputs["extraConfigRebootRequired"] is False
        assert vm.replace_on_changes == ()  # replaceTrigger (ForceNew) decides
        assert vm.delete_before_replace is True  # same name, same static IP


def test_host_time_sync_is_fully_off(offline_run):
    """VMware KB 1189: periodic sync off is not enough; the one-off syncs need their own keys."""
    keys = {
        "time.synchronize.continue",
        "time.synchronize.restore",
        "time.synchronize.resume.disk",
        "time.synchronize.resume.host",
        "time.synchronize.shrink",
        "time.synchronize.tools.startup",
        "time.synchronize.tools.enable",
    }
    for vm in offline_run.of_type(VM):
        inputs = vm.plain_inputs
        assert inputs["syncTimeWithHost"] is False and inputs["syncTimeWithHostPeriodically"] is False
        extra = inputs["extraConfig"]
        assert {k: extra.get(k) for k in keys} == dict.fromkeys(keys, "FALSE")
        assert "tools.syncTime" not in extra  # the provider sets it from syncTimeWithHostPeriodically


def test_every_node_gets_a_node_settings_step_that_nothing_waits_for(offline_run, lab_config):
    settings = {r.name: r for r in offline_run.of_type(COMMAND) if r.name.endswith("-node-settings")}
    assert set(settings) == {f"{n.name}-node-settings" for n in lab_config.all_nodes}
    for name, reg in settings.items():
        node = name.removesuffix("-node-settings")
        assert offline_run.depends_on(name, f"{node}-ready")
        assert reg.plain_inputs["connection"]["host"] == NODES[node]
    for reg in offline_run.registrations.values():
        assert not set(reg.dependencies) & {r.urn for r in settings.values()}, reg.name


def test_clones_have_a_static_mac_that_their_network_config_matches(offline_run, lab_config):
    """The MAC the VM gets is the MAC cloud-init looks for: the NIC's name cannot drift."""
    macs = {n.name: n.mac for n in lab_config.all_nodes}
    assert len(set(macs.values())) == 7
    for vm in offline_run.of_type(VM):
        inputs = vm.plain_inputs
        (nic,) = inputs["networkInterfaces"]
        assert nic["useStaticMac"] is True
        assert nic["macAddress"] == macs[inputs["name"]]
        metadata = yaml.safe_load(base64.b64decode(inputs["extraConfig"]["guestinfo.metadata"]))
        ethernets = metadata["network"]["ethernets"]
        assert ethernets == {lab_config.network.interface: ethernets[lab_config.network.interface]}
        assert ethernets[lab_config.network.interface]["match"] == {"macaddress": nic["macAddress"]}
        assert ethernets[lab_config.network.interface]["set-name"] == lab_config.network.interface


def test_clones_carry_their_own_cloud_init_in_guestinfo(offline_run):
    for vm in offline_run.of_type(VM):
        extra = vm.plain_inputs["extraConfig"]
        assert extra["guestinfo.metadata.encoding"] in ("base64", "gzip+base64")
        if extra["guestinfo.metadata.encoding"] == "base64":
            metadata = base64.b64decode(extra["guestinfo.metadata"]).decode()
            assert f"local-hostname: {vm.plain_inputs['name']}" in metadata
            assert f"{NODES[vm.plain_inputs['name']]}/24" in metadata


def test_worker_count_is_config(run_with, lab_namespace):
    workers = lab_namespace["nodes"]["workers"]["hosts"]
    workers += [{"name": f"labs-k8s-w0{i}", "ip": f"10.3.60.{54 + i}"} for i in range(3, 6)]
    workers[1]["ip"] = "10.3.60.65"  # 10.3.60.56 belongs to lb02
    run = run_with(nodes=lab_namespace["nodes"])
    assert len(run.of_type(VM)) == 2 + 3 + 5


def compared(reg) -> dict:
    """The inputs the engine diffs: without the resource's ignoreChanges paths ("a.b" nested)."""
    inputs = copy.deepcopy(reg.plain_inputs)
    for path in reg.ignore_changes:
        *parents, leaf = path.split(".")
        node = inputs
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return inputs


def test_adding_a_worker_leaves_the_others_untouched(offline_run, run_with, lab_namespace):
    """Same inputs for every existing resource but the final verification: nothing else re-runs."""
    lab_namespace["nodes"]["workers"]["hosts"].append({"name": "labs-k8s-w03", "ip": "10.3.60.57"})
    grown = run_with(nodes=lab_namespace["nodes"])
    changed = {
        reg.name
        for reg in offline_run.registrations.values()
        if reg.custom and compared(reg) != compared(grown.by_name(reg.name))
    }
    assert changed == {"verify-cluster", "workers-anti-affinity"}
    # What the engine leaves out of the diff does change: clone.timeout follows the node count.
    assert (
        grown.by_name("labs-k8s-w01").plain_inputs["clone"]["timeout"]
        != offline_run.by_name("labs-k8s-w01").plain_inputs["clone"]["timeout"]
    )
    # The teardown guard only gains a dependency (on the new leave guard): its inputs are the same.
    guard = offline_run.by_name("teardown-guard")
    assert guard.plain_inputs["triggers"] == grown.by_name("teardown-guard").plain_inputs["triggers"] == []
    new = {r.name for r in grown.registrations.values()} - {r.name for r in offline_run.registrations.values()}
    assert new == {
        "labs-k8s-w03",
        "labs-k8s-w03-ready",
        "labs-k8s-w03-prepare",
        "labs-k8s-w03-refresh-join-material",
        "labs-k8s-w03-kubeadm-join",
        "labs-k8s-w03-leave-cluster",
        "labs-k8s-w03-clone-source",
        "labs-k8s-w03-node-settings",
        "labs-k8s-w03-host-key-seed",
        "labs-k8s-w03-host-key",
        "labs-k8s-w03-join-token",
        # Its upgrade steps (no-ops: it is prepared at the configured version).
        "labs-k8s-w03-upgrade-drain",
        "labs-k8s-w03-upgrade",
        "labs-k8s-w03-upgrade-uncordon",
    }


def test_three_rules_with_exactly_the_right_members(offline_run):
    rules = {r.plain_inputs["name"]: r for r in offline_run.of_type(RULE)}
    assert set(rules) == {
        "labs-k8s-labs-control-planes",
        "labs-k8s-labs-balancers",
        "labs-k8s-labs-workers",
    }
    vm_urns = {r.name: r.urn for r in offline_run.of_type(VM)}
    members = {
        "labs-k8s-labs-control-planes": {"labs-k8s-m01", "labs-k8s-m02", "labs-k8s-m03"},
        "labs-k8s-labs-balancers": {"labs-k8s-lb01", "labs-k8s-lb02"},
        "labs-k8s-labs-workers": {"labs-k8s-w01", "labs-k8s-w02"},
    }
    for name, rule in rules.items():
        assert set(rule.property_dependencies["virtualMachineIds"]) == {vm_urns[n] for n in members[name]}
        assert len(rule.plain_inputs["virtualMachineIds"]) == len(members[name])
        assert "virtualMachineIds" in rule.replace_on_changes
    assert rules["labs-k8s-labs-control-planes"].plain_inputs["mandatory"] is True
    assert rules["labs-k8s-labs-balancers"].plain_inputs["mandatory"] is True
    assert rules["labs-k8s-labs-workers"].plain_inputs["mandatory"] is False


def test_anti_affinity_off_drops_the_rule(run_with, lab_namespace):
    run = run_with(antiAffinity={"workers": "off"})
    assert {r.plain_inputs["name"] for r in run.of_type(RULE)} == {
        "labs-k8s-labs-control-planes",
        "labs-k8s-labs-balancers",
    }


def test_every_command_on_a_vm_depends_on_that_vms_readiness(offline_run):
    ready_by_host = {}
    for reg in offline_run.of_type(COMMAND):
        if reg.name.endswith("-ready"):
            vm_name = reg.name.removesuffix("-ready")
            assert host_of(reg) == NODES[vm_name]  # the configured static IP, not a vCenter report
            assert offline_run.depends_on(reg.name, vm_name)
            ready_by_host[host_of(reg)] = reg.name
            # After the step that puts the pinned host key in place.
            assert offline_run.depends_on(reg.name, f"{vm_name}-host-key")
    assert len(ready_by_host) == 7
    for reg in offline_run.of_type(COMMAND):
        if endpoint_of(reg) == CLUSTER_ENDPOINT:
            # Cluster-wide: reached through the VIP once the cluster exists.
            assert offline_run.depends_on(reg.name, "labs-k8s-m01-kubeadm-init"), reg.name
        elif reg.name.endswith("-host-key"):
            assert offline_run.depends_on(reg.name, reg.name.removesuffix("-host-key")), reg.name
        elif not reg.name.endswith("-ready"):
            assert offline_run.depends_on(reg.name, ready_by_host[host_of(reg)]), reg.name


def _minutes(duration: str) -> float:
    """A Pulumi custom timeout ("30m", "1h30m", "90s") in minutes."""
    parts = re.findall(r"(\d+)([hms])", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(int(n) * {"h": 60, "m": 1, "s": 1 / 60}[u] for n, u in parts)


def test_commands_connect_to_static_ips_with_bounded_dials(offline_run):
    """No unlimited dial retries: a host that never answers fails a step within minutes."""
    for reg in offline_run.of_type(COMMAND):
        connection = reg.plain_inputs["connection"]
        assert connection["host"] in NODES.values() or endpoint_of(reg) == CLUSTER_ENDPOINT
        assert connection["user"] == "labs"
        assert "connection" in reg.secret_input_keys  # the private key is inside
        attempts, per_dial = connection["dialErrorLimit"], connection["perDialTimeout"]
        assert 0 < per_dial <= 15, reg.name
        if reg.name.endswith(("-host-key", "-ready")):  # a clone's first boot
            assert attempts == remote_steps.BOOT_DIAL_ATTEMPTS
        else:
            assert 0 < attempts <= remote_steps.STEP_DIAL_ATTEMPTS, reg.name
            # pulumi-command: per attempt at most the dial timeout plus a back-off capped at 5 s.
            assert attempts * (per_dial + 5) <= 3 * 60, reg.name


def test_every_command_has_finite_timeouts_longer_than_its_dials(offline_run):
    for reg in offline_run.of_type(COMMAND):
        timeouts = reg.custom_timeouts
        assert all(timeouts[k] for k in ("create", "update", "delete")), (reg.name, timeouts)
        connection = reg.plain_inputs["connection"]
        dials = connection["dialErrorLimit"] * (connection["perDialTimeout"] + 5)
        # pulumi-command dials on delete only when there is a delete command.
        kinds = ("create", "update", "delete") if reg.plain_inputs.get("delete") else ("create", "update")
        for kind in kinds:
            assert dials / 60 < _minutes(timeouts[kind]) <= 60, (reg.name, kind, timeouts[kind])
    guard = offline_run.by_name("teardown-guard")
    assert _minutes(guard.custom_timeouts["delete"]) <= 5  # the first thing `pulumi destroy` deletes


_BOUNDED = re.compile(r"^sudo -n timeout --kill-after=(\d+) (\d+) bash -s((?: -- \w+)?); rc=\$\?; (.*)$")


def _bounded(command: str) -> tuple[int, int, str]:
    """(kill-after, deadline, arguments) of a remote command that runs a bundle under `timeout`."""
    match = _BOUNDED.match(command)
    assert match, f"not run under its own deadline: {command!r}"
    assert "exit $rc" in match.group(4) and "stopped after" in match.group(4)
    return int(match.group(1)), int(match.group(2)), match.group(3)


def test_every_bundle_runs_under_its_own_deadline_shorter_than_the_step_timeout(offline_run):
    """pulumi-command 1.2.1 runs `session.Run` without the step's context (remote/commandOutputs.go):
    the custom timeout ends only the dial. A script that hangs is stopped on the node by `timeout`,
    before the step's own timeout, even after the longest dial."""
    checked = 0
    for reg in offline_run.of_type(COMMAND):
        connection = reg.plain_inputs["connection"]
        dials = connection["dialErrorLimit"] * (connection["perDialTimeout"] + 5)
        for kind, timeout_kind in (("create", "create"), ("delete", "delete")):
            command = reg.plain_inputs.get(kind)
            if not command or command == remote_steps.NO_OP_CREATE:
                continue
            kill_after, deadline, _args = _bounded(command)
            budget = _minutes(reg.custom_timeouts[timeout_kind]) * 60
            assert deadline >= 60 and dials + deadline + kill_after < budget, (reg.name, kind, deadline, budget)
            checked += 1
    assert checked > 30


def test_no_command_sends_its_previous_output_back(offline_run):
    """pulumi-command defaults addPreviousOutputInEnv to true: the kubeconfig would travel as an
    SSH environment variable on every update of its step."""
    commands = offline_run.of_type(COMMAND)
    assert len(commands) > 20
    for reg in commands:
        assert reg.plain_inputs.get("addPreviousOutputInEnv") is False, reg.name


# --------------------------------------------------------------------------- balancers


def test_balancer_setup_after_readiness_with_secret_password(offline_run):
    for name in ("labs-k8s-lb01", "labs-k8s-lb02"):
        setup = offline_run.by_name(f"{name}-lb-setup")
        assert offline_run.depends_on(setup.name, f"{name}-ready")
        assert offline_run.depends_on(setup.name, "vrrp-password")
        assert "stdin" in setup.secret_input_keys
        assert set(setup.additional_secret_outputs) >= {"stdout", "stderr"}
        assert setup.plain_inputs["logging"] == "none"


# --------------------------------------------------------------------------- cluster


def test_prepare_runs_on_every_kubernetes_node_in_parallel(offline_run):
    prepares = [r.name for r in offline_run.of_type(COMMAND) if r.name.endswith("-prepare")]
    assert sorted(prepares) == sorted(f"{n}-prepare" for n in NODES if "-lb" not in n)
    for a in prepares:
        for b in prepares:
            assert a == b or not offline_run.depends_on(a, b)


def test_init_depends_on_balancers_and_m01_preparation(offline_run):
    init = "labs-k8s-m01-kubeadm-init"
    assert host_of(offline_run.by_name(init)) == "10.3.60.51"
    for dependency in ("labs-k8s-m01-prepare", "labs-k8s-lb01-lb-setup", "labs-k8s-lb02-lb-setup"):
        assert offline_run.depends_on(init, dependency)


def test_control_plane_joins_are_serialized_and_the_first_control_plane_joins_too(offline_run):
    chain = [
        "labs-k8s-m01-kubeadm-init",
        "labs-k8s-m01-refresh-join-material",
        "labs-k8s-m01-kubeadm-join",
        "labs-k8s-m02-refresh-join-material",
        "labs-k8s-m02-kubeadm-join",
        "labs-k8s-m03-refresh-join-material",
        "labs-k8s-m03-kubeadm-join",
    ]
    for earlier, later in itertools.pairwise(chain):
        assert offline_run.depends_on(later, earlier), (later, earlier)
    assert not offline_run.depends_on("labs-k8s-m02-kubeadm-join", "labs-k8s-m03-kubeadm-join")
    for node in ("labs-k8s-m01", "labs-k8s-m02", "labs-k8s-m03"):
        join = offline_run.by_name(f"{node}-kubeadm-join")
        assert host_of(join) == NODES[node]
        assert offline_run.depends_on(join.name, f"{node}-prepare")
        assert offline_run.depends_on(join.name, f"{node}-leave-cluster")
        # Fresh join material right before each join, from a healthy control plane (not m01).
        refresh = offline_run.by_name(f"{node}-refresh-join-material")
        assert endpoint_of(refresh) == CLUSTER_ENDPOINT
        assert refresh.urn in join.property_dependencies["stdin"]


def test_worker_joins_depend_on_init_not_on_each_other(offline_run):
    for worker in ("labs-k8s-w01", "labs-k8s-w02"):
        join = f"{worker}-kubeadm-join"
        assert offline_run.depends_on(join, "labs-k8s-m01-kubeadm-init")
        assert offline_run.depends_on(join, f"{worker}-refresh-join-material")
        assert offline_run.depends_on(join, f"{worker}-leave-cluster")
        assert not offline_run.depends_on(join, "labs-k8s-m02-kubeadm-join")
    assert not offline_run.depends_on("labs-k8s-w01-kubeadm-join", "labs-k8s-w02-kubeadm-join")
    assert not offline_run.depends_on("labs-k8s-w02-kubeadm-join", "labs-k8s-w01-kubeadm-join")


def test_no_single_management_node(offline_run):
    """Everything cluster-wide runs wherever the VIP's SSH port lands (a healthy control plane):
    with m01 down, removing a worker, verifying or destroying still works."""
    cluster_wide = {"flannel", "verify-cluster", "kubeconfig", "teardown-guard"}
    cluster_wide |= {f"{n}-refresh-join-material" for n in NODES if "-lb" not in n}
    cluster_wide |= {f"{n}-leave-cluster" for n in NODES if "-lb" not in n}
    cluster_wide |= {f"{n}-upgrade-{action}" for n in NODES if "-w" in n for action in ("drain", "uncordon")}
    for name in cluster_wide:
        assert endpoint_of(offline_run.by_name(name)) == CLUSTER_ENDPOINT, name
    on_m01 = {r.name for r in offline_run.of_type(COMMAND) if host_of(r) == NODES["labs-k8s-m01"]}
    # The upgrade of m01 itself is m01's, as every node's own upgrade is its own.
    assert on_m01 == {
        "labs-k8s-m01-host-key",
        "labs-k8s-m01-ready",
        "labs-k8s-m01-node-settings",
        "labs-k8s-m01-prepare",
        "labs-k8s-m01-kubeadm-init",
        "labs-k8s-m01-kubeadm-join",
        "labs-k8s-m01-upgrade",
    }


def test_flannel_and_verify(offline_run):
    assert offline_run.depends_on("flannel", "labs-k8s-m01-kubeadm-init")
    for join in ("m01", "m02", "m03", "w01", "w02"):
        assert offline_run.depends_on("verify-cluster", f"labs-k8s-{join}-kubeadm-join")
    assert offline_run.depends_on("verify-cluster", "flannel")


def test_joins_take_no_data_from_init_output(offline_run):
    init = offline_run.by_name("labs-k8s-m01-kubeadm-init").urn
    for reg in offline_run.of_type(COMMAND):
        if reg.name.endswith("-kubeadm-join"):
            for prop, urns in reg.property_dependencies.items():
                assert init not in urns, f"{reg.name}.{prop} reads init's output"


def test_secret_bearing_steps_are_secret_and_quiet(offline_run):
    for reg in offline_run.of_type(COMMAND):
        name = reg.name
        if any(s in name for s in ("kubeadm-init", "kubeadm-join", "refresh-join", "lb-setup")):
            assert "stdin" in reg.secret_input_keys, name  # token, certificate key or VRRP password inside
        if any(s in name for s in ("kubeadm-init", "refresh-join", "kubeconfig", "lb-setup")):
            assert set(reg.additional_secret_outputs) >= {"stdout", "stderr"}, name
        if name.endswith("-kubeadm-join"):
            # "joined": readable in the state, so the next `up` knows the join finished.
            assert "stderr" in reg.additional_secret_outputs and "stdout" not in reg.additional_secret_outputs, name
        if any(s in name for s in ("kubeadm-init", "kubeadm-join", "refresh-join", "kubeconfig", "lb-setup")):
            assert reg.plain_inputs["logging"] == "none", name
            assert "sudo" in reg.plain_inputs["create"] and "." not in reg.plain_inputs["create"].split()[-1]
    for name in ("bootstrap-token-id", "bootstrap-token-secret"):
        reg = offline_run.by_name(name)
        assert reg.plain_inputs["special"] is False and reg.plain_inputs["upper"] is False
    assert set(offline_run.by_name("certificate-key").additional_secret_outputs) >= {"hex"}


def test_leave_guards_remove_a_node_before_its_vm_goes(offline_run):
    for node in ("labs-k8s-m01", "labs-k8s-m02", "labs-k8s-m03", "labs-k8s-w01", "labs-k8s-w02"):
        leave = offline_run.by_name(f"{node}-leave-cluster")
        vm = offline_run.by_name(node)
        # Its only trigger is the VM's id, a property dependency: when the VM is replaced
        # (delete-before-replace), the engine deletes this step first and its delete runs.
        assert leave.property_dependencies["triggers"] == [vm.urn]
        assert leave.plain_inputs["triggers"] == [f"{node}-id"]
        assert "triggers" in leave.replace_on_changes and leave.delete_before_replace
        # An SSH key rotation changes every connection: an in-place update (pulumi-command replaces
        # on triggers only), so the delete that runs later logs in with the current key.
        assert "connection" not in leave.ignore_changes and "connection" not in leave.replace_on_changes
        # The create does nothing; the delete runs the bundle (drain, delete the Node, etcd member).
        assert leave.plain_inputs["create"] == remote_steps.NO_OP_CREATE
        assert _bounded(leave.plain_inputs["delete"])[2] == ""
        assert "leave-cluster.sh" in leave.plain_inputs["stdin"] and node in leave.plain_inputs["stdin"]
        assert offline_run.depends_on(leave.name, node)
        assert offline_run.depends_on("teardown-guard", leave.name)  # deleted first on destroy
    # Control planes leave one at a time, the last configured first.
    assert offline_run.depends_on("labs-k8s-m03-leave-cluster", "labs-k8s-m02-leave-cluster")
    assert offline_run.depends_on("labs-k8s-m02-leave-cluster", "labs-k8s-m01-leave-cluster")
    assert not offline_run.depends_on("labs-k8s-w02-leave-cluster", "labs-k8s-w01-leave-cluster")


def test_teardown_guard_marks_on_delete_clears_on_create_and_is_never_replaced(offline_run):
    guard = offline_run.by_name("teardown-guard")
    assert _bounded(guard.plain_inputs["create"])[2] == " -- clear"
    assert _bounded(guard.plain_inputs["delete"])[2] == " -- set"
    assert guard.plain_inputs["triggers"] == []
    assert guard.delete_before_replace  # mark, then clear
    assert "connection" not in guard.ignore_changes  # a key rotation updates the key its delete uses
    assert "teardown-guard.sh" in guard.plain_inputs["stdin"]


def test_preview_registers_the_same_graph(offline_run):
    """`pulumi preview` (dry run: unknown ids and outputs) evaluates the same resources."""
    preview = run_program("labs", preview=True)
    assert {r.name for r in preview.registrations.values()} == {r.name for r in offline_run.registrations.values()}
    assert preview.depends_on("labs-k8s-m03-kubeadm-join", "labs-k8s-m02-kubeadm-join")


def _secret_unknowns(value) -> list:
    """Where the wire form holds a secret whose value is unknown (the SDK's {sig: secret, value:
    UNKNOWN}, rpc.serialize_property): pulumi-command echoes it back as a secret without a value."""
    if isinstance(value, dict):
        if value.get(rpc._special_sig_key) == rpc._special_secret_sig:
            return [value] if value.get("value") == rpc.UNKNOWN or _has_unknown(value.get("value")) else []
        return [found for v in value.values() for found in _secret_unknowns(v)]
    if isinstance(value, list):
        return [found for v in value for found in _secret_unknowns(v)]
    return []


def _has_unknown(value) -> bool:
    if isinstance(value, dict):
        return any(_has_unknown(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_unknown(v) for v in value)
    return value == rpc.UNKNOWN


def test_a_new_stacks_preview_sends_no_secret_unknown_in_any_trigger():
    """Issue #29: on the real engine a new stack's preview failed on labs-k8s-lb01-lb-setup with
    `triggers[0]: malformed secret: missing value`: pulumi-command 1.2.1 answers a secret trigger
    still unknown in a preview as a secret without a value, and CLI v3.274.1 refuses it. Under a new
    stack's preview (no provider output known), no Command's triggers may hold one."""
    run = run_program("labs", preview=True, unknown_outputs=True)
    commands = run.of_type(COMMAND)
    assert len(commands) > 40
    unknown_triggers = 0
    for reg in commands:
        triggers = json_format.MessageToDict(reg.wire_inputs).get("triggers") or []
        assert not _secret_unknowns(triggers), f"{reg.name}: a secret unknown in its triggers {triggers}"
        unknown_triggers += _has_unknown(triggers)
    # The mock really previews a new stack: the steps with secrets have triggers still unknown.
    assert unknown_triggers >= 2 + 1 + 5 + 5 + 7, unknown_triggers
    assert _has_unknown(json_format.MessageToDict(run.by_name("labs-k8s-lb01-lb-setup").wire_inputs)["triggers"])


def test_a_trigger_of_a_bundle_with_secrets_is_an_hmac_that_is_no_secret(offline_run):
    """Known runs: the trigger stands for the bundle (a changed secret re-runs the step) without
    being a secret, nor an offline oracle for one (remote.trigger_digest)."""
    key = offline_run.by_name("step-trigger-key").plain_outputs["hex"]
    setup = offline_run.by_name("labs-k8s-lb01-lb-setup")
    digest = setup.plain_inputs["triggers"][0]
    assert digest == remote_steps.trigger_digest(key, setup.plain_inputs["stdin"])
    assert setup.inputs["triggers"][0] == digest  # not "[secret]"
    password = offline_run.by_name("vrrp-password").plain_outputs["result"]
    assert digest not in {remote_steps.content_hash(setup.plain_inputs["stdin"]), password}


# --------------------------------------------------------------------------- provider timeouts (issue 23)


def test_an_api_timeout_too_short_for_the_data_disks_is_refused_before_registration():
    """The provider's 5-minute default bounds the reconfigure that zeroes each clone's data disk;
    on a timeout it deletes the half-made VM (terraform-provider-vsphere
    resourceVSphereVirtualMachineRollbackCreate). The labs stack's 160 GiB need 60 minutes."""
    monitors: list[RecordingMonitor] = []
    with pytest.raises(pulumi.RunError) as caught:
        run_program("labs", overrides={"vsphere:apiTimeout": ""}, monitor_sink=monitors)
    message = str(caught.value)
    assert "vsphere:apiTimeout (or VSPHERE_API_TIMEOUT): not set (the provider's default: 5 minutes)" in message
    assert "160 GiB of eager-zeroed data disks" in message
    assert "pulumi config set --stack labs vsphere:apiTimeout 60" in message
    assert monitors[0].registrations == {}
    with pytest.raises(pulumi.RunError, match=r"vsphere:apiTimeout: 20 minutes is too short"):
        run_program("labs", overrides={"vsphere:apiTimeout": "20"})


def test_the_api_timeout_needed_is_that_of_the_vms_this_run_creates(offline_run, monkeypatch):
    """Adding one worker to a lab that exists creates one VM: its 50 GiB need 23 minutes, not the
    first `up`'s 60. Shorter than the largest disk alone is refused; shorter than all the new disks
    together (an estimate: the engine's parallelism decides) is a warning with the value to set."""
    previous = offline_run.previous_state()
    grown = {
        "labs-k8s:nodes": offline_run.config["labs-k8s:nodes"].replace(
            '{"name": "labs-k8s-w02", "ip": "10.3.60.55"}',
            '{"name": "labs-k8s-w02", "ip": "10.3.60.55"}, {"name": "labs-k8s-w03", "ip": "10.3.60.57"}',
        )
    }
    assert "labs-k8s-w03" in grown["labs-k8s:nodes"]
    warnings: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **k: warnings.append(str(message)))
    run = run_program("labs", overrides={**grown, "vsphere:apiTimeout": "23"}, previous=previous)
    assert run.by_name("labs-k8s-w03")
    assert not [w for w in warnings if "vsphere:apiTimeout" in w]
    with pytest.raises(pulumi.RunError, match=r"vsphere:apiTimeout: 22 minutes is too short for the clones. 50 GiB"):
        run_program("labs", overrides={**grown, "vsphere:apiTimeout": "22"}, previous=previous)
    # The same eight nodes in a new stack: 210 GiB at once.
    run_program("labs", overrides={**grown, "vsphere:apiTimeout": "60"})
    assert [
        w
        for w in warnings
        if "vsphere:apiTimeout: 60 minutes is too short for the clones' 210 GiB" in w
        and "pulumi config set --stack labs vsphere:apiTimeout 77" in w
    ]


def test_the_clone_timeout_follows_the_template_disk(offline_run):
    """Seven full clones copy 7 x 20 GiB at once: more than the provider's 30-minute clone.timeout
    allows at the assumed rate. A changed timeout is an update, never a new VM (its CustomizeDiff)."""
    for node in NODES:
        assert offline_run.by_name(node).plain_inputs["clone"]["timeout"] == 53


def test_the_clones_resource_pool_is_the_templates_a_path_below_the_clusters_root_pool(run_with, lab_namespace):
    """labs-k8s:vsphere.resourcePool "team/k8s" is Cluster/Resources/team/k8s for the template
    builder (find_resource_pool); the provider's finder resolves paths from the host folder, so the
    clones are given that full path (tests/test_vsphere_vcsim.py resolves both on a nested pool)."""
    run = run_with(vsphere=dict(lab_namespace["vsphere"], resourcePool="team/k8s"))
    pools = [args for token, args in run.calls if token == "vsphere:index/getResourcePool:getResourcePool"]
    assert [args["name"] for args in pools] == [f"{lab_namespace['vsphere']['computeCluster']}/Resources/team/k8s"]
    assert run.by_name("golden-template").plain_inputs["resourcePool"] == "team/k8s"


# --------------------------------------------------------------------------- host identity


def _bundle_texts(bundle: str) -> str:
    """The bundle's own text and every file it writes, decoded: where a plain secret would show."""
    return "\n".join([bundle, *bundle_files(bundle).values()])


def _secret_values(run) -> dict[str, str]:
    out = {
        name: run.by_name(name).plain_outputs["result"]
        for name in ("bootstrap-token-id", "bootstrap-token-secret", "vrrp-password")
    }
    out["certificate-key"] = run.by_name("certificate-key").plain_outputs["hex"]
    # As the EncryptionConfiguration holds it: the RandomId's 32 bytes in base64.
    out["secrets-encryption-key"] = k8s.encryption_key_from_hex(
        run.by_name("secrets-encryption-key").plain_outputs["hex"]
    )
    for reg in run.registrations.values():
        if reg.name.endswith("-join-token"):
            out[reg.name] = k8s.drawn_token(reg.plain_outputs["result"])
        if reg.name.endswith("-certificate-key") and reg.name != "certificate-key":
            out[reg.name] = reg.plain_outputs["hex"]
    return out


def _userdata(run, node: str) -> dict:
    vm = run.by_name(node)
    return yaml.safe_load(base64.b64decode(vm.plain_inputs["extraConfig"]["guestinfo.userdata"]).decode())


def _seed(run, name: str) -> str:
    return run.by_name(name).plain_outputs["hex"]


def test_each_vm_gets_its_own_host_key_only_through_vcenter_and_never_in_its_identity(offline_run):
    """Each VM's Ed25519 key (and on a control plane the shared VIP key) comes from a seed kept as a
    secret in the state, reaches the VM in its user-data (vCenter's API), and is no part of the VM's
    identity: its instance-id and replace trigger name no key, so a rotation replaces no VM."""
    cluster_key = host_keys.ecdsa_host_key(_seed(offline_run, "control-plane-host-key-seed"))
    publics = set()
    for node in NODES:
        vm = offline_run.by_name(node)
        assert vm.inputs["extraConfig"]["guestinfo.userdata"] == "[secret]"
        seed = offline_run.by_name(f"{node}-host-key-seed")
        assert seed.type == "random:index/randomId:RandomId" and seed.plain_inputs["byteLength"] == 32
        assert set(seed.additional_secret_outputs) == {"hex", "b64Std", "b64Url", "dec"}
        # A new VM (new identity or clone source) is a new key.
        assert seed.plain_inputs["keepers"] == {"vm": vm.plain_inputs["replaceTrigger"]}
        key = host_keys.ed25519_host_key(_seed(offline_run, f"{node}-host-key-seed"))
        expected = {"ed25519_private": key.private_openssh, "ed25519_public": key.public_openssh}
        if "-m0" in node:
            expected |= {"ecdsa_private": cluster_key.private_openssh, "ecdsa_public": cluster_key.public_openssh}
        userdata = _userdata(offline_run, node)
        assert userdata["ssh_keys"] == expected and userdata["ssh_deletekeys"] is True
        assert "ssh_genkeytypes" not in userdata  # nothing else: sshd presents exactly these
        (drop_in,) = userdata["write_files"]
        assert drop_in["content"] == "".join(
            f"HostKey /etc/ssh/ssh_host_{kind}_key\n"
            for kind in (["ed25519", "ecdsa"] if "-m0" in node else ["ed25519"])
        )
        metadata = base64.b64decode(vm.plain_inputs["extraConfig"]["guestinfo.metadata"]).decode()
        for text in (metadata, vm.plain_inputs["replaceTrigger"]):
            assert key.public_openssh.split()[1] not in text and "PRIVATE" not in text
        publics.add(key.public_openssh)
    assert len(publics) == len(NODES)


def test_every_remote_command_pins_the_host_key_its_host_was_given(offline_run):
    """pulumi-command takes any host key when `hostKey` is unset (ssh.InsecureIgnoreHostKey,
    connection.go SSHConfig): every connection sets it, to the key the VM got in its user-data; a
    step through the VIP pins the key only the control planes have."""
    cluster_public = host_keys.ecdsa_host_key(_seed(offline_run, "control-plane-host-key-seed")).public_openssh
    by_ip = {ip: name for name, ip in NODES.items()}
    commands = offline_run.of_type(COMMAND)
    assert commands
    for reg in commands:
        connection = reg.plain_inputs["connection"]
        assert connection.get("hostKey"), f"{reg.name}: a connection without hostKey accepts any host"
        if endpoint_of(reg) == CLUSTER_ENDPOINT:
            assert connection["hostKey"] == cluster_public, reg.name
        else:
            node = by_ip[connection["host"]]
            assert connection["hostKey"] == _userdata(offline_run, node)["ssh_keys"]["ed25519_public"], reg.name
        # Pins are public keys: readable in the state, diffable in a preview.
        assert "hostKey" not in str(reg.inputs.get("connection", "")) or reg.inputs["connection"] != "[secret]"


def test_every_step_through_the_vip_runs_after_every_control_plane_presents_the_shared_key(offline_run):
    """HAProxy sends a VIP:2222 session to any healthy control plane: after a rotation of
    `control-plane-host-key-seed` a VIP step must not run before each control plane's host-key step
    installed the new key (it would meet `ssh: host key mismatch`). Order only: the host-key
    steps' ids are in no VIP step's triggers, so a rotation re-runs none of them."""
    host_key_steps = [offline_run.by_name(f"{n}-host-key") for n in NODES if "-m" in n]
    assert len(host_key_steps) == 3
    through_vip = [reg for reg in offline_run.of_type(COMMAND) if endpoint_of(reg) == CLUSTER_ENDPOINT]
    assert {"flannel", "verify-cluster", "kubeconfig", "teardown-guard"} <= {reg.name for reg in through_vip}
    for reg in through_vip:
        assert {h.urn for h in host_key_steps} <= set(reg.dependencies), reg.name
        assert not {f"{h.name}-id" for h in host_key_steps} & set(map(str, reg.plain_inputs["triggers"])), reg.name


def test_the_operators_known_hosts_is_a_stack_output(offline_run):
    lines = offline_run.stack_outputs["sshKnownHosts"].splitlines()
    pins = {
        endpoint_of(reg): reg.plain_inputs["connection"]["hostKey"]
        for reg in offline_run.of_type(COMMAND)
        if not reg.name.endswith("-host-key")
    }
    expected = {f"{host} {key}" if port == 22 else f"[{host}]:{port} {key}" for (host, port), key in pins.items()}
    assert set(lines) == expected and len(lines) == len(NODES) + 1
    assert "[10.3.60.100]:2222 ecdsa-sha2-nistp256 " in offline_run.stack_outputs["sshKnownHosts"]


def test_secrets_travel_only_in_a_secret_stdin_with_the_logs_off(offline_run):
    """The token, the certificate key, the VRRP password and the host keys go in the stdin of the
    steps that need them, over the pinned session; never on a command line, in triggers or in logs."""
    secrets = _secret_values(offline_run)
    # The token's ID is its public half (kubeadm looks the secret up by it): verify-cluster has it.
    del secrets["bootstrap-token-id"]
    for node in NODES:
        secrets[f"{node} host key"] = host_keys.ed25519_host_key(
            _seed(offline_run, f"{node}-host-key-seed")
        ).private_openssh.splitlines()[2]
    carrying = set()
    for reg in offline_run.of_type(COMMAND):
        texts = _bundle_texts(reg.plain_inputs["stdin"])
        held = [name for name, value in secrets.items() if value in texts]
        if held:
            carrying.add(reg.name)
            assert "stdin" in reg.secret_input_keys, reg.name
            assert reg.plain_inputs["logging"] == "none", reg.name
            assert {"stdout", "stderr"} & set(reg.additional_secret_outputs) >= {"stderr"}, reg.name
            # The files that hold them leave the step directory when the step ends.
            assert "\ntrap 'rm -f -- /var/lib/labs-k8s/steps/" in reg.plain_inputs["stdin"], reg.name
        for value in secrets.values():
            for key in ("create", "delete", "triggers"):
                assert value not in str(reg.plain_inputs.get(key, "")), (reg.name, key)
    assert len(carrying) == 7 + 2 + 1 + 5 + 5  # host-key x7, lb-setup x2, init, refresh x5, join x5


def test_each_node_joins_with_a_token_of_its_own(offline_run):
    """Issue #30 §5: a token per join generation. A node's refresh creates its token and its join
    uses it; no other step carries it, the token `kubeadm init` made goes only to init, and
    verify-cluster gets every token's ID (and no secret half) to delete them after the joins."""
    secrets = _secret_values(offline_run)
    init_token = f"{secrets['bootstrap-token-id']}.{secrets['bootstrap-token-secret']}"
    join_nodes = [n for n in NODES if "-lb" not in n]
    tokens = {node: secrets[f"{node}-join-token"] for node in join_nodes}
    assert len(set(tokens.values())) == len(join_nodes)
    for reg in offline_run.of_type(COMMAND):
        texts = _bundle_texts(reg.plain_inputs["stdin"])
        holds = {node for node, token in tokens.items() if token in texts}
        owner = reg.name.removesuffix("-refresh-join-material").removesuffix("-kubeadm-join")
        if owner != reg.name:
            assert holds == {owner}, (reg.name, holds)
        else:
            assert holds == set(), (reg.name, holds)
        assert (init_token in texts) == (reg.name == "labs-k8s-m01-kubeadm-init"), reg.name
    for node in join_nodes:
        token = offline_run.by_name(f"{node}-join-token")
        assert token.plain_inputs["length"] == 22 and token.plain_inputs["special"] is False
        assert token.plain_inputs["upper"] is False
        assert token.plain_inputs["keepers"] == {"vm": f"{node}-id", "joinAttempt": "join-attempt:1"}, node
    verify = _bundle_texts(offline_run.by_name("verify-cluster").plain_inputs["stdin"])
    for token_value in [init_token, *tokens.values()]:
        token_id, secret = token_value.split(".")
        assert token_id in verify and secret not in verify


def test_each_control_plane_joins_with_a_certificate_key_of_its_own(offline_run):
    """Issue 50: the certificate key decrypts the cluster's CA keys in kubeadm-certs. One per stack,
    never rotated, a key seen at the first join still opened the last upload: each control-plane
    join generation draws its own, as the tokens do, and `kubeadm init` keeps the stack's."""
    secrets = _secret_values(offline_run)
    control_planes = [n for n in NODES if "-m0" in n]
    keys = {node: secrets[f"{node}-certificate-key"] for node in control_planes}
    init_key = secrets["certificate-key"]
    assert len({init_key, *keys.values()}) == 1 + len(control_planes)
    assert not [n for n in NODES if n not in control_planes and f"{n}-certificate-key" in secrets]
    for reg in offline_run.of_type(COMMAND):
        texts = _bundle_texts(reg.plain_inputs["stdin"])
        holds = {node for node, key in keys.items() if key in texts}
        owner = reg.name.removesuffix("-refresh-join-material").removesuffix("-kubeadm-join")
        assert holds == ({owner} if owner in keys and owner != reg.name else set()), (reg.name, holds)
        assert (init_key in texts) == (reg.name == "labs-k8s-m01-kubeadm-init"), reg.name
    for node in control_planes:
        key = offline_run.by_name(f"{node}-certificate-key")
        assert key.plain_inputs["byteLength"] == 32
        assert key.plain_inputs["keepers"] == {"vm": f"{node}-id", "joinAttempt": "join-attempt:1"}, node
        assert "hex" in key.additional_secret_outputs


def test_the_join_pins_the_ca_hash_its_refresh_printed(offline_run):
    refresh = offline_run.by_name("labs-k8s-w01-refresh-join-material")
    join = offline_run.by_name("labs-k8s-w01-kubeadm-join")
    assert f"bash ./join-worker.sh {refresh.plain_outputs['stdout']}" in join.plain_inputs["stdin"]
    kubeconfig = offline_run.by_name("kubeconfig")
    assert offline_run.stack_outputs["kubeconfig"] == "[secret]"
    assert {"stdout", "stderr"} <= set(kubeconfig.additional_secret_outputs)
    assert kubeconfig.plain_inputs["logging"] == "none"


def _rotated(run, node: str) -> dict:
    """`pulumi up --replace` of the node's seed: the provider's answer, a new seed."""
    seed = run.by_name(f"{node}-host-key-seed").plain_outputs
    return {("random:index/randomId:RandomId", f"{node}-host-key-seed"): {**seed, "hex": "5a" * 32}}


def test_a_rotated_host_key_is_installed_over_a_session_pinned_to_the_old_one(offline_run):
    first = offline_run
    old = first.by_name("labs-k8s-w01-prepare").plain_inputs["connection"]["hostKey"]
    new = host_keys.ed25519_host_key("5a" * 32).public_openssh
    second = run_program("labs", kept=_rotated(first, "labs-k8s-w01"), previous=first.previous_state())
    install = second.by_name("labs-k8s-w01-host-key")
    assert install.plain_inputs["connection"]["hostKey"] == old != new
    assert host_keys.ed25519_host_key("5a" * 32).private_openssh in _bundle_texts(install.plain_inputs["stdin"])
    # Every other step on the node pins the new key, after the install.
    for name in (
        "labs-k8s-w01-ready",
        "labs-k8s-w01-node-settings",
        "labs-k8s-w01-prepare",
        "labs-k8s-w01-kubeadm-join",
    ):
        assert second.by_name(name).plain_inputs["connection"]["hostKey"] == new, name
        assert second.depends_on(name, "labs-k8s-w01-host-key"), name
    # The VM keeps its identity; its user-data has the new key for a future replacement.
    assert (
        second.by_name("labs-k8s-w01").plain_inputs["replaceTrigger"]
        == first.by_name("labs-k8s-w01").plain_inputs["replaceTrigger"]
    )
    assert _userdata(second, "labs-k8s-w01")["ssh_keys"]["ed25519_public"] == new
    assert f"10.3.60.54 {new}" in second.stack_outputs["sshKnownHosts"]
    # The next run after the rotation pins the new key everywhere.
    third = run_program("labs", kept=_rotated(first, "labs-k8s-w01"), previous=second.previous_state())
    assert third.by_name("labs-k8s-w01-host-key").plain_inputs["connection"]["hostKey"] == new
    # Other nodes are untouched.
    assert (
        second.by_name("labs-k8s-w02-host-key").plain_inputs["connection"]["hostKey"]
        == first.by_name("labs-k8s-w02-host-key").plain_inputs["connection"]["hostKey"]
    )


def test_a_new_vm_is_reached_with_its_new_key_not_the_old_vms(offline_run):
    """A replaced VM (another id) booted with the key of its user-data: the host-key step pins that."""
    previous = offline_run.previous_state()
    for entry in previous.values():
        triggers = entry["outputs"].get("triggers")
        if isinstance(triggers, list):
            entry["outputs"]["triggers"] = [t.replace("labs-k8s-w01-id", "old-vm-id") for t in triggers]
    run = run_program("labs", kept=_rotated(offline_run, "labs-k8s-w01"), previous=previous)
    new = host_keys.ed25519_host_key("5a" * 32).public_openssh
    assert run.by_name("labs-k8s-w01-host-key").plain_inputs["connection"]["hostKey"] == new


def test_the_certificate_key_goes_only_to_steps_that_upload_or_fetch_certificates(offline_run):
    """It decrypts the cluster's CA keys (kubeadm-certs): the stack's goes to init alone, each
    control plane's own (issue 50) to that control plane's refresh and join."""
    secrets = _secret_values(offline_run)
    expected = {
        "certificate-key": {"labs-k8s-m01-kubeadm-init"},
        **{
            f"labs-k8s-m0{i}-certificate-key": {f"labs-k8s-m0{i}-refresh-join-material", f"labs-k8s-m0{i}-kubeadm-join"}
            for i in (1, 2, 3)
        },
    }
    for name, steps in expected.items():
        key = secrets[name]
        having = {r.name for r in offline_run.of_type(COMMAND) if key in _bundle_texts(r.plain_inputs["stdin"])}
        assert having == steps, name


def test_the_secrets_encryption_key_goes_only_to_init_and_the_control_planes_joins(offline_run):
    """Issue 50: kube-apiserver encrypts Secrets in etcd with one stack key, generated once and kept
    as a secret in the state; it reaches a control plane only in the stdin of init and of its join
    (in encryption-config.yaml, removed from the step directory when the step ends), never a
    worker, a refresh, argv, a trigger or a log."""
    key = offline_run.by_name("secrets-encryption-key")
    assert key.type == "random:index/randomId:RandomId" and key.plain_inputs["byteLength"] == 32
    assert "keepers" not in key.plain_inputs  # never replaced by a change elsewhere
    assert set(key.additional_secret_outputs) == {"hex", "b64Std", "b64Url", "dec"}
    value = _secret_values(offline_run)["secrets-encryption-key"]
    having = {}
    for reg in offline_run.of_type(COMMAND):
        stdin = reg.plain_inputs["stdin"]
        if value in _bundle_texts(stdin):
            having[reg.name] = reg
            assert [n for n, text in bundle_files(stdin).items() if value in text] == ["encryption-config.yaml"]
            assert "stdin" in reg.secret_input_keys and reg.plain_inputs["logging"] == "none", reg.name
            assert "/encryption-config.yaml" in stdin.split("\ntrap ", 1)[1].splitlines()[0], reg.name
        for field in ("create", "delete", "triggers"):
            assert value not in str(reg.plain_inputs.get(field, "")), (reg.name, field)
    assert set(having) == {"labs-k8s-m01-kubeadm-init", *(f"labs-k8s-m0{i}-kubeadm-join" for i in (1, 2, 3))}


def test_a_preview_runs_without_the_ssh_private_key_and_keeps_the_recorded_connections(monkeypatch):
    """The preview job holds no SSH key (issue #30 §4): with LABS_K8S_PREVIEW_WITHOUT_SSH_KEY=true a
    preview evaluates the whole graph, and every remote step compares its recorded connection
    (the placeholder key would otherwise show every step as an update)."""
    from components.stack_config import PREVIEW_PLACEHOLDER_PRIVATE_KEY, PREVIEW_WITHOUT_SSH_KEY

    monkeypatch.setenv(PREVIEW_WITHOUT_SSH_KEY, "true")
    preview = run_program("labs", overrides={"labs-k8s:sshPrivateKey": ""}, preview=True)
    steps = [r for r in preview.registrations.values() if r.type == "command:remote:Command"]
    assert len(steps) > 20
    assert all("connection" in r.ignore_changes for r in steps)
    assert all(r.plain_inputs["connection"]["privateKey"] == PREVIEW_PLACEHOLDER_PRIVATE_KEY for r in steps[:3])
    assert all(r.inputs["connection"] == "[secret]" for r in steps)
    assert not any("connection" in r.ignore_changes for r in preview.registrations.values() if "remote" not in r.type)
    monkeypatch.delenv(PREVIEW_WITHOUT_SSH_KEY)
    keyed = run_program("labs", preview=True)
    assert {r.name for r in keyed.registrations.values()} == {r.name for r in preview.registrations.values()}
    assert not any("connection" in r.ignore_changes for r in keyed.registrations.values())


@pytest.mark.parametrize(("value", "preview"), [("true", False), ("yes", True)])
def test_the_preview_only_path_is_refused_outside_a_preview(monkeypatch, value, preview):
    from components.stack_config import PREVIEW_WITHOUT_SSH_KEY

    monkeypatch.setenv(PREVIEW_WITHOUT_SSH_KEY, value)
    monitors: list[RecordingMonitor] = []
    with pytest.raises(pulumi.RunError) as caught:
        run_program("labs", preview=preview, monitor_sink=monitors)
    assert f"{PREVIEW_WITHOUT_SSH_KEY}=" in str(caught.value) and "unset it" in str(caught.value)
    assert monitors[0].registrations == {}


# --------------------------------------------------------------------------- the step library


def test_each_node_gets_the_step_library_once_and_only_the_guards_carry_it_again(offline_run):
    """lib.sh and upgrade-lib.sh travel in each Kubernetes node's prepare bundle, which installs them;
    every later step copies them on its node, by their SHA-256. Carried by every step they were half
    of a 10-worker lab's state, which the file backend rewrites at each step's start and end. The
    guards' deletes run with an earlier `up`'s bundle on whichever control plane: they keep theirs."""
    library = k8s.step_library()
    lib_text = library.files[k8s.LIB_FILE]
    carriers, users = set(), set()
    for reg in offline_run.of_type(COMMAND):
        stdin = reg.plain_inputs["stdin"]
        if lib_text in stdin:
            carriers.add(reg.name)
        if f"{LIBRARY_ROOT}/{library.digest}/{k8s.LIB_FILE}" in stdin:
            users.add(reg.name)
    prepares = {f"{node}-prepare" for node in K8S_NODES}
    guards = {f"{node}-leave-cluster" for node in K8S_NODES} | {"teardown-guard"}
    assert carriers == prepares | guards
    assert {"labs-k8s-m01-kubeadm-init", "labs-k8s-w01-kubeadm-join", "labs-k8s-w01-upgrade-drain"} <= users
    assert not users & guards
    for name in prepares:
        assert (
            f'mv -T -- "$library_new" {LIBRARY_ROOT}/{library.digest}\n'
            in offline_run.by_name(name).plain_inputs["stdin"]
        )


def test_a_step_through_the_vip_copies_the_library_only_after_every_control_plane_has_it(offline_run):
    """HAProxy may send the session to any healthy control plane (remote.cluster_connection)."""
    library = k8s.step_library()
    through_vip = [
        reg
        for reg in offline_run.of_type(COMMAND)
        if reg.plain_inputs["connection"]["host"] == "10.3.60.100"
        and f"{LIBRARY_ROOT}/{library.digest}/" in reg.plain_inputs["stdin"]
    ]
    assert {"verify-cluster", "kubeconfig", "flannel", "labs-k8s-w02-refresh-join-material"} <= {
        reg.name for reg in through_vip
    }
    for reg in through_vip:
        direct = {urn.rsplit("::", 1)[-1] for urn in reg.dependencies}
        assert {f"labs-k8s-m0{i}-prepare" for i in (1, 2, 3)} <= direct, reg.name


# --------------------------------------------------------------------------- issue 50: minor items


def test_a_plain_http_registry_mirror_is_warned_about_at_every_preview(run_with, monkeypatch):
    """Accepted only with mirrors.allowInsecureRegistryMirror, and then said every time, not once."""
    warnings: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **k: warnings.append(str(message)))
    mirrors = {"registryMirror": "http://registry.lab.local:5000", "allowInsecureRegistryMirror": True}
    for preview in (True, False):
        warnings.clear()
        run_program("labs", overrides={"labs-k8s:mirrors": mirrors}, preview=preview)
        assert [w for w in warnings if "labs-k8s:mirrors.registryMirror 'http://registry.lab.local:5000'" in w]
