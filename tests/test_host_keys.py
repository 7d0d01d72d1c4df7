"""The host keys the program owns (components/rendering/host_keys.py), as OpenSSH and cloud-init
take them, and the host-key step's script (cloudinit/node/install-host-keys.sh)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from components.fleet import HOST_KEY_ENTRYPOINT, host_key_files
from components.rendering import host_keys, node
from tests.labs import make_lab_config_with
from tests.requirements import require_tool

SEED = "1f" * 32
OTHER = "2e" * 32


def test_the_same_seed_gives_the_same_key_files() -> None:
    """cryptography fills OpenSSH's checkint with os.urandom; a key file that changed on every run
    would change the user-data and the step bundle in every preview."""
    for make in (host_keys.ed25519_host_key, host_keys.ecdsa_host_key):
        assert make(SEED) == make(SEED)
        assert make(SEED).public_openssh != make(OTHER).public_openssh
    assert host_keys.ed25519_host_key(SEED).public_openssh.startswith("ssh-ed25519 ")
    assert host_keys.ecdsa_host_key(SEED).public_openssh.startswith("ecdsa-sha2-nistp256 ")
    with pytest.raises(ValueError, match="32 bytes"):
        host_keys.ed25519_host_key("00" * 16)


@pytest.mark.parametrize("make", [host_keys.ed25519_host_key, host_keys.ecdsa_host_key])
def test_openssh_reads_the_private_key_and_derives_the_pinned_public_key(tmp_path: Path, make) -> None:
    require_tool("ssh-keygen")
    key = make(SEED)
    path = tmp_path / "key"
    path.write_text(key.private_openssh)
    path.chmod(0o600)
    derived = subprocess.run(["ssh-keygen", "-y", "-f", str(path)], capture_output=True, text=True, check=False)
    assert derived.returncode == 0, derived.stderr
    assert derived.stdout.split()[:2] == key.public_openssh.split()


def test_known_hosts_lines() -> None:
    assert host_keys.known_hosts_line("10.3.60.51", 22, "ssh-ed25519 AAAA") == "10.3.60.51 ssh-ed25519 AAAA"
    assert host_keys.known_hosts_line("10.3.60.100", 2222, "k v") == "[10.3.60.100]:2222 k v"


def _keys_of(role_node_is_control_plane: bool) -> list[host_keys.HostKey]:
    keys = [host_keys.ed25519_host_key(SEED)]
    return [*keys, host_keys.ecdsa_host_key(OTHER)] if role_node_is_control_plane else keys


def test_the_user_data_carries_the_keys_and_the_identity_does_not(tmp_path: Path) -> None:
    cfg = make_lab_config_with(lambda raw: None)
    for each in (cfg.control_planes[0], cfg.workers[0]):
        keys = _keys_of(each in cfg.control_planes)
        doc = yaml.safe_load(node.render_userdata(cfg, each, keys))
        assert doc["ssh_deletekeys"] is True and "ssh_genkeytypes" not in doc
        assert doc["ssh_keys"] == {
            f"{k.kind}_{part}": getattr(k, f"{part}_openssh") for k in keys for part in ("private", "public")
        }
        assert doc["write_files"][0]["path"] == "/etc/ssh/sshd_config.d/00-labs-k8s-hostkeys.conf"
        # The metadata (the instance-id) is the same with or without keys.
        assert (
            node.guestinfo_extra_config(cfg, each, keys)["guestinfo.metadata"]
            == node.guestinfo_extra_config(cfg, each)["guestinfo.metadata"]
        )
        require_tool("cloud-init")
        path = tmp_path / f"{each.name}.yaml"
        path.write_text(node.render_userdata(cfg, each, keys))
        result = subprocess.run(["cloud-init", "schema", "--config-file", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def _run_step(tmp_path: Path, files: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    step = tmp_path / "step"
    root = tmp_path / "root"
    step.mkdir(exist_ok=True)
    for name, text in files.items():
        (step / name).write_text(text)
    env = {**os.environ, "LABS_K8S_ROOT": str(root)}
    result = subprocess.run(
        ["bash", str(step / HOST_KEY_ENTRYPOINT)], capture_output=True, text=True, env=env, check=False
    )
    return result, step, root


def test_the_step_installs_the_keys_once_and_leaves_no_private_key_behind(tmp_path: Path) -> None:
    require_tool("shellcheck")
    files = host_key_files(host_keys.ed25519_host_key(SEED), host_keys.ecdsa_host_key(OTHER))
    lint = subprocess.run(["shellcheck", "-"], input=files[HOST_KEY_ENTRYPOINT], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout
    first, step, root = _run_step(tmp_path, files)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == host_keys.ed25519_host_key(SEED).public_openssh
    ssh = root / "etc/ssh"
    assert (ssh / "ssh_host_ed25519_key").read_text() == host_keys.ed25519_host_key(SEED).private_openssh
    assert (ssh / "ssh_host_ecdsa_key").read_text() == host_keys.ecdsa_host_key(OTHER).private_openssh
    assert (ssh / "ssh_host_ed25519_key").stat().st_mode & 0o777 == 0o600
    assert (ssh / "sshd_config.d/00-labs-k8s-hostkeys.conf").read_text() == (
        "HostKey /etc/ssh/ssh_host_ed25519_key\nHostKey /etc/ssh/ssh_host_ecdsa_key\n"
    )
    assert not list(step.glob("ssh_host_*_key")), "a private key stayed in the step directory"
    assert "installed" in first.stderr
    # The same keys again (a new VM, where cloud-init put them): nothing changes.
    again, _, _ = _run_step(tmp_path, files)
    assert again.returncode == 0 and "pinned ones already" in again.stderr and "installed" not in again.stderr
    # A rotation: the new key replaces the old one, and is what the step reports.
    rotated = host_key_files(host_keys.ed25519_host_key(OTHER), None)
    third, _, _ = _run_step(tmp_path, rotated)
    assert third.returncode == 0, third.stderr
    assert third.stdout.strip() == host_keys.ed25519_host_key(OTHER).public_openssh
    assert (ssh / "sshd_config.d/00-labs-k8s-hostkeys.conf").read_text() == "HostKey /etc/ssh/ssh_host_ed25519_key\n"


def test_the_step_refuses_a_bundle_without_the_node_key(tmp_path: Path) -> None:
    files = host_key_files(host_keys.ed25519_host_key(SEED), None)
    del files["ssh_host_ed25519_key"]
    result, _, root = _run_step(tmp_path, files)
    assert result.returncode != 0 and "no Ed25519 host key" in result.stderr
    assert not (root / "etc/ssh").exists()
