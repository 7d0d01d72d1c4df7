"""The node's images, built offline from the real programs, served by the real registry over TLS, and
pulled by the real containerd through its CRI image service (the kubelet's path) via the `_default`
mirror that prepare-node.sh writes, under the names kubeadm asks for."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests import kube_images, kube_programs
from tests.requirements import require_root, require_tool, unavailable


def _store() -> Path:
    try:
        return kube_images.build_store()
    except (kube_programs.BuildError, subprocess.CalledProcessError, RuntimeError) as error:
        unavailable(f"the node images could not be built: {error}")
        raise AssertionError("unreachable") from error


def test_the_registry_serves_every_image_kubeadm_and_flannel_name(tmp_path: Path) -> None:
    store = _store()
    ca, cert, key = kube_images.throwaway_tls(tmp_path)
    with kube_images.serve(store, cert, key) as address:
        repositories = set(kube_images.catalog(address, ca))
    wanted = {image.repository for image in kube_images.images()}
    assert wanted == repositories
    assert {"kube-apiserver", "etcd", "coredns/coredns", "pause", "kube-proxy", "flannel-io/flannel"} <= wanted


@contextlib.contextmanager
def _netns() -> Iterator[str]:
    """A network namespace with loopback alone: the mirror's fallback to the upstream registry (no
    `server` in hosts.toml, as prepare-node.sh writes it) has nowhere to go."""
    name = f"labs-k8s-images-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


@contextlib.contextmanager
def _containerd(root: Path, hosts_dir: Path, netns: str) -> Iterator[Path]:
    """A real containerd (CRI enabled, as prepare-node.sh configures it) with its own root, state and
    socket, in `netns` and a mount namespace of its own, so nothing it mounts is seen outside."""
    programs = kube_programs.build_one("containerd")
    root.mkdir(parents=True, exist_ok=True)
    # A unix socket's path must fit in 108 bytes; pytest's tmp_path under CI does not (pytest-103/...).
    sockets = Path(tempfile.mkdtemp(prefix="lk-ctrd-", dir="/tmp"))
    socket = sockets / "containerd.sock"
    config = root / "config.toml"
    config.write_text(
        "version = 3\n"
        f"root = '{root / 'root'}'\nstate = '{root / 'state'}'\n"
        f"[grpc]\n  address = '{socket}'\n"
        f"[ttrpc]\n  address = '{socket}.ttrpc'\n"
        f"[plugins.'io.containerd.cri.v1.images'.registry]\n  config_path = '{hosts_dir}'\n"
    )
    log = (root / "containerd.log").open("w")
    env = {**os.environ, "PATH": f"{programs}:{os.environ['PATH']}"}
    proc = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            netns,
            "unshare",
            "--mount",
            "--propagation",
            "private",
            str(programs / "containerd"),
            "--config",
            str(config),
        ],
        stdout=log,
        stderr=log,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while not socket.exists():
            assert proc.poll() is None and time.monotonic() < deadline, (root / "containerd.log").read_text()[-3000:]
            time.sleep(0.2)
        yield socket
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()
        shutil.rmtree(sockets, ignore_errors=True)


@contextlib.contextmanager
def _crictl_through_mirror(tmp_path: Path, pin_ca: bool) -> Iterator[list[str]]:
    """crictl against a real containerd whose `_default` mirror is the images' registry, as
    prepare-node.sh writes it for labs-k8s:mirrors.registryMirror, with or without its CA pinned."""
    require_root()
    require_tool("unshare", "openssl")
    store = _store()
    ca, cert, key = kube_images.throwaway_tls(tmp_path)
    crictl = kube_programs.build_one("cri-tools") / "crictl"
    with _netns() as netns, kube_images.serve(store, cert, key, netns) as address:
        hosts = tmp_path / "certs.d" / "_default" / "hosts.toml"
        hosts.parent.mkdir(parents=True)
        pinned = f'  ca = "{ca}"\n' if pin_ca else ""
        hosts.write_text(f'[host."https://{address}"]\n  capabilities = ["pull", "resolve"]\n{pinned}')
        with _containerd(tmp_path / "containerd", tmp_path / "certs.d", netns) as socket:
            yield [str(crictl), "--runtime-endpoint", f"unix://{socket}", "--image-endpoint", f"unix://{socket}"]


def test_containerd_pulls_each_image_through_the_mirror_over_tls(tmp_path: Path) -> None:
    with _crictl_through_mirror(tmp_path, pin_ca=True) as crictl:
        for image in kube_images.images():
            upstream = "ghcr.io" if image.repository.startswith("flannel-io/") else "registry.k8s.io"
            ref = f"{upstream}/{image.name}"
            pulled = subprocess.run([*crictl, "pull", ref], capture_output=True, text=True, timeout=300, check=False)
            assert pulled.returncode == 0, f"crictl pull {ref}: {pulled.stderr}"
        listed = subprocess.run([*crictl, "images", "-o", "json"], capture_output=True, text=True, check=True)
    tags = {tag for entry in json.loads(listed.stdout)["images"] for tag in entry["repoTags"]}
    assert "registry.k8s.io/kube-apiserver:" + kube_programs.entry("kubernetes-1.37")["version"] in tags
    assert len(tags) == len(kube_images.images())


def test_a_mirror_whose_certificate_is_not_pinned_is_refused(tmp_path: Path) -> None:
    """The check can fail: without the CA in hosts.toml, containerd refuses the mirror's certificate
    and falls back to the registry itself, which the namespace cannot reach: the pull fails."""
    with _crictl_through_mirror(tmp_path, pin_ca=False) as crictl:
        pulled = subprocess.run(
            [*crictl, "pull", "registry.k8s.io/pause:3.10.2"], capture_output=True, text=True, timeout=120, check=False
        )
        said = pulled.stderr + (tmp_path / "containerd" / "containerd.log").read_text()
    assert pulled.returncode != 0
    assert "certificate signed by unknown authority" in said, said[-3000:]


def test_kube_proxy_and_flannel_images_carry_the_iptables_and_cp_they_run(tmp_path: Path) -> None:
    """kube-proxy and flanneld run iptables and conntrack, the install-cni init containers cp:
    Debian's, in the image, run in a chroot of the exported image."""
    require_root()
    store = _store()
    ca, cert, key = kube_images.throwaway_tls(tmp_path)
    crane = kube_programs.build_one("crane") / "crane"
    version = kube_programs.entry("kubernetes-1.37")["version"]
    with kube_images.serve(store, cert, key) as address:
        for name, argv, expected in (
            (f"kube-proxy:{version}", ["/usr/sbin/iptables", "--version"], "nf_tables"),
            (f"kube-proxy:{version}", ["/usr/sbin/conntrack", "--version"], "conntrack v1.4.7"),
            (f"kube-proxy:{version}", ["/usr/local/bin/kube-proxy", "--version"], version),
            ("flannel-io/flannel-cni-plugin:v1.9.1-flannel1", ["/bin/cp", "--help"], "Usage: cp"),
        ):
            root = tmp_path / name.replace("/", "_").replace(":", "_")
            if not root.is_dir():
                root.mkdir()
                exported = subprocess.run(
                    f"{crane} export {address}/{name} - | tar -x -C {root}",
                    shell=True,
                    capture_output=True,
                    text=True,
                    env={**os.environ, "SSL_CERT_FILE": str(ca)},
                    check=False,
                )
                assert exported.returncode == 0, exported.stderr
            ran = subprocess.run(["chroot", str(root), *argv], capture_output=True, text=True, timeout=30, check=False)
            assert expected in ran.stdout + ran.stderr, f"{name} {argv}: {ran.stdout}{ran.stderr}"
