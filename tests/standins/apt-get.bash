# shellcheck shell=bash disable=SC2154 # STATE, ROOT come from the prelude
# Stand-in for apt-get against the Kubernetes package repositories, one per minor (<base>/v1.XX/deb/:
# pkgs.k8s.io's core:/stable:, or a mirror's, see "Changing The Kubernetes Package Repository" on
# kubernetes.io): `apt-get update` indexes the source in kubernetes.list, whatever its base, and
# `apt-cache madison` lists what the last update indexed, so a switched source means nothing until the
# next update. Install is all or nothing: a version the index lacks ("Version
# 'x' for 'y' was not found") or a held package it would change without --allow-change-held-packages
# ("Held packages were changed and -y was used without --allow-change-held-packages") stops it before
# anything is installed. Other packages come from $STATE/repo, or any version when none is listed.
# Test knobs: $STATE/apt-update-fails, $STATE/apt-install-fails (a repository that does not answer),
# $STATE/dpkg-interrupted (dpkg cut off mid-run: install refuses until `dpkg --configure -a`).
mkdir -p "$STATE/dpkg"
verb=""; pkgs=(); allow_held=0
for a in "$@"; do
    case $a in
        --allow-change-held-packages) allow_held=1 ;;
        -*) ;;
        *) if [[ -z $verb ]]; then verb=$a; else pkgs+=("$a"); fi ;;
    esac
done
k8s_package() { [[ $1 == kubeadm || $1 == kubelet || $1 == kubectl || $1 == kubernetes-cni || $1 == cri-tools ]]; }
available() {
    if k8s_package "$1"; then cat "$STATE/repos/$(cat "$STATE/apt-index" 2>/dev/null)/$1" 2>/dev/null
    else cat "$STATE/repo/$1" 2>/dev/null; fi
}
case $verb in
    update)
        [[ -f $STATE/apt-update-fails ]] && { echo "E: Failed to fetch https://pkgs.k8s.io/core:/stable: Connection timed out" >&2; exit 100; }
        src=$(sed -n 's#^deb \[[^]]*\] \([^ ]*\)/\(v[0-9.]*\)/deb/ /$#\1 \2#p' \
            "$ROOT/etc/apt/sources.list.d/kubernetes.list" 2>/dev/null || true)
        printf '%s\n' "${src#* }" >"$STATE/apt-index"
        printf '%s\n' "${src%% *}" >"$STATE/apt-base" ;;
    install)
        # An earlier run cut off mid-dpkg (apt-pkg's pkgDPkgPM journal check, the lab in a box's find).
        [[ -f $STATE/dpkg-interrupted ]] && { echo "E: dpkg was interrupted, you must manually run 'dpkg --configure -a' to correct the problem." >&2; exit 100; }
        resolved=()
        for p in "${pkgs[@]}"; do
            name=${p%%=*}; version=${p#*=}
            [[ $name == "$p" ]] && version=$(available "$name" | head -n 1)
            if k8s_package "$name" || [[ -f $STATE/repo/$name ]]; then
                if ! available "$name" | grep -qxF "$version"; then
                    echo "E: Version '$version' for '$name' was not found" >&2; exit 100
                fi
            fi
            version=${version:-1.0}
            current=$(cat "$STATE/dpkg/$name" 2>/dev/null || true)
            if [[ -n $current && $current != "$version" && $allow_held == 0 ]] && grep -qxF "$name" "$STATE/held" 2>/dev/null; then
                echo "E: Held packages were changed and -y was used without --allow-change-held-packages." >&2; exit 100
            fi
            resolved+=("$name=$version")
        done
        [[ -f $STATE/apt-install-fails ]] && { echo "E: Failed to fetch https://pkgs.k8s.io/core:/stable: Connection timed out" >&2; exit 100; }
        for p in "${resolved[@]}"; do
            name=${p%%=*}; version=${p#*=}
            printf '%s' "$version" >"$STATE/dpkg/$name"
            case $name in
                containerd.io) printf '%s' "${version%%-*}" >"$STATE/containerd-version" ;;
                kubernetes-cni) mkdir -p "$ROOT/opt/cni/bin"
                    for b in bridge host-local loopback portmap; do install -m 0755 /dev/null "$ROOT/opt/cni/bin/$b"; done ;;
            esac
        done ;;
    purge|remove) for p in "${pkgs[@]}"; do rm -f "$STATE/dpkg/$p"; done ;;
esac
