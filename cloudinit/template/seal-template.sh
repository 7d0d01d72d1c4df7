#!/usr/bin/env bash
# labs-k8s: seal the golden Debian 12 template so that every clone boots as a new machine.
#
# Usage: seal-template.sh [ROOT]
#   ROOT  the root of the system to seal (default /). The installer runs it as
#         `in-target bash seal-template.sh /`; a test or an image tool passes a chroot path.
#
# The config snippets it installs (cloud-init datasource list, open-vm-tools tools.conf,
# the SSH host key unit) are read from the directory this script lives in, or from
# $LABS_K8S_SEAL_FILES. Idempotent: a second run changes nothing and succeeds.
set -euo pipefail

readonly UNIT=labs-k8s-ssh-hostkeys.service
readonly DATASOURCE_CFG=90-labs-k8s-datasource.cfg
readonly SNIPPETS=("$DATASOURCE_CFG" tools.conf "$UNIT")

log() { printf 'seal-template: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ $# -le 1 ]] || die "usage: seal-template.sh [ROOT]"
root=${1:-/}
[[ -d $root ]] || die "$root is not a directory"
root=$(cd "$root" && pwd -P)
# R is prefixed to every path: "" for the running system, "/path/to/chroot" otherwise.
R=${root%/}
[[ -f $R/etc/debian_version ]] || die "$root does not look like a Debian root (no /etc/debian_version); refusing to touch it"

src=${LABS_K8S_SEAL_FILES:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)}
for snippet in "${SNIPPETS[@]}"; do
    [[ -f $src/$snippet ]] || die "$src/$snippet is missing; keep the script next to its snippets or set LABS_K8S_SEAL_FILES"
done

# True only on the running system itself: never swapoff or run host tools against a chroot
# (inside a chroot, swapoff -a would act on the host's swap).
on_live_system() {
    [[ -z $R ]] && command -v ischroot >/dev/null 2>&1 && ! ischroot --default-true
}

# Delete the entries inside a directory, keep the directory.
empty_dir() {
    [[ -d $1 ]] && find "$1" -mindepth 1 -delete
    return 0
}

log "sealing ${root}"

# --- machine-id: an empty file makes systemd generate a new ID on each clone's first boot.
: > "$R/etc/machine-id"
chmod 0444 "$R/etc/machine-id"
if [[ -d $R/var/lib/dbus ]]; then
    rm -f "$R/var/lib/dbus/machine-id"
    ln -s /etc/machine-id "$R/var/lib/dbus/machine-id"
fi
# Clones must not share the entropy seed or the credential key either.
rm -f "$R/var/lib/systemd/random-seed" "$R/var/lib/systemd/credential.secret"

# --- SSH host keys: none in the template; each clone makes its own at first boot
# (cloud-init's ssh module, with $UNIT as the safety net before ssh.service).
rm -f "$R"/etc/ssh/ssh_host_*
install -D -m 0644 "$src/$UNIT" "$R/etc/systemd/system/$UNIT"
for wants in multi-user.target.wants ssh.service.wants; do
    install -d -m 0755 "$R/etc/systemd/system/$wants"
    ln -sfn "/etc/systemd/system/$UNIT" "$R/etc/systemd/system/$wants/$UNIT"
done

# --- swap: off now, gone from fstab, and swap.target masked so nothing turns it back on.
if on_live_system; then
    swapoff -a || log "warning: swapoff -a failed; the fstab entry is removed anyway"
fi
if [[ -f $R/etc/fstab ]]; then
    fstab_tmp=$(mktemp)
    awk '!/^[[:space:]]*#/ && $3 == "swap" { next } { print }' "$R/etc/fstab" > "$fstab_tmp"
    cat "$fstab_tmp" > "$R/etc/fstab"
    rm -f "$fstab_tmp"
fi
install -d -m 0755 "$R/etc/systemd/system"
ln -sfn /dev/null "$R/etc/systemd/system/swap.target"

# --- cloud-init: forget this machine so each clone is a new instance; VMware datasource first.
if [[ -z $R ]] && command -v cloud-init >/dev/null 2>&1; then
    cloud-init clean --logs --seed || log "warning: cloud-init clean failed; cleaning its paths by hand"
fi
# The same paths by hand: covers a ROOT prefix and a system without cloud-init.
empty_dir "$R/var/lib/cloud"
rm -f "$R/var/log/cloud-init.log" "$R/var/log/cloud-init-output.log" "$R/etc/cloud/cloud-init.disabled"
install -D -m 0644 "$src/$DATASOURCE_CFG" "$R/etc/cloud/cloud.cfg.d/$DATASOURCE_CFG"

# --- open-vm-tools: report the node address to vCenter, not an overlay/CNI address.
install -D -m 0644 "$src/tools.conf" "$R/etc/vmware-tools/tools.conf"

# --- network: the installer's build address must not follow the template into clones;
# cloud-init writes each clone's config under interfaces.d (DHCP on the first NIC if it has none).
if [[ -d $R/etc/network ]]; then
    cat > "$R/etc/network/interfaces" <<'EOF'
# labs-k8s template: no NIC is configured here. cloud-init writes each clone's
# network config to /etc/network/interfaces.d/ from the VM's guestinfo metadata.
source /etc/network/interfaces.d/*

auto lo
iface lo inet loopback
EOF
    install -d -m 0755 "$R/etc/network/interfaces.d"
fi
rm -f "$R"/var/lib/dhcp/*.leases "$R"/var/lib/dhcp/dhclient*.lease*
rm -f "$R/etc/udev/rules.d/70-persistent-net.rules"

# --- apt: no downloaded packages or package lists in the template (clones run apt-get update).
if [[ -z $R ]] && command -v apt-get >/dev/null 2>&1; then
    apt-get clean
fi
if [[ -d $R/var/cache/apt ]]; then
    find "$R/var/cache/apt" -type f \( -name '*.deb' -o -name '*.bin' \) -delete
    empty_dir "$R/var/cache/apt/archives/partial"
fi
if [[ -d $R/var/lib/apt/lists ]]; then
    find "$R/var/lib/apt/lists" -type f ! -name lock -delete
fi
# The installer writes the build's apt proxy (mirror/http/proxy) into /etc/apt/apt.conf. It is
# part of the build environment, not of the template: clones get mirrors.aptProxy from cloud-init
# (90cloud-init-aptproxy) and the node-settings step, and a baked-in proxy would outlive its
# removal from the config.
if [[ -f $R/etc/apt/apt.conf ]]; then
    sed -i '/^[[:space:]]*Acquire::[a-z]*::Proxy[[:space:]]/d' "$R/etc/apt/apt.conf"
    grep -q '[^[:space:]]' "$R/etc/apt/apt.conf" || rm -f "$R/etc/apt/apt.conf"
fi

# --- shell history, temporary files and logs of the build (/tmp is emptied at every boot anyway).
for home in "$R/root" "$R"/home/*; do
    [[ -d $home ]] || continue
    rm -f "$home/.bash_history" "$home/.lesshst" "$home/.viminfo" "$home/.wget-hsts"
    rm -f "$home/.ssh/known_hosts"
done
empty_dir "$R/var/tmp"
if [[ -d $R/var/log ]]; then
    find "$R/var/log" -type f \( -name '*.gz' -o -name '*.[0-9]' -o -name '*.old' \) -delete
    empty_dir "$R/var/log/journal"
    find "$R/var/log" -type f -exec truncate -s 0 {} +
fi

log "sealed ${root}: empty machine-id, no SSH host keys, no swap, cloud-init clean"
