"""The sealed template really boots as two clones, in QEMU with vSphere's devices.

tests/firstboot.py builds the image (debootstrap + the preseed's packages + late_command + the
project's seal script; cached outside the repository) and boots the clones; its docstring says
what each part stands in for. Here the program itself is run under the mock engine with a key
made for this run, and each clone gets exactly what the program registers for its VM: the
guestinfo.* values of `extraConfig` and the MAC address of its network interface. The SSH steps
are the program's own registered commands: the readiness step and the node-settings step of each
clone, each sent as `ssh user@ip 'sudo -n bash -s'` with the
registered bundle on stdin, as pulumi-command's remote.Command sends it.

Two clones: the first control plane and the first worker, so both roles' data disks are seen.
Everything is observed from inside the network namespace the clones sit in.

What this does not prove: VMware's guestinfo backdoor channel (vmware-rpctool, open-vm-tools'
RPC) and vCenter itself (cloning, extraConfig, device placement, MAC assignment), the installer
run (tests/test_template_render.py and tests/test_iso.py cover its inputs) and GRUB.
"""

from __future__ import annotations

import ast
import base64
import json
import re
import subprocess
import time
from typing import Any

import pytest
import yaml

from components.config import Role
from components.fleet import READINESS_TIMEOUT_SECONDS
from components.rendering.node import DATA_DISK_BY_PATH, DATA_DISKS, guestinfo_extra_config, node_mac
from components.tools.offline import run_program
from tests.firstboot import (
    CACHE_DIR,
    NIC_PCI_ADDRESS,
    RECIPE_FILES,
    SCSI_PCI_ADDRESS,
    build_image,
    clone_lab,
    guestinfo_environment,
    make_ssh_key,
    systemd_dropin,
    tools_missing,
)
from tests.labs import make_lab_config_with, namespace
from tests.requirements import require_root, require_tool, unavailable

# SSH up, both clones booting at once under TCG: about 2-3 min on an idle 2-core machine, 7 when
# other work keeps the cores busy. The readiness step is then bounded by the program's own timeout.
BOOT_TIMEOUT_SECONDS = 900
READINESS_SSH_TIMEOUT = READINESS_TIMEOUT_SECONDS + 60
# Image build (first run on a machine: debootstrap + apt about 7 min) + boot + steps.
pytestmark = pytest.mark.timeout(3600)
TIMINGS_FILE = CACHE_DIR / "timings.json"
BACKDOOR_WARNING = re.compile(r"Failed to set guestinfo key=local-ipv[46] ")

# Runs as root in each clone (python3 is there for cloud-init): everything the assertions read.
OBSERVE = r"""
import glob, json, os, re, subprocess

def sh(*argv):
    done = subprocess.run(argv, capture_output=True, text=True)
    return {"rc": done.returncode, "out": done.stdout, "err": done.stderr}

def read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except OSError as error:
        return None

def net(name):
    base = f"/sys/class/net/{name}"
    device = os.path.realpath(base + "/device") if os.path.exists(base + "/device") else None
    driver = os.path.basename(os.path.realpath(base + "/device/driver")) if device else None
    return {"mac": read(base + "/address").strip(), "pci": device and os.path.basename(device), "driver": driver}

def problems(log):
    # cloud-init.log records (a timestamped line and its continuation lines) that warn, fail or
    # carry a traceback: the first line of each, and the exception line when there is one.
    records, current = [], []
    for line in log.splitlines():
        if re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} - ", line) and current:
            records.append(current)
            current = []
        current.append(line)
    records.append(current)
    found = []
    for record in records:
        text = "\n".join(record)
        if any(f"[{level}]" in record[0] for level in ("WARNING", "ERROR", "CRITICAL")) or "Traceback" in text:
            found.append(record[0] + (" | " + record[-1] if "Traceback" in text else ""))
    return found

out = {
    "hostname": sh("hostname")["out"].strip(),
    "fqdn": sh("hostname", "--fqdn")["out"].strip(),
    "machine_id": read("/etc/machine-id"),
    "status": sh("cloud-init", "status", "--long"),
    "result": json.loads(read("/run/cloud-init/result.json") or "null"),
    "ds_identify": read("/run/cloud-init/ds-identify.log"),
    "cloud_cfg": read("/run/cloud-init/cloud.cfg"),
    "links": {name: net(name) for name in os.listdir("/sys/class/net") if name != "lo"},
    "addresses": json.loads(sh("ip", "-j", "-4", "addr")["out"]),
    "routes": json.loads(sh("ip", "-j", "-4", "route")["out"]),
    "pci_slots": {slot: read(f"/sys/bus/pci/slots/{slot}/address").strip()
                  for slot in os.listdir("/sys/bus/pci/slots")},
    "host_key_files": sorted(os.path.basename(p) for p in glob.glob("/etc/ssh/ssh_host_*")),
    "mounts": json.loads(sh("findmnt", "--list", "-J", "-o", "TARGET,SOURCE,FSTYPE,LABEL")["out"])["filesystems"],
    "by_path": {p: os.path.realpath(p) for p in glob.glob("/dev/disk/by-path/*")},
    "fstab": read("/etc/fstab"),
    "data_dirs": {d: {"mode": oct(os.stat(d).st_mode & 0o777), "entries": sorted(os.listdir(d))}
                  for d in ("/var/lib/etcd", "/var/lib/containerd") if os.path.isdir(d)},
    "virt": sh("systemd-detect-virt")["out"].strip(),
    "final_message": [line for line in (read("/var/log/cloud-init-output.log") or "").splitlines()
                      if "finished at" in line],
    "cloud_init_problems": problems(read("/var/log/cloud-init.log") or ""),
    "cmdline": read("/proc/cmdline"),
    "machine_id_overmounted": sh("mountpoint", "-q", "/etc/machine-id")["rc"] == 0,
    "locale": read("/etc/default/locale"),
    "resolv_conf": read("/etc/resolv.conf"),
}
print(json.dumps(out))
"""


def _registered(program: Any, name: str) -> dict[str, Any]:
    return program.by_name(name).plain_inputs


# ssh's own failure to reach or greet the host (exit 255): what pulumi-command counts as a dial error.
DIAL_ERROR = re.compile(r"^(ssh: connect to host |kex_exchange_identification: |Connection (closed|reset) by )", re.M)


def _run_step(lab: Any, clone: Any, command: dict[str, Any], step: str, timeout: float = 600) -> dict[str, Any]:
    """The program's registered remote.Command: its `create` over SSH, its `stdin` on stdin.

    Dial errors are retried as pulumi-command does with the registered connection's settings
    (remote/connection.go dialWithRetry: `dialErrorLimit` attempts of `perDialTimeout` each,
    back-off 100 ms x1.5 up to 5 s): cloud-init restarts sshd while it configures it."""
    connection = command["connection"]
    assert connection["host"] == str(clone.node.ip), f"{step}: the program dials {connection['host']}"
    assert connection["user"] == lab.ssh_user
    started = time.monotonic()
    delay, attempts = 0.1, int(connection["dialErrorLimit"])
    for attempt in range(1, attempts + 1):
        result = lab.ssh(
            clone,
            command["create"],
            stdin=command.get("stdin"),
            timeout=timeout,
            connect_timeout=int(connection["perDialTimeout"]),
        )
        if result.returncode != 255 or not DIAL_ERROR.search(result.stderr) or attempt == attempts:
            break
        time.sleep(delay)
        delay = min(delay * 1.5, 5.0)
    return {
        "rc": result.returncode,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "dials": attempt,
        "seconds": round(time.monotonic() - started, 1),
    }


@pytest.fixture(scope="module")
def firstboot(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    require_root()
    missing = tools_missing()
    if missing:
        unavailable(f"needs {', '.join(missing)} (scripts/install-test-deps.sh installs them on Debian)")
    workdir = tmp_path_factory.mktemp("firstboot")
    private_key, public_key = make_ssh_key(workdir)
    cfg = make_lab_config_with(ssh={"publicKey": public_key})
    program = run_program("labs", overrides={"labs-k8s:ssh": {**namespace()["ssh"], "publicKey": public_key}})
    first_cp, first_worker = cfg.control_planes[0], cfg.workers[0]
    nodes = [first_cp, first_worker]

    started = time.monotonic()
    image = build_image(cfg)
    image_seconds = time.monotonic() - started

    observed: dict[str, Any] = {"cfg": cfg, "image": image, "nodes": nodes, "clones": {}}
    # What the program pins for each clone: key type -> base64, from its user-data's `ssh_keys`.
    observed["pinned_host_keys"] = {
        node.name: dict(
            value.split()[:2]
            for key, value in yaml.safe_load(
                base64.b64decode(_registered(program, node.name)["extraConfig"]["guestinfo.userdata"]).decode()
            )["ssh_keys"].items()
            if key.endswith("_public")
        )
        for node in nodes
    }
    timings: dict[str, Any] = {
        "image_seconds": round(image_seconds, 1),
        "image_built_now": image.built_now,
        "image_build_seconds": image.facts["build_seconds"],
        "rootfs_seconds": image.facts.get("rootfs_seconds"),
    }
    with clone_lab(cfg, image, workdir, cfg.ssh.user, private_key) as lab:
        for node in nodes:
            vm = _registered(program, node.name)
            # The user-data carries the program's host keys (docs/cluster.md, "Host identity").
            extra_config = {k: v for k, v in vm["extraConfig"].items() if k.startswith("guestinfo.")}
            (nic,) = vm["networkInterfaces"]
            mac = nic["macAddress"]
            assert nic["useStaticMac"] is True and mac == node_mac(node)
            lab.add(node, mac, extra_config)
        for clone in lab.clones.values():
            lab.start(clone)
        deadline = time.monotonic() + BOOT_TIMEOUT_SECONDS
        for clone in lab.clones.values():
            seen: dict[str, Any] = {"mac": clone.mac, "extra_config": clone.extra_config}
            seen["ssh_up_seconds"] = round(lab.wait_for_ssh(clone, deadline), 1)
            seen["ready"] = _run_step(
                lab, clone, _registered(program, f"{clone.node.name}-ready"), "ready", timeout=READINESS_SSH_TIMEOUT
            )
            seen["ready_seconds"] = round(time.monotonic() - clone.started_at, 1)
            observed["clones"][clone.node.name] = seen
        for clone in lab.clones.values():
            seen = observed["clones"][clone.node.name]
            seen["host_keys"] = lab.host_keys(clone)
            result = lab.ssh(clone, "sudo -n python3 -", stdin=OBSERVE, timeout=300)
            assert result.returncode == 0, f"{clone.node.name}: observing failed:\n{result.stderr}"
            seen["guest"] = json.loads(result.stdout)
            seen["console"] = clone.console_tail(400)

        # The readiness step of one clone run on the other: it must fail, naming both.
        worker_clone = lab.clones[first_worker.name]
        cp_ready = _registered(program, f"{first_cp.name}-ready")
        observed["wrong_clone"] = _run_step(
            lab,
            worker_clone,
            {**cp_ready, "connection": {**cp_ready["connection"], "host": str(first_worker.ip)}},
            "ready",
        )

        # A step with real work on every node: the node settings a later `up` applies in place
        # (authorized keys, NTP, DNS, network config, apt proxy); on a fresh clone it must agree.
        for clone in lab.clones.values():
            seen = observed["clones"][clone.node.name]
            settings = _registered(program, f"{clone.node.name}-node-settings")
            seen["node_settings"] = _run_step(lab, clone, settings, "node-settings")
            step_dir = f"/var/lib/labs-k8s/steps/{clone.node.name}-node-settings"
            seen["node_settings_dir"] = lab.ssh(clone, f"sudo -n stat -c '%a %U' {step_dir}").stdout.strip()

    for name, seen in observed["clones"].items():
        final = seen["guest"]["final_message"]
        uptime = re.search(r"up ([0-9.]+) seconds", final[-1]) if final else None
        timings[name] = {
            "ssh_up_seconds": seen["ssh_up_seconds"],
            "ready_seconds": seen["ready_seconds"],
            "guest_uptime_at_cloud_init_done": float(uptime.group(1)) if uptime else None,
        }
    observed["timings"] = timings
    TIMINGS_FILE.write_text(json.dumps(timings, indent=2) + "\n")
    # Everything seen, for whoever reads a failure (consoles are in the clones' directories).
    plain = {k: v for k, v in observed.items() if k not in ("cfg", "image", "nodes")}
    (workdir / "observed.json").write_text(json.dumps(plain, indent=1, default=str))
    print(f"\nfirstboot timings: {json.dumps(timings)}")
    return observed


def _guest(firstboot: dict[str, Any], name: str) -> dict[str, Any]:
    return firstboot["clones"][name]["guest"]


def _names(firstboot: dict[str, Any]) -> list[str]:
    return [node.name for node in firstboot["nodes"]]


# --------------------------------------------------------------------------- the image


def test_image_is_the_sealed_template_with_pvscsi_in_its_initramfs(firstboot):
    facts = firstboot["image"].facts
    assert any(path.endswith("/vmw_pvscsi.ko") for path in facts["initrd_drivers"]), facts["initrd_drivers"]
    before, after = facts["before_seal"], facts["after_seal"]
    assert re.fullmatch(r"[0-9a-f]{32}", before["machine_id"]), "the unsealed rootfs had a machine-id"
    assert set(before["host_keys"]) == {"ssh-rsa", "ecdsa-sha2-nistp256", "ssh-ed25519"}, "the rootfs had host keys"
    assert after == {"machine_id_bytes": 0, "host_keys": []}
    for package in ("open-vm-tools", "cloud-init", "resolvconf", "sudo", "systemd-timesyncd", "task-ssh-server"):
        assert package in facts["packages"]


# --------------------------------------------------------------------------- cloud-init


def test_cloud_init_is_done_without_errors_through_the_vmware_datasource(firstboot):
    for name in _names(firstboot):
        guest = _guest(firstboot, name)
        status = guest["status"]
        assert status["rc"] == 0, f"{name}: {status}"
        assert "status: done" in status["out"], f"{name}: {status['out']}"
        result = guest["result"]["v1"]
        assert result["errors"] == [], f"{name}: {result['errors']}"
        assert result["datasource"].startswith("DataSourceVMware"), result["datasource"]
        # The only complaints allowed: the datasource publishing the clone's addresses back to
        # guestinfo through vmware-rpctool, which needs VMware's backdoor (not proven here).
        problems = [line for line in guest["cloud_init_problems"] if not BACKDOOR_WARNING.search(line)]
        assert problems == [], f"{name}: {problems}"
        # ds-identify found VMware by itself (dscheck_VMware's VMX_GUESTINFO check): nothing forced it.
        assert "datasource_list: [ VMware, None ]" in guest["cloud_cfg"], guest["cloud_cfg"]
        assert "ci.ds" not in guest["cmdline"] and "ci.datasource" not in guest["cmdline"]
        assert guest["virt"] == "vmware"
        final = guest["final_message"]
        assert final and f"labs-k8s {name}: cloud-init" in final[-1], final


def test_readiness_step_succeeds_through_the_programs_transport(firstboot):
    for name in _names(firstboot):
        ready = firstboot["clones"][name]["ready"]
        assert ready["rc"] == 0, f"{name}: {ready}"
        assert ready["stdout"].strip() == f"cloud-init done on {name}"


def test_readiness_step_fails_on_the_wrong_clone(firstboot):
    """The check above can fail: m01's readiness step run on w01 says which VM it found."""
    cp, worker = _names(firstboot)
    wrong = firstboot["wrong_clone"]
    assert wrong["rc"] != 0
    assert f"this VM calls itself {worker}, expected {cp}" in wrong["stderr"]


# --------------------------------------------------------------------------- identity


def test_hostname_is_the_node_name(firstboot):
    domain = firstboot["cfg"].network.search_domain
    for name in _names(firstboot):
        guest = _guest(firstboot, name)
        assert guest["hostname"] == name
        assert guest["fqdn"] == f"{name}.{domain}"


def test_machine_id_is_new_and_differs_between_clones(firstboot):
    template_id = firstboot["image"].facts["before_seal"]["machine_id"]
    ids = {name: _guest(firstboot, name)["machine_id"].strip() for name in _names(firstboot)}
    for name, machine_id in ids.items():
        assert re.fullmatch(r"[0-9a-f]{32}", machine_id), f"{name}: {machine_id!r}"
        assert machine_id != template_id
        # Committed to disk (systemd-machine-id-commit), not only a transient overmount: it survives a reboot.
        assert _guest(firstboot, name)["machine_id_overmounted"] is False
    assert len(set(ids.values())) == len(ids), ids


def test_ssh_host_keys_are_exactly_the_pinned_ones_and_differ_between_clones(firstboot):
    """cloud-init writes the program's keys (user-data `ssh_keys`) and sshd presents only them: the
    Ed25519 key every node step pins, and on a control plane the VIP's ECDSA key besides; never a
    key of the template, never RSA (docs/cluster.md, "Host identity")."""
    template_keys = firstboot["image"].facts["before_seal"]["host_keys"]
    assert set(template_keys) == {"ssh-rsa", "ecdsa-sha2-nistp256", "ssh-ed25519"}
    keys = {name: firstboot["clones"][name]["host_keys"] for name in _names(firstboot)}
    for name, presented in keys.items():
        pinned = firstboot["pinned_host_keys"][name]
        assert presented == pinned, f"{name}: presents {sorted(presented)}, pinned {sorted(pinned)}"
        assert not set(presented.values()) & set(template_keys.values()), f"{name} presents a template key"
    first, second = keys.values()
    assert not set(first.values()) & set(second.values()), "two clones present the same host key"


# --------------------------------------------------------------------------- network


def test_nic_has_the_configured_name_mac_and_static_address(firstboot):
    cfg = firstboot["cfg"]
    interface = cfg.network.interface
    for node in firstboot["nodes"]:
        guest = _guest(firstboot, node.name)
        mac = firstboot["clones"][node.name]["mac"]
        assert set(guest["links"]) == {interface}, guest["links"]
        link = guest["links"][interface]
        assert link == {"mac": mac.lower(), "pci": NIC_PCI_ADDRESS, "driver": "vmxnet3"}
        # The name comes from the slot, as on vSphere: pciehp registered slot 192 for the NIC's bus.
        assert guest["pci_slots"]["192"] == NIC_PCI_ADDRESS.rsplit(".", 1)[0]
        (entry,) = [a for a in guest["addresses"] if a["ifname"] == interface]
        assert [(i["local"], i["prefixlen"]) for i in entry["addr_info"]] == [(str(node.ip), cfg.prefix_length)]
        default = [r for r in guest["routes"] if r["dst"] == "default"]
        assert default == [
            {
                "dst": "default",
                "gateway": str(cfg.network.gateway),
                "dev": interface,
                **{k: v for k, v in default[0].items() if k not in ("dst", "gateway", "dev")},
            }
        ]
        # resolvconf carried the network config's name servers into resolv.conf.
        for server in cfg.network.dns_servers:
            assert f"nameserver {server}" in guest["resolv_conf"]


# --------------------------------------------------------------------------- data disk


def test_data_disk_is_mounted_where_the_role_needs_it(firstboot):
    for node in firstboot["nodes"]:
        guest = _guest(firstboot, node.name)
        disk = DATA_DISKS[node.role]
        partition = guest["by_path"].get(f"{DATA_DISK_BY_PATH}-part1")
        assert partition, f"{node.name}: no {DATA_DISK_BY_PATH}-part1; by-path: {sorted(guest['by_path'])}"
        assert DATA_DISK_BY_PATH.startswith(f"/dev/disk/by-path/pci-{SCSI_PCI_ADDRESS}-")
        (mount,) = [m for m in guest["mounts"] if m["target"] == disk.mount_point]
        assert (mount["source"], mount["fstype"], mount["label"]) == (partition, "ext4", disk.label)
        assert f"{DATA_DISK_BY_PATH}-part1\t{disk.mount_point}\text4" in guest["fstab"].replace(" ", "\t")
        if node.role is Role.CONTROL_PLANE:
            assert guest["data_dirs"][disk.mount_point] == {"mode": "0o700", "entries": []}


# --------------------------------------------------------------------------- a real step


def test_a_real_step_bundle_runs_through_the_programs_transport(firstboot):
    for name in _names(firstboot):
        seen = firstboot["clones"][name]
        assert seen["node_settings"]["rc"] == 0, f"{name}: {seen['node_settings']}"
        assert seen["node_settings_dir"] == "700 root"


def test_timings_are_recorded(firstboot):
    timings = json.loads(TIMINGS_FILE.read_text())
    for name in _names(firstboot):
        assert 0 < timings[name]["guest_uptime_at_cloud_init_done"] < BOOT_TIMEOUT_SECONDS
        assert 0 < timings[name]["ready_seconds"] < BOOT_TIMEOUT_SECONDS + 300


# --------------------------------------------------------------------------- the transport, without booting


def test_guestinfo_environment_names_are_cloud_inits_own(lab_config):
    """The variables the clones get are the ones Debian's DataSourceVMware reads for each guestinfo key."""
    require_tool("cloud-init")
    extra = guestinfo_extra_config(lab_config, lab_config.control_planes[0])
    keys = [key.removeprefix("guestinfo.") for key in extra]
    probe = subprocess.run(
        [
            "/usr/bin/python3",
            "-c",
            "import json, sys; from cloudinit.sources.DataSourceVMware import get_guestinfo_envvar_key_name as n; "
            "print(json.dumps({k: n(k) for k in json.load(sys.stdin)}))",
        ],
        input=json.dumps(keys),
        capture_output=True,
        text=True,
        check=False,
    )
    assert probe.returncode == 0, probe.stderr
    names = json.loads(probe.stdout)
    env = guestinfo_environment(extra)
    assert env == {"VMX_GUESTINFO": "1", **{names[key.removeprefix("guestinfo.")]: extra[key] for key in extra}}
    assignments = " ".join(f'"{name}={value}"' for name, value in env.items())
    assert systemd_dropin(env).splitlines()[1:] == ["[Manager]", f"DefaultEnvironment={assignments}"]


# tests/ modules tests/firstboot.py uses that need not be in the image key, and why.
NOT_RECIPE = {
    # parse_preseed only reads the rendered preseed, whose text is in the key already.
    "tests.test_template_render": "parses the preseed",
}


def test_the_image_key_covers_every_module_that_builds_the_image():
    """A cached image is reused only while the code that made it is unchanged: every tests/ module
    tests/firstboot.py imports (the late_command replay in tests/debian_rootfs.py decides where the
    template files land) is hashed into the key, or listed above with the reason it need not be."""
    firstboot = next(path for path in RECIPE_FILES if path.name == "firstboot.py")
    tree = ast.parse(firstboot.read_text())
    imported = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tests.")
    }
    assert "tests.debian_rootfs" in imported
    hashed = {f"tests.{path.stem}" for path in RECIPE_FILES if path.suffix == ".py"}
    assert imported - set(NOT_RECIPE) <= hashed, f"not in the image key: {sorted(imported - set(NOT_RECIPE) - hashed)}"
    assert all(path.is_file() for path in RECIPE_FILES)
