#!/usr/bin/env bash
# prepare-node.sh: turn a Debian 12 VM into a Kubernetes node (every control plane and
# worker): kernel modules and sysctl, swap off, no ufw, time sync, the data disk,
# containerd 2.x with the systemd cgroup driver, and kubeadm/kubelet/kubectl pinned to
# the configured patch release. Guarded throughout: a second run changes nothing.
#
# Parameters (params.env, rendered by components/rendering/k8s.py): NODE_NAME, NODE_ROLE,
# K8S_VERSION, K8S_MINOR_VERSION, CONTAINERD_MIN_VERSION, CONTAINERD_VERSION, APT_PROXY,
# REGISTRY_MIRROR, REGISTRY_MIRROR_CA_FILE, KUBERNETES_REPOSITORY_URL, KUBERNETES_KEY_FINGERPRINT, CONTAINERD_REPOSITORY_URL,
# CONTAINERD_KEY_FINGERPRINT, DATA_DISK_GIB, DATA_DISK_MOUNT, DATA_DISK_LABEL, DATA_DISK_UNIT.
# stdout: "prepared <node name>".
set -Eeuo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"
require_root
load_params "$HERE"
: "${NODE_NAME:?}" "${NODE_ROLE:?}" "${K8S_VERSION:?}" "${K8S_MINOR_VERSION:?}" "${CONTAINERD_MIN_VERSION:?}" "${CONTAINERD_VERSION:?}"
: "${APT_PROXY?}" "${REGISTRY_MIRROR?}" "${REGISTRY_MIRROR_CA_FILE?}" "${DATA_DISK_GIB:?}" "${DATA_DISK_MOUNT?}" "${DATA_DISK_LABEL?}" "${DATA_DISK_UNIT?}"
: "${KUBERNETES_REPOSITORY_URL:?}" "${KUBERNETES_KEY_FINGERPRINT:?}" "${CONTAINERD_REPOSITORY_URL:?}" "${CONTAINERD_KEY_FINGERPRINT:?}"

CONTAINERD_SOCKET=unix:///run/containerd/containerd.sock
# The repositories and the fingerprints of their signing keys, checked before apt trusts a key, come
# from labs-k8s:mirrors.kubernetesRepository and labs-k8s:mirrors.containerdRepository: upstream's
# by default (components/config.py says where those fingerprints come from), or a mirror's own.

# ------------------------------------------------------------------ apt proxy (mirrors.aptProxy)
configure_apt_proxy() {
    local conf=$ROOT/etc/apt/apt.conf.d/90labs-k8s-proxy
    if [[ -n $APT_PROXY ]]; then
        write_file "$conf" 0644 <<EOF
// labs-k8s: apt reaches its repositories through the lab's proxy (labs-k8s:mirrors.aptProxy).
Acquire::http::Proxy "$APT_PROXY";
Acquire::https::Proxy "$APT_PROXY";
EOF
    else
        remove_managed "$conf"
    fi
    if ((WROTE)); then APT_FRESH=0; fi
}

# ------------------------------------------------------------------ kernel: modules and sysctl
configure_kernel() {
    write_file "$ROOT/etc/modules-load.d/k8s.conf" 0644 <<'EOF'
# labs-k8s: overlay for container image layers, br_netfilter so bridged pod traffic reaches iptables
overlay
br_netfilter
EOF
    modprobe overlay
    modprobe br_netfilter

    local conf=$ROOT/etc/sysctl.d/99-kubernetes.conf key
    write_file "$conf" 0644 <<'EOF'
# labs-k8s: kube-proxy needs bridged traffic in iptables, pods on other nodes need forwarding
net.bridge.bridge-nf-call-iptables = 1
net.bridge.bridge-nf-call-ip6tables = 1
net.ipv4.ip_forward = 1
EOF
    sysctl -q -p "$conf"
    for key in net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables net.ipv4.ip_forward; do
        [[ $(sysctl -n "$key") == 1 ]] || die "sysctl $key is not 1 after applying ${conf#"$ROOT"}"
    done
}

# ------------------------------------------------------------------ swap: off now and at boot
disable_swap() {
    local fstab=$ROOT/etc/fstab unit
    swapoff -a
    if [[ -f $fstab ]] && grep -Eq '^[[:space:]]*[^#[:space:]]+[[:space:]]+[^[:space:]]+[[:space:]]+swap[[:space:]]' "$fstab"; then
        sed -E -i.labs-k8s.bak \
            's/^([[:space:]]*[^#[:space:]]+[[:space:]]+[^[:space:]]+[[:space:]]+swap[[:space:]].*)$/# labs-k8s: swap off for the kubelet: \1/' \
            "$fstab"
        log "commented out the swap lines of /etc/fstab (backup: /etc/fstab.labs-k8s.bak)"
    fi
    # Swap units from the fstab generator, GPT auto-discovery or an installer: mask them all.
    while read -r unit _; do
        [[ $unit == *.swap ]] || continue
        if [[ $(systemctl is-enabled "$unit" 2>/dev/null || true) != masked ]]; then
            systemctl mask "$unit"
        fi
    done < <(systemctl list-units --type=swap --all --plain --no-legend --no-pager 2>/dev/null || true)
    if [[ $(systemctl is-enabled swap.target 2>/dev/null || true) != masked ]]; then
        systemctl mask swap.target
    fi
    [[ -z $(swapon --show --noheadings 2>/dev/null || true) ]] || die "swap is still active after swapoff -a"
}

# ------------------------------------------------------------------ firewall: kube-proxy owns iptables
remove_ufw() {
    if pkg_installed ufw; then
        log "purging ufw: it rewrites the iptables chains kube-proxy and flannel manage"
        ufw --force disable || log "ufw disable failed; purging it anyway"
        apt-get purge -y -q ufw
    fi
}

# ------------------------------------------------------------------ time: etcd and TLS need it
# Which servers is the node-settings step's (and cloud-init's at first boot): a new
# network.ntpServers re-runs that step alone, not this one and the kubeadm steps after it.
configure_time() {
    if ! pkg_installed systemd-timesyncd; then
        apt_update
        "${APT_INSTALL[@]}" systemd-timesyncd
    fi
    timedatectl set-ntp true
}

# ------------------------------------------------------------------ the data disk
# The VM's second disk (etcd on control planes, containerd on workers): the one disk with
# the configured size that has no partitions, no holders and no mount. Formatted ext4 only
# when it carries no filesystem and no partition table; mounted by UUID.
find_data_disk() {
    local want=$1 name type size removable found=()
    while read -r name type size removable; do
        [[ $type == disk && $removable == 0 && $size == "$want" ]] || continue
        [[ $(lsblk -nro NAME "$name" | wc -l) -eq 1 ]] || continue           # partitions or holders
        [[ -z $(lsblk -nro MOUNTPOINT "$name" | tr -d '[:space:]') ]] || continue # mounted elsewhere
        found+=("$name")
    done < <(lsblk -dbnpo NAME,TYPE,SIZE,RM)
    if ((${#found[@]} != 1)); then
        log "disks seen: $(lsblk -dbnpo NAME,TYPE,SIZE,RM | tr '\n' ';')"
        die "expected exactly one unused ${DATA_DISK_GIB} GiB disk for $DATA_DISK_MOUNT, found ${#found[@]} (${found[*]:-none}); check the VM's second disk (labs-k8s:nodes.*.dataDiskGib)"
    fi
    printf '%s\n' "${found[0]}"
}

ensure_fstab_entry() {
    local uuid=$1 fstype=$2 fstab=$ROOT/etc/fstab line
    # nofail: a missing disk must not drop the VM into emergency mode (no SSH); the unit
    # drop-in below keeps the service that uses the disk from starting without it.
    line="UUID=$uuid $DATA_DISK_MOUNT $fstype defaults,noatime,nofail 0 2"
    if [[ -f $fstab ]] && grep -qxF "$line" "$fstab"; then
        return 0
    fi
    local others=""
    if [[ -f $fstab ]]; then
        # Keep every other line, drop a stale entry for the same mount point.
        others=$(awk -v target="$DATA_DISK_MOUNT" '$1 ~ /^#/ || $2 != target' "$fstab")
    fi
    printf '%s\n%s\n' "$others" "$line" | sed '/./,$!d' >"$fstab.labs-k8s.new"
    write_file "$fstab" 0644 <"$fstab.labs-k8s.new"
    rm -f "$fstab.labs-k8s.new"
    systemctl daemon-reload
}

prepare_data_disk() {
    if ((DATA_DISK_GIB == 0)) || [[ -z $DATA_DISK_MOUNT ]]; then
        log "no data disk configured for this role"
        return 0
    fi
    local dir=$ROOT$DATA_DISK_MOUNT dev fstype uuid
    if mountpoint -q "$dir"; then
        uuid=$(findmnt -rno UUID --mountpoint "$dir")
        fstype=$(findmnt -rno FSTYPE --mountpoint "$dir")
        [[ -n $uuid ]] || die "$DATA_DISK_MOUNT is mounted but its filesystem has no UUID"
        ensure_fstab_entry "$uuid" "$fstype"
    else
        dev=$(find_data_disk $((DATA_DISK_GIB * 1024 * 1024 * 1024)))
        fstype=$(blkid -p -o value -s TYPE "$dev" || true)
        if [[ -z $fstype ]]; then
            if [[ -n $(blkid -p -o value -s PTTYPE "$dev" || true) ]]; then
                die "$dev has a partition table but no filesystem; not formatting it. If it is the data disk, wipe it (wipefs -a $dev) and re-run"
            fi
            log "formatting $dev as ext4 for $DATA_DISK_MOUNT"
            mkfs.ext4 -q -L "$DATA_DISK_LABEL" "$dev"
            udevadm settle
            fstype=ext4
        elif [[ $fstype != ext4 && $fstype != xfs ]]; then
            die "$dev already holds a $fstype filesystem; expected ext4 (or none); not touching it"
        fi
        uuid=$(blkid -o value -s UUID "$dev")
        [[ -n $uuid ]] || die "no filesystem UUID on $dev"
        ensure_fstab_entry "$uuid" "$fstype"
        mkdir -p "$dir"
        if [[ -n $(ls -A "$dir") ]]; then
            die "$DATA_DISK_MOUNT is not empty and not yet a mount: move its contents away before the data disk is mounted over it"
        fi
        mount "$dir"
        mountpoint -q "$dir" || die "mounting $dev on $DATA_DISK_MOUNT failed"
        log "mounted $dev (UUID=$uuid) on $DATA_DISK_MOUNT"
    fi
    if [[ $DATA_DISK_MOUNT == /var/lib/etcd ]]; then
        chmod 0700 "$dir"
        # A new ext4 has an empty lost+found, and kubeadm's preflight DirAvailable--var-lib-etcd
        # refuses a /var/lib/etcd that holds anything: it goes, as on cloud-init's path
        # (data-disk-ready.sh; e2fsck recreates it when it needs one). A non-empty one stays.
        rmdir "$dir/lost+found" 2>/dev/null || true
    fi
    write_file "$ROOT/etc/systemd/system/$DATA_DISK_UNIT.service.d/10-labs-k8s-data-disk.conf" 0644 <<EOF
# labs-k8s: $DATA_DISK_UNIT only starts with its data disk mounted, never on the root disk
[Unit]
RequiresMountsFor=$DATA_DISK_MOUNT
EOF
    if ((WROTE)); then systemctl daemon-reload; fi
}

# ------------------------------------------------------------------ packages and repositories
install_base_packages() {
    local pkg missing=()
    # iputils-arping: kubeadm-init.sh checks that exactly one balancer answers ARP for the VIP.
    for pkg in ca-certificates curl gnupg ethtool jq conntrack socat iptables iputils-arping; do
        pkg_installed "$pkg" || missing+=("$pkg")
    done
    if ((${#missing[@]} > 0)); then
        apt_update
        "${APT_INSTALL[@]}" "${missing[@]}"
    fi
}

# primary_fingerprints FILE: the fingerprint of every primary key in the OpenPGP key file FILE,
# one a line (a subkey's `fpr` record follows a `sub` record, not a `pub` one).
primary_fingerprints() {
    local gnupg_home
    gnupg_home=$(mktemp -d)
    GNUPGHOME=$gnupg_home gpg --batch --show-keys --with-colons "$1" 2>/dev/null |
        awk -F: '$1 == "pub" {want = 1; next} $1 == "fpr" && want {print $10} {want = 0}'
    rm -rf "$gnupg_home"
}

# install_verified_key URL FINGERPRINT DEST: download a repository signing key and install as
# DEST the key with FINGERPRINT alone (a compromised mirror or proxy cannot swap it).
# The file is imported into a throwaway keyring and only the primary key with FINGERPRINT (its
# user ids and subkeys) is exported to DEST: apt trusts every key in a signed-by keyring, so a
# served file holding the pinned key and another one would otherwise let apt accept a repository
# signed by the other (labs-k8s issue #30 §2). A file without that primary key is refused.
# Every prepare run fetches it again: upstream extends its keys' expiry and adds subkeys under the
# same fingerprint, and a keyring kept from the first run would make a later `apt-get update`
# (an upgrade months on) fail on an expired key. A download that fails keeps the installed key
# (the node may be offline meanwhile); a key with another fingerprint is refused every time.
# Sets WROTE when DEST changed.
install_verified_key() {
    local url=$1 fingerprint=$2 dest=$3 tmp pinned gnupg_home
    local proxy=()
    [[ -z $APT_PROXY ]] || proxy=(--proxy "$APT_PROXY")
    WROTE=0
    tmp=$(mktemp)
    if ! curl -fsSL --retry 3 --connect-timeout 10 --max-time 60 "${proxy[@]}" -o "$tmp" "$url"; then
        rm -f "$tmp"
        [[ -s $dest ]] || die "could not download $url"
        log "WARNING: could not download $url to check it again; keeping the installed ${dest#"$ROOT"}"
        return 0
    fi
    if ! primary_fingerprints "$tmp" | grep -qx "$fingerprint"; then
        rm -f "$tmp"
        die "the key served by $url does not have the fingerprint $fingerprint"
    fi
    pinned=$(mktemp)
    gnupg_home=$(mktemp -d)
    if ! GNUPGHOME=$gnupg_home gpg --batch --quiet --import "$tmp" 2>/dev/null ||
        ! GNUPGHOME=$gnupg_home gpg --batch --armor --export "$fingerprint" >"$pinned" 2>/dev/null ||
        [[ $(primary_fingerprints "$pinned") != "$fingerprint" ]]; then
        rm -rf "$gnupg_home" "$tmp" "$pinned"
        die "could not keep only the key $fingerprint of the file served by $url"
    fi
    rm -rf "$gnupg_home" "$tmp"
    if [[ -s $dest ]] && cmp -s "$pinned" "$dest"; then
        rm -f "$pinned"
        return 0
    fi
    install -m 0644 "$pinned" "$dest"
    rm -f "$pinned"
    log "installed ${dest#"$ROOT"} (fingerprint $fingerprint alone, from $url)"
    WROTE=1
}

configure_repositories() {
    local keyrings=$ROOT/etc/apt/keyrings codename arch
    # shellcheck source=/dev/null
    codename=$(. "$ROOT/etc/os-release" && printf '%s' "${VERSION_CODENAME:-}")
    [[ -n $codename ]] || die "cannot read VERSION_CODENAME from /etc/os-release"
    arch=$(dpkg --print-architecture)
    install -d -m 0755 "$keyrings"

    # containerd 2.x: Kubernetes 1.36 dropped containerd 1.x and Debian 12 ships 1.6, so the
    # runtime comes from Docker's apt repository (containerd.io bundles runc; signed, patched),
    # or a mirror of it (labs-k8s:mirrors.containerdRepository).
    install_verified_key "$CONTAINERD_REPOSITORY_URL/gpg" "$CONTAINERD_KEY_FINGERPRINT" "$keyrings/docker.asc"
    if ((WROTE)); then APT_FRESH=0; fi
    write_file "$ROOT/etc/apt/sources.list.d/docker.list" 0644 <<EOF
# labs-k8s: containerd.io 2.x (Debian 12's containerd is 1.6; Kubernetes 1.36 needs 2.x)
deb [arch=$arch signed-by=/etc/apt/keyrings/docker.asc] $CONTAINERD_REPOSITORY_URL $codename stable
EOF
    if ((WROTE)); then APT_FRESH=0; fi

    install_verified_key "$KUBERNETES_REPOSITORY_URL/v$K8S_MINOR_VERSION/deb/Release.key" \
        "$KUBERNETES_KEY_FINGERPRINT" "$keyrings/kubernetes-apt-keyring.asc"
    if ((WROTE)); then APT_FRESH=0; fi
    if ((LEAVE_KUBERNETES)) && [[ -s $KUBERNETES_LIST ]]; then
        log "leaving ${KUBERNETES_LIST#"$ROOT"} as it is: the upgrade steps switch it"
    else
        use_kubernetes_repository "$K8S_MINOR_VERSION"
    fi
}

containerd_version() {
    if command -v containerd >/dev/null 2>&1; then
        # "containerd containerd.io 2.1.5 <commit>" or "containerd github.com/containerd/containerd/v2 v2.1.4 <commit>"
        { containerd --version 2>/dev/null || true; } | awk 'NR == 1 {sub(/^v/, "", $3); print $3}'
    fi
}

# containerd.io at exactly labs-k8s:kubernetes.containerdVersion, held: the runtime under every
# pod changes only when the config says so, never as a side effect of an apt upgrade.
CONTAINERD_INSTALLED=0
install_containerd() {
    local current candidate installed
    current=$(pkg_version containerd.io)
    if ((LEAVE_CONTAINERD)); then
        hold_packages containerd.io
        return 0
    fi
    if [[ $current != "$CONTAINERD_VERSION"-* ]]; then
        apt_update
        candidate=$(apt-cache madison containerd.io | awk -v prefix="$CONTAINERD_VERSION-" 'index($3, prefix) == 1 {print $3; exit}')
        [[ -n $candidate ]] ||
            die "the containerd repository $CONTAINERD_REPOSITORY_URL (labs-k8s:mirrors.containerdRepository.url) has no containerd.io $CONTAINERD_VERSION for this release/architecture (labs-k8s:kubernetes.containerdVersion; apt-cache madison containerd.io lists: $(apt-cache madison containerd.io | awk '{print $3}' | head -n 5 | tr '\n' ' '))"
        log "installing containerd.io $candidate (found: ${current:-none}; labs-k8s:kubernetes.containerdVersion is $CONTAINERD_VERSION)"
        "${APT_INSTALL[@]}" --allow-change-held-packages "containerd.io=$candidate"
        CONTAINERD_INSTALLED=1
    fi
    installed=$(containerd_version)
    if [[ -z $installed ]] || version_lt "$installed" "$CONTAINERD_MIN_VERSION"; then
        die "containerd is ${installed:-missing} after installing containerd.io $CONTAINERD_VERSION; Kubernetes $K8S_VERSION needs >= $CONTAINERD_MIN_VERSION"
    fi
    hold_packages containerd.io
}

install_kubernetes_packages() {
    local pkg current need=0 resolved=() plugin
    if ((LEAVE_KUBERNETES)); then
        hold_packages kubeadm kubelet kubectl
        return 0
    fi
    for pkg in kubeadm kubelet kubectl; do
        current=$(pkg_version "$pkg")
        [[ $current == "$K8S_VERSION"-* ]] || need=1
    done
    if ((need)); then
        apt_update
        for pkg in kubeadm kubelet kubectl; do
            current=$(apt-cache madison "$pkg" | awk -v prefix="$K8S_VERSION-" 'index($3, prefix) == 1 {print $3; exit}')
            [[ -n $current ]] || die "the Kubernetes repository $KUBERNETES_REPOSITORY_URL/v$K8S_MINOR_VERSION/deb/ (labs-k8s:mirrors.kubernetesRepository.url) has no $pkg $K8S_VERSION (labs-k8s:kubernetes.version; apt-cache madison $pkg lists: $(apt-cache madison "$pkg" | awk '{print $3}' | head -n 5 | tr '\n' ' '))"
            resolved+=("$pkg=$current")
        done
        log "installing ${resolved[*]}"
        "${APT_INSTALL[@]}" --allow-change-held-packages "${resolved[@]}" kubernetes-cni cri-tools
    fi
    hold_packages kubeadm kubelet kubectl
    for plugin in bridge host-local loopback portmap; do
        [[ -x $ROOT/opt/cni/bin/$plugin ]] || die "CNI plugin /opt/cni/bin/$plugin is missing (package kubernetes-cni)"
    done
}

# ------------------------------------------------------------------ containerd configuration
# toml_has TEXT SECTION LINE: does SECTION of a `containerd config dump` hold LINE?
# Quotes are normalised, so 1.x ("...") and 2.x ('...') dumps compare alike.
toml_has() {
    awk -v section="[$2]" -v want="$3" '
        function norm(s) { gsub(/"/, "\047", s); gsub(/^[ \t]+|[ \t]+$/, "", s); return s }
        /^[ \t]*\[/ { current = norm($0); next }
        current == norm(section) && norm($0) == norm(want) { found = 1 }
        END { exit !found }' <<<"$1"
}

configure_containerd() {
    local version major pause config=$ROOT/etc/containerd/config.toml changed=0
    local runc_section sandbox_section sandbox_line dump
    version=$(containerd_version)
    major=${version%%.*}
    pause=$(kubeadm config images list --kubernetes-version "v$K8S_VERSION" 2>/dev/null | grep '/pause:' | head -n 1 || true)
    [[ -n $pause ]] || die "kubeadm $K8S_VERSION did not name its pause image (kubeadm config images list)"

    if ((major >= 2)); then
        runc_section="plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options"
        sandbox_section="plugins.'io.containerd.cri.v1.images'.pinned_images"
        sandbox_line="sandbox = '$pause'"
        write_file "$config" 0644 <<EOF
# labs-k8s: containerd $major.x (config version 3); written by prepare-node.sh, verified with 'containerd config dump'
version = 3

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = '$pause'

[plugins.'io.containerd.cri.v1.images'.registry]
  config_path = '/etc/containerd/certs.d'

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = 'io.containerd.runc.v2'

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  SystemdCgroup = true
EOF
    else
        runc_section='plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options'
        sandbox_section='plugins."io.containerd.grpc.v1.cri"'
        sandbox_line="sandbox_image = \"$pause\""
        write_file "$config" 0644 <<EOF
# labs-k8s: containerd $major.x (config version 2); written by prepare-node.sh, verified with 'containerd config dump'
version = 2

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause"

[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = "/etc/containerd/certs.d"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = true
EOF
    fi
    if ((WROTE)); then changed=1; fi

    # Registry mirror for every registry (_default), tried before the registry itself; its CA
    # (labs-k8s:mirrors.registryMirrorCa) trusted for that host, as apt's mirrors pin their keys.
    local hosts=$ROOT/etc/containerd/certs.d/_default/hosts.toml ca_line=""
    local ca_path=/etc/containerd/certs.d/_default/registry-mirror-ca.crt
    if [[ -n $REGISTRY_MIRROR && -n $REGISTRY_MIRROR_CA_FILE ]]; then
        # Text before the PEM block is fine (Go's pem.Decode skips it); the marker lets remove_managed work.
        write_file "$ROOT$ca_path" 0644 < <(
            echo "# labs-k8s: the registry mirror's CA (labs-k8s:mirrors.registryMirrorCa)"
            cat "$HERE/$REGISTRY_MIRROR_CA_FILE"
        )
        if ((WROTE)); then changed=1; fi
        ca_line="  ca = \"$ca_path\""
    else
        remove_managed "$ROOT$ca_path"
        if ((WROTE)); then changed=1; fi
    fi
    if [[ -n $REGISTRY_MIRROR ]]; then
        write_file "$hosts" 0644 < <(
            cat <<EOF
# labs-k8s: pull through the lab's registry mirror (labs-k8s:mirrors.registryMirror), then the registry itself
[host."$REGISTRY_MIRROR"]
  capabilities = ["pull", "resolve"]
EOF
            if [[ -n $ca_line ]]; then echo "$ca_line"; fi
        )
    else
        remove_managed "$hosts"
    fi
    if ((WROTE)); then changed=1; fi

    if [[ $(systemctl is-enabled containerd 2>/dev/null || true) != enabled ]]; then
        systemctl enable containerd
    fi
    # A new containerd binary runs only once restarted (the package's own restart is not relied on).
    if ((changed || CONTAINERD_INSTALLED)); then
        systemctl restart containerd
    elif ! systemctl is-active --quiet containerd; then
        systemctl start containerd
    fi

    dump=$(containerd config dump) || die "containerd config dump failed: ${config#"$ROOT"} is not valid for containerd $version"
    toml_has "$dump" "$runc_section" "SystemdCgroup = true" ||
        die "containerd $version does not apply SystemdCgroup = true under [$runc_section]; check ${config#"$ROOT"}"
    toml_has "$dump" "$sandbox_section" "$sandbox_line" ||
        die "containerd $version does not use the sandbox image $pause (kubeadm's) under [$sandbox_section]"
    if grep -Eq "^[[:space:]]*disabled_plugins[[:space:]]*=.*cri" <<<"$dump"; then
        die "containerd still has its CRI plugin disabled; ${config#"$ROOT"} was not applied"
    fi
    log "containerd $version: SystemdCgroup = true, sandbox $pause"

    write_file "$ROOT/etc/crictl.yaml" 0644 <<EOF
# labs-k8s: crictl talks to containerd
runtime-endpoint: $CONTAINERD_SOCKET
image-endpoint: $CONTAINERD_SOCKET
timeout: 10
EOF
}

# ------------------------------------------------------------------ flannel VXLAN over VMXNET3
# flannel-io/flannel#1279: with TX checksum offload on flannel.1, VXLAN packets between VMs on
# VMXNET3 get bad checksums and are dropped. Turn it off whenever flannel (re)creates the device.
configure_flannel_offload() {
    write_file "$ROOT/etc/udev/rules.d/90-labs-k8s-flannel-checksum.rules" 0644 <<'EOF'
# labs-k8s: flannel-io/flannel#1279, VXLAN over VMXNET3 drops packets with TX checksum offload on
ACTION=="add", SUBSYSTEM=="net", KERNEL=="flannel.1", RUN+="/usr/sbin/ethtool -K %k tx-checksum-ip-generic off"
EOF
    # Without a running udevd (a container) there is nothing to reload: it reads the rule when it starts.
    if ((WROTE)) && udevadm control --ping >/dev/null 2>&1; then
        udevadm control --reload
    fi
    if ip link show flannel.1 >/dev/null 2>&1; then
        ethtool -K flannel.1 tx-checksum-ip-generic off
    fi
}

# A node already in the cluster at another version than labs-k8s:kubernetes.version is moved to it by
# the upgrade steps, in order and drained (upgrade-*.sh), never here under its workloads: until then
# its Kubernetes repository and packages stay as they are (even half-way through its own upgrade,
# kubeadm already new) and the rest is prepared for the version its kubelet runs (the pause image).
# The upgrade steps run this script again once its packages are new.
LEAVE_KUBERNETES=0
running=$(pkg_version kubelet)
[[ -n $running ]] || running=$(pkg_version kubeadm)
if [[ -f $KUBELET_CONF && -n $running && $running != "$K8S_VERSION"-* ]]; then
    log "$NODE_NAME runs kubelet ${running%%-*} in the cluster; labs-k8s:kubernetes.version $K8S_VERSION comes with the upgrade steps: preparing it for ${running%%-*} meanwhile"
    LEAVE_KUBERNETES=1
    K8S_VERSION=${running%%-*}
    K8S_MINOR_VERSION=${K8S_VERSION%.*}
fi

# containerd likewise: on a node in the cluster, a new labs-k8s:kubernetes.containerdVersion is
# installed by its upgrade step, drained, one node at a time (upgrade-lib.sh reprepare_node sets
# LABS_K8S_ROLL_CONTAINERD), never here on every node at once under their pods.
LEAVE_CONTAINERD=0
running=$(pkg_version containerd.io)
if [[ -f $KUBELET_CONF && -n $running && $running != "$CONTAINERD_VERSION"-* && -z ${LABS_K8S_ROLL_CONTAINERD:-} ]]; then
    log "$NODE_NAME runs containerd.io ${running%%-*} in the cluster; labs-k8s:kubernetes.containerdVersion $CONTAINERD_VERSION comes with its upgrade step, drained: leaving containerd as it is meanwhile"
    LEAVE_CONTAINERD=1
fi

configure_apt_proxy
configure_kernel
disable_swap
remove_ufw
configure_time
prepare_data_disk
install_base_packages
configure_repositories
install_containerd
install_kubernetes_packages
configure_containerd
configure_flannel_offload
if [[ $(systemctl is-enabled kubelet 2>/dev/null || true) != enabled ]]; then
    systemctl enable kubelet
fi
log "node $NODE_NAME ($NODE_ROLE) is ready for kubeadm"
result "prepared $NODE_NAME"
