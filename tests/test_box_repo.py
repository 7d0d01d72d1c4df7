"""The lab in a box's signed apt repositories of the stand-in packages (tests/box_repo.py), checked
with the real apt: `apt-get update` against `python -m tests.apt_mirror serve --repo` on loopback,
each repository's signature checked with a keyring holding only its published key, in the three
ways a node's apt can ask the mirror; what the packages hold; that the published keys have the
fingerprints `build` reports; that another key is refused; that the packages are deterministic.

apt runs on directories of its own (APT_CONFIG: sources, lists, cache, and a dpkg status that holds
only the Debian packages the stand-ins depend on), never this machine's.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import http.client
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from components.config import KubernetesConfig
from tests import box_repo
from tests.box_repo import BoxRepo, build, upstream
from tests.requirements import require_tool

REPO = Path(__file__).resolve().parents[1]
PREPARE_NODE = REPO / "cloudinit" / "k8s" / "prepare-node.sh"
TOOLS = ("dpkg-deb", "apt-ftparchive", "gpg", "gpgconf", "apt-get", "apt-cache")
KUBERNETES_PACKAGES = {"kubeadm", "kubelet", "kubectl", "kubernetes-cni", "cri-tools"}
# Debian packages the stand-in packages depend on (kubelet's real Depends, box_repo.STANDIN_DEPENDS),
# installed on every node before the repositories are added: the dpkg status apt resolves against.
NODE_STATUS = {
    "iptables": "1.8.9-2",
    "mount": "2.38.1-5+deb12u3",
    "util-linux": "2.38.1-5+deb12u3",
    "python3": "3.11.2-1+b1",
    "python3-yaml": "6.0-3+b2",
    "openssl": "3.0.17-1~deb12u2",
    "iproute2": "6.1.0-3",
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> BoxRepo:
    require_tool(*TOOLS)
    return build(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def mirror(repo: BoxRepo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The box's mirror on a free loopback port, with an empty Debian snapshot: (HOST:PORT, its log)."""
    work = tmp_path_factory.mktemp("mirror")
    log = work / "mirror.log"
    (work / "snapshot").mkdir()
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.apt_mirror", "serve", str(work / "snapshot"), "127.0.0.1:0",
         "--log", str(log), "--repo", str(repo.root)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.startswith("MIRROR http://127.0.0.1:"), line
        yield line.split("http://", 1)[1].strip(), log
    finally:
        server.kill()
        server.wait()


class Apt:
    """apt-get and apt-cache on directories of their own under `work` (APT_CONFIG)."""

    def __init__(self, work: Path, proxy: str | None) -> None:
        self.work = work
        for sub in ("etc/apt.conf.d", "etc/sources.list.d", "etc/preferences.d", "etc/trusted.gpg.d",
                    "state/lists/partial", "cache/archives/partial", "log", "download"):  # fmt: skip
            (work / sub).mkdir(parents=True, exist_ok=True)
        (work / "state/status").write_text(
            "".join(
                f"Package: {name}\nStatus: install ok installed\nPriority: optional\nSection: misc\n"
                f"Maintainer: test <test@invalid>\nArchitecture: amd64\nVersion: {version}\n"
                "Description: already on the node\n\n"
                for name, version in NODE_STATUS.items()
            )
        )
        (work / "apt.conf").write_text(
            f'Dir::Etc "{work}/etc/";\n'
            f'Dir::State "{work}/state/";\n'
            f'Dir::State::status "{work}/state/status";\n'
            f'Dir::Cache "{work}/cache/";\n'
            f'Dir::Log "{work}/log/";\n'
            'Debug::NoLocking "true";\n'
            # As root apt would fetch as _apt, which cannot enter pytest's private directories.
            'APT::Sandbox::User "root";\n'
            'Acquire::Languages "none";\n'
            'Acquire::Retries "0";\n'
            'APT::Architecture "amd64";\n'
            'APT::Architectures { "amd64"; };\n'
            f'Acquire::http::Proxy "{f"http://{proxy}" if proxy else "DIRECT"}";\n'
        )

    def sources(self, *lines: str) -> None:
        (self.work / "etc/sources.list").write_text("".join(f"{line}\n" for line in lines))

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args, cwd=self.work / "download", capture_output=True, text=True, timeout=120, check=False,
            env={"APT_CONFIG": str(self.work / "apt.conf"), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"},
        )  # fmt: skip

    def madison(self, package: str) -> list[tuple[str, str]]:
        """(version, source) of each line of `apt-cache madison PACKAGE`, as prepare-node.sh reads it."""
        out = self.run("apt-cache", "madison", package).stdout
        return [(fields[1], fields[2]) for fields in (line.split(" | ") for line in out.splitlines())]


def keyrings(repo: BoxRepo, work: Path) -> tuple[Path, Path]:
    """The published keys, as prepare-node.sh installs them (the names its sources name)."""
    kubernetes, docker = work / "kubernetes-apt-keyring.asc", work / "docker.asc"
    kubernetes.write_bytes((repo.kubernetes_dir("1.36") / "Release.key").read_bytes())
    docker.write_bytes((repo.containerd_dir / "gpg").read_bytes())
    return kubernetes, docker


# How a node's apt reaches the mirror: the real URLs through the proxy (absolute-form, the real host);
# the mirror's URLs through the proxy, as the box sets them (absolute-form, the mirror's host); the
# mirror's URLs without a proxy (origin-form).
FORMS = {
    "real-urls-through-the-proxy": (False, True),
    "mirror-urls-through-the-proxy": (True, True),
    "mirror-urls-direct": (True, False),
}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("minor", sorted(box_repo.KUBERNETES_VERSIONS))
def test_apt_update_checks_the_signatures_and_lists_the_pinned_versions(repo, mirror, tmp_path, form, minor):
    address, log = mirror
    mirror_urls, proxied = FORMS[form]
    apt = Apt(tmp_path, address if proxied else None)
    kubernetes_key, docker_key = keyrings(repo, tmp_path)
    kubernetes = repo.kubernetes_url(address) if mirror_urls else f"http://{box_repo.KUBERNETES_PATH}"
    docker = repo.containerd_url(address) if mirror_urls else f"http://{box_repo.CONTAINERD_PATH}"
    # The lines prepare-node.sh (configure_repositories) and lib.sh (use_kubernetes_repository) write.
    apt.sources(
        f"deb [signed-by={kubernetes_key}] {kubernetes}/v{minor}/deb/ /",
        f"deb [arch=amd64 signed-by={docker_key}] {docker} bookworm stable",
    )
    update = apt.run("apt-get", "update")
    assert update.returncode == 0, update.stdout + update.stderr
    assert "W:" not in update.stderr and "E:" not in update.stderr, update.stderr
    version = repo.kubernetes_versions[minor]
    for package in ("kubeadm", "kubelet", "kubectl"):
        assert apt.madison(package) == [(version, f"{kubernetes}/v{minor}/deb  Packages")]
    assert sorted(v for v, _ in apt.madison("containerd.io")) == sorted(repo.containerd_versions)
    # What each request looked like at the mirror, and that it answered it.
    requests = log.read_text()
    inrelease = f"{box_repo.KUBERNETES_PATH}/v{minor}/deb/InRelease"
    expected = {
        "real-urls-through-the-proxy": f" 200 http://{inrelease}\n",
        "mirror-urls-through-the-proxy": f" 200 http://{address}/{inrelease}\n",
        "mirror-urls-direct": f" 200 /{inrelease}\n",
    }[form]
    assert expected in requests

    # What prepare-node.sh installs, pinned as it pins them, resolves against a node's packages...
    containerd = next(v for v in repo.containerd_versions if v.startswith(f"{KubernetesConfig().containerd_version}-"))
    install = apt.run("apt-get", "install", "-s", "--no-install-recommends", f"kubeadm={version}",
                      f"kubelet={version}", f"kubectl={version}", "kubernetes-cni", "cri-tools",
                      f"containerd.io={containerd}")  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    for package in ("kubeadm", "kubelet", "kubectl"):
        assert f"Inst {package} ({version} " in install.stdout
    assert f"Inst containerd.io ({containerd} " in install.stdout
    # ...and the packages come down with the hashes the signed indices give (a `~` in the path too).
    download = apt.run("apt-get", "download", f"kubeadm={version}", f"containerd.io={containerd}")
    assert download.returncode == 0, download.stdout + download.stderr
    fetched = {p.name: p.read_bytes() for p in (tmp_path / "download").glob("*.deb")}
    served = {p.name: p.read_bytes() for p in repo.debs()}
    assert {name: served[name] for name in fetched} == fetched
    assert {f"kubeadm_{version}_amd64.deb", f"containerd.io_{containerd}_amd64.deb"} == set(fetched)


def test_a_repository_signed_by_another_key_is_refused(repo, mirror, tmp_path):
    address, _ = mirror
    apt = Apt(tmp_path, address)
    _, docker_key = keyrings(repo, tmp_path)
    # The Kubernetes repository with Docker's key as its keyring: apt must refuse its InRelease.
    apt.sources(f"deb [signed-by={docker_key}] http://{box_repo.KUBERNETES_PATH}/v1.36/deb/ /")
    update = apt.run("apt-get", "update")
    output = update.stdout + update.stderr
    assert update.returncode != 0, output
    assert f"NO_PUBKEY {repo.kubernetes_fingerprint[-16:]}" in output
    assert "is not signed" in output
    assert apt.madison("kubeadm") == []


def primary_fingerprints(key_file: Path) -> list[str]:
    """The primary keys' fingerprints, as prepare-node.sh's primary_fingerprints reads them."""
    with tempfile.TemporaryDirectory(prefix="box-gpg-") as home:
        env = {**os.environ, "GNUPGHOME": home}
        show = ["gpg", "--batch", "--show-keys", "--with-colons", str(key_file)]
        out = subprocess.run(show, env=env, capture_output=True, text=True, check=True).stdout
        subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=env, check=False)
    records = [line.split(":") for line in out.splitlines()]
    return [r[9] for previous, r in itertools.pairwise(records) if previous[0] == "pub" and r[0] == "fpr"]


def test_each_published_key_has_the_fingerprint_build_reports(repo):
    for minor in repo.kubernetes_versions:
        # One key for every minor, as pkgs.k8s.io has (prepare-node.sh pins one fingerprint).
        assert primary_fingerprints(repo.kubernetes_dir(minor) / "Release.key") == [repo.kubernetes_fingerprint]
    assert primary_fingerprints(repo.containerd_dir / "gpg") == [repo.containerd_fingerprint]
    assert repo.kubernetes_fingerprint != repo.containerd_fingerprint
    for fingerprint in (repo.kubernetes_fingerprint, repo.containerd_fingerprint):
        assert re.fullmatch(r"[0-9A-F]{40}", fingerprint)


def test_the_release_files_name_the_real_repositories(repo):
    for minor in repo.kubernetes_versions:
        release = (repo.kubernetes_dir(minor) / "Release").read_text()
        assert f"Origin: obs://build.opensuse.org/isv:kubernetes:core:stable:v{minor}/deb\n" in release
        assert f"Label: isv:kubernetes:core:stable:v{minor}\n" in release
        assert "InRelease" not in release and "Valid-Until" not in release
    release = (repo.containerd_dir / "dists/bookworm/Release").read_text()
    for field in ("Origin: Docker", "Label: Docker CE", "Suite: bookworm", "Codename: bookworm", "Components: stable"):
        assert f"{field}\n" in release


def deb_contents(deb: Path) -> dict[str, str]:
    """path -> mode string of each entry of `dpkg-deb -c`."""
    out = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1].removeprefix("."): line.split()[0] for line in out.splitlines()}


def deb_field(deb: Path, field: str) -> str:
    out = subprocess.run(["dpkg-deb", "-f", str(deb), field], capture_output=True, text=True, check=True).stdout
    return out.strip()


def standin_commands() -> set[str]:
    """The keys of tests/tools/box/standin/main.py COMMANDS."""
    tree = ast.parse((box_repo.STANDIN / "main.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "COMMANDS" for t in node.targets):
            assert isinstance(node.value, ast.Dict)
            return {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    raise AssertionError("no COMMANDS in main.py")


def test_each_package_ships_its_launchers_units_and_the_stand_in_code(repo):
    code = {p.name for p in box_repo.STANDIN.glob("*.py")} | {"kube_standin.py", "release.json"}
    launchers = {"kubeadm": "kubeadm", "kubelet": "kubelet", "kubectl": "kubectl", "cri-tools": "crictl",
                 "containerd.io": "containerd"}  # fmt: skip
    assert set(launchers.values()) <= standin_commands()
    seen = set()
    for deb in repo.debs():
        name = deb_field(deb, "Package")
        seen.add(name)
        contents = deb_contents(deb)
        lib = f"/usr/lib/labs-k8s-standin/{name}"
        assert f"{lib}/release.json" in contents
        if name in launchers:
            command = launchers[name]
            assert contents[f"/usr/bin/{command}"] == "-rwxr-xr-x"
            assert {p.rsplit("/", 1)[1] for p in contents if p.startswith(f"{lib}/") and not p.endswith("/")} == code
    assert seen == KUBERNETES_PACKAGES | {"containerd.io"}

    kubelet = repo.kubernetes_dir("1.36") / "amd64" / f"kubelet_{repo.kubernetes_versions['1.36']}_amd64.deb"
    assert "/lib/systemd/system/kubelet.service" in deb_contents(kubelet)
    assert "kubernetes-cni (>= 1.2.0)" in deb_field(kubelet, "Depends")
    # kubeadm, not the kubelet, ships the drop-in (kubernetes/release kubeadm.spec), as on a real node.
    kubeadm = repo.kubernetes_dir("1.36") / "amd64" / f"kubeadm_{repo.kubernetes_versions['1.36']}_amd64.deb"
    assert "/lib/systemd/system/kubelet.service.d/10-kubeadm.conf" in deb_contents(kubeadm)
    # The plugins prepare-node.sh checks after installing kubernetes-cni.
    plugins = re.search(r"for plugin in ([a-z -]+); do", PREPARE_NODE.read_text())
    assert plugins is not None
    cni = next(repo.kubernetes_dir("1.36").glob("amd64/kubernetes-cni_*.deb"))
    for plugin in plugins.group(1).split():
        assert deb_contents(cni)[f"/opt/cni/bin/{plugin}"] == "-rwxr-xr-x"
    containerd = next(repo.containerd_dir.glob("dists/bookworm/pool/stable/amd64/containerd.io_*.deb"))
    assert {"/lib/systemd/system/containerd.service", "/etc/containerd/config.toml"} <= set(deb_contents(containerd))
    assert deb_field(containerd, "Conflicts") == "containerd, runc"


def test_the_launchers_run_the_stand_ins_with_their_package_version(repo, tmp_path):
    for deb in repo.debs():
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path / deb.stem)], check=True)
    for minor, version in repo.kubernetes_versions.items():
        tree = tmp_path / f"kubeadm_{version}_amd64"
        launcher = (tree / "usr/bin/kubeadm").read_text()
        assert launcher.endswith('\nexec python3 /usr/lib/labs-k8s-standin/kubeadm/main.py kubeadm "$@"\n')
        release = json.loads((tree / "usr/lib/labs-k8s-standin/kubeadm/release.json").read_text())
        assert release == {"package": "kubeadm", "version": version, "upstream_version": upstream(version)}
        (tmp_path / "store").mkdir(exist_ok=True)
        # The copy in the package, run as its launcher runs it: kubeadm reports the package's version.
        main = tree / "usr/lib/labs-k8s-standin/kubeadm/main.py"
        out = subprocess.run(
            [sys.executable, str(main), "kubeadm", "version", "-o", "short"],
            env={**os.environ, "LABS_K8S_BOX_STORE": str(tmp_path / "store")},
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert out == f"v{upstream(version)}\n", minor
    for version in repo.containerd_versions:
        tree = tmp_path / f"containerd.io_{version}_amd64"
        out = subprocess.run(
            [sys.executable, str(tree / "usr/lib/labs-k8s-standin/containerd.io/main.py"), "containerd", "--version"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        # prepare-node.sh containerd_version: the third field, here the package's upstream version.
        assert out.split()[2] == upstream(version)
        config = (tree / "etc/containerd/config.toml").read_text()
        assert 'disabled_plugins = ["cri"]' in config.splitlines()


def test_the_repositories_hold_what_the_scripts_install(repo):
    script = PREPARE_NODE.read_text()
    # install_kubernetes_packages: kubeadm, kubelet, kubectl at the version, the other two by name.
    assert '"${resolved[@]}" kubernetes-cni cri-tools' in script
    for minor, version in repo.kubernetes_versions.items():
        text = (repo.kubernetes_dir(minor) / "Packages").read_text()
        packages = dict(re.findall(r"^Package: (\S+)\n(?:.+\n)*?Version: (\S+)$", text, flags=re.M))
        assert set(packages) == KUBERNETES_PACKAGES
        assert {packages[name] for name in ("kubeadm", "kubelet", "kubectl")} == {version}
        assert packages["cri-tools"].startswith(f"{minor}.")
    # The default Kubernetes version and containerd version of the config are there.
    cfg = KubernetesConfig()
    minor = cfg.version.rsplit(".", 1)[0]
    assert upstream(repo.kubernetes_versions[minor]) == cfg.version
    assert cfg.containerd_version in {upstream(v) for v in repo.containerd_versions}


def test_two_builds_give_the_same_packages_and_a_second_build_is_the_cached_one(repo, tmp_path):
    again = build(tmp_path / "other-cache")
    assert again.root != repo.root

    def digests(built: BoxRepo) -> dict[str, str]:
        return {str(p.relative_to(built.root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in built.debs()}

    assert digests(again) == digests(repo)
    assert len(digests(repo)) == 2 * len(KUBERNETES_PACKAGES) + len(repo.containerd_versions)
    for minor in repo.kubernetes_versions:
        index = (repo.kubernetes_dir(minor) / "Packages").read_bytes()
        assert (again.kubernetes_dir(minor) / "Packages").read_bytes() == index
    # The same cache again: the same build (its keys are new with each build, so the same fingerprint).
    cached = build(tmp_path / "other-cache")
    assert cached == again


def test_the_mirror_answers_only_inside_the_repositories(repo, mirror):
    address, _ = mirror
    host, port = address.rsplit(":", 1)
    key = f"/{box_repo.KUBERNETES_PATH}/v1.36/deb/Release.key"

    def get(target: str) -> int:
        with contextlib.closing(http.client.HTTPConnection(host, int(port), timeout=10)) as connection:
            connection.putrequest("GET", target, skip_host=True, skip_accept_encoding=True)
            connection.putheader("Host", address)
            connection.endheaders()
            return connection.getresponse().status

    assert get(key) == 200
    assert get(f"http://{address}{key}") == 200
    assert get(f"http://pkgs.k8s.io{key.removeprefix('/pkgs.k8s.io')}") == 200
    assert get(f"/{box_repo.KUBERNETES_PATH}/v1.36/deb/../../../../../repo.json") == 404
    assert get(f"/{box_repo.KUBERNETES_PATH}/v1.36/deb/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/repo.json") == 404
    assert get("/etc/passwd") == 404
    assert get("http://example.org/pkgs.k8s.io/nothing") == 404
