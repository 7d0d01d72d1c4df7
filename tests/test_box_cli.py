"""`make box` and `make box-down` as a user meets them (tests/box_cli.py, issue #51): what the
terminal shows, the order of the checks, Ctrl-C, and what the build scripts assume of the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
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


def box_processes(pid: int) -> list[str]:
    """What a holder `pid` made that is still there: its namespaces, and the holder itself."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    left = [line.split()[0] for line in listed.splitlines() if f"-{pid}-" in line]
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 0)
        left.append(f"the holder, pid {pid}")
    return left


def interrupt_when(proc: subprocess.Popen[str], wanted: str, timeout: float) -> list[str]:
    """Read `proc`'s output until a line holds `wanted`, then Ctrl-C it as a terminal does (SIGINT
    to its whole process group); the lines read."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        lines.append(line)
        if wanted in line:
            os.killpg(proc.pid, signal.SIGINT)
            return lines
        assert time.monotonic() < deadline, f"no {wanted!r} in {timeout:g}s:\n{''.join(lines)}"
    raise AssertionError(f"ended before {wanted!r}:\n{''.join(lines)}")


def test_ctrl_c_during_the_builds_says_so_in_one_line(tmp_path: Path) -> None:
    script = (
        "import sys; from tests import box_cli\n"
        "box_cli.BUILDS = [box_cli.Build('a slow build', ('sleep', '60'))]\n"
        "sys.exit(box_cli.main(['up', sys.argv[1]]))\n"
    )
    require_root()
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "box")], cwd=REPO_ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    lines = interrupt_when(proc, "a slow build", timeout=60)
    rest, _ = proc.communicate(timeout=30)
    output = "".join(lines) + rest
    assert proc.returncode == 130, output
    assert "Traceback" not in output, output
    assert rest.strip().splitlines() == [
        "make box: Ctrl-C during the builds; no box was started (the next make box builds what did not finish)"
    ], output


@pytest.mark.integration
@pytest.mark.timeout(3600)
def test_ctrl_c_mid_way_tears_the_box_down(tmp_path: Path) -> None:
    """Ctrl-C while the box comes up (its holder runs in a session of its own): the box is torn down
    as `make box-down` does, without a traceback, and nothing of it is left."""
    require_root()
    root = tmp_path / "box"
    proc = subprocess.Popen(
        ["make", "--no-print-directory", "box", f"BOX={root}"], cwd=REPO_ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    lines = interrupt_when(proc, "vcsim, the CLI's namespace", timeout=3000)
    holder = int((root / "holder.pid").read_text())
    rest, _ = proc.communicate(timeout=600)
    output = "".join(lines) + rest
    assert "Traceback" not in output, output
    assert "make box: Ctrl-C: tearing the box down" in output, output
    assert "make box: the box is gone" in output, output
    assert box_processes(holder) == [], output
    assert not root.exists(), output
