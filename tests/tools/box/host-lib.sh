#!/bin/bash
# TEST ONLY: what both boots of a lab-in-a-box host set up the same way (host-boot.sh for the
# stand-in init, systemd-host-boot.sh for systemd as PID 1). Sourced; ROOT is the host's new root.

# /proc/sys read-only but for net/ (the host's network namespace's own) and each SHADOW_DIR file,
# bind-mounted over its entry (a kernel tunable the host may write, kept in the host's file). The
# rest is the machine's: fs.protected_*, kernel.*, vm.* are not namespaced, so a host's
# systemd-sysctl (or init.sh's `sysctl --system`) would change the machine running the tests.
# Each is a mount of its own on a read-only bind of /proc/sys: the remount changes that one alone.
guard_proc_sys() {
    local root=$1 shadows=${2:-} entry
    mount --bind "$root/proc/sys" "$root/proc/sys"
    mount --bind "$root/proc/sys/net" "$root/proc/sys/net"
    if [[ -n $shadows ]]; then
        for entry in "$shadows"/*; do
            [[ -e $entry ]] || continue
            mount --bind "$entry" "$root/proc/sys/$(basename "$entry" | tr . /)"
        done
    fi
    mount -o remount,bind,ro "$root/proc/sys"
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
