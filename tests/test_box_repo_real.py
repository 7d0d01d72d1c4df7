"""The box's signed repositories with the real packages (tests/box_repo.py `build(real=True)`): the
programs tests/kube_programs.py builds, packaged with the real packages' names, versions, Depends,
units and conffiles; apt resolves and fetches them through the mirror with their signatures checked,
and every program in them runs and reports its version."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import box_repo, kube_programs
from tests.box_repo import BoxRepo, upstream
from tests.requirements import require_tool, unavailable
from tests.test_box_repo import NODE_STATUS, TOOLS, Apt, keyrings
from tests.test_box_repo import mirror as _mirror_fixture

# What a Debian 12 node has besides NODE_STATUS that containerd.io depends on.
REAL_NODE_STATUS = {"libc6": "2.36-9+deb12u10", "libseccomp2": "2.5.4-1+b3"}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> BoxRepo:
    require_tool(*TOOLS)
    try:
        return box_repo.build(tmp_path_factory.mktemp("cache"), real=True)
    except (kube_programs.BuildError, RuntimeError) as error:
        unavailable(f"the real packages could not be built: {error}")
        raise AssertionError("unreachable") from error


mirror = _mirror_fixture


@pytest.fixture
def apt(repo: BoxRepo, mirror: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Apt]:
    monkeypatch.setattr("tests.test_box_repo.NODE_STATUS", {**NODE_STATUS, **REAL_NODE_STATUS})
    address, _ = mirror
    apt = Apt(tmp_path, proxy=address)
    kubernetes_key, docker_key = keyrings(repo, tmp_path)
    minor = max(repo.kubernetes_versions)
    apt.sources(
        f"deb [signed-by={kubernetes_key}] {repo.kubernetes_url(address)}/v{minor}/deb/ /",
        f"deb [arch=amd64 signed-by={docker_key}] {repo.containerd_url(address)} bookworm stable",
    )
    updated = apt.run("apt-get", "update")
    assert updated.returncode == 0, updated.stderr
    yield apt


def _fetch(apt: Apt, *packages: str) -> dict[str, Path]:
    fetched = apt.run("apt-get", "install", "--download-only", "-y", "--no-install-recommends", *packages)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    debs = sorted((apt.work / "cache" / "archives").glob("*.deb"))
    return {deb.name.split("_")[0]: deb for deb in debs}


def _field(deb: Path, name: str) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb), name], capture_output=True, text=True, check=True).stdout.strip()


def test_apt_resolves_the_real_packages_and_each_program_reports_its_version(apt: Apt, repo: BoxRepo, tmp_path: Path):
    minor = max(repo.kubernetes_versions)
    version = repo.kubernetes_versions[minor]
    (containerd,) = repo.containerd_versions
    # prepare-node.sh names cri-tools itself: kubeadm has no Depends since 1.32 (metadata.yaml).
    wanted = ("kubeadm", "kubelet", "kubectl")
    debs = _fetch(apt, *(f"{name}={version}" for name in wanted), "cri-tools", f"containerd.io={containerd}")
    assert set(debs) == {"kubeadm", "kubelet", "kubectl", "kubernetes-cni", "cri-tools", "containerd.io"}
    assert _field(debs["kubelet"], "Depends") == "iptables (>= 1.4.21), kubernetes-cni (>= 1.2.0), mount, util-linux"
    assert _field(debs["containerd.io"], "Depends") == "libc6, libseccomp2"
    root = tmp_path / "root"
    for deb in debs.values():
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    reported = {
        "kubeadm": (["usr/bin/kubeadm", "version", "-o", "short"], f"v{upstream(version)}"),
        "kubelet": (["usr/bin/kubelet", "--version"], f"Kubernetes v{upstream(version)}"),
        "kubectl": (["usr/bin/kubectl", "version", "--client"], f"v{upstream(version)}"),
        "crictl": (["usr/bin/crictl", "--version"], kube_programs.entry("cri-tools")["version"]),
        "containerd": (["usr/bin/containerd", "--version"], upstream(containerd)),
        "runc": (["usr/bin/runc", "--version"], "runc version 1.1.5"),
        "bridge": (["opt/cni/bin/bridge"], kube_programs.entry("cni-plugins")["version"]),
    }
    for name, (argv, expected) in reported.items():
        run = subprocess.run([str(root / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=60, check=False)
        assert expected in run.stdout + run.stderr, f"{name}: {run.stdout}{run.stderr}"
    # The units and conffiles the steps rely on: the kubelet's, kubeadm's drop-in, containerd's, and
    # containerd.io's config.toml with the CRI disabled, which prepare-node.sh must replace.
    assert (root / "lib/systemd/system/kubelet.service").read_text() == box_repo.KUBELET_SERVICE
    assert (root / "lib/systemd/system/kubelet.service.d/10-kubeadm.conf").read_text() == box_repo.KUBEADM_DROPIN
    assert 'disabled_plugins = ["cri"]' in (root / "etc/containerd/config.toml").read_text()


def test_the_real_packages_carry_no_stand_in(repo: BoxRepo, tmp_path: Path) -> None:
    for deb in repo.debs():
        listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
        assert box_repo.STANDIN_LIB not in listing, deb.name
        assert "stand-in" not in _field(deb, "Description"), deb.name
        for depends in box_repo.STANDIN_DEPENDS:
            assert depends not in _field(deb, "Depends").split(", "), deb.name
