#!/usr/bin/env bash
# refresh-join-material.sh: on the first control plane, before each join, make the join
# material valid again and print the CA cert hash the joins pin.
#
# - certificates: 'kubeadm init phase upload-certs' re-encrypts the control-plane
#   certificates into the kubeadm-certs Secret with the same certificate key (the Secret
#   expires after 2 h, so a late join would otherwise fail);
# - bootstrap token: created from the config (24 h TTL) when it is missing or has less
#   than an hour left;
# - stdout: exactly one line, sha256:<hex> of the cluster CA's public key, computed from
#   /etc/kubernetes/pki/ca.crt with openssl (never parsed from kubeadm init output).
#
# Parameters (params.env): VIP, API_PORT, API_WAIT_SECONDS, TOKEN_ID (the public half of
# the token). The bundle carries kubeadm-init.yaml (root-only: token and certificate key).
set -Eeuo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"
require_root
load_params "$HERE"
: "${VIP:?}" "${API_PORT:?}" "${API_WAIT_SECONDS:?}" "${TOKEN_ID:?}"
CONFIG=$HERE/kubeadm-init.yaml
[[ -s $CONFIG ]] || die "the kubeadm configuration ${CONFIG##*/} is missing from the bundle"
[[ -f $ADMIN_CONF ]] || die "no ${ADMIN_CONF#"$ROOT"}: kubeadm init has not run on this node"
wait_for "$API_WAIT_SECONDS" 5 api_answers "127.0.0.1:$API_PORT" ||
    die "the local API server does not answer within ${API_WAIT_SECONDS}s"

log "re-uploading the control-plane certificates (kubeadm-certs Secret, valid 2 h)"
run_logged "$HERE/upload-certs.log" kubeadm init phase upload-certs --upload-certs \
    --config "$CONFIG" --kubeconfig "$ADMIN_CONF" ||
    die "kubeadm init phase upload-certs failed"

# token_valid: the token with our ID exists and lives for at least another hour.
token_valid() {
    local listing line expires
    listing=$(kubeadm token list --kubeconfig "$ADMIN_CONF" 2>/dev/null) ||
        die "kubeadm token list failed"
    # Columns: TOKEN TTL EXPIRES USAGES DESCRIPTION EXTRA-GROUPS; match on the public token ID.
    line=$(awk -v id="$TOKEN_ID." 'index($1, id) == 1 {print $2, $3; exit}' <<<"$listing")
    [[ -n $line ]] || return 1
    expires=${line#* }
    if [[ $expires == "<never>" || ${line%% *} == "<forever>" ]]; then
        return 0
    fi
    (($(date -d "$expires" +%s) > $(date +%s) + 3600))
}

if token_valid; then
    log "bootstrap token $TOKEN_ID.* exists and is valid for more than an hour"
else
    log "creating bootstrap token $TOKEN_ID.* (TTL 24h, from the config)"
    run_logged "$HERE/token-create.log" kubeadm token create --config "$CONFIG" --kubeconfig "$ADMIN_CONF" ||
        die "kubeadm token create failed"
    token_valid || die "bootstrap token $TOKEN_ID.* still missing after kubeadm token create"
fi

hash=$(ca_cert_hash "$CA_CERT")
result "$hash"
