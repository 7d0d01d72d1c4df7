"""TEST ONLY: a host of the lab in a box with systemd as PID 1, its CPU and memory its own cgroup's.

The next shape of the box's hosts (issue 49): the kubelet takes its cgroup driver from containerd
(KubeletCgroupDriverFromCRI, GA and locked since 1.34) and prepare-node.sh sets `SystemdCgroup =
true`, so the kubelet's pod slices and runc's container scopes are asked of systemd over D-Bus, which
the stand-in runner (tests/tools/box/init.sh, sbin/systemctl.sh) cannot answer. A `SystemdHost` is a
mount, UTS, IPC, network, PID and cgroup namespace booted by tests/tools/box/systemd-host-boot.sh:
the sealed template rootfs overlaid, the cgroup hierarchies of its own cgroups, /proc/sys read-only
but for net/ and the kubelet's kernel tunables (`KUBELET_SYSCTLS`, each a file of the host's).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BOOT = REPO / "tests" / "tools" / "box" / "systemd-host-boot.sh"
CGROUP_ROOT = Path("/sys/fs/cgroup")
# The machine-wide settings the kubelet writes at start (k8s.io/kubernetes@v1.37.2
# pkg/kubelet/cm/container_manager_linux.go setupKernelTunables): shadowed in every host.
KUBELET_SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
)


def hierarchies() -> list[Path]:
    """This machine's cgroup hierarchies (v1 controllers, the named systemd one, v2's unified)."""
    return sorted(path for path in CGROUP_ROOT.iterdir() if path.is_dir() and not path.is_symlink())


@dataclass
class SystemdHost:
    name: str
    rootfs: Path  # the sealed template rootfs, read-only lower layer
    directory: Path
    memory_mib: int = 2048
    cpus: float = 2.0
    netns: str | None = None  # a named network namespace (ip netns) to boot in; None: a new, empty one
    data_disk: tuple[Path, str] | None = None  # the VM's second disk: (ext4 image, mount point)
    modules: Path | None = None  # shown as /lib/modules/<release> (tests/lab_box.py modules_index)
    # Directories on the VM's own disk (an ext4 image of the host's, kept across power cycles), not on
    # the overlay root: containerd's overlay snapshots cannot live on an overlay, and the kubelet
    # judges its nodefs (DiskPressure) by the filesystem its root is on.
    scratch: tuple[str, ...] = ()
    disk_gib: int = 20
    # A drop-in for systemd's manager (system.conf.d), put in the host's /run before systemd starts:
    # how a lab-box clone gets its guestinfo (tests/firstboot.py systemd_dropin).
    system_conf: str | None = None
    binds: tuple[tuple[Path, str], ...] = ()  # (directory of the machine's, where the host sees it)
    cgroup_parent: str = ""  # a cgroup (in every hierarchy) the host's own is made under
    cgroup_name: str = ""  # the host's cgroup; default labs-k8s-host-<pid>-<name>
    proc: subprocess.Popen[bytes] | None = None
    cgroups: list[Path] = field(default_factory=list)

    def start(self) -> None:
        for sub in ("upper", "work", "root", "sysctl"):
            (self.directory / sub).mkdir(parents=True, exist_ok=True)
        # The box's deviations in the host's own layer: its root is an overlay, not the VM's disk
        # /etc/fstab names, so systemd-remount-fs (remount / by fstab's UUID) has nothing to do.
        masked = self.directory / "upper" / "etc" / "systemd" / "system" / "systemd-remount-fs.service"
        masked.parent.mkdir(parents=True, exist_ok=True)
        if not masked.is_symlink():
            masked.symlink_to("/dev/null")
        for key in KUBELET_SYSCTLS:  # what the VM's kernel would answer before anything writes
            value = Path("/proc/sys", key.replace(".", "/")).read_text()
            (self.directory / "sysctl" / key).write_text(value)
        group = self.cgroup_name or f"labs-k8s-host-{os.getpid()}-{self.name}"
        for hierarchy in hierarchies():
            parents = [hierarchy / self.cgroup_parent] if self.cgroup_parent else []
            for path in [*parents, hierarchy / self.cgroup_parent / group]:
                path.mkdir(exist_ok=True)
                if hierarchy.name == "cpuset":  # a new cpuset has no CPUs or memory nodes until given
                    for knob in ("cpuset.cpus", "cpuset.mems"):
                        (path / knob).write_text((hierarchy / knob).read_text())
            self.cgroups.append(path)
            if hierarchy.name == "memory":  # bounded as a VM's memory is
                (path / "memory.limit_in_bytes").write_text(str(self.memory_mib * 1024 * 1024))
            elif hierarchy.name == "cpu":
                (path / "cpu.cfs_period_us").write_text("100000")
                (path / "cpu.cfs_quota_us").write_text(str(int(self.cpus * 100000)))
        procs = " ".join(str(path / "cgroup.procs") for path in self.cgroups)
        # The shell joins the host's cgroups first, then unshares: the new cgroup namespace's root
        # is the host's cgroup.
        script = f'for f in {procs}; do echo $$ > "$f"; done; exec "$@"'
        net = ["ip", "netns", "exec", self.netns] if self.netns else []
        unshare = ["unshare", "--cgroup", "--mount", "--uts", "--ipc", *([] if self.netns else ["--net"])]
        argv = [*net, *unshare, "--pid", "--fork", "bash", str(BOOT)]
        paths = [self.directory / sub for sub in ("root", "upper", "work", "sysctl")]
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
        if self.scratch:
            disk = self.directory / "disk.img"
            if not disk.exists():  # sparse: the box has no room for the GiBs a VM's disk reserves
                subprocess.run(["truncate", "-s", f"{self.disk_gib}G", str(disk)], check=True)
                subprocess.run(["mkfs.ext4", "-q", str(disk)], check=True)
            env |= {"BOX_DISK_IMAGE": str(disk), "BOX_SCRATCH": " ".join(self.scratch)}
        if self.data_disk is not None:
            env |= {"BOX_DATA_IMAGE": str(self.data_disk[0]), "BOX_DATA_MOUNT": self.data_disk[1]}
        if self.modules is not None:
            env["BOX_MODULES"] = str(self.modules)
        if self.system_conf is not None:
            (self.directory / "system.conf").write_text(self.system_conf)
            env["BOX_SYSTEM_CONF"] = str(self.directory / "system.conf")
        if self.binds:
            env["BOX_BINDS"] = " ".join(f"{source}={target}" for source, target in self.binds)
        self.proc = subprocess.Popen(
            ["bash", "-c", script, "bash", *argv, str(paths[0]), str(self.rootfs), *map(str, paths[1:])],
            stdout=(self.directory / "boot.log").open("w"),
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

    def init_pid(self) -> int:
        """systemd, as this machine numbers it: the one child of `unshare --fork`."""
        assert self.proc is not None and self.proc.poll() is None, (self.directory / "boot.log").read_text()
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        assert len(children) == 1, children
        return int(children[0])

    def run(self, *argv: str, timeout: float = 60, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """`argv` in the host's namespaces and root, as root."""
        return subprocess.run(
            ["nsenter", "-t", str(self.init_pid()), "-a", "--", *argv],
            capture_output=True, text=True, timeout=timeout, input=input, check=False,
            env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
        )  # fmt: skip

    def boot_state(self) -> str | None:
        """systemd's verdict once the boot has finished (running, degraded: see failed_units), or None."""
        assert self.proc is not None and self.proc.poll() is None, (self.directory / "boot.log").read_text()
        if self._has_init() and Path(f"/proc/{self.init_pid()}/comm").read_text().strip() == "systemd":
            # "offline": systemd has not yet opened its private bus for systemctl.
            state = self.run("systemctl", "is-system-running").stdout.strip()
            if state not in ("initializing", "starting", "offline", ""):
                return state
        return None

    def wait_booted(self, timeout: float = 180) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.boot_state()
            if state is not None:
                return state
            time.sleep(1)
        raise AssertionError(f"{self.name} did not finish booting: {(self.directory / 'boot.log').read_text()}")

    def _has_init(self) -> bool:
        assert self.proc is not None
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        return len(children) == 1

    def failed_units(self) -> list[str]:
        out = self.run("systemctl", "list-units", "--failed", "--plain", "--no-legend").stdout
        return sorted(line.split()[0] for line in out.splitlines() if line.strip())

    def stop(self) -> None:
        """Kill every process of the host (PID 1 of its namespace, so all of it), then its cgroups."""
        if self.proc is not None and self.proc.poll() is None:
            if self._has_init():  # SIGKILL to a PID namespace's init kills the whole namespace
                os.kill(self.init_pid(), signal.SIGKILL)
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        for group in self.cgroups:
            deadline = time.monotonic() + 30
            below = [path for path in group.rglob("*") if path.is_dir()]
            for path in [*sorted(below, key=lambda p: -len(p.parts)), group]:
                while path.is_dir():
                    try:
                        path.rmdir()
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.2)
        self.cgroups.clear()
        shutil.rmtree(self.directory / "work", ignore_errors=True)
