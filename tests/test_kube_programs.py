"""The node's real programs, built from the Go module proxy (tests/kube_programs.py): each reports the
version the manifest pins, and the pins are the ones kubeadm itself asks for."""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

from tests import kube_programs
from tests.requirements import unavailable

BUILDS = [build["name"] for build in kube_programs.manifest()["builds"]]
FULL_KUBERNETES = [
    build for build in kube_programs.manifest()["builds"] if "cmd/kube-apiserver" in build.get("packages", [])
]


@cache
def built(name: str) -> Path | str:
    try:
        return kube_programs.build_one(name)
    except kube_programs.BuildError as error:
        return str(error)


def bin_dir(name: str) -> Path:
    result = built(name)
    if isinstance(result, str):
        unavailable(f"tests/kube_programs.py could not build {name}: {result}")
        raise AssertionError("unreachable")
    return result


@pytest.mark.parametrize("name", BUILDS)
def test_each_program_is_built_and_reports_the_pinned_version(name: str) -> None:
    directory = bin_dir(name)
    build = kube_programs.entry(name)
    assert sorted(path.name for path in directory.iterdir()) == sorted(build["checks"])
    kube_programs.check_versions(build, directory)  # raises with what the binary printed


def test_the_version_check_can_fail() -> None:
    build = kube_programs.entry("kubernetes-1.35")
    wrong = {**build, "checks": {"kubeadm": [["version", "-o", "short"], "v1.35.99"]}}
    with pytest.raises(kube_programs.BuildError, match=re.escape("v1.35.99")):
        kube_programs.check_versions(wrong, bin_dir("kubernetes-1.35"))


@pytest.mark.parametrize("build", FULL_KUBERNETES, ids=[b["name"] for b in FULL_KUBERNETES])
def test_the_pins_are_what_that_kubeadm_pulls(build: dict[str, object]) -> None:
    """`kubeadm config images list` names the etcd, CoreDNS and pause each minor runs: the manifest
    pins those, and builds that etcd and that CoreDNS."""
    kubeadm = bin_dir(str(build["name"])) / "kubeadm"
    listed = subprocess.run(
        [str(kubeadm), "config", "images", "list", "--kubernetes-version", str(build["version"])],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    tags = dict(re.findall(r"^registry\.k8s\.io/(?:coredns/)?([a-z-]+):(\S+)$", listed, re.M))
    pins = build["pins"]
    assert isinstance(pins, dict)
    assert (tags["etcd"], tags["coredns"], tags["pause"]) == (pins["etcd"], pins["coredns"], pins["pause"]), listed
    for image in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy"):
        assert tags[image] == build["version"]
    versions = {(b["module"], b["version"]) for b in kube_programs.manifest()["builds"] if "module" in b}
    assert ("go.etcd.io/etcd/server/v3", "v" + pins["etcd"].split("-")[0]) in versions
    assert ("github.com/coredns/coredns", pins["coredns"]) in versions
    assert kube_programs.entry("pause")["version"] == pins["pause"]


@pytest.mark.parametrize("name", [b["name"] for b in kube_programs.manifest()["builds"] if "module" in b])
def test_each_wrapper_module_requires_the_pinned_version(name: str) -> None:
    build = kube_programs.entry(name)
    go_mod = (kube_programs.wrapper_dir(build) / "go.mod").read_text()
    assert re.search(rf"^\s*(require\s+)?{re.escape(build['module'])} {re.escape(build['version'])}\b", go_mod, re.M)
