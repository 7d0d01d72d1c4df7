#!/bin/bash
# TEST ONLY (tests/lab_box.py): the firmware and initramfs of one node host of the lab in a box.
# Runs as PID 1 of the host's own PID namespace, in its own mount and UTS namespaces and in the
# network namespace the harness made for the clone (its NIC is a veth on the box's bridge, with the
# VM's MAC). It mounts the clone's disk (an overlay: the sealed template rootfs read-only below, this
# VM's own upper layer, so a replaced VM starts from the template again), the kernel filesystems a
# booted Debian has, then becomes the host's init (init.sh). systemd is not PID 1 in a box host:
# init.sh starts what a booted clone runs, in systemd's order.
# Usage: host-boot.sh ROOT LOWER UPPER WORK [DATA_MOUNT]
set -euo pipefail
root=$1 lower=$2 upper=$3 work=$4 data_mount=${5:-}

mount -t overlay overlay -o "lowerdir=$lower,upperdir=$upper,workdir=$work" "$root"
if [[ -n $data_mount ]]; then
    # The data disk's stand-in (tests/lab_box.py's docstring says why): a tmpfs at its mount point.
    mkdir -p "$root$data_mount"
    mount -t tmpfs -o mode=0755 labs-data "$root$data_mount"
fi
mount -t proc proc "$root/proc"
# sysfs mounted from inside the network namespace shows that namespace's interfaces only.
mount -t sysfs sysfs "$root/sys"
# A /dev of its own, as a container's: the machine's disks are never visible in a host.
mount -t tmpfs -o mode=0755,nosuid tmpfs "$root/dev"
for node in null:1:3 zero:1:5 full:1:7 random:1:8 urandom:1:9 tty:5:0; do
    IFS=: read -r name major minor <<<"$node"
    mknod -m 0666 "$root/dev/$name" c "$major" "$minor"
done
mkdir -p "$root/dev/pts" "$root/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$root/dev/pts"
ln -s pts/ptmx "$root/dev/ptmx"
# What udev and systemd link on a booted Debian: bash's process substitution opens /dev/fd/N.
ln -s /proc/self/fd "$root/dev/fd"
ln -s /proc/self/fd/0 "$root/dev/stdin"
ln -s /proc/self/fd/1 "$root/dev/stdout"
ln -s /proc/self/fd/2 "$root/dev/stderr"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/dev/shm"
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs "$root/run"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/tmp"
exec chroot "$root" /usr/local/lib/labs-k8s-box/init
