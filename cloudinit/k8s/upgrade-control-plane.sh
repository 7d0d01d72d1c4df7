#!/usr/bin/env bash
# upgrade-control-plane.sh: move one control plane to labs-k8s:kubernetes.version, following
# kubeadm's procedure, one control plane at a time (the graph serializes them).
#
#   UPGRADE_MODE=apply (the first control plane): refuse a bad transition before anything
#     changes; the Kubernetes repository of the new minor; kubeadm; `kubeadm upgrade plan`; an etcd
#     snapshot; `kubeadm upgrade apply vX.Y.Z`.
#   UPGRADE_MODE=node (every other control plane): the same without plan, snapshot and apply:
#     `kubeadm upgrade node`, once the cluster (kubeadm-config) is at the new version.
#   Then, on both: drain this node, kubelet and kubectl, the node converged for the new version
#   (prepare-node.sh), kubelet restarted, Ready at the new version, uncordon; and a check of the
#   cluster: this node's control-plane pods at the new version, etcd healthy, the API on the VIP.
#   A change of labs-k8s:kubernetes.containerdVersion alone takes part 3 and the check: drained,
#   containerd.io installed and restarted (prepare-node.sh), kubelet restarted, Ready, uncordoned.
#
# Every part is guarded, so a run that died anywhere resumes where it stopped, and a node already
# at the version changes nothing. kubeadm renews this node's certificates (admin.conf included)
# during `upgrade apply`/`upgrade node`; root's kubeconfig copy is refreshed afterwards.
#
# Parameters (params.env): NODE_NAME, UPGRADE_MODE, K8S_VERSION, K8S_MINOR_VERSION,
# CONTAINERD_MIN_VERSION, CONTAINERD_VERSION, VIP, API_PORT, API_WAIT_SECONDS, NODE_WAIT_SECONDS, DRAIN_TIMEOUT_SECONDS,
# VERIFY_TIMEOUT_SECONDS, VERIFY_INTERVAL_SECONDS, KUBERNETES_REPOSITORY_URL (labs-k8s:mirrors.kubernetesRepository.url),
# PREPARE_DIR (this node's prepare step directory).
# stdout: "<node> upgraded to vX.Y.Z, containerd A.B.C" (first control plane: "...; etcd snapshot
# <path>") or "<node> already at vX.Y.Z, containerd A.B.C".
set -Eeuo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"
# shellcheck source-path=SCRIPTDIR source=upgrade-lib.sh
. "$HERE/upgrade-lib.sh"
require_root
load_params "$HERE"
: "${NODE_NAME:?}" "${UPGRADE_MODE:?}" "${K8S_VERSION:?}" "${K8S_MINOR_VERSION:?}" "${CONTAINERD_MIN_VERSION:?}" "${CONTAINERD_VERSION:?}"
: "${VIP:?}" "${API_PORT:?}" "${API_WAIT_SECONDS:?}" "${NODE_WAIT_SECONDS:?}" "${DRAIN_TIMEOUT_SECONDS:?}"
: "${VERIFY_TIMEOUT_SECONDS:?}" "${VERIFY_INTERVAL_SECONDS:?}" "${PREPARE_DIR:?}" "${KUBERNETES_REPOSITORY_URL:?}"
[[ $UPGRADE_MODE == apply || $UPGRADE_MODE == node ]] || die "UPGRADE_MODE must be apply or node, not '$UPGRADE_MODE'"
TARGET=v$K8S_VERSION
CONTROL_PLANE_COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler)

[[ -f $ADMIN_CONF ]] || die "no ${ADMIN_CONF#"$ROOT"}: run this on a control plane of the cluster"
wait_for "$API_WAIT_SECONDS" 5 api_answers "127.0.0.1:$API_PORT" ||
    die "the local API server does not answer within ${API_WAIT_SECONDS}s: see 'crictl ps -a' and 'journalctl -u kubelet' on $NODE_NAME"

# control_plane_at VERSION: this node's static pod manifests run VERSION.
control_plane_at() {
    local component
    for component in "${CONTROL_PLANE_COMPONENTS[@]}"; do
        [[ $(manifest_version "$component") == "$1" ]] || return 1
    done
}

# ------------------------------------------------------------------ the transition, refused before any change
# check_transition CURRENT: may the cluster at CURRENT move to TARGET? Every problem is listed at once.
check_transition() {
    local current=$1 problems=() nodes pods name ready kubelet runtime image tag
    local target_minor current_minor
    target_minor=$(minor_of "$TARGET")
    current_minor=$(minor_of "$current")
    if version_lt "$TARGET" "$current"; then
        die "labs-k8s:kubernetes.version is $K8S_VERSION but the cluster already runs $current: downgrades are not supported (kubeadm upgrades and etcd's data do not go back). Set labs-k8s:kubernetes.version to ${current#v} or later. Nothing was changed"
    fi
    if ((target_minor > current_minor + 1)); then
        die "labs-k8s:kubernetes.version $K8S_VERSION skips a minor: the cluster runs $current and kubeadm upgrades one minor at a time (version skew policy). Set labs-k8s:kubernetes.version to a 1.$((current_minor + 1)).x release, run pulumi up, then set $K8S_VERSION. Nothing was changed"
    fi

    nodes=$(kq get nodes -o json) || die "cannot list the nodes"
    while IFS=$'\t' read -r name ready kubelet runtime; do
        [[ -n $name ]] || continue
        [[ $ready == True ]] ||
            problems+=("node $name is not Ready (Ready=$ready): the upgrade drains nodes one by one and needs every node healthy; repair it (or remove it from labs-k8s:nodes) first")
        if version_lt "$TARGET" "$kubelet"; then
            problems+=("node $name runs kubelet $kubelet, newer than $TARGET: that would be a downgrade of $name")
        elif (($(minor_of "$kubelet") + 3 < target_minor)); then
            problems+=("node $name runs kubelet $kubelet, more than three minors older than $TARGET (version skew policy): finish the earlier upgrade of $name first")
        fi
        if [[ $runtime == containerd://* ]]; then
            if version_lt "${runtime#containerd://}" "$CONTAINERD_MIN_VERSION"; then
                problems+=("node $name runs containerd ${runtime#containerd://}; Kubernetes $K8S_MINOR_VERSION needs containerd $CONTAINERD_MIN_VERSION or newer: the upgrade steps roll labs-k8s:kubernetes.containerdVersion node by node: set it with labs-k8s:kubernetes.version ${current#v} first and run pulumi up, then this upgrade")
            fi
        else
            problems+=("node $name reports the container runtime '$runtime', not containerd")
        fi
    done < <(jq -r '.items[] | [.metadata.name,
        ([.status.conditions[]? | select(.type == "Ready") | .status][0] // "Unknown"),
        .status.nodeInfo.kubeletVersion, .status.nodeInfo.containerRuntimeVersion] | @tsv' <<<"$nodes")

    # HA apiservers may differ by one minor at most: an unfinished earlier upgrade is finished first.
    pods=$(kq -n kube-system get pods -l component=kube-apiserver -o json) || die "cannot list the kube-apiserver pods"
    while IFS=$'\t' read -r name image; do
        [[ -n $name ]] || continue
        tag=$(image_tag "$image")
        if (($(minor_of "$tag") + 1 < target_minor)); then
            problems+=("$name runs $tag: the upgrade to $current did not finish on its node; set labs-k8s:kubernetes.version to ${current#v}, run pulumi up, then set $K8S_VERSION")
        fi
    done < <(jq -r '.items[] | [.metadata.name, .spec.containers[0].image] | @tsv' <<<"$pods")

    if ((${#problems[@]} > 0)); then
        log "not upgrading the cluster from $current to $TARGET:"
        printf '  - %s\n' "${problems[@]}" >&2
        die "${#problems[@]} problem(s) above (labs-k8s:kubernetes.version $K8S_VERSION). Nothing was changed"
    fi
}

# ------------------------------------------------------------------ kubeadm upgrade
# run_shown LOG COMMAND...: run it with its output on stderr and in LOG (kubeadm's upgrade output
# holds no secrets); returns the command's status.
run_shown() {
    local logfile=$1
    shift
    "$@" 2>&1 | tee "$logfile" >&2
    return "${PIPESTATUS[0]}"
}

kubeadm_upgrade_apply() {
    local manual
    # With the version as its argument, plan checks that version instead of looking up the latest
    # release on dl.k8s.io (NewOfflineVersionGetter in cmd/kubeadm/app/cmd/upgrade/common.go):
    # nothing here needs the internet beyond the package and image mirrors.
    run_shown "$HERE/kubeadm-upgrade-plan.log" kubeadm upgrade plan "$TARGET" ||
        die "kubeadm upgrade plan $TARGET failed (output above): the cluster is not upgradeable as it is. Nothing was upgraded"
    # Component configs kubeadm cannot convert itself make `upgrade apply` fail: say so now.
    manual=$(awk '/MANUAL UPGRADE REQUIRED/ {table = 1; next} table && NF == 0 {table = 0}
        table && $NF == "yes" {print $1}' "$HERE/kubeadm-upgrade-plan.log" | tr '\n' ' ')
    [[ -z $manual ]] ||
        die "kubeadm upgrade plan: the component config(s) ${manual% } need a manual upgrade, which labs-k8s does not do; see the plan above. Nothing was upgraded"
    take_etcd_snapshot "etcd-before-$TARGET.db"
    if ! run_shown "$HERE/kubeadm-upgrade-apply.log" kubeadm upgrade apply "$TARGET" --yes; then
        die "kubeadm upgrade apply $TARGET failed (output above; kubeadm rolls back a control-plane component that does not come up, and backs up manifests and etcd data under /etc/kubernetes/tmp). The etcd snapshot $SNAPSHOT_PATH was taken before it. Run pulumi up again to retry: kubeadm upgrade is idempotent"
    fi
}

# ------------------------------------------------------------------ the check after this node
verify_control_plane() {
    local pods component name phase image
    MISSING=()
    node_state "$NODE_NAME"
    [[ $NODE_READY == True && $NODE_KUBELET == "$TARGET" ]] ||
        MISSING+=("node $NODE_NAME is not Ready at $TARGET (Ready=$NODE_READY, kubelet ${NODE_KUBELET:-unknown})")
    [[ -z $NODE_MARK ]] || MISSING+=("node $NODE_NAME is still cordoned for the upgrade")
    pods=$(kq -n kube-system get pods -o json 2>/dev/null) || pods='{"items":[]}'
    for component in "${CONTROL_PLANE_COMPONENTS[@]}" etcd; do
        IFS='|' read -r name phase image < <(jq -r --arg pod "$component-$NODE_NAME" '
            [.items[] | select(.metadata.name == $pod)][0] // {} |
            [$pod, (.status.phase // "absent"), (.spec.containers[0].image // "")] | join("|")' <<<"$pods")
        [[ $phase == Running ]] || MISSING+=("pod kube-system/$name is $phase, not Running")
        if [[ $component != etcd && $(image_tag "$image") != "$TARGET" ]]; then
            MISSING+=("pod kube-system/$name runs ${image:-no image}, not $TARGET")
        fi
    done
    etcd_healthy || MISSING+=("$ETCD_PROBLEM")
    api_answers "$VIP:$API_PORT" || MISSING+=("the API does not answer through the VIP (https://$VIP:$API_PORT)")
    ((${#MISSING[@]} == 0))
}

# ------------------------------------------------------------------ main
CURRENT=$(cluster_version)
[[ $CURRENT =~ ^v1\.[0-9]+\.[0-9]+$ ]] || die "cannot read kubernetesVersion from the kubeadm-config ConfigMap (got '$CURRENT')"
node_state "$NODE_NAME"
((NODE_FOUND)) || die "node $NODE_NAME is not registered in the cluster"

if [[ $CURRENT == "$TARGET" ]] && control_plane_at "$TARGET" && packages_at "$K8S_VERSION" kubeadm kubelet kubectl &&
    [[ $NODE_KUBELET == "$TARGET" && -z $NODE_MARK ]] && containerd_at; then
    log "$NODE_NAME is at $TARGET already (control plane, kubeadm, kubelet, kubectl) with containerd $CONTAINERD_VERSION: nothing to do"
    result "$NODE_NAME already at $(at_versions)"
    exit 0
fi

# A cluster already at TARGET is an upgrade being resumed: its transition was checked when it began.
if [[ $UPGRADE_MODE == apply && $CURRENT != "$TARGET" ]]; then
    check_transition "$CURRENT"
elif [[ $UPGRADE_MODE == node && $CURRENT != "$TARGET" ]]; then
    if version_lt "$TARGET" "$CURRENT"; then
        die "labs-k8s:kubernetes.version is $K8S_VERSION but the cluster runs $CURRENT: downgrades are not supported. Nothing was changed"
    fi
    die "the cluster is at $CURRENT, not $TARGET: the first control plane's upgrade step (kubeadm upgrade apply $TARGET) must succeed before $NODE_NAME follows. Nothing was changed"
fi
if version_lt "$TARGET" "$NODE_KUBELET"; then
    die "$NODE_NAME runs kubelet $NODE_KUBELET, newer than labs-k8s:kubernetes.version $K8S_VERSION: downgrades are not supported. Nothing was changed"
fi
log "upgrading $NODE_NAME to $TARGET (cluster at $CURRENT, this control plane at $(manifest_version kube-apiserver), kubelet $NODE_KUBELET)"

# 1. The repository of the new minor, then kubeadm.
use_kubernetes_repository "$K8S_MINOR_VERSION"
install_kubernetes_packages_at "$K8S_VERSION" kubeadm
[[ $(kubeadm version -o short) == "$TARGET" ]] || die "kubeadm version says $(kubeadm version -o short), expected $TARGET"

# 2. The control plane of this node (and, on the first, the cluster's configuration and addons).
if [[ $UPGRADE_MODE == apply ]]; then
    if [[ $CURRENT != "$TARGET" ]] || ! control_plane_at "$TARGET"; then
        kubeadm_upgrade_apply
    else
        log "kubeadm upgrade apply $TARGET is done already (kubeadm-config and the manifests are at $TARGET)"
        if snapshot_complete "$SNAPSHOT_DIR/etcd-before-$TARGET.db"; then
            SNAPSHOT_PATH=${SNAPSHOT_DIR#"$ROOT"}/etcd-before-$TARGET.db
        fi
    fi
    [[ $(cluster_version) == "$TARGET" ]] || die "kubeadm upgrade apply finished but kubeadm-config still says $(cluster_version)"
elif ! control_plane_at "$TARGET"; then
    run_shown "$HERE/kubeadm-upgrade-node.log" kubeadm upgrade node ||
        die "kubeadm upgrade node failed (output above); run pulumi up again to retry: kubeadm upgrade is idempotent"
else
    log "kubeadm upgrade node is done already (the manifests are at $TARGET)"
fi
control_plane_at "$TARGET" ||
    die "kubeadm finished but this node's static pod manifests are not all at $TARGET: $(for c in "${CONTROL_PLANE_COMPONENTS[@]}"; do printf '%s=%s ' "$c" "$(manifest_version "$c")"; done)"
# kubeadm renewed the certificate in admin.conf: root's copy follows it.
setup_root_kubeconfig

# 3. kubelet and kubectl, and the pinned containerd.io, with the node drained.
node_state "$NODE_NAME"
if [[ $NODE_KUBELET != "$TARGET" ]] || ! packages_at "$K8S_VERSION" kubelet kubectl || ! containerd_at; then
    drain_for_upgrade "$NODE_NAME" "$TARGET"
    install_kubernetes_packages_at "$K8S_VERSION" kubelet kubectl
    reprepare_node
    systemctl daemon-reload
    systemctl restart kubelet
fi
wait_node_at "$NODE_NAME" "$TARGET"
uncordon_after_upgrade "$NODE_NAME"

# 4. The cluster after this control plane.
if ! wait_for "$VERIFY_TIMEOUT_SECONDS" "$VERIFY_INTERVAL_SECONDS" verify_control_plane; then
    log "after upgrading $NODE_NAME to $TARGET, within ${VERIFY_TIMEOUT_SECONDS}s:"
    printf '  - %s\n' "${MISSING[@]}" >&2
    die "the cluster is not healthy after upgrading $NODE_NAME (above); the upgrade stops here. Repair it, then run pulumi up again"
fi
log "$NODE_NAME is at $TARGET; its control plane is Running, etcd is healthy, the API answers on $VIP"
if [[ $UPGRADE_MODE == apply && -n $SNAPSHOT_PATH ]]; then
    result "$NODE_NAME upgraded to $(at_versions); etcd snapshot $SNAPSHOT_PATH"
else
    result "$NODE_NAME upgraded to $(at_versions)"
fi
