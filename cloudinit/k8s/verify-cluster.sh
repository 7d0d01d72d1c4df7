#!/usr/bin/env bash
# verify-cluster.sh: on the first control plane, wait (bounded) until the cluster is what
# the config describes, then say so; otherwise list exactly what is missing and fail.
#
# Checks: every expected node Ready; kube-apiserver, kube-controller-manager,
# kube-scheduler and etcd pods Running on every control plane; CoreDNS Available; etcd
# with the expected member count, all healthy, one leader that every member agrees on,
# one raft term; the API answering through the VIP, and admin.conf pointing at it.
#
# Parameters (params.env): NODE_NAME, VIP, API_PORT, EXPECTED_NODES (array),
# CONTROL_PLANES (array), VERIFY_TIMEOUT_SECONDS, VERIFY_INTERVAL_SECONDS.
# stdout: "cluster-ok".
set -Eeuo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"
require_root
load_params "$HERE"
: "${NODE_NAME:?}" "${VIP:?}" "${API_PORT:?}" "${VERIFY_TIMEOUT_SECONDS:?}" "${VERIFY_INTERVAL_SECONDS:?}"
((${#EXPECTED_NODES[@]} > 0 && ${#CONTROL_PLANES[@]} > 0)) || die "EXPECTED_NODES and CONTROL_PLANES must not be empty"
[[ -f $ADMIN_CONF ]] || die "no ${ADMIN_CONF#"$ROOT"}: run this on the initialised first control plane"

ETCD_PKI=/etc/kubernetes/pki/etcd
MISSING=()
missing() { MISSING+=("$*"); }

check_nodes() {
    local ready name status
    if ! ready=$(kc get nodes -o jsonpath='{range .items[*]}{.metadata.name}{"="}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}'); then
        missing "the API server does not answer kubectl get nodes (admin.conf)"
        return 1
    fi
    for name in "${EXPECTED_NODES[@]}"; do
        status=$(awk -F= -v n="$name" '$1 == n {print $2; exit}' <<<"$ready")
        if [[ -z $status ]]; then
            missing "node $name is not registered"
        elif [[ $status != True ]]; then
            missing "node $name is not Ready (Ready=$status)"
        fi
    done
}

check_control_plane_pods() {
    local pods node component phase
    if ! pods=$(kc -n kube-system get pods -o jsonpath='{range .items[*]}{.metadata.name}{"="}{.status.phase}{"\n"}{end}'); then
        missing "cannot list the kube-system pods"
        return 1
    fi
    for node in "${CONTROL_PLANES[@]}"; do
        for component in kube-apiserver kube-controller-manager kube-scheduler etcd; do
            phase=$(awk -F= -v n="$component-$node" '$1 == n {print $2; exit}' <<<"$pods")
            [[ $phase == Running ]] || missing "pod kube-system/$component-$node is ${phase:-absent}, not Running"
        done
    done
}

check_coredns() {
    local available
    available=$(kc -n kube-system get deployment coredns \
        -o jsonpath='{.status.conditions[?(@.type=="Available")].status}' 2>/dev/null || true)
    [[ $available == True ]] || missing "deployment kube-system/coredns is not Available (Available=${available:-unknown})"
}

etcdctl_in() {
    local pod=$1
    shift
    kc -n kube-system exec "$pod" -c etcd -- etcdctl \
        --endpoints=https://127.0.0.1:2379 --cacert="$ETCD_PKI/ca.crt" \
        --cert="$ETCD_PKI/server.crt" --key="$ETCD_PKI/server.key" \
        --command-timeout=10s "$@"
}

check_etcd() {
    local expected=${#CONTROL_PLANES[@]} pod="" candidate status health count leaders views terms unhealthy
    for candidate in "$NODE_NAME" "${CONTROL_PLANES[@]}"; do
        if [[ $(kc -n kube-system get pod "etcd-$candidate" -o jsonpath='{.status.phase}' 2>/dev/null || true) == Running ]]; then
            pod=etcd-$candidate
            break
        fi
    done
    if [[ -z $pod ]]; then
        missing "no Running etcd pod to run etcdctl in"
        return 1
    fi
    if ! status=$(etcdctl_in "$pod" endpoint status --cluster -w json 2>/dev/null) || [[ -z $status ]]; then
        missing "etcdctl endpoint status --cluster failed in $pod"
        return 1
    fi
    # Member IDs are 64-bit: quote them before jq, whose numbers are doubles.
    status=$(sed -E 's/"(cluster_id|member_id|leader)":([0-9]+)/"\1":"\2"/g' <<<"$status")
    count=$(jq 'length' <<<"$status")
    leaders=$(jq '[.[] | select(.Status.leader == .Status.header.member_id)] | length' <<<"$status")
    views=$(jq '[.[].Status.leader] | unique | length' <<<"$status")
    terms=$(jq '[.[].Status.raftTerm] | unique | length' <<<"$status")
    [[ $count == "$expected" ]] || missing "etcd has $count members answering, expected $expected (one per control plane)"
    [[ $leaders == 1 ]] || missing "etcd has $leaders members that are leader, expected exactly 1"
    [[ $views == 1 ]] || missing "etcd members disagree on the leader ($views different leaders reported)"
    [[ $terms == 1 ]] || missing "etcd members are on $terms different raft terms"

    health=$(etcdctl_in "$pod" endpoint health --cluster -w json 2>/dev/null || true)
    if [[ -z $health ]] || ! jq -e 'type == "array"' >/dev/null 2>&1 <<<"$health"; then
        missing "etcdctl endpoint health --cluster gave no answer in $pod"
        return 1
    fi
    count=$(jq 'length' <<<"$health")
    unhealthy=$(jq -r '[.[] | select(.health != true) | .endpoint] | join(", ")' <<<"$health")
    [[ $count == "$expected" ]] || missing "etcd health lists $count endpoints, expected $expected"
    [[ -z $unhealthy ]] || missing "etcd endpoints not healthy: $unhealthy"
}

check_vip() {
    local server
    api_answers "$VIP:$API_PORT" || missing "the API does not answer through the VIP (https://$VIP:$API_PORT/readyz)"
    server=$(kubeconfig_server "$ADMIN_CONF")
    [[ $server == "https://$VIP:$API_PORT" ]] || missing "admin.conf points at '${server:-nothing}', not https://$VIP:$API_PORT"
}

check_all() {
    MISSING=()
    check_nodes || true
    check_control_plane_pods || true
    check_coredns
    check_etcd || true
    check_vip
    ((${#MISSING[@]} == 0))
}

if ! wait_for "$VERIFY_TIMEOUT_SECONDS" "$VERIFY_INTERVAL_SECONDS" check_all; then
    log "the cluster is not complete after waiting ${VERIFY_TIMEOUT_SECONDS}s; missing:"
    printf '  - %s\n' "${MISSING[@]}" >&2
    exit 1
fi
log "all ${#EXPECTED_NODES[@]} nodes Ready, control plane Running on ${#CONTROL_PLANES[@]} nodes, CoreDNS Available, etcd healthy with one leader, API answering on $VIP"
result cluster-ok
