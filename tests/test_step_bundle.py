"""A step bundle's secret files leave the node's step directory when the step ends (issue #30, 5)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from components.rendering import LIBRARY_ROOT, STEP_ROOT, StepLibrary, bundle_files, read_file, step_bundle


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


# --------------------------------------------------------------------------- the step library

LIBRARY = StepLibrary({"lib.sh": 'greet() { echo "hello from $1"; }\n', "extra-lib.sh": "extra=1\n"})


def _on_node(tmp_path: Path, bundle: str) -> subprocess.CompletedProcess[str]:
    """Run a bundle as on a node whose /var/lib/labs-k8s is under tmp_path."""
    moved = bundle.replace(LIBRARY_ROOT, str(tmp_path / "lib")).replace(STEP_ROOT, str(tmp_path / "steps"))
    return subprocess.run(["bash", "-s"], input=moved, capture_output=True, text=True, check=False)


def _user(library: StepLibrary = LIBRARY) -> str:
    files = {"run.sh": ". ./lib.sh\ngreet user\n", "lib.sh": library.files["lib.sh"], "params.env": "A=1\n"}
    return step_bundle("node-join", files, "run.sh", from_library=(library, "node-prepare"))


def _installer(library: StepLibrary = LIBRARY) -> str:
    files = {"run.sh": ". ./lib.sh\ngreet prepare\n", "lib.sh": library.files["lib.sh"]}
    return step_bundle("node-prepare", files, "run.sh", installs_library=library)


def test_a_later_step_takes_the_library_its_nodes_prepare_installed(tmp_path: Path) -> None:
    user = _user()
    assert LIBRARY.files["lib.sh"] not in user and "params.env" in user
    prepared = _on_node(tmp_path, _installer())
    assert prepared.returncode == 0 and prepared.stdout == "hello from prepare\n", prepared.stderr
    assert sorted(p.name for p in (tmp_path / "lib" / LIBRARY.digest).iterdir()) == ["extra-lib.sh", "lib.sh"]
    joined = _on_node(tmp_path, user)
    assert joined.returncode == 0 and joined.stdout == "hello from user\n", joined.stderr


@pytest.mark.parametrize("damage", ["never-installed", "removed", "altered"])
def test_without_its_library_intact_a_step_stops_and_names_the_step_that_installs_it(
    tmp_path: Path, damage: str
) -> None:
    if damage != "never-installed":
        assert _on_node(tmp_path, _installer()).returncode == 0
        lib = tmp_path / "lib" / LIBRARY.digest / "lib.sh"
        if damage == "removed":
            lib.unlink()
        else:
            lib.write_text("greet() { echo forged; }\n")
    result = _on_node(tmp_path, _user())
    assert result.returncode == 1 and result.stdout == ""
    assert f"lacks the step library {LIBRARY.digest} (lib.sh) that node-prepare installs" in result.stderr
    assert "--replace" in result.stderr


def test_a_new_library_replaces_the_old_one_on_the_node(tmp_path: Path) -> None:
    newer = StepLibrary({**LIBRARY.files, "lib.sh": 'greet() { echo "hi from $1"; }\n'})
    assert newer.digest != LIBRARY.digest
    assert _on_node(tmp_path, _installer()).returncode == 0
    assert _on_node(tmp_path, _installer(newer)).returncode == 0
    assert [p.name for p in (tmp_path / "lib").iterdir()] == [newer.digest]
    assert _on_node(tmp_path, _user(newer)).stdout == "hi from user\n"
    assert _on_node(tmp_path, _user()).returncode == 1, "a bundle of the old library finds it gone"
