#!/usr/bin/env bash
# join-control-plane.sh sha256:<hex>: join this node as a control plane (its own etcd member and
# API server) through the VIP, unless it already is one; a join that stopped half-way is reset
# (its etcd member removed first) and run again. Also the first control plane's step: after it
# initialised the cluster it is a member already; a VM that replaced it joins here.
#
# Parameters (params.env): NODE_NAME, NODE_IP, VIP, API_PORT, API_WAIT_SECONDS, and
# control-plane-files.sh's. The bundle carries kubeadm-join.yaml (root-only: bootstrap token and
# certificate key) and encryption-config.yaml (root-only: the Secrets' encryption key).
# stdout: "joined" or "already-joined".
set -Eeuo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"
# shellcheck source-path=SCRIPTDIR source=control-plane-files.sh
. "$HERE/control-plane-files.sh"
require_root
load_params "$HERE"
: "${NODE_NAME:?}" "${NODE_IP:?}" "${VIP:?}" "${API_PORT:?}" "${API_WAIT_SECONDS:?}"
# The kubeadm-config this node joins with names both files: they are in place before its API server.
install_control_plane_files
join_cluster control-plane "${1:-}"
