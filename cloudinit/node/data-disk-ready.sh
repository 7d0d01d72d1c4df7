#!/usr/bin/env bash
# labs-k8s: first boot of a node with a data disk, run by cloud-init's runcmd after
# disk_setup, fs_setup and mounts. Those modules only log their failures; this check turns
# a missing data disk into a cloud-init error (`cloud-init status` says error, exits 1),
# instead of letting etcd or containerd fill the root disk unnoticed.
#
# Usage: data-disk-ready.sh MOUNT_POINT [etcd]
#   etcd  also make the mount point what etcd and kubeadm expect: mode 0700 (etcd warns
#         otherwise) and empty (kubeadm's DirAvailable--var-lib-etcd preflight check), so
#         the empty lost+found of the new filesystem goes (e2fsck recreates it if needed).
set -euo pipefail

[[ $# -ge 1 && $# -le 2 ]] || { echo "usage: data-disk-ready.sh MOUNT_POINT [etcd]" >&2; exit 2; }
mount_point=$1
purpose=${2:-}

if ! mountpoint -q "$mount_point"; then
    echo "labs-k8s: the data disk is not mounted at $mount_point;" \
        "see disk_setup, fs_setup and mounts in /var/log/cloud-init.log" >&2
    exit 1
fi

if [[ $purpose == etcd ]]; then
    chmod 0700 "$mount_point"
    rmdir "$mount_point/lost+found" 2>/dev/null || true
fi
echo "labs-k8s: data disk mounted at $mount_point"
