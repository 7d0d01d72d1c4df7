"""A new user's first `make up`, at the level they meet it: `make` targets with a fake `pulumi`
(tests/fake_pulumi.py) on PATH, and `python -m components render` as a subprocess.

Each mistake the machine running Pulumi can see must stop the run in seconds, say what is wrong
and print the command that fixes it, before `pulumi up` (or anything in vCenter) happens.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from components.offline import REPO_ROOT
from tests.debian_rootfs import in_target
from tests.requirements import require_root, require_tool
from tests.sandbox import Sandbox
from tests.test_docs import commands_of, first_lab_blocks
from tests.test_install_test_deps import online_rootfs
from tests.test_seal_rootfs import _rootfs_tarball

STACK = "mysite"


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    box = Sandbox(tmp_path)
    stale = subprocess.run(["make", "-q", ".venv/.runtime"], cwd=box.repo, env=box.env, capture_output=True,
                           check=False)
    assert stale.returncode == 0, "the sandbox's make would rebuild .venv: run `make venv` in the repository first"
    return box


def keypair(home: Path, name: str = "labs-k8s", passphrase: str = "") -> tuple[Path, Path]:
    require_tool("ssh-keygen")
    (home / ".ssh").mkdir(exist_ok=True)
    private = home / ".ssh" / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", name, "-f", str(private)],
                   check=True, capture_output=True)
    return private, private.with_suffix(".pub")


def ready_stack(box: Sandbox, *, private: Path | None = None, public: Path | None = None, backend: str = "cloud",
                edit: str = "") -> None:
    """The README's steps 2-5 done (stack created, secrets set), with the given key files."""
    if private is None or public is None:
        private, public = keypair(box.home)
    login = "pulumi login --local" if backend == "local" else "pulumi login"
    script = f"""
{login}
cp Pulumi.labs.yaml Pulumi.{STACK}.yaml
{edit}
pulumi stack init {STACK}
pulumi config set --stack {STACK} vsphere:vsphereServer vcenter.example.com
pulumi config set --stack {STACK} vsphere:user labs-k8s@vsphere.local
printf 'hunter2' | pulumi config set --stack {STACK} --secret vsphere:password
pulumi config set --stack {STACK} --secret labs-k8s:sshPrivateKey < {private}
pulumi config set --stack {STACK} --path 'labs-k8s:ssh.publicKey' "$(cat {public})"
"""
    result = box.run(script, PULUMI_ACCESS_TOKEN="pul-fake", PULUMI_CONFIG_PASSPHRASE="correct horse")
    assert result.returncode == 0, result.stderr


# --------------------------------------------------------------------------- step 1 on a fresh machine

# What the README's later steps run on the user's machine, and how to see that it is there.
LATER_STEPS_NEED = {
    "curl": "command -v curl",  # step 1: get.pulumi.com; the vCenter CA download
    "git": "command -v git",  # step 1: the clone
    "make": "command -v make",  # make venv, make up
    "python3 -m venv": "python3 -m venv /tmp/first-lab-venv && /tmp/first-lab-venv/bin/pip --version",
    "ssh-keygen": "command -v ssh-keygen",  # step 5: the lab's key pair
    "xorriso": "command -v xorriso",  # the template build remasters the installer ISO on this machine
}


def test_step_one_installs_every_tool_the_later_steps_use(tmp_path):
    """The README's apt-get line, verbatim, in a minimal Debian 12 (debootstrap minbase, which has
    none of git, make, curl, xorriso or python3-venv), then each tool the later steps call."""
    require_root()
    require_tool("debootstrap", "tar", "chroot", "unshare")
    apt_line = next(line for line in commands_of(first_lab_blocks("pulumi-cloud")[0]) if "apt-get install" in line)
    root = tmp_path / "fresh"
    online_rootfs(_rootfs_tarball({}), root)
    before = {tool: in_target(root, check).returncode for tool, check in LATER_STEPS_NEED.items()}
    assert [tool for tool, status in before.items() if status != 0], "the rootfs already has every tool: no baseline"

    installed = in_target(root, f"apt-get update -qq && {apt_line} >/dev/null", timeout=1200)
    assert installed.returncode == 0, installed.stderr[-3000:]
    after = {tool: in_target(root, check) for tool, check in LATER_STEPS_NEED.items()}
    missing = {tool: result.stderr[-300:] for tool, result in after.items() if result.returncode != 0}
    assert not missing, f"README step 1 does not install what later steps use: {missing}"


# --------------------------------------------------------------------------- the CLI and the login


@pytest.mark.parametrize("target", ["up", "preview", "destroy"])
def test_without_the_cli_make_says_how_to_install_it(tmp_path, target):
    box = Sandbox(tmp_path, with_cli=False)
    result = box.make(target)
    assert result.returncode != 0
    assert "command not found" not in result.stderr
    assert "the Pulumi CLI is not installed" in result.stderr
    assert "curl -fsSL https://get.pulumi.com | sh" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("target", ["up", "preview", "destroy"])
def test_without_a_login_make_says_how_to_log_in(sandbox, target):
    result = sandbox.make(target)
    assert result.returncode != 0
    assert "not logged in to a backend" in result.stderr
    for way in ("pulumi login  ", "pulumi login s3://", "pulumi login --local", "PULUMI_CONFIG_PASSPHRASE"):
        assert way in result.stderr
    assert sandbox.commands() == ["whoami"]


# --------------------------------------------------------------------------- the stack


def test_up_says_backend_and_stack_before_it_creates_the_stack(sandbox):
    sandbox.run("pulumi login --local\ncp Pulumi.labs.yaml Pulumi.mysite.yaml\n")
    result = sandbox.make("up", f"STACK={STACK}", PULUMI_CONFIG_PASSPHRASE="correct horse")
    announced = f"make up: creating stack '{STACK}' in backend file://~ as tester"
    assert announced in result.stdout
    assert sandbox.commands()[:4] == ["login", "whoami", "stack ls", "stack init"]
    # The announcement comes before `pulumi stack init`'s own output.
    assert result.stdout.index(announced) < result.stdout.index(f"Created stack '{STACK}'")
    # The new stack has no secrets yet: the exact commands, and no `pulumi up`.
    assert result.returncode != 0
    assert "up" not in sandbox.commands()
    for command in (
        f"pulumi config set --stack {STACK} --path 'labs-k8s:ssh.publicKey' \"$(cat ~/.ssh/labs-k8s.pub)\"",
        f"pulumi config set --stack {STACK} --secret labs-k8s:sshPrivateKey < ~/.ssh/labs-k8s",
        f"pulumi config set --stack {STACK} --secret vsphere:password",
        f"pulumi config set --stack {STACK} vsphere:vsphereServer <vcenter host>",
    ):
        assert command in result.stderr


def test_an_existing_stack_is_named_and_not_created_again(sandbox):
    ready_stack(sandbox)
    result = sandbox.make("preview", f"STACK={STACK}")
    assert result.returncode == 0, result.stderr
    assert f"make preview: stack '{STACK}' in backend https://api.pulumi.com as tester" in result.stdout
    assert sandbox.commands().count("stack init") == 1
    assert sandbox.calls()[-1] == ["preview", "--stack", STACK, "--diff"]


def test_destroy_never_creates_a_stack(sandbox):
    sandbox.run("pulumi login --local\n")
    result = sandbox.make("destroy", "STACK=elsewhere")
    assert result.returncode != 0
    assert "stack 'elsewhere' does not exist in backend file://~" in result.stderr
    assert "stack init" not in sandbox.commands() and "destroy" not in sandbox.commands()


def test_destroy_reads_vcenter_first_so_a_vm_already_gone_does_not_stop_it(sandbox):
    """`pulumi destroy` alone trusts the state: the vSphere provider's delete of a VM deleted in
    vCenter fails ("cannot locate virtual machine with UUID", terraform-provider-vsphere
    resourceVSphereVirtualMachineDelete), while its read marks the VM gone (UUIDNotFoundError ->
    SetId("")). So `make destroy` refreshes first (docs/troubleshooting.md)."""
    ready_stack(sandbox)
    result = sandbox.make("destroy", f"STACK={STACK}")
    assert result.returncode == 0, result.stderr
    assert sandbox.calls()[-1] == ["destroy", "--stack", STACK, "--refresh"]


def test_the_stack_file_must_exist(sandbox):
    sandbox.run("pulumi login --local\n")
    result = sandbox.make("up", "STACK=nowhere", PULUMI_CONFIG_PASSPHRASE="x")
    assert result.returncode != 0
    assert "no stack file Pulumi.nowhere.yaml" in result.stderr
    assert "cp Pulumi.labs.yaml Pulumi.nowhere.yaml" in result.stderr
    assert "stack init" not in sandbox.commands()


@pytest.mark.parametrize("target", ["up", "destroy"])
def test_a_teammates_checkout_fetches_the_stacks_settings_instead_of_copying_the_example(sandbox, target):
    # The lab was built from this machine; stack files are not committed, so a second checkout
    # (a teammate, a new laptop) has the stack in the backend but no Pulumi.mysite.yaml.
    ready_stack(sandbox, backend="local",
                edit=f"sed -i 's/datacenter: Datacenter/datacenter: DC-Berlin/' Pulumi.{STACK}.yaml")
    deployed = sandbox.make("up", f"STACK={STACK}", PULUMI_CONFIG_PASSPHRASE="correct horse")
    assert deployed.returncode == 0, deployed.stderr
    sandbox.stack_file(STACK).unlink()

    result = sandbox.make(target, f"STACK={STACK}", PULUMI_CONFIG_PASSPHRASE="correct horse")
    assert result.returncode != 0
    assert f"stack '{STACK}' exists in backend file://~, but its settings file Pulumi.{STACK}.yaml is not" \
           in result.stderr
    assert f"pulumi config refresh --stack {STACK}" in result.stderr
    assert "no stack file" not in result.stderr  # the example's settings are not this lab's
    assert sandbox.commands()[-2:] == ["whoami", "stack ls"]

    # The command it prints brings back the lab's own settings and salt; then the target runs.
    refreshed = sandbox.run(f"pulumi config refresh --stack {STACK}\n")
    assert refreshed.returncode == 0, refreshed.stderr
    assert "DC-Berlin" in sandbox.stack_file(STACK).read_text()
    result = sandbox.make(target, f"STACK={STACK}", PULUMI_CONFIG_PASSPHRASE="correct horse")
    assert result.returncode == 0, result.stderr
    assert sandbox.calls()[-1][0] == target


def test_a_copied_salt_or_ciphertext_is_refused_before_stack_init(sandbox):
    ready_stack(sandbox, backend="local")
    # Someone copies a used stack file (salt and ciphertext of `mysite`) for a new site.
    sandbox.run(f"cp Pulumi.{STACK}.yaml Pulumi.berlin.yaml\n")
    result = sandbox.make("up", "STACK=berlin", PULUMI_CONFIG_PASSPHRASE="another passphrase")
    assert result.returncode != 0
    assert "carries secrets material of another stack" in result.stderr
    assert "encryptionsalt" in result.stderr and "vsphere:password" in result.stderr
    assert sandbox.commands().count("stack init") == 1  # only mysite's, from ready_stack


def test_a_self_managed_backend_without_passphrase_says_so_before_stack_init(sandbox):
    sandbox.run("pulumi login --local\ncp Pulumi.labs.yaml Pulumi.mysite.yaml\n")
    result = sandbox.make("up", f"STACK={STACK}")
    assert result.returncode != 0
    assert "export PULUMI_CONFIG_PASSPHRASE=" in result.stderr
    assert "stack init" not in sandbox.commands()


# --------------------------------------------------------------------------- settings the program checks


def test_a_complete_stack_reaches_pulumi_up(sandbox):
    ready_stack(sandbox)
    result = sandbox.make("up", f"STACK={STACK}")
    assert result.returncode == 0, result.stderr
    assert sandbox.calls()[-1] == ["up", "--stack", STACK]
    assert "to create (fake up" in result.stdout
    # What is committed: ciphertext only, never the password or the key.
    text = sandbox.stack_file(STACK).read_text()
    assert "hunter2" not in text and "PRIVATE KEY" not in text
    assert yaml.safe_load(text)["config"]["vsphere:password"]["secure"].startswith("v1:")


def test_a_private_key_with_a_passphrase_stops_up_before_anything_is_built(sandbox):
    private, public = keypair(sandbox.home, "locked", passphrase="s3cret-phrase")
    ready_stack(sandbox, private=private, public=public)
    result = sandbox.make("up", f"STACK={STACK}")
    assert result.returncode != 0
    assert "labs-k8s:sshPrivateKey: the private key is protected by a passphrase" in result.stderr
    assert "ssh-keygen -t ed25519 -N ''" in result.stderr
    assert "nothing was created" in result.stderr


def test_a_private_key_that_is_not_the_public_keys_pair_stops_up(sandbox):
    private, _ = keypair(sandbox.home, "one")
    _, public = keypair(sandbox.home, "two")
    ready_stack(sandbox, private=private, public=public)
    result = sandbox.make("up", f"STACK={STACK}")
    assert result.returncode != 0
    assert "does not belong to labs-k8s:ssh.publicKey" in result.stderr
    fingerprint = subprocess.run(["ssh-keygen", "-lf", str(public)], capture_output=True, text=True,
                                 check=True).stdout.split()[1]
    assert f"ssh.publicKey is {fingerprint}" in result.stderr


def test_a_junk_allow_unverified_ssl_stops_up_before_the_cli_runs_up(sandbox):
    ready_stack(sandbox, edit=f"sed -i 's/allowUnverifiedSsl: \"false\"/allowUnverifiedSsl: \"ture\"/' "
                              f"Pulumi.{STACK}.yaml")
    result = sandbox.make("up", f"STACK={STACK}")
    assert result.returncode != 0
    assert "vsphere:allowUnverifiedSsl: 'ture' is neither true nor false" in result.stderr
    assert "up" not in sandbox.commands()


def test_a_config_mistake_stops_up_before_the_cli_runs_up(sandbox):
    ready_stack(sandbox, edit=f"sed -i 's/vip: 10.3.60.100/vip: 10.3.60.51/' Pulumi.{STACK}.yaml")
    result = sandbox.make("up", f"STACK={STACK}")
    assert result.returncode != 0
    assert "labs-k8s:loadBalancer.vip" in result.stderr
    assert "up" not in sandbox.commands()


def test_settings_from_pulumi_esc_are_left_to_the_program(sandbox):
    ready_stack(sandbox)
    document = yaml.safe_load(sandbox.stack_file(STACK).read_text())
    del document["config"]["vsphere:password"]  # comes from the environment instead
    document["environment"] = ["labs-k8s/vcenter"]
    sandbox.stack_file(STACK).write_text(yaml.safe_dump(document, sort_keys=False))
    result = sandbox.make("preview", f"STACK={STACK}", VSPHERE_PASSWORD="from-esc")
    assert f"Pulumi.{STACK}.yaml imports Pulumi ESC environments" in result.stdout
    assert sandbox.calls()[-1][0] == "preview"


# --------------------------------------------------------------------------- render


def render(stack: str, out: Path, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "components", "render", "--stack", stack, "--out", str(out)],
                          cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


def test_render_of_a_missing_stack_file_says_so(tmp_path):
    result = render("nowhere", tmp_path / "out")
    assert result.returncode == 2
    assert "no stack file Pulumi.nowhere.yaml" in result.stderr
    assert "cp Pulumi.labs.yaml Pulumi.nowhere.yaml" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", ["privileges --stack labs", "render --stack labs --out out", "check --for up"])
def test_components_without_the_projects_packages_names_the_virtualenv(tmp_path, command):
    # The system's python3 (here: site-packages switched off with -S) has none of the pinned packages;
    # the README's `python -m components` lines need the project's .venv.
    result = subprocess.run([sys.executable, "-S", "-m", "components", *command.split()], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1
    assert "does not have this project's packages (pulumi" in result.stderr
    assert ".venv/bin/python -m components" in result.stderr
    assert "Traceback" not in result.stderr


def test_render_reports_a_junk_boolean(sandbox, tmp_path):
    text = sandbox.stack_file("labs").read_text().replace('allowUnverifiedSsl: "false"', 'allowUnverifiedSsl: "yes"')
    sandbox.stack_file("junk").write_text(text)
    result = render("junk", tmp_path / "out", cwd=sandbox.repo)
    assert result.returncode == 2
    assert "vsphere:allowUnverifiedSsl: 'yes' is neither true nor false" in result.stderr
    assert "Traceback" not in result.stderr


# --------------------------------------------------------------------------- the example


def test_the_example_stack_file_carries_nothing_site_or_secret():
    document = yaml.safe_load((REPO_ROOT / "Pulumi.labs.yaml").read_text())
    assert not {"encryptionsalt", "encryptedkey", "secretsprovider"} & set(document)
    config = document["config"]
    assert not [k for k, v in config.items() if isinstance(v, dict) and "secure" in v]
    # The workflow passes VSPHERE_*: a committed value would win over them.
    assert not {"vsphere:vsphereServer", "vsphere:user", "vsphere:password"} & set(config)
    ignored = subprocess.run(["git", "check-ignore", "-q", "Pulumi.mysite.yaml"], cwd=REPO_ROOT, check=False)
    assert ignored.returncode == 0, "a site's stack file must be ignored by git"
    tracked = subprocess.run(["git", "check-ignore", "-q", "Pulumi.labs.yaml"], cwd=REPO_ROOT, check=False)
    assert tracked.returncode == 1


def test_a_stack_files_vcenter_login_wins_over_the_workflows_variables():
    """Why the example names no vCenter: the program reads the login as the provider does (its
    config first, VSPHERE_* only for what the config lacks), so a committed value would win."""
    from components.stack_config import vsphere_settings

    example = yaml.safe_load((REPO_ROOT / "Pulumi.labs.yaml").read_text())["config"]
    workflow = {"VSPHERE_SERVER": "vcenter.ci.example", "VSPHERE_USER": "preview@vsphere.local",
                "VSPHERE_PASSWORD": "from-secrets"}
    settings = vsphere_settings(lambda key: example.get(key), workflow)
    assert (settings["vsphereServer"], settings["user"], settings["password"]) == (
        "vcenter.ci.example", "preview@vsphere.local", "from-secrets")
    committed = {**example, "vsphere:vsphereServer": "vcenter.site.example"}
    assert vsphere_settings(lambda key: committed.get(key), workflow)["vsphereServer"] == "vcenter.site.example"


@pytest.mark.parametrize("target", ["up", "preview", "destroy"])
def test_a_stale_ssh_agent_socket_does_not_break_the_steps(sandbox, tmp_path, target):
    """SSH_AUTH_SOCK left from a closed session (a tmux pane that outlived its SSH login): pulumi-command
    dials it before the lab's own key and every remote step fails. The steps log in with
    labs-k8s:sshPrivateKey alone, so make runs the CLI without the variable."""
    ready_stack(sandbox)
    if target == "destroy":
        assert sandbox.make("up", f"STACK={STACK}").returncode == 0
    stale = tmp_path / "gone" / "agent.sock"
    result = sandbox.make(target, f"STACK={STACK}", SSH_AUTH_SOCK=str(stale))
    assert result.returncode == 0, result.stderr
    assert sandbox.calls()[-1][0] == target
