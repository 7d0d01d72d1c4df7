#!/usr/bin/env bash
# Write (or renew) the wrapper module that builds kubeadm VERSION (v1.MINOR.PATCH) from the Go
# module proxy: tests/tools/kubeadm/<1.MINOR>/{go.mod,go.sum,tools.go}. Then set that minor's
# version in tests/tools/kubeadm/manifest.json and commit the three files: go.sum is what makes
# every later build verified (build_kubeadm.sh builds with -mod=readonly).
#
# Why a wrapper: k8s.io/kubernetes's own go.mod replaces every k8s.io/* staging module with
# ./staging/src/k8s.io/<name>, and a dependency's replace lines are ignored (go.dev/ref/mod#go-mod-file-replace),
# so `go install k8s.io/kubernetes/cmd/kubeadm@VERSION` cannot resolve them (they require v0.0.0).
# The staging modules are published as their own modules at v0.MINOR.PATCH for each release
# (k8s.io/api v0.36.3 for v1.36.3): the wrapper pins every one that go.mod names at that version.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=go_env.sh source-path=SCRIPTDIR/..
source "$HERE/../go_env.sh"

version=${1:?usage: pin.sh v1.MINOR.PATCH}
[[ $version =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || { echo "pin.sh: $version is not v1.MINOR.PATCH" >&2; exit 2; }
staging_version="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
minor="1.${BASH_REMATCH[1]}"
go=$(go_binary)
dir="$HERE/$minor"
mkdir -p "$dir"
rm -f "$dir/go.mod" "$dir/go.sum"

cat >"$dir/tools.go" <<GO
//go:build tools

// kubeadm $version, built from the k8s.io/kubernetes module (tests/tools/build_kubeadm.sh). The
// staging modules are pinned at $staging_version in go.mod (why: tests/tools/kubeadm/pin.sh).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubeadm"
)
GO

(cd "$dir" && "$go" mod init "labs-k8s/tests/tools/kubeadm/$minor" 2>/dev/null)
# The upstream go.mod, from the module cache (go mod download verifies it against sum.golang.org).
upstream_mod=$(cd "$dir" && "$go" mod download -json "k8s.io/kubernetes@$version" | jq -r .GoMod)

edits=(-require "k8s.io/kubernetes@$version")
while read -r module; do
    edits+=(-replace "$module=$module@$staging_version")
done < <(sed -n 's#^\s*\(k8s\.io/[^ ]*\) => \./staging/.*#\1#p' "$upstream_mod")
((${#edits[@]} > 2)) || { echo "pin.sh: no staging replace lines in k8s.io/kubernetes@$version's go.mod" >&2; exit 1; }
(cd "$dir" && "$go" mod edit "${edits[@]}" && GOFLAGS=-mod=mod "$go" mod tidy)
echo "pin.sh: $dir pins k8s.io/kubernetes $version and $(((${#edits[@]} - 2) / 2)) staging modules at $staging_version" >&2
