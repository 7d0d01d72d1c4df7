"""The machine's own kernel settings, as `sysctl -a` shows them outside every box host: what no test
may change (fs.protected_*, kernel.*, vm.* are not namespaced; a host's net.* is its own)."""

from __future__ import annotations

import re
import subprocess

# Left out: counters that move by themselves on a busy machine, and net.*, per network namespace
# (the box beside the suite adds and removes interface keys in the machine's while a test runs).
VOLATILE = re.compile(
    r"^(fs\.(dentry-state|inode-nr|inode-state|file-nr|aio-nr|quota\..*)"
    r"|kernel\.(ns_last_pid|random\..*|pty\.nr)|net\..*|vm\.(nr_.*|stat_refresh)|fs\.fanotify\..*count.*) = ",
    re.M,
)


def settings(sysctl_a: str) -> dict[str, str]:
    """`sysctl -a`'s settings, less the counters that move by themselves."""
    lines = (line for line in sysctl_a.splitlines() if " = " in line and not VOLATILE.match(line))
    return dict(line.split(" = ", 1) for line in lines)


def machine_sysctls() -> dict[str, str]:
    return settings(subprocess.run(["sysctl", "-a"], capture_output=True, text=True, check=False).stdout)


def changed(before: dict[str, str], after: dict[str, str]) -> dict[str, tuple[str | None, str | None]]:
    """Each setting that differs: (before, after)."""
    return {key: (before.get(key), after.get(key)) for key in before.keys() | after.keys()
            if before.get(key) != after.get(key)}  # fmt: skip
