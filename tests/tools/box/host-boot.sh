#!/bin/bash
# TEST ONLY (tests/lab_box.py): the firmware and initramfs of one node host of the lab in a box.
# Runs as PID 1 of the host's own PID namespace, in its own mount and UTS namespaces and in the
# network namespace the harness made for the clone (its NIC is a veth on the box's bridge, with the
# VM's MAC). It mounts the clone's disk (an overlay: the sealed template rootfs read-only below, this
# VM's own upper layer, so a replaced VM starts from the template again), the kernel filesystems a
# booted Debian has, then becomes the host's init (init.sh). systemd is not PID 1 in a box host:
# init.sh starts what a booted clone runs, in systemd's order.
# Usage: host-boot.sh ROOT LOWER UPPER WORK [DATA_IMAGE DATA_MOUNT]
# The environment names the box's shared pieces (unset before the host's init sees them):
# BOX_STORE, the directory of the stand-ins' shared cluster store (tests/tools/box/standin/), and
# BOX_MODULES, the directory to show as /lib/modules/$(uname -r): what the running kernel offers.
set -euo pipefail
# shellcheck source=host-lib.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/host-lib.sh"
root=$1 lower=$2 upper=$3 work=$4 data_image=${5:-} data_mount=${6:-}
store=${BOX_STORE:-} modules=${BOX_MODULES:-}
unset BOX_STORE BOX_MODULES

mount -t overlay overlay -o "lowerdir=$lower,upperdir=$upper,workdir=$work" "$root"
data_device=""
if [[ -n $data_image ]]; then
    # The VM's second disk (tests/lab_box.py's docstring says why it is not a real disk here).
    data_device=$(mount_data_disk "$root" "$data_image" "$data_mount")
fi
mount -t proc proc "$root/proc"
guard_proc_sys "$root"
hide_swaps "$root" "$upper/../swaps.empty"
# sysfs mounted from inside the network namespace shows that namespace's interfaces only.
mount -t sysfs sysfs "$root/sys"
make_dev "$root"
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs "$root/run"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/tmp"
if [[ -n $data_device ]]; then
    data_disk_node "$root" "$data_device"
fi
if [[ -n $modules ]]; then
    show_modules "$root" "$modules"
fi
if [[ -n $store ]]; then
    # The stand-ins' shared cluster store (tests/tools/box/standin/box_cluster.py): what etcd's
    # replication would share; the stand-ins reach each other only through the box's network.
    mkdir -p "$root/var/lib/labs-k8s-box/cluster"
    mount --bind "$store" "$root/var/lib/labs-k8s-box/cluster"
fi
exec chroot "$root" /usr/local/lib/labs-k8s-box/init
