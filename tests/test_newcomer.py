"""A newcomer's third pass (issue 33): the small things a first user trips over."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from components.remote import NO_OP_CREATE
from components.tools.offline import REPO_ROOT


def _components(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "components", *args],
        cwd=REPO_ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_render_and_diff_take_an_exported_stack_as_the_makefile_does(tmp_path: Path) -> None:
    """They rendered the example `labs` whatever STACK said (issue 33)."""
    render = _components("render", "--out", str(tmp_path / "out"), STACK="nosuchsite")
    assert render.returncode != 0 and "Pulumi.nosuchsite.yaml" in render.stderr, render.stderr
    for command in ("render", "diff"):
        helped = _components(command, "--help")
        assert "default: $STACK, else labs" in " ".join(helped.stdout.split()), helped.stdout


# --------------------------------------------------------------------------- the README's status (issue 33)


def _readme() -> str:
    return (REPO_ROOT / "README.md").read_text()


def _status_items(label: str) -> list[str]:
    """The `;`-separated items of the status line that starts with **label**, after its link."""
    line = next(line for line in _readme().splitlines() if line.startswith(f"**{label}"))
    listed = line.split("): ", 1)[1].rstrip(".")
    return [item.strip() for item in listed.split(";")]


def test_the_status_comes_right_under_the_title():
    lines = _readme().splitlines()
    assert lines[0] == "# labs-k8s" and lines[1] == ""
    assert lines[2].startswith("**Status.** Proven without a vCenter")
    assert lines[3].startswith("**Not yet run against a real vCenter**")


def test_every_proof_in_the_status_is_a_row_of_testings_table_and_back():
    """The README read as proven on vCenter while the runbook said otherwise. Its status line now
    names exactly the proofs of docs/testing.md's status table, each with tests that exist."""
    section = (REPO_ROOT / "docs" / "testing.md").read_text().split("## Status", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:3] for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    table = {proof.strip(): tests for proof, tests in rows[1:]}  # past the header
    assert _status_items("Status.") == list(table)
    for proof, tests in table.items():
        named = re.findall(r"`(tests/[\w/]+\.py)`", tests)
        assert named, f"{proof}: names no test"
        assert all((REPO_ROOT / path).is_file() for path in named), f"{proof}: {named}"


def test_every_not_yet_claim_is_the_runbooks_list_and_back():
    section = (REPO_ROOT / "docs" / "runbook.md").read_text().split("### Not yet run against a real vCenter", 1)[1]
    listed = re.findall(r"^- \*\*([^*]+)\*\*:", section.split("\n## ", 1)[0], flags=re.M)
    assert listed and _status_items("Not yet run against a real vCenter") == listed
    # The first lab's hour is named an estimate, as the runbook's table says.
    first_lab = _readme().split("## Your first lab", 1)[1].split("\n**1.", 1)[0]
    assert "about an hour" in first_lab and "an estimate" in first_lab


def test_the_readme_is_short_and_keeps_engine_internals_in_docs():
    """279 lines with engine internals; a newcomer needs about 150 (issue 33), plus the lab in a box's
    few lines (issue 31) and what it makes real, costs and offers (issue 51, about ten more)."""
    readme = _readme()
    assert len(readme.splitlines()) <= 205
    for internal in ("GetPackageConfig", "pulumi:providers:pulumi-python", "```mermaid", "## Layout"):
        assert internal not in readme, internal
    runbook = (REPO_ROOT / "docs" / "runbook.md").read_text()
    assert "GetPackageConfig" in runbook
    # What moved out of the README is in the page it links to, under the heading the link names.
    moved = {
        ("docs/runbook.md#what-you-see-during-the-first-up", "### What you see during the first `up`"): (
            "Diagnostics at the end",
            "it powers itself off when done",
            "A failed install keeps the builder VM, powered off",
        ),
        ("docs/runbook.md#the-node-networks-subnet", "#### The node network's subnet"): (
            "30-45 minutes in",
            "ip -4 addr",
        ),
        ("docs/testing.md#what-make-test-does-to-the-machine", "## What `make test` does to the machine"): (
            "scripts/install-test-deps.sh",
            "shellcheck, debootstrap",
            "/etc/cloud/cloud-init.disabled",
            "(without root those tests skip)",
        ),
    }
    for (link, heading), facts in moved.items():
        assert f"]({link})" in readme, link
        page = (REPO_ROOT / link.split("#", 1)[0]).read_text()
        section = " ".join(page.split(f"\n{heading}\n", 1)[1].split("\n#", 1)[0].split())
        for fact in facts:
            assert fact in section, (link, fact)


def test_the_readme_says_make_test_is_the_suites_with_what_it_costs():
    setup = _readme().split("## Set up", 1)[1].split("\n## ", 1)[0]
    text = " ".join(setup.split())
    for fact in ("contributors and CI", "30 minutes", "root", "GB of disk", "haproxy, keepalived, cloud-init"):
        assert fact in text, fact
    assert "disables cloud-init at boot" in text
    # DRS is optional where preflight.drsDisabled: warn exists; make names no Python on success.
    prerequisites = " ".join(_readme().split("## Prerequisites", 1)[1].split("\n## ", 1)[0].split())
    assert "labs-k8s:preflight.drsDisabled: warn" in prerequisites
    assert "names the version it finds" not in _readme()


# --------------------------------------------------------------------------- python -m components logs (issue 33)

FAKE_PULUMI = """#!/bin/sh
case "$*" in
  "stack output --json --show-secrets --stack labs") printf '%s\\n' "$FAKE_OUTPUTS" ;;
  "config get --stack labs labs-k8s:sshPrivateKey")
    printf -- '-----BEGIN OPENSSH PRIVATE KEY-----\\nAAAA\\n-----END OPENSSH PRIVATE KEY-----\\n' ;;
  *) echo "unexpected: $*" >&2; exit 1 ;;
esac
"""
# Records what it was given, as ssh would see it; prints the remote script's head for the test.
FAKE_SSH = """#!/bin/sh
log="$FAKE_LOG"
printf '%s\\n' "$@" > "$log.argv"
for a in "$@"; do case "$a" in UserKnownHostsFile=*) cp "${a#UserKnownHostsFile=}" "$log.known_hosts" ;; esac; done
key=$(printf '%s\\n' "$@" | sed -n '/^-i$/{n;p;}'); stat -c %a "$key" > "$log.keymode"
cat > "$log.stdin"
echo "kubeadm-init.log from the node"
"""


def _logs(tmp_path: Path, outputs: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    import json

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("pulumi", FAKE_PULUMI), ("ssh", FAKE_SSH)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "ssh"
    done = _components(
        "logs",
        "--stack",
        "labs",
        *args,
        PATH=f"{bin_dir}:/usr/bin:/bin",
        FAKE_OUTPUTS=json.dumps(outputs),
        FAKE_LOG=str(log),
    )
    return done, log


def test_logs_collects_a_steps_logs_over_the_pinned_connection(tmp_path: Path) -> None:
    """No command collected a failed step's logs from its node (issue 33)."""
    pinned = "10.3.60.51 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPinnedHostKeyOfM01xxxxxxxxxxxxxxxxxxxxxx"
    done, log = _logs(tmp_path, {"sshKnownHosts": pinned}, "labs-k8s-m01", "labs-k8s-m01-kubeadm-init")
    assert done.returncode == 0, done.stderr
    assert "kubeadm-init.log from the node" in done.stdout
    argv = log.with_suffix(".argv").read_text().splitlines()
    assert argv[-1] == "sudo -n bash -s" and argv[-2].endswith("@10.3.60.51")
    assert "StrictHostKeyChecking=yes" in argv and "BatchMode=yes" in argv and "IdentitiesOnly=yes" in argv
    assert log.with_suffix(".known_hosts").read_text().strip() == pinned
    assert log.with_suffix(".keymode").read_text().strip() == "600"
    assert "PRIVATE KEY" not in " ".join(argv)  # the key is a file, never an argument
    script = log.with_suffix(".stdin").read_text()
    assert "/var/lib/labs-k8s/steps/labs-k8s-m01-kubeadm-init" in script and "[secret]" in script


def test_logs_refuses_a_host_no_key_was_pinned_for(tmp_path: Path) -> None:
    done, log = _logs(tmp_path, {"apiEndpoint": "https://10.3.60.100:6443"}, "labs-k8s-m01")
    assert done.returncode == 2
    assert "no sshKnownHosts output" in done.stderr and "refusing to connect" in done.stderr
    assert not log.with_suffix(".argv").exists(), "ssh was started"
    unknown, _ = _logs(tmp_path, {"sshKnownHosts": "x"}, "labs-k8s-m09")
    assert unknown.returncode == 2 and "no node 'labs-k8s-m09'" in unknown.stderr


def test_logs_takes_only_a_step_of_the_stack_that_ran_on_that_node(tmp_path: Path) -> None:
    """STEP went into the node's root shell unquoted (issue 50): it must name one of the stack's
    steps that runs on NODE (its own, or through the VIP on a control plane), or nothing is started."""
    pinned = "10.3.60.54 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPinnedHostKeyOfM01xxxxxxxxxxxxxxxxxxxxxx"
    for step in ("x'; touch /tmp/owned; '", "labs-k8s-m01-kubeadm-init", "flannel"):
        done, log = _logs(tmp_path, {"sshKnownHosts": pinned}, "labs-k8s-w01", step)
        assert done.returncode == 2, (step, done.stdout, done.stderr)
        assert "labs-k8s-w01-kubeadm-join" in done.stderr, done.stderr  # the steps it could name
        assert not log.with_suffix(".argv").exists(), "ssh was started"
    done, log = _logs(tmp_path, {"sshKnownHosts": pinned}, "labs-k8s-w01", "labs-k8s-w01-kubeadm-join")
    assert done.returncode == 0, done.stderr
    assert "/var/lib/labs-k8s/steps/labs-k8s-w01-kubeadm-join ]" in log.with_suffix(".stdin").read_text()


def test_the_logs_hint_quotes_the_hostname_it_pastes(tmp_path: Path) -> None:
    """Through the VIP the hint names the node by its `hostname` at run time: a node that calls itself
    something a shell would run must come out as one quoted word of the command to paste (issue 50)."""
    import shlex

    from components.remote import NODE_AT_RUN_TIME, logs_hint

    evil = "m02; touch /tmp/owned"
    hint = logs_hint("flannel", NODE_AT_RUN_TIME, "labs")
    script = f'hostname() {{ printf "%s\\n" {shlex.quote(evil)}; }}; rc=3; {hint}'
    printed = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stderr
    command = printed.split(": ", 2)[2]
    assert shlex.split(command) == ["python", "-m", "components", "logs", "--stack", "labs", evil, "flannel"], printed


# --------------------------------------------------------------------------- a failed step names its logs (issue 33)

COMMAND = "command:remote:Command"
NODE_ADDRESSES = {
    "10.3.60.50": "labs-k8s-lb01",
    "10.3.60.56": "labs-k8s-lb02",
    "10.3.60.51": "labs-k8s-m01",
    "10.3.60.52": "labs-k8s-m02",
    "10.3.60.53": "labs-k8s-m03",
    "10.3.60.54": "labs-k8s-w01",
    "10.3.60.55": "labs-k8s-w02",
}
VIP = "10.3.60.100"


def _hint(node: str, step: str, stack: str = "labs") -> str:
    return f"python -m components logs --stack {stack} {node} {step}"


def _run_as_sshd_does(
    command: str, step: str, script: str, tmp_path: Path, hostname: str
) -> subprocess.CompletedProcess[str]:
    """Run a registered remote command as the node's sshd does (the login shell, bash, with
    `-c`), its bundle on stdin, in a UTS namespace whose hostname is `hostname`: the node it
    landed on. The bundle writes into tmp_path instead of the node's step root."""
    from components.rendering import STEP_ROOT, step_bundle
    from tests.requirements import require_root, require_tool

    require_root()
    require_tool("sudo", "timeout", "unshare", "hostname")
    bundle = step_bundle(step, {"run.sh": script}, "run.sh").replace(STEP_ROOT, str(tmp_path))
    return subprocess.run(
        ["unshare", "--uts", "bash", "-c", 'hostname "$1" && exec bash -c "$2"', "-", hostname, command],
        input=bundle,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_failed_step_prints_the_logs_command_for_its_node_and_a_step_that_succeeds_does_not(
    offline_run, tmp_path: Path
) -> None:
    """A failed step's error text (pulumi-command 1.2.1 remote/commandOutputs.go:101 holds the
    command's stdout and stderr) named no way to its logs. Registered commands run as they are: a
    step's create on its node; through the VIP a create (flannel) and a leave guard's delete with its
    arguments, each naming the control plane it landed on (its hostname)."""
    cases = [
        ("labs-k8s-w01-kubeadm-join", "create", "labs-k8s-w01"),
        ("flannel", "create", "labs-k8s-m02"),
        ("labs-k8s-w01-leave-cluster", "delete", "labs-k8s-m03"),
    ]
    for name, kind, landed_on in cases:
        reg = offline_run.by_name(name)
        command = reg.plain_inputs[kind]
        failed = _run_as_sshd_does(command, name, "echo kubeadm said no >&2\nexit 3\n", tmp_path, landed_on)
        assert failed.returncode == 3, failed.stderr
        assert "kubeadm said no" in failed.stderr
        assert _hint(landed_on, name) in failed.stderr, (name, kind, failed.stderr)
        assert f"labs-k8s[{name}]: failed (exit 3)" in failed.stderr
        done = _run_as_sshd_does(command, name, "echo fine\n", tmp_path, landed_on)
        assert done.returncode == 0 and "fine" in done.stdout, done.stderr
        assert "python -m components logs" not in done.stderr + done.stdout, (name, kind, done.stderr)


def test_every_steps_create_and_delete_name_the_logs_command_for_its_node(offline_run) -> None:
    """Every command a step runs on a node (create, delete) prints the logs command when it fails:
    its own node by name, or through the VIP the control plane's hostname at run time; the stack is
    the stack's real name, so the line is a command to paste."""
    checked: dict[str, int] = {"create": 0, "delete": 0}
    for reg in offline_run.of_type(COMMAND):
        host = reg.plain_inputs["connection"]["host"]
        node = '"$(hostname)"' if host == VIP else NODE_ADDRESSES[host]
        for kind in ("create", "delete"):
            command = reg.plain_inputs.get(kind)
            if not command or command == NO_OP_CREATE:  # a guard's create runs nothing on the node
                continue
            printed = (
                "if [ $rc -ne 0 ]; then printf 'labs-k8s[%s]: failed (exit %s); its logs on %q: "
                f'python -m components logs --stack %q %q %q\\n\' {reg.name} "$rc" {node} labs {node} {reg.name} >&2; '
                "fi; exit $rc"
            )
            assert command.endswith(printed), (reg.name, kind, command)
            checked[kind] += 1
    assert checked["create"] > 30 and checked["delete"] == 6, checked  # 5 nodes leave the cluster; the teardown guard


# ------------------------------------------------------------------- the README's command table, as written (issue 33)

# The table's rows that another test runs as written, and where: (test file, what it runs there).
RUN_ELSEWHERE = {
    "make preview": ("tests/test_real_engine.py", 'make("preview"'),
    "make destroy": ("tests/test_real_engine.py", 'make("destroy"'),
    'python -m components logs --stack "$STACK" NODE [STEP]': (
        "tests/test_newcomer.py",
        "def test_logs_collects_a_steps_logs_over_the_pinned_connection",
    ),
}
# Benchmarks print figures and are not tests (the brief: bench/ is not a timed test); `make bench`
# needs root and minutes of the real engine. That its target exists is test_docs' job.
NOT_RUN = {"make bench"}


def _command_table() -> list[str]:
    table = _readme().split("| command | what it does |", 1)[1].split("\n\n", 1)[0]
    return [row.split("`", 2)[1].replace("\\|", "|") for row in table.splitlines()[2:] if row.startswith("| `")]


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True, capture_output=True
    )


def test_the_readme_command_table_runs_as_written(tmp_path: Path) -> None:
    """Every row of the README's command table runs as the README writes it: the offline ones
    here, in a clone with an `origin` and a site's (gitignored) stack, after `. .venv/bin/activate`
    and `export STACK` as the README says; the others where the named test runs them."""
    from tests.sandbox import Sandbox

    commands = _command_table()
    offline = [c for c in commands if c not in RUN_ELSEWHERE and c not in NOT_RUN]
    assert {c.split(" --", 1)[0] for c in offline} == {
        "make render",
        "python -m components diff",
        "python -m components drill <control-plane|balancer|worker|drain>",
    }, "a new row in the README's command table: run it here, or name the test that does"
    for command, (test_file, run) in RUN_ELSEWHERE.items():
        assert command in commands, command
        assert run in (REPO_ROOT / test_file).read_text(), (command, test_file)

    box = Sandbox(tmp_path, with_cli=False)
    _git(box.repo, "init", "-q", "-b", "main")
    _git(box.repo, "add", "-A")
    _git(box.repo, "commit", "-q", "-m", "the checkout")
    _git(tmp_path, "clone", "-q", "--bare", str(box.repo), "origin.git")
    _git(box.repo, "remote", "add", "origin", str(tmp_path / "origin.git"))
    _git(box.repo, "fetch", "-q", "origin")
    (box.repo / "Pulumi.mysite.yaml").write_text((box.repo / "Pulumi.labs.yaml").read_text())
    lines = []
    for command in offline:
        if "<control-plane|balancer|worker|drain>" in command:
            # The placeholder's choices, each; [--dry-run] taken: a live drill powers VMs off.
            for scenario in ("control-plane", "balancer", "worker", "drain"):
                lines.append(
                    command.replace("<control-plane|balancer|worker|drain>", scenario).replace(
                        "[--dry-run]", "--dry-run"
                    )
                )
        else:
            lines.append(command)
    for line in lines:
        done = box.run(f". .venv/bin/activate\nexport STACK=mysite\n{line}\n", timeout=240)
        assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        if line == "make render":
            assert (box.repo / "render" / "plan.json").is_file() and "--stack mysite" in done.stdout
        elif " diff " in line:
            assert "stack mysite: origin/main" in done.stdout and "no change to any resource" in done.stdout
        else:
            assert "dry run" in (done.stdout + done.stderr).lower() or "nodes: labs-k8s-lb01" in done.stdout, line
