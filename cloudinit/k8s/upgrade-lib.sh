# shellcheck shell=bash disable=SC2034 # the variables below are used by the scripts that source this
# Helpers of the Kubernetes upgrade steps (upgrade-control-plane.sh, upgrade-worker.sh,
# upgrade-drain.sh). Sourced after lib.sh, never run.
#
# The procedure is kubeadm's ("Upgrading kubeadm clusters", kubernetes.io/docs/tasks/
# administer-cluster/kubeadm/kubeadm-upgrade/): switch the Kubernetes package repository
# (labs-k8s:mirrors.kubernetesRepository.url, pkgs.k8s.io's by default) to the new minor; kubeadm
# first; `kubeadm upgrade apply` on the first control plane, `kubeadm upgrade node` everywhere else;
# then, with the node drained, kubelet and kubectl, a kubelet restart, and uncordon. Versions follow
# the version skew policy (kubernetes.io/releases/version-skew-policy): no minor is skipped, nothing
# is downgraded, and no kubelet is newer than the apiservers.

MANIFESTS=$ROOT/etc/kubernetes/manifests
SNAPSHOT_DIR=$STATE_DIR/etcd-snapshots
# Set on a node by the upgrade when it cordoned it: only such a node is uncordoned afterwards, so a
# node an operator cordoned stays cordoned (kubespray's pre-upgrade does the same with needs_cordoning).
UPGRADE_MARK=labs-k8s/cordoned-for-upgrade

# ------------------------------------------------------------------ versions
# Versions are written as the cluster reports them: v1.36.2.

# minor_of v1.36.2 -> 36
minor_of() {
    local rest=${1#v}
    rest=${rest#*.}
    printf '%s\n' "${rest%%.*}"
}

# image_tag IMAGE -> the tag after the last colon (registry.k8s.io/kube-apiserver:v1.36.0 -> v1.36.0)
image_tag() {
    printf '%s\n' "${1##*:}"
}

# manifest_version COMPONENT: the image tag of this node's static pod manifest, or nothing.
manifest_version() {
    local manifest=$MANIFESTS/$1.yaml image
    [[ -f $manifest ]] || return 0
    image=$(awk '$1 == "image:" {print $2; exit}' "$manifest")
    [[ -z $image ]] || image_tag "$image"
}

# ------------------------------------------------------------------ the cluster, as the API reports it
# Every query goes through `kubectl --kubeconfig $CLUSTER_KUBECONFIG`: admin.conf on a control plane,
# the node's own kubelet.conf on a worker (nodes may read Nodes and the kubeadm-config ConfigMap).
CLUSTER_KUBECONFIG=$ADMIN_CONF
kq() {
    kubectl --kubeconfig "$CLUSTER_KUBECONFIG" --request-timeout=20s "$@"
}

# cluster_version: kubernetesVersion of the ClusterConfiguration in the kubeadm-config ConfigMap,
# which `kubeadm upgrade apply` rewrites in its upload-config phase, after the control plane of the
# first node is upgraded: it is the version the other nodes' `kubeadm upgrade node` moves them to.
cluster_version() {
    local config
    config=$(kq -n kube-system get configmap kubeadm-config -o jsonpath='{.data.ClusterConfiguration}') ||
        die "cannot read the kubeadm-config ConfigMap: is the API server reachable?"
    awk '$1 == "kubernetesVersion:" {gsub(/"/, "", $2); print $2; exit}' <<<"$config"
}

# node_state NODE: read the Node object once. Sets NODE_FOUND (0/1), NODE_READY (True, False,
# Unknown), NODE_KUBELET (v1.36.0), NODE_CORDONED (true/false), NODE_MARK (the upgrade's mark) and
# NODE_RUNTIME (.status.nodeInfo.containerRuntimeVersion without "containerd://" and a "v": 2.2.1).
node_state() {
    local json
    NODE_FOUND=0 NODE_READY=Unknown NODE_KUBELET="" NODE_CORDONED=false NODE_MARK="" NODE_RUNTIME=""
    json=$(kq get node "$1" -o json 2>/dev/null) || return 0
    [[ -n $json ]] || return 0
    NODE_FOUND=1
    IFS='|' read -r NODE_READY NODE_KUBELET NODE_CORDONED NODE_MARK NODE_RUNTIME < <(jq -r --arg key "$UPGRADE_MARK" '[
        ([.status.conditions[]? | select(.type == "Ready") | .status][0] // "Unknown"),
        (.status.nodeInfo.kubeletVersion // ""), (.spec.unschedulable // false),
        (.metadata.annotations[$key] // ""),
        (.status.nodeInfo.containerRuntimeVersion // "" | sub("^containerd://v?"; ""))] | join("|")' <<<"$json")
}

# ------------------------------------------------------------------ containerd (labs-k8s:kubernetes.containerdVersion)
# A new containerd pin is rolled like a Kubernetes upgrade: in the same steps, drained, one control
# plane at a time and workersAtOnce workers at a time; prepare-node.sh leaves it alone on a node in
# the cluster (LEAVE_CONTAINERD) until reprepare_node below, in the node's upgrade step.

# containerd_at: this node's containerd.io package is at CONTAINERD_VERSION.
containerd_at() {
    [[ $(pkg_version containerd.io) == "$CONTAINERD_VERSION"-* ]]
}

# at_versions: what the upgrade steps' stdout records, read back by components/upgrade.py.
at_versions() {
    printf '%s, containerd %s\n' "$TARGET" "$CONTAINERD_VERSION"
}

# wait_node_at NODE VERSION: bounded wait for the node to report Ready with its kubelet at VERSION.
node_is_at() {
    node_state "$1"
    [[ $NODE_READY == True && $NODE_KUBELET == "$2" ]]
}
wait_node_at() {
    local node=$1 version=$2
    if ! wait_for "$NODE_WAIT_SECONDS" 5 node_is_at "$node" "$version"; then
        die "node $node did not come back Ready at $version within ${NODE_WAIT_SECONDS}s (Ready=$NODE_READY, kubelet ${NODE_KUBELET:-unknown}): see 'journalctl -u kubelet' on $node"
    fi
}

# ------------------------------------------------------------------ drain and uncordon (admin.conf)
# drain_for_upgrade NODE VERSION: cordon and evict, respecting PodDisruptionBudgets (no --force, no
# --disable-eviction: the node comes back, so nothing is deleted that eviction would not delete).
# The node is marked first when it is schedulable, so the uncordon afterwards knows it is ours.
drain_for_upgrade() {
    local node=$1 version=$2
    node_state "$node"
    ((NODE_FOUND)) || die "node $node is not registered in the cluster; cannot drain it"
    if [[ $NODE_CORDONED != true && -z $NODE_MARK ]]; then
        kc annotate node "$node" --overwrite "$UPGRADE_MARK=$version" >/dev/null ||
            die "cannot annotate node $node"
    fi
    log "draining $node (kubectl drain --ignore-daemonsets --delete-emptydir-data, up to ${DRAIN_TIMEOUT_SECONDS}s)"
    if ! timeout $((DRAIN_TIMEOUT_SECONDS + 30)) kubectl --kubeconfig "$ADMIN_CONF" drain "$node" \
        --ignore-daemonsets --delete-emptydir-data --timeout="${DRAIN_TIMEOUT_SECONDS}s"; then
        log "pods still on $node:"
        kc get pods --all-namespaces --field-selector "spec.nodeName=$node" -o wide >&2 || true
        die "could not drain $node within ${DRAIN_TIMEOUT_SECONDS}s: a PodDisruptionBudget, a pod without a controller or a pod with local storage blocks it (pods above). $node stays cordoned and nothing was upgraded on it; fix what blocks the drain (or drain it yourself: kubectl drain $node --ignore-daemonsets --delete-emptydir-data --force), then run pulumi up again: the upgrade resumes at $node"
    fi
}

# uncordon_after_upgrade NODE: uncordon a node the upgrade cordoned; leave any other as it is.
uncordon_after_upgrade() {
    local node=$1
    node_state "$node"
    ((NODE_FOUND)) || die "node $node is not registered in the cluster"
    if [[ -z $NODE_MARK ]]; then
        if [[ $NODE_CORDONED == true ]]; then
            log "$node was cordoned before the upgrade (no $UPGRADE_MARK annotation): leaving it cordoned"
        fi
        return 0
    fi
    kc uncordon "$node" >/dev/null || die "kubectl uncordon $node failed"
    kc annotate node "$node" "$UPGRADE_MARK-" >/dev/null || die "cannot remove the $UPGRADE_MARK annotation from $node"
    log "uncordoned $node"
}

# ------------------------------------------------------------------ etcd, through its static pod
# etcdctl runs inside the etcd container (lib.sh etcdctl_in_pod): the very etcd release of the
# cluster, and its certificates.

# etcd_healthy: every member `endpoint health --cluster` lists answers healthy. (How many members
# there should be is verify-cluster.sh's to check at the end: a control plane added in the same
# `pulumi up` joins after the upgraded ones.)
ETCD_PROBLEM=""
etcd_healthy() {
    local health unhealthy
    ETCD_PROBLEM=""
    health=$(etcdctl_in_pod "etcd-$NODE_NAME" endpoint health --cluster -w json 2>/dev/null || true)
    if [[ -z $health ]] || ! jq -e 'type == "array" and length > 0' >/dev/null 2>&1 <<<"$health"; then
        ETCD_PROBLEM="etcdctl endpoint health --cluster gave no answer in etcd-$NODE_NAME"
        return 1
    fi
    unhealthy=$(jq -r '[.[] | select(.health != true) | .endpoint] | join(", ")' <<<"$health")
    [[ -z $unhealthy ]] || ETCD_PROBLEM="etcd endpoints not healthy: $unhealthy"
    [[ -z $ETCD_PROBLEM ]]
}

# snapshot_complete FILE: etcd appends a sha256 to every snapshot, so a whole one is 32 bytes past a
# multiple of 512 (hasChecksum in etcd's client/v3/snapshot/v3_snapshot.go).
snapshot_complete() {
    local size
    [[ -s $1 ]] || return 1
    size=$(stat -c %s "$1")
    ((size % 512 == 32))
}

# take_etcd_snapshot NAME: `etcdctl snapshot save` against this node's member, into the etcd data
# disk (the one host path the etcd pod mounts), then moved to $SNAPSHOT_DIR on the root disk.
# Once per NAME: a resumed upgrade reports the snapshot it already took. Sets SNAPSHOT_PATH.
SNAPSHOT_PATH=""
SNAPSHOTS_KEPT=3
take_etcd_snapshot() {
    local name=$1 in_pod host_copy
    SNAPSHOT_PATH=${SNAPSHOT_DIR#"$ROOT"}/$name
    if snapshot_complete "$SNAPSHOT_DIR/$name"; then
        log "etcd snapshot already taken: $SNAPSHOT_PATH"
        return 0
    fi
    in_pod=/var/lib/etcd/labs-k8s-$name
    host_copy=$ROOT$in_pod
    rm -f "$host_copy" "$host_copy.part"
    log "etcd snapshot of member $NODE_NAME before the upgrade (etcdctl snapshot save)"
    # etcdctl writes <file>.part and renames it only when the whole snapshot and its checksum are in.
    # A whole keyspace takes longer than etcdctl's 10 s command timeout (lib.sh): give it minutes.
    if ! etcdctl_in_pod "etcd-$NODE_NAME" --command-timeout=300s snapshot save "$in_pod"; then
        rm -f "$host_copy"
        die "etcdctl snapshot save failed in etcd-$NODE_NAME: not upgrading without a backup of etcd. Check 'kubectl -n kube-system logs etcd-$NODE_NAME' and the free space on /var/lib/etcd, then run pulumi up again"
    fi
    snapshot_complete "$host_copy" || die "the etcd snapshot ${host_copy#"$ROOT"} is missing or truncated"
    install -d -m 0700 "$SNAPSHOT_DIR"
    install -m 0600 "$host_copy" "$SNAPSHOT_DIR/$name.part"
    mv -f "$SNAPSHOT_DIR/$name.part" "$SNAPSHOT_DIR/$name"
    rm -f "$host_copy"
    (cd "$SNAPSHOT_DIR" && sha256sum "$name" >"$name.sha256")
    log "etcd snapshot saved: $SNAPSHOT_PATH ($(stat -c %s "$SNAPSHOT_DIR/$name") bytes; restore with 'etcdutl snapshot restore')"
    # Keep the newest few: each is a full copy of the keyspace.
    local old
    # shellcheck disable=SC2012 # the names are ours: etcd-before-vX.Y.Z.db
    while read -r old; do
        [[ -n $old ]] || continue
        rm -f "$SNAPSHOT_DIR/$old" "$SNAPSHOT_DIR/$old.sha256"
        log "removed the older etcd snapshot $old (keeping $SNAPSHOTS_KEPT)"
    done < <(cd "$SNAPSHOT_DIR" && ls -1t -- *.db 2>/dev/null | tail -n +$((SNAPSHOTS_KEPT + 1)))
}

# ------------------------------------------------------------------ node preparation for the new version
# The node's own prepare step ran earlier in this `pulumi up`, with the new version in its params
# (on a node still at the old version it prepared it for that one, see prepare-node.sh). Once the
# packages are new, the same script and params converge the node for the new version (the pause
# image containerd pins comes from the new kubeadm), while the node is still drained.
reprepare_node() {
    local dir=$ROOT$PREPARE_DIR
    [[ -f $dir/prepare-node.sh && -f $dir/params.env ]] ||
        die "no $PREPARE_DIR/prepare-node.sh on $NODE_NAME: its prepare step runs before its upgrade step; run pulumi up again"
    { grep -qx "K8S_VERSION=$K8S_VERSION" "$dir/params.env" && grep -qx "CONTAINERD_VERSION=$CONTAINERD_VERSION" "$dir/params.env"; } ||
        die "$PREPARE_DIR holds the preparation of another version than Kubernetes $K8S_VERSION with containerd $CONTAINERD_VERSION: its prepare step runs before its upgrade step; run pulumi up again"
    log "converging $NODE_NAME for $TARGET with containerd $CONTAINERD_VERSION ($PREPARE_DIR/prepare-node.sh)"
    # The node is drained: its containerd may change now (prepare-node.sh LEAVE_CONTAINERD).
    LABS_K8S_ROLL_CONTAINERD=1 STEP_NAME=prepare-node bash "$dir/prepare-node.sh" >&2 ||
        die "prepare-node.sh failed after the packages were upgraded (log above)"
    containerd_at || die "containerd.io is $(pkg_version containerd.io) after prepare-node.sh, not labs-k8s:kubernetes.containerdVersion $CONTAINERD_VERSION"
}
