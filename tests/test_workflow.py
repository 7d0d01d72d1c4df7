"""The pull-request workflow (.github/workflows/preview.yml): schema-valid, and saying what it must.

The lint is check-jsonschema's vendored GitHub workflow schema (offline). The schema only knows
shapes; the key facts (tests before the preview, pulumi/actions preview of `labs` commented on
the PR, self-hosted runner, credentials only from `secrets.`) are asserted on the parsed YAML.
Each broken copy must fail the lint, so the lint demonstrably can fail.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.requirements import unavailable

REPO = Path(__file__).resolve().parent.parent
WORKFLOW = REPO / ".github" / "workflows" / "preview.yml"
SECRET_REF = re.compile(r"^\$\{\{ secrets\.[A-Z][A-Z0-9_]* \}\}$")


def check_jsonschema() -> str:
    binary = Path(sys.executable).parent / "check-jsonschema"
    if not binary.is_file():
        unavailable(f"no check-jsonschema next to {sys.executable} (requirements-dev.txt installs it)")
    return str(binary)


def lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [check_jsonschema(), "--builtin-schema", "vendor.github-workflows", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def workflow() -> dict[str, Any]:
    document = yaml.safe_load(WORKFLOW.read_text())
    # YAML 1.1 reads the bare key `on` as the boolean True.
    document["on"] = document.pop(True, document.get("on"))
    return document


def step_index(steps: list[dict[str, Any]], predicate: Any) -> int:
    matches = [i for i, step in enumerate(steps) if predicate(step)]
    assert len(matches) == 1, f"{len(matches)} matching steps"
    return matches[0]


def test_workflow_passes_the_schema_lint() -> None:
    proc = lint(WORKFLOW)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok -- validation done" in proc.stdout


@pytest.mark.parametrize(
    ("mistake", "old", "new"),
    [
        ("job without runs-on", "    runs-on: [self-hosted, vsphere]\n", ""),
        ("misspelt trigger", "on:\n  pull_request:\n", "on:\n  pull_requests:\n"),
        ("invalid permission level", "pull-requests: write", "pull-requests: admin"),
        ("misspelt needs", "    needs: test\n", "    need: test\n"),
        ("step with uses and run", "      - uses: actions/checkout@v4\n      - name: Python 3.11\n",
         "      - uses: actions/checkout@v4\n        run: git status\n      - name: Python 3.11\n"),
    ],
)
def test_a_broken_copy_fails_the_lint(tmp_path: Path, mistake: str, old: str, new: str) -> None:
    text = WORKFLOW.read_text()
    assert text.count(old) == 1, f"the workflow changed: fix this test's {mistake!r} case"
    broken = tmp_path / "preview.yml"
    broken.write_text(text.replace(old, new))
    proc = lint(broken)
    assert proc.returncode != 0, f"{mistake}: the lint accepted it"
    assert "Schema validation errors were encountered" in proc.stdout + proc.stderr


def test_runs_on_pull_requests_with_least_privilege(workflow: dict[str, Any]) -> None:
    assert "pull_request" in workflow["on"]
    assert workflow["permissions"] == {"contents": "read", "pull-requests": "write"}
    assert workflow["concurrency"]["group"] == "preview-${{ github.event.pull_request.number }}"


def test_tests_run_first_on_a_hosted_runner(workflow: dict[str, Any]) -> None:
    test = workflow["jobs"]["test"]
    assert test["runs-on"] == "ubuntu-latest"
    assert test["container"]["image"] == "debian:bookworm"  # make test installs Debian packages as root
    assert test["env"]["CI"] == "true"  # what .ci/run sets: a test that cannot run fails
    steps = test["steps"]
    checkout = step_index(steps, lambda s: str(s.get("uses", "")).startswith("actions/checkout@"))
    python = step_index(steps, lambda s: "sys.version_info[:2] == (3, 11)" in s.get("run", ""))
    make_test = step_index(steps, lambda s: s.get("run", "").strip() == "make test")
    assert checkout < make_test and python < make_test


def test_preview_runs_after_the_tests_on_the_vsphere_runner(workflow: dict[str, Any]) -> None:
    preview = workflow["jobs"]["preview"]
    assert preview["needs"] == "test"
    assert preview["runs-on"] == ["self-hosted", "vsphere"]
    assert "github.event.pull_request.head.repo.full_name == github.repository" in preview["if"]
    steps = preview["steps"]
    venv = step_index(steps, lambda s: s.get("run", "").strip() == "make venv")
    action = step_index(steps, lambda s: s.get("uses") == "pulumi/actions@v6" and "command" in s.get("with", {}))
    assert venv < action
    with_ = steps[action]["with"]
    assert with_["command"] == "preview"
    assert with_["stack-name"] == "labs"
    assert with_["comment-on-pr"] is True
    assert with_["diff"] is True
    assert with_["cloud-url"] == "${{ vars.PULUMI_BACKEND_URL }}"
    assert with_["github-token"] == "${{ secrets.GITHUB_TOKEN }}"


def test_pulumi_cli_matches_the_pinned_sdk(workflow: dict[str, Any]) -> None:
    pinned = re.search(r"^pulumi==(\S+)", (REPO / "requirements.txt").read_text(), re.MULTILINE)
    assert pinned is not None
    versions = {
        step["with"]["pulumi-version"]
        for step in workflow["jobs"]["preview"]["steps"]
        if str(step.get("uses", "")).startswith("pulumi/actions@")
    }
    assert versions == {pinned.group(1)}


def test_credentials_come_only_from_secrets(workflow: dict[str, Any]) -> None:
    env = workflow["jobs"]["preview"]["env"]
    for name in ("PULUMI_ACCESS_TOKEN", "PULUMI_CONFIG_PASSPHRASE", "VSPHERE_SERVER", "VSPHERE_USER",
                 "VSPHERE_PASSWORD"):
        assert SECRET_REF.match(env[name]), f"{name} = {env[name]!r} is not a ${{{{ secrets.* }}}} reference"
    key_step = next(s for s in workflow["jobs"]["preview"]["steps"] if "LABS_K8S_SSH_PRIVATE_KEY" in s.get("env", {}))
    assert SECRET_REF.match(key_step["env"]["LABS_K8S_SSH_PRIVATE_KEY"])
    # The private key reaches pulumi through stdin, never as a command-line argument.
    assert '| pulumi config set --stack labs --secret labs-k8s:sshPrivateKey' in key_step["run"]
    text = WORKFLOW.read_text()
    assert "PRIVATE KEY-----" not in text
    # Any credential-looking key in the file has an expression for a value, never a literal.
    credential = re.compile(r"^\s*[\w-]*(password|passphrase|token|private_key)[\w-]*:\s*(\S.*)$", re.IGNORECASE)
    values = [m.group(2) for line in text.splitlines() if (m := credential.match(line))]
    assert len(values) >= 5
    assert all(v.startswith("${{ ") for v in values), values
