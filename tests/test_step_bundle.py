"""A step bundle's secret files leave the node's step directory when the step ends (issue #30, 5)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from components.rendering import STEP_ROOT, bundle_files, read_file, step_bundle


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


# Texts a here-document could mangle: expansions, backslashes, tabs (<<- would strip them), CRLF,
# the delimiter itself (alone, indented, with a suffix), no final newline, NUL, empty, UTF-8.
AWKWARD_TEXTS = {
    "expansions.sh": 'echo "$HOME" `id` $(date) ${x:-y} \\\\ \\n\n',
    "tabs.txt": "\tindented\n\t\tmore\n",
    "crlf.txt": "a\r\nb\r\n",
    "delimiter.txt": "before\nLABS_K8S_EOF\nafter\n",
    "near-delimiter.txt": " LABS_K8S_EOF\nLABS_K8S_EOF \nLABS_K8S_EOFx\n",
    "no-final-newline.txt": "last line",
    "nul.bin": "a\0b\n",
    "empty.txt": "",
    "blank-lines.txt": "\n\n\n",
    "utf8.txt": "Проверка ✓\n",
}


def test_every_file_arrives_byte_for_byte(tmp_path: Path) -> None:
    files = {"run.sh": "exit 0\n", **AWKWARD_TEXTS}
    bundle = step_bundle("probe", files, "run.sh").replace(STEP_ROOT, str(tmp_path))
    result = subprocess.run(["bash", "-s"], input=bundle.encode(), capture_output=True, check=False)
    assert result.returncode == 0, result.stderr
    for name, text in files.items():
        assert (tmp_path / "probe" / name).read_bytes() == text.encode(), name


def test_a_script_travels_as_text_not_a_third_larger() -> None:
    """Bundles are kept twice in the state, which the file backend rewrites at every step's start and
    end: base64 made every one a third larger (the 10-worker bench, docs/testing.md)."""
    lib = read_file("k8s/lib.sh")
    bundle = step_bundle("probe", {"lib.sh": lib, "run.sh": "exit 0\n"}, "run.sh")
    assert lib in bundle
    assert len(bundle) < len(lib) + 512


def test_the_bundle_reads_back_as_the_files_it_writes() -> None:
    files = {"run.sh": "exit 0\n", **AWKWARD_TEXTS}
    assert bundle_files(step_bundle("probe", files, "run.sh")) == files
