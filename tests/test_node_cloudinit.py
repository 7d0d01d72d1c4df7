"""cloud-init instance data of the clones (components/rendering/node.py, cloudinit/node/).

Pure tests check the documents against the stack file (Pulumi.labs.yaml) read independently
of the code under test. Tool tests hand them to Debian 12's own cloud-init 22.4: its schema
validator, its VMware datasource (fed the guestinfo values through its environment-variable
transport), its network renderers and its disk modules. Those skip on a laptop without the
`cloud-init` package and fail under CI=true.
"""

from __future__ import annotations

import base64
import gzip
import ipaddress
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.config import LabConfig, Node, Role
from components.rendering import node as node_rendering
from components.rendering.node import (
    DATA_DISK_ALIAS,
    DATA_DISK_BY_PATH,
    GUESTINFO_VALUE_LIMIT,
    encode_guestinfo,
    guestinfo_extra_config,
    instance_id,
    node_files,
    render_metadata,
    render_network_config,
    render_userdata,
    yaml_scalar,
)
from tests.labs import make_lab_config_with, namespace, public_key
from tests.requirements import require_root, require_tool, unavailable

REPO = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = "/usr/bin/python3"
CLOUD_INIT_SCHEMA = Path("/usr/lib/python3/dist-packages/cloudinit/config/schemas/schema-cloud-config-v1.json")


# Pinned, not the stack's placeholder: the user-data below must carry exactly this key.
PUBLIC_KEY = public_key()


def make_cfg(change: Callable[[dict[str, Any]], None] | None = None) -> LabConfig:
    return make_lab_config_with(change, ssh={"publicKey": PUBLIC_KEY})


def node_named(cfg: LabConfig, name: str) -> Node:
    return next(n for n in cfg.all_nodes if n.name == name)


def set_ip(name: str, ip: str) -> Callable[[dict[str, Any]], None]:
    def change(raw: dict[str, Any]) -> None:
        for group in raw["nodes"].values():
            for host in group["hosts"]:
                if host["name"] == name:
                    host["ip"] = ip

    return change


@pytest.fixture(scope="module")
def cfg() -> LabConfig:
    return make_cfg()


@pytest.fixture(scope="module")
def expected() -> dict[str, Any]:
    """What the stack file says, read without the code under test."""
    raw = namespace()
    roles = {"balancers": "balancer", "controlPlanes": "control-plane", "workers": "worker"}
    hosts = {
        host["name"]: {
            "ip": host["ip"],
            "role": roles[group_key],
            "disk": raw["nodes"][group_key].get("dataDiskGib", 0),
        }
        for group_key in roles
        for host in raw["nodes"][group_key]["hosts"]
    }
    net = raw["network"]
    return {
        "hosts": hosts,
        "prefix": net["cidr"].split("/")[1],
        "gateway": net["gateway"],
        "dns": net["dnsServers"],
        "domain": net["searchDomain"],
        "ntp": net["ntpServers"],
        "user": raw["ssh"]["user"],
        "interface": net["interface"],
        "macs": {name: _independent_mac(host["ip"]) for name, host in hosts.items()},
    }


def _independent_mac(ip: str) -> str:
    """VMware's manual range is 00:50:56:00:00:00-3f:ff:ff: the octets after 00:50:56 are the
    address's second octet masked to its low 6 bits, then the third and fourth octets."""
    _, second, third, fourth = (int(octet) for octet in ip.split("."))
    return f"00:50:56:{second & 0x3F:02x}:{third:02x}:{fourth:02x}"


# --------------------------------------------------------------------------- metadata and network


def test_every_node_gets_its_own_identity_and_static_address(cfg, expected):
    assert sorted(n.name for n in cfg.all_nodes) == sorted(expected["hosts"])
    assert len(expected["hosts"]) == 7
    seen_ids = set()
    for node in cfg.all_nodes:
        want = expected["hosts"][node.name]
        metadata = yaml.safe_load(render_metadata(cfg, node))
        assert set(metadata) == {"instance-id", "local-hostname", "network"}
        assert metadata["local-hostname"] == node.name
        prefix, _, digest = metadata["instance-id"].rpartition("-")
        assert prefix == node.name and len(digest) == 12 and int(digest, 16) >= 0
        seen_ids.add(metadata["instance-id"])

        network = metadata["network"]
        assert network == yaml.safe_load(render_network_config(cfg, node))
        assert network["version"] == 2
        assert list(network) == ["version", "ethernets"]
        assert list(network["ethernets"]) == [expected["interface"]]
        nic = network["ethernets"][expected["interface"]]
        # Found by the static MAC the VM layer sets, named by set-name: no PCI-slot guesswork.
        assert nic["match"] == {"macaddress": expected["macs"][node.name]}
        assert node_rendering.node_mac(node) == expected["macs"][node.name]
        assert nic["set-name"] == expected["interface"]
        assert nic["dhcp4"] is False and nic["dhcp6"] is False
        assert nic["addresses"] == [f"{want['ip']}/{expected['prefix']}"]
        assert nic["gateway4"] == expected["gateway"]
        assert "routes" not in nic  # cloud-init 22.4 + ifupdown: see network-config.yaml.j2
        assert nic["nameservers"] == {"addresses": expected["dns"], "search": [expected["domain"]]}
        # Every address really is CIDR, inside the node network, and the gateway is on-link.
        iface = ipaddress.ip_interface(nic["addresses"][0])
        assert iface.network == cfg.network.cidr
        assert ipaddress.ip_address(nic["gateway4"]) in iface.network
    assert len(seen_ids) == 7


def test_network_config_without_search_domain_has_no_search_list():
    def no_domain(raw):
        del raw["network"]["searchDomain"]

    cfg = make_cfg(no_domain)
    node = cfg.all_nodes[0]
    nic = next(iter(yaml.safe_load(render_network_config(cfg, node))["ethernets"].values()))
    assert nic["nameservers"] == {"addresses": ["10.3.60.1"]}
    userdata = yaml.safe_load(render_userdata(cfg, node))
    assert "fqdn" not in userdata and userdata["hostname"] == node.name


# --------------------------------------------------------------------------- user-data


def test_userdata_identity_access_time_and_packages(cfg, expected):
    for node in cfg.all_nodes:
        text = render_userdata(cfg, node)
        assert text.startswith("#cloud-config\n")
        doc = yaml.safe_load(text)
        assert doc["hostname"] == node.name
        assert doc["fqdn"] == f"{node.name}.{expected['domain']}"
        assert doc["prefer_fqdn_over_hostname"] is False
        assert doc["manage_etc_hosts"] is True

        assert len(doc["users"]) == 1  # no "default": Debian's `debian` user is not created
        user = doc["users"][0]
        assert user["name"] == expected["user"]
        assert user["sudo"] == "ALL=(ALL) NOPASSWD:ALL"
        assert user["shell"] == "/bin/bash"
        assert user["lock_passwd"] is True
        assert user["ssh_authorized_keys"] == [PUBLIC_KEY]
        assert not {"passwd", "plain_text_passwd", "hashed_passwd"} & set(user)

        assert doc["ssh_pwauth"] is False
        assert doc["disable_root"] is True
        assert "chpasswd" not in doc and "password" not in doc
        assert doc["ssh_deletekeys"] is True
        assert doc["ssh_genkeytypes"] == ["ed25519", "ecdsa", "rsa"]

        assert doc["ntp"] == {"enabled": True, "ntp_client": "systemd-timesyncd", "servers": expected["ntp"]}
        assert doc["package_update"] is False and doc["package_upgrade"] is False
        assert "packages" not in doc
        assert doc["swap"] == {"size": 0}
        assert "apt" not in doc  # no proxy in the stack file
        assert node.name in doc["final_message"]


def test_apt_proxy_is_set_only_when_configured():
    def with_proxy(raw):
        raw["mirrors"] = {"aptProxy": "http://apt-cache.labs.local:3142"}

    cfg = make_cfg(with_proxy)
    for node in cfg.all_nodes:
        doc = yaml.safe_load(render_userdata(cfg, node))
        assert doc["apt"] == {"preserve_sources_list": True, "proxy": "http://apt-cache.labs.local:3142"}


def test_data_disk_only_on_roles_that_have_one(cfg, expected):
    mount_points = {"control-plane": "/var/lib/etcd", "worker": "/var/lib/containerd"}
    consumers = {"control-plane": "kubelet.service", "worker": "containerd.service"}
    disk_keys = {"device_aliases", "disk_setup", "fs_setup", "mounts", "runcmd"}
    for node in cfg.all_nodes:
        want = expected["hosts"][node.name]
        doc = yaml.safe_load(render_userdata(cfg, node))
        if want["role"] == "balancer":
            assert want["disk"] == 0
            assert not disk_keys & set(doc), node.name
            continue
        assert want["disk"] > 0
        mount_point = mount_points[want["role"]]
        assert doc["device_aliases"] == {DATA_DISK_ALIAS: DATA_DISK_BY_PATH}
        assert DATA_DISK_BY_PATH.endswith("-scsi-0:0:1:0")  # unit 1 of the PVSCSI controller
        assert doc["disk_setup"] == {DATA_DISK_ALIAS: {"table_type": "mbr", "layout": [100], "overwrite": False}}
        (fs,) = doc["fs_setup"]
        assert fs["device"] == f"{DATA_DISK_ALIAS}.1"
        assert fs["filesystem"] == "ext4" and fs["overwrite"] is False
        assert 0 < len(fs["label"].encode()) <= 16  # ext4 label limit
        (mount,) = doc["mounts"]
        assert mount[:3] == [f"{DATA_DISK_ALIAS}.1", mount_point, "ext4"]
        options = mount[3].split(",")
        consumer = consumers[want["role"]]
        assert {"defaults", "nofail", f"x-systemd.before={consumer}", f"x-systemd.required-by={consumer}"} == set(
            options
        )
        assert mount[4:] == ["0", "2"]
        (check,) = doc["runcmd"]
        assert check[:2] == ["bash", "-c"]
        assert check[3:] == ["data-disk-ready", mount_point, "etcd" if want["role"] == "control-plane" else ""]
        assert "mountpoint -q" in check[2]


def test_a_node_without_data_disk_gets_no_disk_setup(cfg):
    worker = cfg.workers[0]
    bare = Node(worker.name, worker.ip, Role.WORKER, worker.vcpu, worker.memory_mib, data_disk_gib=0)
    doc = yaml.safe_load(render_userdata(cfg, bare))
    assert not {"device_aliases", "disk_setup", "fs_setup", "mounts", "runcmd"} & set(doc)


def test_awkward_values_stay_values_not_yaml():
    """Quotes, colons, hashes and commas in free-text config must come back unchanged."""
    key = public_key(comment="ops: 'night' \"shift\" #1, [x]")
    # A proxy holds only URL characters (config.py refuses commas, hashes, quotes: issue #30 §3),
    # and of those the colon, percent sign and tilde still mean something to YAML.
    proxy = "http://cache.labs.local:3142/a:b%23c~"

    def awkward(raw):
        raw["ssh"]["publicKey"] = key
        raw["mirrors"] = {"aptProxy": proxy}
        raw["network"]["ntpServers"] = ["ntp-1.labs.local", "yes"]

    cfg = make_cfg(awkward)
    node = cfg.control_planes[0]
    doc = yaml.safe_load(render_userdata(cfg, node))
    assert doc["users"][0]["ssh_authorized_keys"] == [key]
    assert doc["apt"]["proxy"] == proxy
    assert doc["ntp"]["servers"] == ["ntp-1.labs.local", "yes"]


@pytest.mark.parametrize(
    "value", ["plain", "a, b", "x: y", "#z", "yes", "10.3.60.1", "a\nb", "", " lead", "é😀", "[x]", 24, False, None]
)
def test_yaml_scalar_round_trips_in_block_and_flow_context(value):
    text = yaml_scalar(value)
    assert "\n" not in text
    assert yaml.safe_load(f"k: {text}")["k"] == value
    assert yaml.safe_load(f"k: [{text}, z]")["k"] == [value, "z"]


# --------------------------------------------------------------------------- guestinfo


def test_guestinfo_values_decode_to_the_rendered_documents(cfg):
    for node in cfg.all_nodes:
        extra = guestinfo_extra_config(cfg, node)
        assert set(extra) == {
            "guestinfo.metadata",
            "guestinfo.metadata.encoding",
            "guestinfo.userdata",
            "guestinfo.userdata.encoding",
        }
        assert extra["guestinfo.metadata.encoding"] == "base64"
        assert extra["guestinfo.userdata.encoding"] == "base64"
        assert base64.b64decode(extra["guestinfo.metadata"], validate=True).decode() == render_metadata(cfg, node)
        assert base64.b64decode(extra["guestinfo.userdata"], validate=True).decode() == render_userdata(cfg, node)
        # Far below open-vm-tools' 64 KiB per value: no need for gzip today.
        assert len(extra["guestinfo.userdata"]) < 8 * 1024
        assert len(extra["guestinfo.metadata"]) < 1024
        assert all(value.isascii() for value in extra.values())


def test_guestinfo_falls_back_to_gzip_and_refuses_what_does_not_fit():
    text = "#cloud-config\n" + "write_files: []\n" * 500
    plain, encoding = encode_guestinfo(text)
    assert encoding == "base64" and base64.b64decode(plain).decode() == text

    value, encoding = encode_guestinfo(text, limit=len(plain) - 1)
    assert encoding == "gzip+base64"
    assert gzip.decompress(base64.b64decode(value)).decode() == text
    assert encode_guestinfo(text, limit=len(plain) - 1) == (value, encoding)  # no timestamp in gzip

    noise = base64.b64encode(os.urandom(3 * GUESTINFO_VALUE_LIMIT // 4)).decode()
    with pytest.raises(ValueError, match="guestinfo values are limited"):
        encode_guestinfo(noise)


def test_node_files_are_the_guestinfo_documents(cfg):
    for node in cfg.all_nodes:
        files = node_files(cfg, node)
        assert files == {"meta-data.yaml": render_metadata(cfg, node), "user-data.yaml": render_userdata(cfg, node)}


# --------------------------------------------------------------------------- instance-id


def test_instance_id_follows_the_node_content_only(cfg):
    before = {n.name: instance_id(cfg, n) for n in cfg.all_nodes}
    assert before == {n.name: instance_id(make_cfg(), n) for n in make_cfg().all_nodes}  # stable
    for n in cfg.all_nodes:
        assert yaml.safe_load(render_metadata(cfg, n))["instance-id"] == before[n.name]

    moved = make_cfg(set_ip("labs-k8s-m01", "10.3.60.61"))
    after = {n.name: instance_id(moved, n) for n in moved.all_nodes}
    assert after["labs-k8s-m01"] != before["labs-k8s-m01"]
    assert {k: v for k, v in after.items() if k != "labs-k8s-m01"} == {
        k: v for k, v in before.items() if k != "labs-k8s-m01"
    }

    other = make_cfg(set_ip("labs-k8s-w02", "10.3.60.62"))
    assert instance_id(other, node_named(other, "labs-k8s-m01")) == before["labs-k8s-m01"]
    assert instance_id(other, node_named(other, "labs-k8s-w02")) != before["labs-k8s-w02"]

    # What a running node takes in place (the node-settings step) is not its identity: a reboot
    # after a key rotation must not make cloud-init see a new instance (new host keys, users...).
    def in_place(raw):
        raw["ssh"]["publicKey"] = public_key(seed=7)
        raw["ssh"]["extraPublicKeys"] = [public_key(seed=8)]
        raw["network"]["ntpServers"] = ["ntp.labs.local"]
        raw["network"]["dnsServers"] = ["10.3.60.9"]
        raw["mirrors"] = {"aptProxy": "http://apt-cache.labs.local:3142"}

    rekeyed = make_cfg(in_place)
    assert {n.name: instance_id(rekeyed, n) for n in rekeyed.all_nodes} == before
    assert all(render_userdata(rekeyed, n) != render_userdata(cfg, n) for n in rekeyed.all_nodes)  # carried

    # Anything else in the documents is: the search domain (fqdn), the NIC name, the data disk.
    def identity(raw):
        raw["network"]["searchDomain"] = "lab2.local"

    assert all(instance_id(make_cfg(identity), n) != before[n.name] for n in cfg.all_nodes)
    bigger = make_cfg(lambda raw: raw["nodes"]["workers"].__setitem__("dataDiskGib", 60))
    assert instance_id(bigger, node_named(bigger, "labs-k8s-w01")) != before["labs-k8s-w01"]
    assert instance_id(bigger, node_named(bigger, "labs-k8s-m01")) == before["labs-k8s-m01"]


def test_userdata_trusts_the_login_key_and_the_extra_keys(cfg):
    extra = public_key(seed=3, comment="alice@ops")
    more = make_cfg(lambda raw: raw["ssh"].__setitem__("extraPublicKeys", [extra, PUBLIC_KEY]))
    doc = yaml.safe_load(render_userdata(more, more.workers[0]))
    assert doc["users"][0]["ssh_authorized_keys"] == [PUBLIC_KEY, extra]  # login key first, no duplicate


# --------------------------------------------------------------------------- Debian's cloud-init


def _require_cloud_init_python() -> None:
    require_tool("cloud-init")
    probe = subprocess.run(
        [SYSTEM_PYTHON, "-c", "import cloudinit.sources.DataSourceVMware"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        unavailable(f"{SYSTEM_PYTHON} cannot import Debian's cloudinit package: {probe.stderr.strip()[-300:]}")


def test_userdata_passes_cloud_init_schema(cfg, tmp_path):
    require_tool("cloud-init")

    def with_proxy(raw):
        raw["mirrors"] = {"aptProxy": "http://apt-cache.labs.local:3142"}

    proxied = make_cfg(with_proxy)
    cases = [(cfg, n) for n in cfg.all_nodes] + [(proxied, proxied.control_planes[0])]
    for index, (config, node) in enumerate(cases):
        path = tmp_path / f"{index}-{node.name}.yaml"
        path.write_text(render_userdata(config, node))
        result = subprocess.run(["cloud-init", "schema", "--config-file", str(path)], capture_output=True, text=True)
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"{node.name}:\n{output}"
        assert f"Valid cloud-config: {path}" in output
        assert "deprecat" not in output.lower(), output


def test_userdata_keys_are_known_to_cloud_init(cfg):
    """22.4's schema allows unknown top-level keys: a typo would pass `cloud-init schema` silently."""
    require_tool("cloud-init")
    if not CLOUD_INIT_SCHEMA.is_file():
        unavailable(f"{CLOUD_INIT_SCHEMA} is missing (Debian's cloud-init package ships it)")
    schema = json.loads(CLOUD_INIT_SCHEMA.read_text())
    known = {key for module in schema["$defs"].values() for key in module.get("properties", {})}
    assert {"ntp", "mounts", "fs_setup", "users"} <= known  # the schema is the one we think it is
    for node in (cfg.balancers[0], cfg.control_planes[0], cfg.workers[0]):
        doc = yaml.safe_load(render_userdata(cfg, node))
        assert set(doc) <= known, set(doc) - known


# Runs inside Debian's python3 with Debian's cloudinit package: reads the guestinfo values
# through the VMware datasource (its VMX_GUESTINFO environment transport, the same decode path
# as vmware-rpctool's), renders the network config with the ENI, netplan and networkd
# renderers, and runs the disk modules' device resolution with the destructive steps stubbed.
_CLOUD_INIT_PROBE = r"""
import json, logging, os, sys, tempfile
from cloudinit import distros, helpers, net, subp, util
from cloudinit.config import cc_disk_setup, cc_mounts
from cloudinit.net import eni, netplan, networkd
from cloudinit.net.network_state import parse_net_config_data
from cloudinit.sources.DataSourceVMware import DataSourceVMware

request = json.load(sys.stdin)
log = logging.getLogger("probe")
results = {}
for name, extra in request["nodes"].items():
    for key in list(os.environ):
        if key.startswith("VMX_GUESTINFO"):
            del os.environ[key]
    os.environ["VMX_GUESTINFO"] = "1"
    for key, value in extra.items():
        os.environ[("vmx." + key).upper().replace(".", "_")] = value
    tmp = tempfile.mkdtemp()
    paths = helpers.Paths({"cloud_dir": tmp, "run_dir": tmp + "/run"})
    distro = distros.fetch("debian")("debian", {}, paths)
    ds = DataSourceVMware({}, distro, paths)
    out = {"found": ds._get_data()}
    out["instance_id"] = ds.get_instance_id()
    out["hostname"] = ds.get_hostname().hostname
    out["userdata"] = util.decode_binary(ds.userdata_raw)
    netcfg = ds.network_config
    state = parse_net_config_data(netcfg, skip_broken=False)
    out["interfaces"] = [
        {"name": i["name"], "subnets": i["subnets"]} for i in state.iter_interfaces()
    ]
    rendered = {}
    for kind, renderer in (("eni", eni.Renderer), ("netplan", netplan.Renderer), ("networkd", networkd.Renderer)):
        target = tempfile.mkdtemp()
        renderer().render_network_state(state, target=target)
        rendered[kind] = "".join(
            open(os.path.join(root, f)).read() for root, _, files in os.walk(target) for f in sorted(files)
        )
    out["rendered"] = rendered
    # What a Debian clone writes: the ENI renderer with the Debian distro's own settings
    # (interfaces.d/50-cloud-init and the udev rule that names the NIC on later boots).
    target = tempfile.mkdtemp()
    eni.Renderer(config=distro.renderer_configs["eni"]).render_network_state(state, target=target)
    out["debian_files"] = {
        os.path.relpath(os.path.join(root, f), target): open(os.path.join(root, f)).read()
        for root, _, files in os.walk(target) for f in files
    }
    # The rename cloud-init does in init-local, before ifupdown: its real code, with the NIC
    # table and `ip` stubbed. Kernel names as vSphere's PCI slots give them (ens160, ens224)
    # and the already-right name; and a NIC with another MAC (nothing to rename: an error).
    renames = {}
    for kernel_name, mac in request["nics"][name]:
        commands = []
        current = {kernel_name: {"mac": mac, "driver": "vmxnet3", "device_id": "0x07b0",
                                 "up": False, "downable": True}}
        real_info, real_subp = net._get_current_rename_info, subp.subp
        net._get_current_rename_info = lambda: current
        subp.subp = lambda args, **kwargs: commands.append(args) or ("", "")
        try:
            distro.networking.apply_network_config_names(netcfg)
            renames[kernel_name + " " + mac] = {"commands": commands}
        except Exception as error:  # what 22.4 raises; stages.py logs "Failed to rename devices"
            renames[kernel_name + " " + mac] = {"error": str(error)}
        finally:
            net._get_current_rename_info, subp.subp = real_info, real_subp
    out["renames"] = renames

    cfg = util.load_yaml(out["userdata"])
    out["disk"] = None
    if "disk_setup" in cfg:
        calls = {"mkpart": [], "mkfs": []}
        cc_disk_setup.mkpart = lambda device, definition: calls["mkpart"].append([device, definition])
        cc_disk_setup.mkfs = lambda definition: calls["mkfs"].append(definition)
        class Cloud:
            def device_name_to_device(self, name):
                return None
        cc_disk_setup.handle("disk_setup", cfg, Cloud(), log, [])
        # cc_mounts checks that the partition exists: pretend the udev link of partition 1 does.
        part = cfg["device_aliases"][request["alias"]] + "-part1"
        exists, is_block = os.path.exists, cc_mounts._is_block_device
        os.path.exists = lambda p: p == part or exists(p)
        cc_mounts._is_block_device = lambda device, partition=None: True
        try:
            mounts = [
                cc_mounts.sanitize_devname(m[0], lambda n: None, log, aliases=cfg["device_aliases"])
                for m in cfg["mounts"]
            ]
        finally:
            os.path.exists, cc_mounts._is_block_device = exists, is_block
        # What 22.4 feeds sfdisk for this layout (exec_mkpart_mbr: sfdisk --unit=S ... <<< "LAYOUT\n").
        sfdisk_input = [cc_disk_setup.get_partition_mbr_layout(request["sectors"], definition["layout"])
                        for _, definition in calls["mkpart"]]
        out["disk"] = {"mkpart": calls["mkpart"], "mkfs": calls["mkfs"], "mounts": mounts,
                       "sfdisk_input": sfdisk_input}
    results[name] = out
json.dump(results, sys.stdout)
"""


FOREIGN_MAC = "00:50:56:aa:bb:cc"  # a vCenter-generated MAC: what a clone without its static MAC has
DATA_DISK_TEST_SECTORS = 2 * 1024 * 1024  # a 1 GiB disk, in 512-byte sectors


@pytest.fixture(scope="module")
def cloud_init_view(cfg) -> dict[str, Any]:
    _require_cloud_init_python()
    request = {
        "alias": DATA_DISK_ALIAS,
        "sectors": DATA_DISK_TEST_SECTORS,
        "nodes": {n.name: guestinfo_extra_config(cfg, n) for n in cfg.all_nodes},
        "nics": {
            n.name: [["ens160", n.mac], ["ens224", n.mac], [cfg.network.interface, n.mac], ["ens192", FOREIGN_MAC]]
            for n in cfg.all_nodes
        },
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VMX_", "PYTHON"))}
    result = subprocess.run(
        [SYSTEM_PYTHON, "-c", _CLOUD_INIT_PROBE],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout)


def test_vmware_datasource_reads_identity_from_guestinfo(cfg, cloud_init_view):
    assert sorted(cloud_init_view) == sorted(n.name for n in cfg.all_nodes)
    for node in cfg.all_nodes:
        seen = cloud_init_view[node.name]
        assert seen["found"] is True
        assert seen["instance_id"] == instance_id(cfg, node)
        assert seen["hostname"] == node.name
        assert seen["userdata"] == render_userdata(cfg, node)


def test_cloud_init_renders_the_static_address_for_every_renderer(cfg, cloud_init_view, expected):
    for node in cfg.all_nodes:
        seen = cloud_init_view[node.name]
        ip, prefix, gateway = expected["hosts"][node.name]["ip"], expected["prefix"], expected["gateway"]
        (iface,) = seen["interfaces"]
        assert iface["name"] == expected["interface"]
        (subnet,) = iface["subnets"]
        assert subnet["type"] == "static"
        assert (subnet["address"], str(subnet["prefix"]), subnet["gateway"]) == (ip, prefix, gateway)

        eni_text = seen["rendered"]["eni"]
        assert f"iface {expected['interface']} inet static" in eni_text
        assert f"address {ip}/{prefix}" in eni_text
        assert f"gateway {gateway}" in eni_text
        # ifupdown's own gateway line, not `post-up route add` (net-tools, failure swallowed).
        assert "route add" not in eni_text
        assert f"dns-nameservers {' '.join(expected['dns'])}" in eni_text
        assert f"dns-search {expected['domain']}" in eni_text

        plan = yaml.safe_load(seen["rendered"]["netplan"])["network"]["ethernets"][expected["interface"]]
        assert plan["addresses"] == [f"{ip}/{prefix}"] and plan["gateway4"] == gateway
        assert plan["match"] == {"macaddress": expected["macs"][node.name]}
        assert plan["set-name"] == expected["interface"]

        networkd_text = seen["rendered"]["networkd"]
        for line in (
            f"Address={ip}/{prefix}",
            f"Gateway={gateway}",
            f"MACAddress={expected['macs'][node.name]}",
            f"Name={expected['interface']}",
            "DHCP=no",
        ):
            assert line in networkd_text


def test_debian_clone_names_its_nic_by_the_static_mac(cfg, cloud_init_view, expected):
    """What cloud-init 22.4 does on a Debian clone: ENI config for the named NIC, a udev rule
    that gives that name to the node's MAC on every later boot, and the live rename at first
    boot from whatever name the PCI slot gave the NIC."""
    interface = expected["interface"]
    for node in cfg.all_nodes:
        seen = cloud_init_view[node.name]
        mac = expected["macs"][node.name]
        ip, prefix = expected["hosts"][node.name]["ip"], expected["prefix"]
        files = seen["debian_files"]
        assert set(files) == {"etc/network/interfaces.d/50-cloud-init", "etc/udev/rules.d/70-persistent-net.rules"}
        stanza = files["etc/network/interfaces.d/50-cloud-init"]
        assert f"auto {interface}\niface {interface} inet static\n" in stanza
        assert f"    address {ip}/{prefix}\n" in stanza
        assert "auto lo" in stanza and stanza.count("inet static") == 1
        (rule,) = files["etc/udev/rules.d/70-persistent-net.rules"].splitlines()
        assert rule == (f'SUBSYSTEM=="net", ACTION=="add", DRIVERS=="?*", ATTR{{address}}=="{mac}", NAME="{interface}"')

        renames = seen["renames"]
        for kernel_name in ("ens160", "ens224"):
            assert renames[f"{kernel_name} {mac}"] == {
                "commands": [["ip", "link", "set", kernel_name, "name", interface]]
            }
        assert renames[f"{interface} {mac}"] == {"commands": []}
        # No NIC with the node's MAC: cloud-init says so (init-local logs it; see troubleshooting).
        assert f"Cannot rename mac={mac} to {interface}, not available" in renames[f"ens192 {FOREIGN_MAC}"]["error"]


def test_cloud_init_resolves_the_data_disk_alias(cfg, cloud_init_view):
    for node in cfg.all_nodes:
        disk = cloud_init_view[node.name]["disk"]
        if node.role is Role.BALANCER:
            assert disk is None
            continue
        (mkpart,) = disk["mkpart"]
        assert mkpart[0] == DATA_DISK_BY_PATH
        assert mkpart[1]["table_type"] == "mbr" and mkpart[1]["overwrite"] is False
        (mkfs,) = disk["mkfs"]
        assert (mkfs["device"], str(mkfs["partition"])) == (DATA_DISK_BY_PATH, "1")
        assert disk["mounts"] == [f"{DATA_DISK_BY_PATH}-part1"]


def test_data_disk_partition_table_is_one_that_sfdisk_accepts(cfg, cloud_init_view, tmp_path):
    """cloud-init 22.4's own sfdisk input for our layout, given to Debian 12's sfdisk (util-linux
    2.38) with cloud-init's own arguments, on a disk image file: one Linux partition from sfdisk's
    aligned start to the end of the disk (`layout: true` fails here: canonical/cloud-init#1932)."""
    require_tool("sfdisk")
    for node in (cfg.control_planes[0], cfg.workers[0]):
        (sfdisk_input,) = cloud_init_view[node.name]["disk"]["sfdisk_input"]
        disk = tmp_path / f"{node.name}.img"
        with disk.open("wb") as handle:
            handle.truncate(DATA_DISK_TEST_SECTORS * 512)
        made = subprocess.run(
            ["sfdisk", "--Linux", "--unit=S", "--force", str(disk)],
            input=f"{sfdisk_input}\n",
            capture_output=True,
            text=True,
        )
        assert made.returncode == 0, f"{node.name}: sfdisk rejected {sfdisk_input!r}:\n{made.stderr}"
        table = json.loads(
            subprocess.run(["sfdisk", "-J", str(disk)], capture_output=True, text=True, check=True).stdout
        )["partitiontable"]
        assert table["label"] == "dos"
        (partition,) = table["partitions"]
        assert partition["type"] == "83"
        assert partition["start"] == 2048  # 1 MiB aligned
        assert partition["start"] + partition["size"] == DATA_DISK_TEST_SECTORS


def test_data_disk_check_script(cfg, tmp_path):
    require_tool("bash", "mountpoint")
    doc = yaml.safe_load(render_userdata(cfg, cfg.control_planes[0]))
    script = doc["runcmd"][0][2]

    not_mounted = subprocess.run(
        ["bash", "-c", script, "data-disk-ready", str(tmp_path), "etcd"], capture_output=True, text=True
    )
    assert not_mounted.returncode == 1
    assert f"not mounted at {tmp_path}" in not_mounted.stderr

    mounted = subprocess.run(["bash", "-c", script, "data-disk-ready", "/", ""], capture_output=True, text=True)
    assert mounted.returncode == 0, mounted.stderr
    assert "data disk mounted at /" in mounted.stdout

    usage = subprocess.run(["bash", "-c", script, "data-disk-ready"], capture_output=True, text=True)
    assert usage.returncode == 2


def test_data_disk_check_script_prepares_a_mounted_etcd_dir(cfg, tmp_path):
    """On a real mount (a tmpfs in a private mount namespace): mode 0700, empty lost+found gone."""
    require_root()
    require_tool("unshare", "mount", "bash")
    doc = yaml.safe_load(render_userdata(cfg, cfg.control_planes[0]))
    script = doc["runcmd"][0][2]
    target = tmp_path / "etcd"
    target.mkdir()
    inside = (
        'mount -t tmpfs labs-test "$1" && mkdir "$1/lost+found" && chmod 0755 "$1"'
        ' && bash -c "$2" data-disk-ready "$1" etcd && stat -c %a "$1" && ls -A "$1"'
    )
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", inside, "sh", str(target), script],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0 and "unshare failed" in result.stderr:
        unavailable(f"cannot make a mount namespace here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines == [f"labs-k8s: data disk mounted at {target}", "700"]


def test_data_disk_check_script_is_shellcheck_clean():
    require_tool("shellcheck")
    script = REPO / "cloudinit" / node_rendering.DATA_DISK_CHECK
    result = subprocess.run(["shellcheck", "-S", "style", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
