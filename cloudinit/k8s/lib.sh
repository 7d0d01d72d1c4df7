# shellcheck shell=bash disable=SC2034 # the variables below are used by the scripts that source this
# Shared helpers for the labs-k8s Kubernetes steps. Sourced, never run.
#
# Conventions every step follows:
# - logs go to stderr; stdout carries only the step's result (a status word, the CA
#   cert hash, or the kubeconfig), so the caller can read it as a value;
# - secrets (bootstrap token, certificate key) live only in the root-only kubeadm files
#   that the bundle wrote into the step directory; they are never echoed, never put on
#   a command line, and kubeadm output that may contain them is redacted;
# - every file path goes through ROOT, empty on a node; the test harness points it at a
#   scratch directory so the scripts can run against stand-in commands.

ROOT=${LABS_K8S_ROOT:-}
STEP_NAME=${STEP_NAME:-$(basename "${BASH_SOURCE[1]:-$0}" .sh)}
STATE_DIR=$ROOT/var/lib/labs-k8s
TEARDOWN_MARKER=$STATE_DIR/teardown
ADMIN_CONF=$ROOT/etc/kubernetes/admin.conf
KUBELET_CONF=$ROOT/etc/kubernetes/kubelet.conf
CA_CERT=$ROOT/etc/kubernetes/pki/ca.crt
umask 077

# stdout is kept for the step's result (fd 3); everything else, tools' chatter included, goes
# to stderr, so a stray line can never be mistaken for the result.
exec 3>&1 1>&2
result() { printf '%s\n' "$*" >&3; }

trap 'log "unexpected failure (exit $?) at ${BASH_SOURCE[0]##*/} line $LINENO: $BASH_COMMAND"' ERR

log() { printf 'labs-k8s[%s]: %s\n' "$STEP_NAME" "$*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

require_root() {
    if [[ -z $ROOT && $EUID -ne 0 ]]; then
        die "must run as root (the bundle is fed to 'sudo bash -s')"
    fi
}

# Load the rendered, shell-quoted parameters that travel in the bundle.
load_params() {
    local here=$1
    [[ -r $here/params.env ]] || die "params.env missing next to the script in $here"
    # shellcheck source=/dev/null
    . "$here/params.env"
}

# Hide anything shaped like a bootstrap token or a 32-byte hex key (certificate key).
redact() {
    sed -E 's/[a-z0-9]{6}\.[a-z0-9]{16}/<redacted-token>/g; s/[0-9a-fA-F]{64}/<redacted-hex>/g'
}

# Run a command whose output may contain secrets: full output to a root-only log in
# the step directory, a redacted tail to stderr if it fails. Returns the command's status.
run_logged() {
    local logfile=$1
    shift
    local rc=0
    "$@" >"$logfile" 2>&1 || rc=$?
    if ((rc != 0)); then
        log "command failed (exit $rc): $1 $2; last lines of its output (secrets redacted):"
        tail -n 40 "$logfile" | redact >&2
    fi
    return "$rc"
}

# write_file PATH MODE < content: replace PATH only when the content differs.
# Sets WROTE=1 when it changed the file, WROTE=0 when the file already had that content.
# (A status global rather than a return code: callers never run it under `||`, where
# bash would silently switch errexit off inside the function.)
WROTE=0
write_file() {
    local path=$1 mode=$2 tmp dir
    dir=$(dirname "$path")
    # New directories are world-readable like the rest of /etc (the script's umask is 077):
    # daemons that drop privileges, systemd-timesyncd for one, must read their drop-ins.
    if [[ ! -d $dir ]]; then
        (umask 022 && mkdir -p "$dir") || die "cannot create ${dir#"$ROOT"}"
    fi
    tmp=$(mktemp "$path.labs-k8s.XXXXXX") || die "cannot write next to ${path#"$ROOT"}"
    cat >"$tmp" || die "cannot write ${path#"$ROOT"}"
    chmod "$mode" "$tmp"
    if [[ -f $path ]] && cmp -s "$tmp" "$path"; then
        rm -f "$tmp"
        chmod "$mode" "$path"
        WROTE=0
        return 0
    fi
    mv -f "$tmp" "$path" || die "cannot replace ${path#"$ROOT"}"
    log "wrote ${path#"$ROOT"}"
    WROTE=1
}

# remove_managed PATH: delete a file this project wrote earlier (its first line names
# labs-k8s), because its setting is no longer configured. Sets WROTE like write_file.
remove_managed() {
    local path=$1
    WROTE=0
    if [[ -f $path ]] && head -n 1 "$path" | grep -q 'labs-k8s'; then
        rm -f "$path"
        log "removed ${path#"$ROOT"} (no longer configured)"
        WROTE=1
    fi
}

# kubectl against the local admin kubeconfig, never waiting forever on the API.
kc() {
    kubectl --kubeconfig "$ADMIN_CONF" --request-timeout=20s "$@"
}

# api_answers HOST:PORT: does a kube-apiserver answer /readyz or /healthz over TLS?
api_answers() {
    local endpoint=$1 path
    for path in readyz healthz; do
        if curl -fsk --connect-timeout 3 --max-time 5 "https://$endpoint/$path" >/dev/null 2>&1; then
            return 0
        fi
    done
    return 1
}

# The server URL of a kubeconfig's first cluster (no kubectl needed).
kubeconfig_server() {
    awk '$1 == "server:" {print $2; exit}' "$1"
}

# sha256:<hex> of the DER SubjectPublicKeyInfo of a CA certificate: what kubeadm pins.
ca_cert_hash() {
    local cert=$1 hex
    [[ -s $cert ]] || die "CA certificate ${cert#"$ROOT"} is missing"
    hex=$(openssl x509 -in "$cert" -noout -pubkey |
        openssl pkey -pubin -outform DER |
        openssl dgst -sha256 -hex | awk '{print $NF}')
    [[ $hex =~ ^[0-9a-f]{64}$ ]] || die "could not compute the CA public key hash of ${cert#"$ROOT"}"
    printf 'sha256:%s\n' "$hex"
}

# Wait up to SECONDS for COMMAND to succeed, polling every STEP seconds. Counted in
# attempts rather than wall time, so the bound holds whatever each attempt costs.
wait_for() {
    local seconds=$1 step=$2
    shift 2
    local attempts=$((seconds / step + 1))
    while ! "$@"; do
        attempts=$((attempts - 1))
        if ((attempts <= 0)); then
            return 1
        fi
        sleep "$step"
    done
}

# Give root a kubectl config: a copy of admin.conf (its server is the VIP).
setup_root_kubeconfig() {
    install -d -m 0700 "$ROOT/root/.kube"
    if ! cmp -s "$ADMIN_CONF" "$ROOT/root/.kube/config"; then
        install -m 0600 "$ADMIN_CONF" "$ROOT/root/.kube/config"
        log "installed /root/.kube/config (a copy of /etc/kubernetes/admin.conf)"
    fi
}

# join_cluster ROLE CA_CERT_HASH: kubeadm join with the rendered JoinConfiguration, once.
# The CA hash (public: it pins the cluster CA) comes from refresh-join-material.sh on the
# first control plane and replaces the placeholder the render left in the file.
join_cluster() {
    local role=$1 hash=$2
    local template=${HERE:?}/kubeadm-join.yaml final=${HERE:?}/kubeadm-join.final.yaml
    [[ $hash =~ ^sha256:[0-9a-f]{64}$ ]] ||
        die "usage: ${0##*/} sha256:<64 hex digits> (the CA cert hash printed by refresh-join-material.sh)"
    if [[ -f $KUBELET_CONF ]]; then
        log "already joined: ${KUBELET_CONF#"$ROOT"} exists; not running kubeadm join again"
        if [[ $role == control-plane && -f $ADMIN_CONF ]]; then
            setup_root_kubeconfig
        fi
        result already-joined
        return 0
    fi
    [[ -s $template ]] || die "the JoinConfiguration ${template##*/} is missing from the bundle"
    grep -q 'LABS_K8S_CA_CERT_HASH' "$template" || die "${template##*/} has no CA cert hash placeholder"
    sed "s/LABS_K8S_CA_CERT_HASH/$hash/" "$template" >"$final"
    chmod 0600 "$final"
    wait_for "$API_WAIT_SECONDS" 5 api_answers "$VIP:$API_PORT" ||
        die "no API server answers on https://$VIP:$API_PORT within ${API_WAIT_SECONDS}s: is the load balancer up and the first control plane initialised?"
    log "kubeadm join as $role through $VIP:$API_PORT (output: $HERE/kubeadm-join.log, root-only)"
    if ! run_logged "$HERE/kubeadm-join.log" kubeadm join --config "$final"; then
        die "kubeadm join failed. Before retrying, run 'kubeadm reset -f' on this node; for a control plane also check 'etcdctl member list' for a stale member"
    fi
    [[ -f $KUBELET_CONF ]] || die "kubeadm join finished but ${KUBELET_CONF#"$ROOT"} is missing"
    if [[ $role == control-plane ]]; then
        [[ -f $ADMIN_CONF ]] || die "kubeadm join --control-plane finished but ${ADMIN_CONF#"$ROOT"} is missing"
        setup_root_kubeconfig
    fi
    result joined
}
