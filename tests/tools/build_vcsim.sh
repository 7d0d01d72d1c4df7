#!/usr/bin/env bash
# Build govmomi's vCenter simulator (vcsim) from Debian bookworm packages only
# and print the path of the binary on stdout (progress goes to stderr).
#
# Why from Debian packages: the machines of this project reach the Debian
# archive and PyPI only; there is no Go module proxy for third-party code and
# no prebuilt vcsim download. Bookworm ships the govmomi 0.24.2 library sources
# (golang-github-vmware-govmomi-dev) but not vcsim/main.go, which lives in the
# source package's orig tarball, so we fetch that with `apt-get source`.
#
# Two local changes are made before compiling:
# - patch_drs_enabled: vcsim 0.24's ReconfigureComputeResource_Task ignores
#   drsConfig.enabled, so a test could never turn DRS off; later govmomi
#   releases apply it, we backport that behaviour with our own few lines.
# - patch_rotatable_password: vcsim takes its password once, from -password.
#   With LABS_K8S_VCSIM_PASSWORD_FILE set, every login checks against that
#   file's current content instead, so a test can rotate the vCenter password
#   while the inventory lives on (a restart would lose it). Test-only; vcsim
#   behaves as upstream when the variable is unset.
#
# Idempotent: the binary is cached at $REPO/.cache/vcsim/vcsim (.cache is
# gitignored) with a stamp of the build recipe beside it; when both are present
# and the binary runs, nothing is rebuilt.
# Env: VCSIM_REBUILD=1 forces a rebuild.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE_DIR="$REPO/.cache/vcsim"
BIN="$CACHE_DIR/vcsim"
STAMP="$CACHE_DIR/vcsim.recipe"
# Bump when the build recipe (packages, local change) changes so caches are rebuilt.
RECIPE="govmomi-0.24.2 debian-bookworm drs-enabled-patch rotatable-password-patch v2"
SRC_PKG="golang-github-vmware-govmomi"
APT_PKGS=(golang-go golang-github-vmware-govmomi-dev dpkg-dev)
DEB_SRC_FILE="/etc/apt/sources.list.d/labs-k8s-deb-src.sources"
DEB_SOURCES="/etc/apt/sources.list.d/debian.sources"

log() { printf 'build_vcsim: %s\n' "$*" >&2; }

# A cached binary that still starts is good enough: vcsim prints its usage on
# -h and exits 0 (2 with older Go), so only a broken binary fails here.
if [[ -x "$BIN" && "${VCSIM_REBUILD:-0}" != "1" ]] &&
    [[ "$(cat "$STAMP" 2>/dev/null || true)" == "$RECIPE" ]]; then
    if "$BIN" -h >/dev/null 2>&1 || [[ $? -eq 2 ]]; then
        printf '%s\n' "$BIN"
        exit 0
    fi
    log "cached $BIN does not run; rebuilding"
fi

# Backport: make ReconfigureComputeResource_Task honour drsConfig.enabled.
# Written as a new file in the simulator package plus one line in the list of
# config updaters, and checked, so a changed upstream layout fails loudly.
patch_drs_enabled() {
    local sim="$1/simulator"
    cat >"$sim/labs_k8s_drs_enabled.go" <<'GO'
package simulator

import "github.com/vmware/govmomi/vim25/types"

// updateDrsEnabled applies spec.drsConfig.enabled, which vcsim 0.24 dropped.
// Added by labs-k8s tests/tools/build_vcsim.sh (not part of govmomi 0.24.2).
func (c *ClusterComputeResource) updateDrsEnabled(cfg *types.ClusterConfigInfoEx, cspec *types.ClusterConfigSpecEx) types.BaseMethodFault {
	if cspec.DrsConfig != nil && cspec.DrsConfig.Enabled != nil {
		cfg.DrsConfig.Enabled = cspec.DrsConfig.Enabled
	}
	return nil
}
GO
    sed -i 's/^\([[:space:]]*\)c\.updateOverridesDRS,$/&\n\1c.updateDrsEnabled,/' \
        "$sim/cluster_compute_resource.go"
    if ! grep -q 'c\.updateDrsEnabled,' "$sim/cluster_compute_resource.go"; then
        log "could not hook updateDrsEnabled into cluster_compute_resource.go"
        exit 1
    fi
}

# Test hook: the login password can change while vcsim runs (see the header).
patch_rotatable_password() {
    local sim="$1/simulator"
    cat >"$sim/labs_k8s_password.go" <<'GO'
package simulator

import (
	"os"
	"strings"
)

// labsK8sPassword is the password a login must match: the current content of the
// file named by LABS_K8S_VCSIM_PASSWORD_FILE (re-read on every login) when that is
// set, else pass (the -password flag). Sessions already logged in stay valid, as on
// a real vCenter after a password change.
// Added by labs-k8s tests/tools/build_vcsim.sh (not part of govmomi 0.24.2).
func labsK8sPassword(pass string) string {
	name := os.Getenv("LABS_K8S_VCSIM_PASSWORD_FILE")
	if name == "" {
		return pass
	}
	data, err := os.ReadFile(name)
	if err != nil {
		return "\x00unreadable password file"
	}
	return strings.TrimRight(string(data), "\n")
}
GO
    sed -i 's/^\([[:space:]]*\)pass, _ := user\.Password()$/&\n\1pass = labsK8sPassword(pass)/' \
        "$sim/session_manager.go"
    if ! grep -q 'pass = labsK8sPassword(pass)' "$sim/session_manager.go"; then
        log "could not hook labsK8sPassword into session_manager.go"
        exit 1
    fi
}

start_s=$SECONDS

need_install=()
for pkg in "${APT_PKGS[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
        need_install+=("$pkg")
    fi
done

# deb-src entries are needed for `apt-get source`. We never edit the image's
# own debian.sources: we write a separate file that mirrors its `Types: deb`
# stanzas as `Types: deb-src` (same URIs, suites, components, keyring).
have_deb_src() {
    # Only files apt reads (*.list, *.sources); "*.disabled" leftovers do not count.
    grep -rqsE --include='*.list' --include='*.sources' '^(Types:.*deb-src|deb-src )' \
        /etc/apt/sources.list /etc/apt/sources.list.d/
}

if [[ $EUID -eq 0 ]]; then
    updated=0
    if ! have_deb_src; then
        if [[ ! -r "$DEB_SOURCES" ]]; then
            log "no deb-src entry and no $DEB_SOURCES to mirror; add a deb-src line for bookworm by hand"
            exit 1
        fi
        log "writing $DEB_SRC_FILE (deb-src mirror of $DEB_SOURCES)"
        # Keep only stanzas whose Types list contains "deb"; rewrite their Types.
        awk 'BEGIN { RS = ""; ORS = "\n\n"; FS = "\n" }
             {
                 out = ""; keep = 0
                 for (i = 1; i <= NF; i++) {
                     line = $i
                     if (line ~ /^Types:/ && (" " substr(line, 7) " ") ~ /[ \t]deb[ \t]/) {
                         line = "Types: deb-src"; keep = 1
                     }
                     out = out (i > 1 ? "\n" : "") line
                 }
                 if (keep) print out
             }' "$DEB_SOURCES" >"$DEB_SRC_FILE.tmp"
        if ! grep -q '^Types: deb-src' "$DEB_SRC_FILE.tmp"; then
            rm -f "$DEB_SRC_FILE.tmp"
            log "found no 'Types: deb' stanza in $DEB_SOURCES to mirror"
            exit 1
        fi
        mv "$DEB_SRC_FILE.tmp" "$DEB_SRC_FILE"
        apt-get update -qq >&2
        updated=1
    fi
    if [[ ${#need_install[@]} -gt 0 ]]; then
        [[ $updated -eq 1 ]] || apt-get update -qq >&2
        log "installing ${need_install[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "${need_install[@]}" >&2
    fi
else
    if [[ ${#need_install[@]} -gt 0 ]] || ! have_deb_src; then
        log "not root: install ${APT_PKGS[*]} and add a deb-src entry, or run this as root"
        exit 1
    fi
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
# apt-get source downloads as the unprivileged _apt user (when root), which
# must be able to write where it downloads, or apt warns and falls back.
chmod 755 "$WORK"
mkdir "$WORK/apt"
if [[ $EUID -eq 0 ]] && id _apt >/dev/null 2>&1; then
    chown _apt "$WORK/apt"
fi

log "fetching source package $SRC_PKG"
# apt-get source runs dpkg-source -x, which applies Debian's own patches.
if ! (cd "$WORK/apt" && apt-get source -qq "$SRC_PKG" >&2); then
    # A deb-src entry someone added without `apt-get update` has no index yet.
    [[ $EUID -eq 0 ]] || exit 1
    log "apt-get source failed; refreshing the package lists and retrying once"
    apt-get update -qq >&2
    (cd "$WORK/apt" && apt-get source -qq "$SRC_PKG" >&2)
fi
src_dir="$(find "$WORK/apt" -mindepth 1 -maxdepth 1 -type d -name "${SRC_PKG}-*" | head -n1)"
if [[ -z "$src_dir" || ! -f "$src_dir/vcsim/main.go" ]]; then
    log "vcsim/main.go not found in the unpacked $SRC_PKG source"
    exit 1
fi

# GOPATH mode: the temp GOPATH holds the unpacked govmomi tree at its import
# path (so vcsim builds against exactly the source it ships with, internal
# packages included); /usr/share/gocode supplies govmomi's dependencies from
# their Debian -dev packages. No module proxy, no network.
gopath="$WORK/gopath"
mkdir -p "$gopath/src/github.com/vmware"
mv "$src_dir" "$gopath/src/github.com/vmware/govmomi"
patch_drs_enabled "$gopath/src/github.com/vmware/govmomi"
patch_rotatable_password "$gopath/src/github.com/vmware/govmomi"
mkdir -p "$CACHE_DIR"

log "compiling vcsim (GOPATH mode, offline)"
(
    cd "$gopath/src/github.com/vmware/govmomi/vcsim"
    GO111MODULE=off GOPROXY=off GOFLAGS='' GOPATH="$gopath:/usr/share/gocode" \
        GOCACHE="$WORK/gocache" CGO_ENABLED=0 \
        go build -o "$BIN.tmp" .
)
mv "$BIN.tmp" "$BIN"
printf '%s\n' "$RECIPE" >"$STAMP"

log "built $BIN in $((SECONDS - start_s))s ($(go version))"
printf '%s\n' "$BIN"
