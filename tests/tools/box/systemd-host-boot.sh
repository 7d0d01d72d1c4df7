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
# Optional, from the environment: BOX_DATA_IMAGE and BOX_DATA_MOUNT (the VM's second disk),
# BOX_MODULES (shown as /lib/modules/$(uname -r)), BOX_DISK_IMAGE and BOX_SCRATCH (directories kept
# on that ext4 image, the VM's own disk: containerd's overlay snapshots cannot live on the overlay root),
# BOX_SYSTEM_CONF (a systemd manager drop-in put in /run: the clone's guestinfo), BOX_BINDS
# ("SOURCE=TARGET ...": the machine's directories shown in the host).
root=$1 lower=$2 upper=$3 work=$4 sysctls=$5
data_image=${BOX_DATA_IMAGE:-} data_mount=${BOX_DATA_MOUNT:-} modules=${BOX_MODULES:-}
disk_image=${BOX_DISK_IMAGE:-} scratch=${BOX_SCRATCH:-}
system_conf=${BOX_SYSTEM_CONF:-} binds=${BOX_BINDS:-}

mount --make-rprivate /
mount -t overlay overlay -o "lowerdir=$lower,upperdir=$upper,workdir=$work" "$root"
data_device=""
if [[ -n $data_image ]]; then
    data_device=$(mount_data_disk "$root" "$data_image" "$data_mount")
fi
if [[ -n $scratch ]]; then
    disk=$upper/../disk
    mkdir -p "$disk"
    mount -o loop,noatime "$disk_image" "$disk"
    for dir in $scratch; do
        mkdir -p "$disk$dir" "$root$dir"
        mount --bind "$disk$dir" "$root$dir"
    done
fi
mount -t proc proc "$root/proc"
guard_proc_sys "$root" "$sysctls"
hide_swaps "$root" "$upper/../swaps.empty"
mount -t sysfs sysfs "$root/sys"
mount -t tmpfs -o mode=0755 tmpfs "$root/sys/fs/cgroup"
while read -r hierarchy options; do
    mkdir -p "$root/sys/fs/cgroup/$hierarchy"
    mount -t cgroup -o "$options" cgroup "$root/sys/fs/cgroup/$hierarchy"
done < <(awk -F: '$2 != "" { name = $2; sub(/^name=/, "", name); print name, $2 }' /proc/self/cgroup)
mkdir -p "$root/sys/fs/cgroup/unified"
mount -t cgroup2 cgroup2 "$root/sys/fs/cgroup/unified"
# /sys read-only, as systemd's container interface asks: systemd-udevd and udev-trigger then stay
# off (ConditionPathIsReadWrite=/sys), which would otherwise send uevents for the machine's devices.
mount -o remount,bind,ro "$root/sys"
make_dev "$root" console:1:3 kmsg:1:3
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs "$root/run"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/tmp"
if [[ -n $system_conf ]]; then
    install -D -m 0644 "$system_conf" "$root/run/systemd/system.conf.d/labs-k8s-box.conf"
fi
for bind in $binds; do
    mkdir -p "$root${bind#*=}"
    mount --bind "${bind%%=*}" "$root${bind#*=}"
done
if [[ -n $data_device ]]; then
    data_disk_node "$root" "$data_device"
fi
if [[ -n $modules ]]; then
    show_modules "$root" "$modules"
fi
cd "$root"
mkdir -p .box-oldroot
pivot_root . .box-oldroot
umount -l /.box-oldroot
rmdir /.box-oldroot
exec env -i container=labs-k8s-box /sbin/init
