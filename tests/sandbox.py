"""A copy of the repository with its own HOME and a fake `pulumi` (tests/fake_pulumi.py) on PATH.

What a new user's machine looks like to `make up`: the project's files (tracked and new, never
ignored ones such as someone's own Pulumi.<site>.yaml), the already-built .venv (linked, so no
test installs anything), an empty HOME, and a PATH with only system directories and, when a
test wants it, the fake CLI. The fake's state and its log of invocations live in the sandbox.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from components.tools.offline import REPO_ROOT

FAKE_PULUMI = REPO_ROOT / "tests" / "fake_pulumi.py"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def project_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO_ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [name for name in listed.split("\0") if name and (REPO_ROOT / name).is_file()]


@dataclass
class Sandbox:
    root: Path
    with_cli: bool = True
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.repo = self.root / "repo"
        self.home = self.root / "home"
        self.bin = self.root / "bin"
        self.state = self.root / "fake-pulumi"
        for name in project_files():
            target = self.repo / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, target)  # keeps mtimes: make must find .venv up to date
        (self.repo / ".venv").symlink_to(REPO_ROOT / ".venv")
        self.home.mkdir()
        self.bin.mkdir()
        if self.with_cli:
            self.install_cli()
        self.env = {
            "HOME": str(self.home),
            "PATH": f"{self.bin}:{SYSTEM_PATH}",
            "FAKE_PULUMI_HOME": str(self.state),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "TERM": "dumb",
            **self.env,
        }

    def install_cli(self) -> None:
        wrapper = self.bin / "pulumi"
        wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE_PULUMI} "$@"\n')
        wrapper.chmod(0o755)

    def run(self, script: str, stdin: str = "", timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
        """`bash -euo pipefail` on a script file, in the repository copy, with the sandbox's environment."""
        path = self.root / "script.sh"
        path.write_text(script)
        return subprocess.run(
            ["bash", "-euo", "pipefail", str(path)],
            cwd=self.repo,
            input=stdin,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def make(self, *args: str, stdin: str = "", **env: str) -> subprocess.CompletedProcess[str]:
        return self.run("make " + " ".join(args) + "\n", stdin=stdin, **env)

    def calls(self) -> list[list[str]]:
        log = self.state / "calls.jsonl"
        if not log.is_file():
            return []
        return [json.loads(line)["argv"] for line in log.read_text().splitlines()]

    def parallels(self) -> list[str | None]:
        """PULUMI_PARALLEL as each invocation of the fake saw it (None: unset)."""
        log = self.state / "calls.jsonl"
        return [json.loads(line).get("parallel") for line in log.read_text().splitlines()]

    def commands(self) -> list[str]:
        """The fake's invocations as `pulumi <sub> [<sub>]` words, in order."""
        words = []
        for argv in self.calls():
            positional = [a for a in argv if not a.startswith("-")]
            words.append(" ".join(positional[:2]) if positional[:1] in (["stack"], ["config"]) else positional[0])
        return words

    def stack_file(self, stack: str) -> Path:
        return self.repo / f"Pulumi.{stack}.yaml"
