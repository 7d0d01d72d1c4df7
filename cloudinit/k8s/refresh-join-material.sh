#!/usr/bin/env bash
# refresh-join-material.sh: on any healthy control plane (the step reaches one through the VIP),
# right before a node joins: make the join material valid again and print the CA cert hash the
# join pins.
#
# - certificates (control-plane joins only): 'kubeadm init phase upload-certs' re-encrypts the
#   control-plane certificates into the kubeadm-certs Secret with the same certificate key. The
#   Secret is owned by a bootstrap token with a 2 h TTL (kubeadm constants.DefaultCertTokenDuration)
#   and disappears with it, so a join retried later needs a fresh upload;
# - bootstrap token: the joining node's own, drawn for its join generation (components/cluster.py
#   _join_token). 'kubeadm init phase bootstrap-token' creates it with a 24 h TTL, or updates it
#   in place (UpdateOrCreateTokens with failIfExists=false) when this generation's refresh runs
#   again, and re-creates the bootstrapper RBAC and the cluster-info ConfigMap. Unlike 'kubeadm
#   token create' (which fails "a token with id ... already exists") it never fails on an
#   existing token;
# - stdout: exactly one line, sha256:<hex> of the cluster CA's public key, computed from
#   /etc/kubernetes/pki/ca.crt with openssl (never parsed from kubeadm output).
#
# Parameters (params.env): VIP, API_PORT, API_WAIT_SECONDS, TOKEN_ID (the public half of the
# node's token), JOINING_NODE, JOINING_ROLE. The bundle carries kubeadm-init.yaml (root-only: token and
# certificate key).
set -Eeuo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"
require_root
load_params "$HERE"
: "${VIP:?}" "${API_PORT:?}" "${API_WAIT_SECONDS:?}" "${TOKEN_ID:?}" "${JOINING_NODE:?}" "${JOINING_ROLE:?}"
CONFIG=$HERE/kubeadm-init.yaml
[[ -s $CONFIG ]] || die "the kubeadm configuration ${CONFIG##*/} is missing from the bundle"
[[ -f $ADMIN_CONF ]] || die "no ${ADMIN_CONF#"$ROOT"} on this control plane: it is not (yet) part of the cluster"
wait_for "$API_WAIT_SECONDS" 5 api_answers "$VIP:$API_PORT" ||
    die "the API does not answer on $VIP:$API_PORT within ${API_WAIT_SECONDS}s"

if [[ $JOINING_ROLE == control-plane ]]; then
    log "re-uploading the control-plane certificates for $JOINING_NODE (kubeadm-certs Secret, valid 2 h)"
    run_logged "$HERE/upload-certs.log" kubeadm init phase upload-certs --upload-certs --skip-certificate-key-print \
        --config "$CONFIG" --kubeconfig "$ADMIN_CONF" || die "kubeadm init phase upload-certs failed"
    api_has secret kubeadm-certs kube-system || die "the kubeadm-certs Secret is still missing after upload-certs"
fi

log "refreshing bootstrap token $TOKEN_ID.* for $JOINING_NODE (TTL 24 h from now)"
run_logged "$HERE/bootstrap-token.log" kubeadm init phase bootstrap-token --skip-token-print \
    --config "$CONFIG" --kubeconfig "$ADMIN_CONF" || die "kubeadm init phase bootstrap-token failed"
api_has secret "bootstrap-token-$TOKEN_ID" kube-system ||
    die "bootstrap token $TOKEN_ID.* is still missing after kubeadm init phase bootstrap-token"

hash=$(ca_cert_hash "$CA_CERT")
result "$hash"
