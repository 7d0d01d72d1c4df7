"""The node-settings step (cloudinit/node/apply-node-settings.sh): what changes without a new VM.

The step runs with the bundle the program renders (components/rendering/node.py
node_settings_files), against a fake root (tests/shell_harness.py) that starts as cloud-init
22.4 leaves a clone: the ENI file rendered by Debian's own cloud-init from the node's network
config, the operator's authorized_keys, cloud-init's timesyncd drop-in. The network file is
rendered by the real `cloud-init devel net-convert`, as on the node; systemctl, resolvconf,
getent and chown are stand-ins that log their calls.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from components.config import LabConfig, Node
from components.rendering import node as node_rendering
from tests.labs import make_lab_config_with, public_key
from tests.requirements import require_tool
from tests.shell_harness import ShellHarness

KEY = public_key()
NEW_KEY = public_key(seed=9, comment="next@labs")
ENI = "etc/network/interfaces.d/50-cloud-init"
TIMESYNCD = "etc/systemd/timesyncd.conf.d"
HOME = "/home/labs"

STUBS = {
    "getent": r"""
case $1 in
    passwd) [[ $2 == labs ]] && echo "labs:x:1000:1000:labs-k8s operator:/home/labs:/bin/bash" ;;
    group) [[ $2 == 1000 ]] && echo "labs:x:1000:" ;;
esac
""",
    "chown": "exit 0",
    # The node's own renderer: Debian's cloud-init, writing only under the --directory it is given.
    "cloud-init": 'exec /usr/bin/cloud-init "$@"',
    "resolvconf": r"""
mkdir -p "$STATE/resolvconf"
[[ $1 == -a ]] && cat >"$STATE/resolvconf/$2"
""",
}


def lab(change: Callable[[dict[str, Any]], None] | None = None) -> LabConfig:
    return make_lab_config_with(change, ssh={"publicKey": KEY})


def first_boot_files(cfg: LabConfig, node: Node, tmp: Path) -> dict[str, str]:
    """What cloud-init 22.4 writes on the clone at first boot, for the files the step manages."""
    source = tmp / "boot-network.yaml"
    source.write_text(node_rendering.render_network_config(cfg, node))
    out = tmp / "boot-render"
    subprocess.run(
        [
            "/usr/bin/cloud-init",
            "devel",
            "net-convert",
            "-p",
            str(source),
            "-k",
            "yaml",
            "-D",
            "debian",
            "-d",
            str(out),
            "-O",
            "eni",
        ],
        check=True,
        capture_output=True,
    )
    servers = " ".join(cfg.network.ntp_servers)
    return {
        ENI: (out / ENI).read_text(),
        f"{HOME.lstrip('/')}/.ssh/authorized_keys": "".join(f"{k}\n" for k in node_rendering.authorized_keys(cfg)),
        # cc_ntp's template, and the template build's drop-in.
        f"{TIMESYNCD}/cloud-init.conf": f"# cloud-init generated file\n\n[Time]\nNTP={servers} \n",
        f"{TIMESYNCD}/labs-k8s.conf": f"# labs-k8s: time sources of the lab\n[Time]\nNTP={servers}\n",
    }


@pytest.fixture
def node_at_first_boot(tmp_path: Path) -> tuple[ShellHarness, LabConfig, Node]:
    require_tool("cloud-init", "bash")
    cfg = lab()
    node = cfg.workers[0]
    h = ShellHarness(tmp_path / "h")
    for name, body in STUBS.items():
        h.stub(name, body)
    for path, text in first_boot_files(cfg, node, tmp_path).items():
        h.write(path, text)
    return h, cfg, node


def run_step(h: ShellHarness, cfg: LabConfig, node: Node) -> subprocess.CompletedProcess[str]:
    h.install_step(node_rendering.node_settings_files(cfg, node))
    h.reset_log()
    return h.run(node_rendering.SETTINGS_ENTRYPOINT, cfg.ssh.user, node_rendering.interface_name(cfg))


def test_a_fresh_clone_is_already_in_step(node_at_first_boot):
    """The first run after first boot changes nothing: cloud-init wrote the same values."""
    h, cfg, node = node_at_first_boot
    before = h.snapshot()
    result = run_step(h, cfg, node)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "node-settings: ssh keys of labs: unchanged",
        "node-settings: ntp servers: unchanged",
        "node-settings: dns: unchanged",
        "node-settings: apt proxy: unchanged",
    ]
    assert h.snapshot() == before
    assert h.calls("systemctl") == [] and h.calls("resolvconf") == []


def test_new_keys_ntp_dns_and_proxy_reach_the_running_node_once(node_at_first_boot):
    h, old, node = node_at_first_boot

    def change(raw: dict[str, Any]) -> None:
        raw["ssh"]["extraPublicKeys"] = [NEW_KEY]
        raw["network"]["ntpServers"] = ["ntp1.labs.local", "ntp2.labs.local"]
        raw["network"]["dnsServers"] = ["10.3.60.2", "10.3.60.3"]
        raw["mirrors"] = {"aptProxy": "http://apt-cache.labs.local:3142"}

    cfg = lab(change)
    assert node_rendering.instance_id(cfg, node) == node_rendering.instance_id(old, node)  # same VM
    result = run_step(h, cfg, node)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "node-settings: ssh keys of labs: changed",
        "node-settings: ntp servers: changed to ntp1.labs.local ntp2.labs.local",
        "node-settings: dns: changed",
        "node-settings: apt proxy: changed",
    ]
    root = h.root
    keys = (root / HOME.lstrip("/") / ".ssh/authorized_keys").read_text()
    assert keys == f"{KEY}\n{NEW_KEY}\n"
    assert oct((root / HOME.lstrip("/") / ".ssh/authorized_keys").stat().st_mode & 0o777) == "0o600"
    for name in ("cloud-init.conf", "labs-k8s.conf"):
        assert "\nNTP=ntp1.labs.local ntp2.labs.local\n" in (root / TIMESYNCD / name).read_text()
    assert h.calls("systemctl") == [["systemctl", "try-restart", "systemd-timesyncd.service"]]
    eni = (root / ENI).read_text()
    assert "dns-nameservers 10.3.60.2 10.3.60.3" in eni and "10.3.60.1" not in eni.split("gateway")[0]
    assert f"address {node.ip}/24" in eni
    # Applied live through resolvconf, for both records ifupdown made (lo carries the global DNS).
    assert [c[1:] for c in h.calls("resolvconf")] == [["-a", "lo.inet"], ["-a", "ens192.inet"]]
    for record in ("lo.inet", "ens192.inet"):
        assert (h.state / "resolvconf" / record).read_text() == (
            "nameserver 10.3.60.2\nnameserver 10.3.60.3\nsearch labs.local\n"
        )
    assert (root / "etc/apt/apt.conf.d/90cloud-init-aptproxy").read_text() == (
        'Acquire::http::Proxy "http://apt-cache.labs.local:3142";\n'
    )

    # A second run with the same values: nothing changes, nothing restarts.
    after = h.snapshot()
    again = run_step(h, cfg, node)
    assert again.returncode == 0, again.stderr
    assert all(line.endswith("unchanged") for line in again.stdout.splitlines()), again.stdout
    assert h.snapshot() == after
    assert h.calls("systemctl") == [] and h.calls("resolvconf") == []

    # The proxy removed from the config: the file goes.
    no_proxy = lab(lambda raw: (change(raw), raw.__setitem__("mirrors", {})))
    removed = run_step(h, no_proxy, node)
    assert "node-settings: apt proxy: removed" in removed.stdout
    assert not (root / "etc/apt/apt.conf.d/90cloud-init-aptproxy").exists()


def test_a_key_rotation_keeps_the_login_key_until_it_is_swapped(node_at_first_boot):
    """Phase 1 adds the next key beside the one the steps log in with; phase 2 (publicKey and
    sshPrivateKey swapped, the old key dropped) leaves only the new one."""
    h, _, node = node_at_first_boot
    phase1 = lab(lambda raw: raw["ssh"].__setitem__("extraPublicKeys", [NEW_KEY]))
    assert run_step(h, phase1, node).returncode == 0
    keys = h.root / HOME.lstrip("/") / ".ssh/authorized_keys"
    assert keys.read_text().splitlines() == [KEY, NEW_KEY]

    def swap(raw: dict[str, Any]) -> None:
        raw["ssh"]["publicKey"] = NEW_KEY
        raw["ssh"]["extraPublicKeys"] = []

    phase2 = make_lab_config_with(swap)
    assert run_step(h, phase2, node).returncode == 0
    assert keys.read_text().splitlines() == [NEW_KEY]


def test_an_address_change_is_refused(node_at_first_boot):
    """Only DNS may change in place; a different address means another VM (a replacement)."""
    h, _, node = node_at_first_boot

    def move(raw: dict[str, Any]) -> None:
        raw["network"]["gateway"] = "10.3.60.254"

    before = h.snapshot()
    result = run_step(h, lab(move), node)
    assert result.returncode == 1
    assert "differs from the config in more than DNS; such a change replaces the VM" in result.stderr
    assert h.snapshot() == before  # the keys and NTP ran before it: same values, nothing written


def test_it_never_empties_authorized_keys(node_at_first_boot):
    h, cfg, node = node_at_first_boot
    files = {**node_rendering.node_settings_files(cfg, node), "authorized_keys": ""}
    h.install_step(files)
    result = h.run(node_rendering.SETTINGS_ENTRYPOINT, "labs", "ens192")
    assert result.returncode == 1
    assert "refusing to empty" in result.stderr
