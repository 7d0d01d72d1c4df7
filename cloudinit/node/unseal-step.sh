#!/usr/bin/env bash
# unseal-step.sh: the plain front of a sealed step bundle (components/rendering/sealed.py).
#
# Why: pulumi-command accepts any SSH host key (ssh.InsecureIgnoreHostKey in 1.2.1
# provider/pkg/provider/remote/connection.go) and sends a step's whole stdin at once, so whatever
# host answers for a node's address (an ARP spoof on the node network, a conflict for the VIP) gets
# the bundle. A bundle that carries a secret (bootstrap token, certificate key, VRRP password) is
# therefore sealed: its real bundle is encrypted to the node key of each host meant to run it, a
# random key that only that VM has (the program puts it in the VM's guestinfo through vCenter;
# nothing on the node network can read it). A host without one of those keys cannot read the
# bundle: this script stops here, naming the node it was meant for, and nothing secret is on it.
#
# Files beside it: sealed-recipients (one line per host meant to run it: name, key id, the bundle
# key wrapped with that host's node key), sealed-bundle (the real bundle, encrypted with the bundle
# key), sealed-sha256 (the real bundle's SHA-256). Arguments after the step name go to the bundle.
# The node key is never on a command line: openssl reads every key from a pipe (-pass fd:3).
set -Eeuo pipefail
umask 077
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STEP=${1:?the step name}
shift
GUESTINFO_KEY=guestinfo.labs-k8s.node-key
# Must match components/rendering/sealed.py (PBKDF2_ITERATIONS, key_id).
ITERATIONS=10000

die() {
    printf 'labs-k8s[%s]: %s\n' "$STEP" "$*" >&2
    exit 1
}

mapfile -t lines <"$HERE/sealed-recipients"
names=()
for line in "${lines[@]}"; do names+=("${line%% *}"); done
meant_for=${names[*]}
if ((${#names[@]} > 1)); then meant_for="any of ${meant_for// /, }"; fi
this_host=$(hostname 2>/dev/null || echo unknown)
refuse() {
    die "refusing to run: this host ($this_host) is not ${meant_for}: $1. The step carries secrets sealed" \
        "to the node key of ${meant_for#any of } (the VM's $GUESTINFO_KEY, set through vCenter), so nothing secret" \
        "reached this host. Another machine answers for the address (an address conflict or an ARP spoof on" \
        "the node network): find it before running \`pulumi up\` again (docs/cluster.md, \"Host identity\")"
}

command -v vmware-rpctool >/dev/null || refuse "it has no vmware-rpctool, so it is no VMware VM of this lab"
# open-vm-tools' rpctool prints the value and exits 0, or fails when the key is not set.
node_key=$(vmware-rpctool "info-get $GUESTINFO_KEY" 2>/dev/null) || node_key=
[[ -n $node_key ]] || refuse "its guestinfo has no $GUESTINFO_KEY"
key_id=$(printf 'labs-k8s node key id\n%s\n' "$node_key" | sha256sum)
key_id=${key_id:0:16}

wrapped=
for line in "${lines[@]}"; do
    read -r _ id value <<<"$line"
    if [[ $id == "$key_id" ]]; then
        wrapped=$value
        break
    fi
done
[[ -n $wrapped ]] || refuse "its node key (id $key_id) is none of theirs"

decrypt() { # decrypt KEY: base64 of openssl-enc data on stdin -> plain text on stdout
    openssl enc -d -aes-256-cbc -pbkdf2 -iter "$ITERATIONS" -md sha256 -a -A -pass fd:3 3< <(printf '%s\n' "$1")
}
bundle_key=$(decrypt "$node_key" <<<"$wrapped") || die "cannot unwrap the bundle key with this host's node key"
unset node_key
inner=$HERE/sealed-bundle.sh
decrypt "$bundle_key" <"$HERE/sealed-bundle" >"$inner" || die "cannot decrypt the sealed bundle"
read -r want <"$HERE/sealed-sha256"
have=$(sha256sum <"$inner")
[[ ${have%% *} == "$want" ]] || die "the decrypted bundle is not the one sealed (SHA-256 differs)"
# The decrypted bundle is read from an open descriptor and its file removed first: the secrets it
# writes stay only in the root-only files of the step directory, as for any other step.
exec 4<"$inner"
rm -f "$inner"
if [[ ! -f $HERE/sealed-prove ]]; then
    unset bundle_key
    exec bash /dev/fd/4 "$@"
fi
# An answer the program relies on (the CA hash a join pins, the exported kubeconfig): a last line
# proves it came from a host that could open the bundle, a SHA-256 over the bundle key and the
# answer (components/rendering/sealed.py `verified_answer` checks it before using the answer).
rc=0
answer=$(bash /dev/fd/4 "$@") || rc=$?
printf '%s\n' "$answer"
((rc == 0)) || exit "$rc"
proof=$({ printf 'labs-k8s proof\n%s\n' "$bundle_key" && printf '%s' "$answer"; } | sha256sum)
printf 'labs-k8s-proof %s\n' "${proof%% *}"
