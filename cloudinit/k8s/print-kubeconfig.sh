#!/usr/bin/env bash
# print-kubeconfig.sh: print the cluster's admin kubeconfig from the first control plane,
# after checking that it points at the VIP (not at one control plane's own address).
#
# Parameters (params.env): VIP, API_PORT.
# stdout: /etc/kubernetes/admin.conf, verbatim. It holds the cluster-admin client key:
# the caller must treat it as a secret.
set -Eeuo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"
require_root
load_params "$HERE"
: "${VIP:?}" "${API_PORT:?}"
[[ -s $ADMIN_CONF ]] || die "no ${ADMIN_CONF#"$ROOT"}: kubeadm init has not run on this node"
server=$(kubeconfig_server "$ADMIN_CONF")
[[ $server == "https://$VIP:$API_PORT" ]] ||
    die "admin.conf points at '${server:-nothing}', expected https://$VIP:$API_PORT (labs-k8s:loadBalancer.vip)"
cat "$ADMIN_CONF" >&3
