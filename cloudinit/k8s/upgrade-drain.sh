#!/usr/bin/env bash
# upgrade-drain.sh drain|uncordon: on a control plane (admin.conf), the two cluster-side halves of
# a worker's upgrade, around upgrade-worker.sh on the worker itself:
#
#   drain     once the cluster (kubeadm-config) is at the new version: cordon and evict the worker,
#             respecting PodDisruptionBudgets, and mark it (labs-k8s/cordoned-for-upgrade) when it
#             was schedulable. Nothing to do when the worker already runs the new kubelet on the
#             pinned containerd (its Node's containerRuntimeVersion).
#   uncordon  once the worker is Ready at the new version: uncordon it if the upgrade cordoned it;
#             a worker an operator had cordoned stays cordoned.
#
# Parameters (params.env): DRAIN_NODE, K8S_VERSION, CONTAINERD_VERSION, API_WAIT_SECONDS,
# NODE_WAIT_SECONDS, DRAIN_TIMEOUT_SECONDS.
# stdout: "drained <node>" | "uncordoned <node>" | "<node> already at vX.Y.Z" | "<node> left cordoned".
set -Eeuo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"
# shellcheck source-path=SCRIPTDIR source=upgrade-lib.sh
. "$HERE/upgrade-lib.sh"
require_root
load_params "$HERE"
: "${DRAIN_NODE:?}" "${K8S_VERSION:?}" "${CONTAINERD_VERSION:?}" "${API_WAIT_SECONDS:?}" "${NODE_WAIT_SECONDS:?}" "${DRAIN_TIMEOUT_SECONDS:?}"
ACTION=${1:-}
[[ $ACTION == drain || $ACTION == uncordon ]] || die "usage: ${0##*/} drain|uncordon"
TARGET=v$K8S_VERSION
[[ -f $ADMIN_CONF ]] || die "no ${ADMIN_CONF#"$ROOT"}: run this on a control plane of the cluster"

# A node that has just joined registers within seconds; an absent one is an error, not a skip.
registered() {
    node_state "$DRAIN_NODE"
    ((NODE_FOUND))
}
wait_for "$API_WAIT_SECONDS" 5 registered ||
    die "node $DRAIN_NODE is not registered in the cluster (waited ${API_WAIT_SECONDS}s): did its join finish?"

case $ACTION in
drain)
    if [[ $NODE_KUBELET == "$TARGET" && $NODE_RUNTIME == "$CONTAINERD_VERSION" ]]; then
        if [[ -n $NODE_MARK ]]; then
            log "$DRAIN_NODE already runs kubelet $TARGET on containerd $CONTAINERD_VERSION and is cordoned for the upgrade: its uncordon step follows"
        else
            log "$DRAIN_NODE already runs kubelet $TARGET on containerd $CONTAINERD_VERSION: not draining it"
        fi
        result "$DRAIN_NODE already at $TARGET"
        exit 0
    fi
    CURRENT=$(cluster_version)
    if version_lt "$TARGET" "$CURRENT"; then
        die "labs-k8s:kubernetes.version is $K8S_VERSION but the cluster runs $CURRENT: downgrades are not supported. $DRAIN_NODE was not drained"
    fi
    [[ $CURRENT == "$TARGET" ]] ||
        die "the cluster is at $CURRENT, not $TARGET: the control planes are upgraded before any worker is drained. $DRAIN_NODE was not drained"
    drain_for_upgrade "$DRAIN_NODE" "$TARGET"
    result "drained $DRAIN_NODE"
    ;;
uncordon)
    if [[ -z $NODE_MARK ]]; then
        if [[ $NODE_CORDONED == true ]]; then
            log "$DRAIN_NODE was cordoned before the upgrade (no $UPGRADE_MARK annotation): leaving it cordoned"
            result "$DRAIN_NODE left cordoned"
        else
            result "$DRAIN_NODE already at $TARGET"
        fi
        exit 0
    fi
    node_is_at "$DRAIN_NODE" "$TARGET" ||
        die "not uncordoning $DRAIN_NODE: it is not Ready at $TARGET (Ready=$NODE_READY, kubelet ${NODE_KUBELET:-unknown}); its upgrade step on the node must succeed first"
    uncordon_after_upgrade "$DRAIN_NODE"
    result "uncordoned $DRAIN_NODE"
    ;;
esac
