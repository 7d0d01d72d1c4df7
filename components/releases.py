"""Does `labs-k8s:kubernetes.version` exist? Asked of the package repository the nodes install from.

The nodes install kubeadm, kubelet and kubectl `<version>-*` from the repository of the minor under
`labs-k8s:mirrors.kubernetesRepository.url`, pkgs.k8s.io's by default (cloudinit/k8s/prepare-node.sh).
A patch release that does not exist (1.36.9 when 1.36.3 is the newest) otherwise fails there, after
the template build and the clones: 30+ minutes in. The repository's `Packages` index lists every
version it has, so preflight reads that one file from the machine that runs Pulumi (which has
internet access, or reaches the mirror) and knows in a second.

Not reachable (no internet, a proxy, a timeout) is a warning, not an error: the check cannot tell.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from dataclasses import dataclass

from components.config import KUBERNETES_REPOSITORY_URL

DEFAULT_REPOSITORY = KUBERNETES_REPOSITORY_URL
PACKAGES = ("kubeadm", "kubelet", "kubectl")
TIMEOUT_S = 20
# pkgs.k8s.io answers a minor it does not have with 403 (its CDN) or 404.
NOT_THERE = (403, 404, 410)


@dataclass(frozen=True)
class ReleaseFinding:
    error: bool  # False: a warning (the check could not decide)
    message: str


def packages_index_url(repository: str, minor: str) -> str:
    return f"{repository.rstrip('/')}/v{minor}/deb/Packages"


def versions_in_index(text: str) -> dict[str, set[str]]:
    """Package name -> versions, from a Debian `Packages` index."""
    found: dict[str, set[str]] = {}
    for stanza in re.split(r"\n\s*\n", text):
        name = re.search(r"^Package:\s*(\S+)", stanza, flags=re.M)
        version = re.search(r"^Version:\s*(\S+)", stanza, flags=re.M)
        if name and version:
            found.setdefault(name.group(1), set()).add(version.group(1))
    return found


def _patch_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version.split("-", 1)[0]))


def check_release(
    version: str, repository: str = DEFAULT_REPOSITORY, timeout_s: float = TIMEOUT_S
) -> ReleaseFinding | None:
    """None when kubeadm, kubelet and kubectl `<version>-*` are all in the repository."""
    minor = ".".join(version.split(".")[:2])
    url = packages_index_url(repository, minor)
    key = "labs-k8s:kubernetes.version"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            text = response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as error:
        if error.code in NOT_THERE:
            return ReleaseFinding(
                True,
                f"{key}: {version}: there is no Kubernetes {minor} package repository "
                f"({url}: HTTP {error.code}), so {minor} is not released (yet); pick a "
                "released version (https://kubernetes.io/releases/)",
            )
        return ReleaseFinding(False, f"could not check that Kubernetes {version} exists ({url}: HTTP {error.code})")
    except (OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        return ReleaseFinding(
            False,
            f"could not check that Kubernetes {version} exists ({url}: {reason}); "
            "if it does not, the nodes' package installation fails",
        )
    available = versions_in_index(text)
    missing = [p for p in PACKAGES if not any(v.startswith(f"{version}-") for v in available.get(p, ()))]
    if not missing:
        return None
    releases = sorted({v.split("-", 1)[0] for v in available.get("kubeadm", ())}, key=_patch_key)
    listed = ", ".join(releases[-8:]) if releases else "none"
    return ReleaseFinding(
        True,
        f"{key}: {version} does not exist: the {minor} repository ({url}) has no "
        f"{', '.join(missing)} {version}. Releases there: {listed}"
        + (f"; the newest is {releases[-1]}" if releases else ""),
    )
