#!/usr/bin/env bash
# apply-flannel.sh: apply the pinned kube-flannel manifest on the first control plane and
# wait, bounded, for the DaemonSet to roll out. kubectl apply makes re-runs harmless.
#
# Parameters (params.env): FLANNEL_TIMEOUT_SECONDS. The bundle carries kube-flannel.yml.
# stdout: "flannel-ready".
set -Eeuo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"
require_root
load_params "$HERE"
: "${FLANNEL_TIMEOUT_SECONDS:?}"
MANIFEST=$HERE/kube-flannel.yml
[[ -s $MANIFEST ]] || die "kube-flannel.yml is missing from the bundle"
[[ -f $ADMIN_CONF ]] || die "no ${ADMIN_CONF#"$ROOT"}: run this on the initialised first control plane"

kc apply -f "$MANIFEST" || die "kubectl apply of kube-flannel.yml failed"
if ! timeout $((FLANNEL_TIMEOUT_SECONDS + 30)) kubectl --kubeconfig "$ADMIN_CONF" -n kube-flannel \
    rollout status daemonset/kube-flannel-ds --timeout="${FLANNEL_TIMEOUT_SECONDS}s"; then
    kc -n kube-flannel get daemonset,pods -o wide || true
    die "the kube-flannel DaemonSet did not roll out within ${FLANNEL_TIMEOUT_SECONDS}s (pods above)"
fi
result flannel-ready
