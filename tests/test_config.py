"""The lab config model: every validation rule names its key and the fix; problems come together."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from components.config import LabConfigError, Role, load_lab_config, mac_for_ip


def problems(namespace: dict[str, Any]) -> dict[str, str]:
    """key -> message for every problem the config has (fails the test if it has none)."""
    with pytest.raises(LabConfigError) as caught:
        load_lab_config(namespace)
    found = {p.key: p.message for p in caught.value.problems}
    assert str(caught.value).startswith("the labs-k8s config has")
    for key in found:
        assert f"labs-k8s:{key}: " in str(caught.value)
    return found


def hosts(ns: dict[str, Any], role: str) -> list[dict[str, Any]]:
    return ns["nodes"][role]["hosts"]


def test_committed_lab_is_the_seed_lab(lab_config):
    names = {n.name: (str(n.ip), n.role) for n in lab_config.all_nodes}
    assert names == {
        "labs-k8s-lb01": ("10.3.60.50", Role.BALANCER),
        "labs-k8s-lb02": ("10.3.60.56", Role.BALANCER),
        "labs-k8s-m01": ("10.3.60.51", Role.CONTROL_PLANE),
        "labs-k8s-m02": ("10.3.60.52", Role.CONTROL_PLANE),
        "labs-k8s-m03": ("10.3.60.53", Role.CONTROL_PLANE),
        "labs-k8s-w01": ("10.3.60.54", Role.WORKER),
        "labs-k8s-w02": ("10.3.60.55", Role.WORKER),
    }
    assert str(lab_config.load_balancer.vip) == "10.3.60.100"
    assert str(lab_config.kubernetes.pod_cidr) == "10.244.0.0/16"
    assert str(lab_config.kubernetes.service_cidr) == "10.96.0.0/12"
    assert lab_config.kubernetes.minor == 36
    assert lab_config.anti_affinity.control_planes == "mandatory"
    assert lab_config.anti_affinity.workers == "preferred"


def test_seed_sizing_defaults_are_within_the_seed_ranges(lab_config):
    for node in lab_config.control_planes:
        assert node.vcpu >= 2 and node.memory_mib >= 4096
    for node in lab_config.workers:
        assert 2 <= node.vcpu <= 4 and 4096 <= node.memory_mib <= 8192
    for node in lab_config.balancers:
        assert 1 <= node.vcpu <= 2 and 1024 <= node.memory_mib <= 2048


def test_malformed_ip_names_the_key(lab_namespace):
    hosts(lab_namespace, "workers")[1]["ip"] = "10.3.60.300"
    found = problems(lab_namespace)
    assert "nodes.workers.hosts[1].ip" in found
    assert "IPv4" in found["nodes.workers.hosts[1].ip"]


def test_duplicate_ip(lab_namespace):
    hosts(lab_namespace, "workers")[1]["ip"] = "10.3.60.54"
    found = problems(lab_namespace)
    assert "already used by labs-k8s:nodes.workers.hosts[0].ip" in found["nodes.workers.hosts[1].ip"]


@pytest.mark.parametrize(
    ("key", "mutate"),
    [
        ("nodes.controlPlanes.hosts[2].ip", lambda ns: hosts(ns, "controlPlanes")[2].update(ip="10.3.61.53")),
        ("network.gateway", lambda ns: ns["network"].update(gateway="192.168.1.1")),
        ("loadBalancer.vip", lambda ns: ns["loadBalancer"].update(vip="10.9.9.9")),
    ],
)
def test_addresses_outside_the_node_cidr(lab_namespace, key, mutate):
    mutate(lab_namespace)
    found = problems(lab_namespace)
    assert "outside network.cidr 10.3.60.0/24" in found[key]


def test_vip_equal_to_gateway(lab_namespace):
    lab_namespace["loadBalancer"]["vip"] = "10.3.60.1"
    assert "is the gateway" in problems(lab_namespace)["loadBalancer.vip"]


def test_vip_equal_to_a_node_ip(lab_namespace):
    lab_namespace["loadBalancer"]["vip"] = "10.3.60.56"
    assert "labs-k8s:nodes.balancers.hosts[1].ip" in problems(lab_namespace)["loadBalancer.vip"]


@pytest.mark.parametrize("name", ["Labs-K8s-W01", "w_01", "-w01", "w01-", "x" * 64, "w01.labs"])
def test_invalid_hostnames(lab_namespace, name):
    hosts(lab_namespace, "workers")[0]["name"] = name
    message = problems(lab_namespace)["nodes.workers.hosts[0].name"]
    assert "not a valid hostname" in message and "1-63" in message


def test_sixty_three_character_hostname_is_fine(lab_namespace):
    hosts(lab_namespace, "workers")[0]["name"] = "w" * 63
    assert load_lab_config(lab_namespace).workers[0].name == "w" * 63


def test_duplicate_hostname(lab_namespace):
    hosts(lab_namespace, "workers")[1]["name"] = "labs-k8s-m01"
    assert (
        "already used by labs-k8s:nodes.controlPlanes.hosts[0].name"
        in problems(lab_namespace)["nodes.workers.hosts[1].name"]
    )


def test_even_number_of_control_planes(lab_namespace):
    hosts(lab_namespace, "controlPlanes").pop()
    message = problems(lab_namespace)["nodes.controlPlanes.hosts"]
    assert "odd number" in message and "list 1 or 3" in message


def test_zero_control_planes(lab_namespace):
    lab_namespace["nodes"]["controlPlanes"]["hosts"] = []
    assert "no control planes" in problems(lab_namespace)["nodes.controlPlanes.hosts"]


def test_single_control_plane_needs_the_explicit_opt_in(lab_namespace):
    del hosts(lab_namespace, "controlPlanes")[1:]
    assert "allowSingleControlPlane" in problems(lab_namespace)["nodes.controlPlanes.hosts"]
    lab_namespace["kubernetes"]["allowSingleControlPlane"] = True
    assert len(load_lab_config(lab_namespace).control_planes) == 1


@pytest.mark.parametrize("count", [0, 3])
def test_balancer_count_other_than_two(lab_namespace, count):
    balancers = hosts(lab_namespace, "balancers")
    if count == 0:
        balancers.clear()
    else:
        balancers.append({"name": "labs-k8s-lb03", "ip": "10.3.60.57"})
    assert "exactly 2" in problems(lab_namespace)["nodes.balancers.hosts"]


def test_single_balancer_needs_the_explicit_opt_in(lab_namespace):
    hosts(lab_namespace, "balancers").pop()
    assert "allowSingleBalancer" in problems(lab_namespace)["nodes.balancers.hosts"]
    lab_namespace["loadBalancer"]["allowSingleBalancer"] = True
    assert len(load_lab_config(lab_namespace).balancers) == 1


@pytest.mark.parametrize(
    ("key", "value", "clashes_with"),
    [
        ("podCidr", "10.3.0.0/16", "network.cidr"),
        ("serviceCidr", "10.244.128.0/17", "kubernetes.podCidr"),
        ("serviceCidr", "10.3.60.0/25", "network.cidr"),
    ],
)
def test_overlapping_cidrs(lab_namespace, key, value, clashes_with):
    lab_namespace["kubernetes"][key] = value
    message = problems(lab_namespace)[f"kubernetes.{key}"]
    assert f"overlaps {clashes_with}" in message


@pytest.mark.parametrize("version", ["1.36", "v1.36.0", "1.36.x", "2.0.0", ""])
def test_malformed_kubernetes_version(lab_namespace, version):
    lab_namespace["kubernetes"]["version"] = version
    assert "MAJOR.MINOR.PATCH" in problems(lab_namespace)["kubernetes.version"]


@pytest.mark.parametrize("version", ["1.29.9", "1.38.0"])
def test_unsupported_kubernetes_version(lab_namespace, version):
    lab_namespace["kubernetes"]["version"] = version
    assert "not supported" in problems(lab_namespace)["kubernetes.version"]


@pytest.mark.parametrize(
    ("kubernetes", "message"),
    [
        ({"containerdVersion": "2.2"}, "not a containerd release"),
        ({"containerdVersion": "latest"}, "not a containerd release"),
        (
            {"containerdVersion": "1.7.28"},
            "too old for Kubernetes 1.36.0 (labs-k8s:kubernetes.version); use 2.0 or newer",
        ),
        (
            {"version": "1.35.2", "containerdVersion": "1.6.20"},
            "too old for Kubernetes 1.35.2 (labs-k8s:kubernetes.version); use 1.7",
        ),
    ],
)
def test_containerd_version_is_a_release_the_kubernetes_minor_supports(lab_namespace, kubernetes, message):
    lab_namespace["kubernetes"].update(kubernetes)
    assert message in problems(lab_namespace)["kubernetes.containerdVersion"]


def test_containerd_1_7_is_fine_for_older_minors(lab_namespace):
    lab_namespace["kubernetes"].update(version="1.35.2", containerdVersion="1.7.28")
    assert load_lab_config(lab_namespace).kubernetes.containerd_version == "1.7.28"


@pytest.mark.parametrize(
    ("role", "field", "value", "minimum"),
    [
        ("controlPlanes", "vcpu", 1, "2"),
        ("controlPlanes", "memoryMib", 2048, "4096"),
        ("workers", "vcpu", 1, "2"),
        ("workers", "memoryMib", 3072, "4096"),
        ("balancers", "memoryMib", 512, "1024"),
        ("controlPlanes", "dataDiskGib", 5, "10"),
    ],
)
def test_sizes_below_the_minimums(lab_namespace, role, field, value, minimum):
    lab_namespace["nodes"][role][field] = value
    message = problems(lab_namespace)[f"nodes.{role}.{field}"]
    assert f"at least {minimum}" in message


@pytest.mark.parametrize(
    "key",
    [
        "not a key",
        "ssh-ed25519",
        "ssh-ed25519 !!!notbase64!!!",
        "ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAIDepyaBTvQco3InMZ3UGqqttoQO27Y46RlhA2zNSr1XW",  # body says ed25519
        "-----BEGIN OPENSSH PRIVATE KEY-----",
    ],
)
def test_malformed_ssh_public_key(lab_namespace, key):
    lab_namespace["ssh"]["publicKey"] = key
    message = problems(lab_namespace)["ssh.publicKey"]
    assert ".pub" in message  # every variant says where a good key comes from


def test_valid_ssh_public_key_is_accepted(lab_namespace):
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDepyaBTvQco3InMZ3UGqqttoQO27Y46RlhA2zNSr1XW me@laptop"
    lab_namespace["ssh"]["publicKey"] = key
    assert load_lab_config(lab_namespace).ssh.public_key == key


@pytest.mark.parametrize("field", ["datacenter", "computeCluster", "datastore", "network", "folder"])
def test_missing_vsphere_placement(lab_namespace, field):
    del lab_namespace["vsphere"][field]
    message = problems(lab_namespace)[f"vsphere.{field}"]
    assert "required" in message and "Pulumi.<stack>.yaml" in message


def test_missing_whole_section(lab_namespace):
    del lab_namespace["vsphere"]
    assert "vsphere" in problems(lab_namespace)


def test_unknown_keys_are_named(lab_namespace):
    lab_namespace["loadBalancer"]["vipp"] = "10.3.60.100"
    lab_namespace["worker"] = {}
    found = problems(lab_namespace)
    assert "camelCase" in found["loadBalancer.vipp"]
    assert "unknown key" in found["worker"]


def test_several_problems_are_reported_together(lab_namespace):
    hosts(lab_namespace, "workers")[1]["ip"] = "10.3.60.54"  # duplicate
    lab_namespace["loadBalancer"]["vip"] = "10.3.60.1"  # the gateway
    hosts(lab_namespace, "controlPlanes").pop()  # even
    lab_namespace["kubernetes"]["version"] = "1.99.0"  # unsupported
    hosts(lab_namespace, "workers")[0]["name"] = "Bad_Name"  # hostname
    found = problems(lab_namespace)
    assert {
        "nodes.workers.hosts[1].ip",
        "loadBalancer.vip",
        "nodes.controlPlanes.hosts",
        "kubernetes.version",
        "nodes.workers.hosts[0].name",
    } <= set(found)


def test_several_shape_errors_are_reported_together(lab_namespace):
    hosts(lab_namespace, "workers")[0]["ip"] = "nope"
    lab_namespace["network"]["cidr"] = "10.3.60.1/24"  # host bits set
    found = problems(lab_namespace)
    assert {"nodes.workers.hosts[0].ip", "network.cidr"} <= set(found)


def test_kubeadm_api_version_follows_the_minor(lab_namespace):
    lab_namespace["kubernetes"]["version"] = "1.30.14"
    assert load_lab_config(lab_namespace).kubernetes.kubeadm_api_version == "kubeadm.k8s.io/v1beta3"
    lab_namespace["kubernetes"]["version"] = "1.31.0"
    assert load_lab_config(lab_namespace).kubernetes.kubeadm_api_version == "kubeadm.k8s.io/v1beta4"


# --------------------------------------------------------------------------- NIC: static MAC and name


def test_macs_derive_from_the_ip_inside_vmwares_manual_range(lab_config):
    macs = {n.name: n.mac for n in lab_config.all_nodes}
    # 10.3.60.51: 00:50:56 + the address's low 22 bits (0x03, 0x3c, 0x33).
    assert macs["labs-k8s-m01"] == "00:50:56:03:3c:33"
    assert macs["labs-k8s-lb02"] == "00:50:56:03:3c:38"
    assert len(set(macs.values())) == len(macs)
    for mac in macs.values():
        assert mac.startswith("00:50:56:") and int(mac.split(":")[3], 16) <= 0x3F


def test_low_22_bits_are_unique_within_a_slash_10():
    # The highest and lowest address of a /10 and their neighbours map to distinct MACs.
    network = ipaddress.IPv4Network("10.64.0.0/10")
    probes = [network.network_address + i for i in (0, 1, 2)] + [network.broadcast_address - i for i in (0, 1, 2)]
    assert len({mac_for_ip(ip) for ip in probes}) == len(probes)
    assert mac_for_ip(network.broadcast_address) == "00:50:56:3f:ff:ff"  # the top of the manual range
    assert mac_for_ip(ipaddress.IPv4Address("10.0.0.1")) == mac_for_ip(ipaddress.IPv4Address("10.64.0.1"))


def test_a_host_may_pin_its_mac(lab_namespace):
    hosts(lab_namespace, "workers")[0]["mac"] = "00-50-56-3F-00-01"
    workers = load_lab_config(lab_namespace).workers
    assert workers[0].mac == "00:50:56:3f:00:01"  # normalized: lowercase, colons
    assert workers[1].mac == "00:50:56:03:3c:37"


@pytest.mark.parametrize(
    ("mac", "says"),
    [
        ("00:50:56:40:00:01", "outside VMware's range for static MACs"),
        ("00:0c:29:00:00:01", "outside VMware's range for static MACs"),
        ("00:50:56:00:01", "not a MAC address"),
        ("00:50:56:zz:00:01", "not a MAC address"),
    ],
)
def test_a_pinned_mac_must_be_a_manual_vmware_mac(lab_namespace, mac, says):
    hosts(lab_namespace, "workers")[0]["mac"] = mac
    assert says in problems(lab_namespace)["nodes.workers.hosts[0].mac"]


def test_macs_are_unique(lab_namespace):
    hosts(lab_namespace, "workers")[1]["mac"] = "00:50:56:03:3c:36"  # w01's derived MAC
    message = problems(lab_namespace)["nodes.workers.hosts[1].mac"]
    assert "already used by labs-k8s:nodes.workers.hosts[0].ip" in message


def test_derived_macs_collide_only_beyond_a_slash_10(lab_namespace):
    lab_namespace["network"]["cidr"] = "10.0.0.0/8"
    hosts(lab_namespace, "workers")[1]["ip"] = "10.67.60.54"  # same low 22 bits as w01's 10.3.60.54
    message = problems(lab_namespace)["nodes.workers.hosts[1].ip"]
    assert "MAC 00:50:56:03:3c:36 (the MAC derived from 10.67.60.54) is already used" in message
    assert "labs-k8s:nodes.workers.hosts[1].mac" in message  # the fix


def test_the_old_interface_key_names_the_new_one(lab_namespace):
    lab_namespace["loadBalancer"]["interface"] = "ens160"
    message = problems(lab_namespace)["loadBalancer.interface"]
    assert "moved to labs-k8s:network.interface" in message
    assert "pulumi config set --path labs-k8s:network.interface ens160" in message


@pytest.mark.parametrize("name", ["eth0", "lo", "Ens192", "a-name-longer-than-15", "ens 192", "9net", ""])
def test_bad_interface_names(lab_namespace, name):
    lab_namespace["network"]["interface"] = name
    assert "network.interface" in problems(lab_namespace)


@pytest.mark.parametrize("name", ["ens192", "ens160", "lab0", "node-nic_1"])
def test_good_interface_names(lab_namespace, name):
    lab_namespace["network"]["interface"] = name
    assert load_lab_config(lab_namespace).network.interface == name


def test_extra_public_keys_are_checked_one_by_one(lab_namespace):
    lab_namespace["ssh"]["extraPublicKeys"] = [lab_namespace["ssh"]["publicKey"], "ssh-ed25519 not-base64!"]
    found = problems(lab_namespace)
    assert list(found) == ["ssh.extraPublicKeys[1]"]


# --------------------------------------------------------------------------- issue 24: workers, YAML shapes


def test_zero_workers_are_refused(lab_namespace):
    """The lab built with no worker, and nothing could run: kubeadm keeps the control planes tainted."""
    lab_namespace["nodes"]["workers"]["hosts"] = []
    found = problems(lab_namespace)
    assert "no workers: kubeadm taints the control planes NoSchedule" in found["nodes.workers.hosts"]
    assert "kubernetes.upgrade.workersAtOnce" not in found  # one problem, said once
    lab_namespace["kubernetes"]["allowSingleWorker"] = True
    assert "nodes.workers.hosts" in problems(lab_namespace)  # the opt-in is for one worker, not none


def test_a_single_worker_needs_the_explicit_opt_in(lab_namespace):
    """With one worker, workersAtOnce: 1 (its only legal value) drains the only worker on upgrade."""
    hosts(lab_namespace, "workers").pop()
    message = problems(lab_namespace)["nodes.workers.hosts"]
    assert "every Kubernetes upgrade drains it" in message and "allowSingleWorker: true" in message
    lab_namespace["kubernetes"]["allowSingleWorker"] = True
    assert len(load_lab_config(lab_namespace).workers) == 1
    lab_namespace["kubernetes"]["upgrade"] = {"workersAtOnce": 2}
    assert "use 1 to 1" in problems(lab_namespace)["kubernetes.upgrade.workersAtOnce"]


def test_a_single_dns_server_not_in_a_list_says_the_list_form(lab_namespace):
    lab_namespace["network"]["dnsServers"] = "10.3.60.1"
    message = problems(lab_namespace)["network.dnsServers"]
    assert message.startswith("Input should be a valid list (got '10.3.60.1')")
    assert "write a YAML list, one `- item` per line" in message


def test_an_unquoted_version_says_to_quote_it(lab_namespace):
    lab_namespace["kubernetes"]["version"] = 1.36
    message = problems(lab_namespace)["kubernetes.version"]
    assert message.startswith("Input should be a valid string (got 1.36)")
    assert 'quote it, so that YAML keeps it text and whole: "1.36.0"' in message
    lab_namespace["kubernetes"]["version"] = "1.36.0"
    lab_namespace["template"]["name"] = 12
    assert problems(lab_namespace)["template.name"].endswith("quote it, so that YAML keeps it text")


# --------------------------------------------------------------------------- issue 30 §3: strict inputs
# Each value below reached a file on the nodes verbatim: apt.conf, containerd's hosts.toml,
# authorized_keys, the user-data. The config is refused, the key named, the fix said.

APT_PRE_INVOKE = 'http://proxy.lab:3142/";APT::Update::Pre-Invoke{"touch /root/owned"};//'
TOML_INJECTION = 'https://mirror.lab:5000"]\n  skip_verify = true\n[host."https://mirror.lab:5000'
SEED_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDepyaBTvQco3InMZ3UGqqttoQO27Y46RlhA2zNSr1XW"


def set_path(namespace: dict[str, Any], path: str, value: Any) -> None:
    section, key = path.split(".")
    namespace.setdefault(section, {})[key] = value


@pytest.mark.parametrize(
    ("path", "value", "fix"),
    [
        ("mirrors.aptProxy", APT_PRE_INVOKE, "such as http://proxy.lab.example:3142"),
        ("mirrors.aptProxy", "http://proxy.lab:3142\nAcquire::https::Verify-Peer false", "such as http://"),
        ("mirrors.aptProxy", "http://user:secret@proxy.lab:3142", "such as http://"),
        ("mirrors.aptProxy", "http://proxy.lab:99999", "such as http://"),
        ("mirrors.aptProxy", "socks5h://proxy.lab:1080", "such as http://"),
        ("mirrors.aptProxy", "http://10.3.60.300:3142", "such as http://"),
        ("mirrors.registryMirror", TOML_INJECTION, "such as https://registry-mirror.lab.example:5000"),
        ("mirrors.registryMirror", "https://mirror.lab/v2?ns=docker.io", "such as https://"),
        ("mirrors.registryMirror", "https://mirror.lab/'x", "such as https://"),
        ("preflight.kubernetesPackagesUrl", 'https://pkgs.k8s.io/";x', "such as https://pkgs.k8s.io/core:/stable:"),
    ],
)
def test_proxy_and_mirror_urls_are_checked_whole(lab_namespace, path, value, fix):
    set_path(lab_namespace, path, value)
    found = problems(lab_namespace)
    assert list(found) == [path]
    assert fix in found[path]


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("mirrors.aptProxy", "http://10.3.60.1:3142"),
        ("mirrors.aptProxy", "http://apt-cacher.lab.local:3142/"),
        ("mirrors.aptProxy", "http://[fd00:3:60::1]:3142"),
        ("mirrors.registryMirror", "https://registry-mirror.lab.local:5000"),
        ("mirrors.registryMirror", "https://harbor.lab.local/v2/proxy-cache"),
    ],
)
def test_ordinary_proxy_and_mirror_urls_are_accepted(lab_namespace, path, value):
    set_path(lab_namespace, path, value)
    section, key = path.split(".")
    assert load_lab_config(lab_namespace).model_dump(by_alias=True)[section][key] == value


@pytest.mark.parametrize(
    "value",
    [
        SEED_KEY + " me@laptop\nssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDepyaBTvQco3InMZ3UGqqttoQO27Y46RlhA2zNSr1XW evil",
        SEED_KEY + '\ncommand="/bin/sh" ssh-ed25519 AAAA',
        SEED_KEY + " me\r@laptop",
        SEED_KEY + "\n",
    ],
)
def test_an_ssh_public_key_is_exactly_one_line(lab_namespace, value):
    lab_namespace["ssh"]["publicKey"] = value
    assert "exactly one line" in problems(lab_namespace)["ssh.publicKey"]
    lab_namespace["ssh"]["publicKey"] = SEED_KEY
    lab_namespace["ssh"]["extraPublicKeys"] = [SEED_KEY + " ok", value]
    found = problems(lab_namespace)
    assert list(found) == ["ssh.extraPublicKeys[1]"]
    assert "paste the single line of the .pub file" in found["ssh.extraPublicKeys[1]"]


@pytest.mark.parametrize(
    "server",
    [
        "0.debian.pool.ntp.org\nruncmd: [touch /root/owned]",
        "pool.ntp.org iburst",
        "ntp_1.lab",
        "-ntp.lab",
        "10.3.60.300",
    ],
)
def test_ntp_servers_are_host_names_or_addresses(lab_namespace, server):
    lab_namespace["network"]["ntpServers"] = ["10.3.60.1", server]
    found = problems(lab_namespace)
    assert list(found) == ["network.ntpServers[1]"]
    assert "such as 0.debian.pool.ntp.org or 10.3.60.1" in found["network.ntpServers[1]"]


def test_ordinary_ntp_servers_are_accepted(lab_namespace):
    servers = ["0.debian.pool.ntp.org", "10.3.60.1", "fd00:3:60::1", "ntp.labs.local.", "Time-A.example"]
    lab_namespace["network"]["ntpServers"] = servers
    assert load_lab_config(lab_namespace).network.ntp_servers == servers


@pytest.mark.parametrize("domain", ["labs.local\nnameserver 6.6.6.6", "labs local", "labs..local", "10.3.60.1", ""])
def test_search_domain_is_a_domain(lab_namespace, domain):
    lab_namespace["network"]["searchDomain"] = domain
    found = problems(lab_namespace)
    assert list(found) == ["network.searchDomain"]
    assert "such as labs.local" in found["network.searchDomain"]


def test_snake_case_keys_are_named_with_their_camel_case_spelling(lab_namespace):
    """pydantic took `data_disk_gib` by its Python name (populate_by_name), so a snake_case key
    passed silently although the error text says keys are camelCase (issue 33)."""
    lab_namespace["nodes"]["workers"]["data_disk_gib"] = lab_namespace["nodes"]["workers"].pop("dataDiskGib")
    lab_namespace["vsphere"]["compute_cluster"] = lab_namespace["vsphere"].pop("computeCluster")
    lab_namespace["template"]["build_timeout_minutes"] = 90  # a key that has a default: it was ignored
    found = problems(lab_namespace)
    assert found == {
        "nodes.workers.data_disk_gib": "write it camelCase, as every key in Pulumi.labs.yaml: dataDiskGib",
        "vsphere.compute_cluster": "write it camelCase, as every key in Pulumi.labs.yaml: computeCluster",
        "template.build_timeout_minutes": "write it camelCase, as every key in Pulumi.labs.yaml: buildTimeoutMinutes",
    }


def test_unknown_vsphere_keys_are_named_with_did_you_mean(run_with):
    """`vsphere:usr` was ignored by the provider and by the program: only the missing
    vsphere:user was reported, never the typo (issue 33)."""
    from components.stack_config import unknown_vsphere_keys

    assert unknown_vsphere_keys(["vsphere:user", "vsphere:vsphereServer", "labs-k8s:nodes"]) == []
    snake, usr = unknown_vsphere_keys(["vsphere:usr", "vsphere:allow_unverified_ssl"])  # sorted
    assert usr.startswith("vsphere:usr: unknown key") and "Did you mean vsphere:user?" in usr
    assert "Did you mean vsphere:allowUnverifiedSsl?" in snake
    # The program refuses it before any resource is registered.
    from components.tools.offline import run_program

    with pytest.raises(Exception, match=r"vsphere:usr: unknown key.*Did you mean vsphere:user\?") as caught:
        run_program("labs", overrides={"vsphere:usr": "labs-k8s@vsphere.local"})
    assert "registered" not in str(caught.value)


# --------------------------------------------------------------------------- the nodes' apt repositories
# A test lab, or an air-gapped site whose internal mirror (Artifactory, Nexus, aptly) re-signs what it
# serves with its own key, gives other URLs and fingerprints.

PKGS_K8S = "https://pkgs.k8s.io/core:/stable:"
PKGS_K8S_KEY = "DE15B14486CD377B9E876E1A234654DA9A296436"
DOCKER = "https://download.docker.com/linux/debian"
DOCKER_KEY = "9DC858229FC7DD38854AE2D88D81803C0EBFCD88"
MIRROR_KEY = "5A3B1C0F9E8D7C6B5A4F3E2D1C0B9A8F7E6D5C4B"


def set_repository(namespace: dict[str, Any], repository: str, key: str, value: Any) -> None:
    namespace.setdefault("mirrors", {}).setdefault(repository, {})[key] = value


def test_the_repositories_default_to_upstreams(lab_namespace):
    mirrors = load_lab_config(lab_namespace).mirrors
    assert (mirrors.kubernetes_repository.url, mirrors.kubernetes_repository.key_fingerprint) == (
        PKGS_K8S,
        PKGS_K8S_KEY,
    )
    assert (mirrors.containerd_repository.url, mirrors.containerd_repository.key_fingerprint) == (DOCKER, DOCKER_KEY)
    assert mirrors.kubernetes_repository.key_url("1.36") == f"{PKGS_K8S}/v1.36/deb/Release.key"
    assert mirrors.containerd_repository.key_url() == f"{DOCKER}/gpg"


def test_a_mirror_and_its_own_key_are_taken_as_users_copy_them(lab_namespace):
    """A trailing "/" goes; the fingerprint as gpg prints it (groups, lower case) becomes 40 upper-case digits."""
    set_repository(lab_namespace, "kubernetesRepository", "url", "https://artifactory.lab.local/artifactory/k8s/")
    set_repository(
        lab_namespace, "kubernetesRepository", "keyFingerprint", "5a3b 1c0f 9e8d 7c6b 5a4f  3e2d 1c0b 9a8f 7e6d 5c4b"
    )
    set_repository(lab_namespace, "containerdRepository", "url", "http://10.3.60.1:8081/repository/docker-debian")
    mirrors = load_lab_config(lab_namespace).mirrors
    assert mirrors.kubernetes_repository.url == "https://artifactory.lab.local/artifactory/k8s"
    assert mirrors.kubernetes_repository.key_fingerprint == MIRROR_KEY
    # One repository set alone leaves the other's key upstream's.
    assert mirrors.containerd_repository.url == "http://10.3.60.1:8081/repository/docker-debian"
    assert mirrors.containerd_repository.key_fingerprint == DOCKER_KEY


@pytest.mark.parametrize(
    ("repository", "key", "value", "fix"),
    [
        (
            "kubernetesRepository",
            "url",
            'https://mirror.lab/k8s";x',
            "such as https://artifactory.lab.example/k8s-stable",
        ),
        ("kubernetesRepository", "url", "ftp://mirror.lab/k8s", "is not an http:// or https:// URL"),
        ("kubernetesRepository", "url", "mirror.lab/k8s", "is not an http:// or https:// URL"),
        ("kubernetesRepository", "url", "", "empty"),
        (
            "kubernetesRepository",
            "url",
            f"{PKGS_K8S}/v1.36/deb/",
            f"give the base, {PKGS_K8S!r}: the program adds /v<minor>/deb/",
        ),
        ("kubernetesRepository", "url", "https://nexus.lab/k8s/v1.35/deb", "give the base, 'https://nexus.lab/k8s'"),
        (
            "containerdRepository",
            "url",
            "https://mirror.lab/docker debian",
            "such as https://artifactory.lab.example/docker-debian",
        ),
        ("containerdRepository", "url", "https://user:secret@mirror.lab/docker", "such as https://"),
        ("kubernetesRepository", "keyFingerprint", "234654DA9A296436", "gpg --show-keys --with-fingerprint"),
        (
            "kubernetesRepository",
            "keyFingerprint",
            "0x" + PKGS_K8S_KEY[2:],
            f"for its key file, {PKGS_K8S}/v1.36/deb/Release.key",
        ),
        ("containerdRepository", "keyFingerprint", DOCKER_KEY[:-1] + "G", f"for its key file, {DOCKER}/gpg"),
        ("containerdRepository", "keyFingerprint", DOCKER_KEY + "\n", "write the 40 hex digits"),
    ],
)
def test_a_repository_url_or_fingerprint_that_is_not_one_names_its_key(lab_namespace, repository, key, value, fix):
    set_repository(lab_namespace, repository, key, value)
    found = problems(lab_namespace)
    assert list(found) == [f"mirrors.{repository}.{key}"]
    assert fix in found[f"mirrors.{repository}.{key}"]


def test_repository_keys_are_camel_case_and_known(lab_namespace):
    set_repository(lab_namespace, "kubernetesRepository", "key_fingerprint", PKGS_K8S_KEY)
    set_repository(lab_namespace, "containerdRepository", "fingerprint", DOCKER_KEY)
    found = problems(lab_namespace)
    assert found["mirrors.kubernetesRepository.key_fingerprint"] == (
        "write it camelCase, as every key in Pulumi.labs.yaml: keyFingerprint"
    )
    assert "unknown key" in found["mirrors.containerdRepository.fingerprint"]


def test_the_release_check_follows_the_kubernetes_repository_unless_set(lab_namespace):
    """preflight.kubernetesPackagesUrl, unset, is where the nodes install from; "" still skips the check."""
    assert load_lab_config(lab_namespace).release_check_url == PKGS_K8S
    set_repository(lab_namespace, "kubernetesRepository", "url", "https://artifactory.lab.local/k8s/")
    assert load_lab_config(lab_namespace).release_check_url == "https://artifactory.lab.local/k8s"
    lab_namespace.setdefault("preflight", {})["kubernetesPackagesUrl"] = "https://proxy.lab.local/pkgs"
    assert load_lab_config(lab_namespace).release_check_url == "https://proxy.lab.local/pkgs"
    lab_namespace["preflight"]["kubernetesPackagesUrl"] = ""
    assert load_lab_config(lab_namespace).release_check_url == ""


# --------------------------------------------------------------------------- issue 50: the minor items


@pytest.mark.parametrize(
    ("path", "value", "fix"),
    [
        ("kubernetes.clusterName", "labs k8s", "lowercase letters, digits and inner hyphens"),
        ("kubernetes.clusterName", 'labs"\nkind: Secret', "lowercase letters, digits and inner hyphens"),
        ("kubernetes.clusterName", "Labs_K8s", "such as labs-k8s"),
        ("template.isoUrl", 'https://deb.example/"x.iso', "such as https://cdimage.debian.org"),
        ("template.isoUrl", "https://deb.example/x.iso\nAcquire::x", "such as https://"),
        ("template.isoUrl", "ftp://deb.example/x.iso", "such as https://"),
    ],
)
def test_cluster_name_and_iso_url_get_pattern_checks(lab_namespace, path, value, fix):
    set_path(lab_namespace, path, value)
    found = problems(lab_namespace)
    assert list(found) == [path]
    assert fix in found[path]


def test_a_plain_http_registry_mirror_is_refused_unless_allowed(lab_namespace):
    """Images are pulled by tag: through a plain-http mirror anyone on the path serves the apiserver's."""
    from components.config import config_warnings

    lab_namespace.setdefault("mirrors", {})["registryMirror"] = "http://registry.lab.local:5000"
    message = problems(lab_namespace)["mirrors.registryMirror"]
    assert "plain http" in message and "labs-k8s:mirrors.allowInsecureRegistryMirror: true" in message
    lab_namespace["mirrors"]["allowInsecureRegistryMirror"] = True
    cfg = load_lab_config(lab_namespace)
    (warning,) = config_warnings(cfg)
    assert "mirrors.registryMirror" in warning and "http://registry.lab.local:5000" in warning
    lab_namespace["mirrors"]["registryMirror"] = "https://registry.lab.local:5000"
    assert config_warnings(load_lab_config(lab_namespace)) == []


def _test_ca() -> str:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lab mirror CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def test_the_registry_mirrors_ca_can_be_pinned(lab_namespace):
    ca = _test_ca()
    lab_namespace.setdefault("mirrors", {})["registryMirrorCa"] = ca
    assert "mirrors.registryMirror" in problems(lab_namespace)["mirrors.registryMirrorCa"]  # a CA for no mirror
    lab_namespace["mirrors"]["registryMirror"] = "https://registry.lab.local:5000"
    assert load_lab_config(lab_namespace).mirrors.registry_mirror_ca == ca
    lab_namespace["mirrors"]["registryMirrorCa"] = ca.replace("MII", "XXX", 1)
    assert "PEM" in problems(lab_namespace)["mirrors.registryMirrorCa"]
    lab_namespace["mirrors"]["registryMirrorCa"] = ca + '"]\nskip_verify = true'
    assert "PEM" in problems(lab_namespace)["mirrors.registryMirrorCa"]
