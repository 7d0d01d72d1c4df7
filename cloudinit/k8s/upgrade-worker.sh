#!/usr/bin/env bash
# upgrade-worker.sh: move one worker to labs-k8s:kubernetes.version, following kubeadm's procedure
# for worker nodes: the Kubernetes repository of the new minor; kubeadm; `kubeadm upgrade node` (the
# kubelet configuration of the new version); kubelet and kubectl; the node converged for the new
# version (prepare-node.sh); kubelet restarted; Ready at the new version. A change of
# labs-k8s:kubernetes.containerdVersion alone takes the same path without the Kubernetes packages:
# containerd.io installed and restarted (prepare-node.sh), kubelet restarted, Ready.
#
# It runs between its drain and its uncordon (upgrade-drain.sh on a control plane, one step each):
# a worker has no cluster-admin credentials. Its own kubelet.conf is enough to read its Node and the
# kubeadm-config ConfigMap, and it refuses to touch the kubelet of a node that is not cordoned, or
# while the control planes are not at the new version (a kubelet is never newer than the apiservers).
# Guarded: a worker already at the version changes nothing; a run that died resumes.
#
# Parameters (params.env): NODE_NAME, K8S_VERSION, K8S_MINOR_VERSION, CONTAINERD_VERSION,
# API_WAIT_SECONDS, NODE_WAIT_SECONDS, KUBERNETES_REPOSITORY_URL (labs-k8s:mirrors.kubernetesRepository.url),
# PREPARE_DIR (this node's prepare step directory).
# stdout: "<node> upgraded to vX.Y.Z, containerd A.B.C" or "<node> already at vX.Y.Z, containerd A.B.C".
set -Eeuo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"
# shellcheck source-path=SCRIPTDIR source=upgrade-lib.sh
. "$HERE/upgrade-lib.sh"
require_root
load_params "$HERE"
: "${NODE_NAME:?}" "${K8S_VERSION:?}" "${K8S_MINOR_VERSION:?}" "${CONTAINERD_VERSION:?}" "${API_WAIT_SECONDS:?}" "${NODE_WAIT_SECONDS:?}" "${PREPARE_DIR:?}"
: "${KUBERNETES_REPOSITORY_URL:?}"
TARGET=v$K8S_VERSION
[[ -f $KUBELET_CONF ]] || die "no ${KUBELET_CONF#"$ROOT"}: $NODE_NAME has not joined the cluster"
CLUSTER_KUBECONFIG=$KUBELET_CONF

registered() {
    node_state "$NODE_NAME"
    ((NODE_FOUND))
}
wait_for "$API_WAIT_SECONDS" 5 registered ||
    die "cannot read node $NODE_NAME from the API within ${API_WAIT_SECONDS}s (kubelet.conf): is the API reachable through the VIP, and is the node registered?"

# Done, unless the upgrade cordoned this node and its kubelet is not Ready yet: then the restart is
# what is left to do (a node that is NotReady for another reason, say before the CNI, is not ours).
KUBERNETES_AT=0
if packages_at "$K8S_VERSION" kubeadm kubelet kubectl && [[ $NODE_KUBELET == "$TARGET" ]]; then KUBERNETES_AT=1; fi
if ((KUBERNETES_AT)) && containerd_at && [[ $NODE_READY == True || -z $NODE_MARK ]]; then
    log "$NODE_NAME is at $TARGET already (kubeadm, kubelet, kubectl) with containerd $CONTAINERD_VERSION: nothing to do"
    result "$NODE_NAME already at $(at_versions)"
    exit 0
fi

CURRENT=$(cluster_version)
if version_lt "$TARGET" "$NODE_KUBELET" || version_lt "$TARGET" "$CURRENT"; then
    die "labs-k8s:kubernetes.version is $K8S_VERSION but the cluster runs $CURRENT and $NODE_NAME kubelet $NODE_KUBELET: downgrades are not supported. Nothing was changed"
fi
[[ $CURRENT == "$TARGET" ]] ||
    die "the cluster is at $CURRENT, not $TARGET: the control planes' upgrade steps must succeed before any worker (a kubelet is never newer than the apiservers). Nothing was changed"
[[ $NODE_CORDONED == true ]] ||
    die "$NODE_NAME is not cordoned: its drain step (upgrade-drain.sh drain, on a control plane) runs first; not upgrading the kubelet under running workloads. Nothing was changed"
log "upgrading $NODE_NAME from kubelet $NODE_KUBELET, containerd.io $(pkg_version containerd.io) to $TARGET, containerd $CONTAINERD_VERSION"

if ! ((KUBERNETES_AT)); then
    use_kubernetes_repository "$K8S_MINOR_VERSION"
    install_kubernetes_packages_at "$K8S_VERSION" kubeadm
    [[ $(kubeadm version -o short) == "$TARGET" ]] || die "kubeadm version says $(kubeadm version -o short), expected $TARGET"
    # On a worker, `kubeadm upgrade node` writes the kubelet configuration of the cluster's version.
    if ! run_logged "$HERE/kubeadm-upgrade-node.log" kubeadm upgrade node; then
        die "kubeadm upgrade node failed (log above); $NODE_NAME stays cordoned. Run pulumi up again to retry: kubeadm upgrade is idempotent"
    fi
    install_kubernetes_packages_at "$K8S_VERSION" kubelet kubectl
fi
# Also the pinned containerd.io, installed and restarted while the node is drained.
reprepare_node
systemctl daemon-reload
systemctl restart kubelet
wait_node_at "$NODE_NAME" "$TARGET"
log "$NODE_NAME is Ready at $TARGET with containerd $CONTAINERD_VERSION; its uncordon step follows"
result "$NODE_NAME upgraded to $(at_versions)"
