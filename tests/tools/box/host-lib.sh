#!/bin/bash
# TEST ONLY: the pieces of a lab-in-a-box host's boot (tests/tools/box/systemd-host-boot.sh), each a
# function of what a VM has of its own. Sourced; ROOT is the host's new root.

# /proc/sys read-only but for net/ (the host's network namespace's own) and each SHADOW_DIR file,
# bind-mounted over its entry (a kernel tunable the host may write, kept in the host's file). The
# rest is the machine's: fs.protected_*, kernel.*, vm.* are not namespaced, so a host's
# systemd-sysctl would change the machine running the tests. Each top directory but net/ is a
# read-only bind of its own, so /proc/sys itself stays writable and systemd-sysctl runs
# (ConditionPathIsReadWrite=/proc/sys/), its writes outside net/ failing with EROFS, which it ignores.
guard_proc_sys() {
    local root=$1 shadows=${2:-} entry top
    for top in "$root"/proc/sys/*; do
        [[ $(basename "$top") != net ]] || continue
        mount --bind "$top" "$top"
        mount -o remount,bind,ro "$top"
    done
    if [[ -n $shadows ]]; then
        for entry in "$shadows"/*; do
            [[ -e $entry ]] || continue
            mount --bind "$entry" "$root/proc/sys/$(basename "$entry" | tr . /)"
        done
    fi
}

# A /dev of its own, as a container's: the machine's disks are never visible in a host. Extra
# NAME:MAJOR:MINOR nodes come after the root (systemd's /dev/console and /dev/kmsg as /dev/null).
make_dev() {
    local root=$1 node name major minor
    shift
    mount -t tmpfs -o mode=0755,nosuid tmpfs "$root/dev"
    for node in null:1:3 zero:1:5 full:1:7 random:1:8 urandom:1:9 tty:5:0 "$@"; do
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
}

# The VM's second disk: the ext4 image of the VM's own, loop-mounted at MOUNT (the filesystem
# cloud-init's fs_setup or prepare-node.sh leaves on it). Prints the loop device it is on.
mount_data_disk() {
    local root=$1 image=$2 mount=$3
    mkdir -p "$root$mount"
    mount -o loop,noatime "$image" "$root$mount"
    findmnt -rno SOURCE --mountpoint "$root$mount"
}

# The disk's device node in the host's /dev (after make_dev), as udev makes /dev/sdb on a VM:
# blkid and findmnt read its UUID there.
data_disk_node() {
    local root=$1 device=$2 major minor
    read -r major minor < <(stat -L -c '%t %T' "$device")
    mknod -m 0660 "$root$device" b "$((16#$major))" "$((16#$minor))"
}

# The kernel is the machine's: its modules (or an index of those built into it), read-only.
show_modules() {
    local root=$1 modules=$2 release
    release=$(uname -r)
    mkdir -p "$root/lib/modules/$release"
    mount --bind -o ro "$modules" "$root/lib/modules/$release"
}

# A VM's swap is its own: /proc/swaps lists the machine's, which `swapoff -a` in the host would turn
# off. The host sees none, as a template clone without a swap partition has none. EMPTY: a file.
hide_swaps() {
    local root=$1 empty=$2
    : >"$empty"
    mount --bind "$empty" "$root/proc/swaps"
}
