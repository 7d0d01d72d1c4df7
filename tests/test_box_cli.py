"""`make box` and `make box-down` as a user meets them (tests/box_cli.py, issue #51): what the
terminal shows, the order of the checks, Ctrl-C, and what the build scripts assume of the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from components.tools.offline import REPO_ROOT
from tests import box_cli
from tests.requirements import require_root


def test_no_tracked_file_names_a_directory_of_one_machine() -> None:
    """The third-party snapshots are found from the checkout (../shared/third_party) or
    LABS_K8S_THIRD_PARTY: an absolute path of one machine means nothing on a user's."""
    found = subprocess.run(
        ["git", "grep", "-nIF", "/work/shared", "--", ".", ":!tests/test_box_cli.py"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert found.stdout == "", f"machine-specific paths:\n{found.stdout}"


def test_make_box_refuses_a_user_without_root_before_it_installs_or_builds(tmp_path: Path) -> None:
    """Not being root was found after pip, vcsim and ten minutes of Go: the check comes first, and
    nothing is installed or compiled before it."""
    require_root()  # to become an unprivileged user
    home = tmp_path / "home"
    home.mkdir()
    tmp_path.chmod(0o755)
    home.chmod(0o777)
    run = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "make", "--no-print-directory", "box",
         f"BOX={home / 'box'}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(home)},
    )  # fmt: skip
    output = run.stdout + run.stderr
    assert run.returncode != 0, output
    assert output.splitlines()[0].startswith("make box: needs root"), output
    for build in ("pip", "install-test-deps", "build_vcsim", "build_toolchain", "go build"):
        assert build not in output, f"{build} ran before the root check:\n{output}"


def test_a_second_make_box_says_the_box_is_up_and_where(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    require_root()
    root = tmp_path / "box"
    root.mkdir()
    (root / "holder.pid").write_text(str(os.getpid()))  # a live holder
    kubeconfig = root / "kubeconfig"
    (root / "status.json").write_text(json.dumps({
        "ok": True, "log": "up.log", "artifacts": "artifacts", "netns": "lk8s-engine-1-0", "workspace": "ws",
        "kubeconfig": str(kubeconfig), "kubectl": f"KUBECONFIG={kubeconfig} kubectl get --raw /readyz",
    }))  # fmt: skip
    assert box_cli.up(root) == 0
    out = capsys.readouterr().out
    assert "the box is up already" in out, out
    assert f"KUBECONFIG={kubeconfig} kubectl" in out, out
    assert str(root / "holder.log") in out, out
    assert (root / "holder.pid").exists(), "a second make box touched the running box"


def test_box_down_says_what_it_leaves_and_how_to_remove_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert box_cli.down(tmp_path / "box") == 0
    out = capsys.readouterr().out
    for left in ("~/.cache/labs-k8s", "apt-get purge", "install-test-deps.sh", ".cache/", "rm -rf"):
        assert left in out, f"box-down does not mention {left!r}:\n{out}"


def test_each_build_prints_one_line_and_keeps_its_detail_in_the_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A successful `make box` printed 38 `go: upgraded` lines and git's whitespace warnings."""
    chatter = "import sys; print('go: upgraded golang.org/x/net v0.1.0 => v0.2.0', file=sys.stderr)"
    builds = [box_cli.Build("vcsim", (sys.executable, "-c", chatter)),
              box_cli.Build("the Pulumi CLI", (sys.executable, "-c", chatter))]  # fmt: skip
    monkeypatch.setattr(box_cli, "BUILDS", builds)
    log = tmp_path / "build.log"
    assert box_cli.build_all(log, started=0.0) is True
    out = capsys.readouterr().out
    assert "go: upgraded" not in out, out
    assert len(out.splitlines()) == 2, out
    assert "vcsim" in out and "the Pulumi CLI" in out, out
    assert log.read_text().splitlines().count("go: upgraded golang.org/x/net v0.1.0 => v0.2.0") == 2

    failing = "import sys; print('the error', file=sys.stderr); sys.exit(3)"
    monkeypatch.setattr(box_cli, "BUILDS", [box_cli.Build("vcsim", (sys.executable, "-c", failing))])
    assert box_cli.build_all(log, started=0.0) is False
    captured = capsys.readouterr()
    assert "vcsim failed" in captured.err and "the error" in captured.err and str(log) in captured.err, captured
