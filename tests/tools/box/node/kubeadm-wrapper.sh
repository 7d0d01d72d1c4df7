#!/bin/bash
# labs-k8s box (test only): /usr/local/bin/kubeadm on a box node, ahead of the real /usr/bin/kubeadm
# on PATH. Two deviations from a VM, each for a property of this machine (docs/testing.md):
# - its cgroups are v1, which kubeadm's preflight refuses from 1.35 on (a VM's are v2): init and
#   join (and their preflight phase) skip that one check, SystemVerification;
# - the node's network namespace is not the kernel's first, where alone nf_conntrack_max can be
#   written: init's configuration gets kube-proxy's conntrack.maxPerCore 0 (leave it), as kind's.
set -uo pipefail
args=("$@")
patched=""
if [[ ${1:-} == init ]]; then
    for ((i = 0; i < ${#args[@]}; i++)); do
        if [[ ${args[i]} == --config && -f ${args[i + 1]:-} ]]; then
            # The configuration holds the token: root-only, and gone when kubeadm is.
            patched=$(umask 077 && mktemp /run/labs-k8s-box-kubeadm.XXXXXX)
            {
                cat "${args[i + 1]}"
                printf '%s\n' --- "apiVersion: kubeproxy.config.k8s.io/v1alpha1" \
                    "kind: KubeProxyConfiguration" "conntrack:" "  maxPerCore: 0"
            } >"$patched"
            args[i + 1]=$patched
        fi
    done
fi
if [[ (${1:-} == init || ${1:-} == join) && (${2:-} != phase || ${3:-} == preflight) ]]; then
    args+=(--ignore-preflight-errors=SystemVerification)
fi
if [[ -z $patched ]]; then
    exec /usr/bin/kubeadm "${args[@]}"
fi
/usr/bin/kubeadm "${args[@]}"
status=$?
rm -f "$patched"
exit "$status"
