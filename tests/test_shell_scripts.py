"""Every shell script in the repo passes shellcheck; the step bundle and the readiness step run for real."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from components.rendering import read_file, step_bundle
from components.tools.offline import REPO_ROOT
from tests.requirements import require_tool

TRACKED_SCRIPTS = subprocess.run(
    ["git", "ls-files", "*.sh", ".ci/run"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
).stdout.split()


def shellcheck(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["shellcheck", "-x", "-s", "bash", str(path)],
        cwd=path.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_there_are_scripts_to_check():
    assert {"scripts/install-test-deps.sh", "tests/tools/build_vcsim.sh", ".ci/run"} <= set(TRACKED_SCRIPTS)


@pytest.mark.parametrize("script", TRACKED_SCRIPTS)
def test_shellcheck(script):
    require_tool("shellcheck")
    result = shellcheck(REPO_ROOT / script)
    assert result.returncode == 0, result.stdout + result.stderr


def test_step_bundle_is_clean_bash_and_writes_then_runs(tmp_path, monkeypatch):
    require_tool("shellcheck")
    files = {"run.sh": 'echo "ran $1 in $PWD"; cat data.txt\n', "data.txt": "secret-free payload\n"}
    bundle = step_bundle("demo", files, "run.sh", ("arg one",)).replace("/var/lib/labs-k8s/steps", str(tmp_path))
    script = tmp_path / "bundle.sh"
    script.write_text(bundle)
    assert shellcheck(script).returncode == 0
    result = subprocess.run(["bash", "-s"], input=bundle, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"ran arg one in {tmp_path}/demo\nsecret-free payload\n"
    assert oct((tmp_path / "demo").stat().st_mode & 0o777) == "0o700"
    assert oct((tmp_path / "demo" / "data.txt").stat().st_mode & 0o777) == "0o600"


def test_step_bundle_rejects_nested_names():
    with pytest.raises(ValueError, match="flat"):
        step_bundle("demo", {"a/b.sh": ""}, "a/b.sh")
    with pytest.raises(ValueError, match="entrypoint"):
        step_bundle("demo", {"a.sh": ""}, "b.sh")


# --------------------------------------------------------------------------- readiness step

WAIT = read_file("fleet/wait-for-cloud-init.sh")


def run_wait(tmp_path: Path, cloud_init_body: str, hostname: str = "labs-k8s-w01", timeout: str = "5"):
    """wait-for-cloud-init.sh with stand-in `cloud-init` and `hostname` commands on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "cloud-init").write_text(f"#!/bin/bash\n{cloud_init_body}\n")
    (bin_dir / "hostname").write_text(f"#!/bin/bash\necho {hostname}\n")
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    script = tmp_path / "wait.sh"
    script.write_text(WAIT)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.run(
        ["bash", str(script), timeout, "labs-k8s-w01"], env=env, capture_output=True, text=True, timeout=30, check=False
    )


def test_readiness_passes_when_cloud_init_is_done(tmp_path):
    result = run_wait(tmp_path, 'case "$1 $2" in "status --wait") exit 0;; esac; exit 3')
    assert result.returncode == 0, result.stderr
    assert result.stdout == "cloud-init done on labs-k8s-w01\n"


def test_readiness_fails_with_cloud_inits_own_error(tmp_path):
    body = 'if [[ $2 == --wait ]]; then exit 1; fi; echo "status: error"; echo "  mounts: labs_data.1 missing"'
    result = run_wait(tmp_path, body)
    assert result.returncode == 1
    assert "cloud-init failed on labs-k8s-w01" in result.stderr
    assert "labs_data.1 missing" in result.stderr


def test_readiness_is_bounded(tmp_path):
    result = run_wait(tmp_path, 'if [[ $2 == --wait ]]; then sleep 30; fi; echo "status: running"', timeout="1")
    assert result.returncode == 1
    assert "did not finish within 1s" in result.stderr and "status: running" in result.stderr


def test_readiness_catches_a_clone_with_the_wrong_identity(tmp_path):
    result = run_wait(tmp_path, "exit 0", hostname="debian")
    assert result.returncode == 1
    assert "calls itself debian, expected labs-k8s-w01" in result.stderr
