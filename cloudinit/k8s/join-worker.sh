#!/usr/bin/env bash
# join-worker.sh sha256:<hex>: join this node as a worker through the VIP, unless the API
# already knows its Node; a join that stopped half-way is reset and run again.
#
# Parameters (params.env): NODE_NAME, NODE_IP, VIP, API_PORT, API_WAIT_SECONDS. The bundle
# carries kubeadm-join.yaml (root-only: bootstrap token).
# stdout: "joined" or "already-joined".
set -Eeuo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"
require_root
load_params "$HERE"
: "${NODE_NAME:?}" "${NODE_IP:?}" "${VIP:?}" "${API_PORT:?}" "${API_WAIT_SECONDS:?}"
join_cluster worker "${1:-}"
