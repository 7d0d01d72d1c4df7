"""Run the k8s step scripts against stand-in commands, with a fake root prefix.

Each script runs as it would on a node (`bash ./<entrypoint>` inside its step directory,
with lib.sh and params.env beside it) but with:

- LABS_K8S_ROOT pointing at a scratch directory, so every file it reads or writes
  (/etc/fstab, /etc/kubernetes/admin.conf, ...) lives there;
- PATH holding only stand-ins for the commands that touch the machine or the cluster
  (kubeadm, kubectl, systemctl, apt-get, modprobe, mount, curl, ...) plus links to a short
  list of harmless real tools (coreutils, sed, awk, grep, openssl, jq). A command on
  neither list is simply not found, so a script can never reach the real system.

Every stand-in appends its invocation to a log that the tests read back. Their behaviour is
driven by files in a state directory (installed packages, healthy API endpoints, disks,
tokens, canned kubectl output), so a test sets up a situation by writing files, runs the
script, then asserts on the invocations and on the files under the fake root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

TEST_TOKEN = "abcdef.0123456789abcdef"
TEST_CERTIFICATE_KEY = "0f" * 32


# Real tools the scripts may use. Everything else must be a stand-in.
SAFE_TOOLS = (
    "bash", "cat", "grep", "sed", "awk", "install", "mkdir", "mktemp", "cmp", "cp", "mv", "rm",
    "chmod", "date", "tr", "cut", "sort", "uniq", "head", "tail", "wc", "printf", "env", "dirname",
    "basename", "tee", "touch", "ln", "readlink", "stat", "ls", "timeout", "openssl", "jq", "sha256sum",
)  # fmt: skip

_PRELUDE = r"""#!/bin/bash
# stand-in for {name} (tests/shell_harness.py)
{{
    printf '%s' '{name}'
    for arg in "$@"; do printf '\x1f%s' "${{arg//$'\n'/\\n}}"; done
    printf '\n'
}} >>"$HARNESS_LOG"
ROOT=$LABS_K8S_ROOT
STATE=$HARNESS_STATE
"""

# Default behaviour of each stand-in: enough of the real command for the scripts' happy path.
DEFAULT_STUBS: dict[str, str] = {
    "sleep": "exit 0",
    "modprobe": "exit 0",
    "swapoff": "exit 0",
    "swapon": "exit 0",
    "udevadm": "exit 0",
    "ethtool": "exit 0",
    "timedatectl": "exit 0",
    "ufw": "exit 0",
    "sysctl": 'if [[ $1 == -n ]]; then echo 1; fi',
    "dpkg": 'if [[ $1 == --print-architecture ]]; then echo amd64; fi',
    # The fingerprint of whichever key curl "downloaded" (its body names the repository).
    "gpg": r"""
case $(cat "${*: -1}") in
    *docker*) echo "fpr:::::::::9DC858229FC7DD38854AE2D88D81803C0EBFCD88:" ;;
    *kubernetes*) echo "fpr:::::::::DE15B14486CD377B9E876E1A234654DA9A296436:" ;;
esac
""",
    "ip": '[[ -f $STATE/flannel-up ]]',
    "systemctl": r"""
mkdir -p "$STATE/systemd"
verb=$1; shift
args=(); for a in "$@"; do [[ $a == -* ]] || args+=("$a"); done
case $verb in
    is-enabled) f=$STATE/systemd/${args[0]}.enabled
        if [[ -f $f ]]; then cat "$f"; else echo disabled; exit 1; fi ;;
    enable) for u in "${args[@]}"; do echo enabled >"$STATE/systemd/$u.enabled"; done ;;
    mask) for u in "${args[@]}"; do echo masked >"$STATE/systemd/$u.enabled"; done ;;
    start|restart) for u in "${args[@]}"; do touch "$STATE/systemd/$u.active"; done ;;
    is-active) [[ -f $STATE/systemd/${args[0]}.active ]] ;;
    list-units) cat "$STATE/swap-units" 2>/dev/null || true ;;
esac
""",
    "dpkg-query": r"""
fmt=$2; pkg=$3
[[ -f $STATE/dpkg/$pkg ]] || exit 1
case $fmt in
    *Status*) printf 'install ok installed' ;;
    *Version*) printf '%s' "$(cat "$STATE/dpkg/$pkg")" ;;
esac
""",
    "apt-cache": r"""
[[ $1 == madison ]] || exit 0
[[ -f $STATE/repo/$2 ]] || exit 0
while read -r version; do
    printf ' %s | %s | https://example.invalid/deb Packages\n' "$2" "$version"
done <"$STATE/repo/$2"
""",
    "apt-get": r"""
mkdir -p "$STATE/dpkg"
verb=""; pkgs=()
for a in "$@"; do
    case $a in -*) ;; *) if [[ -z $verb ]]; then verb=$a; else pkgs+=("$a"); fi ;; esac
done
case $verb in
    install)
        for p in "${pkgs[@]}"; do
            name=${p%%=*}; version=${p#*=}
            if [[ $name == "$p" ]]; then version=$(head -n 1 "$STATE/repo/$name" 2>/dev/null || echo 1.0); fi
            printf '%s' "$version" >"$STATE/dpkg/$name"
            case $name in
                containerd.io) printf '%s' "${version%%-*}" >"$STATE/containerd-version" ;;
                kubernetes-cni) mkdir -p "$ROOT/opt/cni/bin"
                    for b in bridge host-local loopback portmap; do
                        install -m 0755 /dev/null "$ROOT/opt/cni/bin/$b"
                    done ;;
            esac
        done ;;
    purge|remove) for p in "${pkgs[@]}"; do rm -f "$STATE/dpkg/$p"; done ;;
esac
""",
    "apt-mark": r"""
case $1 in
    hold) shift; for p in "$@"; do echo "$p" >>"$STATE/held"; done ;;
    showhold) sort -u "$STATE/held" 2>/dev/null || true ;;
esac
""",
    "curl": r"""
out=""; url=""
while (($#)); do
    case $1 in -o) out=$2; shift ;; http*) url=$1 ;; esac
    shift
done
case $url in
    */gpg|*/Release.key) repo=kubernetes; [[ $url == */gpg ]] && repo=docker
        block="PGP PUBLIC KEY BLOCK-----"
        printf -- '-----BEGIN %s\nfake %s\n-----END %s\n' "$block" "$repo" "$block" >"$out" ;;
    https://*:6443/*) host=${url#https://}; host=${host%%:*}
        if [[ -f $STATE/api/$host ]]; then echo ok; else exit 7; fi ;;
    *) exit 6 ;;
esac
""",
    "containerd": r"""
case $1 in
    --version) [[ -f $STATE/containerd-version ]] || exit 127
        echo "containerd containerd.io $(cat "$STATE/containerd-version") 0123456789abcdef" ;;
    config) # "config dump": the stand-in's "merged" config is the file itself, or a canned dump
        if [[ -f $STATE/containerd-dump ]]; then cat "$STATE/containerd-dump"
        else cat "$ROOT/etc/containerd/config.toml"; fi ;;
esac
""",
    "kubeadm": r"""
config=""; prev=""
for a in "$@"; do [[ $prev == --config ]] && config=$a; prev=$a; done
case "$1 ${2:-}" in
    "config images")
        printf '%s\n' registry.k8s.io/kube-apiserver:v1.36.0 registry.k8s.io/coredns/coredns:v1.13.1 \
            registry.k8s.io/pause:3.10.1 registry.k8s.io/etcd:3.6.6-0 ;;
    "init phase") exit "$(cat "$STATE/upload-certs-exit" 2>/dev/null || echo 0)" ;;
    "token list") cat "$STATE/tokens" 2>/dev/null || true ;;
    "token create")
        token=$(sed -n 's/^ *- token: "\(.*\)"$/\1/p' "$config")
        # Like the real one: create, or update the existing Secret of that token ID in place.
        if [[ -f $STATE/tokens ]]; then
            grep -v "^${token%%.*}\." "$STATE/tokens" >"$STATE/tokens.new" || true
            mv "$STATE/tokens.new" "$STATE/tokens"
        fi
        printf '%s   23h   %s   authentication,signing   labs-k8s   system:bootstrappers:kubeadm:default-node-token\n' \
            "$token" "$(date -u -d '+23 hours' +%Y-%m-%dT%H:%M:%SZ)" >>"$STATE/tokens"
        echo "$token" ;;
    init\ *)
        # Like the real one, it would print the join secrets: the script must keep them out of its output.
        token=$(sed -n 's/^ *- token: "\(.*\)"$/\1/p' "$config")
        key=$(sed -n 's/^certificateKey: "\(.*\)"$/\1/p' "$config")
        echo "kubeadm join 10.3.60.100:6443 --token $token --certificate-key $key"
        if [[ -f $STATE/init-fails ]]; then echo "error execution phase wait-control-plane" >&2; exit 1; fi
        mkdir -p "$ROOT/etc/kubernetes"
        printf 'apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: AAAA\n    server: %s\n' \
            "$(cat "$STATE/admin-server")" >"$ROOT/etc/kubernetes/admin.conf" ;;
    join\ *)
        if [[ -f $STATE/join-fails ]]; then exit 1; fi
        mkdir -p "$ROOT/etc/kubernetes"
        echo "kubelet" >"$ROOT/etc/kubernetes/kubelet.conf"
        if grep -q '^controlPlane:' "$config"; then echo "admin" >"$ROOT/etc/kubernetes/admin.conf"; fi ;;
esac
""",
    "kubectl": r"""
args=" $* "
k=$STATE/kubectl
case $args in
    *" get node "*" --ignore-not-found "*)
        [[ -f $k/unreachable ]] && { echo "The connection to the server was refused" >&2; exit 1; }
        for a in "$@"; do [[ -f $k/nodes.d/$a ]] && echo "node/$a"; done; exit 0 ;;
    *" drain "*)
        if [[ $args == *--disable-eviction* ]]; then exit "$(cat "$k/drain-force-exit" 2>/dev/null || echo 0)"; fi
        exit "$(cat "$k/drain-exit" 2>/dev/null || echo 0)" ;;
    *" delete node "*) for a in "$@"; do rm -f "$k/nodes.d/$a"; done ;;
    *" get nodes "*) cat "$k/nodes" ;;
    *" get pods "*) cat "$k/pods" ;;
    *" get deployment coredns "*) cat "$k/coredns" ;;
    *" get pod etcd-"*)
        for a in "$@"; do [[ $a == etcd-* ]] && grep -q "^$a=Running$" "$k/pods" && echo Running; done
        exit 0 ;;
    *" endpoint status "*) cat "$k/etcd-status" ;;
    *" endpoint health "*) cat "$k/etcd-health"; exit "$(cat "$k/etcd-health-exit" 2>/dev/null || echo 0)" ;;
    *" apply "*) exit 0 ;;
    *" rollout status "*) exit "$(cat "$k/rollout-exit" 2>/dev/null || echo 0)" ;;
    *" get daemonset,pods "*) echo "kube-flannel-ds-abcde   0/1   CrashLoopBackOff" ;;
esac
""",
    # Disks: $STATE/disks holds `lsblk -dbnpo NAME,TYPE,SIZE,RM` lines; $STATE/fs/<name>.* what is on them.
    "lsblk": r"""
if [[ $* == "-dbnpo NAME,TYPE,SIZE,RM" ]]; then cat "$STATE/disks" 2>/dev/null || true; exit 0; fi
dev=${*: -1}; base=${dev##*/}
case $* in
    *"-nro NAME "*) echo "$base"; cat "$STATE/children/$base" 2>/dev/null || true ;;
    *"-nro MOUNTPOINT "*) echo "" ;;
esac
""",
    "blkid": r"""
dev=${*: -1}; base=${dev##*/}
case $* in
    *"-s TYPE"*) cat "$STATE/fs/$base.type" 2>/dev/null || exit 2 ;;
    *"-s PTTYPE"*) cat "$STATE/fs/$base.pttype" 2>/dev/null || exit 2 ;;
    *"-s UUID"*) cat "$STATE/fs/$base.uuid" 2>/dev/null || exit 2 ;;
esac
""",
    "mkfs.ext4": r"""
dev=${*: -1}; base=${dev##*/}
mkdir -p "$STATE/fs"
echo ext4 >"$STATE/fs/$base.type"
echo 3f0c1a2b-4d5e-4f60-8a7b-9c0d1e2f3a4b >"$STATE/fs/$base.uuid"
""",
    "mountpoint": r"""
dir=${*: -1}
[[ -f $STATE/mounts/${dir//\//_} ]]
""",
    "mount": r"""
dir=${*: -1}
mkdir -p "$STATE/mounts"
uuid=$(awk -v d="${dir#"$ROOT"}" '$2 == d {sub(/^UUID=/, "", $1); print $1 " " $3}' "$ROOT/etc/fstab")
echo "$uuid" >"$STATE/mounts/${dir//\//_}"
""",
    "findmnt": r"""
dir=${*: -1}
record=$(cat "$STATE/mounts/${dir//\//_}")
case $* in *UUID*) echo "${record%% *}" ;; *FSTYPE*) echo "${record##* }" ;; esac
""",
}


class ShellHarness:
    """One fake node: a root prefix, a state directory, stand-ins on PATH and a call log."""

    def __init__(self, tmp_path: Path) -> None:
        self.base = tmp_path
        self.root = tmp_path / "root"
        self.state = tmp_path / "state"
        self.bin = tmp_path / "bin"
        self.safe = tmp_path / "safe-bin"
        self.step = tmp_path / "step"
        self.log = tmp_path / "calls.log"
        for directory in (self.root, self.state, self.bin, self.safe, self.step, tmp_path / "home"):
            directory.mkdir(parents=True, exist_ok=True)
        self.log.touch()
        missing = []
        for tool in SAFE_TOOLS:
            real = shutil.which(tool)
            if real is None:
                missing.append(tool)
            else:
                (self.safe / tool).symlink_to(real)
        self.missing_tools = missing
        for name, body in DEFAULT_STUBS.items():
            self.stub(name, body)

    # ------------------------------------------------------------------ setup
    def stub(self, name: str, body: str) -> None:
        """Replace the behaviour of stand-in `name` (bash, after the logging prelude)."""
        path = self.bin / name
        path.write_text(_PRELUDE.format(name=name) + body.strip() + "\n")
        path.chmod(0o755)

    def write(self, relative: str, text: str, under: Path | None = None) -> Path:
        """Write a file under the fake root (default) or another harness directory."""
        path = (under or self.root) / relative.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def set_state(self, relative: str, text: str = "") -> Path:
        return self.write(relative, text, under=self.state)

    def clear_state(self, relative: str) -> None:
        (self.state / relative).unlink(missing_ok=True)

    def install_step(self, files: Mapping[str, str]) -> None:
        """Lay out a step directory as step_bundle would (flat, 0600)."""
        for old in self.step.iterdir():
            old.unlink()
        for name, text in files.items():
            path = self.step / name
            path.write_text(text)
            path.chmod(0o600)

    # ------------------------------------------------------------------ running
    def run(self, entrypoint: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": f"{self.bin}:{self.safe}",
            "LABS_K8S_ROOT": str(self.root),
            "HARNESS_LOG": str(self.log),
            "HARNESS_STATE": str(self.state),
            "HOME": str(self.base / "home"),
            "LC_ALL": "C",
            "TZ": "UTC",
        }
        bash = shutil.which("bash") or "/bin/bash"
        return subprocess.run(
            [bash, f"./{entrypoint}", *args],
            cwd=self.step,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    # ------------------------------------------------------------------ reading back
    def calls(self, name: str | None = None) -> list[list[str]]:
        """Every logged invocation as [command, arg1, ...], optionally only those of one command."""
        result = []
        for line in self.log.read_text().splitlines():
            parts = line.split("\x1f")
            if name is None or parts[0] == name:
                result.append(parts)
        return result

    def calls_matching(self, name: str, *words: str) -> list[list[str]]:
        """Invocations of `name` whose arguments contain every one of `words`."""
        return [call for call in self.calls(name) if all(word in call[1:] for word in words)]

    def reset_log(self) -> None:
        self.log.write_text("")

    def snapshot(self) -> dict[str, bytes]:
        """Every file under the fake root with its content: compare two runs with it."""
        return {
            str(path.relative_to(self.root)): path.read_bytes()
            for path in sorted(self.root.rglob("*"))
            if path.is_file()
        }


def modes(path: Path) -> int:
    return os.stat(path).st_mode & 0o777
