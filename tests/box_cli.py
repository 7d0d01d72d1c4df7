"""`make box` and `make box-down`: the lab in a box for a user without a vCenter (README, "Try it
without a vCenter"; docs/testing.md, "The lab in a box", says what is real and what is simulated).

`up` starts a holder process in the background that opens the box (tests/test_lab_box.py
`open_box`: vcsim, the package mirror, a host per clone) under `.box/`, runs `make up` against it
as a user would, writes the kubeconfig output to `.box/kubeconfig` and keeps the box running; the
foreground follows its log and prints where the kubeconfig and the logs are. `down` stops the
holder, which tears down everything it made (hosts, namespaces, vcsim, the mirror), and removes
`.box/`. Linux and root only: the box is network and mount namespaces.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BOX_ROOT = REPO / ".box"
UP_TIMEOUT_S = 3600


def _pid(root: Path) -> int | None:
    try:
        pid = int((root / "holder.pid").read_text())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    return pid


def hold(root: Path) -> int:
    """The holder: open the box, `make up`, then wait for `down` (SIGTERM)."""
    from tests.test_lab_box import open_box

    stop = {"requested": False}

    def on_term(*_: object) -> None:
        stop["requested"] = True

    signal.signal(signal.SIGTERM, on_term)
    status = root / "status.json"
    with open_box(root / "run") as box:
        lab = box.lab
        print(f"box: vcsim and the mirror are up; `make up` runs now (CLI output: {lab.artifacts})", flush=True)
        up = lab.make("up", args="--yes", timeout=UP_TIMEOUT_S, cli_parallel=True)
        facts: dict[str, object] = {"ok": up.ok, "log": str(up.log), "artifacts": str(lab.artifacts),
                                    "netns": lab.netns, "workspace": str(lab.workspace)}  # fmt: skip
        if up.ok:
            shown = lab.pulumi("stack", "output", "--stack", lab.stack, "--show-secrets", "kubeconfig")
            kubeconfig = root / "kubeconfig"
            kubeconfig.touch(mode=0o600)
            kubeconfig.write_text(shown.stdout)
            facts["kubeconfig"] = str(kubeconfig)
        status.write_text(json.dumps(facts))
        while not stop["requested"]:
            time.sleep(1)
        print("box: stopping", flush=True)
    return 0


def up(root: Path) -> int:
    if os.geteuid() != 0 or sys.platform != "linux":
        print("make box: the lab in a box needs Linux and root (network and mount namespaces): sudo make box",
              file=sys.stderr)  # fmt: skip
        return 2
    if _pid(root) is not None:
        print(f"make box: a box is running already ({root}); `make box-down` removes it", file=sys.stderr)
        return 2
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    log = root / "holder.log"
    with open(log, "w") as out:
        holder = subprocess.Popen(
            [sys.executable, "-m", "tests.box_cli", "hold", str(root)],
            cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    (root / "holder.pid").write_text(str(holder.pid))
    print(f"make box: starting the box (log: {log})", flush=True)
    status = root / "status.json"
    deadline = time.monotonic() + UP_TIMEOUT_S + 600
    while not status.exists():
        if holder.poll() is not None or time.monotonic() > deadline:
            print(f"make box: the box stopped before `make up` finished; see {log}", file=sys.stderr)
            print(log.read_text()[-3000:], file=sys.stderr)
            return 1
        time.sleep(2)
    facts = json.loads(status.read_text())
    if not facts["ok"]:
        print(f"make box: `make up` failed in the box; its output: {facts['log']}; `make box-down` removes the box",
              file=sys.stderr)  # fmt: skip
        return 1
    print(f"""make box: the lab is up.
  kubeconfig:  {facts["kubeconfig"]}   (its server is the VIP, reachable inside the box's namespace:
               sudo ip netns exec {facts["netns"]} curl --cacert ... https://VIP:6443/ ...)
  CLI output:  {facts["artifacts"]}
  host logs:   {root}/run/hosts/<VM>-<uuid>/upper/var/log/labs-k8s-* (boot, sshd, units), and the
               steps' own logs under upper/var/lib/labs-k8s/steps/ (root-only, as on a node)
  the stack:   {facts["workspace"]} (sudo ip netns exec {facts["netns"]} ... pulumi, as `make up` ran it)
  remove it:   make box-down""")
    return 0


def down(root: Path) -> int:
    pid = _pid(root)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 300
        while _pid(root) is not None and time.monotonic() < deadline:
            time.sleep(1)
        if _pid(root) is not None:
            os.killpg(pid, signal.SIGKILL)
    shutil.rmtree(root, ignore_errors=True)
    print("make box-down: the box is gone" if pid is not None else "make box-down: no box was running")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.box_cli")
    parser.add_argument("action", choices=("up", "down", "hold"))
    parser.add_argument("root", nargs="?", type=Path, default=BOX_ROOT)
    args = parser.parse_args(argv)
    return {"up": up, "down": down, "hold": hold}[args.action](args.root)


if __name__ == "__main__":
    sys.exit(main())
