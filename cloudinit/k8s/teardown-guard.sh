#!/usr/bin/env bash
# teardown-guard.sh set|clear: the in-cluster mark that the whole lab is being destroyed.
#
# `pulumi destroy` deletes the teardown-guard step first (every leave step depends on it); its
# delete runs `set`, and every leave-cluster.sh after it then drains and removes nothing: the VMs
# are going anyway. Its create runs `clear`, so an `up` after an interrupted destroy does not
# inherit the mark. The mark is a ConfigMap (kube-system/labs-k8s-teardown), not a file on one
# node: the steps reach whichever control plane is healthy.
#
# stdout: "teardown-marked" or "teardown-cleared".
set -Eeuo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"
require_root
[[ -f $ADMIN_CONF ]] || die "no ${ADMIN_CONF#"$ROOT"} on this node: the step must run on a control plane"
case ${1:-} in
    set)
        rc=0
        api_has configmap "$TEARDOWN_CONFIGMAP" kube-system || rc=$?
        ((rc < 2)) || die "cannot reach the API to mark the teardown"
        if ((rc == 1)); then
            kc -n kube-system create configmap "$TEARDOWN_CONFIGMAP" --from-literal=reason=pulumi-destroy ||
                die "cannot create ConfigMap kube-system/$TEARDOWN_CONFIGMAP"
        fi
        result teardown-marked
        ;;
    clear)
        kc -n kube-system delete configmap "$TEARDOWN_CONFIGMAP" --ignore-not-found ||
            die "cannot delete ConfigMap kube-system/$TEARDOWN_CONFIGMAP"
        result teardown-cleared
        ;;
    *) die "usage: ${0##*/} set|clear" ;;
esac
