"""`python -m components diff`: two commits of a copy of this project in a temporary git repository,
rendered offline by their own code, compared host by host and resource by resource.

Each scenario commits one change on top of the same base commit and runs the real command (a
subprocess, in that repository, with no route to the network) against the base.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from components.tools.artifacts import PLACEHOLDERS, SECRET_PLACEHOLDERS
from components.tools.changes import CHANGE_CASES, case_runs, plan_changes
from components.tools.offline import REPO_ROOT, run_document, run_from_document
from components.tools.pr_comment import build_comment
from components.tools.render_diff import pin_mismatches, redact, side_python

# Ciphertexts as `pulumi config set --secret` writes them (passphrase provider: v1:<nonce>:<box>).
# Nobody can decrypt these; the diff must name the rotation without printing either.
OLD_PASSWORD_CIPHERTEXT = "v1:Q2lwaGVyT2xkMDAw:T2xkUGFzc3dvcmRDaXBoZXJ0ZXh0QUFBQUFBQUFBQQ=="
NEW_PASSWORD_CIPHERTEXT = "v1:Q2lwaGVyTmV3MTEx:TmV3UGFzc3dvcmRDaXBoZXJ0ZXh0QkJCQkJCQkJCQg=="
KEY_CIPHERTEXT = "v1:S2V5Tm9uY2UyMjI=:U3NoS2V5Q2lwaGVydGV4dENDQ0NDQ0NDQ0NDQ0NDQ0NDQw=="
NEW_KEY_CIPHERTEXT = "v1:S2V5Tm9uY2UzMzM=:TmV3U3NoS2V5Q2lwaGVydGV4dERERERERERERERERERERA=="
NEW_WORKER = "labs-k8s-w03"


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    report: dict[str, Any]

    def files(self) -> set[tuple[str, str, str]]:
        return {(f["host"], f["path"], f["status"]) for f in self.report["files"]}

    def resources(self, action: str | None = None) -> dict[str, dict[str, Any]]:
        return {r["name"]: r for r in self.report["resources"] if action in (None, r["action"])}

    def file_diff(self, host: str, path: str) -> str:
        matches = [f["diff"] for f in self.report["files"] if (f["host"], f["path"]) == (host, path)]
        assert len(matches) == 1, f"{host}/{path}: {len(matches)} diffs"
        return matches[0]

    def assert_no_secret_in_clear(self) -> None:
        text = self.stdout + self.stderr + json.dumps(self.report)
        for leaked in (
            OLD_PASSWORD_CIPHERTEXT,
            NEW_PASSWORD_CIPHERTEXT,
            KEY_CIPHERTEXT,
            NEW_KEY_CIPHERTEXT,
            "PRIVATE KEY-----",
            "[placeholder",
            "[secret:",
        ):
            assert leaked not in text
        for what, value in SECRET_PLACEHOLDERS.items():
            # As a value of its own: the certificate key's zeros also occur in the public CA hash.
            assert not re.search(rf"(?<![\w:]){re.escape(value)}(?!\w)", text), f"the {what} is shown"


class ProjectRepo:
    """A git repository holding a copy of this project, base commit first."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def git(self, *args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(self.root), *args], capture_output=True, text=True, check=True, env=_git_env()
        ).stdout

    def edit(self, relative: str, change: Callable[[str], str]) -> None:
        path = self.root / relative
        before = path.read_text()
        after = change(before)
        assert after != before, f"the edit of {relative} changed nothing: fix the test"
        path.write_text(after)

    def commit(self, message: str) -> str:
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)
        return self.git("rev-parse", "HEAD").strip()

    def diff(self, against: str, *extra: str, stack: str = "labs", env_extra: dict[str, str] | None = None) -> Outcome:
        report = self.root.parent / "report.json"
        report.unlink(missing_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PULUMI_", "VSPHERE_"))}
        # No route to the network: nothing in diff or render may reach for it.
        env.update(http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9", no_proxy="", **_git_env())
        env.update(env_extra or {})
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "components",
                "diff",
                *(["--stack", stack] if stack else []),
                "--against",
                against,
                "--json",
                str(report),
                *extra,
            ],
            cwd=self.root,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        return Outcome(
            proc.returncode, proc.stdout, proc.stderr, json.loads(report.read_text()) if report.exists() else {}
        )


def _git_env() -> dict[str, str]:
    return {
        **os.environ,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "test",
        "GIT_AUTHOR_EMAIL": "test@example.invalid",
        "GIT_COMMITTER_NAME": "test",
        "GIT_COMMITTER_EMAIL": "test@example.invalid",
    }


def _with_encrypted_secrets(stack_file: str, password_ciphertext: str) -> str:
    """The stack file as a site commits it: both secrets set, encrypted (README, "Prerequisites")."""
    return stack_file.replace(
        "\nconfig:\n",
        f"\nconfig:\n  vsphere:password:\n    secure: {password_ciphertext}\n"
        f"  labs-k8s:sshPrivateKey:\n    secure: {KEY_CIPHERTEXT}\n",
        1,
    )


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[ProjectRepo, str]:
    """A copy of this project's tracked (and new, unignored) files, committed once: the base."""
    root = tmp_path_factory.mktemp("diff") / "labs-k8s"
    listed = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for relative in filter(None, set(listed.split("\0"))):
        source = REPO_ROOT / relative
        if source.is_file():
            (root / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / relative)
    repo = ProjectRepo(root)
    repo.git("init", "-q", "-b", "main")
    repo.edit("Pulumi.labs.yaml", lambda text: _with_encrypted_secrets(text, OLD_PASSWORD_CIPHERTEXT))
    return repo, repo.commit("base")


def scenario(project: tuple[ProjectRepo, str], name: str, *changes: tuple[str, Callable[[str], str]]) -> Outcome:
    repo, base = project
    repo.git("checkout", "-q", "-B", name, base)
    repo.git("clean", "-q", "-fd")
    for relative, change in changes:
        repo.edit(relative, change)
    repo.commit(name)
    return repo.diff(base)


@pytest.fixture(scope="module")
def haproxy_timeout(project: tuple[ProjectRepo, str]) -> Outcome:
    return scenario(
        project,
        "haproxy-timeout",
        ("cloudinit/lb/haproxy.cfg.j2", lambda t: re.sub(r"timeout client-fin \d+s", "timeout client-fin 45s", t)),
    )


def test_a_haproxy_timeout_change_shows_on_both_balancers_and_nowhere_else(haproxy_timeout):
    outcome = haproxy_timeout
    assert outcome.returncode == 0, outcome.stderr
    assert outcome.files() == {
        ("labs-k8s-lb01", "steps/lb-setup/haproxy.cfg", "modified"),
        ("labs-k8s-lb02", "steps/lb-setup/haproxy.cfg", "modified"),
    }
    diff = outcome.file_diff("labs-k8s-lb01", "steps/lb-setup/haproxy.cfg")
    assert diff.startswith("--- a/labs-k8s-lb01/steps/lb-setup/haproxy.cfg\n+++ b/labs-k8s-lb01/steps/lb-setup/")
    changed = [line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert changed == ["-    timeout client-fin 30s", "+    timeout client-fin 45s"]
    # The printed report: the summary names both files, then the same diffs follow.
    assert "Files: 2 changed on 2 hosts" in outcome.stdout
    assert outcome.stdout.count("+    timeout client-fin 45s") == 2
    assert outcome.report["changed"] is True
    # Resources: only the two balancers' setup steps change by their own inputs; their bundle (stdin)
    # holds the VRRP password, so it is secret; its trigger is an HMAC keyed by a stack secret (#29), so
    # it is plain and shows no more than that the bundle changed. Whatever else changes only follows
    # from their replacement.
    lb_setup = {"labs-k8s-lb01-lb-setup", "labs-k8s-lb02-lb-setup"}
    changed = outcome.resources()
    assert {name for name, r in changed.items() if r["cause"] == "inputs"} == lb_setup
    for name in lb_setup:
        assert changed[name]["action"] == "replace"  # pulumi-command replaces a Command on new triggers
        assert changed[name]["inputs"][0] == "triggers" and "stdin" in changed[name]["inputs"]
        assert set(changed[name]["secret_inputs"]) == {"stdin"}
        assert re.search(rf"^\s+1\s+replace\s+{name}\s+triggers, stdin \[secret\]$", outcome.stdout, re.M)
    assert not outcome.resources("create") and not outcome.resources("delete")
    assert all(r["type"] == "command:remote:Command" for r in changed.values())
    outcome.assert_no_secret_in_clear()


def test_an_added_worker_adds_its_machine_and_its_leave_guard(project):
    def add_worker(text: str) -> str:
        return text.replace(
            "        - {name: labs-k8s-w02, ip: 10.3.60.55}\n",
            f"        - {{name: labs-k8s-w02, ip: 10.3.60.55}}\n        - {{name: {NEW_WORKER}, ip: 10.3.60.57}}\n",
        )

    outcome = scenario(project, "worker-added", ("Pulumi.labs.yaml", add_worker))
    assert outcome.returncode == 0, outcome.stderr
    files = outcome.files()
    added = {(host, path) for host, path, status in files if status == "added"}
    assert {
        (NEW_WORKER, "cloud-init/user-data.yaml"),
        (NEW_WORKER, "steps/kubeadm-join/kubeadm-join.yaml"),
        (NEW_WORKER, "steps/prepare/prepare-node.sh"),
        ("cluster-endpoint", f"steps/{NEW_WORKER}-leave-cluster/leave-cluster.sh"),
    } <= added
    # Every file of the new machine is new; no other machine loses a file.
    assert {status for host, _, status in files if host == NEW_WORKER} == {"added"}
    assert not [f for f in files if f[2] == "removed"]
    meta = outcome.file_diff(NEW_WORKER, "cloud-init/meta-data.yaml")
    assert meta.startswith(f"--- /dev/null\n+++ b/{NEW_WORKER}/cloud-init/meta-data.yaml\n")
    assert f"+local-hostname: {NEW_WORKER}" in meta
    assert "10.3.60.57/24" in "".join(
        outcome.file_diff(NEW_WORKER, path) for _, path, _ in [f for f in files if f[0] == NEW_WORKER]
    )
    # The join config carries the bootstrap token: it is shown as [secret], never as its value.
    join = outcome.file_diff(NEW_WORKER, "steps/kubeadm-join/kubeadm-join.yaml")
    assert '+    token: "[secret]"' in join
    # Resources: the machine and its steps are created, the workers' DRS rule takes it in.
    created = outcome.resources("create")
    assert {
        NEW_WORKER,
        f"{NEW_WORKER}-ready",
        f"{NEW_WORKER}-prepare",
        f"{NEW_WORKER}-kubeadm-join",
        f"{NEW_WORKER}-leave-cluster",
    } <= set(created)
    assert created[NEW_WORKER]["type"] == "vsphere:index/virtualMachine:VirtualMachine"
    assert all(name.startswith(NEW_WORKER) for name in created)
    rule = outcome.resources()["workers-anti-affinity"]  # how it changes is components.tools.changes' call
    assert rule["action"] in ("update", "replace") and rule["inputs"] == ["virtualMachineIds"]
    assert not outcome.resources("delete")
    outcome.assert_no_secret_in_clear()


def test_a_rotated_ssh_key_updates_every_remote_step_and_is_never_shown(project):
    outcome = scenario(
        project, "secret-rotated", ("Pulumi.labs.yaml", lambda t: t.replace(KEY_CIPHERTEXT, NEW_KEY_CIPHERTEXT))
    )
    assert outcome.returncode == 0, outcome.stderr
    # No machine is given a different file: the key is how the steps log in, not what they install.
    assert outcome.files() == set()
    assert "Files: no rendered file changes" in outcome.stdout
    # Every remote step logs in with it: each one is updated (not replaced) for its `connection`.
    changed = outcome.resources()
    assert len(changed) >= 29 and {r["type"] for r in changed.values()} == {"command:remote:Command"}
    for name, change in changed.items():
        assert (change["action"], change["inputs"], change["secret_inputs"]) == (
            "update",
            ["connection"],
            ["connection"],
        ), name
    assert f"{len(changed)} to update" in outcome.stdout
    assert "connection [secret]" in outcome.stdout
    outcome.assert_no_secret_in_clear()


def test_nothing_changed_prints_one_line_and_exits_0(project):
    repo, base = project
    committed = scenario(project, "docs-only", ("README.md", lambda t: t + "\nA line of documentation.\n"))
    # Uncommitted edits are part of the working tree; ignored files (render output) are not copied.
    repo.edit("docs/runbook.md", lambda t: t + "\nMore.\n")
    junk = repo.root / "render" / "hosts" / "labs-k8s-lb01" / "junk.cfg"
    junk.parent.mkdir(parents=True)
    junk.write_text("not part of any checkout\n")
    uncommitted = repo.diff(base)
    for outcome in (committed, uncommitted):
        assert outcome.returncode == 0, outcome.stderr
        assert outcome.report["changed"] is False
        assert outcome.report["files"] == [] and outcome.report["resources"] == []
        assert len(outcome.stdout.splitlines()) == 1
        assert outcome.stdout.rstrip().endswith("no change to any resource or rendered file")
    assert "with uncommitted changes" not in committed.stdout
    assert "with uncommitted changes" in uncommitted.stdout


def test_a_head_that_does_not_render_is_reported_with_exit_2(project):
    outcome = scenario(
        project, "bad-vip", ("Pulumi.labs.yaml", lambda t: t.replace("vip: 10.3.60.100", "vip: 10.3.60.51"))
    )
    assert outcome.returncode == 2
    assert "the head (working tree" in outcome.stderr and "does not render" in outcome.stderr
    assert "labs-k8s:loadBalancer.vip" in outcome.stderr
    assert "Traceback" not in outcome.stderr
    # The JSON report still says what went wrong: the pull-request comment shows it.
    assert "labs-k8s:loadBalancer.vip" in outcome.report["error"]
    assert outcome.stdout == ""


def test_a_site_stack_that_git_ignores_is_diffed_from_the_working_tree(project):
    """README's pull-request line, `diff --stack "$STACK" --against origin/main`, failed for every
    site: .gitignore ignores Pulumi.<site>.yaml, and only files git tracks were exported ("exists
    neither at ... nor in the working tree"). Both sides now render the working tree's copy."""
    repo, base = project
    repo.git("checkout", "-q", "-B", "site-stack", base)
    repo.git("clean", "-q", "-fd")
    site = repo.root / "Pulumi.mysite.yaml"
    site.write_text((repo.root / "Pulumi.labs.yaml").read_text().replace("datacenter: Datacenter", "datacenter: DC-B"))
    assert repo.git("check-ignore", site.name).strip() == site.name  # as in a user's checkout
    repo.edit("cloudinit/lb/haproxy.cfg.j2", lambda t: re.sub(r"timeout client-fin \d+s", "timeout client-fin 45s", t))
    repo.commit("haproxy timeout")
    try:
        by_flag = repo.diff(base, stack="mysite")
        by_env = repo.diff(base, stack="", env_extra={"STACK": "mysite"})  # an exported STACK, as make takes it
        given = repo.root.parent / "elsewhere.yaml"
        shutil.copy(site, given)
        site.unlink()
        by_path = repo.diff(base, "--stack-file", str(given), stack="mysite")
    finally:
        site.unlink(missing_ok=True)
    for outcome in (by_flag, by_env, by_path):
        assert outcome.returncode == 0, outcome.stderr
        assert outcome.report["stack"] == "mysite"
        assert outcome.files() == {
            ("labs-k8s-lb01", "steps/lb-setup/haproxy.cfg", "modified"),
            ("labs-k8s-lb02", "steps/lb-setup/haproxy.cfg", "modified"),
        }
        assert "which git does not track" in outcome.stdout.splitlines()[0]
    assert by_flag.report["stack_file"] == "Pulumi.mysite.yaml"
    assert by_path.report["stack_file"] == str(given)
    missing = repo.diff(base, "--stack-file", str(repo.root / "nope.yaml"), stack="mysite")
    assert missing.returncode == 2 and "--stack-file" in missing.stderr and "no such file" in missing.stderr


def test_an_unknown_ref_is_an_error_not_a_diff(project):
    repo, _ = project
    outcome = repo.diff("no-such-branch")
    assert outcome.returncode == 2
    assert "--against no-such-branch: no such commit" in outcome.stderr
    assert outcome.report == {}


def test_secret_placeholders_are_shown_as_secret_and_public_values_are_not(lab_config):
    from components.tools.artifacts import host_artifacts

    files = host_artifacts(lab_config)
    init = redact(files["labs-k8s-m01"]["steps/kubeadm-init/kubeadm-init.yaml"])
    assert '- token: "[secret]"' in init and 'certificateKey: "[secret]"' in init
    assert "auth_pass [secret]" in redact(files["labs-k8s-lb01"]["steps/lb-setup/keepalived.conf"])
    # The CA certificate hash is public (and contains the certificate key's zeros): left as it is.
    args = files["labs-k8s-m02"]["steps/kubeadm-join/ARGS"]
    assert PLACEHOLDERS["CA certificate hash"] in args and redact(args) == args


def test_a_side_uses_this_interpreter_only_when_its_pins_are_installed(tmp_path):
    pinned = (REPO_ROOT / "requirements.txt").read_text()
    assert pin_mismatches(pinned) == []
    (tmp_path / "requirements.txt").write_text(pinned)
    assert side_python(tmp_path, "base") == sys.executable
    other = re.sub(r"^pulumi==\S+", "pulumi==3.0.0", pinned, count=1, flags=re.MULTILINE)
    mismatches = pin_mismatches(other)
    assert len(mismatches) == 1 and mismatches[0].startswith("pulumi==3.0.0 (here: ")


EXAMPLE_BEGIN, EXAMPLE_END = "<!-- example-comment:begin -->\n", "<!-- example-comment:end -->\n"


def test_the_documented_example_comment_is_what_a_real_run_posts(haproxy_timeout):
    """docs/pull-requests.md shows the comment of the HAProxy scenario, commits made readable."""
    report = json.loads(json.dumps(haproxy_timeout.report))
    report["base"]["commit"], report["head"]["commit"] = "4b1c0de" + "0" * 33, "9f8e7d6" + "0" * 33
    comment = build_comment(report, "https://github.com/OWNER/labs-k8s/actions/runs/RUN_ID")
    doc = REPO_ROOT / "docs" / "pull-requests.md"
    text = doc.read_text()
    before, rest = text.split(EXAMPLE_BEGIN, 1)
    committed, after = rest.split(EXAMPLE_END, 1)
    if os.environ.get("LABS_K8S_WRITE_DOCS") == "1":
        doc.write_text(before + EXAMPLE_BEGIN + comment + EXAMPLE_END + after)
        committed = comment
    assert committed == comment, (
        "docs/pull-requests.md's example comment is stale: "
        "LABS_K8S_WRITE_DOCS=1 pytest tests/test_render_diff.py -k example"
    )


def test_run_documents_compare_secrets_without_holding_them():
    from components.tools.offline import PLACEHOLDER_PRIVATE_KEY, run_document, run_from_document, run_program

    # The SSH private key reaches every remote step's `connection` (the vCenter password reaches no
    # resource: the template's provider reads it from the stack config at each call).
    old, new = (
        PLACEHOLDER_PRIVATE_KEY.replace("sshPrivateKey", f"sshPrivateKey {tag}") for tag in ("OLD-KEY", "NEW-KEY")
    )
    key = b"k" * 32
    before = run_from_document(run_document(run_program("labs", overrides={"labs-k8s:sshPrivateKey": old}), key))
    after = run_from_document(run_document(run_program("labs", overrides={"labs-k8s:sshPrivateKey": new}), key))
    ready_before, ready_after = before.by_name("labs-k8s-w01-ready"), after.by_name("labs-k8s-w01-ready")
    assert ready_before.inputs["connection"] == ready_after.inputs["connection"] == "[secret]"
    assert ready_before.plain_inputs["connection"] != ready_after.plain_inputs["connection"]
    assert ready_before.plain_inputs["connection"].startswith("[secret:")
    # Everything that does not log in over SSH is equal, secrets included (same key, same values).
    for urn, registration in before.registrations.items():
        if "connection" not in registration.inputs:
            assert registration.plain_inputs == after.registrations[urn].plain_inputs, registration.name
            assert sorted(registration.dependencies) == sorted(after.registrations[urn].dependencies)
    # The options survive the trip; a fingerprint depends on the key and never holds the value.
    assert "triggers" in before.by_name("labs-k8s-w01-leave-cluster").replace_on_changes
    other_key = run_document(run_program("labs", overrides={"labs-k8s:sshPrivateKey": old}), b"x" * 32)
    assert "OLD-KEY" not in json.dumps(other_key)
    assert (
        run_from_document(other_key).by_name("labs-k8s-w01-ready").plain_inputs["connection"]
        != ready_before.plain_inputs["connection"]
    )


def test_an_encrypted_value_renders_as_a_placeholder_named_after_its_ciphertext():
    from components.tools.offline import PLACEHOLDER_PRIVATE_KEY, encrypted_placeholder

    old = encrypted_placeholder("vsphere:password", OLD_PASSWORD_CIPHERTEXT)
    assert old != encrypted_placeholder("vsphere:password", NEW_PASSWORD_CIPHERTEXT)
    assert old == encrypted_placeholder("vsphere:password", OLD_PASSWORD_CIPHERTEXT)
    assert OLD_PASSWORD_CIPHERTEXT.split(":")[1] not in old and old.startswith("[placeholder: encrypted")
    key = encrypted_placeholder("labs-k8s:sshPrivateKey", KEY_CIPHERTEXT)
    # Still shaped like a key block, so validation runs as with a real key.
    assert key.splitlines()[0] == PLACEHOLDER_PRIVATE_KEY.splitlines()[0]
    assert key.splitlines()[-1] == PLACEHOLDER_PRIVATE_KEY.splitlines()[-1]
    assert key != PLACEHOLDER_PRIVATE_KEY


@pytest.mark.parametrize("case", CHANGE_CASES, ids=lambda c: c.title)
def test_a_recorded_run_plans_as_the_live_run_does(case, offline_run):
    """The run document loses nothing components.tools.changes reads: each of the runbook's changes plans
    the same from two recorded runs (as `diff` has them) as from the live ones."""
    key = secrets.token_bytes(32)
    before, after = case_runs(case, "labs", offline_run)
    # A case run with `pulumi up --replace` names what it replaces, as case_plans does.
    forced = frozenset(name for _, name in case.replaced)
    live = plan_changes(before, after, forced)
    recorded = plan_changes(
        *(run_from_document(json.loads(json.dumps(run_document(run, key)))) for run in (before, after)), forced
    )
    assert recorded.effects == live.effects
    assert recorded.steps == live.steps
