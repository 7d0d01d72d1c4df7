"""A user's installed Pulumi instead of compiling one (tests/tools/build_toolchain.sh, issue #51).

Where `pulumi` on PATH is exactly the pinned CLI, its Python language host the pinned one, and
`pulumi plugin ls --json` lists the vsphere, command and random resource plugins at exactly the
pinned versions, build_toolchain.sh compiles nothing: it prints a directory of links to them (the
layout the source build makes: the CLI and its bundled scripts in bin/, plugins.json beside it).
Any mismatch is said in one line, and the source build runs as before; LABS_K8S_BUILD_PULUMI=1
forces it (CI does). Stdlib only: `make box` runs it under the machine's python3 before any install.

Where the pinned CLI (pkg/v3 and sdk/v3 v3.274.1) looks, and so where this looks:
- `pulumi plugin ls` lists the plugin cache only, `$PULUMI_HOME/plugins` or `~/.pulumi/plugins` of
  the user the process runs as (cmd/pulumi/plugin/plugin_list.go, util/pulumihome Dir: `user.Current()`,
  so under sudo root's), each plugin in `<kind>-<name>-v<version>/pulumi-<kind>-<name>`
  (workspace PluginDescriptor.Dir/File); its JSON has no path.
- the python language host is "bundled": the engine takes `pulumi-language-python` from PATH, else
  from beside the real `pulumi` (workspace getPluginInfoAndPath, IsPluginBundled); the host itself
  runs `pulumi-language-python-exec` from beside its own real path (its main.go, os.Executable).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

FORCE = "LABS_K8S_BUILD_PULUMI"
SCRIPTS = ("pulumi-language-python-exec", "pulumi-resource-pulumi-python")


class Installed(NamedTuple):
    """The installed binaries the box links to: name -> path, and plugins.json's entries."""

    binaries: dict[str, str]
    plugins: list[dict[str, str]]


def pins(manifest: dict[str, Any]) -> tuple[str, str, dict[str, str]]:
    """The CLI's version, the language host's as a release ships it, and each resource plugin's."""
    entries = {entry["name"]: entry for entry in manifest["binaries"]}
    host = entries["pulumi-language-python"]
    plugins = {e["plugin"]: e["version"] for e in manifest["binaries"] if e.get("kind") == "resource"}
    return entries["pulumi"]["version"], host.get("installed_version", host["version"]), plugins


def pulumi_home(environ: Mapping[str, str]) -> Path:
    """PULUMI_HOME, else ~/.pulumi of the user this runs as (from the password database, as Go's
    user.Current does: not $HOME)."""
    if environ.get("PULUMI_HOME"):
        return Path(environ["PULUMI_HOME"])
    return Path(pwd.getpwuid(os.getuid()).pw_dir) / ".pulumi"


def _output(argv: list[str], environ: Mapping[str, str]) -> str | None:
    # The CLI must not look for updates (a network call) while it is only asked its version.
    env = {**environ, "PULUMI_SKIP_UPDATE_CHECK": "true"}
    try:
        run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return run.stdout.strip() if run.returncode == 0 else None


def find(manifest: dict[str, Any], environ: Mapping[str, str]) -> tuple[Installed | None, str]:
    """The installed toolchain if every version is the pinned one, and a short line saying what is
    used or why not (which version differs)."""
    cli, host_version, plugins = pins(manifest)
    if environ.get(FORCE) == "1":
        return None, f"{FORCE}=1"
    path = environ.get("PATH", "")
    pulumi = shutil.which("pulumi", path=path)
    if pulumi is None:
        return None, "no pulumi on PATH"
    version = _output([pulumi, "version"], environ)
    if version != cli:
        return None, f"{pulumi} is {version or 'unknown'}, the pins need {cli}"
    real_dir = Path(os.path.realpath(pulumi)).parent
    binaries = {"pulumi": pulumi}
    for name in ("pulumi-language-python", *SCRIPTS):
        found = shutil.which(name, path=path) or shutil.which(name, path=str(real_dir))
        if found is None:
            return None, f"no {name} on PATH or beside {pulumi}"
        binaries[name] = found
    host = binaries["pulumi-language-python"]
    version = _output([host, "-version"], environ)
    if version != host_version:
        return None, f"{host} is {version or 'unknown'}, the pins need {host_version}"
    if not (Path(os.path.realpath(host)).parent / SCRIPTS[0]).is_file():
        return None, f"no {SCRIPTS[0]} beside {os.path.realpath(host)} (the host runs it from there)"
    listed = _output([pulumi, "plugin", "ls", "--json"], environ)
    try:
        cached = json.loads(listed or "")
    except ValueError:
        return None, "`pulumi plugin ls --json` failed or printed no JSON"
    home = pulumi_home(environ)
    chosen = []
    for name, want in plugins.items():
        have = sorted(p.get("version", "") for p in cached if p.get("kind") == "resource" and p.get("name") == name)
        binary = home / "plugins" / f"resource-{name}-v{want}" / f"pulumi-resource-{name}"
        if want not in have or not os.access(binary, os.X_OK):
            listed_versions = ", ".join(have) or "none"
            return None, f"the resource plugin {name} is not installed at {want} (pulumi plugin ls: {listed_versions})"
        chosen.append({"kind": "resource", "name": name, "version": want, "path": str(binary)})
    named = ", ".join(f"{p['name']} {p['version']}" for p in chosen)
    return Installed(binaries, chosen), f"the installed Pulumi {cli} ({pulumi}) and plugins {named}: nothing to compile"


def link(installed: Installed, out: Path) -> Path:
    """`out`/bin with links to the installed binaries and `out`/plugins.json, the source build's
    layout (tests/pulumi_engine.py installs plugins.json's into each box's own PULUMI_HOME)."""
    bin_dir = out / "bin"
    shutil.rmtree(out, ignore_errors=True)
    bin_dir.mkdir(parents=True)
    for name, path in installed.binaries.items():
        (bin_dir / name).symlink_to(os.path.realpath(path))
    (out / "plugins.json").write_text(json.dumps(installed.plugins, indent=2) + "\n")
    return bin_dir


def main(argv: list[str]) -> int:
    """`installed_toolchain.py MANIFEST OUT`: exit 0 with OUT filled when the installed toolchain
    is used, 1 when the source build must run; one line on stderr either way."""
    manifest, out = json.loads(Path(argv[0]).read_text()), Path(argv[1])
    installed, line = find(manifest, os.environ)
    if installed is None:
        print(f"build_toolchain: {line}: building the Pulumi CLI and plugins from source", file=sys.stderr)
        return 1
    print(f"build_toolchain: {line}", file=sys.stderr)
    link(installed, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
