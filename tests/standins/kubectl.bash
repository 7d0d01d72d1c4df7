# shellcheck shell=bash disable=SC2154 # STATE, ROOT, CLUSTER, SELF, VIP come from the prelude
# Stand-in for kubectl against the fake API in $CLUSTER. admin.conf is cluster-admin; a node's
# kubelet.conf is system:node:<name>, which here may only read Nodes and the kubeadm-config ConfigMap
# (kubeadm's RBAC for `kubeadm upgrade node`: the kubeadm:nodes-kubeadm-config Role). Output is the API's
# JSON shape (a false spec.unschedulable is omitted, as the API omits it).
# drain follows k8s.io/kubectl/pkg/drain: cordon first, then evict; a PodDisruptionBudget makes the
# evictions retry until --timeout ("global timeout reached"); a pod without a controller stops it at
# once unless --force; the node stays cordoned either way.
# annotate refuses to change an existing key without --overwrite (kubectl annotate).
# exec into an etcd pod runs etcdctl_standin (etcdctl.bash) on that pod's node.
selector=""; fieldsel=""; kubeconfig=""; overwrite=0; force=0; args=(); command=()
while (($#)); do
    case $1 in
        --kubeconfig) kubeconfig=$2; shift ;;
        -n|--namespace|-o) shift ;;
        -l) selector=$2; shift ;;
        --field-selector) fieldsel=$2; shift ;;
        -c) shift ;;
        --overwrite) overwrite=1 ;;
        --force) force=1 ;;
        --) shift; command=("$@"); break ;;
        -*) ;;
        *) args+=("$1") ;;
    esac
    shift
done
if api_down; then echo "The connection to the server $VIP:6443 was refused - did you specify the right host or port?" >&2; exit 1; fi
identity="admin"
[[ $kubeconfig == */kubelet.conf ]] && identity="system:node:$SELF"
forbid() {
    echo "Error from server (Forbidden): $1 is forbidden: User \"$identity\" cannot $2" >&2
    exit 1
}
# JSON by printf (values are plain names and versions): jq is only for reading, as on a node.
node_json() {
    local d=$CLUSTER/nodes/$1 file key value annotations="" labels="" spec="{}" role="" ready="" kubelet="" runtime=""
    for file in "$d"/annotations/*; do
        [[ -f $file ]] || continue
        key=${file##*/}
        value=""
        read -r value <"$file" || true
        annotations+="${annotations:+,}\"${key//%2F//}\":\"$value\""
    done
    read -r role <"$d/role" || true
    read -r ready <"$d/ready" || true
    read -r kubelet <"$d/kubelet" || true
    read -r runtime <"$d/runtime" || true
    [[ $role == control-plane ]] && labels='"node-role.kubernetes.io/control-plane":""'
    [[ -f $d/unschedulable ]] &&
        spec='{"unschedulable":true,"taints":[{"key":"node.kubernetes.io/unschedulable","effect":"NoSchedule"}]}'
    printf '{"apiVersion":"v1","kind":"Node","metadata":{"name":"%s","labels":{%s}%s},"spec":%s,' \
        "$1" "$labels" "${annotations:+,\"annotations\":{$annotations\}}" "$spec"
    printf '"status":{"conditions":[{"type":"Ready","status":"%s"}],"nodeInfo":{"kubeletVersion":"%s","containerRuntimeVersion":"%s"}}}\n' \
        "$ready" "$kubelet" "$runtime"
}
pod_json() {
    local d=$CLUSTER/pods/$1 node="" component image="" phase=""
    read -r node <"$d/node" || true
    read -r image <"$d/image" || true
    read -r phase <"$d/phase" || true
    component=${1%"-$node"}
    printf '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"%s","namespace":"kube-system","labels":{"component":"%s"}},' \
        "$1" "$component"
    printf '"spec":{"nodeName":"%s","containers":[{"name":"%s","image":"%s"}]},"status":{"phase":"%s"}}\n' \
        "$node" "$component" "$image" "$phase"
}
list_json() {
    local item items=""
    while read -r item; do items+="${items:+,}$item"; done
    printf '{"apiVersion":"v1","kind":"List","items":[%s]}\n' "$items"
}
need_node() { [[ -d $CLUSTER/nodes/$1 ]] || { echo "Error from server (NotFound): nodes \"$1\" not found" >&2; exit 1; }; }
verb=${args[0]:-}
case "$verb ${args[1]:-}" in
    "get node")
        need_node "${args[2]}"
        node_json "${args[2]}" ;;
    "get nodes")
        for d in "$CLUSTER"/nodes/*; do node_json "${d##*/}"; done | list_json ;;
    "get configmap")
        [[ ${args[2]} == kubeadm-config ]] || exit 1
        printf 'apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\nkubernetesVersion: %s\ncontrolPlaneEndpoint: %s:6443\n' \
            "$(cat "$CLUSTER/version")" "$VIP" ;;
    "get pod")
        [[ $identity == admin ]] || forbid "pods" "get resource \"pods\""
        [[ -d $CLUSTER/pods/${args[2]} ]] || { echo "Error from server (NotFound): pods \"${args[2]}\" not found" >&2; exit 1; }
        pod_json "${args[2]}" ;;
    "get pods")
        [[ $identity == admin ]] || forbid "pods" "list resource \"pods\""
        if [[ -n $fieldsel ]]; then
            cat "$CLUSTER/nodes/${fieldsel#spec.nodeName=}/workloads" 2>/dev/null || true
            exit 0
        fi
        for d in "$CLUSTER"/pods/*; do
            name=${d##*/}
            if [[ -z $selector || $name == "${selector#component=}-"* ]]; then pod_json "$name"; fi
        done | list_json ;;
    "annotate node")
        [[ $identity == admin ]] || forbid "nodes \"${args[2]}\"" "patch resource \"nodes\""
        need_node "${args[2]}"
        spec=${args[3]}
        dir=$CLUSTER/nodes/${args[2]}/annotations
        mkdir -p "$dir"
        if [[ $spec == *- ]]; then
            key=${spec%-}
            rm -f "$dir/${key//\//%2F}"
        else
            key=${spec%%=*}
            if [[ -f $dir/${key//\//%2F} && $overwrite == 0 ]]; then
                echo "error: --overwrite is false but found the following declared annotation(s): '$key' already has a value ($(cat "$dir/${key//\//%2F}"))" >&2
                exit 1
            fi
            printf '%s' "${spec#*=}" >"$dir/${key//\//%2F}"
        fi
        echo "node/${args[2]} annotated" ;;
    "drain "*)
        node=${args[1]}
        [[ $identity == admin ]] || forbid "nodes \"$node\"" "patch resource \"nodes\""
        need_node "$node"
        d=$CLUSTER/nodes/$node
        touch "$d/unschedulable"
        echo "node/$node cordoned"
        if [[ -f $d/bare-pod && $force == 0 ]]; then
            echo "error: unable to drain node \"$node\" due to error: cannot delete Pods declare no controller (use --force to override): default/debug, continuing command..." >&2
            exit 1
        fi
        if [[ -f $d/pdb-blocks ]]; then
            echo "evicting pod default/web-0" >&2
            echo "error when evicting pods/\"web-0\" -n \"default\" (will retry after 5s): Cannot evict pod as it would violate the pod's disruption budget." >&2
            echo "error: unable to drain node \"$node\" due to error: [error when evicting pods/\"web-0\" -n \"default\": global timeout reached: 300s], continuing command..." >&2
            exit 1
        fi
        [[ -s $d/workloads ]] && echo "evicting pod default/web-0"
        : >"$d/workloads"
        echo "node/$node drained" ;;
    "uncordon "*)
        node=${args[1]}
        [[ $identity == admin ]] || forbid "nodes \"$node\"" "patch resource \"nodes\""
        need_node "$node"
        rm -f "$CLUSTER/nodes/$node/unschedulable"
        echo "node/$node uncordoned" ;;
    "exec "*)
        [[ $identity == admin ]] || forbid "pods \"${args[1]}\"" "create resource \"pods/exec\""
        pod=${args[1]}
        phase="" ETCD_NODE=""
        read -r phase <"$CLUSTER/pods/$pod/phase" 2>/dev/null || true
        # shellcheck disable=SC2034 # ETCD_NODE is read by etcdctl_standin (etcdctl.bash)
        read -r ETCD_NODE <"$CLUSTER/pods/$pod/node" 2>/dev/null || true
        [[ $phase == Running ]] || { echo "error: unable to upgrade connection: container not found (\"etcd\")" >&2; exit 1; }
        [[ ${command[0]:-} == etcdctl ]] || exit 1
        etcdctl_standin "${command[@]:1}" ;;
    *) echo "stand-in kubectl: unexpected arguments ${args[*]}" >&2; exit 1 ;;
esac
