#!/usr/bin/env bash
# kubeadm-init.sh: create the cluster on the first control plane, exactly once, and finish an
# init that stopped half-way.
#
# kubeadm init does not roll back: it writes admin.conf in its kubeconfig phase, long before
# upload-config, upload-certs, bootstrap-token and the addons (cmd/kubeadm/app/cmd/init.go). So
# "admin.conf exists" proves nothing. When this node holds kubeadm state, every phase whose
# result is missing is run again on its own (`kubeadm init phase <phase> --config`, each
# idempotent), in kubeadm's order, and the step reports success only when all of them are there.
#
# When this node holds nothing and a cluster already answers on the VIP (this VM replaced an
# earlier first control plane), there is nothing to create: the node's join step makes it a
# control plane of that cluster. Before a new init, the VIP must answer on the API port through
# HAProxy and exactly one balancer must hold it.
#
# Parameters (params.env): NODE_NAME, VIP, API_PORT, API_WAIT_SECONDS, TOKEN_ID, BALANCER_STEPS
# (array), and control-plane-files.sh's. The bundle carries kubeadm-init.yaml (root-only: bootstrap
# token and certificate key) and encryption-config.yaml (root-only: the Secrets' encryption key).
# stdout: "initialized", "already-initialized" or "cluster-exists".
set -Eeuo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"
# shellcheck source-path=SCRIPTDIR source=control-plane-files.sh
. "$HERE/control-plane-files.sh"
require_root
load_params "$HERE"
: "${NODE_NAME:?}" "${VIP:?}" "${API_PORT:?}" "${API_WAIT_SECONDS:?}" "${TOKEN_ID:?}"
((${#BALANCER_STEPS[@]} > 0)) || die "BALANCER_STEPS is empty"
CONFIG=$HERE/kubeadm-init.yaml
[[ -s $CONFIG ]] || die "the kubeadm configuration ${CONFIG##*/} is missing from the bundle"
PHASES_RUN=()
# Before any phase can start an API server: its manifest names both files (ClusterConfiguration).
install_control_plane_files

# phase NAME [ARGS...]: run one idempotent init phase with the rendered configuration.
phase() {
    local name=$1
    shift
    log "kubeadm init phase $name $* (output: $HERE/kubeadm-init-phase.log, root-only)"
    run_logged "$HERE/kubeadm-init-phase.log" kubeadm init phase "$name" "$@" --config "$CONFIG" ||
        die "kubeadm init phase $name failed"
    PHASES_RUN+=("$name")
}

missing_file() {
    local path
    for path in "$@"; do
        [[ -e $path ]] || return 0
    done
    return 1
}

# present KIND NAME [NAMESPACE]: does the API have it? Dies when the API cannot be asked.
present() {
    local rc=0
    api_has "$@" || rc=$?
    ((rc < 2)) || die "cannot ask the API about $1 $2 (through $VIP:$API_PORT)"
    return "$rc"
}

node_is_labelled_control_plane() {
    local labels
    labels=$(kc get node "$NODE_NAME" -o json) || die "cannot read node $NODE_NAME from the API"
    jq -e '.metadata.labels | has("node-role.kubernetes.io/control-plane")' >/dev/null <<<"$labels"
}

# The balancers: HAProxy must accept on VIP:API_PORT and exactly one balancer may answer ARP for
# the VIP (two would be split brain: half the clients on each).
check_balancers() {
    local rc=0 iface macs count steps="${BALANCER_STEPS[*]}"
    curl -fsk --connect-timeout 3 --max-time 5 -o /dev/null "https://$VIP:$API_PORT/readyz" || rc=$?
    if ((rc == 7 || rc == 28)); then
        die "nothing accepts connections on $VIP:$API_PORT (curl exit $rc): HAProxy on the balancers is not serving the VIP. Check the balancer steps ($steps: keepalived and haproxy on those VMs) and run 'pulumi up' again"
    fi
    iface=$(ip -o route get "$VIP" | awk '{for (i = 1; i < NF; i++) if ($i == "dev") {print $(i + 1); exit}}')
    [[ -n $iface ]] || die "no route to the VIP $VIP from $NODE_NAME"
    macs=$(arping -c 3 -w 5 -I "$iface" "$VIP" 2>/dev/null |
        awk '/reply from/ {gsub(/[][]/, "", $5); print tolower($5)}' | sort -u || true)
    count=$(grep -c . <<<"$macs" || true)
    if ((count == 0)); then
        die "no balancer answers ARP for the VIP $VIP: Keepalived holds it nowhere. Check the balancer steps ($steps) and 'systemctl status keepalived' on the balancers"
    fi
    if ((count > 1)); then
        die "$count machines answer ARP for the VIP $VIP ($(tr '\n' ' ' <<<"$macs")): both balancers hold it (split brain, VRRP between them is broken). Check the balancer steps ($steps), labs-k8s:loadBalancer.vrrpRouterId and the network between the balancers"
    fi
    log "VIP $VIP: HAProxy accepts on port $API_PORT, one balancer holds it ($macs on $iface)"
}

# finish_init: run, in kubeadm's order, every init phase whose result is missing.
finish_init() {
    local pki=$K8S_DIR/pki
    # Phases on this node's disk (certs, kubeconfig, etcd, control-plane, kubelet-start).
    if missing_file "$pki/ca.crt" "$pki/ca.key" "$pki/sa.key" "$pki/sa.pub" "$pki/front-proxy-ca.crt" "$pki/etcd/ca.crt"; then
        phase certs all
    fi
    if missing_file "$ADMIN_CONF" "$KUBELET_CONF" "$K8S_DIR/controller-manager.conf" "$K8S_DIR/scheduler.conf"; then
        phase kubeconfig all
    fi
    if missing_file "$ETCD_MANIFEST"; then phase etcd local; fi
    if missing_file "$MANIFESTS/kube-apiserver.yaml" "$MANIFESTS/kube-controller-manager.yaml" "$MANIFESTS/kube-scheduler.yaml"; then
        phase control-plane all
    fi
    # kubelet-start stops the kubelet before it writes these files and starts it after
    # (phases/init/kubelet.go runKubeletStart): a run cut off in between leaves both files and a
    # stopped kubelet, so no static pod starts. The phase again is safe (it rewrites and restarts).
    if missing_file "$ROOT/var/lib/kubelet/config.yaml" "$ROOT/var/lib/kubelet/kubeadm-flags.env" ||
        ! api_answers "127.0.0.1:$API_PORT"; then
        phase kubelet-start
    fi
    wait_for "$API_WAIT_SECONDS" 5 api_answers "127.0.0.1:$API_PORT" ||
        die "this node's API server does not answer within ${API_WAIT_SECONDS}s after its manifests and kubelet are in place: see 'journalctl -u kubelet' and 'crictl ps -a'; to start this node over, 'kubeadm reset -f' and run 'pulumi up' again"
    # Phases in the API, checked by what each one creates (cmd/kubeadm/app/cmd/phases/init/*.go).
    if ! present configmap kubeadm-config kube-system || ! present configmap kubelet-config kube-system; then
        phase upload-config all
    fi
    if ! present secret kubeadm-certs kube-system; then
        phase upload-certs --upload-certs --skip-certificate-key-print
    fi
    if ! node_is_labelled_control_plane; then phase mark-control-plane; fi
    if ! present configmap cluster-info kube-public || ! present secret "bootstrap-token-$TOKEN_ID" kube-system ||
        ! present clusterrolebinding kubeadm:kubelet-bootstrap || ! present clusterrolebinding kubeadm:node-autoapprove-bootstrap ||
        ! present clusterrolebinding kubeadm:node-autoapprove-certificate-rotation || ! present clusterrolebinding kubeadm:get-nodes ||
        ! present role kubeadm:bootstrap-signer-clusterinfo kube-public; then
        phase bootstrap-token --skip-token-print
    fi
    if ! grep -q 'kubelet-client-current.pem' "$KUBELET_CONF"; then phase kubelet-finalize all; fi
    if ! present deployment coredns kube-system; then phase addon coredns; fi
    if ! present daemonset kube-proxy kube-system; then phase addon kube-proxy; fi
}

if has_kubeadm_state; then
    if api_answers "127.0.0.1:$API_PORT"; then
        log "this node holds a cluster and its API server answers: checking that every init phase finished"
    elif api_answers "$VIP:$API_PORT"; then
        log "this node holds kubeadm state but its API server does not answer, while the cluster does on $VIP: this node's join step judges (and if need be resets) it"
        result cluster-exists
        exit 0
    else
        log "this node holds a half-finished kubeadm init and no API server answers: finishing it"
        check_balancers
    fi
    finish_init
    initialized=${#PHASES_RUN[@]}
else
    if api_answers "$VIP:$API_PORT"; then
        log "a cluster already answers on https://$VIP:$API_PORT and this node holds nothing: not creating a second cluster; this node's join step makes it a control plane of that one"
        result cluster-exists
        exit 0
    fi
    check_balancers
    log "kubeadm init for $NODE_NAME (output: $HERE/kubeadm-init.log, root-only)"
    # The token and the certificate key come from the config file; the skip-*-print flags keep
    # them out of kubeadm's own output too.
    if ! run_logged "$HERE/kubeadm-init.log" kubeadm init --config "$CONFIG" --upload-certs \
        --skip-token-print --skip-certificate-key-print; then
        die "kubeadm init failed (log above). kubeadm does not roll back: the next 'pulumi up' finishes the phases that are missing"
    fi
    finish_init
    initialized=1
fi

server=$(kubeconfig_server "$ADMIN_CONF")
[[ $server == "https://$VIP:$API_PORT" ]] ||
    die "admin.conf points at $server, not https://$VIP:$API_PORT: controlPlaneEndpoint was not applied"
setup_root_kubeconfig
if ((initialized > 0)); then
    log "cluster initialised on $NODE_NAME; API endpoint https://$VIP:$API_PORT${PHASES_RUN[*]:+ (finished phases: ${PHASES_RUN[*]})}"
    result initialized
else
    log "every init phase had finished; nothing to do"
    result already-initialized
fi
