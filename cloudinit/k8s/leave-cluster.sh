#!/usr/bin/env bash
# leave-cluster.sh: on any healthy control plane (reached through the VIP), when a node leaves
# the cluster (removed from the config, or its VM about to be replaced): drain it, delete its
# Node object and, for a control plane, remove its etcd member, so the cluster never keeps a
# member that will not come back (3 members with 2 alive tolerate no failure). Never hangs: every
# kubectl and etcdctl call is bounded; when eviction is blocked (a PodDisruptionBudget, a stuck
# pod) pods are deleted without eviction. Harmless when the node is already gone. Does nothing
# while the whole lab is being destroyed (teardown-guard.sh's ConfigMap).
#
# Parameters (params.env): LEAVING_NODE, LEAVING_IP, LEAVING_ROLE, DRAIN_TIMEOUT_SECONDS.
# stdout: "left", "already-gone" or "skipped-teardown".
set -Eeuo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"
require_root
load_params "$HERE"
: "${LEAVING_NODE:?}" "${LEAVING_IP:?}" "${LEAVING_ROLE:?}" "${DRAIN_TIMEOUT_SECONDS:?}"
[[ -f $ADMIN_CONF ]] || die "no ${ADMIN_CONF#"$ROOT"} on this node: the step must run on a control plane"

if teardown_in_progress; then
    log "the lab is being destroyed (ConfigMap kube-system/$TEARDOWN_CONFIGMAP): not draining or removing $LEAVING_NODE"
    result skipped-teardown
    exit 0
fi
did=0

drain() {
    timeout $((DRAIN_TIMEOUT_SECONDS + 30)) kubectl --kubeconfig "$ADMIN_CONF" drain "$LEAVING_NODE" \
        --ignore-daemonsets --delete-emptydir-data --force --timeout="${DRAIN_TIMEOUT_SECONDS}s" "$@"
}

rc=0
api_has node "$LEAVING_NODE" || rc=$?
((rc < 2)) || die "cannot ask the API about node $LEAVING_NODE"
if ((rc == 0)); then
    if drain; then
        log "drained $LEAVING_NODE"
    elif drain --disable-eviction --grace-period=30; then
        log "eviction was blocked; drained $LEAVING_NODE by deleting its pods (--disable-eviction)"
    else
        log "WARNING: $LEAVING_NODE did not drain within the time allowed; deleting the Node anyway (its VM is going away, its pods are rescheduled)"
    fi
    kc delete node "$LEAVING_NODE" --ignore-not-found --timeout=60s || die "kubectl delete node $LEAVING_NODE failed"
    did=1
else
    log "node $LEAVING_NODE is not in the cluster; nothing to drain"
fi

if [[ $LEAVING_ROLE == control-plane ]]; then
    pod=$(running_etcd_pod "$LEAVING_NODE") || die "cannot list the etcd pods"
    [[ -n $pod ]] || die "no Running etcd pod other than $LEAVING_NODE's: cannot remove its etcd member safely"
    members=$(etcdctl_in_pod "$pod" member list) || die "etcdctl member list failed in $pod"
    line=$(member_line "$members" "$LEAVING_IP")
    if [[ -n $line ]]; then
        id=${line%%,*}
        # Removing a member is a membership change: it needs a quorum of the current members,
        # and what is left must still have one. Refuse rather than leave etcd without quorum.
        voting=$(awk -F', ' '$6 != "true"' <<<"$members" | grep -c . || true)
        health=$(etcdctl_in_pod "$pod" endpoint health --cluster -w json 2>/dev/null || true)
        healthy_others=$(jq -r --arg leaving "https://$LEAVING_IP:2379" \
            '[.[]? | select(.health == true and .endpoint != $leaving)] | length' <<<"${health:-[]}" 2>/dev/null || echo 0)
        remaining=$((voting - 1))
        if ((remaining < 1 || healthy_others < remaining / 2 + 1)); then
            die "removing $LEAVING_NODE's etcd member ($id) would leave etcd without quorum: $healthy_others healthy of $remaining remaining voting members. Bring the other control planes back first"
        fi
        log "removing etcd member $id ($line) through $pod"
        etcdctl_in_pod "$pod" member remove "$id" || die "etcdctl member remove $id failed in $pod"
        did=1
    else
        log "no etcd member with peer URL https://$LEAVING_IP:2380; nothing to remove"
    fi
fi
if ((did)); then result left; else result already-gone; fi
