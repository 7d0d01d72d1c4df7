#!/usr/bin/env bash
# print-kubeconfig.sh: on any healthy control plane (reached through the VIP), print the cluster's
# admin kubeconfig after checking that it points at the VIP (not at one control plane's own
# address). Its client certificate is signed for one year (kubeadm's CertificateValidityPeriod);
# when it has less than RENEW_BEFORE_DAYS left it is renewed first ('kubeadm certs renew
# admin.conf'), and the first line says until when it is valid, so the stack can re-export it
# before it lapses.
#
# Parameters (params.env): VIP, API_PORT, RENEW_BEFORE_DAYS.
# stdout: "# labs-k8s: client certificate valid until <RFC 3339>" and /etc/kubernetes/admin.conf.
# It holds the cluster-admin client key: the caller must treat it as a secret.
set -Eeuo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"
require_root
load_params "$HERE"
: "${VIP:?}" "${API_PORT:?}" "${RENEW_BEFORE_DAYS:?}"
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
# The admin credentials go to stdout last, in one write, once nothing can fail any more:
# pulumi-command puts a failed step's stdout into its error text whatever `logging` says
# (v1.2.1 remote/commandOutputs.go, `run`), so a step must never fail after printing them.
valid_until=$(date -u -d "@$end" +%Y-%m-%dT%H:%M:%SZ)
kubeconfig=$(<"$ADMIN_CONF") || die "cannot read ${ADMIN_CONF#"$ROOT"}"
[[ $kubeconfig == *client-key-data:* ]] || die "admin.conf has no embedded client key"
printf '# labs-k8s: client certificate valid until %s\n%s\n' "$valid_until" "$kubeconfig" >&3
