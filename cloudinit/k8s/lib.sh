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
K8S_DIR=$ROOT/etc/kubernetes
ADMIN_CONF=$K8S_DIR/admin.conf
KUBELET_CONF=$K8S_DIR/kubelet.conf
CA_CERT=$K8S_DIR/pki/ca.crt
MANIFESTS=$K8S_DIR/manifests
ETCD_MANIFEST=$MANIFESTS/etcd.yaml
# The in-cluster mark that the whole lab is being destroyed (teardown-guard.sh): while it exists,
# leave-cluster.sh drains and removes nothing.
TEARDOWN_CONFIGMAP=labs-k8s-teardown
# etcdctl runs inside an etcd container (crictl exec on this node, kubectl exec elsewhere), with
# the client certificate kubeadm made for etcd's health checks; paths are inside the container.
ETCD_PKI=/etc/kubernetes/pki/etcd
ETCDCTL_ARGS=(--endpoints=https://127.0.0.1:2379 "--cacert=$ETCD_PKI/ca.crt"
    "--cert=$ETCD_PKI/healthcheck-client.crt" "--key=$ETCD_PKI/healthcheck-client.key" --command-timeout=10s)
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

# ------------------------------------------------------------------ cluster objects and etcd

# api_has KIND NAME [NAMESPACE]: 0 when the object exists, 1 when it does not, 2 when the API
# could not be asked (a missing object must never be confused with an unreachable API).
api_has() {
    local kind=$1 name=$2 namespace=${3:-} out
    local scope=()
    [[ -z $namespace ]] || scope=(-n "$namespace")
    out=$(kc get "$kind" "$name" "${scope[@]}" --ignore-not-found -o name) || return 2
    [[ -n $out ]]
}

# teardown_in_progress: is the lab being destroyed (teardown-guard.sh set the mark)? Dies when
# the API cannot be asked: a drain or member removal must not guess.
teardown_in_progress() {
    local rc=0
    api_has configmap "$TEARDOWN_CONFIGMAP" kube-system || rc=$?
    case $rc in
        0) return 0 ;;
        1) return 1 ;;
        *) die "cannot ask the API (through $(kubeconfig_server "$ADMIN_CONF")) whether the lab is being destroyed; is a control plane healthy?" ;;
    esac
}

# running_etcd_pod [NOT_ON_NODE]: a Running etcd static pod, preferably not on NOT_ON_NODE.
running_etcd_pod() {
    kc -n kube-system get pods -l component=etcd -o json |
        jq -r --arg not "${1:-}" '[.items[] | select(.status.phase == "Running" and .spec.nodeName != $not)
            | .metadata.name][0] // empty'
}

# etcdctl_in_pod POD ARGS...: etcdctl inside that etcd pod (kubectl exec, through the API).
etcdctl_in_pod() {
    local pod=$1
    shift
    kc -n kube-system exec "$pod" -c etcd -- etcdctl "${ETCDCTL_ARGS[@]}" "$@"
}

# etcdctl_local ARGS...: etcdctl inside this node's etcd container (crictl exec: no API needed).
etcdctl_local() {
    local id
    id=$(crictl ps --name etcd --state running -q 2>/dev/null | head -n 1) || true
    [[ -n $id ]] || return 1
    crictl exec "$id" etcdctl "${ETCDCTL_ARGS[@]}" "$@"
}

# member_line MEMBERS IP: the `etcdctl member list` line (simple format, etcdctl
# printer_simple.go: "ID, started|unstarted, name, peerURLs, clientURLs, isLearner") whose peer
# URL is https://IP:2380. IDs stay hex strings: they are 64-bit, too big for shell arithmetic.
member_line() {
    awk -F', ' -v peer="https://$2:2380" 'index($4, peer) {print; exit}' <<<"$1"
}

# member_state MEMBERS IP NAME: voting | learner | unstarted | absent | "named <other>".
member_state() {
    local line
    line=$(member_line "$1" "$2")
    if [[ -z $line ]]; then
        echo absent
        return
    fi
    awk -F', ' -v name="$3" '{
        if ($2 != "started") print "unstarted"
        else if ($6 == "true") print "learner"
        else if ($3 != name) print "named " $3
        else print "voting" }' <<<"$line"
}

# ------------------------------------------------------------------ joining

# has_kubeadm_state: does this node hold anything a kubeadm init or join left behind?
has_kubeadm_state() {
    local path
    for path in "$ADMIN_CONF" "$KUBELET_CONF" "$K8S_DIR/bootstrap-kubelet.conf" "$CA_CERT" \
        "$ROOT/var/lib/kubelet/config.yaml" "$ROOT/var/lib/etcd/member"; do
        [[ -e $path ]] && return 0
    done
    compgen -G "$MANIFESTS/*.yaml" >/dev/null
}

# cluster_members: `etcdctl member list` from this node's etcd if it runs (MEMBERS_FROM=local),
# else from another control plane's etcd through the API (MEMBERS_FROM=cluster).
MEMBERS_FROM=""
cluster_members() {
    local pod
    MEMBERS_FROM=local
    etcdctl_local member list 2>/dev/null && return 0
    MEMBERS_FROM=cluster
    [[ -f $ADMIN_CONF ]] || return 1
    pod=$(running_etcd_pod "$NODE_NAME" 2>/dev/null) || return 1
    [[ -n $pod ]] || return 1
    etcdctl_in_pod "$pod" member list
}

# node_marked_control_plane: 0 when the API has this node's Node labelled control-plane, 1 when
# the Node is missing or unlabelled, 2 when the API cannot be asked (through admin.conf).
node_marked_control_plane() {
    local out
    out=$(kc get node "$NODE_NAME" --ignore-not-found -o json) || return 2
    [[ -n $out ]] || return 1
    jq -e '.metadata.labels // {} | has("node-role.kubernetes.io/control-plane")' >/dev/null <<<"$out"
}

# kubelet_client_cert: 0 when this node's kubelet holds a client certificate, present and not
# expired: embedded in kubelet.conf (kubeadm init's, until kubelet-finalize) or in the file
# kubelet.conf names. The kubelet writes kubelet.conf at startup, *before* it has one: a
# kubeconfig naming /var/lib/kubelet/pki/kubelet-client-current.pem, which exists only once its
# CSR is signed (kubernetes/kubernetes pkg/kubelet/certificate/bootstrap/bootstrap.go
# LoadClientConfig, writeKubeconfigFromBootstrapping). So kubelet.conf alone proves nothing.
# CLIENT_CERT_PROBLEM says why not.
CLIENT_CERT_PROBLEM=""
kubelet_client_cert() {
    local data file pem
    CLIENT_CERT_PROBLEM=""
    if [[ ! -f $KUBELET_CONF ]]; then
        CLIENT_CERT_PROBLEM="there is no ${KUBELET_CONF#"$ROOT"}"
        return 1
    fi
    data=$(awk '$1 == "client-certificate-data:" {print $2; exit}' "$KUBELET_CONF")
    file=$(awk '$1 == "client-certificate:" {print $2; exit}' "$KUBELET_CONF")
    if [[ -n $data ]]; then
        pem=$(base64 -d <<<"$data" 2>/dev/null) || pem=""
    elif [[ -n $file ]]; then
        if [[ ! -s $ROOT$file ]]; then
            CLIENT_CERT_PROBLEM="${KUBELET_CONF#"$ROOT"} names $file, which does not exist: the kubelet's TLS bootstrap did not finish"
            return 1
        fi
        pem=$(cat "$ROOT$file")
    else
        CLIENT_CERT_PROBLEM="${KUBELET_CONF#"$ROOT"} names no client certificate"
        return 1
    fi
    if ! openssl x509 -noout <<<"$pem" >/dev/null 2>&1; then
        CLIENT_CERT_PROBLEM="the kubelet's client certificate (${file:-embedded in ${KUBELET_CONF#"$ROOT"}}) cannot be read"
        return 1
    fi
    if ! openssl x509 -noout -checkend 0 <<<"$pem" >/dev/null 2>&1; then
        CLIENT_CERT_PROBLEM="the kubelet's client certificate (${file:-embedded in ${KUBELET_CONF#"$ROOT"}}) has expired"
        return 1
    fi
}

# JOIN_STATE after joined_state ROLE: joined | unfinished | partial | none | unknown:<why>.
# A control plane is joined when it has admin.conf, the etcd static pod manifest, is a started,
# voting etcd member under its own name, and its Node is registered with the control-plane label.
# A voting member without that Node is `unfinished`: its join stopped after etcd-join, before
# kubelet-wait-bootstrap (since Kubernetes 1.35 a control plane's kubelet bootstraps against its
# own API server, ControlPlaneKubeletLocalMode, so its kubelet.conf and Node come after etcd-join)
# or control-plane-join (the label and taint), or its kubelet has no client certificate (its TLS
# bootstrap failed: finish_control_plane_join). A worker is joined when its kubelet holds a client
# certificate and the API knows its Node; without one it is `partial`: kubeadm removed
# bootstrap-kubelet.conf when its wait failed (`defer os.Remove`, cmd/kubeadm/app/cmd/phases/join/
# kubelet.go runKubeletWaitBootstrapPhase), so only a reset and a new join bootstrap it again.
# A kubelet.conf kubectl cannot load is told apart from an API that does not answer: only the
# second is `unknown`. kubeadm join writes admin.conf and the control-plane manifests
# (control-plane-prepare) and kubelet.conf before the join is done (cmd/kubeadm/app/cmd/join.go),
# so no file alone proves anything.
JOIN_STATE=none
joined_state() {
    local role=$1 members state out errors rc=0
    if ! has_kubeadm_state; then
        JOIN_STATE=none
        return
    fi
    if [[ $role == control-plane ]]; then
        if [[ ! -f $ADMIN_CONF || ! -f $ETCD_MANIFEST ]]; then
            JOIN_STATE=partial
            return
        fi
        if ! members=$(cluster_members); then
            JOIN_STATE="unknown:no etcd member answers (neither this node's etcd nor another control plane's through $VIP)"
            return
        fi
        state=$(member_state "$members" "$NODE_IP" "$NODE_NAME")
        log "etcd member for $NODE_IP (member list from the $MEMBERS_FROM etcd): $state"
        if [[ $state == voting ]]; then
            node_marked_control_plane || rc=$?
            if ((rc == 0)) && ! kubelet_client_cert; then
                log "this node's kubelet has no usable client certificate: $CLIENT_CERT_PROBLEM"
                rc=1
            fi
            case $rc in
                0) JOIN_STATE=joined ;;
                1) JOIN_STATE=unfinished ;;
                *) JOIN_STATE="unknown:this node is a voting etcd member, but the API (through $(kubeconfig_server "$ADMIN_CONF")) does not say whether its Node is registered and marked control-plane" ;;
            esac
        elif [[ $MEMBERS_FROM == local && $state == absent ]]; then
            # This node's own etcd answers, yet its member list lacks it: never reset on that.
            JOIN_STATE="unknown:this node's etcd runs but its member list has no member at $NODE_IP"
        else
            JOIN_STATE=partial
        fi
        return
    fi
    if ! kubelet_client_cert; then
        log "this node's kubelet has no usable client certificate: $CLIENT_CERT_PROBLEM"
        JOIN_STATE=partial
        return
    fi
    # The kubelet's own credentials may read its own Node object (Node authorizer).
    errors=$(mktemp)
    if ! out=$(kubectl --kubeconfig "$KUBELET_CONF" --request-timeout=20s get node "$NODE_NAME" --ignore-not-found -o name 2>"$errors"); then
        out=$(head -n 3 "$errors")
        rm -f "$errors"
        # kubectl validates the kubeconfig before it dials (client-go clientcmd: "Error in
        # configuration", "error loading config file"): credentials it cannot load are this node's
        # problem, not the API's.
        if grep -qE '^(Error in configuration|error loading config file)' <<<"$out"; then
            log "kubectl cannot load this node's kubelet.conf: $out"
            JOIN_STATE=partial
        else
            JOIN_STATE="unknown:the API does not answer this node's kubelet credentials (${out//$'\n'/ })"
        fi
        return
    fi
    rm -f "$errors"
    if [[ -n $out ]]; then JOIN_STATE=joined; else JOIN_STATE=partial; fi
}

# remove_own_stale_member: before a half-joined control plane is reset, take its etcd member
# out of the cluster (through another control plane's etcd): kubeadm's own reset only tries,
# and a member left behind costs the cluster its fault tolerance.
remove_own_stale_member() {
    local pod members line
    [[ -f $ADMIN_CONF ]] || return 0
    pod=$(running_etcd_pod "$NODE_NAME" 2>/dev/null) || pod=""
    if [[ -z $pod ]]; then
        log "no other etcd member answers through the API; kubeadm reset will try to remove this node's member itself"
        return 0
    fi
    members=$(etcdctl_in_pod "$pod" member list) || die "etcdctl member list failed in $pod"
    line=$(member_line "$members" "$NODE_IP")
    if [[ -n $line ]]; then
        log "removing this node's stale etcd member (${line%%,*}: $line) through $pod"
        etcdctl_in_pod "$pod" member remove "${line%%,*}" || die "etcdctl member remove ${line%%,*} failed in $pod"
    fi
}

# finish_control_plane_join CONFIG: the join phases after etcd-join, each on its own and each
# idempotent: the kubelet's TLS bootstrap against this node's API server, then the control-plane
# label and taint. A kubelet without a client certificate gets a new bootstrap-kubelet.conf and a
# restart first (`kubeadm join phase kubelet-start`): a failed kubelet-wait-bootstrap removed the
# old one, and the certificate-less kubelet.conf the kubelet wrote at startup cannot bootstrap
# (bootstrap.go LoadClientConfig). kubelet-wait-bootstrap also runs when a join that died before
# it left bootstrap-kubelet.conf (it holds the token) behind: it returns at once and removes it.
# All read the cluster's configuration through discovery, so the refreshed token in CONFIG must be
# valid (the refresh ran right before). A voting etcd member is never reset for this.
finish_control_plane_join() {
    local config=$1 logfile=${HERE:?}/kubeadm-join-phase.log wait=0
    if ! kubelet_client_cert; then
        log "this node's kubelet has no client certificate ($CLIENT_CERT_PROBLEM): kubeadm join phase kubelet-start (output: $logfile, root-only)"
        run_logged "$logfile" kubeadm join phase kubelet-start --config "$config" ||
            die "kubeadm join phase kubelet-start failed (log above): this node's kubelet could not be given new bootstrap credentials"
        wait=1
    fi
    if [[ -f $K8S_DIR/bootstrap-kubelet.conf ]]; then wait=1; fi
    if ((wait)); then
        log "kubeadm join phase kubelet-wait-bootstrap (output: $logfile, root-only)"
        run_logged "$logfile" kubeadm join phase kubelet-wait-bootstrap --config "$config" ||
            die "kubeadm join phase kubelet-wait-bootstrap failed: this node's kubelet did not bootstrap against its own API server; see 'journalctl -u kubelet' and 'crictl ps -a' on it. The next 'pulumi up' gives it new bootstrap credentials (kubeadm join phase kubelet-start) and waits again; its etcd member stays"
    fi
    log "kubeadm join phase control-plane-join mark-control-plane (output: $logfile, root-only)"
    run_logged "$logfile" kubeadm join phase control-plane-join mark-control-plane --config "$config" ||
        die "kubeadm join phase control-plane-join mark-control-plane failed (log above)"
}

# How long a worker's join waits for its kubelet to register the Node (join_cluster).
NODE_REGISTRATION_SECONDS=60
worker_node_registered() {
    joined_state worker
    [[ $JOIN_STATE == joined ]]
}

# join_cluster ROLE CA_CERT_HASH: kubeadm join with the rendered JoinConfiguration, once; a node
# that a previous join left half-way is reset (its etcd member removed first) and joined again,
# except a control plane whose etcd member already votes: its remaining phases are run instead.
# The CA hash (public: it pins the cluster CA) comes from refresh-join-material.sh and replaces
# the placeholder the render left in the file.
join_cluster() {
    local role=$1 hash=$2
    local template=${HERE:?}/kubeadm-join.yaml final=${HERE:?}/kubeadm-join.final.yaml
    [[ $hash =~ ^sha256:[0-9a-f]{64}$ ]] ||
        die "usage: ${0##*/} sha256:<64 hex digits> (the CA cert hash printed by refresh-join-material.sh)"
    [[ -s $template ]] || die "the JoinConfiguration ${template##*/} is missing from the bundle"
    grep -q 'LABS_K8S_CA_CERT_HASH' "$template" || die "${template##*/} has no CA cert hash placeholder"
    sed "s/LABS_K8S_CA_CERT_HASH/$hash/" "$template" >"$final"
    chmod 0600 "$final"
    joined_state "$role"
    case $JOIN_STATE in
        joined)
            log "already joined as $role; not running kubeadm join again"
            if [[ $role == control-plane ]]; then setup_root_kubeconfig; fi
            result already-joined
            return 0
            ;;
        unknown:*)
            die "cannot tell whether this node finished joining: ${JOIN_STATE#unknown:}. Not resetting it on a guess; retry when the control plane answers"
            ;;
        unfinished)
            # Its etcd member votes: a reset would take a healthy member out. Run what is left.
            log "this node is a voting etcd member but its join stopped before kubeadm's last phases: finishing them"
            finish_control_plane_join "$final"
            joined_state "$role"
            [[ $JOIN_STATE == joined ]] || die "the remaining join phases ran but this node is not joined (${JOIN_STATE}); see $HERE/kubeadm-join-phase.log"
            setup_root_kubeconfig
            result joined
            return 0
            ;;
        partial)
            log "a previous kubeadm join stopped half-way; resetting this node and joining again"
            if [[ $role == control-plane ]]; then remove_own_stale_member; fi
            run_logged "$HERE/kubeadm-reset.log" kubeadm reset -f || die "kubeadm reset -f failed (see $HERE/kubeadm-reset.log)"
            ;;
    esac
    wait_for "$API_WAIT_SECONDS" 5 api_answers "$VIP:$API_PORT" ||
        die "no API server answers on https://$VIP:$API_PORT within ${API_WAIT_SECONDS}s: is the load balancer up and a control plane healthy?"
    log "kubeadm join as $role through $VIP:$API_PORT (output: $HERE/kubeadm-join.log, root-only)"
    if ! run_logged "$HERE/kubeadm-join.log" kubeadm join --config "$final"; then
        die "kubeadm join failed (log above). The next 'pulumi up' refreshes the join material, resets this node (removing its etcd member) and joins it again"
    fi
    joined_state "$role"
    if [[ $role == worker && $JOIN_STATE == partial ]]; then
        # kubeadm join returns once the kubelet has its client certificate (kubelet-wait-bootstrap);
        # the kubelet registers its Node after that, from its own loop (kubelet_node_status.go
        # registerWithAPIServer, a backoff up to 7 s): not yet registered is not half-joined.
        log "waiting up to ${NODE_REGISTRATION_SECONDS}s for the kubelet to register Node $NODE_NAME"
        wait_for "$NODE_REGISTRATION_SECONDS" 2 worker_node_registered || true
    fi
    [[ $JOIN_STATE == joined ]] || die "kubeadm join finished but this node is not joined (${JOIN_STATE}); the next 'pulumi up' resets it and joins again"
    if [[ $role == control-plane ]]; then setup_root_kubeconfig; fi
    result joined
}

# ------------------------------------------------------------------ packages (prepare and upgrade steps)
export DEBIAN_FRONTEND=noninteractive
# confold: a package upgrade never replaces a config file prepare-node.sh manages.
APT_INSTALL=(apt-get install -y -q --no-install-recommends
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
KUBERNETES_LIST=$ROOT/etc/apt/sources.list.d/kubernetes.list

# shellcheck source-path=SCRIPTDIR/../node source=interrupted-dpkg.sh
. "$(dirname "${BASH_SOURCE[0]}")/interrupted-dpkg.sh"

APT_FRESH=0
apt_update() {
    if ((APT_FRESH == 0)); then
        log "apt-get update"
        apt-get update -q -o Acquire::Retries=3 ||
            die "apt-get update failed: are the repositories (Debian's, labs-k8s:mirrors.kubernetesRepository.url, labs-k8s:mirrors.containerdRepository.url, or labs-k8s:mirrors.aptProxy) reachable from this node?"
        # A step cut off while dpkg worked (the VM powered off, the step's deadline) left it to
        # finish before any install: apt refuses one until then.
        finish_interrupted_dpkg
        APT_FRESH=1
    fi
}

pkg_installed() {
    # shellcheck disable=SC2016 # ${Status} is dpkg-query's field syntax, not a shell expansion
    [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true) == "install ok installed" ]]
}

pkg_version() {
    # shellcheck disable=SC2016
    dpkg-query -W -f='${Version}' "$1" 2>/dev/null || true
}

# version_lt A B: is version A older than B (sort -V order; a leading v is ignored)?
version_lt() {
    local a=${1#v} b=${2#v}
    [[ $a != "$b" && $(printf '%s\n%s\n' "$a" "$b" | sort -V | head -n 1) == "$a" ]]
}

hold_packages() {
    local held pkg todo=()
    held=$(apt-mark showhold 2>/dev/null || true)
    for pkg in "$@"; do
        grep -qxF "$pkg" <<<"$held" || todo+=("$pkg")
    done
    if ((${#todo[@]} > 0)); then
        apt-mark hold "${todo[@]}"
    fi
}

# use_kubernetes_repository MINOR: the source of one minor, $KUBERNETES_REPOSITORY_URL/v<minor>/deb/
# (labs-k8s:mirrors.kubernetesRepository.url, pkgs.k8s.io's by default: each minor is its own
# repository, "Changing The Kubernetes Package Repository", kubernetes.io). Sets WROTE.
use_kubernetes_repository() {
    local minor=$1
    write_file "$KUBERNETES_LIST" 0644 <<EOF
# labs-k8s: the community-owned Kubernetes packages, one repository per minor (v$minor)
deb [signed-by=/etc/apt/keyrings/kubernetes-apt-keyring.asc] ${KUBERNETES_REPOSITORY_URL:?}/v$minor/deb/ /
EOF
    if ((WROTE)); then APT_FRESH=0; fi
}

# packages_at VERSION PACKAGE...: are all these packages installed at VERSION (any build of it)?
packages_at() {
    local version=$1 pkg
    shift
    for pkg in "$@"; do
        [[ $(pkg_version "$pkg") == "$version"-* ]] || return 1
    done
}

# install_kubernetes_packages_at VERSION PACKAGE...: each package at VERSION (the newest VERSION-*
# build the repository has), then held. Held packages change only with --allow-change-held-packages
# (apt refuses otherwise: "Held packages were changed and -y was used without ...").
install_kubernetes_packages_at() {
    local version=$1 pkg candidate todo=() resolved=()
    shift
    for pkg in "$@"; do
        packages_at "$version" "$pkg" || todo+=("$pkg")
    done
    if ((${#todo[@]} > 0)); then
        apt_update
        for pkg in "${todo[@]}"; do
            candidate=$(apt-cache madison "$pkg" | awk -v prefix="$version-" 'index($3, prefix) == 1 {print $3; exit}')
            [[ -n $candidate ]] ||
                die "the Kubernetes repository $KUBERNETES_REPOSITORY_URL/v${version%.*}/deb/ (labs-k8s:mirrors.kubernetesRepository.url) has no $pkg $version (labs-k8s:kubernetes.version; apt-cache madison $pkg lists: $(apt-cache madison "$pkg" | awk '{print $3}' | head -n 5 | tr '\n' ' '))"
            resolved+=("$pkg=$candidate")
        done
        log "installing ${resolved[*]}"
        "${APT_INSTALL[@]}" --allow-change-held-packages "${resolved[@]}" || die "apt-get install ${resolved[*]} failed"
        packages_at "$version" "${todo[@]}" || die "${todo[*]} not at $version after apt-get install"
    fi
    hold_packages "$@"
}
