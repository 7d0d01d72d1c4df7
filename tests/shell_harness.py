"""Run the k8s step scripts against stand-in commands, with a fake root prefix.

Each script runs as it would on a node (`bash ./<entrypoint>` inside its step directory,
with lib.sh and params.env beside it) but with:

- LABS_K8S_ROOT pointing at a scratch directory, so every file it reads or writes
  (/etc/fstab, /etc/kubernetes/admin.conf, ...) lives there;
- PATH holding only stand-ins for the commands that touch the machine or the cluster
  (kubeadm, kubectl, systemctl, apt-get, modprobe, mount, curl, ...) plus links to a short
  list of harmless real tools (coreutils, sed, awk, grep, openssl, jq). A command on
  neither list is simply not found, so a script can never reach the real system.

Every stand-in appends its invocation to a log that the tests read back. The machine-level
ones (apt, systemctl, disks) are driven by files in a per-node state directory. The cluster-level
ones (kubeadm, kubectl, etcdctl via kubectl/crictl exec, crictl, arping, curl to the API) are one
model of a cluster shared by every node of a scenario (tests/kube_standin.py: kubeadm's real
phase order, what each phase leaves on disk, TTLs, etcd membership). A test sets up a situation,
runs the real scripts on one node or several (ClusterLab), then asserts on the invocations and on
what is on disk and in the cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tests import kubeadm_real
from tests.kubeadm_real import REAL_KUBEADM_DIR_ENV

STANDIN = Path(__file__).with_name("kube_standin.py")

TEST_TOKEN = "abcdef.0123456789abcdef"
TEST_CERTIFICATE_KEY = "0f" * 32
# 32 bytes in base64, as the program renders the Secrets' encryption key (k8s.encryption_key_from_hex).
TEST_ENCRYPTION_KEY = "c2VjcmV0Ym94LWtleS1vZi1sYWJzLWs4cy10ZXN0cyE="


# Real tools the scripts may use. Everything else must be a stand-in.
SAFE_TOOLS = (
    "bash", "cat", "grep", "sed", "awk", "install", "mkdir", "mktemp", "cmp", "cp", "mv", "rm",
    "rmdir", "chmod", "date", "tr", "cut", "sort", "uniq", "head", "tail", "wc", "printf", "env", "dirname",
    "basename", "tee", "touch", "ln", "readlink", "stat", "ls", "timeout", "openssl", "jq", "sha256sum",
    "base64",
)  # fmt: skip

_MODEL = 'exec "$HARNESS_PYTHON" "$HARNESS_STANDIN" {name} "$@"'

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
    "sysctl": "if [[ $1 == -n ]]; then echo 1; fi",
    # --configure -a finishes what an interrupted run left ($STATE/dpkg-interrupted, see apt-get.bash),
    # and refuses a package dpkg left half unpacked ($STATE/dpkg-reinstreq, one name per line: the
    # reinst-required flag; dpkg's src/main/configure.c), which only a reinstall clears.
    "dpkg": r"""
case $1 in
    --print-architecture) echo amd64 ;;
    --configure)
        rm -f "$STATE/dpkg-interrupted"
        if [[ -s $STATE/dpkg-reinstreq ]]; then
            printf 'dpkg: error processing package %s (--configure):\n' "$(head -n 1 "$STATE/dpkg-reinstreq")" >&2
            printf ' package is in a very bad inconsistent state; you should\n' >&2
            printf ' reinstall it before attempting configuration\n' >&2
            exit 1
        fi ;;
esac
""",
    # gpg on the key files curl "downloaded" (their body names the repository): --show-keys gives
    # the primary key's fingerprint ($STATE/gpg-fpr-<repo> overrides it), --import keeps the file
    # in the throwaway GNUPGHOME and --export gives it back. tests/test_k8s_scripts.py runs the
    # real gpg on real keys for what the pinning must keep and drop.
    "gpg": r"""
case " $* " in
    *" --import "*) cp "${*: -1}" "$GNUPGHOME/imported"; exit 0 ;;
    *" --export "*) cat "$GNUPGHOME/imported"; exit 0 ;;
esac
case $(cat "${*: -1}") in
    *docker*) repo=docker fpr=9DC858229FC7DD38854AE2D88D81803C0EBFCD88 ;;
    *kubernetes*) repo=kubernetes fpr=DE15B14486CD377B9E876E1A234654DA9A296436 ;;
    *) exit 2 ;;
esac
[[ ! -f $STATE/gpg-fpr-$repo ]] || fpr=$(cat "$STATE/gpg-fpr-$repo")
printf 'pub:-:4096:1:%s:1487788800:::-:::scESC::::::23::0:\nfpr:::::::::%s:\n' "${fpr: -16}" "$fpr"
""",
    "ip": r"""
if [[ $* == "-o route get "* ]]; then echo "${*: -1} dev ens192 src $HARNESS_NODE_IP uid 0"; exit 0; fi
[[ -f $STATE/flannel-up ]]
""",
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
fmt=$2; pkg=${3:-}
if [[ -z $pkg ]]; then
    # -W alone: every package, as finish_interrupted_dpkg asks ('${db:Status-Eflag} ${binary:Package}=${Version}').
    for f in "$STATE"/dpkg/*; do
        [[ -f $f ]] || continue
        eflag=ok; grep -qxF "${f##*/}" "$STATE/dpkg-reinstreq" 2>/dev/null && eflag=reinstreq
        printf '%s %s=%s\n' "$eflag" "${f##*/}" "$(cat "$f")"
    done
    exit 0
fi
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
        # A package dpkg left half unpacked fails every run of dpkg until it is reinstalled.
        if [[ " $* " == *" --reinstall "* ]]; then
            for p in "${pkgs[@]}"; do sed -i "/^${p%%=*}\$/d" "$STATE/dpkg-reinstreq" 2>/dev/null || true; done
        elif [[ -s $STATE/dpkg-reinstreq ]]; then
            echo "E: Sub-process /usr/bin/dpkg returned an error code (1)" >&2; exit 100
        fi
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
for arg in "$@"; do case $arg in http*) url=$arg ;; esac; done
case $url in
    https://*:6443/*) exec "$HARNESS_PYTHON" "$HARNESS_STANDIN" curl "$@" ;;
esac
while (($#)); do
    case $1 in -o) out=$2; shift ;; esac
    shift
done
# $STATE/offline: nothing answers; $STATE/key-edition: upstream re-issued its keys (same
# fingerprint, new expiry or subkeys: other bytes).
[[ ! -f $STATE/offline ]] || exit 6
case $url in
    */gpg|*/Release.key) repo=kubernetes; [[ $url == */gpg ]] && repo=docker
        block="PGP PUBLIC KEY BLOCK-----"
        printf -- '-----BEGIN %s\nfake %s%s\n-----END %s\n' "$block" "$repo" \
            "$(cat "$STATE/key-edition" 2>/dev/null || true)" "$block" >"$out" ;;
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
    # The cluster: one model shared by every node of a scenario (tests/kube_standin.py).
    "kubeadm": _MODEL.format(name="kubeadm"),
    "kubectl": _MODEL.format(name="kubectl"),
    "crictl": _MODEL.format(name="crictl"),
    "arping": _MODEL.format(name="arping"),
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
    # mke2fs makes every new ext4 filesystem with an empty lost+found (misc/mke2fs.c
    # create_lost_and_found); it shows in the mount point once the filesystem is mounted.
    "mkfs.ext4": r"""
dev=${*: -1}; base=${dev##*/}
mkdir -p "$STATE/fs"
echo ext4 >"$STATE/fs/$base.type"
echo 3f0c1a2b-4d5e-4f60-8a7b-9c0d1e2f3a4b >"$STATE/fs/$base.uuid"
touch "$STATE/fs/lost+found.3f0c1a2b-4d5e-4f60-8a7b-9c0d1e2f3a4b"
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
if [[ -f $STATE/fs/lost+found.${uuid%% *} ]]; then mkdir -p "$dir/lost+found"; fi
""",
    "findmnt": r"""
dir=${*: -1}
record=$(cat "$STATE/mounts/${dir//\//_}")
case $* in *UUID*) echo "${record%% *}" ;; *FSTYPE*) echo "${record##* }" ;; esac
""",
}


class ShellHarness:
    """One fake node: a root prefix, a state directory, stand-ins on PATH and a call log.

    Nodes made by one ClusterLab share its cluster model; a lone ShellHarness has a cluster of
    its own with this node in it.
    """

    def __init__(
        self, tmp_path: Path, node: str = "labs-k8s-m01", ip: str = "10.3.60.51", cluster: Path | None = None
    ) -> None:
        self.base = tmp_path
        self.node = node
        self.ip = ip
        self.cluster = cluster or tmp_path / "cluster"
        self.cluster.mkdir(parents=True, exist_ok=True)
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
            elif not (self.safe / tool).is_symlink():  # a copied node keeps its links
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
            "HARNESS_CLUSTER": str(self.cluster),
            "HARNESS_NODE": self.node,
            "HARNESS_NODE_IP": self.ip,
            "HARNESS_PYTHON": sys.executable,
            "HARNESS_STANDIN": str(STANDIN),
            # The stand-in kubeadm validates every --config with the real kubeadm first (and under
            # CI=true refuses to run without it): tests/kubeadm_real.py builds it once a session.
            "CI": os.environ.get("CI", ""),
            REAL_KUBEADM_DIR_ENV: str(kubeadm_real.build() or ""),
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


class ClusterLab:
    """Several fake nodes over one modelled cluster (kube_standin.py), with the balancers' VIP.

    `edit()` opens the model's state for a test to arrange a situation: time passing, a host
    down, kubeadm told to die after a phase, which balancers hold the VIP.
    """

    def __init__(self, tmp_path: Path, vip: str = "10.3.60.100") -> None:
        self.base = tmp_path
        self.dir = tmp_path / "cluster"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.nodes: dict[str, ShellHarness] = {}
        sys.path.insert(0, str(STANDIN.parent))
        with self.edit() as state:
            state["vip"] = vip

    @contextlib.contextmanager
    def edit(self) -> Iterator[dict[str, Any]]:
        from kube_standin import Cluster  # type: ignore[import-not-found]  # tests/ on sys.path above

        with Cluster(self.dir).locked() as cluster:
            yield cluster.s

    def state(self) -> dict[str, Any]:
        with self.edit() as state:
            return json.loads(json.dumps(state))

    def add_node(self, name: str, ip: str, role: str) -> ShellHarness:
        harness = ShellHarness(self.base / name, node=name, ip=ip, cluster=self.dir)
        self.nodes[name] = harness
        with self.edit() as state:
            state["hosts"][name] = {"ip": ip, "role": role, "root": str(harness.root), "up": True, "kubelet": False}
        return harness

    def add_balancer(self, name: str, mac: str, holds_vip: bool) -> None:
        with self.edit() as state:
            state["balancers"][name] = {"mac": mac, "holds_vip": holds_vip, "haproxy": True}

    def replace_vm(self, name: str) -> ShellHarness:
        """A new VM under the same name and address: an empty disk, nothing running."""
        old = self.nodes[name]
        with self.edit() as state:
            role = state["hosts"][name]["role"]
        fresh = ShellHarness(
            self.base / f"{name}-replaced-{len(list(self.base.glob(name + '-replaced-*')))}",
            node=name,
            ip=old.ip,
            cluster=self.dir,
        )
        self.nodes[name] = fresh
        with self.edit() as state:
            state["hosts"][name] = {"ip": old.ip, "role": role, "root": str(fresh.root), "up": True, "kubelet": False}
        return fresh

    def advance(self, hours: float) -> None:
        with self.edit() as state:
            state["now"] += hours * 3600

    def die_after(self, node: str, workflow: str, phase: str) -> None:
        with self.edit() as state:
            state["die"].setdefault(node, {})[workflow] = phase

    def set_up(self, node: str, up: bool) -> None:
        with self.edit() as state:
            state["hosts"][node]["up"] = up

    def stall_bootstrap(self, node: str, stalls: bool) -> None:
        """The node's kubelet runs but its TLS bootstrap does not finish (its CSR is never signed,
        or it crash-loops before it sends one) while `stalls` holds."""
        with self.edit() as state:
            state["hosts"][node]["bootstrap_stalls"] = stalls

    def lag_node_registration(self, node: str, commands: int) -> None:
        """The node's kubelet registers its Node `commands` stand-in commands after it has its
        certificate (kube_standin.Cluster.register_nodes), not at once."""
        with self.edit() as state:
            state["hosts"][node]["registration_lag"] = commands

    def restart_kubelet(self, node: str) -> None:
        """systemd restarts the node's kubelet (kube_standin.Cluster.restart_kubelet)."""
        from kube_standin import Cluster

        with Cluster(self.dir).locked() as cluster:
            cluster.restart_kubelet(node)

    def healthy_control_planes(self) -> list[str]:
        """What HAProxy's `balance first` on the cluster SSH port picks from: control planes in
        config order whose API server answers."""
        from kube_standin import Cluster

        with Cluster(self.dir).locked() as cluster:
            return [n for n in cluster.control_plane_hosts() if cluster.apiserver_running(n)]

    def cluster_node(self) -> ShellHarness:
        """The node a cluster-wide step lands on through the VIP (the first healthy control plane)."""
        healthy = self.healthy_control_planes()
        assert healthy, "no control plane is healthy: a cluster-wide step could not connect"
        return self.nodes[healthy[0]]

    def members(self) -> list[dict[str, Any]]:
        return self.state()["members"]

    def objects(self) -> dict[str, Any]:
        return self.state()["objects"]


def modes(path: Path) -> int:
    return os.stat(path).st_mode & 0o777
