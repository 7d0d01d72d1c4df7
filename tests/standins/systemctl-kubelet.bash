# shellcheck shell=bash disable=SC2154 # STATE, CLUSTER, SELF come from the prelude
# A restarted kubelet registers the version installed (Node .status.nodeInfo.kubeletVersion) and the
# runtime's, which it asks the CRI for (.status.nodeInfo.containerRuntimeVersion: the VersionInfo setter
# in kubernetes pkg/kubelet/nodestatus/setters.go), and is Ready again unless $STATE/kubelet-broken
# says it does not come back.
if [[ ${1:-} == restart && ${2:-} == kubelet && -d $CLUSTER/nodes/$SELF ]]; then
    installed kubelet >"$CLUSTER/nodes/$SELF/kubelet"
    [[ ! -f $STATE/containerd-version ]] || echo "containerd://$(cat "$STATE/containerd-version")" >"$CLUSTER/nodes/$SELF/runtime"
    if [[ -f $STATE/kubelet-broken ]]; then echo False; else echo True; fi >"$CLUSTER/nodes/$SELF/ready"
fi
