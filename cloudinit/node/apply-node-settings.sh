#!/usr/bin/env bash
# labs-k8s step `node-settings`: the settings of a running node that change without rebuilding
# its VM (docs/runbook.md, "What a config change does"): the SSH keys the operator user trusts,
# the NTP servers, the DNS servers and search list, and the apt proxy. cloud-init applied the
# same values at first boot; the VM's guestinfo carries the current ones for a replacement.
#
# Runs as root from the step directory that step_bundle() fills with the files of
# components/rendering/node.py:node_settings_files():
#   authorized_keys      the keys of ssh.publicKey and ssh.extraPublicKeys, one a line
#   ntp-servers          network.ntpServers, space-separated
#   network-config.yaml  the node's network config (the same document as in guestinfo)
#   resolv.conf          nameserver and search lines of network.dnsServers / searchDomain
#   apt-proxy            mirrors.aptProxy, or empty
# Usage: apply-node-settings.sh USER INTERFACE
#
# Idempotent: a file is replaced (atomically) and a service touched only when the content
# changes; a second run prints "unchanged" for everything. The network file is rendered by the
# node's own cloud-init (`cloud-init devel net-convert`, the renderer that wrote it at first
# boot), and refused if anything but DNS would change: an address change rebuilds the VM.
set -euo pipefail
shopt -s inherit_errexit # a failure inside $(...) stops the script too

ROOT=${LABS_K8S_ROOT:-}
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
readonly ROOT here
readonly TIMESYNCD_DIR=$ROOT/etc/systemd/timesyncd.conf.d
readonly ENI_FILE=/etc/network/interfaces.d/50-cloud-init
readonly APT_PROXY_FILE=$ROOT/etc/apt/apt.conf.d/90cloud-init-aptproxy

log() { printf 'node-settings: %s\n' "$*"; }
die() {
    printf 'node-settings: ERROR: %s\n' "$*" >&2
    exit 1
}

[[ $# -eq 2 ]] || die "usage: apply-node-settings.sh USER INTERFACE"
user=$1
interface=$2
[[ -n $ROOT || $EUID -eq 0 ]] || die "run as root (the step runs it through sudo)"
for name in authorized_keys ntp-servers network-config.yaml resolv.conf apt-proxy; do
    [[ -f $here/$name ]] || die "$name is missing next to $0"
done

# Replace PATH with the content on stdin when it differs; mode and owner as given.
# Prints "changed" or "unchanged". The new file is written beside the old one and renamed
# over it, so a reader (sshd, apt) never sees half a file.
replace_file() {
    local path=$1 mode=$2 owner=$3 tmp
    [[ -d $(dirname -- "$path") ]] || install -d -m 0755 "$(dirname -- "$path")"
    tmp=$(mktemp "$(dirname -- "$path")/.labs-k8s.XXXXXX") || die "cannot write next to ${path#"$ROOT"}"
    cat >"$tmp" || die "cannot write ${path#"$ROOT"}"
    if [[ -f $path ]] && cmp -s "$tmp" "$path"; then
        rm -f "$tmp"
        echo unchanged
        return
    fi
    chmod "$mode" "$tmp"
    chown "$owner" "$tmp"
    mv -f "$tmp" "$path"
    echo changed
}

# Lines that are neither blank nor comments, trailing blanks removed: how two key files compare.
significant() { sed -e 's/[[:space:]]*$//' -e '/^$/d' -e '/^#/d' "$@"; }

apply_ssh_keys() {
    local entry home group keys state
    entry=$(getent passwd "$user") || die "user $user does not exist (ssh.user); cloud-init creates it at first boot"
    home=$(cut -d: -f6 <<<"$entry")
    group=$(getent group "$(cut -d: -f4 <<<"$entry")" | cut -d: -f1)
    [[ -n $home && -n $group ]] || die "cannot read the home directory and group of $user"
    keys=$ROOT$home/.ssh/authorized_keys
    [[ -s $here/authorized_keys ]] || die "no SSH key to trust: refusing to empty $keys"
    install -d -m 0700 "$ROOT$home/.ssh"
    chown "$user:$group" "$ROOT$home/.ssh"
    if [[ -f $keys ]] && [[ $(significant "$keys") == "$(significant "$here/authorized_keys")" ]]; then
        state=unchanged
    else
        state=$(replace_file "$keys" 0600 "$user:$group" <"$here/authorized_keys")
    fi
    log "ssh keys of $user: $state"
}

# The servers a timesyncd drop-in names: its NTP= values, space-separated, in order.
ntp_of() { [[ -f $1 ]] && sed -n 's/^[[:space:]]*NTP=//p' "$1" | tr -s ' \t\n' ' ' | sed -e 's/^ //' -e 's/ $//'; }

apply_ntp() {
    local servers file changed=0
    servers=$(tr -s ' \n' ' ' <"$here/ntp-servers" | sed -e 's/^ //' -e 's/ $//')
    [[ -n $servers ]] || die "no NTP server (network.ntpServers)"
    install -d -m 0755 "$TIMESYNCD_DIR"
    # cloud-init's drop-in (cc_ntp) and labs-k8s.conf (which templates and prepare steps of earlier
    # versions wrote; this step is now the only writer on a running node): timesyncd adds up every
    # NTP= line, so both must name the new servers or the old ones stay in use. A file that already
    # names them is left as it is.
    for file in "$TIMESYNCD_DIR/cloud-init.conf" "$TIMESYNCD_DIR/labs-k8s.conf"; do
        [[ $(ntp_of "$file" || true) == "$servers" ]] && continue
        printf '# labs-k8s: the lab'"'"'s NTP servers (labs-k8s:network.ntpServers)\n[Time]\nNTP=%s\n' "$servers" |
            replace_file "$file" 0644 root:root >/dev/null
        changed=1
    done
    if ((changed)); then
        systemctl try-restart systemd-timesyncd.service
        log "ntp servers: changed to $servers"
    else
        log "ntp servers: unchanged"
    fi
}

apply_dns() {
    local rendered live state record
    rendered=$(mktemp -d)
    # shellcheck disable=SC2064 # expand now: the directory is this function's
    trap "rm -rf -- '$rendered'" RETURN
    cloud-init devel net-convert --network-data "$here/network-config.yaml" --kind yaml --distro debian \
        --directory "$rendered" --output-kind eni >/dev/null 2>&1 ||
        die "cloud-init could not render network-config.yaml: see cloud-init devel net-convert --debug"
    live=$ROOT$ENI_FILE
    [[ -f $rendered$ENI_FILE ]] || die "cloud-init rendered no $ENI_FILE"
    [[ -f $live ]] || die "$ENI_FILE is missing: this node's network was not configured by cloud-init"
    # Only DNS may differ: anything else (address, gateway, interface) means another VM.
    if ! cmp -s <(grep -v -E '^[[:space:]]*(dns-|dns \{)' "$live") \
        <(grep -v -E '^[[:space:]]*(dns-|dns \{)' "$rendered$ENI_FILE"); then
        die "$ENI_FILE differs from the config in more than DNS; such a change replaces the VM: run pulumi up"
    fi
    state=$(replace_file "$live" 0644 root:root <"$rendered$ENI_FILE")
    if [[ $state == changed ]]; then
        # ifupdown hands dns-* to resolvconf when an interface comes up; bouncing the only NIC
        # would cut this very session, so give resolvconf the same records directly.
        if command -v resolvconf >/dev/null; then
            for record in lo.inet "$interface.inet"; do
                resolvconf -a "$record" <"$here/resolv.conf"
            done
        else
            replace_file "$ROOT/etc/resolv.conf" 0644 root:root <"$here/resolv.conf" >/dev/null
        fi
    fi
    log "dns: $state"
}

apply_apt_proxy() {
    local proxy state
    proxy=$(tr -d '[:space:]' <"$here/apt-proxy")
    if [[ -n $proxy ]]; then
        # cloud-init 22.4 cc_apt_configure writes `proxy:` as exactly this line.
        state=$(printf 'Acquire::http::Proxy "%s";\n' "$proxy" | replace_file "$APT_PROXY_FILE" 0644 root:root)
    elif [[ -f $APT_PROXY_FILE ]]; then
        rm -f -- "$APT_PROXY_FILE"
        state=removed
    else
        state=unchanged
    fi
    log "apt proxy: $state"
}

apply_ssh_keys
apply_ntp
apply_dns
apply_apt_proxy
