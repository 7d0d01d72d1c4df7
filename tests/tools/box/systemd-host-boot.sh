#!/bin/bash
# TEST ONLY (tests/systemd_host.py): boot one host of the lab in a box with systemd as PID 1.
# Runs as PID 1 of new mount, UTS, IPC, network, PID and cgroup namespaces, already placed in the
# host's own cgroups (its CPU and memory bounded as a VM's). It builds the host's root (an overlay of
# the sealed template rootfs and the host's own upper layer), the kernel filesystems a booted VM has,
# the cgroup hierarchies seen from the host's cgroup namespace (this machine is cgroup v1 "hybrid",
# real nodes v2), pivot_root's into it and execs systemd, as kind runs its nodes.
# Usage: systemd-host-boot.sh ROOT LOWER UPPER WORK SYSCTL_DIR
# What keeps the machine's settings the machine's (docs/testing.md, the box's deviations): /proc/sys
# is read-only but for net/ (this host's network namespace's own), and each kernel tunable the
# kubelet writes is a file of the host's (SYSCTL_DIR) bind-mounted over its /proc/sys entry.
set -euo pipefail
# shellcheck source=host-lib.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/host-lib.sh"
root=$1 lower=$2 upper=$3 work=$4 sysctls=$5

mount --make-rprivate /
mount -t overlay overlay -o "lowerdir=$lower,upperdir=$upper,workdir=$work" "$root"
mount -t proc proc "$root/proc"
guard_proc_sys "$root" "$sysctls"
mount -t sysfs sysfs "$root/sys"
mount -t tmpfs -o mode=0755 tmpfs "$root/sys/fs/cgroup"
while read -r hierarchy options; do
    mkdir -p "$root/sys/fs/cgroup/$hierarchy"
    mount -t cgroup -o "$options" cgroup "$root/sys/fs/cgroup/$hierarchy"
done < <(awk -F: '$2 != "" { name = $2; sub(/^name=/, "", name); print name, $2 }' /proc/self/cgroup)
mkdir -p "$root/sys/fs/cgroup/unified"
mount -t cgroup2 cgroup2 "$root/sys/fs/cgroup/unified"
make_dev "$root" console:1:3 kmsg:1:3
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs "$root/run"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/tmp"
cd "$root"
mkdir -p .box-oldroot
pivot_root . .box-oldroot
umount -l /.box-oldroot
rmdir /.box-oldroot
exec env -i container=labs-k8s-box /sbin/init
