"""The lab in a box (issue #31): every clone vcsim powers on becomes a Linux host on this machine.

The real Pulumi CLI and plugins run in the engine's network namespace (tests/pulumi_engine.py)
against vcsim there. The box adds:

- the lab's network: a bridge in the engine's namespace carrying the stack's gateway address, so
  the CLI (and so pulumi-command's SSH) reaches the node addresses, and the nodes reach each other
  and the CLI's namespace, and nothing else: that namespace has no other way out;
- one node host per clone (`NodeHost`), started when vcsim reports the clone powered on, stopped
  when it is powered off, removed with its disk when the VM is gone (tests/engine_box.py
  `watch_clones` reports each change): a network namespace whose one NIC is a veth on the bridge
  with the VM's MAC (cloud-init finds it by that MAC and renames it, as on vSphere), and a mount,
  UTS and PID namespace whose root is an overlay of the template's sealed rootfs
  (tests/firstboot.py `sealed_rootfs`: debootstrap, what the installer adds, then the project's
  own seal script) with an upper layer of the VM's own. A replaced VM is a new VM uuid, so a new
  upper layer: its disk is new, as on vSphere;
- the clone's guestinfo, exactly as the real vSphere provider set it in vcsim (values and
  encodings, read back from the VM's extraConfig), handed to cloud-init 22.4's VMware datasource
  through its environment transport (VMX_GUESTINFO_*, tests/firstboot.py guestinfo_environment):
  the rest of cloud-init's first boot (users, keys, host keys, hostname, sudoers, network config)
  is cloud-init's own, on the rendered user-data.

What is not a VM here, and says so: systemd is not PID 1 in a host. tests/tools/box/init.sh starts
what a booted clone runs, in systemd's order (cloud-init's four stages, ifupdown, sshd), and a
stand-in `systemctl` (tests/tools/box/sbin/) keeps unit state on disk as systemctl does, runs
services through their packages' init scripts, and runs a unit that has none (kubelet,
containerd) from its ExecStart= under a supervisor (unit-run.sh). The data disk of a control plane
or worker is an ext4 image file of the VM's own, mounted at its mount point before the host's init
starts, as cloud-init's disk_setup, fs_setup and mounts leave it at first boot: cloud-init's
disk_setup of a real disk is proven in QEMU (tests/test_firstboot_qemu.py), and a loop device is
not a disk cloud-init will partition. The image outlives power cycles (etcd's data survives a
power-off, as on a VM's disk) and goes with the VM. The kernel is the machine's: /lib/modules of
its release, or, where the machine has none (everything built in), an index of the built-in
modules the lab asks modprobe for (`modules_index`). /proc/swaps shows no swap: the machine's swap
is not the VM's to turn off.

With `systemd=True` (the real programs: tests/test_lab_box_real.py) a host is a tests/systemd_host.py
host instead: systemd as PID 1 boots the template's own units (systemd-sysctl, cloud-init's four
stages, ifupdown, sshd, journald), the guestinfo reaching them through a systemd manager drop-in
(tests/firstboot.py systemd_dropin) in the host's /run; each host's profile (`HostProfile`) adds the
box's deviations for the real programs (tests/real_node.py `host_profile`). The stand-in init goes
with the stand-ins (issue 49).

The Kubernetes stand-ins the nodes install (tests/tools/box/standin/, packaged by
tests/box_repo.py) share one cluster store, a directory of the box's bind-mounted into every host
(`store`): see tests/tools/box/standin/box_cluster.py for what goes through it and what goes
through the network.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.firstboot import guestinfo_environment, systemd_dropin
from tests.kube_standin import Cluster, empty_state
from tests.systemd_host import SystemdHost, hierarchies

REPO = Path(__file__).resolve().parents[1]
BOX_TOOLS = REPO / "tests" / "tools" / "box"
HOST_BOOT = BOX_TOOLS / "host-boot.sh"
HOST_INIT = BOX_TOOLS / "init.sh"
HOST_SYSLOGD = BOX_TOOLS / "syslogd.py"
HOST_SBIN = BOX_TOOLS / "sbin"
INIT_IN_HOST = "usr/local/lib/labs-k8s-box/init"
BOOT_LOG = "var/log/labs-k8s-box-boot.log"
# sshd writes a file of its own (VERBOSE: each session's close and its reason), the other daemons
# syslog (tests/tools/box/syslogd.py).
SSHD_LOG = "var/log/labs-k8s-box-sshd.log"
SYSLOG = "var/log/labs-k8s-box-syslog.log"
# Where a systemd host sees the stand-ins' cluster store (tests/tools/box/standin/box_cluster.py).
STORE_IN_HOST = "/var/lib/labs-k8s-box/cluster"
BRIDGE = "lk8s-box0"
GATEWAY_MAC = "02:00:0a:03:3c:01"  # locally administered


# The hosts' CPU. On vSphere each node is a VM with vCPUs of its own; in the box, every host shares
# this machine's cores with the CLI. With the scheduler's autogroups (sched_autogroup_enabled, on by
# default) every session gets an equal share, and every host (start_new_session) and every SSH
# session in it (sshd calls setsid) is a session of its own, so fifteen booting hosts left the CLI,
# its plugins and the program a sixteenth of the machine, and the engine's own work (checkpoints,
# scheduling) was timed as the wait for CPU. All hosts run in one cgroup of its own, whose CPU
# weight is one session's: together they get at most half the machine while the CLI wants CPU, and
# all of it while it does not (a task outside the root cgroup has no autogroup:
# kernel/sched/autogroup.c task_wants_autogroup).
CGROUP_V2 = Path("/sys/fs/cgroup")
CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")


def hosts_cpu_group(name: str) -> Path | None:
    """A new cgroup `name` with the CPU controller at the default weight, or None (no writable
    cgroup with one here: the hosts then share CPU as any other process does, and the box says so)."""
    try:
        if (CGROUP_V2 / "cgroup.controllers").exists():
            if "cpu" not in (CGROUP_V2 / "cgroup.subtree_control").read_text().split():
                (CGROUP_V2 / "cgroup.subtree_control").write_text("+cpu")
            group = CGROUP_V2 / name
        elif (CGROUP_V1_CPU / "cpu.shares").exists():
            group = CGROUP_V1_CPU / name
        else:
            return None
        group.mkdir(exist_ok=True)
    except OSError:
        return None
    return group


def remove_cpu_group(group: Path, timeout: float = 10) -> None:
    """rmdir, once the killed hosts' last tasks have left it (EBUSY until then)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"ip {' '.join(args)}: {result.stderr}"


@dataclass(frozen=True)
class DataDiskImage:
    """A node's second disk: where cloud-init mounts it, the label fs_setup gives it, its size."""

    mount_point: str
    label: str
    gib: int


@dataclass(frozen=True)
class HostProfile:
    """What the box gives a kind of VM beyond the template: its memory, the directories kept on an
    ext4 disk of its own (tests/systemd_host.py `scratch`), and the box's deviation files written
    into its layer before its first boot ({path in the host: (file of the machine's, mode)})."""

    memory_mib: int = 2048
    scratch: tuple[str, ...] = ()
    files: Mapping[str, tuple[Path, int]] = field(default_factory=dict)


def modules_index(root: Path, rootfs: Path) -> Path:
    """What the hosts see as /lib/modules/<release> of the running kernel: the machine's own tree
    when it has one; otherwise (a kernel with everything built in) an index, made with the
    template's own depmod, listing as built in the modules prepare-node.sh asks modprobe for,
    where the kernel offers them (overlay in /proc/filesystems, br_netfilter's sysctls), so that
    modprobe answers as on that kernel: success for a built-in, "not found" for what it lacks."""
    release = os.uname().release
    machine = Path("/lib/modules") / release
    if machine.is_dir():
        return machine
    index = root / "modules"
    tree = index / "lib/modules" / release
    tree.mkdir(parents=True, exist_ok=True)
    builtin = []
    if "overlay" in Path("/proc/filesystems").read_text().split():
        builtin.append("kernel/fs/overlayfs/overlay.ko")
    if Path("/proc/sys/net/bridge/bridge-nf-call-iptables").exists():
        builtin.append("kernel/net/bridge/br_netfilter.ko")
    (tree / "modules.builtin").write_text("".join(f"{line}\n" for line in builtin))
    (tree / "modules.order").write_text("")
    # depmod from the template (the machine may have no kmod), in a mount namespace of its own so
    # the cached rootfs is not touched: the index is bind-mounted at its /mnt.
    script = 'mount --bind "$1" "$2/mnt" && chroot "$2" /sbin/depmod -b /mnt "$3"'
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(index), str(rootfs), release],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"depmod of the modules index failed: {done.stderr}"
    return tree


@dataclass
class NodeHost:
    """One clone as a host: see the module docstring."""

    uuid: str
    name: str
    mac: str
    vm: str  # the managed object id: one VM (tests/engine_box.py clone_facts)
    guestinfo: dict[str, str]
    directory: Path
    netns: str
    veth: str
    data_disk: DataDiskImage | None = None
    proc: subprocess.Popen[bytes] | None = None  # the stand-in init's host
    system: SystemdHost | None = None  # a systemd host (LabBox.systemd), while powered on
    boots: int = 0

    @property
    def upper(self) -> Path:
        return self.directory / "upper"

    def journal(self, *args: str) -> str:
        """A systemd host's journal on its disk (Debian 12's journald keeps it in /var/log/journal),
        read with the machine's journalctl: also after the host is powered off."""
        directory = self.upper / "var/log/journal"
        if not directory.is_dir():
            return ""
        shown = subprocess.run(
            ["journalctl", "--directory", str(directory), "--no-pager", "-o", "short-precise", *args],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        return shown.stdout

    def boot_log(self) -> str:
        if self.system is not None:  # systemd's console, and the journal's tail
            console = self.directory / "boot.log"
            tail = self.journal("-b", "-n", "200") if self.running() else ""
            return (console.read_text(errors="replace") if console.is_file() else "") + tail
        log = self.upper / BOOT_LOG
        return log.read_text(errors="replace") if log.is_file() else ""

    def booted(self) -> bool:
        if self.system is not None:  # systemd finished this boot's jobs (cloud-init's final stage too)
            return self.running() and self.system.boot_state() is not None
        return self.boot_log().count("labs-k8s-box: booted") >= self.boots

    def running(self) -> bool:
        if self.system is not None:
            return self.system.proc is not None and self.system.proc.poll() is None
        return self.proc is not None and self.proc.poll() is None

    def init_pid(self) -> int:
        """The host's PID 1 (init.sh), as this machine numbers it: the child `unshare` forked into the
        new PID namespace (`ip netns exec` execs unshare, so `proc` is unshare itself)."""
        if self.system is not None:
            return self.system.init_pid()
        assert self.proc is not None, f"{self.name} is not running"
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        assert len(children) == 1, f"{self.name}: unshare has children {children}"
        return int(children[0])

    def run(self, *argv: str, timeout: float = 60, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """`argv` inside the running host (its namespaces and root), as root: what a console login sees."""
        if self.system is not None:
            return self.system.run(*argv, timeout=timeout, input=input)
        return subprocess.run(
            ["nsenter", "-t", str(self.init_pid()), "-n", "-m", "-u", "-p", "-r", "-w", "--", *argv],
            capture_output=True, text=True, timeout=timeout, input=input, check=False,
            env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
        )  # fmt: skip


# What the cluster store holds that is not etcd's: the machines and balancers the stand-ins know,
# the VIP, and the tests' plans (a phase to die in, a canned status).
NOT_IN_ETCD = ("hosts", "balancers", "vip", "node_grace_s", "die", "status_override")


def forget_cluster_without_members(store: Path, machines: set[str]) -> dict[str, Any] | None:
    """The store is what etcd's replication makes one (box_cluster.py), and etcd's data is on its
    members' disks (/var/lib/etcd, their data disk): when no VM named as a member is left among
    `machines`, no disk holds the cluster, so the store forgets it (its API objects, members and
    cluster CA), as `make destroy` takes the cluster with the VMs on vCenter. Without this the
    next `make up` after `make destroy` found the old members and its kubeadm init's etcd waited
    for them (bench/lab_box.py, the template-reused run). Returns the state it forgot, if any."""
    path = store / "cluster.json"
    with (store / "cluster.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the stand-ins' own lock (kube_standin.Cluster.locked)
        if not path.is_file():
            return None
        state: dict[str, Any] = json.loads(path.read_text())
        members = {str(m.get("name")) for m in state.get("members", [])}
        if not members or members & machines:
            return None
        fresh = {**empty_state(), **{key: state[key] for key in NOT_IN_ETCD if key in state}}
        fresh["hosts"] = {name: facts for name, facts in fresh["hosts"].items() if name in machines}
        fresh["balancers"] = {name: facts for name, facts in fresh["balancers"].items() if name in machines}
        cluster = Cluster(store)
        cluster.s = fresh
        cluster.save()  # the stand-ins' own write, by rename: daemons read without the lock
        shutil.rmtree(store / "pki", ignore_errors=True)
        return state


@dataclass
class LabBox:
    """The hosts of one engine lab; `follow` reads the engine box's CLONE lines (tests/engine_box.py)."""

    root: Path
    engine_netns: str
    rootfs: Path  # the sealed template rootfs, every host's lower layer
    gateway: str  # with its prefix, e.g. 10.3.60.1/24: the stack's network.gateway
    data_disks: Mapping[str, DataDiskImage] = field(default_factory=dict)  # VM name -> its second disk
    # The hosts boot systemd (tests/systemd_host.py), as the real programs need; else the stand-in
    # init (tests/tools/box/init.sh), which the stand-ins' scenario runs on until it goes (issue 49).
    systemd: bool = False
    profiles: Mapping[str, HostProfile] = field(default_factory=dict)  # VM name -> its profile (systemd)
    # Where the box's VMware Tools write each running VM's guest address for the engine box to put
    # into vcsim (`report_guest_addresses`); None: not reported.
    guest_addresses: Path | None = None
    hosts: dict[str, NodeHost] = field(default_factory=dict)  # by VM (managed object id)
    events: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # The cluster stores `forget_cluster_without_members` took away, as the last member's VM left them.
    forgotten_clusters: list[dict[str, Any]] = field(default_factory=list)
    _count: int = 0
    cpu_group: Path | None = None  # hosts_cpu_group: where every host runs

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.cpu_group = hosts_cpu_group(f"labs-k8s-box-{os.getpid()}-{self.root.name}")
        if self.cpu_group is None:
            print("labs-k8s box: no writable cgroup with a CPU controller: the hosts compete with the CLI "
                  "for CPU as sessions of their own", flush=True)  # fmt: skip
        self.store.mkdir(mode=0o700, exist_ok=True)
        self.modules = modules_index(self.root, self.rootfs)
        # A fixed MAC: a bridge without one takes its ports' lowest, so it changed whenever a VM
        # came or went, and the nodes' ARP entries for the gateway (the CLI) went stale; a real
        # gateway's does not change when a VM powers on.
        _ip("-n", self.engine_netns, "link", "add", BRIDGE, "address", GATEWAY_MAC, "type", "bridge")
        _ip("-n", self.engine_netns, "addr", "add", self.gateway, "dev", BRIDGE)
        _ip("-n", self.engine_netns, "link", "set", BRIDGE, "up")

    def follow(self, lines: Iterable[str]) -> threading.Thread:
        """Act on every CLONE line of `lines` (the engine box's stdout), in a thread of its own."""

        def loop() -> None:
            for line in lines:
                if line.startswith("CLONE "):
                    self.on_clone(json.loads(line.removeprefix("CLONE ")))

        thread = threading.Thread(target=loop, daemon=True)
        if self.guest_addresses is not None:
            threading.Thread(target=self.report_guest_addresses, daemon=True).start()
        thread.start()
        return thread

    def on_clone(self, facts: dict[str, Any]) -> None:
        with self.lock:
            self.events.append({**facts, "at": time.time()})
            state = facts["state"]
            host = self.hosts.get(str(facts.get("vm") or facts["uuid"]))
            if state == "poweredOn":
                if host is None:
                    host = self._new_host(facts)
                self._boot(host)
            elif host is not None:
                self._halt(host)
                if state == "gone":
                    self._remove(host)

    def _new_host(self, facts: Mapping[str, Any]) -> NodeHost:
        self._count += 1
        vm = str(facts.get("vm") or facts["uuid"])
        directory = self.root / f"{facts['name']}-{facts['uuid'][:8]}-{vm}"
        host = NodeHost(
            uuid=facts["uuid"], name=facts["name"], mac=facts["mac"], vm=vm, guestinfo=dict(facts["guestinfo"]),
            directory=directory, netns=f"lk8s-box-{os.getpid()}-{self._count}",
            veth=f"lk8sb{os.getpid() % 1000}n{self._count}",
            data_disk=self.data_disks.get(facts["name"]),
        )  # fmt: skip
        for sub in ("upper", "work", "root"):
            (directory / sub).mkdir(parents=True, exist_ok=True)
        if host.data_disk is not None:
            # A new VM's new disk, formatted as fs_setup formats it (sparse: the box has no room for
            # eager-zeroed GiBs).
            image = host.directory / "data-disk.img"
            subprocess.run(["truncate", "-s", f"{host.data_disk.gib}G", str(image)], check=True)
            subprocess.run(["mkfs.ext4", "-q", "-L", host.data_disk.label, str(image)], check=True)
        self.hosts[host.vm] = host
        if self.systemd:
            for path, (source, mode) in self.profile(host.name).files.items():
                target = host.upper / path
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)
                target.chmod(mode)
            return host
        # The box's own files, in the VM's layer (test only, module docstring): its init and the
        # systemctl stand-in, ahead of /usr/bin in every PATH (sudo's secure_path included).
        init = host.upper / INIT_IN_HOST
        init.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(HOST_INIT, init)
        shutil.copy2(HOST_SYSLOGD, init.parent / "syslogd")
        sbin = host.upper / "usr/local/sbin"
        sbin.mkdir(parents=True, exist_ok=True)
        for tool in HOST_SBIN.glob("*.sh"):
            shutil.copy2(tool, sbin / tool.stem)  # systemctl.sh is the host's systemctl
        default_ssh = host.upper / "etc/default/ssh"
        default_ssh.parent.mkdir(parents=True, exist_ok=True)
        default_ssh.write_text(
            f'# labs-k8s box (test only): sshd logs to a file\nSSHD_OPTS="-E /{SSHD_LOG} -o LogLevel=VERBOSE"\n'
        )
        return host

    def profile(self, name: str) -> HostProfile:
        return self.profiles.get(name, HostProfile())

    def _boot_systemd(self, host: NodeHost) -> None:
        """Every host's cgroups under the box's (one session's CPU weight: `hosts_cpu_group`)."""
        disk, profile = host.data_disk, self.profile(host.name)
        host.system = SystemdHost(
            host.name, self.rootfs, host.directory, netns=host.netns, modules=self.modules,
            data_disk=(host.directory / "data-disk.img", disk.mount_point) if disk is not None else None,
            system_conf=systemd_dropin(guestinfo_environment(host.guestinfo)),
            binds=((self.store, STORE_IN_HOST),),
            cgroup_parent=self.cpu_group.name if self.cpu_group is not None else "",
            cgroup_name=host.directory.name, memory_mib=profile.memory_mib, scratch=profile.scratch,
        )  # fmt: skip
        host.system.start()

    def _boot(self, host: NodeHost) -> None:
        if host.running():
            return
        _ip("netns", "add", host.netns)
        engine = ("-n", self.engine_netns)
        _ip(*engine, "link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
        _ip("-n", host.netns, "link", "set", "eth0", "address", host.mac)
        _ip("-n", self.engine_netns, "link", "set", host.veth, "master", BRIDGE, "up")
        if self.systemd:
            host.boots += 1
            self._boot_systemd(host)
            return
        env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", **guestinfo_environment(host.guestinfo),
            "BOX_STORE": str(self.store), "BOX_MODULES": str(self.modules),
        }  # fmt: skip
        disk = host.data_disk
        data = [str(host.directory / "data-disk.img"), disk.mount_point] if disk is not None else []
        host.boots += 1
        log = (host.directory / "host.log").open("ab")
        # The host's first process joins the hosts' cgroup before it execs the rest, so that every
        # process of the host (and of its SSH sessions) is born in it.
        join: list[str] = []
        if self.cpu_group is not None:
            join = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.cpu_group / "cgroup.procs")]
        host.proc = subprocess.Popen(
            [*join, "ip", "netns", "exec", host.netns, "unshare", "--mount", "--uts", "--pid", "--fork",
             "--propagation", "private", "bash", str(HOST_BOOT), str(host.directory / "root"), str(self.rootfs),
             str(host.upper), str(host.directory / "work"), *data],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, start_new_session=True,
        )  # fmt: skip
        log.close()

    def _halt(self, host: NodeHost) -> None:
        """Power off: every process of the host killed at once (a VM powered off does not shut down)."""
        if host.system is not None:
            host.system.stop()
            host.system = None
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True, check=False)
            return
        if host.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(host.proc.pid, 9)
        pids = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True, check=False)
        for pid in pids.stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)
        with contextlib.suppress(subprocess.TimeoutExpired):
            host.proc.wait(timeout=10)
        host.proc = None
        subprocess.run(["ip", "netns", "del", host.netns], capture_output=True, check=False)

    def _remove(self, host: NodeHost) -> None:
        """The VM is gone, and its disk: only its logs are kept (`logs`), for the artifacts. The host
        leaves `hosts` last, so a reader that sees it gone (under the lock or not) also sees the
        cluster its disk took with it in `forgotten_clusters`."""
        self.keep_logs(host)
        shutil.rmtree(host.directory, ignore_errors=True)
        left = {h.name for h in self.hosts.values() if h is not host}
        forgotten = forget_cluster_without_members(self.store, left)
        if forgotten is not None:
            self.forgotten_clusters.append(forgotten)
        del self.hosts[host.vm]

    def report_guest_addresses(self) -> None:
        """VMware Tools, for the drills (components/tools/drills/vcenter.py reads guest.ipAddress):
        each running host's address as its NIC holds it, the VIP while it holds one (a Keepalived
        VIP is the address the drill looks for), written to `guest_addresses` as {VM: address},
        which the engine box sets in vcsim (tests/engine_box.py `apply_guest_addresses`). Real
        Tools report every 30 s by default; this every second, so the drills' bounds measure the lab.
        vcsim holds one guest address per VM (its SET.guest.ipAddress), so a VIP holder reports
        the VIP alone."""
        assert self.guest_addresses is not None
        written: dict[str, str] = {}
        while True:
            with self.lock:
                running = [(h.vm, h.netns) for h in self.hosts.values() if h.running()]
            report: dict[str, str] = {}
            for vm, netns in running:
                shown = subprocess.run(
                    ["ip", "-n", netns, "-4", "-o", "addr", "show", "scope", "global"],
                    capture_output=True, text=True, check=False,
                )  # fmt: skip
                lines = shown.stdout.splitlines()
                # Keepalived adds the VIP in the node's own subnet (cloudinit/lb/keepalived.conf.j2),
                # so the kernel lists it as a secondary address.
                vip = next((line.split()[3].split("/")[0] for line in lines if " secondary " in line), None)
                if lines:
                    report[vm] = vip or lines[0].split()[3].split("/")[0]
            if report != written:
                staged = self.guest_addresses.with_suffix(".staged")
                staged.write_text(json.dumps(report))
                os.replace(staged, self.guest_addresses)
                written = report
            time.sleep(1)

    @property
    def store(self) -> Path:
        """The Kubernetes stand-ins' shared cluster store (module docstring), root-only."""
        return self.root / "cluster-store"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def keep_logs(self, host: NodeHost) -> None:
        """The host's boot log, systemctl stand-in log, cloud-init's log and the steps' logs, into
        `logs/<VM name>-<uuid>/`."""
        target = self.logs / host.directory.name
        target.mkdir(parents=True, exist_ok=True)
        logs = [*(host.upper / "var/log").glob("labs-k8s*"), host.upper / "var/log/cloud-init.log"]
        for log in [*logs, host.directory / "boot.log"]:
            if log.is_file():
                shutil.copy2(log, target / log.name)
        if self.systemd:
            (target / "journal.log").write_text(host.journal())

    # A machine vCenter does not know about: the tests' impostor, or a VM cut off from the network.
    def halt_outside_vcenter(self, host: NodeHost) -> None:
        with self.lock:
            self._halt(host)

    def boot_outside_vcenter(self, host: NodeHost) -> None:
        with self.lock:
            self._boot(host)

    def start_outside_vcenter(self, name: str, mac: str, guestinfo: Mapping[str, str]) -> NodeHost:
        facts = {"uuid": f"outside-{name}", "name": name, "mac": mac, "guestinfo": dict(guestinfo)}
        with self.lock:
            host = self._new_host(facts)
            self._boot(host)
        return host

    def forget(self, host: NodeHost) -> None:
        with self.lock:
            self._remove(host)

    def names(self) -> list[str]:
        return sorted(h.name for h in self.snapshot())

    def snapshot(self) -> list[NodeHost]:
        """The hosts now, read under the lock: the engine's clones add and remove them meanwhile."""
        with self.lock:
            return list(self.hosts.values())

    def by_name(self, name: str) -> NodeHost:
        with self.lock:
            found = [h for h in self.hosts.values() if h.name == name]
        assert len(found) == 1, f"{len(found)} hosts named {name}: {[h.uuid for h in found]}"
        return found[0]

    def wait_booted(self, names: Iterable[str], timeout: float = 300) -> float:
        """Seconds until each named VM has a host that finished booting (init.sh's last line)."""
        started = time.monotonic()
        wanted = set(names)
        while True:
            with self.lock:
                done = {h.name for h in self.hosts.values() if h.running() and h.booted()}
            if wanted <= done:
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                detail = "\n".join(
                    f"--- {h.name} ({h.uuid}) running={h.running()}\n{h.boot_log()[-2000:]}"
                    for h in self.hosts.values()
                )
                raise AssertionError(f"hosts {sorted(wanted - done)} did not boot in {timeout:g}s:\n{detail}")
            time.sleep(1)

    def close(self) -> None:
        with self.lock:
            for host in list(self.hosts.values()):
                self._halt(host)
                self.keep_logs(host)
            if self.cpu_group is not None:
                remove_cpu_group(self.cpu_group)
                if self.systemd:  # the hosts' parent SystemdHost made in the other hierarchies
                    for hierarchy in hierarchies():
                        remove_cpu_group(hierarchy / self.cpu_group.name)
