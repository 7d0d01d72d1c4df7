"""TEST ONLY: the lab in a box's signed apt repositories of the Kubernetes and containerd stand-ins.

The Kubernetes steps add two apt repositories to a node (cloudinit/k8s/prepare-node.sh
configure_repositories, lib.sh use_kubernetes_repository): pkgs.k8s.io's, one flat repository per
minor (`deb [signed-by=…] <url>/v<minor>/deb/ /`, its key at `<url>/v<minor>/deb/Release.key`),
and Docker's (`deb [arch=amd64 signed-by=…] …/linux/debian bookworm stable`, its key at
`…/linux/debian/gpg`). They check each key's fingerprint, then install pinned versions with
apt-get and hold them. `build` makes both repositories, laid out and signed as the real ones are,
with the stand-in packages in place of the real ones:

- pkgs.k8s.io/core:/stable:/v1.35/deb/ and …/v1.36/deb/: kubeadm, kubelet and kubectl at
  `KUBERNETES_VERSIONS`, cri-tools and kubernetes-cni (prepare-node.sh installs both by name), each
  built with kubernetes/release's package templates as the model (cmd/krel/templates/latest: the
  files each ships, its Depends, the kubelet unit and kubeadm's drop-in);
- download.docker.com/linux/debian/ (dists/bookworm, component stable, pool under
  dists/bookworm/pool/stable/amd64/ as Docker's is): containerd.io at `CONTAINERD_VERSIONS`
  (components/config.py's default containerd_version and the next patch, for its upgrade step),
  with the unit and config.toml Docker's package ships (docker/containerd-packaging).

What is real: the packages are real .debs (dpkg-deb), the indices apt-ftparchive's, the Release
files signed (InRelease, Release.gpg) with a throwaway key per repository whose armoured public key
is published where the scripts fetch it, so apt checks signatures, hashes, versions and holds as it
does against the real repositories. What is simulated: what the packages contain. Each command is a
launcher, `/usr/bin/<command>`, that runs the stand-ins (tests/tools/box/standin/ and
tests/kube_standin.py, copied under /usr/lib/labs-k8s-standin/<package>/ with a release.json
naming the package and its version); the CNI plugins are shell stand-ins that only answer CNI's
VERSION command. The packages have no maintainer scripts: the steps enable and start containerd
and the kubelet themselves. Their Depends are the real package's (kubelet: iptables, kubernetes-cni,
mount, util-linux) plus what the stand-in code runs on (`STANDIN_DEPENDS`).

Deterministic: the same inputs give the same .deb bytes (SOURCE_DATE_EPOCH, every mtime set, root
owner, one compressor thread). The repositories are cached under the cache directory, keyed by a
hash of the inputs (this file, the stand-ins); the signing keys are new with each build (their
private halves are thrown away once the Release files are signed).

`python -m tests.apt_mirror serve … --repo <BoxRepo.root>` serves them next to the Debian snapshot.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import itertools
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from tests import kube_programs

REPO = Path(__file__).resolve().parents[1]
STANDIN = REPO / "tests" / "tools" / "box" / "standin"
KUBE_STANDIN = REPO / "tests" / "kube_standin.py"

# Where the repositories live under BoxRepo.root: the URL's host and path, as the mirror serves them.
KUBERNETES_PATH = "pkgs.k8s.io/core:/stable:"
CONTAINERD_PATH = "download.docker.com/linux/debian"
CODENAME = "bookworm"
ARCH = "amd64"

# kubeadm, kubelet and kubectl per minor repository; the upgrade goes from 1.35 to 1.36, the default
# labs-k8s:kubernetes.version (components/config.py).
KUBERNETES_VERSIONS = {"1.35": "1.35.4-1.1", "1.36": "1.36.0-1.1"}
# cri-tools follows the Kubernetes minor; kubernetes-cni (the CNI plugins) does not.
CRI_TOOLS_VERSIONS = {"1.35": "1.35.0-1.1", "1.36": "1.36.0-1.1"}
KUBERNETES_CNI_VERSION = "1.7.1-1.1"
# containerd.io: labs-k8s:kubernetes.containerdVersion's default (2.2.1) and the next patch.
CONTAINERD_VERSIONS = ("2.2.1-1~debian.12~bookworm", "2.2.2-1~debian.12~bookworm")

# What the stand-in code needs on the node (python3 runs it, kubeadm reads YAML, the stand-ins call
# openssl and ip): Debian packages every node has already (cloud-init, ca-certificates, ifupdown).
STANDIN_DEPENDS = ("python3", "python3-yaml", "openssl", "iproute2")
# The plugins containernetworking/plugins' release tarball holds (kubernetes-cni ships them all).
CNI_PLUGINS = (
    "bandwidth", "bridge", "dhcp", "dummy", "firewall", "host-device", "host-local", "ipvlan",
    "loopback", "macvlan", "portmap", "ptp", "sbr", "static", "tap", "tuning", "vlan", "vrf",
)  # fmt: skip

# The real packages (`build(cache, real=True)`): the binaries tests/kube_programs.py builds, one
# pkgs.k8s.io repository per minor the box runs (the default and the one a lab upgrades from).
REAL_MINORS = {"1.36": "kubernetes-1.36", "1.37": "kubernetes-1.37"}
REAL_CNI_BUILD, REAL_CRI_TOOLS_BUILD, REAL_CONTAINERD_BUILD = "cni-plugins", "cri-tools", "containerd"
# Docker's containerd.io ships its own runc; the box's is Debian's (a signed .deb, version pinned).
DEBIAN_RUNC = "runc=1.1.5+ds1-1+deb12u1"

# 2026-01-01T00:00:00Z: every timestamp inside a package.
SOURCE_DATE_EPOCH = 1767225600
MAINTAINER = "labs-k8s lab in a box <box@labs-k8s.invalid>"
STANDIN_LIB = "usr/lib/labs-k8s-standin"
# Bumped when the layout changes in a way the hashed inputs do not show.
FORMAT = 1

# kubernetes/release cmd/krel/templates/latest/kubelet/kubelet.service (unchanged since 2023).
KUBELET_SERVICE = """\
[Unit]
Description=kubelet: The Kubernetes Node Agent
Documentation=https://kubernetes.io/docs/
Wants=network-online.target
After=network-online.target

[Service]
ExecStart=/usr/bin/kubelet
Restart=always
StartLimitInterval=0
RestartSec=10

[Install]
WantedBy=multi-user.target
"""
# kubernetes/release cmd/krel/templates/latest/kubeadm/10-kubeadm.conf, with the sed kubeadm.spec
# applies for a .deb (/etc/sysconfig/kubelet -> /etc/default/kubelet). The kubeadm package ships it
# (kubeadm.spec), at /lib/systemd/system/kubelet.service.d/ on Debian (%{_unitdir}).
KUBEADM_DROPIN = """\
# Note: This dropin only works with kubeadm and kubelet v1.11+
[Service]
Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf"
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
# This is a file that "kubeadm init" and "kubeadm join" generates at runtime, populating the KUBELET_KUBEADM_ARGS variable dynamically
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
# This is a file that the user can use for overrides of the kubelet args as a last resort. Preferably, the user should use
# the .NodeRegistration.KubeletExtraArgs object in the configuration files instead. KUBELET_EXTRA_ARGS should be sourced from this file.
EnvironmentFile=-/etc/default/kubelet
ExecStart=
ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
"""  # noqa: E501
# containerd's own containerd.service (containerd/containerd, 2.x) with /usr/local/bin made /usr/bin,
# as docker/containerd-packaging's Makefile does for containerd.io.
CONTAINERD_SERVICE = """\
# Copyright The containerd Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

[Unit]
Description=containerd container runtime
Documentation=https://containerd.io
After=network.target dbus.service

[Service]
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/usr/bin/containerd

Type=notify
Delegate=yes
KillMode=process
Restart=always
RestartSec=5

# Having non-zero Limit*s causes performance problems due to accounting overhead
# in the kernel. We recommend using cgroups to do container-local accounting.
LimitNPROC=infinity
LimitCORE=infinity

# Comment TasksMax if your systemd version does not supports it.
# Only systemd 226 and above support this version.
TasksMax=infinity
OOMScoreAdjust=-999

[Install]
WantedBy=multi-user.target
"""
# docker/containerd-packaging common/containerd.toml, containerd.io's /etc/containerd/config.toml (a
# conffile): the CRI plugin disabled, which prepare-node.sh must replace for the kubelet.
CONTAINERD_TOML = """\
#   Copyright 2018-2022 Docker Inc.

#   Licensed under the Apache License, Version 2.0 (the "License");
#   you may not use this file except in compliance with the License.
#   You may obtain a copy of the License at

#       http://www.apache.org/licenses/LICENSE-2.0

#   Unless required by applicable law or agreed to in writing, software
#   distributed under the License is distributed on an "AS IS" BASIS,
#   WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
#   See the License for the specific language governing permissions and
#   limitations under the License.

disabled_plugins = ["cri"]

#root = "/var/lib/containerd"
#state = "/run/containerd"
#subreaper = true
#oom_score = 0

#[grpc]
#  address = "/run/containerd/containerd.sock"
#  uid = 0
#  gid = 0

#[debug]
#  address = "/run/containerd/debug.sock"
#  uid = 0
#  gid = 0
#  level = "info"
"""
CNI_PLUGIN = """\
#!/bin/sh
# TEST ONLY: the labs-k8s lab in a box's stand-in of the CNI plugin {name} (kubernetes-cni {version},
# tests/box_repo.py). No container runs in the box: it answers CNI's VERSION command and refuses the rest.
if [ "${{CNI_COMMAND:-}}" = VERSION ]; then
    echo '{{"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}}'
    exit 0
fi
echo '{{"cniVersion":"1.0.0","code":999,"msg":"labs-k8s stand-in: {name} does not run containers"}}'
exit 1
"""


# What the kubelet package ships besides the binary (kubelet.spec).
KUBELET_FILES: dict[str, tuple[str | bytes, int]] = {
    "lib/systemd/system/kubelet.service": (KUBELET_SERVICE, 0o644),
    "etc/default/kubelet": ("KUBELET_EXTRA_ARGS=\n", 0o644),
    "var/lib/kubelet/.kubelet-keep": ("", 0o644),
    "etc/kubernetes/manifests/.kubelet-keep": ("", 0o644),
}


@dataclass(frozen=True)
class BoxRepo:
    """The built repositories: `root` holds `KUBERNETES_PATH`/v<minor>/deb/ and `CONTAINERD_PATH`/."""

    root: Path
    kubernetes_fingerprint: str
    containerd_fingerprint: str
    kubernetes_versions: Mapping[str, str]
    containerd_versions: tuple[str, ...]

    def kubernetes_dir(self, minor: str) -> Path:
        return self.root / KUBERNETES_PATH / f"v{minor}" / "deb"

    @property
    def containerd_dir(self) -> Path:
        return self.root / CONTAINERD_PATH

    def debs(self) -> list[Path]:
        return sorted(self.root.rglob("*.deb"))

    @staticmethod
    def kubernetes_url(mirror: str) -> str:
        """labs-k8s:mirrors.kubernetesRepository.url for a mirror at `mirror` (HOST:PORT)."""
        return f"http://{mirror}/{KUBERNETES_PATH}"

    @staticmethod
    def containerd_url(mirror: str) -> str:
        """labs-k8s:mirrors.containerdRepository.url for a mirror at `mirror` (HOST:PORT)."""
        return f"http://{mirror}/{CONTAINERD_PATH}"


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    control: Mapping[str, str]
    files: Mapping[str, tuple[str | bytes, int]]  # path in the package -> content, mode
    conffiles: tuple[str, ...] = ()


def inputs_key(real: bool = False) -> str:
    """The hash of everything a build depends on: this file, the stand-ins or the real binaries (their
    cache paths hold their builds' keys), the format."""
    digest = hashlib.sha256(f"box-repo {FORMAT} real={real}\0".encode())
    for path in [Path(__file__).resolve(), KUBE_STANDIN, *sorted(STANDIN.glob("*.py"))]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    if real:
        for name in [*REAL_MINORS.values(), REAL_CNI_BUILD, REAL_CRI_TOOLS_BUILD, REAL_CONTAINERD_BUILD]:
            digest.update(str(kube_programs.build_one(name)).encode() + b"\0")
        digest.update(DEBIAN_RUNC.encode())
    return digest.hexdigest()[:16]


def build(cache: Path, real: bool = False) -> BoxRepo:
    """The repositories, built into `cache` unless a build of the same inputs is there already: the
    stand-in packages, or with `real` the real programs (tests/kube_programs.py)."""
    cache.mkdir(parents=True, exist_ok=True)
    final = cache / f"box-repo-{inputs_key(real)}"
    with (cache / "box-repo.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (final / "repo.json").is_file():
            work = cache / f"{final.name}.build"
            shutil.rmtree(work, ignore_errors=True)
            meta = _build_into(work / "root", real)
            (work / "repo.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
            shutil.rmtree(final, ignore_errors=True)
            work.replace(final)
    meta = json.loads((final / "repo.json").read_text())
    return BoxRepo(
        root=final / "root",
        kubernetes_fingerprint=meta["kubernetes_fingerprint"],
        containerd_fingerprint=meta["containerd_fingerprint"],
        kubernetes_versions=dict(meta["kubernetes_versions"]),
        containerd_versions=tuple(meta["containerd_versions"]),
    )


def _build_into(root: Path, real: bool = False) -> dict[str, object]:
    kubernetes_versions = real_kubernetes_versions() if real else KUBERNETES_VERSIONS
    containerd_versions = (real_containerd_version(),) if real else CONTAINERD_VERSIONS
    with tempfile.TemporaryDirectory(prefix="box-repo-") as tmp:
        scratch = Path(tmp)
        for minor, version in kubernetes_versions.items():
            deb = root / KUBERNETES_PATH / f"v{minor}" / "deb"
            packages_of = real_kubernetes_packages if real else kubernetes_packages
            for package in packages_of(minor, version):
                build_deb(package, deb / ARCH, scratch)
            packages = _run(["apt-ftparchive", "packages", ARCH], cwd=deb)
            _write_indices(deb, packages)
        docker = root / CONTAINERD_PATH
        dist = docker / "dists" / CODENAME
        for version in containerd_versions:
            package = real_containerd_package(version, scratch) if real else containerd_package(version)
            build_deb(package, dist / "pool" / "stable" / ARCH, scratch)
        packages = _run(["apt-ftparchive", "packages", f"dists/{CODENAME}/pool/stable/{ARCH}"], cwd=docker)
        _write_indices(dist / "stable" / f"binary-{ARCH}", packages)

        with _keyring() as gpg:
            kubernetes_key = gpg.new_key("labs-k8s lab in a box: stand-in of pkgs.k8s.io's key <box@labs-k8s.invalid>")
            for minor in kubernetes_versions:
                # pkgs.k8s.io (openSUSE's build service): Origin and Label, no Suite or Codename.
                deb = root / KUBERNETES_PATH / f"v{minor}" / "deb"
                release = _release(deb, Origin=f"obs://build.opensuse.org/isv:kubernetes:core:stable:v{minor}/deb",
                                   Label=f"isv:kubernetes:core:stable:v{minor}", Architectures=ARCH)  # fmt: skip
                gpg.sign(kubernetes_key, release)
                (deb / "Release.key").write_text(gpg.export(kubernetes_key))
            docker_key = gpg.new_key("labs-k8s lab in a box: stand-in of Docker's release key <box@labs-k8s.invalid>")
            release = _release(dist, Origin="Docker", Label="Docker CE", Suite=CODENAME, Codename=CODENAME,
                               Architectures=ARCH, Components="stable")  # fmt: skip
            gpg.sign(docker_key, release)
            (docker / "gpg").write_text(gpg.export(docker_key))
    return {
        "kubernetes_fingerprint": kubernetes_key,
        "containerd_fingerprint": docker_key,
        "kubernetes_versions": kubernetes_versions,
        "containerd_versions": list(containerd_versions),
    }


# ------------------------------------------------------------------------------------------ packages


def upstream(version: str) -> str:
    """1.35.4-1.1 -> 1.35.4, 2.2.1-1~debian.12~bookworm -> 2.2.1 (what the tools report)."""
    return version.split("-", 1)[0]


def _depends(*real: str) -> str:
    return ", ".join([*real, *STANDIN_DEPENDS])


def _standin(package: str, version: str, commands: tuple[str, ...]) -> dict[str, tuple[str | bytes, int]]:
    """The stand-in code under /usr/lib/labs-k8s-standin/<package>/, its release.json, a launcher
    /usr/bin/<command> for each command (tests/tools/box/standin/main.py COMMANDS)."""
    lib = f"{STANDIN_LIB}/{package}"
    files: dict[str, tuple[str | bytes, int]] = {}
    for source in [*sorted(STANDIN.glob("*.py")), KUBE_STANDIN]:
        files[f"{lib}/{source.name}"] = (source.read_bytes(), 0o644)
    release = {"package": package, "version": version, "upstream_version": upstream(version)}
    files[f"{lib}/release.json"] = (json.dumps(release, indent=1, sort_keys=True) + "\n", 0o644)
    for command in commands:
        files[f"usr/bin/{command}"] = (
            "#!/bin/sh\n"
            f"# TEST ONLY: labs-k8s lab in a box stand-in of {command} ({package} {version}, tests/box_repo.py)\n"
            f'exec python3 /{lib}/main.py {command} "$@"\n',
            0o755,
        )
    return files


def _package(name: str, version: str, section: str, homepage: str, depends: str,
             files: Mapping[str, tuple[str | bytes, int]], summary: str, conffiles: tuple[str, ...] = (),
             extra: Mapping[str, str] | None = None) -> Package:  # fmt: skip
    control = {
        "Package": name,
        "Version": version,
        "Architecture": ARCH,
        "Maintainer": MAINTAINER,
        **({"Depends": depends} if depends else {}),
        **(extra or {}),
        "Section": section,
        "Priority": "optional",
        "Homepage": homepage,
        "Description": f"{summary} (labs-k8s stand-in)\n"
        " TEST ONLY: the labs-k8s lab in a box's stand-in of this package (tests/box_repo.py):\n"
        " what it contains is simulated; its name, version and the real package's Depends are kept.",
    }
    return Package(name, version, control, files, conffiles)


def kubernetes_packages(minor: str, version: str) -> list[Package]:
    """The packages of pkgs.k8s.io's v<minor> repository, after kubernetes/release's templates
    (cmd/krel/templates/latest: *.spec for the files, metadata.yaml for the Depends)."""
    home = "https://kubernetes.io"
    cri_tools, cni = CRI_TOOLS_VERSIONS[minor], KUBERNETES_CNI_VERSION
    kubelet_files = _standin("kubelet", version, ("kubelet",)) | KUBELET_FILES
    kubeadm_files = _standin("kubeadm", version, ("kubeadm",))
    kubeadm_files["lib/systemd/system/kubelet.service.d/10-kubeadm.conf"] = (KUBEADM_DROPIN, 0o644)
    cni_files: dict[str, tuple[str | bytes, int]] = {
        f"opt/cni/bin/{plugin}": (CNI_PLUGIN.format(name=plugin, version=cni), 0o755) for plugin in CNI_PLUGINS
    }
    cni_files["etc/cni/net.d/.kubernetes-cni-keep"] = ("", 0o644)
    release = {"package": "kubernetes-cni", "version": cni, "upstream_version": upstream(cni)}
    cni_files[f"{STANDIN_LIB}/kubernetes-cni/release.json"] = (json.dumps(release, indent=1, sort_keys=True) + "\n",
                                                               0o644)  # fmt: skip
    return [
        # kubeadm >= 1.32 depends on nothing (metadata.yaml); the stand-in on what runs it.
        _package("kubeadm", version, "admin", home, _depends(), kubeadm_files,
                 "Command-line utility for administering a Kubernetes cluster"),
        # kubelet.spec: iptables (>= 1.4.21), mount, util-linux; metadata.yaml: kubernetes-cni (>= 1.2.0).
        _package("kubelet", version, "net", home,
                 _depends("iptables (>= 1.4.21)", "kubernetes-cni (>= 1.2.0)", "mount", "util-linux"), kubelet_files,
                 "Node agent for Kubernetes clusters", conffiles=("/etc/default/kubelet",)),
        _package("kubectl", version, "admin", home, _depends(), _standin("kubectl", version, ("kubectl",)),
                 "Command-line utility for interacting with a Kubernetes cluster"),
        _package("cri-tools", cri_tools, "admin", home, _depends(), _standin("cri-tools", cri_tools, ("crictl",)),
                 "Command-line utility for interacting with a container runtime"),
        # The plugins are shell stand-ins: no Depends beyond the shell.
        _package("kubernetes-cni", cni, "net", home, "", cni_files,
                 "Binaries required to provision kubernetes container networking"),
    ]  # fmt: skip


def containerd_package(version: str) -> Package:
    """containerd.io as Docker builds it (docker/containerd-packaging debian/control, debian/rules):
    Provides, Conflicts and Replaces containerd and runc; the unit; config.toml a conffile."""
    files = _standin("containerd.io", version, ("containerd",))
    files["lib/systemd/system/containerd.service"] = (CONTAINERD_SERVICE, 0o644)
    files["etc/containerd/config.toml"] = (CONTAINERD_TOML, 0o644)
    extra = {"Provides": "containerd, runc", "Conflicts": "containerd, runc", "Replaces": "containerd, runc"}
    return _package("containerd.io", version, "devel", "https://containerd.io", _depends(), files,
                    "An open and reliable container runtime", ("/etc/containerd/config.toml",), extra)  # fmt: skip


def real_kubernetes_versions() -> dict[str, str]:
    """pkgs.k8s.io's version of each minor's packages: 1.37.2-1.1 (kubernetes/release's revision)."""
    return {minor: f"{kube_programs.entry(build)['version'][1:]}-1.1" for minor, build in REAL_MINORS.items()}


def real_containerd_version() -> str:
    return f"{kube_programs.entry(REAL_CONTAINERD_BUILD)['version'].removeprefix('v')}-1~debian.12~{CODENAME}"


def _binaries(build: str, names: tuple[str, ...], into: str) -> dict[str, tuple[str | bytes, int]]:
    directory = kube_programs.build_one(build)
    return {f"{into}/{name}": ((directory / name).read_bytes(), 0o755) for name in names}


def _real(package: Package) -> Package:
    """The real package's description, without the stand-in's note."""
    control = dict(package.control)
    control["Description"] = (
        control["Description"].split(" (labs-k8s stand-in)")[0]
        + "\n"
        + (" Built from source by the labs-k8s lab in a box (tests/kube_programs.py, tests/box_repo.py).")
    )
    return Package(package.name, package.version, control, package.files, package.conffiles)


def real_kubernetes_packages(minor: str, version: str) -> list[Package]:
    """pkgs.k8s.io's packages of `minor` with the real programs: the files and units of
    `kubernetes_packages`, the real Depends (kubernetes/release metadata.yaml), no stand-in code."""
    build = REAL_MINORS[minor]
    cri = f"{kube_programs.entry(REAL_CRI_TOOLS_BUILD)['version'].removeprefix('v')}-1.1"
    cni = f"{kube_programs.entry(REAL_CNI_BUILD)['version'].removeprefix('v')}-1.1"
    plugins = tuple(kube_programs.entry(REAL_CNI_BUILD)["checks"])
    home = "https://kubernetes.io"
    kubelet_files = _binaries(build, ("kubelet",), "usr/bin") | KUBELET_FILES
    kubeadm_files = _binaries(build, ("kubeadm",), "usr/bin")
    kubeadm_files["lib/systemd/system/kubelet.service.d/10-kubeadm.conf"] = (KUBEADM_DROPIN, 0o644)
    cni_files = _binaries(REAL_CNI_BUILD, plugins, "opt/cni/bin")
    cni_files["etc/cni/net.d/.kubernetes-cni-keep"] = ("", 0o644)
    return [_real(p) for p in [
        _package("kubeadm", version, "admin", home, "", kubeadm_files,
                 "Command-line utility for administering a Kubernetes cluster"),
        _package("kubelet", version, "net", home,
                 "iptables (>= 1.4.21), kubernetes-cni (>= 1.2.0), mount, util-linux", kubelet_files,
                 "Node agent for Kubernetes clusters", conffiles=("/etc/default/kubelet",)),
        _package("kubectl", version, "admin", home, "", _binaries(build, ("kubectl",), "usr/bin"),
                 "Command-line utility for interacting with a Kubernetes cluster"),
        _package("cri-tools", cri, "admin", home, "", _binaries(REAL_CRI_TOOLS_BUILD, ("crictl",), "usr/bin"),
                 "Command-line utility for interacting with a container runtime"),
        _package("kubernetes-cni", cni, "net", home, "", cni_files,
                 "Binaries required to provision kubernetes container networking"),
    ]]  # fmt: skip


def debian_runc(scratch: Path) -> bytes:
    """Debian's runc binary, from its signed package (`apt-get download`: apt checks the archive's
    signature and the .deb's hash), pinned to `DEBIAN_RUNC`."""
    _run(["apt-get", "download", "-qq", DEBIAN_RUNC], cwd=scratch)
    (deb,) = scratch.glob("runc_*.deb")
    _run(["dpkg-deb", "-x", str(deb), str(scratch / "runc")])
    return (scratch / "runc" / "usr" / "sbin" / "runc").read_bytes()


def real_containerd_package(version: str, scratch: Path) -> Package:
    """containerd.io as Docker builds it (`containerd_package`) with the real containerd, its shim,
    ctr, and runc; Depends as Docker's: libc6 and libseccomp2 (runc links it)."""
    files = _binaries(REAL_CONTAINERD_BUILD, ("containerd", "containerd-shim-runc-v2", "ctr"), "usr/bin")
    files["usr/bin/runc"] = (debian_runc(scratch), 0o755)
    files["lib/systemd/system/containerd.service"] = (CONTAINERD_SERVICE, 0o644)
    files["etc/containerd/config.toml"] = (CONTAINERD_TOML, 0o644)
    extra = {"Provides": "containerd, runc", "Conflicts": "containerd, runc", "Replaces": "containerd, runc"}
    summary = "An open and reliable container runtime"
    return _real(_package("containerd.io", version, "devel", "https://containerd.io", "libc6, libseccomp2", files,
                          summary, ("/etc/containerd/config.toml",), extra))  # fmt: skip


def build_deb(package: Package, out_dir: Path, scratch: Path) -> Path:
    """`package` as a .deb in `out_dir`, byte for byte the same for the same package."""
    stage = scratch / f"{package.name}_{package.version}"
    shutil.rmtree(stage, ignore_errors=True)
    (stage / "DEBIAN").mkdir(parents=True)
    for rel, (content, mode) in package.files.items():
        path = stage / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        path.chmod(mode)
    control = "".join(f"{key}: {value}\n" for key, value in package.control.items())
    (stage / "DEBIAN" / "control").write_text(control)
    if package.conffiles:
        (stage / "DEBIAN" / "conffiles").write_text("".join(f"{c}\n" for c in package.conffiles))
    for path in [stage, *stage.rglob("*")]:
        if path.is_dir():
            path.chmod(0o755)
        elif path.parent.name == "DEBIAN":
            path.chmod(0o644)
    for path in [*stage.rglob("*"), stage]:
        os.utime(path, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH), follow_symlinks=False)
    out_dir.mkdir(parents=True, exist_ok=True)
    deb = out_dir / f"{package.name}_{package.version}_{ARCH}.deb"
    # gzip: xz on one thread took minutes for the real programs' few hundred MB.
    _run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", str(stage), str(deb)],
         env={"SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)})  # fmt: skip
    shutil.rmtree(stage)
    return deb


# -------------------------------------------------------------------------------------- repositories


def _write_indices(directory: Path, packages: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "Packages").write_text(packages)
    (directory / "Packages.gz").write_bytes(gzip.compress(packages.encode(), mtime=0))


def _release(directory: Path, **fields: str) -> Path:
    """apt-ftparchive's Release of `directory` (the indices below it, hashed) with `fields`."""
    options = [arg for key, value in fields.items() for arg in ("-o", f"APT::FTPArchive::Release::{key}={value}")]
    text = _run(["apt-ftparchive", *options, "release", "."], cwd=directory)
    release = directory / "Release"
    release.write_text(text)
    return release


class _GPG:
    def __init__(self, home: Path) -> None:
        self.env = {"GNUPGHOME": str(home)}

    def run(self, *args: str) -> str:
        return _run(["gpg", "--batch", "--no-tty", "--pinentry-mode", "loopback", "--passphrase", "", *args],
                    env=self.env)  # fmt: skip

    def new_key(self, uid: str) -> str:
        """A new signing key (Ed25519, no expiry, no passphrase); its fingerprint."""
        self.run("--quick-gen-key", uid, "ed25519", "sign", "never")
        listing = self.run("--with-colons", "--list-secret-keys", uid)
        records = [line.split(":") for line in listing.splitlines()]
        fingerprints = [r[9] for previous, r in itertools.pairwise(records) if previous[0] == "sec" and r[0] == "fpr"]
        assert len(fingerprints) == 1, listing
        return fingerprints[0]

    def sign(self, fingerprint: str, release: Path) -> None:
        """InRelease (clear-signed) and Release.gpg (detached, armoured) next to `release`."""
        signer = ("--local-user", fingerprint, "--digest-algo", "SHA512", "--yes")
        self.run(*signer, "--clearsign", "--output", str(release.with_name("InRelease")), str(release))
        self.run(*signer, "--armor", "--detach-sign", "--output", str(release.with_name("Release.gpg")), str(release))

    def export(self, fingerprint: str) -> str:
        return self.run("--armor", "--export", fingerprint)


@contextlib.contextmanager
def _keyring() -> Iterator[_GPG]:
    """A throwaway GnuPG home (its agent stopped and the private keys gone afterwards)."""
    # The agent's socket lives in the home: keep its path short (sun_path is 108 bytes).
    short = Path(tempfile.mkdtemp(prefix="box-gpg-", dir="/tmp"))
    short.chmod(0o700)
    try:
        yield _GPG(short)
    finally:
        subprocess.run(["gpgconf", "--kill", "gpg-agent"], env={**os.environ, "GNUPGHOME": str(short)},
                       capture_output=True, check=False)  # fmt: skip
        shutil.rmtree(short, ignore_errors=True)


def _run(args: list[str], cwd: Path | None = None, env: Mapping[str, str] | None = None) -> str:
    result = subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, check=False,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C", **(env or {})},
    )  # fmt: skip
    if result.returncode != 0:
        output = f"{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
        raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}):\n{output}")
    return result.stdout
