"""A step bundle's secret files leave the node's step directory when the step ends (issue #30, 5)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from components.rendering import STEP_ROOT, step_bundle


def _run(tmp_path: Path, script: str, secret_files: tuple[str, ...]) -> tuple[subprocess.CompletedProcess[str], Path]:
    files = {"run.sh": script, "kubeadm-join.yaml": "token: abcdef.0123456789abcdef\n", "params.env": "A=1\n"}
    bundle = step_bundle("probe", files, "run.sh", secret_files=secret_files).replace(STEP_ROOT, str(tmp_path))
    result = subprocess.run(["bash", "-s"], input=bundle, capture_output=True, text=True, check=False)
    return result, tmp_path / "probe"


@pytest.mark.parametrize(("script", "code"), [("cat kubeadm-join.yaml >/dev/null\n", 0), ("exit 7\n", 7)])
def test_secret_files_are_removed_however_the_step_ends(tmp_path: Path, script: str, code: int) -> None:
    result, step_dir = _run(tmp_path, script, ("kubeadm-join.yaml",))
    assert result.returncode == code, result.stderr
    assert not (step_dir / "kubeadm-join.yaml").exists()
    assert (step_dir / "params.env").read_text() == "A=1\n" and (step_dir / "run.sh").exists()


def test_without_secret_files_the_bundle_keeps_its_files_and_execs(tmp_path: Path) -> None:
    result, step_dir = _run(tmp_path, "exit 0\n", ())
    assert result.returncode == 0 and (step_dir / "kubeadm-join.yaml").exists()


def test_a_secret_file_must_be_one_of_the_bundle(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not among the bundle's files"):
        step_bundle("probe", {"run.sh": ""}, "run.sh", secret_files=("token",))
