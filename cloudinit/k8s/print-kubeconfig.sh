#!/usr/bin/env bash
# print-kubeconfig.sh: on any healthy control plane (reached through the VIP), print the cluster's
# admin kubeconfig after checking that it points at the VIP (not at one control plane's own
# address). Its client certificate is signed for one year (kubeadm's CertificateValidityPeriod);
# when it has less than RENEW_BEFORE_DAYS left it is renewed first ('kubeadm certs renew
# admin.conf'), and the first line says until when it is valid, so the stack can re-export it
# before it lapses.
#
# Parameters (params.env): VIP, API_PORT, RENEW_BEFORE_DAYS, TRANSPORT_KEY_FILE (the bundle's file
# holding the stack's transport key).
# stdout: "# labs-k8s: client certificate valid until <RFC 3339>" and "# labs-k8s: sealed kubeconfig
# <base64>": /etc/kubernetes/admin.conf encrypted with the transport key (openssl enc, PBKDF2), so
# that the cluster-admin key is never in plain in an error text (components/rendering/k8s.py).
set -Eeuo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"
require_root
load_params "$HERE"
: "${VIP:?}" "${API_PORT:?}" "${RENEW_BEFORE_DAYS:?}" "${TRANSPORT_KEY_FILE:?}"
[[ -s $ADMIN_CONF ]] || die "no ${ADMIN_CONF#"$ROOT"}: this node is not a control plane of the cluster"
server=$(kubeconfig_server "$ADMIN_CONF")
[[ $server == "https://$VIP:$API_PORT" ]] ||
    die "admin.conf points at '${server:-nothing}', expected https://$VIP:$API_PORT (labs-k8s:loadBalancer.vip)"

# client_cert_end: the notAfter of admin.conf's client certificate, as epoch seconds.
client_cert_end() {
    local data end
    data=$(awk '$1 == "client-certificate-data:" {print $2; exit}' "$ADMIN_CONF")
    [[ -n $data ]] || die "admin.conf has no embedded client certificate"
    end=$(base64 -d <<<"$data" | openssl x509 -noout -enddate) || die "cannot read admin.conf's client certificate"
    date -u -d "${end#notAfter=}" +%s
}

end=$(client_cert_end)
if ((end - $(date -u +%s) < RENEW_BEFORE_DAYS * 86400)); then
    log "admin.conf's client certificate expires $(date -u -d "@$end" +%Y-%m-%dT%H:%M:%SZ), within ${RENEW_BEFORE_DAYS} days: renewing it"
    run_logged "$HERE/certs-renew.log" kubeadm certs renew admin.conf || die "kubeadm certs renew admin.conf failed"
    end=$(client_cert_end)
fi
# pulumi-command puts a failed step's stdout into its error text whatever `logging` says
# (v1.2.1 remote/commandOutputs.go, `run`), and a session cut after this printed is such a
# failure: the credentials leave only sealed (the key from the bundle's file, never argv), last.
valid_until=$(date -u -d "@$end" +%Y-%m-%dT%H:%M:%SZ)
kubeconfig=$(<"$ADMIN_CONF") || die "cannot read ${ADMIN_CONF#"$ROOT"}"
[[ $kubeconfig == *client-key-data:* ]] || die "admin.conf has no embedded client key"
sealed=$(printf '%s\n' "$kubeconfig" |
    openssl enc -aes-256-cbc -pbkdf2 -iter 100000 -md sha256 -salt -a -A -pass "file:$HERE/$TRANSPORT_KEY_FILE") ||
    die "cannot seal the kubeconfig (openssl enc)"
printf '# labs-k8s: client certificate valid until %s\n# labs-k8s: sealed kubeconfig %s\n' "$valid_until" "$sealed" >&3
