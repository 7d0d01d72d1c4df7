"""The pull-request workflows: schema-valid, and saying what they must.

test.yml: the tests of a pull request. preview.yml: when they pass, the vCenter `pulumi preview`, a
workflow_run of the default branch's file behind an approval gate. render-diff.yml and
render-diff-comment.yml: the offline per-machine diff, computed without any write permission and
posted by a workflow_run that never runs the pull request's code.

The lint is check-jsonschema's vendored GitHub workflow schema (offline). The schema only knows
shapes; the key facts (tests before the preview, the CLI's preview of `labs` commented on the PR
without reading any stack output, self-hosted runner, credentials only from `secrets.`, who may
write) are asserted on the parsed YAML. Each broken copy must fail the lint, so the lint demonstrably can fail.
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
WORKFLOWS = REPO / ".github" / "workflows"
WORKFLOW = WORKFLOWS / "preview.yml"
TESTS = WORKFLOWS / "test.yml"
RENDER_DIFF = WORKFLOWS / "render-diff.yml"
RENDER_DIFF_COMMENT = WORKFLOWS / "render-diff-comment.yml"
SECRET_REF = re.compile(r"^\$\{\{ secrets\.[A-Z][A-Z0-9_]* \}\}$")
CHECKOUT = "actions/checkout@11d5960a326750d5838078e36cf38b85af677262 # v4.4.0"


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


def load(path: Path) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text())
    # YAML 1.1 reads the bare key `on` as the boolean True.
    document["on"] = document.pop(True, document.get("on"))
    return document


@pytest.fixture(scope="module")
def workflow() -> dict[str, Any]:
    return load(WORKFLOW)


@pytest.fixture(scope="module")
def tests_workflow() -> dict[str, Any]:
    return load(TESTS)


def steps_using(steps: list[dict[str, Any]], action: str) -> list[dict[str, Any]]:
    return [s for s in steps if str(s.get("uses", "")).split("@")[0] == action]


def step_index(steps: list[dict[str, Any]], predicate: Any) -> int:
    matches = [i for i, step in enumerate(steps) if predicate(step)]
    assert len(matches) == 1, f"{len(matches)} matching steps"
    return matches[0]


def test_the_workflows_are_these() -> None:
    assert sorted(p.name for p in WORKFLOWS.iterdir()) == [
        "preview.yml",
        "render-diff-comment.yml",
        "render-diff.yml",
        "test.yml",
    ]


@pytest.mark.parametrize("path", [WORKFLOW, TESTS, RENDER_DIFF, RENDER_DIFF_COMMENT], ids=lambda p: p.name)
def test_workflow_passes_the_schema_lint(path: Path) -> None:
    proc = lint(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok -- validation done" in proc.stdout


@pytest.mark.parametrize(
    ("mistake", "path", "old", "new"),
    [
        ("job without runs-on", WORKFLOW, "    runs-on: [self-hosted, vsphere]\n", ""),
        ("misspelt trigger", TESTS, "on:\n  pull_request:\n", "on:\n  pull_requests:\n"),
        ("invalid permission level", WORKFLOW, "pull-requests: write", "pull-requests: admin"),
        ("misspelt needs", WORKFLOW, "    needs: preview\n", "    need: preview\n"),
        (
            "step with uses and run",
            TESTS,
            f"      - uses: {CHECKOUT}\n      - name: Python 3.11\n",
            f"      - uses: {CHECKOUT}\n        run: git status\n      - name: Python 3.11\n",
        ),
    ],
)
def test_a_broken_copy_fails_the_lint(tmp_path: Path, mistake: str, path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"the workflow changed: fix this test's {mistake!r} case"
    broken = tmp_path / "preview.yml"
    broken.write_text(text.replace(old, new))
    proc = lint(broken)
    assert proc.returncode != 0, f"{mistake}: the lint accepted it"
    assert "Schema validation errors were encountered" in proc.stdout + proc.stderr


def test_runs_on_pull_requests_with_least_privilege(workflow: dict[str, Any], tests_workflow: dict[str, Any]) -> None:
    assert list(tests_workflow["on"]) == ["pull_request"]
    # The tests and the preview run the pull request's code: read only. Only the comment job writes.
    assert tests_workflow["permissions"] == workflow["permissions"] == {"contents": "read"}
    assert "permissions" not in tests_workflow["jobs"]["test"]
    assert workflow["jobs"]["preview"]["permissions"] == {"contents": "read"}
    assert workflow["jobs"]["comment"]["permissions"] == {"contents": "read", "pull-requests": "write"}
    assert tests_workflow["concurrency"]["group"] == "test-${{ github.event.pull_request.number }}"


def test_preview_waits_for_a_reviewer_in_a_protected_environment(
    workflow: dict[str, Any], tests_workflow: dict[str, Any]
) -> None:
    assert workflow["jobs"]["preview"]["environment"] == "vcenter-preview"
    assert "environment" not in tests_workflow["jobs"]["test"]
    runbook = (REPO / "docs" / "runbook.md").read_text()
    gate = runbook.split("### The preview job's approval gate", 1)[1].split("\n## ", 1)[0]
    assert "`vcenter-preview`" in gate and "Required reviewers" in gate and "Prevent self-review" in gate


def test_tests_run_first_on_a_hosted_runner(tests_workflow: dict[str, Any]) -> None:
    test = tests_workflow["jobs"]["test"]
    assert test["runs-on"] == "ubuntu-latest"
    assert test["container"]["image"] == "debian:bookworm"  # make test installs Debian packages as root
    assert test["env"]["CI"] == "true"  # what .ci/run sets: a test that cannot run fails
    steps = test["steps"]
    checkout = step_index(steps, lambda s: str(s.get("uses", "")).startswith("actions/checkout@"))
    python = step_index(steps, lambda s: "sys.version_info[:2] == (3, 11)" in s.get("run", ""))
    make_test = step_index(steps, lambda s: s.get("run", "").strip() == "make test")
    assert checkout < make_test and python < make_test


def test_the_test_job_keeps_what_the_suite_builds_for_itself(tests_workflow: dict[str, Any]) -> None:
    """A hosted runner starts empty: the first-boot image, the Debian rootfs and vcsim are cached
    where the suite looks for them, under a key that changes with every file their build reads."""
    import fnmatch

    from components.template import CACHE_ROOT
    from tests import firstboot, kube_programs, test_seal_rootfs

    steps = tests_workflow["jobs"]["test"]["steps"]
    cache = step_index(steps, lambda s: str(s.get("uses", "")).startswith("actions/cache@"))
    assert cache < step_index(steps, lambda s: s.get("run", "").strip() == "make test")
    options = steps[cache]["with"]
    paths = set(options["path"].split())
    home = Path.home()
    assert "~/" + str(CACHE_ROOT.relative_to(home)) in paths  # $LABS_K8S_CACHE unset, as in the job
    assert str(test_seal_rootfs.CACHE_DIR.relative_to(REPO)) in paths
    assert (
        ".cache/vcsim" in paths
        and 'CACHE_DIR="$REPO/.cache/vcsim"' in (REPO / "tests" / "tools" / "build_vcsim.sh").read_text()
    )
    assert ".cache/kube" in paths and kube_programs.CACHE == REPO / ".cache" / "kube"
    patterns = re.findall(r"'([^']+)'", re.search(r"hashFiles\((.*?)\)", options["key"]).group(1))
    inputs = [
        *firstboot.RECIPE_FILES,
        REPO / "tests" / "tools" / "build_vcsim.sh",
        REPO / "tests" / "kube_programs.py",
        *(REPO / "tests" / "tools" / "kube").rglob("go.*"),
        *(REPO / "cloudinit" / "template").iterdir(),
        REPO / "components" / "rendering" / "template.py",
    ]
    for path in inputs:
        relative = str(path.relative_to(REPO))
        assert any(fnmatch.fnmatch(relative, pattern.replace("**", "*")) for pattern in patterns), relative
    assert options["restore-keys"] == options["key"].split("${{")[0]


def test_preview_runs_after_the_tests_on_the_vsphere_runner(
    workflow: dict[str, Any], tests_workflow: dict[str, Any]
) -> None:
    assert workflow["on"] == {"workflow_run": {"workflows": [tests_workflow["name"]], "types": ["completed"]}}
    preview = workflow["jobs"]["preview"]
    assert preview["runs-on"] == ["self-hosted", "vsphere"]
    for guard in (
        "github.event.workflow_run.event == 'pull_request'",
        "github.event.workflow_run.conclusion == 'success'",  # the tests passed
        "github.event.workflow_run.head_repository.full_name == github.repository",  # no fork
    ):
        assert guard in preview["if"], guard
    steps = preview["steps"]
    (checkout,) = steps_using(steps, "actions/checkout")
    assert checkout["with"] == {"ref": "${{ github.event.workflow_run.head_sha }}", "persist-credentials": False}
    venv = step_index(steps, lambda s: s.get("run", "").strip() == "make venv")
    run = step_index(steps, lambda s: "pulumi preview --stack labs --diff" in s.get("run", ""))
    assert steps.index(checkout) < venv < run
    assert "set -o pipefail" in steps[run]["run"]  # tee must not hide a failed preview
    (upload,) = steps_using(steps, "actions/upload-artifact")
    assert steps.index(upload) > run and upload["with"]["path"] == "${{ runner.temp }}/preview.txt"
    # The comment: another job, on a hosted runner, with the default branch's code only.
    comment_job = workflow["jobs"]["comment"]
    assert comment_job["needs"] == "preview" and comment_job["runs-on"] == "ubuntu-latest"
    steps = comment_job["steps"]
    (checkout,) = steps_using(steps, "actions/checkout")
    assert checkout["with"] == {"persist-credentials": False}
    (download,) = steps_using(steps, "actions/download-artifact")
    assert download["with"]["name"] == upload["with"]["name"]
    assert download["with"]["path"].startswith("${{ runner.temp }}/")  # outside the checkout
    build = step_index(steps, lambda s: "components.tools.pr_comment preview" in s.get("run", ""))
    comment = step_index(steps, lambda s: "components.tools.pr_comment post --marker preview" in s.get("run", ""))
    assert steps.index(download) < build < comment and steps[comment]["env"]["GITHUB_TOKEN"] == "${{ github.token }}"
    assert steps[comment]["env"]["HEAD_SHA"] == "${{ github.event.workflow_run.head_sha }}"
    for step in steps:
        assert "make" not in step.get("run", "").split() and "pip" not in step.get("run", "")


def test_the_preview_job_reads_no_stack_output(workflow: dict[str, Any]) -> None:
    """pulumi/actions v6 runs `pulumi stack output --json --show-secrets` after any command and sets
    every output, the admin kubeconfig among them, as a step output (src/run.ts: stack.outputs(),
    core.setOutput): the preview job uses it to install the CLI only."""
    steps = workflow["jobs"]["preview"]["steps"]
    actions = [s for s in steps if str(s.get("uses", "")).startswith("pulumi/actions@")]
    assert actions and all(set(s.get("with", {})) == {"pulumi-version"} for s in actions)
    runs = "\n".join(s.get("run", "") for s in steps)
    assert "stack output" not in runs and "--show-secrets" not in runs


def test_the_preview_comment_is_the_cli_output_under_its_own_marker(tmp_path: Path) -> None:
    from components.tools.pr_comment import COMMENT_LIMIT, MARKER, PREVIEW_MARKER, main, preview_comment, size

    text = "".join(f"    ~ command:remote:Command labs-k8s-w{i:03}-node-settings update\n" for i in range(5000))
    text += "Resources:\n    ~ 5000 to update\n"
    comment = preview_comment(text, "https://github.com/o/r/actions/runs/1")
    assert comment.startswith(PREVIEW_MARKER + "\n") and MARKER not in comment
    assert size(comment) <= COMMENT_LIMIT
    assert comment.rstrip().endswith("actions/runs/1).") and "~ 5000 to update" in comment
    assert "earlier lines not shown" in comment
    short = tmp_path / "preview.txt"
    short.write_text("Resources:\n    12 unchanged\n")
    out = tmp_path / "comment.md"
    assert main(["preview", "--text", str(short), "--out", str(out)]) == 0
    assert "12 unchanged" in out.read_text() and "not shown" not in out.read_text()


def test_a_self_managed_backend_gets_its_object_store_credentials(workflow: dict[str, Any]) -> None:
    """The CLI reads a self-managed backend's state from its object store: the job passes the
    credentials each scheme's driver reads (gocloud.dev s3blob, azureblob; gcsblob uses the
    runner's Application Default Credentials), from secrets."""
    steps = workflow["jobs"]["preview"]["steps"]
    for step in (steps[step_index(steps, lambda s: "pulumi login" in s.get("run", ""))], preview_step(workflow)):
        env = step["env"]
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY"):
            assert SECRET_REF.match(env[name]), name
        assert env["AWS_REGION"] == "${{ vars.AWS_REGION }}"
    header = WORKFLOW.read_text().split("\nname:", 1)[0]
    for needle in ("s3://", "azblob://", "gs://", "GOOGLE_APPLICATION_CREDENTIALS", "AWS_REGION"):
        assert needle in header, needle
    runbook = (REPO / "docs" / "runbook.md").read_text()
    assert "AWS_ACCESS_KEY_ID" in runbook and "AZURE_STORAGE_KEY" in runbook


def test_pulumi_cli_matches_the_pinned_sdk(workflow: dict[str, Any]) -> None:
    pinned = re.search(r"^pulumi==(\S+)", (REPO / "requirements.txt").read_text(), re.MULTILINE)
    assert pinned is not None
    versions = {
        step["with"]["pulumi-version"]
        for step in workflow["jobs"]["preview"]["steps"]
        if str(step.get("uses", "")).startswith("pulumi/actions@")
    }
    assert versions == {pinned.group(1)}


def preview_step(workflow: dict[str, Any]) -> dict[str, Any]:
    steps = workflow["jobs"]["preview"]["steps"]
    return steps[step_index(steps, lambda s: "pulumi preview --stack labs" in s.get("run", ""))]


def test_credentials_come_only_from_secrets(workflow: dict[str, Any]) -> None:
    env = preview_step(workflow)["env"]
    for name in (
        "PULUMI_ACCESS_TOKEN",
        "PULUMI_CONFIG_PASSPHRASE",
        "VSPHERE_SERVER",
        "VSPHERE_USER",
        "VSPHERE_PASSWORD",
    ):
        assert SECRET_REF.match(env[name]), f"{name} = {env[name]!r} is not a ${{{{ secrets.* }}}} reference"
    text = WORKFLOW.read_text()
    assert "PRIVATE KEY-----" not in text
    # Any credential-looking key in the file has an expression for a value, never a literal.
    credential = re.compile(r"^\s*[\w-]*(password|passphrase|token|private_key)[\w-]*:\s*(\S.*)$", re.IGNORECASE)
    values = [m.group(2) for line in text.splitlines() if (m := credential.match(line))]
    assert len(values) >= 5
    assert all(v.startswith("${{ ") for v in values), values


# --------------------------------------------------------------------------- issue 30 §4: what the preview job holds

# Which step may read which secret: the backend login, the preview itself, the comment's token.
SECRETS_BY_STEP = {
    "pulumi login": {"PULUMI_ACCESS_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AZURE_STORAGE_ACCOUNT",
                     "AZURE_STORAGE_KEY"},
    "pulumi preview --stack labs": {"PULUMI_ACCESS_TOKEN", "PULUMI_CONFIG_PASSPHRASE", "VSPHERE_SERVER", "VSPHERE_USER",
                                    "VSPHERE_PASSWORD", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                    "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY"},
    "components.tools.pr_comment post": {"GITHUB_TOKEN"},
}  # fmt: skip


def test_the_preview_job_scopes_each_secret_to_the_steps_that_need_it(workflow: dict[str, Any]) -> None:
    """No secret at the job level, where `make venv` (the pull request's Makefile) and every action
    would see it; each step has exactly the secrets its command needs."""
    job = workflow["jobs"]["preview"]
    assert "secrets." not in yaml.safe_dump(job.get("env", {}))
    for step in job["steps"]:
        secrets = {name for name, value in step.get("env", {}).items() if "secrets." in str(value)}
        assert "secrets." not in yaml.safe_dump(step.get("with", {})), step.get("name")
        allowed = [names for marker, names in SECRETS_BY_STEP.items() if marker in step.get("run", "")]
        assert secrets == (allowed[0] if allowed else set()), step.get("name") or step.get("uses")


def test_every_action_is_pinned_by_its_commit_sha() -> None:
    """A tag (v4) can be moved to other code by whoever controls the action's repository: every
    `uses:` names a full commit SHA, its tag in a comment (the SHAs read from the actions'
    repositories: `git rev-parse <tag>^{commit}`)."""
    pinned = re.compile(r"^\s*(?:- )?uses: ([\w.-]+/[\w.-]+)@([0-9a-f]{40}) # (v\d+\.\d+\.\d+)\b")
    for path in (WORKFLOW, TESTS, RENDER_DIFF, RENDER_DIFF_COMMENT):
        lines = [line for line in path.read_text().splitlines() if re.match(r"^\s*(- )?uses:", line)]
        assert lines, path.name
        for line in lines:
            assert pinned.match(line), f"{path.name}: {line.strip()} is not pinned by commit SHA"


def test_pulumi_home_is_the_jobs_own_and_is_logged_out_whatever_happens(workflow: dict[str, Any]) -> None:
    steps = workflow["jobs"]["preview"]["steps"]
    home = step_index(steps, lambda s: "PULUMI_HOME=" in s.get("run", ""))
    assert steps[home]["run"].strip() == 'echo "PULUMI_HOME=$RUNNER_TEMP/pulumi-home" >> "$GITHUB_ENV"'
    pulumi_steps = [
        i
        for i, s in enumerate(steps)
        if "pulumi " in s.get("run", "") or str(s.get("uses", "")).startswith("pulumi/actions@")
    ]
    assert pulumi_steps and home < min(pulumi_steps)
    logout = steps[-1]
    assert logout["if"] == "always()"
    assert "pulumi logout --all" in logout["run"] and 'rm -rf "$PULUMI_HOME"' in logout["run"]


def test_the_preview_job_holds_no_ssh_private_key(workflow: dict[str, Any]) -> None:
    """A preview runs no remote command: the job sets the preview-only path instead of the key
    that gives root on every node (components/stack_config.py, tests/test_program.py)."""
    from components.stack_config import PREVIEW_WITHOUT_SSH_KEY

    assert "SSH_PRIVATE_KEY" not in WORKFLOW.read_text()
    job = yaml.safe_dump(workflow["jobs"]["preview"].get("env", {}))
    for step in workflow["jobs"]["preview"]["steps"]:
        assert "sshPrivateKey" not in step.get("run", ""), step.get("name")  # no `config set` of it
        job += yaml.safe_dump(step.get("env", {}))
    assert "PRIVATE_KEY" not in job.replace(PREVIEW_WITHOUT_SSH_KEY, "")
    assert preview_step(workflow)["env"][PREVIEW_WITHOUT_SSH_KEY] == "true"
    steps = workflow["jobs"]["preview"]["steps"]
    assert [s for s in steps if PREVIEW_WITHOUT_SSH_KEY in s.get("env", {})] == [preview_step(workflow)]


def test_the_runbook_states_what_the_workflow_cannot_enforce() -> None:
    runbook = (REPO / "docs" / "runbook.md").read_text()
    gate = runbook.split("### The preview job's approval gate", 1)[1].split("\n## ", 1)[0]
    flat = " ".join(gate.split())
    for requirement in (
        "An ephemeral runner in a runner group for this repository only",
        "A preview stack or state without `up`-account secrets and with read-only backend credentials",
        'Approval of a preview run means "cluster-admin, root and vCenter write"',
        "`pulumi logout --all`",
        "`LABS_K8S_PREVIEW_WITHOUT_SSH_KEY=true`",
        "pinned by its full commit SHA",
        # issue 50: only main's preview.yml reaches the runner, which holds nothing of its own.
        "`.github/workflows/preview.yml@refs/heads/main`",
        "with no ambient credentials on the runner",
    ):
        assert requirement in flat, requirement
    assert "LABS_K8S_SSH_PRIVATE_KEY`, stored" not in flat


# --------------------------------------------------------------------------- render diff


@pytest.fixture(scope="module")
def render_diff() -> dict[str, Any]:
    return load(RENDER_DIFF)


@pytest.fixture(scope="module")
def render_diff_comment() -> dict[str, Any]:
    return load(RENDER_DIFF_COMMENT)


def test_no_workflow_runs_pull_request_code_with_a_write_token() -> None:
    for path in WORKFLOWS.glob("*.yml"):
        document = load(path)
        # pull_request_target runs with a write token and the secrets, whatever it checks out.
        assert "pull_request_target" not in document["on"], path.name
        # Event data (branch names, titles) in a run: script is a shell injection; env is not.
        for job in document["jobs"].values():
            for step in job["steps"]:
                assert "${{" not in step.get("run", ""), f"{path.name}: {step.get('name')}: use env"


def test_render_diff_runs_the_diff_against_the_base_without_secrets(render_diff: dict[str, Any]) -> None:
    assert list(render_diff["on"]) == ["pull_request"]
    assert render_diff["permissions"] == {"contents": "read"}
    assert not re.search(r"\$\{\{\s*secrets\.", RENDER_DIFF.read_text())
    (job,) = render_diff["jobs"].values()
    assert "permissions" not in job and "environment" not in job
    assert job["runs-on"] == "ubuntu-latest"
    steps = job["steps"]
    (checkout,) = steps_using(steps, "actions/checkout")
    assert checkout["with"] == {"fetch-depth": 0, "persist-credentials": False}
    (python,) = steps_using(steps, "actions/setup-python")
    assert python["with"]["python-version"] == "3.11"
    venv = step_index(steps, lambda s: s.get("run", "").strip() == "make venv")
    diff = step_index(steps, lambda s: "python -m components diff" in s.get("run", ""))
    assert venv < diff
    assert steps[diff]["env"]["BASE_SHA"] == "${{ github.event.pull_request.base.sha }}"
    assert '--stack labs --against "$BASE_SHA"' in steps[diff]["run"]
    assert "--json render-diff/report.json > render-diff/diff.txt" in steps[diff]["run"]
    pull_request = step_index(steps, lambda s: "pull-request.json" in s.get("run", ""))
    (upload,) = steps_using(steps, "actions/upload-artifact")
    assert upload["with"]["name"] == "render-diff" and upload["with"]["path"] == "render-diff/"
    assert diff < pull_request < steps.index(upload)
    # A head that does not render still uploads its report (the comment says why), then fails.
    fail = step_index(steps, lambda s: s.get("if") == "steps.diff.outputs.status != '0'")
    assert steps.index(upload) < fail == len(steps) - 1


def test_the_comment_is_posted_by_trusted_code_only(
    render_diff: dict[str, Any], render_diff_comment: dict[str, Any]
) -> None:
    trigger = render_diff_comment["on"]
    assert list(trigger) == ["workflow_run"]
    assert trigger["workflow_run"] == {"workflows": [render_diff["name"]], "types": ["completed"]}
    assert render_diff_comment["permissions"] == {"contents": "read", "actions": "read", "pull-requests": "write"}
    (job,) = render_diff_comment["jobs"].values()
    assert "github.event.workflow_run.event == 'pull_request'" in job["if"]
    steps = job["steps"]
    # The checkout is the default branch's (workflow_run's own): no ref, no other repository.
    (checkout,) = steps_using(steps, "actions/checkout")
    assert checkout["with"] == {"persist-credentials": False}
    (download,) = steps_using(steps, "actions/download-artifact")
    assert download["with"]["run-id"] == "${{ github.event.workflow_run.id }}"
    assert download["with"]["name"] == "render-diff"
    # Unpacked outside the checkout: the artifact cannot replace the code that runs next.
    assert download["with"]["path"].startswith("${{ runner.temp }}/")
    build = step_index(steps, lambda s: "components.tools.pr_comment build" in s.get("run", ""))
    post = step_index(steps, lambda s: "components.tools.pr_comment post" in s.get("run", ""))
    assert steps.index(download) < build < post
    assert '--full-diff-url "$RUN_URL"' in steps[build]["run"]
    assert steps[build]["env"]["RUN_URL"] == "${{ github.event.workflow_run.html_url }}"
    env = steps[post]["env"]
    assert env["HEAD_SHA"] == "${{ github.event.workflow_run.head_sha }}"
    assert env["HEAD_REPO"] == "${{ github.event.workflow_run.head_repository.full_name }}"
    assert env["GITHUB_TOKEN"] == "${{ github.token }}"
    for step in steps:
        # Only the standard library's python3: nothing the pull request pinned is installed here.
        assert "make" not in step.get("run", "").split() and "pip" not in step.get("run", "")


# --------------------------------------------------------------------------- what the docs say of the state


def _section(text: str, heading: str) -> str:
    return text.split(heading, 1)[1].split("\n#", 1)[0]


def test_the_default_providers_update_line_is_explained() -> None:
    """A person's `up` (Pulumi.labs.yaml with the README's step-5 `vsphere:*` login) and the
    preview job (the same file, the login in `VSPHERE_*`) give the default providers different
    inputs (components.tools.offline.default_provider_inputs, after the engine's GetPackageConfig):
    docs/pull-requests.md names each key that differs, for both providers."""
    from components.tools.offline import default_provider_inputs, stack_config

    ci, ci_secrets = stack_config("labs")
    for key in ("vsphere:vsphereServer", "vsphere:user", "vsphere:password"):
        ci.pop(key, None)  # not in the committed file: the job passes VSPHERE_*
    person = {
        **ci,
        "vsphere:vsphereServer": "vcenter.example.com",
        "vsphere:user": "labs-k8s@vsphere.local",
        "vsphere:password": "hunter2",
    }
    up = default_provider_inputs(person, {*ci_secrets, "vsphere:password"})
    preview = default_provider_inputs(ci, set(ci_secrets))
    section = _section((REPO / "docs" / "pull-requests.md").read_text(), "### The default providers' `update` lines")
    for provider in ("vsphere", "pulumi-python"):
        differ = {
            k for k in up[provider].keys() | preview[provider].keys() if up[provider].get(k) != preview[provider].get(k)
        }
        assert differ, provider
        assert f"`pulumi:providers:{provider}`" in section
        for key in differ:
            assert f"`{key.rsplit(':', 1)[-1]}`" in section, (provider, key)
    assert "VSPHERE_*" in section and "GetPackageConfig" in section


def test_the_secrets_section_says_the_state_keeps_every_stack_secret() -> None:
    """The dynamic providers' default provider records every config key, secrets included: the
    runbook's secrets section says so, naming each secret a stack file holds, and the README's
    secrets section links there (#33 moved the engine internals out of the README)."""
    from components.tools.offline import REQUIRED_SECRETS, default_provider_inputs

    recorded = default_provider_inputs({key: "x" for key in REQUIRED_SECRETS}, set(REQUIRED_SECRETS))["pulumi-python"]
    assert set(recorded) == set(REQUIRED_SECRETS) and all(v == {"secret": "x"} for v in recorded.values())
    readme = _section((REPO / "README.md").read_text(), "### Secrets and settings: what is committed")
    assert "(docs/runbook.md#secrets-in-the-stack-file-and-in-the-state)" in readme
    section = _section((REPO / "docs" / "runbook.md").read_text(), "### Secrets in the stack file and in the state")
    assert "pulumi:providers:pulumi-python" in section
    for key in REQUIRED_SECRETS:
        assert f"`{key}`" in section, key


# ----------------------------------------------------------------- issue 50, Major 2: who defines the vCenter job

# Triggers whose run uses the default branch's workflow file: a pull request cannot rewrite the job.
# Every other one (pull_request, push, workflow_dispatch on a branch...) runs the file at the event's ref.
DEFAULT_BRANCH_TRIGGERS = {"workflow_run", "pull_request_target", "schedule"}
PR_CODE_REF = re.compile(r"workflow_run\.head|pull_request\.head|github\.head_ref|refs/pull/")


def runs_on_labels(job: dict[str, Any]) -> list[str]:
    runs_on = job.get("runs-on", [])
    if isinstance(runs_on, dict):
        runs_on = runs_on.get("labels", [])
    return [runs_on] if isinstance(runs_on, str) else list(runs_on)


def pr_code_checkouts(job: dict[str, Any]) -> list[int]:
    """The steps that check out the pull request's commit (a ref or repository other than the run's)."""
    return [
        i
        for i, step in enumerate(job.get("steps", []))
        if str(step.get("uses", "")).startswith("actions/checkout@")
        and any(PR_CODE_REF.search(str(step.get("with", {}).get(key, ""))) for key in ("ref", "repository"))
    ]


def trust_findings(document: dict[str, Any]) -> list[str]:
    """Why a workflow's self-hosted or pull-request-code jobs could be rewritten or run unapproved."""
    findings = []
    triggers = set(document["on"]) if isinstance(document["on"], dict | list) else {document["on"]}
    pr_defined = sorted(triggers - DEFAULT_BRANCH_TRIGGERS)
    pr_triggered = bool(triggers & {"pull_request", "pull_request_target"}) or "workflow_run" in triggers
    for name, job in document["jobs"].items():
        self_hosted = "self-hosted" in runs_on_labels(job)
        pr_code = bool(pr_code_checkouts(job)) or (self_hosted and pr_triggered)
        if self_hosted and pr_defined:
            findings.append(f"{name}: self-hosted, defined by the ref of {pr_defined}")
        if (self_hosted or pr_code) and not job.get("environment"):
            findings.append(f"{name}: no environment approval before it runs")
        if self_hosted or pr_code:
            permissions = job.get("permissions", document.get("permissions"))
            if not isinstance(permissions, dict) or any(v == "write" for v in permissions.values()):
                findings.append(f"{name}: a write token where the pull request's code runs ({permissions!r})")
    return findings


def test_no_self_hosted_job_is_defined_or_run_by_a_pull_request() -> None:
    """GitHub runs a `pull_request` workflow from the pull request's own file: any collaborator's branch
    could drop the gate and run on the vCenter runner. The vCenter job is a workflow_run of main's file,
    behind the environment's reviewers, with a read-only token; the comment is another job."""
    findings = {path.name: trust_findings(load(path)) for path in sorted(WORKFLOWS.glob("*.yml"))}
    assert all(not f for f in findings.values()), findings
    assert any("self-hosted" in runs_on_labels(job) for job in load(WORKFLOW)["jobs"].values())


@pytest.mark.parametrize(
    ("mistake", "change"),
    [
        ("on pull_request", lambda d: d.__setitem__("on", {"pull_request": None})),
        ("dispatchable from any branch", lambda d: d["on"].__setitem__("workflow_dispatch", None)),
        ("no gate", lambda d: d["jobs"]["preview"].pop("environment")),
        ("write token", lambda d: d["jobs"]["preview"]["permissions"].__setitem__("pull-requests", "write")),
        ("hosted job checking out the head", lambda d: d["jobs"]["comment"]["steps"][0].__setitem__(
            "with", {"ref": "${{ github.event.workflow_run.head_sha }}"})),
    ],
)  # fmt: skip
def test_the_trust_check_can_fail(mistake: str, change: Any) -> None:
    document = load(WORKFLOW)
    change(document)
    assert trust_findings(document), mistake
