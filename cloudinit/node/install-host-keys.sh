#!/usr/bin/env bash
# labs-k8s step `host-key`: make sshd present the host keys the program pins
# (components/rendering/host_keys.py, docs/cluster.md "Host identity").
#
# On a new VM cloud-init has already written the same keys (user-data `ssh_keys`), and this only
# checks them. On a running VM whose key was rotated it installs the new keys: the step reaches
# the node over a connection pinned to the key it had until now (components/fleet.py), and every
# later step pins the new one. sshd re-reads its host keys on a reload (SIGHUP: it re-executes
# itself); the session this runs in keeps going.
#
# Runs as root from the step directory that step_bundle() fills with:
#   ssh_host_ed25519_key[.pub]   the node's key
#   ssh_host_ecdsa_key[.pub]     control planes only: the key they share on the VIP's SSH port
#   hostkeys.conf                the sshd drop-in naming exactly these keys
# Prints (stdout) the public Ed25519 key the node now presents: the next `up` pins a rotation's
# connection to it. The private key files leave the step directory before that.
set -euo pipefail
shopt -s inherit_errexit

ROOT=${LABS_K8S_ROOT:-}
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
readonly ROOT here
readonly SSH_DIR=$ROOT/etc/ssh
readonly DROP_IN=$SSH_DIR/sshd_config.d/00-labs-k8s-hostkeys.conf

log() { printf 'host-key: %s\n' "$*" >&2; }
die() {
    printf 'host-key: ERROR: %s\n' "$*" >&2
    exit 1
}
# The private keys never stay in the step directory, whatever happens below.
trap 'rm -f -- "$here"/ssh_host_*_key' EXIT

[[ -n $ROOT || $EUID -eq 0 ]] || die "run as root (the step runs it through sudo)"
[[ -f $here/ssh_host_ed25519_key && -f $here/ssh_host_ed25519_key.pub && -f $here/hostkeys.conf ]] ||
    die "the bundle has no Ed25519 host key or no hostkeys.conf"

changed=0
# replace PATH MODE SOURCE: PATH gets SOURCE's content when it differs (written beside, renamed over).
replace() {
    local path=$1 mode=$2 source=$3 tmp
    if cmp -s -- "$source" "$path"; then
        return 0
    fi
    install -d -m 0755 "$(dirname -- "$path")"
    tmp=$(mktemp "$(dirname -- "$path")/.labs-k8s.XXXXXX")
    install -m "$mode" -- "$source" "$tmp"
    mv -f -- "$tmp" "$path"
    changed=1
    log "installed ${path#"$ROOT"}"
}
for kind in ed25519 ecdsa; do
    [[ -f $here/ssh_host_${kind}_key ]] || continue
    replace "$SSH_DIR/ssh_host_${kind}_key" 0600 "$here/ssh_host_${kind}_key"
    replace "$SSH_DIR/ssh_host_${kind}_key.pub" 0644 "$here/ssh_host_${kind}_key.pub"
done
replace "$DROP_IN" 0644 "$here/hostkeys.conf"

if ((changed)); then
    if [[ -z $ROOT ]]; then
        # A broken configuration must not take sshd down with the reload: check it first.
        sshd -t || die "sshd refuses the new configuration; the old keys stay in use until it is fixed"
        systemctl reload ssh.service || die "sshd did not reload; it still presents the old keys"
    fi
    log "sshd presents the new host keys from now on"
else
    log "the host keys are the pinned ones already"
fi
cat -- "$SSH_DIR/ssh_host_ed25519_key.pub"
