"""A newcomer's third pass (issue 33): the small things a first user trips over."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
