"""A new user's first `make up`, at the level they meet it: `make` targets with a fake `pulumi`
(tests/fake_pulumi.py) on PATH, and `python -m components render` as a subprocess.

Each mistake the machine running Pulumi can see must stop the run in seconds, say what is wrong
and print the command that fixes it, before `pulumi up` (or anything in vCenter) happens.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from components.tools.offline import REPO_ROOT
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
    stale = subprocess.run(
        ["make", "-q", ".venv/.runtime"], cwd=box.repo, env=box.env, capture_output=True, check=False
    )
    assert stale.returncode == 0, "the sandbox's make would rebuild .venv: run `make venv` in the repository first"
    return box


def keypair(home: Path, name: str = "labs-k8s", passphrase: str = "") -> tuple[Path, Path]:
    require_tool("ssh-keygen")
    (home / ".ssh").mkdir(exist_ok=True)
    private = home / ".ssh" / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", name, "-f", str(private)],
        check=True,
        capture_output=True,
    )
    return private, private.with_suffix(".pub")


def ready_stack(
    box: Sandbox, *, private: Path | None = None, public: Path | None = None, backend: str = "cloud", edit: str = ""
) -> None:
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
    "ssh-keygen": "command -v ssh-keygen",  # step 6: the lab's key pair
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
    result = box.make(target, f"STACK={STACK}")
    assert result.returncode != 0
    assert "command not found" not in result.stderr
    assert "the Pulumi CLI is not installed" in result.stderr
    assert "curl -fsSL https://get.pulumi.com | sh" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("target", ["up", "preview", "destroy"])
def test_without_a_login_make_says_how_to_log_in(sandbox, target):
    result = sandbox.make(target, f"STACK={STACK}")
    assert result.returncode != 0
    assert "not logged in to a backend" in result.stderr
    for way in ("pulumi login  ", "pulumi login s3://", "pulumi login --local", "PULUMI_CONFIG_PASSPHRASE"):
        assert way in result.stderr
    assert sandbox.commands() == ["version", "whoami"]


# --------------------------------------------------------------------------- the stack


def test_up_says_backend_and_stack_before_it_creates_the_stack(sandbox):
    sandbox.run("pulumi login --local\ncp Pulumi.labs.yaml Pulumi.mysite.yaml\n")
    result = sandbox.make("up", f"STACK={STACK}", PULUMI_CONFIG_PASSPHRASE="correct horse")
    announced = f"make up: creating stack '{STACK}' in backend file://~ as tester"
    assert announced in result.stdout
    assert sandbox.commands()[:5] == ["login", "version", "whoami", "stack ls", "stack init"]
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


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (f"printf 'rotated-pw' | pulumi config set --stack {STACK} --secret vsphere:password", "vsphere:password"),
        (f"pulumi config set --stack {STACK} vsphere:user other@vsphere.local", "vsphere:user"),
    ],
    ids=["password-rotated", "user-changed"],
)
def test_destroy_after_a_changed_vcenter_login_says_an_up_comes_first(sandbox, change, key):
    """`pulumi destroy` configures the providers with the inputs the last `up` recorded
    (pulumi/pulumi providers/registry.go Registry.Same; #18740 reverted by #18756): with a changed
    login it would log in with the old one. The fake's state records the default vSphere provider's
    inputs as the engine does (tests/fake_pulumi.py)."""
    ready_stack(sandbox)
    assert sandbox.make("up", f"STACK={STACK}").returncode == 0
    assert sandbox.run(change + "\n").returncode == 0
    refused = sandbox.make("destroy", f"STACK={STACK}")
    assert refused.returncode != 0
    assert f"{key} changed since the last `up` of stack '{STACK}'" in refused.stderr
    assert f"make up STACK={STACK}" in refused.stderr and "#18756" in refused.stderr
    assert "destroy" not in sandbox.commands()
    assert "hunter2" not in refused.stderr + refused.stdout and "rotated-pw" not in refused.stderr + refused.stdout
    assert not any("hunter2" in arg or "rotated-pw" in arg for argv in sandbox.calls() for arg in argv)

    assert sandbox.make("up", f"STACK={STACK}").returncode == 0  # records the new login
    done = sandbox.make("destroy", f"STACK={STACK}")
    assert done.returncode == 0, done.stderr
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
    ready_stack(
        sandbox, backend="local", edit=f"sed -i 's/datacenter: Datacenter/datacenter: DC-Berlin/' Pulumi.{STACK}.yaml"
    )
    deployed = sandbox.make("up", f"STACK={STACK}", PULUMI_CONFIG_PASSPHRASE="correct horse")
    assert deployed.returncode == 0, deployed.stderr
    sandbox.stack_file(STACK).unlink()

    result = sandbox.make(target, f"STACK={STACK}", PULUMI_CONFIG_PASSPHRASE="correct horse")
    assert result.returncode != 0
    assert (
        f"stack '{STACK}' exists in backend file://~, but its settings file Pulumi.{STACK}.yaml is not" in result.stderr
    )
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


@pytest.mark.parametrize("target", ["up", "preview", "destroy"])
def test_a_cli_older_than_the_program_needs_is_named_with_the_upgrade(sandbox, target):
    """A CLI before 3.139.0 hands the template's provider no vsphere:* settings (pulumi/pulumi#17673):
    the check said nothing, and the build failed for want of a login (issue 33)."""
    ready_stack(sandbox)
    old = sandbox.make(target, f"STACK={STACK}", FAKE_PULUMI_VERSION="v3.130.0")
    assert old.returncode != 0
    assert "the Pulumi CLI is v3.130.0; this lab needs 3.139.0 or newer" in old.stderr
    assert "curl -fsSL https://get.pulumi.com | sh" in old.stderr
    assert target not in [call[0] for call in sandbox.calls()]
    for fine in ("v3.139.0", "v3.274.1-dev.0"):
        assert "this lab needs" not in sandbox.make(target, f"STACK={STACK}", FAKE_PULUMI_VERSION=fine).stderr


def test_a_missing_xorriso_stops_up_before_the_iso_download(sandbox):
    """xorriso was found missing only after the ~700 MB download, inside the build (issue 33)."""
    ready_stack(sandbox)
    # PATH without xorriso: the sandbox's bin, plus links to every other tool of the system's.
    bare = sandbox.root / "bare-bin"
    bare.mkdir()
    for directory in ("/usr/local/bin", "/usr/bin", "/bin"):
        for tool in Path(directory).iterdir() if Path(directory).is_dir() else ():
            if tool.name != "xorriso" and not (bare / tool.name).exists():
                (bare / tool.name).symlink_to(tool)
    result = sandbox.make("up", f"STACK={STACK}", PATH=f"{sandbox.bin}:{bare}")
    assert result.returncode != 0
    assert "xorriso is not installed" in result.stderr and "apt-get install -y xorriso" in result.stderr
    assert "up" not in [call[0] for call in sandbox.calls()]
    # preview and destroy build nothing: they do not need it.
    assert "xorriso" not in sandbox.make("preview", f"STACK={STACK}", PATH=f"{sandbox.bin}:{bare}").stderr


def test_args_reach_the_pulumi_cli_and_make_help_says_how(sandbox):
    """make up/preview/destroy could not pass --yes, --target, --replace or --parallel (issue 33)."""
    ready_stack(sandbox)
    up = sandbox.make("up", f"STACK={STACK}", "ARGS='--yes --parallel 4 --target urn:pulumi:x'")
    assert up.returncode == 0, up.stderr
    assert sandbox.calls()[-1] == ["up", "--stack", STACK, "--yes", "--parallel", "4", "--target", "urn:pulumi:x"]
    preview = sandbox.make("preview", f"STACK={STACK}", "ARGS=--refresh")
    assert preview.returncode == 0, preview.stderr
    assert sandbox.calls()[-1][:4] == ["preview", "--stack", STACK, "--diff"] and sandbox.calls()[-1][-1] == "--refresh"
    shown = subprocess.run(["make", "-s", "help"], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    assert "ARGS='...' is passed to the Pulumi CLI" in shown and "--target URN" in shown and "--replace URN" in shown
    # bench/lb_failover.py refuses without root (network namespaces): help says so before it is run.
    assert "root" in next(line for line in shown.splitlines() if line.startswith("make bench"))


@pytest.mark.parametrize("target", ["up", "preview", "destroy"])
def test_make_runs_the_cli_wider_than_its_per_core_default_unless_told_otherwise(sandbox, target):
    """The CLI's default of 4 operations per local core made a 2-core jump host prepare the 15
    machines of a 10-worker lab in two waves (docs/testing.md, the bench; the Makefile): make
    sets PULUMI_PARALLEL (which the CLI reads for --parallel's default, cmd/pulumi/operations/up.go
    defaultParallel) to 64, and a PULUMI_PARALLEL of the user's own is kept."""
    ready_stack(sandbox)
    made = sandbox.make(target, f"STACK={STACK}", "ARGS=--yes")
    assert made.returncode == 0, made.stderr
    assert sandbox.calls()[-1][0] == target and sandbox.parallels()[-1] == "64"
    own = sandbox.make(target, f"STACK={STACK}", "ARGS=--yes", PULUMI_PARALLEL="6")
    assert own.returncode == 0, own.stderr
    assert sandbox.calls()[-1][0] == target and sandbox.parallels()[-1] == "6"


@pytest.mark.parametrize("target", ["up", "preview", "destroy"])
def test_a_urn_in_args_reaches_the_cli_untouched(sandbox, target):
    """`make up ARGS='--replace URN'` as make help and the runbook say: every nested resource's URN
    holds `$` (`...Lab$labs-k8s:fleet:NodeFleet$...`), which make took for its variables and the
    shell for its own (found by the lab in a box: "Target ... could not be found"). Quotes still
    group words."""
    ready_stack(sandbox)
    urn = f"urn:pulumi:{STACK}::labs-k8s::labs-k8s:lab:Lab$labs-k8s:fleet:NodeFleet$random:index/randomId:RandomId::x"
    # As a user types it: ARGS='--yes --replace urn:...$... --message "two words"'
    typed = shlex.quote(f'ARGS=--yes --replace {urn} --message "two words"')
    made = sandbox.make(target, f"STACK={STACK}", typed, labs="EXPANDED")
    assert made.returncode == 0, made.stderr
    call = sandbox.calls()[-1]
    assert call[-5:] == ["--yes", "--replace", urn, "--message", "two words"], call


@pytest.mark.parametrize("target", ["up", "destroy"])
def test_a_failed_up_says_what_to_do(sandbox, target):
    """A step that failed (here one whose SSH session was cut, as a balancer failover cuts it):
    make keeps the CLI's exit status and says what to do next, with the runbook's section."""
    ready_stack(sandbox)
    if target == "destroy":
        assert sandbox.make("up", f"STACK={STACK}").returncode == 0
    cut = "command:remote:Command labs-k8s-w03-leave-cluster deleting failed: EOF"
    made = sandbox.make(target, f"STACK={STACK}", FAKE_PULUMI_FAILS=cut)
    assert made.returncode != 0 and cut in made.stderr, made.stderr
    hint = next(line for line in made.stderr.splitlines() if line.startswith(f"make {target}: pulumi {target} failed"))
    assert "(exit 255)" in hint and f"then run make {target} again" in hint, hint
    section = re.search(r'docs/runbook\.md, "([^"]+)"', hint)
    assert section and f"## {section.group(1)}\n" in (sandbox.repo / "docs" / "runbook.md").read_text(), hint


@pytest.mark.parametrize("target", ["up", "preview"])
def test_layer_hands_the_layers_targets_to_the_cli_untouched(sandbox, target):
    """`make up LAYER=vsphere`: the vSphere half's `--target` URNs hold `$` and `*`. Each reaches the
    CLI as one argument, exactly as `python -m components targets` prints it: make did not take
    `$l...` for a variable, the shell neither expanded `$labs` nor globbed `**` against the files
    of the checkout (made here to match), and ARGS still comes last."""
    from components.tools.targets import layer_targets

    ready_stack(sandbox)
    expected = [f"--target={urn}" for urn in layer_targets(STACK, "vsphere")]
    for urn in layer_targets(STACK, "vsphere"):  # what an unquoted `...$vsphere:**` would glob to
        (sandbox.repo / urn.replace("**", "bait")).touch()
    made = sandbox.make(target, f"STACK={STACK}", "LAYER=vsphere", "ARGS=--yes", labs="EXPANDED")
    assert made.returncode == 0, made.stderr
    assert any("$" in t and "**" in t for t in expected), "the case this test is about"
    call = sandbox.calls()[-1]
    assert call[call.index("--stack") + 1] == STACK
    assert [a for a in call if a.startswith("--target")] == expected, call
    assert call[-1] == "--yes"
    # Without LAYER, no target at all (the whole lab).
    assert sandbox.make(target, f"STACK={STACK}").returncode == 0
    assert not [a for a in sandbox.calls()[-1] if a.startswith("--target")]


def test_a_wrong_layer_is_refused_naming_layer_and_the_choices(sandbox):
    ready_stack(sandbox)
    before = len(sandbox.calls())
    made = sandbox.make("up", f"STACK={STACK}", "LAYER=vshpere")
    assert made.returncode != 0
    assert "LAYER='vshpere' is not a layer of this program; LAYER is one of: template, vsphere" in made.stderr
    assert len(sandbox.calls()) == before, "refused before the CLI ran at all"
    refused = sandbox.make("destroy", f"STACK={STACK}", "LAYER=vsphere")
    assert refused.returncode != 0 and "LAYER is for up and preview" in refused.stderr
    assert len(sandbox.calls()) == before


def test_the_targets_command_prints_one_urn_a_line_or_names_the_choices():
    from components.tools import targets

    printed = subprocess.run(
        [sys.executable, "-m", "components", "targets", "--stack", "berlin", "template"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.splitlines() == targets.layer_targets("berlin", "template")
    assert printed.stdout.splitlines()[0] == "urn:pulumi:berlin::labs-k8s::labs-k8s:lab:Lab::labs-k8s"
    # The template layer is within the vSphere half; the vSphere half has no remote step.
    assert set(targets.LAYERS["template"]) < set(targets.LAYERS["vsphere"])
    assert not [t for t in targets.LAYERS["vsphere"] if "command:" in t or t.endswith("Lab$**")]
    wrong = subprocess.run(
        [sys.executable, "-m", "components", "targets", "--stack", "berlin", "k8s"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert "LAYER='k8s' is not a layer of this program; LAYER is one of: template, vsphere" in wrong.stderr


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


def test_the_first_up_of_a_new_self_managed_stack_does_not_crash_the_cli(sandbox):
    """The README's self-managed path (`pulumi login --local`, `pulumi stack init`, `make up`): the
    stack has no deployment, and asking the engine for its resources panics the real CLI
    (components/previous_state.py). `make up` gives it an initial deployment once; a bare
    `pulumi preview`/`pulumi up` on such a stack does not crash either."""
    phrase = {"PULUMI_CONFIG_PASSPHRASE": "correct horse"}
    ready_stack(sandbox, backend="local")
    bare = sandbox.run(f"pulumi preview --stack {STACK}\npulumi up --stack {STACK}\n", **phrase)
    assert bare.returncode == 0, bare.stderr
    assert "panic" not in bare.stderr

    sandbox.run(
        f"cp Pulumi.{STACK}.yaml Pulumi.second.yaml\nsed -i '/encryptionsalt/d' Pulumi.second.yaml\n"
        "pulumi stack init second\n",
        **phrase,
    )
    first = sandbox.make("up", "STACK=second", **phrase)
    assert first.returncode == 0, first.stderr
    assert "make up: gave stack 'second' its initial deployment" in first.stdout
    imports = [c for c in sandbox.calls() if c[:2] == ["stack", "import"]]
    assert len(imports) == 1 and sandbox.calls()[-1] == ["up", "--stack", "second"]
    again = sandbox.make("up", "STACK=second", **phrase)
    assert again.returncode == 0, again.stderr
    assert len([c for c in sandbox.calls() if c[:2] == ["stack", "import"]]) == 1  # idempotent
    # A destroy leaves an empty deployment: the next `make up` gives it the initial one again.
    assert sandbox.make("destroy", "STACK=second", **phrase).returncode == 0
    assert sandbox.make("up", "STACK=second", **phrase).returncode == 0
    assert len([c for c in sandbox.calls() if c[:2] == ["stack", "import"]]) == 2


def test_pulumi_cloud_stacks_get_no_initial_deployment(sandbox):
    ready_stack(sandbox)
    assert sandbox.make("up", f"STACK={STACK}").returncode == 0
    assert "stack export" not in sandbox.commands() and "stack import" not in sandbox.commands()


def test_a_private_key_with_a_passphrase_stops_up_before_anything_is_built(sandbox):
    private, public = keypair(sandbox.home, "locked", passphrase="s3cret-phrase")
    ready_stack(sandbox, private=private, public=public)
    result = sandbox.make("up", f"STACK={STACK}")
    assert result.returncode != 0
    assert "labs-k8s:sshPrivateKey: the private key is protected by a passphrase" in result.stderr
    # The real reason (pulumi-command has privateKeyPassword and agents), not "cannot type it".
    assert "cannot type" not in result.stderr
    assert "passes no privateKeyPassword to pulumi-command" in result.stderr
    assert "ssh-keygen -t ed25519 -N ''" in result.stderr
    assert "nothing was created" in result.stderr


def test_a_private_key_that_is_not_the_public_keys_pair_stops_up(sandbox):
    private, _ = keypair(sandbox.home, "one")
    _, public = keypair(sandbox.home, "two")
    ready_stack(sandbox, private=private, public=public)
    result = sandbox.make("up", f"STACK={STACK}")
    assert result.returncode != 0
    assert "does not belong to labs-k8s:ssh.publicKey" in result.stderr
    fingerprint = subprocess.run(
        ["ssh-keygen", "-lf", str(public)], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    assert f"ssh.publicKey is {fingerprint}" in result.stderr


def test_a_junk_allow_unverified_ssl_stops_up_before_the_cli_runs_up(sandbox):
    ready_stack(
        sandbox, edit=f'sed -i \'s/allowUnverifiedSsl: "false"/allowUnverifiedSsl: "ture"/\' Pulumi.{STACK}.yaml'
    )
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


def test_a_mistyped_vsphere_key_stops_up_with_did_you_mean(sandbox):
    """`vsphere:usr` was ignored: only the missing vsphere:user was reported (issue 33)."""
    ready_stack(sandbox)
    sandbox.run(f"pulumi config set --stack {STACK} vsphere:usr someone@vsphere.local\n")
    result = sandbox.make("up", f"STACK={STACK}")
    assert result.returncode != 0
    assert "vsphere:usr: unknown key" in result.stderr and "Did you mean vsphere:user?" in result.stderr
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
    return subprocess.run(
        [sys.executable, "-m", "components", "render", "--stack", stack, "--out", str(out)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


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
    result = subprocess.run(
        [sys.executable, "-S", "-m", "components", *command.split()],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
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
    workflow = {
        "VSPHERE_SERVER": "vcenter.ci.example",
        "VSPHERE_USER": "preview@vsphere.local",
        "VSPHERE_PASSWORD": "from-secrets",
    }
    settings = vsphere_settings(lambda key: example.get(key), workflow)
    assert (settings["vsphereServer"], settings["user"], settings["password"]) == (
        "vcenter.ci.example",
        "preview@vsphere.local",
        "from-secrets",
    )
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


# --------------------------------------------------------------------------- which stack (issue 24)


@pytest.mark.parametrize("target", ["up", "preview", "destroy"])
def test_a_new_shell_without_stack_is_asked_which_stack(sandbox, target):
    """`STACK ?= labs` made a forgotten `export STACK` create a stack named after the example and
    write its encryptionsalt into the tracked Pulumi.labs.yaml: now there is no default."""
    example = sandbox.stack_file("labs").read_bytes()
    sandbox.run(f"pulumi login --local\ncp Pulumi.labs.yaml Pulumi.{STACK}.yaml\n")
    result = sandbox.make(target, PULUMI_CONFIG_PASSPHRASE="correct horse")
    assert result.returncode != 0
    assert f"make {target}: which stack? STACK is not set" in result.stderr
    assert "export STACK=<your site's stack>" in result.stderr
    assert f"Stack files in this checkout: {STACK}" in result.stderr
    assert sandbox.commands() == ["login"]  # not even whoami: nothing was asked of the backend
    assert sandbox.stack_file("labs").read_bytes() == example


@pytest.mark.parametrize("backend", ["local", "cloud"])
def test_the_example_stack_is_never_created_so_its_file_stays_clean(sandbox, backend):
    example = sandbox.stack_file("labs").read_bytes()
    sandbox.run("pulumi login --local\n" if backend == "local" else "pulumi login\n", PULUMI_ACCESS_TOKEN="pul-fake")
    result = sandbox.make("up", "STACK=labs", PULUMI_CONFIG_PASSPHRASE="correct horse", PULUMI_ACCESS_TOKEN="pul-fake")
    assert result.returncode != 0
    assert "stack 'labs' is the example every site's stack file starts from" in result.stderr
    assert 'cp Pulumi.labs.yaml "Pulumi.$STACK.yaml"' in result.stderr
    assert "stack init" not in sandbox.commands()
    assert sandbox.stack_file("labs").read_bytes() == example
    assert "encryptionsalt" not in yaml.safe_load(sandbox.stack_file("labs").read_text())


def test_a_mistyped_stack_is_asked_did_you_mean(sandbox):
    ready_stack(sandbox)
    result = sandbox.make("up", "STACK=mysiet")
    assert result.returncode != 0
    assert result.stderr.startswith(f"make up: did you mean '{STACK}' (STACK={STACK})? If not: no stack file"), (
        result.stderr
    )
    assert sandbox.commands().count("stack init") == 1  # ready_stack's own only
    destroyed = sandbox.make("destroy", "STACK=mysiet")
    assert destroyed.returncode != 0
    assert f"did you mean '{STACK}' (STACK={STACK})?" in destroyed.stderr
    # No near match: no guess.
    far = sandbox.make("up", "STACK=berlin")
    assert "did you mean" not in far.stderr and "no stack file Pulumi.berlin.yaml" in far.stderr


@pytest.mark.parametrize(
    ("key", "value", "fix"),
    [
        ("labs-k8s:sshPrivateKey", None, "--secret labs-k8s:sshPrivateKey < ~/.ssh/labs-k8s"),
        ("vsphere:password", "hunter2", "--secret vsphere:password"),
    ],
)
def test_a_secret_set_in_clear_is_refused_with_the_secret_line(sandbox, key, value, fix):
    """Pulumi only guards key names that look secret (password, token, ...); a private key named
    sshPrivateKey set without --secret sat in the stack file in clear, and the lab built."""
    private, public = keypair(sandbox.home)
    ready_stack(sandbox, private=private, public=public)
    source = f"< {private}" if value is None else f"<<< {value}"
    plain = sandbox.run(f"pulumi config set --stack {STACK} {key} {source}\n")
    assert plain.returncode == 0, plain.stderr
    assert "secure" not in str(yaml.safe_load(sandbox.stack_file(STACK).read_text())["config"][key])

    result = sandbox.make("up", f"STACK={STACK}")
    assert result.returncode != 0
    assert f"{key} is set in clear in Pulumi.{STACK}.yaml" in result.stderr
    assert f"pulumi config set --stack {STACK} {fix}" in result.stderr
    assert "up" not in sandbox.commands()
    secret = private.read_text().splitlines()[1] if value is None else value
    assert secret not in result.stdout + result.stderr

    # The printed line replaces the clear value; then the run goes on.
    fixed = sandbox.run(f"pulumi config set --stack {STACK} --secret {key} {source}\n")
    assert fixed.returncode == 0, fixed.stderr
    assert sandbox.make("up", f"STACK={STACK}").returncode == 0


def test_make_help_lists_every_target_a_user_runs():
    makefile = (REPO_ROOT / "Makefile").read_text()
    phony = set(re.search(r"^\.PHONY: (.*)$", makefile, flags=re.M).group(1).split())
    # Prerequisites of the listed ones:
    internal = {"help", "venv-dev", "system-deps", "vcsim", "toolchain", "kube", "stack-named"}
    shown = subprocess.run(["make", "-s", "help"], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    listed = set(re.findall(r"^make ([a-z-]+)", shown, flags=re.M))
    assert listed == phony - internal
    assert "pulumi preview --stack $STACK --diff" in shown
    assert "two commands a new machine needs" not in makefile


# --------------------------------------------------------------------------- the Python (issue 24)


def fake_python(path: Path, version: str) -> Path:
    """A stand-in interpreter reporting `version`. Its `-m venv DIR` makes DIR/bin/python (itself)
    and a DIR/bin/pip that, as the real one does for a wheel whose Requires-Python the interpreter
    does not meet (pip/_internal/resolution/resolvelib/factory.py, _report_single_requires_python),
    fails for a Python older than 3.11; it logs its argv otherwise."""
    path.write_text(f"""#!/bin/bash
case "$1" in
  -c) echo {version} ;;
  -m) [ "$2" = venv ] || exit 1
      mkdir -p "$3/bin" && cp "$0" "$3/bin/python"
      cat > "$3/bin/pip" <<'PIP'
#!/bin/bash
if [ "$(printf '%s\\n' 3.11 {version} | sort -V | head -n 1)" != 3.11 ]; then
  echo "ERROR: Package 'rpds-py' requires a different Python: {version}.12 not in '>=3.11'" >&2; exit 1
fi
echo "$@" >> "$(dirname "$0")/pip.log"
PIP
      chmod +x "$3/bin/pip" ;;
  *) exit 1 ;;
esac
""")
    path.chmod(0o755)
    return path


def fresh_checkout(tmp_path: Path) -> Sandbox:
    box = Sandbox(tmp_path)
    (box.repo / ".venv").unlink()  # a fresh clone: no virtualenv yet
    return box


def test_python_310_is_named_before_a_virtualenv_is_made(tmp_path):
    box = fresh_checkout(tmp_path)
    fake_python(box.bin / "python3", "3.10")
    result = box.make("venv")
    assert result.returncode != 0
    assert "python3 is Python 3.10; this project's pinned packages need Python 3.11 or newer" in result.stderr
    for way in (
        "Ubuntu 22.04:  sudo apt-get install -y python3.11 python3.11-venv",
        "make up PYTHON=python3.11",
        "macOS:         brew install python@3.12",
        "Debian 12:",
    ):
        assert way in result.stderr
    assert "requires a different Python" not in result.stderr
    assert not (box.repo / ".venv").exists()


def test_a_virtualenv_made_by_python_310_is_made_again(tmp_path):
    box = fresh_checkout(tmp_path)
    fake_python(box.bin / "python3", "3.10")
    fake_python(box.bin / "python3.11", "3.11")
    # What today's Makefile left behind on Ubuntu 22.04: a .venv by 3.10, whose pip failed.
    subprocess.run([str(box.bin / "python3"), "-m", "venv", str(box.repo / ".venv")], check=True)

    result = box.make("venv", "PYTHON=python3.11")
    assert result.returncode == 0, result.stderr
    assert ".venv was made by Python 3.10; this project needs 3.11 or newer: removing it" in result.stderr
    venv_python = subprocess.run(
        [str(box.repo / ".venv" / "bin" / "python"), "-c", "v"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert venv_python == "3.11"
    assert "--require-hashes -r requirements.txt" in (box.repo / ".venv" / "bin" / "pip.log").read_text()
    assert (box.repo / ".venv" / ".runtime").is_file()
    # Made once: the next run keeps it.
    again = box.make("venv", "PYTHON=python3.11")
    assert again.returncode == 0 and "removing" not in again.stderr


def test_the_existing_example_stack_is_told_its_secrets_would_land_in_the_committed_file(sandbox):
    """The pull-request workflow's `labs` stack exists in its backend; `make preview STACK=labs` on a
    workstation then asks for secrets, which `config set` would write into the tracked example."""
    sandbox.run("pulumi login\n", PULUMI_ACCESS_TOKEN="pul-fake")
    created = sandbox.run("pulumi stack init labs\n", PULUMI_ACCESS_TOKEN="pul-fake")
    assert created.returncode == 0, created.stderr
    result = sandbox.make("preview", "STACK=labs", PULUMI_ACCESS_TOKEN="pul-fake")
    assert result.returncode != 0
    assert "pulumi config set --stack labs --secret labs-k8s:sshPrivateKey" in result.stderr
    assert "These write into the committed example Pulumi.labs.yaml" in result.stderr
    assert "preview" not in sandbox.commands()
