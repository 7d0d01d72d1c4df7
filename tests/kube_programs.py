"""The real programs of a Kubernetes node, built from the Go module proxy (tests/tools/kube/manifest.json).

`python -m tests.kube_programs pin NAME` writes a build's wrapper module; `build [NAME ...]` builds
(or finds cached) each entry under .cache/kube/<name>/<key>/ and checks the version every binary
reports. The key digests the entry, its wrapper module and the Go version: a new pin rebuilds that
entry only. Why wrappers and how each is stamped: the manifest's `about`, docs/testing.md.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
TOOLS = REPO_ROOT / "tests" / "tools"
MANIFEST = TOOLS / "kube" / "manifest.json"
CACHE = REPO_ROOT / ".cache" / "kube"


# Where the snapshots are, as tests/tools/build_plugins.sh looks for them: LABS_K8S_THIRD_PARTY, else
# LABS_K8S_THIRD_PARTY, else ../shared/third_party beside the checkout, or beside the checkout it was
# cloned from (a clean clone in /tmp), as tests/tools/build_plugins.sh looks; no path of one machine.
def _origin() -> Path:
    url = subprocess.run(["git", "-C", str(REPO_ROOT), "remote", "get-url", "origin"],
                         capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip
    return Path(url) if url and Path(url).is_dir() else REPO_ROOT


THIRD_PARTY_CANDIDATES = (os.environ.get("LABS_K8S_THIRD_PARTY", ""), str(REPO_ROOT.parent / "shared" / "third_party"),
                          str(_origin().parent / "shared" / "third_party"))  # fmt: skip


def third_party() -> Path:
    for candidate in THIRD_PARTY_CANDIDATES:
        if candidate and (Path(candidate) / "MANIFEST.json").is_file():
            return Path(candidate)
    raise BuildError(f"no third_party snapshots (tried {', '.join(c for c in THIRD_PARTY_CANDIDATES if c)}): "
                     "set LABS_K8S_THIRD_PARTY to the directory holding MANIFEST.json")  # fmt: skip


# A build's log, kept beside its output; a failure prints its tail.
LOG_NAME = "build.log"


class BuildError(RuntimeError):
    pass


def manifest() -> dict[str, Any]:
    return json.loads(MANIFEST.read_text())


def entry(name: str) -> dict[str, Any]:
    found = [build for build in manifest()["builds"] if build["name"] == name]
    if not found:
        raise BuildError(f"no build named {name!r} in {MANIFEST.relative_to(REPO_ROOT)}")
    return found[0]


def go_binary() -> str:
    proc = subprocess.run(
        ["bash", "-c", f"source {TOOLS / 'go_env.sh'} && go_binary"], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise BuildError(proc.stderr.strip())
    return proc.stdout.strip()


def wrapper_dir(build: dict[str, Any]) -> Path:
    return TOOLS / "kube" / build["name"]


def _run(cmd: list[str], cwd: Path, log: Path | None = None, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, check=False)
    if log is not None:
        with log.open("a") as out:
            out.write(f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}\n")
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(cmd[:4])}... in {cwd} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout


def _packages(build: dict[str, Any]) -> list[tuple[str, str]]:
    """(import path, binary name) of each program of the build."""
    out = []
    for spec in build.get("packages", []):
        path, _, binary = spec.partition("=")
        full = path if "." in path.split("/")[0] else f"{build['module']}/{path}"
        out.append((full, binary or full.rsplit("/", 1)[-1]))
    return out


def _module_dir(go: str, module: str, version: str, cwd: Path) -> Path:
    info = json.loads(_run([go, "mod", "download", "-json", f"{module}@{version}"], cwd))
    return Path(info["Dir"])


def _write_main_copy(go: str, build: dict[str, Any], wrapper: Path) -> Path:
    """Copy the upstream main package's file into the wrapper (never committed: .gitignore), less the
    one import the manifest drops (a backend whose SDK the proxy refuses; the docs say which)."""
    spec = build["main_copy"]
    source = _module_dir(go, build["module"], build["version"], wrapper) / spec["file"]
    text = source.read_text()
    dropped = f'\t_ "{spec["drop_import"]}"\n'
    if dropped not in text:
        raise BuildError(f"{source} no longer imports {spec['drop_import']}: review the manifest's main_copy")
    target = wrapper / "cmd" / spec["binary"] / "main.go"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text.replace(dropped, ""))
    return target


def pin(name: str) -> None:
    """(Re)write the wrapper module of one build: go.mod requiring the pinned version, go.sum."""
    build, go = entry(name), go_binary()
    wrapper = wrapper_dir(build)
    wrapper.mkdir(parents=True, exist_ok=True)
    for stale in ("go.mod", "go.sum"):
        (wrapper / stale).unlink(missing_ok=True)
    imports = [path for path, _ in _packages(build)]
    lines = "\n".join(f'\t_ "{path}"' for path in imports)
    (wrapper / "tools.go").write_text(
        f"//go:build tools\n\n// {name}: {build['module']} {build['version']}"
        f" (tests/tools/kube/manifest.json, tests/kube_programs.py).\npackage tools\n\n"
        + (f"import (\n{lines}\n)\n" if lines else "")
    )
    _run([go, "mod", "init", f"labs-k8s/tests/tools/kube/{name}"], wrapper)
    edits = ["-require", f"{build['module']}@{build['version']}"]
    for also in build.get("also", []):
        edits += ["-require", f"{also}@{build['version']}"]
    if build.get("staging"):
        # k8s.io/kubernetes replaces its staging modules with ./staging paths a dependent cannot see;
        # they are published at v0.MINOR.PATCH (go.dev/ref/mod#go-mod-file-replace).
        staging = "v0." + build["version"].split(".", 1)[1]
        upstream_mod = json.loads(
            _run([go, "mod", "download", "-json", f"{build['module']}@{build['version']}"], wrapper)
        )["GoMod"]
        for module in re.findall(r"^\s*(k8s\.io/\S+) => \./staging/", Path(upstream_mod).read_text(), re.M):
            edits += ["-replace", f"{module}={module}@{staging}"]
    _run([go, "mod", "edit", *edits], wrapper)
    if "main_copy" in build:
        _write_main_copy(go, build, wrapper)
    env = {**os.environ, "GOFLAGS": "-mod=mod"}
    # -e: a dependency's tests may import a module the proxy refuses (flannel's pkg/subnet/etcd tests:
    # go.etcd.io/etcd/tests/v3); the build (-mod=readonly) still fails on anything the programs need.
    _run([go, "mod", "tidy", "-e"], wrapper, env=env)
    print(f"kube_programs: pinned {name} at {build['version']} in {wrapper.relative_to(REPO_ROOT)}", file=sys.stderr)


def cache_key(build: dict[str, Any], go: str) -> str:
    digest = hashlib.sha256(json.dumps(build, sort_keys=True).encode())
    digest.update(_run([go, "env", "GOVERSION"], REPO_ROOT).encode())
    if "module" in build:
        wrapper = wrapper_dir(build)
        for name in ("go.mod", "go.sum", "tools.go"):
            digest.update((wrapper / name).read_bytes())
    return digest.hexdigest()[:16]


def _extract_archive(build: dict[str, Any], into: Path) -> Path:
    """A module the proxy refuses, from its snapshot in ../shared/third_party, checked against the
    sha256 the manifest pins before anything is extracted."""
    archive = third_party() / build["archive"]["file"]
    if not archive.is_file():
        raise BuildError(f"{archive} is missing (../shared/third_party holds the modules the Go proxy refuses)")
    if hashlib.sha256(archive.read_bytes()).hexdigest() != build["archive"]["sha256"]:
        raise BuildError(f"{archive}'s sha256 is not the one tests/tools/kube/manifest.json pins")
    source = into / "src"
    source.mkdir(parents=True)
    _run(["tar", "-xzf", str(archive), "-C", str(source)], into)
    return source


def _build_pause(build: dict[str, Any], go: str, out: Path, log: Path) -> None:
    """pause from the kubernetes module's build/pause/linux/pause.c, as its Makefile builds it."""
    spec = build["c_source"]
    source = _module_dir(go, spec["module"], spec["version"], REPO_ROOT) / spec["file"]
    _run(
        [
            "gcc",
            "-Os",
            "-Wall",
            "-Werror",
            "-static",
            f"-DVERSION=v{build['version']}-0",
            "-o",
            str(out / "bin" / "pause"),
            str(source),
        ],
        out,
        log,
    )


def _ldflags(build: dict[str, Any], go: str, wrapper: Path) -> list[str]:
    flags = ["-s", "-w"]
    stamps = dict(build.get("x", {}))
    if build.get("stamp") == "kubernetes":
        # hack/lib/version.sh's stamps; without gitVersion kubeadm calls itself v0.0.0-master.
        version = build["version"]
        major, minor = version[1:].split(".")[:2]
        date = _run([go, "list", "-m", "-f", '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}', build["module"]], wrapper)
        for package in ("k8s.io/client-go/pkg/version", "k8s.io/component-base/version"):
            stamps |= {
                f"{package}.gitVersion": version,
                f"{package}.gitMajor": major,
                f"{package}.gitMinor": minor,
                f"{package}.buildDate": date.strip(),
                f"{package}.gitTreeState": "clean",
            }
    flags += [f"-X={name}={value}" for name, value in sorted(stamps.items())]
    return flags


def check_versions(build: dict[str, Any], bin_dir: Path) -> None:
    """Every binary reports the pinned version (a wrong stamp would otherwise surface as a kubeadm
    refusing a kubernetesVersion, much later)."""
    for binary, (args, expected) in build["checks"].items():
        proc = subprocess.run([str(bin_dir / binary), *args], capture_output=True, text=True, timeout=60, check=False)
        if expected not in proc.stdout + proc.stderr:
            raise BuildError(
                f"{binary} {' '.join(args)} printed {(proc.stdout + proc.stderr)[-400:]!r}, not {expected!r}"
            )


def build_one(name: str) -> Path:
    """The directory of one build's binaries, built first when its cache entry is missing (under a
    lock: the suite's workers may ask for the same build at once)."""
    (CACHE / name).mkdir(parents=True, exist_ok=True)
    with (CACHE / name / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_one(name)


def _build_one(name: str) -> Path:
    build, go = entry(name), go_binary()
    wrapper = wrapper_dir(build)
    if "module" in build and not (wrapper / "go.sum").is_file():
        raise BuildError(
            f"{wrapper.relative_to(REPO_ROOT)} has no go.sum: run python -m tests.kube_programs pin {name}"
        )
    key = cache_key(build, go)
    out = CACHE / name / key
    if (out / ".complete").is_file():
        return out / "bin"
    shutil.rmtree(out, ignore_errors=True)
    (out / "bin").mkdir(parents=True)
    log = out / LOG_NAME
    started = time.monotonic()
    env = {**os.environ, "CGO_ENABLED": "1" if build.get("cgo") else "0", "GOFLAGS": "-mod=readonly"}
    common = [go, "build", "-trimpath", "-ldflags", " ".join(_ldflags(build, go, wrapper))]
    if build.get("tags"):
        common += ["-tags", ",".join(build["tags"])]
    targets = [(path, binary) for path, binary in _packages(build)]
    workdir = wrapper
    if "main_copy" in build:
        main = _write_main_copy(go, build, wrapper)
        targets.append(("./" + str(main.parent.relative_to(wrapper)), build["main_copy"]["binary"]))
    if "archive" in build:
        workdir = _extract_archive(build, out)
        targets = [(".", build["archive"]["binary"])]
    if "c_source" in build:
        _build_pause(build, go, out, log)
    for path, binary in targets:
        _run(["nice", "-n", "10", *common, "-o", str(out / "bin" / binary), path], workdir, log, env)
    shutil.rmtree(out / "src", ignore_errors=True)
    check_versions(build, out / "bin")
    (out / "seconds").write_text(f"{time.monotonic() - started:.0f}\n")
    (out / ".complete").touch()
    for other in (CACHE / name).iterdir():  # older pins of this entry are never used again
        if other.name != key and other.is_dir():
            shutil.rmtree(other, ignore_errors=True)
    return out / "bin"


def build_all(names: list[str] | None = None) -> dict[str, Path]:
    wanted = names or [build["name"] for build in manifest()["builds"]]
    built = {}
    for name in wanted:
        started = time.monotonic()
        built[name] = build_one(name)
        print(f"kube_programs: {name} ready ({time.monotonic() - started:.0f}s) in {built[name]}", file=sys.stderr)
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.kube_programs")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("pin").add_argument("names", nargs="+")
    sub.add_parser("build").add_argument("names", nargs="*")
    args = parser.parse_args(argv)
    try:
        if args.command == "pin":
            for name in args.names:
                pin(name)
        else:
            for name, path in build_all(args.names).items():
                print(f"{name}\t{path}")
    except BuildError as error:
        print(f"kube_programs: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
