#!/usr/bin/env bash
# Build govmomi's vCenter simulator (vcsim) from the Go module proxy and print the path of the
# binary on stdout (progress goes to stderr).
#
# What is built: tests/tools/vcsim/main.go, a small main of ours over govmomi's simulator
# library at the version pinned in tests/tools/go.mod and go.sum (why our own main, and the
# password-file login hook and versioned property collector it adds: main.go's header). No patch to govmomi is needed:
# this simulator applies DRS settings and has a login hook (SessionManager.ValidLogin).
#
# Idempotent: the binary is cached at $REPO/.cache/vcsim/vcsim (.cache is gitignored) with a
# stamp of its inputs (go.mod, go.sum, main.go, collector.go, the Go version) beside it; when the stamp
# matches and the binary runs, nothing is rebuilt. VCSIM_REBUILD=1 forces a rebuild.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TOOLS="$REPO/tests/tools"
CACHE_DIR="$REPO/.cache/vcsim"
BIN="$CACHE_DIR/vcsim"
STAMP="$CACHE_DIR/vcsim.recipe"
# shellcheck source=go_env.sh source-path=SCRIPTDIR
source "$TOOLS/go_env.sh"

log() { printf 'build_vcsim: %s\n' "$*" >&2; }

go=$(go_binary)
recipe="govmomi-module $(go_inputs_digest "$go" "$TOOLS/go.mod" "$TOOLS/go.sum" "$TOOLS/vcsim/main.go" "$TOOLS/vcsim/collector.go")"

# A cached binary that still starts is good enough (-h prints the usage and exits 0 or 2).
if [[ -x "$BIN" && "${VCSIM_REBUILD:-0}" != "1" && "$(cat "$STAMP" 2>/dev/null || true)" == "$recipe" ]]; then
    if "$BIN" -h >/dev/null 2>&1 || [[ $? -eq 2 ]]; then
        printf '%s\n' "$BIN"
        exit 0
    fi
    log "cached $BIN does not run; rebuilding"
fi

start_s=$SECONDS
mkdir -p "$CACHE_DIR"
log "building vcsim with $("$go" env GOVERSION) ($(grep -m1 'github.com/vmware/govmomi ' "$TOOLS/go.mod" | xargs))"
(cd "$TOOLS" && CGO_ENABLED=0 GOFLAGS=-mod=readonly "$go" build -trimpath -o "$BIN.new" ./vcsim)
mv "$BIN.new" "$BIN"
printf '%s\n' "$recipe" >"$STAMP"
log "built $BIN in $((SECONDS - start_s))s"
printf '%s\n' "$BIN"
