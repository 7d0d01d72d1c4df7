"""The real kubeadm, one per Kubernetes minor the node programs are built for.

`bin_dir()` builds (or finds cached) the `kubernetes-<minor>` entries of tests/tools/kube/manifest.json
(tests/kube_programs.py, from the Go module proxy) and returns a directory of `kubeadm-<minor>` links
to them. `binary(minor)` is one of them. Without Go or the proxy the build fails: the calling test
skips on a laptop, fails under CI=true (tests/requirements.py).

The shell harnesses hand the directory to the stand-in kubeadm (tests/kube_standin.py) in
REAL_KUBEADM_DIR_ENV, so the stand-in refuses a config the real kubeadm refuses.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from tests import kube_programs
from tests.requirements import unavailable

# The variable the shell harnesses set for the stand-in kubeadm: the directory of kubeadm-<minor>.
REAL_KUBEADM_DIR_ENV = "HARNESS_REAL_KUBEADM_DIR"
LINKS = kube_programs.CACHE / "kubeadm-bin"
_built: list[Path] = []
_failed: list[str] = []


def _entries() -> list[dict[str, Any]]:
    builds = [b for b in kube_programs.manifest()["builds"] if b["name"].startswith("kubernetes-")]
    return sorted(builds, key=lambda b: int(b["name"].rsplit(".", 1)[1]))


def minors() -> list[str]:
    """The minors a kubeadm is built for, oldest first: "1.35", "1.36", ..."""
    return [b["name"].removeprefix("kubernetes-") for b in _entries()]


def version_of(minor: str) -> str:
    """The kubeadm version built for `minor` ("v1.36.5")."""
    (version,) = [b["version"] for b in _entries() if b["name"] == f"kubernetes-{minor}"]
    return str(version)


def build() -> Path | None:
    """The directory of kubeadm-<minor> links, or None when they cannot be built here (the reason is
    in `build_failure()`). Built once per session; a warm cache answers in a second."""
    if not _built and not _failed:
        try:
            built = kube_programs.build_all([b["name"] for b in _entries()])
        except kube_programs.BuildError as error:
            _failed.append(f"tests/kube_programs.py could not build kubeadm: {error}")
        else:
            LINKS.mkdir(parents=True, exist_ok=True)
            for name, directory in built.items():
                # By rename: the suite's two workers may both link at once.
                link = LINKS / f"kubeadm-{name.removeprefix('kubernetes-')}"
                staged = link.with_name(f".{link.name}.{os.getpid()}")
                staged.unlink(missing_ok=True)
                staged.symlink_to(directory / "kubeadm")
                staged.replace(link)
            _built.append(LINKS)
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
