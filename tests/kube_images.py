"""TEST ONLY: OCI images of the node's real programs, built offline and served by a real registry.

Each image is one layer of the binaries tests/kube_programs.py built, put where upstream's images put
them, appended to an empty OCI base with crane (go-containerregistry) and pushed into a real
distribution `registry` on loopback; its storage directory is the cache, keyed by the binaries' own
cache keys. `serve()` serves that storage read-only over TLS, as a site's registry mirror: the
repositories are named as kubeadm (`kubeadm config images list`) and kube-flannel.yml name them, so
containerd's `_default` mirror (prepare-node.sh) answers registry.k8s.io's and ghcr.io's names.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import shutil
import socket
import subprocess
import tarfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests import kube_programs

CACHE = kube_programs.CACHE / "images"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The minors whose control plane the box runs: the default and the one a lab upgrades from.
MINORS = ("kubernetes-1.37", "kubernetes-1.36")
# Debian's userland for the images whose upstream images carry one: kube-proxy and flanneld run
# iptables, ip6tables and conntrack (upstream: distroless-iptables, Flannel's Alpine base), and
# kube-flannel.yml's install-cni init containers run cp (busybox). Signed packages, versions pinned:
# iptables and conntrack with what they depend on (apt-cache depends --recurse), nothing else.
USERLAND = (
    "busybox-static=1:1.35.0-4+deb12u1+b1", "conntrack=1:1.4.7-1+b2", "gcc-12-base=12.2.0-14+deb12u1",
    "iptables=1.8.9-2", "libc6=2.36-9+deb12u14", "libgcc-s1=12.2.0-14+deb12u1", "libip4tc2=1.8.9-2",
    "libip6tc2=1.8.9-2", "libmnl0=1.0.4-3", "libnetfilter-conntrack3=1.0.9-3", "libnfnetlink0=1.0.2-2",
    "libnftnl11=1.2.4-2", "libxtables12=1.8.9-2", "netbase=6.4",
)  # fmt: skip
# What Debian's maintainer scripts would link (update-alternatives): iptables' nft backend, as a
# Debian 12 node uses it; busybox's applets the init containers call.
USERLAND_LINKS = {
    **{f"usr/sbin/{name}": "xtables-nft-multi" for name in (
        "iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore")},
    "bin/sh": "busybox", "bin/cp": "busybox", "bin/mkdir": "busybox", "bin/cat": "busybox",
}  # fmt: skip


@dataclass(frozen=True)
class Image:
    repository: str  # "kube-apiserver", "coredns/coredns", "flannel-io/flannel"
    tag: str
    files: dict[str, Path]  # path in the image -> built binary
    entrypoint: tuple[str, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    userland: bool = False  # Debian's USERLAND below the binaries

    @property
    def name(self) -> str:
        return f"{self.repository}:{self.tag}"


def _bin(name: str) -> Path:
    return kube_programs.build_one(name)


def images() -> list[Image]:
    """Every image a box node pulls, for each minor the box runs."""
    out: dict[str, Image] = {}
    for minor in MINORS:
        build = kube_programs.entry(minor)
        programs, pins = _bin(minor), build["pins"]
        for program in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy"):
            files = {f"usr/local/bin/{program}": programs / program}
            image = Image(program, build["version"], files, userland=program == "kube-proxy")
            out[image.name] = image
        etcd_version = pins["etcd"].split("-")[0]
        etcd = _bin(f"etcd-{'.'.join(etcd_version.split('.')[:2])}")
        image = Image("etcd", pins["etcd"], {f"usr/local/bin/{p}": etcd / p for p in ("etcd", "etcdctl", "etcdutl")})
        out[image.name] = image
        coredns = _bin(f"coredns-{pins['coredns'].removeprefix('v')}")
        image = Image("coredns/coredns", pins["coredns"], {"coredns": coredns / "coredns"}, ("/coredns",))
        out[image.name] = image
        image = Image("pause", pins["pause"], {"pause": _bin("pause") / "pause"}, ("/pause",))
        out[image.name] = image
    flannel = kube_programs.entry("flannel")
    # What the DaemonSet runs: flanneld, and install-conf in its install-cni init container.
    flanneld = {f"opt/bin/{name}": _bin("flannel") / name for name in ("flanneld", "install-conf")}
    out["flannel"] = Image("flannel-io/flannel", flannel["version"], flanneld, ("/opt/bin/flanneld",), userland=True)
    plugin = kube_programs.entry("flannel-cni-plugin")
    files = {"flannel": _bin("flannel-cni-plugin") / "flannel"}
    out["cni"] = Image("flannel-io/flannel-cni-plugin", plugin["version"], files, userland=True)
    return list(out.values())


def _layer(image: Image) -> bytes:
    """A reproducible tar of the image's files: root-owned, mode 0755, a fixed mtime."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        directories = sorted({str(Path(p).parent) for p in image.files if str(Path(p).parent) != "."})
        for directory in directories:
            parts = Path(directory).parts
            for depth in range(1, len(parts) + 1):
                name = "/".join(parts[:depth])
                if name not in tar.getnames():
                    info = tarfile.TarInfo(name)
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
                    tar.addfile(info)
        for path, source in sorted(image.files.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = source.stat().st_size, 0o755, 0
            with source.open("rb") as data:
                tar.addfile(info, data)
    return buffer.getvalue()


def userland_layer(scratch: Path) -> Path:
    """USERLAND as one layer: the packages fetched by apt (the archive's signature and each .deb's
    hash checked), unpacked, USERLAND_LINKS added."""
    layer = CACHE / f"userland-{hashlib.sha256(repr((USERLAND, USERLAND_LINKS)).encode()).hexdigest()[:16]}.tar"
    if layer.is_file():
        return layer
    debs, tree = scratch / "debs", scratch / "userland"
    debs.mkdir(parents=True)
    subprocess.run(["apt-get", "download", "-qq", *USERLAND], cwd=debs, check=True, capture_output=True)
    for deb in sorted(debs.glob("*.deb")):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tree)], check=True)
    for link, target in USERLAND_LINKS.items():
        (tree / link).parent.mkdir(parents=True, exist_ok=True)
        (tree / link).unlink(missing_ok=True)
        (tree / link).symlink_to(target if "/" in target or link.startswith("usr/sbin") else f"/bin/{target}")
    partial = layer.with_suffix(".partial")
    layer.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["tar", "--sort=name", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner", "-C", str(tree), "-cf",
         str(partial), "."],
        check=True,
    )  # fmt: skip
    partial.replace(layer)
    return layer


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _registry_config(store: Path, port: int, tls: tuple[Path, Path] | None, readonly: bool, address: str) -> str:
    config = {
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": {
            "filesystem": {"rootdirectory": str(store)},
            "maintenance": {"uploadpurging": {"enabled": False}, "readonly": {"enabled": readonly}},
        },
        "http": {"addr": f"{address}:{port}"},
    }
    if tls is not None:
        config["http"]["tls"] = {"certificate": str(tls[0]), "key": str(tls[1])}  # type: ignore[index]
    return json.dumps(config)  # YAML is a superset of JSON


def _listening(port: int, netns: str | None, address: str) -> bool:
    if netns is None:
        with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=1):
            return True
        return False
    probe = ["ip", "netns", "exec", netns, "bash", "-c", f"exec 3<>/dev/tcp/{address}/{port}"]
    return subprocess.run(probe, capture_output=True, check=False).returncode == 0


@contextlib.contextmanager
def _registry(
    store: Path,
    tls: tuple[Path, Path] | None = None,
    readonly: bool = False,
    netns: str | None = None,
    address: str = "127.0.0.1",
) -> Iterator[int]:
    """The real `registry` on a port of `address` (loopback; of `netns` when given), until the block ends."""
    port = _free_port() if netns is None else 5000
    config = store.parent / f"registry-{port}.yml"
    config.write_text(_registry_config(store, port, tls, readonly, address))
    log = (store.parent / f"registry-{port}.log").open("w")
    prefix = [] if netns is None else ["ip", "netns", "exec", netns]
    proc = subprocess.Popen([*prefix, str(_bin("registry") / "registry"), "serve", str(config)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while not _listening(port, netns, address):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the registry did not start: {(store.parent / f'registry-{port}.log').read_text()}")
            time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
        config.unlink(missing_ok=True)


def cache_key(wanted: list[Image]) -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for image in wanted:
        digest.update(json.dumps([image.name, image.entrypoint, sorted(image.labels.items()), image.userland]).encode())
        for path, source in sorted(image.files.items()):
            digest.update(f"{path}={source.resolve()}".encode())  # the path holds the build's key
    return digest.hexdigest()[:16]


def build_store() -> Path:
    """The registry storage holding every image, built first when missing (under a lock: the suite's
    workers may ask at once)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_store()


def _build_store() -> Path:
    wanted = images()
    out = CACHE / cache_key(wanted)
    if (out / ".complete").is_file():
        return out / "store"
    shutil.rmtree(out, ignore_errors=True)
    (out / "store").mkdir(parents=True)
    crane = str(_bin("crane") / "crane")
    userland = userland_layer(out / "scratch")
    with _registry(out / "store") as port:
        for image in wanted:
            ref = f"127.0.0.1:{port}/{image.name}"
            layer = out / "layer.tar"
            layer.write_bytes(_layer(image))
            layers = [str(userland), str(layer)] if image.userland else [str(layer)]
            append = [crane, "append", "--oci-empty-base", *(f"--new_layer={path}" for path in layers), "-t", ref]
            subprocess.run(append, check=True, capture_output=True)
            mutate = [crane, "mutate", ref, "--set-platform", "linux/amd64", "--env", PATH_ENV, "-t", ref]
            if image.entrypoint:
                mutate += ["--entrypoint", ",".join(image.entrypoint)]
            subprocess.run(mutate, check=True, capture_output=True)
        layer.unlink()
    shutil.rmtree(out / "scratch", ignore_errors=True)
    (out / ".complete").touch()
    for other in CACHE.iterdir():
        if other.name != out.name and other.is_dir():
            shutil.rmtree(other, ignore_errors=True)
    return out / "store"


def throwaway_tls(directory: Path, addresses: tuple[str, ...] = ("127.0.0.1",)) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for `addresses` signed by it (openssl)."""
    ca, ca_key = directory / "ca.crt", directory / "ca.key"
    cert, key, csr = directory / "registry.crt", directory / "registry.key", directory / "registry.csr"
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    subprocess.run(
        ["openssl", "req", "-x509", *curve, "-keyout", ca_key, "-out", ca, "-days", "1", "-subj", "/CN=box CA"],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        ["openssl", "req", *curve, "-keyout", key, "-out", csr, "-subj", "/CN=registry"],
        check=True,
        capture_output=True,
    )
    (directory / "san.ext").write_text("subjectAltName=" + ",".join(f"IP:{a}" for a in addresses) + "\n")
    subprocess.run(
        [
            "openssl",
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            ca,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-out",
            cert,
            "-days",
            "1",
            "-extfile",
            directory / "san.ext",
        ],
        check=True,
        capture_output=True,
    )
    return ca, cert, key


@contextlib.contextmanager
def serve(
    store: Path, certificate: Path, key: Path, netns: str | None = None, address: str = "127.0.0.1"
) -> Iterator[str]:
    """The images over TLS, read-only, on a port of `address` (loopback, or an address of `netns`):
    yields "ADDRESS:PORT"."""
    with _registry(store, (certificate, key), readonly=True, netns=netns, address=address) as port:
        yield f"{address}:{port}"


def catalog(address: str, ca: Path) -> list[str]:
    import ssl

    context = ssl.create_default_context(cafile=str(ca))
    with urllib.request.urlopen(f"https://{address}/v2/_catalog", context=context, timeout=10) as response:
        return list(json.load(response)["repositories"])
