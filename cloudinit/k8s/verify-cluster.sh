#!/usr/bin/env bash
# verify-cluster.sh: on any healthy control plane (reached through the VIP), wait (bounded)
# until the cluster is what the config describes, then say so; otherwise list exactly what is
# missing and fail.
#
# Checks: every expected node Ready, its kubelet at KUBERNETES_VERSION; kube-apiserver, kube-controller-manager,
# kube-scheduler and etcd pods Running on every control plane; CoreDNS Available; etcd with
# exactly one started, voting member per configured control plane (stale, unstarted and
# learner members are named), all healthy (unhealthy ones named), one leader that every member
# agrees on, one raft term; the API answering through the VIP, and admin.conf pointing at it.
#
# Parameters (params.env): VIP, API_PORT, KUBERNETES_VERSION (v1.36.0), EXPECTED_NODES (array),
# CONTROL_PLANES (array), VERIFY_TIMEOUT_SECONDS, VERIFY_INTERVAL_SECONDS.
# Arguments: the IDs (the public halves) of the lab's bootstrap tokens: the one `kubeadm init`
# made and each node's join token. Once every node has joined, each is deleted (`kubeadm token
# delete`): a token lets anyone who has it join a node, and no join is pending; a later join
# draws a token of its own, which its refresh step creates (refresh-join-material.sh).
# stdout: "cluster-ok".
set -Eeuo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"
require_root
load_params "$HERE"
: "${VIP:?}" "${API_PORT:?}" "${KUBERNETES_VERSION:?}" "${VERIFY_TIMEOUT_SECONDS:?}" "${VERIFY_INTERVAL_SECONDS:?}"
((${#EXPECTED_NODES[@]} > 0 && ${#CONTROL_PLANES[@]} > 0)) || die "EXPECTED_NODES and CONTROL_PLANES must not be empty"
[[ -f $ADMIN_CONF ]] || die "no ${ADMIN_CONF#"$ROOT"}: run this on a control plane of the cluster"

MISSING=()
missing() { MISSING+=("$*"); }

check_nodes() {
    local ready name status kubelet
    if ! ready=$(kc get nodes -o json | jq -r '.items[] | .metadata.name + "=" +
        ([.status.conditions[]? | select(.type == "Ready") | .status][0] // "Unknown") + "=" +
        (.status.nodeInfo.kubeletVersion // "")'); then
        missing "the API server does not answer kubectl get nodes (admin.conf)"
        return 1
    fi
    for name in "${EXPECTED_NODES[@]}"; do
        status=$(awk -F= -v n="$name" '$1 == n {print $2; exit}' <<<"$ready")
        kubelet=$(awk -F= -v n="$name" '$1 == n {print $3; exit}' <<<"$ready")
        if [[ -z $status ]]; then
            missing "node $name is not registered"
        elif [[ $status != True ]]; then
            missing "node $name is not Ready (Ready=$status)"
        elif [[ $kubelet != "$KUBERNETES_VERSION" ]]; then
            missing "node $name runs kubelet ${kubelet:-unknown}, not $KUBERNETES_VERSION (labs-k8s:kubernetes.version; its upgrade steps move it)"
        fi
    done
}

check_control_plane_pods() {
    local pods node component phase
    if ! pods=$(kc -n kube-system get pods -o json | jq -r '.items[] | .metadata.name + "=" + .status.phase'); then
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
    available=$(kc -n kube-system get deployment coredns -o json 2>/dev/null |
        jq -r '[.status.conditions[]? | select(.type == "Available") | .status][0] // empty' || true)
    [[ $available == True ]] || missing "deployment kube-system/coredns is not Available (Available=${available:-unknown})"
}

check_etcd() {
    local expected=${#CONTROL_PLANES[@]} pod members count status health leaders views terms
    local id state name peer learner endpoint
    pod=$(running_etcd_pod 2>/dev/null || true)
    if [[ -z $pod ]]; then
        missing "no Running etcd pod to run etcdctl in"
        return 1
    fi
    if ! members=$(etcdctl_in_pod "$pod" member list 2>/dev/null) || [[ -z $members ]]; then
        missing "etcdctl member list failed in $pod"
        return 1
    fi
    count=$(grep -c . <<<"$members" || true)
    [[ $count == "$expected" ]] ||
        missing "etcd has $count members, expected $expected (one per control plane: ${CONTROL_PLANES[*]})"
    # Name every member that is not a started, voting member of a configured control plane.
    while IFS=", " read -r id state name peer _ learner; do
        [[ -n $id ]] || continue
        if [[ $state != started ]]; then
            missing "etcd member $id ($peer) never started: a control-plane join stopped half-way (its join step resets it)"
        elif [[ $learner == true ]]; then
            missing "etcd member $name ($id, $peer) is still a learner, not a voting member"
        elif ! printf '%s\n' "${CONTROL_PLANES[@]}" | grep -qxF "$name"; then
            missing "etcd member $name ($id, $peer) is stale: $name is not a control plane in the config (remove it: etcdctl member remove $id)"
        fi
    done < <(awk -F', ' '{print $1 ", " $2 ", " ($3 == "" ? "-" : $3) ", " $4 ", " ($5 == "" ? "-" : $5) ", " $6}' <<<"$members")

    if status=$(etcdctl_in_pod "$pod" endpoint status --cluster -w json 2>/dev/null) && [[ -n $status ]]; then
        # Member IDs are 64-bit: quote them before jq, whose numbers are doubles.
        status=$(sed -E 's/"(cluster_id|member_id|leader)":([0-9]+)/"\1":"\2"/g' <<<"$status")
        leaders=$(jq '[.[] | select(.Status.leader == .Status.header.member_id)] | length' <<<"$status")
        views=$(jq '[.[].Status.leader] | unique | length' <<<"$status")
        terms=$(jq '[.[].Status.raftTerm] | unique | length' <<<"$status")
        [[ $leaders == 1 ]] || missing "etcd has $leaders members that are leader, expected exactly 1"
        [[ $views == 1 ]] || missing "etcd members disagree on the leader ($views different leaders reported)"
        [[ $terms == 1 ]] || missing "etcd members are on $terms different raft terms"
    else
        missing "etcdctl endpoint status --cluster failed in $pod"
    fi

    health=$(etcdctl_in_pod "$pod" endpoint health --cluster -w json 2>/dev/null || true)
    if [[ -z $health ]] || ! jq -e 'type == "array"' >/dev/null 2>&1 <<<"$health"; then
        missing "etcdctl endpoint health --cluster gave no answer in $pod"
        return 1
    fi
    while read -r endpoint; do
        [[ -n $endpoint ]] || continue
        name=$(awk -F', ' -v ep="$endpoint" 'index($5, ep) {print $3; exit}' <<<"$members")
        missing "etcd member ${name:-?} ($endpoint) is not healthy"
    done < <(jq -r '.[] | select(.health != true) | .endpoint' <<<"$health")
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
for TOKEN_ID in "$@"; do
    [[ $TOKEN_ID =~ ^[a-z0-9]{6}$ ]] || die "'$TOKEN_ID' is no bootstrap token ID"
done
for TOKEN_ID in "$@"; do
    if api_has secret "bootstrap-token-$TOKEN_ID" kube-system; then
        run_logged "$HERE/token-delete.log" kubeadm token delete "$TOKEN_ID" --kubeconfig "$ADMIN_CONF" ||
            die "kubeadm token delete $TOKEN_ID failed"
        log "deleted bootstrap token $TOKEN_ID.*: every node has joined"
    fi
done
result cluster-ok
