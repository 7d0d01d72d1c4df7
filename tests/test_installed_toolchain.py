"""An installed Pulumi at the pinned versions is used instead of compiling (tests/installed_toolchain.py,
issue #51): a fake PATH of scripts that print what the real binaries print, no network."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import box_cli, installed_toolchain
from tests.pulumi_engine import MANIFEST, manifest
from tests.requirements import require_tool

SCRIPT = Path(installed_toolchain.__file__)


def fake_pulumi(root: Path, cli: str, host: str, plugins: dict[str, str]) -> dict[str, str]:
    """An install as a release lays it out (the CLI, its language host and scripts in one directory)
    and a plugin cache in PULUMI_HOME; the environment that finds them."""
    bin_dir, home = root / "pulumi" / "bin", root / "pulumi-home"
    bin_dir.mkdir(parents=True)
    listed = [{"name": name, "kind": "resource", "version": version, "size": 1} for name, version in plugins.items()]
    scripts = {
        "pulumi": f"""case "$1" in
    version) echo {cli} ;;
    plugin) echo '{json.dumps(listed)}' ;;
    *) exit 2 ;;
esac""",
        "pulumi-language-python": f'[ "$1" = -version ] && echo {host}',
        "pulumi-language-python-exec": "exit 0",
        "pulumi-resource-pulumi-python": "exit 0",
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    for name, version in plugins.items():
        plugin = home / "plugins" / f"resource-{name}-v{version}" / f"pulumi-resource-{name}"
        plugin.parent.mkdir(parents=True)
        plugin.write_text("#!/bin/sh\n")
        plugin.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "PULUMI_HOME": str(home), "HOME": str(root)}


def pinned() -> tuple[str, str, dict[str, str]]:
    return installed_toolchain.pins(manifest())


def run(environ: dict[str, str], out: Path) -> subprocess.CompletedProcess[str]:
    """What build_toolchain.sh runs first, under the machine's python3 as make box does."""
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(MANIFEST), str(out)],
        env=environ, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_a_matching_installed_pulumi_is_linked_and_nothing_is_compiled(tmp_path: Path) -> None:
    cli, host, plugins = pinned()
    environ = fake_pulumi(tmp_path, cli, host, plugins)
    done = run(environ, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("\n") == 1 and "nothing to compile" in done.stderr, done.stderr
    bin_dir = tmp_path / "out" / "bin"
    for name in ("pulumi", "pulumi-language-python", *installed_toolchain.SCRIPTS):
        assert (bin_dir / name).resolve() == tmp_path / "pulumi" / "bin" / name
    listed = json.loads((tmp_path / "out" / "plugins.json").read_text())
    assert {(p["name"], p["version"]) for p in listed} == set(plugins.items())
    for plugin in listed:
        assert Path(plugin["path"]).is_relative_to(tmp_path / "pulumi-home" / "plugins"), plugin
        assert os.access(plugin["path"], os.X_OK)


def test_build_toolchain_asks_for_the_installed_pulumi_before_it_needs_go() -> None:
    """A user with a matching Pulumi needs no Go for it: the check runs before go_binary."""
    text = (MANIFEST.parents[1] / "build_toolchain.sh").read_text()
    assert 0 < text.index("installed_toolchain.py") < text.index("go=$(go_binary)")
    assert "LABS_K8S_BUILD_PULUMI=1" in (MANIFEST.parents[3] / ".ci" / "run").read_text()


@pytest.mark.parametrize("which", ["cli", "host", "plugin", "no plugin"])
def test_a_version_that_differs_is_named_in_one_line(tmp_path: Path, which: str) -> None:
    cli, host, plugins = pinned()
    said: dict[str, Any] = {"cli": cli, "host": host, "plugins": dict(plugins)}
    if which == "cli":
        said["cli"] = "v3.280.0"
    elif which == "host":
        said["host"] = "v3.280.0"
    elif which == "plugin":
        said["plugins"]["vsphere"] = "4.18.0"
    else:
        del said["plugins"]["random"]
    done = run(fake_pulumi(tmp_path, said["cli"], said["host"], said["plugins"]), tmp_path / "out")
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].endswith("building the Pulumi CLI and plugins from source"), lines
    expected = {
        "cli": f"pulumi is v3.280.0, the pins need {cli}",
        "host": f"pulumi-language-python is v3.280.0, the pins need {host}",
        "plugin": f"vsphere is not installed at {plugins['vsphere']} (pulumi plugin ls: 4.18.0)",
        "no plugin": f"random is not installed at {plugins['random']} (pulumi plugin ls: none)",
    }[which]
    assert expected in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_no_pulumi_on_path_builds_from_source(tmp_path: Path) -> None:
    done = run({"PATH": str(tmp_path), "HOME": str(tmp_path)}, tmp_path / "out")
    assert done.returncode == 1
    assert done.stderr == "build_toolchain: no pulumi on PATH: building the Pulumi CLI and plugins from source\n"


def test_labs_k8s_build_pulumi_forces_the_source_build(tmp_path: Path) -> None:
    cli, host, plugins = pinned()
    environ = {**fake_pulumi(tmp_path, cli, host, plugins), "LABS_K8S_BUILD_PULUMI": "1"}
    done = run(environ, tmp_path / "out")
    assert done.returncode == 1
    assert "LABS_K8S_BUILD_PULUMI=1: building the Pulumi CLI and plugins from source" in done.stderr
    assert not (tmp_path / "out").exists()


def test_make_box_needs_no_snapshot_with_a_matching_installed_pulumi(tmp_path: Path) -> None:
    """The prerequisite check before any install: the snapshots or a matching Pulumi, and its message
    says both, with why the installed one does not do."""
    repo = tmp_path / "labs-k8s"
    repo.mkdir()
    cli, host, plugins = pinned()
    environ = fake_pulumi(tmp_path, cli, host, plugins)
    assert box_cli.third_party_problem(repo, environ) is None
    problem = box_cli.third_party_problem(repo, {**environ, "LABS_K8S_BUILD_PULUMI": "1"})
    assert problem is not None and f"Pulumi {cli} installed" in problem and "LABS_K8S_BUILD_PULUMI=1" in problem


@pytest.mark.parametrize(
    ("plugin", "expected"),
    [
        ("pulumi-resource-command", "pulumi-command/provider v1.2.1: no archive, and the Go module proxy"),
        ("pulumi-resource-random", "pulumi-random/provider/v4 4.19.1: pulumi-random-4.19.1.tar.gz is not"),
    ],
)
def test_a_missing_snapshot_is_taken_from_the_proxy_or_named_in_one_line(
    tmp_path: Path, plugin: str, expected: str
) -> None:
    """Without ../shared/third_party: the same module from the Go module proxy (off here: no network),
    else one line naming the module, the version and what to do; nothing is built."""
    require_tool("jq")
    snapshots = tmp_path / "third_party"
    snapshots.mkdir()
    (snapshots / "MANIFEST.json").write_text("[]")
    cache = tmp_path / "cache"
    done = subprocess.run(
        ["bash", str(MANIFEST.parents[1] / "build_plugins.sh"), plugin],
        env={**os.environ, "LABS_K8S_THIRD_PARTY": str(snapshots), "LABS_K8S_PLUGIN_CACHE": str(cache),
             "GOPROXY": "off"},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    failed = [line for line in done.stderr.splitlines() if expected in line]
    assert len(failed) == 1 and "in $LABS_K8S_THIRD_PARTY, or install Pulumi" in failed[0], done.stderr
    assert not list(cache.glob("*/bin/*")), "something was built"
