#!/usr/bin/env bash
# Build the real kubeadm, one per minor in tests/tools/kubeadm/manifest.json, from the Go module
# proxy (never a release download), and print the directory holding them on stdout: kubeadm-1.35,
# kubeadm-1.36, ... (progress goes to stderr). tests/kubeadm_real.py runs them.
#
# Idempotent: each minor's binary is cached under $REPO/.cache/kubeadm/<minor>/<key>/kubeadm, where
# the key is a digest of that minor's manifest entry, its wrapper module (go.mod, go.sum, tools.go)
# and the Go version; a warm run rebuilds nothing, and a new pin of one minor rebuilds that one
# only. The Go build cache (go env GOCACHE) is the machine's, as for any Go build. nice: the build
# shares the machine with whatever else runs (cold: 11 to 16 minutes a minor on 2 busy cores).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TOOLS="$REPO/tests/tools"
MANIFEST="$TOOLS/kubeadm/manifest.json"
CACHE="$REPO/.cache/kubeadm"
BIN="$CACHE/bin"
# shellcheck source=go_env.sh source-path=SCRIPTDIR
source "$TOOLS/go_env.sh"

log() { printf 'build_kubeadm: %s\n' "$*" >&2; }

command -v jq >/dev/null || { log "jq is needed (scripts/install-test-deps.sh installs it)"; exit 1; }
go=$(go_binary)
package=$(jq -r .package "$MANIFEST")

# build MINOR: the cached kubeadm of that minor, built first when missing.
build() {
    local minor=$1 entry version wrapper key out pinned stamp start_s major minor_number reported
    entry=$(jq -c --arg minor "$minor" '.kubeadm[] | select(.minor == $minor)' "$MANIFEST")
    version=$(jq -r .version <<<"$entry")
    wrapper="$REPO/$(jq -r .wrapper <<<"$entry")"
    key=$({ printf '%s\n' "$entry"; cat "$wrapper/go.mod" "$wrapper/go.sum" "$wrapper/tools.go"; } |
        go_inputs_digest "$go" /dev/stdin)
    out="$CACHE/$minor/$key"
    if [[ -x $out/kubeadm && -f $out/.complete ]]; then
        log "kubeadm $version (cached, $out)"
        ln -sfn "../$minor/$key/kubeadm" "$BIN/kubeadm-$minor"
        return 0
    fi
    pinned=$(cd "$wrapper" && "$go" list -m -f '{{.Version}}' k8s.io/kubernetes)
    [[ $pinned == "$version" ]] || { log "$wrapper pins k8s.io/kubernetes $pinned, the manifest says $version"; return 1; }
    [[ $version =~ ^v([0-9]+)\.([0-9]+)\.[0-9]+$ ]] || { log "$version is not vMAJOR.MINOR.PATCH"; return 1; }
    major=${BASH_REMATCH[1]} minor_number=${BASH_REMATCH[2]}
    # hack/lib/version.sh's buildDate; the release's own time keeps the build reproducible.
    stamp=$(cd "$wrapper" && "$go" list -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' k8s.io/kubernetes)
    local -a ldflags=(-s -w)
    local name value
    for name in gitVersion gitMajor gitMinor buildDate; do
        case $name in
            gitVersion) value=$version ;;
            gitMajor) value=$major ;;
            gitMinor) value=$minor_number ;;
            buildDate) value=$stamp ;;
        esac
        ldflags+=("-X=k8s.io/client-go/pkg/version.$name=$value" "-X=k8s.io/component-base/version.$name=$value")
    done
    rm -rf "$out"
    mkdir -p "$out"
    start_s=$SECONDS
    log "building kubeadm $version with $("$go" env GOVERSION) (cold: 11 to 16 minutes on 2 busy cores)"
    (cd "$wrapper" && CGO_ENABLED=0 GOFLAGS=-mod=readonly nice -n 10 "$go" build -trimpath \
        -tags selinux,notest,grpcnotrace -ldflags "${ldflags[*]}" -o "$out/kubeadm" "$package")
    reported=$("$out/kubeadm" version -o short)
    [[ $reported == "$version" ]] || { log "the built kubeadm reports version '$reported', not $version"; return 1; }
    touch "$out/.complete"
    # Builds of other keys (older pins of this minor) are never used again: about 90 MB each.
    find "$CACHE/$minor" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf {} +
    ln -sfn "../$minor/$key/kubeadm" "$BIN/kubeadm-$minor"
    log "built kubeadm $version in $((SECONDS - start_s))s"
}

mkdir -p "$BIN"
mapfile -t minors < <(jq -r '.kubeadm[].minor' "$MANIFEST")
for minor in "${minors[@]}"; do
    build "$minor"
done
# A minor no longer in the manifest: its link and builds go (relative links: the cache may be
# restored under another checkout path).
for link in "$BIN"/kubeadm-*; do
    [[ -e $link || -L $link ]] || continue
    minor=${link##*/kubeadm-}
    if ! printf '%s\n' "${minors[@]}" | grep -qxF "$minor"; then
        rm -rf "$link" "${CACHE:?}/$minor"
    fi
done
printf '%s\n' "$BIN"
