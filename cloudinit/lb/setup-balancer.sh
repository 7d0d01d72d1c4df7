#!/usr/bin/env bash
# labs-k8s step `lb-setup`: HAProxy + Keepalived for the apiserver VIP on one balancer.
#
# Runs as root on Debian 12 from the step directory that step_bundle() fills with the files of
# components/rendering/lb.py:balancer_files(): haproxy.cfg, keepalived.conf, check_apiserver.sh.
# Idempotent: a second run with the same files changes nothing and prints "unchanged".
# A new config replaces the live one only after `haproxy -c` / `keepalived -t` accepted it, so a
# bad config never replaces a good one (the services keep running on the old one).
set -euo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
readonly here
readonly SCRIPT_USER=keepalived_script
readonly SYSCTL_FILE=/etc/sysctl.d/60-labs-k8s-balancer.conf
readonly HAPROXY_CFG=/etc/haproxy/haproxy.cfg
readonly KEEPALIVED_CONF=/etc/keepalived/keepalived.conf
readonly CHECK_SCRIPT=/etc/keepalived/check_apiserver.sh

changed=()

log() { printf 'setup-balancer: %s\n' "$*"; }
die() {
    printf 'setup-balancer: ERROR: %s\n' "$*" >&2
    exit 1
}

[[ ${EUID} -eq 0 ]] || die "run as root (the step runs it through sudo)"
for name in haproxy.cfg keepalived.conf check_apiserver.sh interrupted-dpkg.sh; do
    [[ -s "${here}/${name}" ]] || die "${name} is missing next to $0"
done
# shellcheck source-path=SCRIPTDIR/../node source=interrupted-dpkg.sh
. "${here}/interrupted-dpkg.sh"

install_packages() {
    local missing=() pkg
    for pkg in haproxy keepalived; do
        if [[ $(dpkg-query -W -f='${Status}' "${pkg}" 2>/dev/null || true) != "install ok installed" ]]; then
            missing+=("${pkg}")
        fi
    done
    if ((${#missing[@]} == 0)); then
        log "packages: unchanged"
        return
    fi
    log "packages: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    # A run cut off while dpkg worked (the VM powered off mid-install) left it to finish first.
    finish_interrupted_dpkg
    apt-get install -y -q --no-install-recommends -o Dpkg::Options::=--force-confold "${missing[@]}"
    changed+=("packages")
}

# HAProxy binds the VIP:6443 frontend while the VIP is on the peer (or not yet assigned at boot).
configure_sysctl() {
    local want
    want=$'# labs-k8s balancer: HAProxy binds the VIP even while Keepalived holds it on the peer.\nnet.ipv4.ip_nonlocal_bind = 1'
    if [[ -f ${SYSCTL_FILE} && "$(<"${SYSCTL_FILE}")" == "${want}" ]]; then
        log "${SYSCTL_FILE}: unchanged"
    else
        printf '%s\n' "${want}" >"${SYSCTL_FILE}.labs-k8s-new"
        chmod 0644 "${SYSCTL_FILE}.labs-k8s-new"
        mv -f "${SYSCTL_FILE}.labs-k8s-new" "${SYSCTL_FILE}"
        log "${SYSCTL_FILE}: updated"
        changed+=("${SYSCTL_FILE}")
    fi
    if [[ $(sysctl -n net.ipv4.ip_nonlocal_bind) != 1 ]]; then
        sysctl -q -w net.ipv4.ip_nonlocal_bind=1
        log "net.ipv4.ip_nonlocal_bind: set to 1"
        changed+=("net.ipv4.ip_nonlocal_bind")
    fi
}

# The unprivileged user Keepalived runs check_apiserver.sh as (script_user, enable_script_security).
create_script_user() {
    if getent passwd "${SCRIPT_USER}" >/dev/null; then
        log "user ${SCRIPT_USER}: unchanged"
        return
    fi
    useradd --system --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin --comment "labs-k8s keepalived check scripts" "${SCRIPT_USER}"
    log "user ${SCRIPT_USER}: created"
    changed+=("user ${SCRIPT_USER}")
}

# install_file SRC DEST MODE GROUP [VALIDATOR...]
# Stages SRC next to DEST, runs `VALIDATOR... STAGED` and only then renames it over DEST.
# Sets file_changed=1 if DEST changed, 0 if it was already identical (content, mode and owner).
# (A status variable rather than a return code: `set -e` does not apply inside a function
# called as a condition.)
file_changed=0
install_file() {
    local src=$1 dest=$2 mode=$3 group=$4
    shift 4
    local staged="${dest}.labs-k8s-new"
    file_changed=0
    if [[ -f ${dest} ]] && cmp -s "${src}" "${dest}" && [[ $(stat -c '%a %U %G' "${dest}") == "${mode} root ${group}" ]]; then
        log "${dest}: unchanged"
        return 0
    fi
    install -D -m "${mode}" -o root -g "${group}" "${src}" "${staged}"
    if (($# > 0)) && ! "$@" "${staged}"; then
        rm -f "${staged}"
        die "${dest}: the new file was rejected by \`$*\`; the live file and the running service were left as they were"
    fi
    mv -f "${staged}" "${dest}"
    log "${dest}: updated"
    changed+=("${dest}")
    file_changed=1
}

# `keepalived -t` of keepalived 2.2.7 (Debian 12) kills itself with SIGTERM (exit 143) whenever
# script_user is set, even for a valid config: its "did my parent die" check compares getppid()
# with a main pid that is still 0 in test mode (fixed in 2.2.8, upstream commit aae8e91). In a
# new PID namespace getppid() is 0 too, so the check passes and `-t` returns its real verdict.
keepalived_config_test() {
    unshare --pid --fork keepalived -t -f "$1"
}

# ensure_service NAME RELOAD(0|1): enabled at boot, running, reloaded when its config changed.
ensure_service() {
    local name=$1 reload=$2
    if ! systemctl is-enabled --quiet "${name}"; then
        systemctl enable --quiet "${name}"
        log "${name}: enabled"
        changed+=("${name} enabled")
    fi
    if ! systemctl is-active --quiet "${name}"; then
        systemctl start "${name}"
        log "${name}: started"
        changed+=("${name} started")
    elif ((reload)); then
        # HAProxy: hitless reload (its unit validates first); Keepalived: SIGHUP, keeps the VIP.
        systemctl reload "${name}"
        log "${name}: reloaded"
        changed+=("${name} reloaded")
    fi
}

install_packages
configure_sysctl
create_script_user

install_file "${here}/haproxy.cfg" "${HAPROXY_CFG}" 644 root haproxy -c -f
haproxy_changed=${file_changed}
# The check script first: `keepalived -t` checks that the script it names exists and is secure.
install_file "${here}/check_apiserver.sh" "${CHECK_SCRIPT}" 755 root
keepalived_changed=${file_changed}
install_file "${here}/keepalived.conf" "${KEEPALIVED_CONF}" 640 root keepalived_config_test
if ((file_changed)); then keepalived_changed=1; fi

# HAProxy first, so that Keepalived's check passes as soon as Keepalived starts.
ensure_service haproxy "${haproxy_changed}"
ensure_service keepalived "${keepalived_changed}"

if ((${#changed[@]} == 0)); then
    log "unchanged"
else
    log "changed: $(printf "%s; " "${changed[@]}")"
fi
