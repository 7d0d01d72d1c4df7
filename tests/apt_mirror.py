"""The lab in a box's package mirror: Debian's real, signed archive, as apt on a node asks for it.

`record` runs apt in a throwaway overlay of the template's sealed rootfs (the node's own
sources.list, keyring and apt version), through an HTTP proxy on this machine's loopback that
forwards each request to the Debian mirror and keeps the answer: `apt-get update`, then
`apt-get install --download-only` of the packages the steps install. What it keeps is a
consistent snapshot of the archive (InRelease, the indices it names, by-hash paths included, and
the .debs), signed by Debian's own keys.

`serve` (`python -m tests.apt_mirror serve DIR HOST:PORT`, run in the engine's namespace on the
box's bridge address) is the stack's `labs-k8s:mirrors.aptProxy`: an HTTP proxy that answers
every absolute-URI GET from the snapshot and 404 for anything else, logging each request. So a
node's `apt-get update` checks Debian's real signatures, and `apt-get install` fetches the real
packages, without any node reaching the internet.

With `--repo DIR` (tests/box_repo.py `BoxRepo.root`), `serve` also answers the stand-in
repositories of pkgs.k8s.io and download.docker.com from DIR, whichever way a node asks: through the
proxy for the real host (`GET http://pkgs.k8s.io/core:/stable:/…`), through the proxy for a URL
that is the mirror itself (`GET http://10.3.60.1:3142/pkgs.k8s.io/…`: any host, the repository's
host first in the path), or straight to the mirror (`GET /pkgs.k8s.io/…`).

A snapshot is re-recorded when it is older than `MAX_AGE_SECONDS`: bookworm-security's InRelease
carries a Valid-Until a week ahead, and apt refuses an expired one ("Release file ... is expired").
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import http.server
import json
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path

MAX_AGE_SECONDS = 3 * 24 * 3600
# The hosts whose stand-in repositories `serve --repo` answers (tests/box_repo.py).
REPO_HOSTS = ("pkgs.k8s.io", "download.docker.com")


def _snapshot_path(base: Path, url: str) -> Path | None:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or ".." in parts.path.split("/"):
        return None
    return base / parts.hostname / parts.path.lstrip("/")


def _repo_path(repo: Path, request: str) -> Path | None:
    """The file of `repo` a request names (module docstring: absolute-form for a repository's host
    or for any host with the repository's host first in the path, or origin-form), or None. apt
    quotes `~` in a path (`%7E`), so the path is unquoted."""
    parts = urllib.parse.urlsplit(request)
    if parts.scheme not in ("", "http"):
        return None
    segments = urllib.parse.unquote(parts.path).lstrip("/").split("/")
    if parts.hostname in REPO_HOSTS:
        segments = [parts.hostname, *segments]
    if segments[0] not in REPO_HOSTS or ".." in segments:
        return None
    return repo.joinpath(*segments)


class _Proxy(http.server.BaseHTTPRequestHandler):
    """What both proxies share: a whole body answered with its length, and no stderr log."""

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


class _RecordingProxy(_Proxy):
    snapshot: Path

    def do_GET(self) -> None:
        target = _snapshot_path(self.snapshot, self.path)
        if target is None:
            self.send_error(400, "only http:// absolute URIs")
            return
        request = urllib.request.Request(self.path, headers={"User-Agent": self.headers.get("User-Agent", "apt")})
        try:
            with urllib.request.urlopen(request, timeout=120) as answer:
                body = answer.read()
        except urllib.error.HTTPError as error:
            self.send_error(error.code)
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        target.with_name(target.name + ".part").write_bytes(body)
        target.with_name(target.name + ".part").replace(target)
        self._send(body)


def snapshot_key(rootfs: Path, packages: Sequence[str]) -> str:
    sources = sorted((rootfs / "etc/apt").rglob("*.list")) + sorted((rootfs / "etc/apt").rglob("*.sources"))
    digest = hashlib.sha256()
    for part in [*packages, *(p.read_text() for p in sources)]:
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


def record(rootfs: Path, packages: Sequence[str], cache: Path) -> Path:
    """A snapshot for `packages` on a node made from `rootfs` (module docstring), cached in `cache`."""
    final = cache / f"snapshot-{snapshot_key(rootfs, packages)}"
    cache.mkdir(parents=True, exist_ok=True)
    # Tests on other xdist workers ask for the same snapshot (the box, tests/test_interrupted_dpkg.py):
    # one records it, the others wait and use it.
    with (cache / "record.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _recorded(rootfs, packages, cache, final)


def _recorded(rootfs: Path, packages: Sequence[str], cache: Path, final: Path) -> Path:
    meta = final / "snapshot.json"
    if meta.is_file() and time.time() - json.loads(meta.read_text())["recorded_at"] < MAX_AGE_SECONDS:
        return final
    work = cache / f"{final.name}.build"
    shutil.rmtree(work, ignore_errors=True)
    for sub in ("archive", "upper", "work", "root"):
        (work / sub).mkdir(parents=True)
    handler = type("Recorder", (_RecordingProxy,), {"snapshot": work / "archive"})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy = f"http://127.0.0.1:{server.server_address[1]}"
    apt = f"apt-get -q -o Acquire::http::Proxy={proxy} -o Acquire::https::Proxy=false"
    script = (
        f'mount -t overlay overlay -o "lowerdir={rootfs},upperdir={work}/upper,workdir={work}/work" {work}/root'
        f" && exec chroot {work}/root sh -ec '{apt} update && {apt} install -y --download-only"
        f" --no-install-recommends {' '.join(packages)}'"
    )
    try:
        result = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            capture_output=True, text=True, timeout=900, check=False,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C", "DEBIAN_FRONTEND": "noninteractive"},
        )  # fmt: skip
    finally:
        server.shutdown()
    if result.returncode != 0:
        raise RuntimeError(f"recording the apt snapshot failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    shutil.rmtree(work / "upper", ignore_errors=True)
    shutil.rmtree(work / "work", ignore_errors=True)
    (work / "snapshot.json").write_text(json.dumps({"recorded_at": time.time(), "packages": list(packages)}) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    work.replace(final)
    return final


class _SnapshotProxy(_Proxy):
    snapshot: Path
    log: Path
    repo: Path | None = None

    def do_GET(self) -> None:
        target = _repo_path(self.repo, self.path) if self.repo is not None else None
        if target is None:
            target = _snapshot_path(self.snapshot / "archive", self.path)
        found = target is not None and target.is_file()
        with self.log.open("a") as log:
            log.write(f"{time.strftime('%H:%M:%S')} {self.client_address[0]} {'200' if found else '404'} {self.path}\n")
        if not found:
            self.send_error(404, "not in the box's snapshot of the archive")
            return
        assert target is not None
        self._send(target.read_bytes())


def serve(snapshot: Path, listen: str, log: Path, repo: Path | None = None) -> None:
    """Answer from `snapshot` (and `repo`, the stand-in repositories) on `listen`, HOST:PORT (port 0:
    any free one); prints `MIRROR http://HOST:PORT` once it listens."""
    host, port = listen.rsplit(":", 1)
    handler = type("Mirror", (_SnapshotProxy,), {"snapshot": snapshot, "log": log, "repo": repo})
    server = http.server.ThreadingHTTPServer((host, int(port)), handler)
    print(f"MIRROR http://{host}:{server.server_address[1]}", flush=True)
    server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serving = sub.add_parser("serve")
    serving.add_argument("snapshot", type=Path)
    serving.add_argument("listen")
    serving.add_argument("--log", type=Path, required=True)
    serving.add_argument("--repo", type=Path, help="the stand-in repositories (tests/box_repo.py BoxRepo.root)")
    args = parser.parse_args(argv)
    serve(args.snapshot, args.listen, args.log, args.repo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
