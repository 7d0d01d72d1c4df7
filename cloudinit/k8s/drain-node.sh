#!/usr/bin/env bash
# drain-node.sh: on the first control plane, when a worker is removed from the config:
# drain it, then delete its Node object. Never hangs: every kubectl call is bounded, and
# when eviction is blocked (a PodDisruptionBudget, a stuck pod) the pods are deleted
# without eviction. Harmless when the node is already gone. Skipped entirely while the
# whole lab is being destroyed (marker /var/lib/labs-k8s/teardown).
#
# Parameters (params.env): DRAIN_NODE, DRAIN_TIMEOUT_SECONDS.
# stdout: "drained", "already-gone" or "skipped-teardown".
set -Eeuo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"
require_root
load_params "$HERE"
: "${DRAIN_NODE:?}" "${DRAIN_TIMEOUT_SECONDS:?}"

if [[ -e $TEARDOWN_MARKER ]]; then
    log "teardown marker ${TEARDOWN_MARKER#"$ROOT"} present: the whole lab is being destroyed; not draining $DRAIN_NODE"
    result skipped-teardown
    exit 0
fi
[[ -f $ADMIN_CONF ]] || die "no ${ADMIN_CONF#"$ROOT"}: run this on the first control plane"

if ! present=$(kc get node "$DRAIN_NODE" --ignore-not-found -o name 2>&1); then
    die "cannot ask the API about node $DRAIN_NODE: $present. If the whole lab is being destroyed, create ${TEARDOWN_MARKER#"$ROOT"} on this node and retry"
fi
if [[ -z $present ]]; then
    log "node $DRAIN_NODE is not in the cluster; nothing to drain"
    result already-gone
    exit 0
fi

drain() {
    timeout $((DRAIN_TIMEOUT_SECONDS + 30)) kubectl --kubeconfig "$ADMIN_CONF" drain "$DRAIN_NODE" \
        --ignore-daemonsets --delete-emptydir-data --force --timeout="${DRAIN_TIMEOUT_SECONDS}s" "$@"
}

if drain; then
    log "drained $DRAIN_NODE"
elif drain --disable-eviction --grace-period=30; then
    log "eviction was blocked; drained $DRAIN_NODE by deleting its pods (--disable-eviction)"
else
    log "WARNING: $DRAIN_NODE did not drain within the time allowed; deleting the Node anyway (its VM is going away, its pods are rescheduled)"
fi
kc delete node "$DRAIN_NODE" --ignore-not-found --timeout=60s || die "kubectl delete node $DRAIN_NODE failed"
result drained
