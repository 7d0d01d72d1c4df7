#!/usr/bin/env bash
# kubeadm-init.sh: create the cluster on the first control plane, exactly once.
#
# Guard: no kubeadm init when this node already has admin.conf and its API server answers,
# or when any cluster already answers on the VIP (a second init would split the lab into
# two clusters). A node with admin.conf whose API never comes back is left alone with a
# clear error: re-running init over a half-initialised node only fails preflight.
#
# Parameters (params.env): NODE_NAME, VIP, API_PORT, API_WAIT_SECONDS. The bundle carries
# kubeadm-init.yaml (root-only: bootstrap token and certificate key).
# stdout: "initialized", "already-initialized" or "cluster-answers-on-vip".
set -Eeuo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"
require_root
load_params "$HERE"
: "${NODE_NAME:?}" "${VIP:?}" "${API_PORT:?}" "${API_WAIT_SECONDS:?}"
CONFIG=$HERE/kubeadm-init.yaml
[[ -s $CONFIG ]] || die "the kubeadm configuration ${CONFIG##*/} is missing from the bundle"

if [[ -f $ADMIN_CONF ]]; then
    if wait_for "$API_WAIT_SECONDS" 5 api_answers "127.0.0.1:$API_PORT"; then
        log "already initialised: admin.conf exists and the local API server answers; not running kubeadm init"
        setup_root_kubeconfig
        result already-initialized
        exit 0
    fi
    if api_answers "$VIP:$API_PORT"; then
        log "admin.conf exists; the local API server does not answer but the cluster does on $VIP: not running kubeadm init"
        setup_root_kubeconfig
        result already-initialized
        exit 0
    fi
    die "admin.conf exists but no API server answers, locally or on $VIP:$API_PORT, within ${API_WAIT_SECONDS}s. Not running kubeadm init over it: see 'journalctl -u kubelet' and 'crictl ps -a'; to start this node over, 'kubeadm reset -f'"
fi

if api_answers "$VIP:$API_PORT"; then
    log "a cluster already answers on https://$VIP:$API_PORT but this node has no admin.conf: not creating a second cluster. Rebuild this node by joining it (kubeadm join --control-plane) or restore its /etc/kubernetes"
    result cluster-answers-on-vip
    exit 0
fi

log "kubeadm init for $NODE_NAME (output: $HERE/kubeadm-init.log, root-only)"
# The token and the certificate key come from the config file; the skip-*-print flags keep
# them out of kubeadm's own output too.
if ! run_logged "$HERE/kubeadm-init.log" kubeadm init --config "$CONFIG" --upload-certs \
    --skip-token-print --skip-certificate-key-print; then
    die "kubeadm init failed. Look at the log above and $HERE/kubeadm-init.log; 'kubeadm reset -f' before retrying"
fi
[[ -f $ADMIN_CONF ]] || die "kubeadm init finished but ${ADMIN_CONF#"$ROOT"} is missing"
server=$(kubeconfig_server "$ADMIN_CONF")
[[ $server == "https://$VIP:$API_PORT" ]] ||
    die "admin.conf points at $server, not https://$VIP:$API_PORT: controlPlaneEndpoint was not applied"
setup_root_kubeconfig
log "cluster initialised on $NODE_NAME; API endpoint https://$VIP:$API_PORT"
result initialized
