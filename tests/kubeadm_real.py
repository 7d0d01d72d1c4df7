"""The real kubeadm, one per Kubernetes minor in tests/tools/kubeadm/manifest.json.

`bin_dir()` builds (or finds cached) what tests/tools/build_kubeadm.sh builds from the Go module
proxy: a directory holding `kubeadm-<minor>` for every minor of the manifest. `binary(minor)` is one
of them. Without Go or the proxy the build fails: the calling test skips on a laptop, fails under
CI=true (tests/requirements.py).

The shell harnesses hand the directory to the stand-in kubeadm (tests/kube_standin.py) in
REAL_KUBEADM_DIR_ENV, so the stand-in refuses a config the real kubeadm refuses.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

from tests.requirements import unavailable

REPO_ROOT = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO_ROOT / "tests" / "tools" / "build_kubeadm.sh"
MANIFEST = REPO_ROOT / "tests" / "tools" / "kubeadm" / "manifest.json"
# The variable the shell harnesses set for the stand-in kubeadm: the directory of kubeadm-<minor>.
REAL_KUBEADM_DIR_ENV = "HARNESS_REAL_KUBEADM_DIR"
_built: list[Path] = []
_failed: list[str] = []


def manifest() -> dict[str, Any]:
    return json.loads(MANIFEST.read_text())


def minors() -> list[str]:
    """The minors a kubeadm is built for, "1.35", "1.36", ..., in the manifest's order."""
    return [entry["minor"] for entry in manifest()["kubeadm"]]


def version_of(minor: str) -> str:
    """The kubeadm version built for `minor` ("v1.36.3")."""
    (entry,) = [entry for entry in manifest()["kubeadm"] if entry["minor"] == minor]
    return str(entry["version"])


def build() -> Path | None:
    """The directory of the built kubeadm binaries, or None when they cannot be built here (the
    reason is in `build_failure()`). Built once per session; a warm cache answers in a second."""
    if not _built and not _failed:
        proc = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=3600, check=False)
        if proc.returncode == 0:
            _built.append(Path(proc.stdout.strip().splitlines()[-1]))
        else:
            _failed.append(f"tests/tools/build_kubeadm.sh failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return _built[0] if _built else None


def build_failure() -> str:
    return _failed[0] if _failed else ""


def bin_dir() -> Path:
    """The directory of the built kubeadm binaries; skips (laptop) or fails (CI) without them."""
    built = build()
    if built is None:
        unavailable(build_failure())
        raise AssertionError("unreachable")  # unavailable() raises
    return built


def binary(minor: str) -> Path:
    return bin_dir() / f"kubeadm-{minor}"


def minor_of(version: str) -> str:
    """ "1.36.0" or "v1.36.0" -> "1.36"."""
    match = re.match(r"^v?(1\.\d+)\.\d+$", version)
    if match is None:
        raise ValueError(f"not a Kubernetes version: {version!r}")
    return match.group(1)
