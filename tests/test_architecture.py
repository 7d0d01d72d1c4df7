"""The tree and its rule: docs/architecture.md shows the tree as it is, and the import contracts
(`[tool.importlinter]` in pyproject.toml, run by `make test`) cover every module and can fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests import architecture_tree

REPO_ROOT = architecture_tree.REPO_ROOT
CONTRACTS = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
LAYERS = {"components.template", "components.fleet", "components.loadbalancer", "components.cluster"}
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def contract(starts: str) -> dict:
    (found,) = [c for c in CONTRACTS if c["name"].startswith(starts)]
    return found


def program_modules() -> set[str]:
    """Every module `pulumi up` evaluates: components/ without tools/, packages as one."""
    top = architecture_tree.COMPONENTS
    modules = {f"components.{p.stem}" for p in top.glob("*.py") if p.stem not in {"__init__", "__main__"}}
    return modules | {f"components.{p.name}" for p in top.iterdir() if (p / "__init__.py").exists()} - {
        "components.tools"
    }


def test_the_documented_tree_is_the_tree() -> None:
    text = architecture_tree.DOCUMENT.read_text()
    assert architecture_tree.document_with_tree(text) == text, (
        "docs/architecture.md's tree is stale: .venv/bin/python -m tests.architecture_tree --write"
    )


def test_every_program_module_is_under_the_contracts() -> None:
    """A new module is not outside the rule by being new: the contracts list every one."""
    modules = program_modules()
    assert "components.cluster" in modules and "components.tools" not in modules
    no_tools = set(contract("The program never imports the operator tools")["source_modules"])
    assert modules - no_tools == set(), "add them to that contract in pyproject.toml"
    only_vsphere = set(contract("Only components.vsphere talks to vCenter")["source_modules"])
    assert modules - {"components.vsphere"} - only_vsphere == set()
    assert set(contract("The four layers")["modules"]) == LAYERS


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        ("rendering/lb.py", "import components.tools.offline", "The program never imports the operator tools"),
        ("rendering/lb.py", "import pulumi", "Rendering is pure"),
        ("fleet.py", "import components.cluster", "The four layers are composed only by the lab"),
        ("vsphere/vm.py", "import components.remote", "Layers use rendering and vsphere"),
        ("upgrade.py", "import pyVmomi", "Only components.vsphere talks to vCenter"),
    ],
)
def test_each_contract_fails_on_the_import_it_forbids(tmp_path: Path, module: str, line: str, broken: str) -> None:
    shutil.copytree(REPO_ROOT / "components", tmp_path / "components", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    run = {**os.environ, "PYTHONPATH": str(tmp_path)}

    def lint() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(LINT_IMPORTS), "--no-cache"], cwd=tmp_path, env=run, capture_output=True, text=True, timeout=120
        )

    clean = lint()
    assert clean.returncode == 0, clean.stdout + clean.stderr
    target = tmp_path / "components" / module
    target.write_text(target.read_text() + f"\n{line}  # noqa\n")
    result = lint()
    assert result.returncode != 0
    assert f"{broken}" in result.stdout.replace("\n", " ") and "BROKEN" in result.stdout, result.stdout
