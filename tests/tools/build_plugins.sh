#!/usr/bin/env bash
# Build the plugins the Go module proxy here refuses (pulumi-resource-vsphere, -random, -command and
# the Python language host) from the public source snapshots in ../shared/third_party, and print the
# directory holding them on stdout (progress goes to stderr). Sourced by nothing: build_toolchain.sh
# runs it after the CLI and links its outputs next to the CLI.
#
# Each archive's sha256 is checked against the sha256 our manifest pins AND against the snapshot's
# own MANIFEST.json before it is extracted: a missing or altered archive is an error. The sources
# are extracted and built under $REPO/.cache/plugins/<name>-<version>-<key>, never in the
# repository; the key is a digest of the recipe, the manifest entry (archives included) and the Go
# version, so a warm run rebuilds nothing. Everything else comes from the Go module proxy, verified
# by each provider module's own go.sum (a `replace` line only for the modules the proxy refuses).
# Where an archive is missing (a user's machine has no ../shared), the same module at the same commit
# comes from the Go module proxy instead (`go_module` in the manifest; `module_from_proxy`).
#
# Usage: build_plugins.sh NAME...   (manifest names: pulumi-resource-vsphere, ...). Builds of
# other keys, or of names not asked for, are removed: build_toolchain.sh always asks for all.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TOOLS="$REPO/tests/tools"
MANIFEST="$TOOLS/toolchain/manifest.json"
# shellcheck source=go_env.sh source-path=SCRIPTDIR
source "$TOOLS/go_env.sh"

log() { printf 'build_plugins: %s\n' "$*" >&2; }
go=$(go_binary)

# Where the snapshots are: LABS_K8S_THIRD_PARTY, else ../shared/third_party beside the checkout, or
# beside the checkout it was cloned from (a clean clone in /tmp); no path of one machine is assumed.
third_party() {
    local dir origin
    origin=$(git -C "$REPO" remote get-url origin 2>/dev/null) || origin=
    [[ -d $origin ]] || origin=$REPO
    for dir in "${LABS_K8S_THIRD_PARTY:-}" "$REPO/../shared/third_party" "$origin/../shared/third_party"; do
        if [[ -n $dir && -f $dir/MANIFEST.json ]]; then
            (cd "$dir" && pwd)
            return 0
        fi
    done
    log "no third_party snapshots (\$LABS_K8S_THIRD_PARTY, $REPO/../shared/third_party): each module" \
        "from the Go module proxy where it serves one"
}
TP=$(third_party)

entry() { jq -c --arg name "$1" '.binaries[] | select(.name == $name)' "$MANIFEST"; }
field() { jq -r --arg f "$2" '.[$f] // ""' <<<"$1"; }

# checked_archive FILE SHA256: the archive's path once its sha256 is what we pin and what the
# snapshot's manifest says; without the archive, one made from the Go module proxy's copy.
checked_archive() {
    local file=$1 pinned=$2 listed actual
    [[ -n $TP && -f $TP/$file ]] || { module_from_proxy "$file"; return; }
    listed=$(jq -r --arg file "$file" '.[] | select(.file == $file) | .sha256' "$TP/MANIFEST.json")
    actual=$(sha256sum "$TP/$file" | cut -d' ' -f1)
    if [[ $actual != "$pinned" || $listed != "$pinned" ]]; then
        log "$TP/$file: sha256 $actual; our manifest pins $pinned, the snapshot's MANIFEST.json says" \
            "'${listed:-nothing}': refusing to build from an altered or unlisted archive"
        return 1
    fi
    printf '%s\n' "$TP/$file"
}

# module_from_proxy FILE: the archive's module at the same commit from the Go module proxy, as a
# tarball laid out as the archive is (its root at `module_dir`), so the recipes build it unchanged.
# Checked by the checksum database (a module no go.sum of ours lists: the tree `go get` gives anyone)
# and, where a provider's go.sum names it, by that sum too. One line naming what to do otherwise.
module_from_proxy() {
    local file=$1 archive module dir sum json error out fix built
    archive=$(jq -c --arg f "$file" '[.binaries[].archives[]? | select(.file == $f)][0]' "$MANIFEST")
    built=$(jq -r --arg f "$file" '[.binaries[] | select(any(.archives[]?; .file == $f))][0] | "\(.module) \(.version)"' "$MANIFEST")
    module=$(field "$archive" go_module)
    fix="put $file (sha256 $(field "$archive" sha256)) in \$LABS_K8S_THIRD_PARTY, or install Pulumi and the released plugins (README, \"Try it without a vCenter\")"
    if [[ -z $module ]]; then
        log "$built: $file is not in ${TP:-a third_party directory}, and $(field "$archive" no_module): $fix"
        return 1
    fi
    if [[ $("$go" env GOSUMDB) == off ]]; then
        log "$module: no archive, and GOSUMDB=off leaves the proxy's copy unchecked: $fix"
        return 1
    fi
    # No exemption from the checksum database for these modules, whatever the machine's settings.
    json=$(cd / && GOFLAGS='' GONOSUMDB='' GONOSUMCHECK='' GOPRIVATE='' "$go" mod download -json "$module" 2>/dev/null) || true
    error="no answer"
    [[ -z $json ]] || error=$(jq -r '.Error // ""' <<<"$json" | head -n1)
    sum=$(field "$archive" go_sum)
    if [[ -n $error ]]; then
        log "${module/@/ }: no archive, and the Go module proxy did not serve it ($error): $fix"
        return 1
    elif [[ -n $sum && $(jq -r .Sum <<<"$json") != "$sum" ]]; then
        log "${module/@/ }: the proxy's copy has $(jq -r .Sum <<<"$json"), the providers' go.sum $sum: $fix"
        return 1
    fi
    dir=$(field "$archive" module_dir)
    out="$CACHE/.proxy/$file"
    mkdir -p "$CACHE/.proxy"
    tar -czf "$out" -C "$(jq -r .Dir <<<"$json")" --transform "s,^\.,./${dir#.},;s,//,/," --mode=u+w .
    log "${module/@/ }: no archive; from the Go module proxy ($(jq -r .Sum <<<"$json"), checked by $("$go" env GOSUMDB)${sum:+ and go.sum})"
    printf '%s\n' "$out"
}

# unpack ENTRY ARCHIVE_NAME DEST: extract the named archive of the entry into DEST.
unpack() {
    local spec=$1 name=$2 dest=$3 file sha archive
    file=$(jq -r --arg n "$name" '.archives[] | select(.name == $n) | .file' <<<"$spec")
    sha=$(jq -r --arg n "$name" '.archives[] | select(.name == $n) | .sha256' <<<"$spec")
    # Checked before anything is made: a failed check inside tar's argument would not stop tar.
    archive=$(checked_archive "$file" "$sha") || return 1
    mkdir -p "$dest"
    tar -xzf "$archive" -C "$dest"
}

# The release builds: no cgo, -trimpath, the version stamped in (without it GetPluginInfo answers
# an empty or default version and the engine looks for the plugin again).
go_build() {
    local version_var=$1 version=$2 out=$3 package=$4
    CGO_ENABLED=0 GOFLAGS=-mod=readonly "$go" build -trimpath \
        -ldflags "-s -w -X $version_var=$version" -o "$out" "$package"
}

build_vsphere() {
    local spec=$1 src=$2 out=$3 version
    version=$(field "$spec" version)
    unpack "$spec" pulumi-vsphere "$src/pulumi-vsphere"
    # The provider's go.mod replaces the upstream with ../upstream (the git submodule).
    unpack "$spec" terraform-provider-vsphere "$src/pulumi-vsphere/upstream"
    # pulumi-vsphere's Makefile (upstream target) applies patches/*.patch to the submodule.
    (cd "$src/pulumi-vsphere/upstream" && git init -q . && git apply ../patches/0001-fork.patch)
    unpack "$spec" terraform-plugin-sdk "$src/terraform-plugin-sdk"
    cd "$src/pulumi-vsphere/provider"
    "$go" mod edit -replace "github.com/hashicorp/terraform-plugin-sdk/v2=../../terraform-plugin-sdk"
    # As `go generate` does in cmd/pulumi-resource-vsphere (generate.go): schema-embed.json is
    # schema.json with the version set.
    (cd cmd/pulumi-resource-vsphere && VERSION=$version GOFLAGS=-mod=readonly "$go" run generate.go)
    go_build github.com/pulumi/pulumi-vsphere/provider/v4/pkg/version.Version "$version" \
        "$out/pulumi-resource-vsphere" ./cmd/pulumi-resource-vsphere
}

build_random() {
    local spec=$1 src=$2 out=$3 version
    version=$(field "$spec" version)
    unpack "$spec" pulumi-random "$src/pulumi-random"
    unpack "$spec" terraform-plugin-sdk "$src/terraform-plugin-sdk"
    cd "$src/pulumi-random/provider"
    "$go" mod edit -replace "github.com/hashicorp/terraform-plugin-sdk/v2=../../terraform-plugin-sdk"
    (cd cmd/pulumi-resource-random && VERSION=$version GOFLAGS=-mod=readonly "$go" run generate.go)
    go_build github.com/pulumi/pulumi-random/provider/v4/pkg/version.Version "$version" \
        "$out/pulumi-resource-random" ./cmd/pulumi-resource-random
}

build_command() {
    local spec=$1 src=$2 out=$3 version
    version=$(field "$spec" version)
    unpack "$spec" pulumi-command "$src/pulumi-command"
    unpack "$spec" pulumi-go-provider "$src/pulumi-go-provider"
    cd "$src/pulumi-command/provider"
    "$go" mod edit -replace "github.com/pulumi/pulumi-go-provider=../../pulumi-go-provider"
    go_build github.com/pulumi/pulumi-command/provider/pkg/version.Version "$version" \
        "$out/pulumi-resource-command" ./cmd/pulumi-resource-command
}

build_language_python() {
    local spec=$1 src=$2 out=$3 version sdk
    version=$(field "$spec" version)
    sdk=$(field "$spec" sdk_version)
    unpack "$spec" pulumi-language-python "$src/pulumi"
    cd "$src/pulumi/sdk/python/cmd/pulumi-language-python"
    # Its go.mod replaces pkg/v3 and sdk/v3 with the monorepo's own trees, which the archive does
    # not hold: require the released modules at the CLI's version from the proxy instead
    # (../shared/third_party/README.md). `go get` records them and their sums in go.mod/go.sum.
    "$go" mod edit -dropreplace github.com/pulumi/pulumi/pkg/v3 -dropreplace github.com/pulumi/pulumi/sdk/v3
    GOFLAGS=-mod=mod "$go" get "github.com/pulumi/pulumi/pkg/v3@$sdk" "github.com/pulumi/pulumi/sdk/v3@$sdk" >&2
    # sdk/v3 v3.274.1 imports modules v3.258.0 did not (pulumi-cloud-sdk): their sums too.
    GOFLAGS=-mod=mod "$go" mod tidy >&2
    go_build github.com/pulumi/pulumi/sdk/v3/go/common/version.Version "$version" \
        "$out/pulumi-language-python" .
}

recipe_of() {
    case $1 in
        pulumi-resource-vsphere) echo build_vsphere ;;
        pulumi-resource-random) echo build_random ;;
        pulumi-resource-command) echo build_command ;;
        pulumi-language-python) echo build_language_python ;;
        *) log "$1: no build recipe"; return 1 ;;
    esac
}

command -v jq >/dev/null || { log "jq is needed (scripts/install-test-deps.sh installs it)"; exit 1; }
# LABS_K8S_PLUGIN_CACHE: another cache directory (a test's, so that it never touches the real one).
CACHE=${LABS_K8S_PLUGIN_CACHE:-$REPO/.cache/plugins}
mkdir -p "$CACHE"
keep=()
for name in "$@"; do
    spec=$(entry "$name")
    [[ -n $spec ]] || { log "$name: no such entry in $MANIFEST"; exit 1; }
    version=$(field "$spec" version)
    recipe=$(recipe_of "$name")
    # The key: the Go version, the manifest entry (archives and their sha256 included) and the
    # recipe's own code, so editing another recipe or this driver rebuilds nothing.
    key=$({ "$go" env GOVERSION; printf '%s' "$spec"; declare -f "$recipe" unpack go_build; } | sha256sum | cut -c1-16)
    dir="$CACHE/$name-$version-$key"
    keep+=("$(basename "$dir")")
    binary=$(field "$spec" binary)
    if [[ -x $dir/bin/$binary && -f $dir/.complete ]]; then
        # Every warm run still checks the archives: a changed snapshot is not silently ignored.
        # (Built from the proxy where an archive is missing: nothing to check again.)
        while read -r archive; do
            [[ -n $TP && -f $TP/$(jq -r .file <<<"$archive") ]] || continue
            checked_archive "$(jq -r .file <<<"$archive")" "$(jq -r .sha256 <<<"$archive")" >/dev/null
        done < <(jq -c '.archives[]' <<<"$spec")
        log "$name $version: cached ($dir)"
        continue
    fi
    rm -rf "$dir"
    mkdir -p "$dir/bin" "$dir/src"
    start_s=$SECONDS
    log "$name $version: building from $(jq -r '[.archives[].file] | join(", ")' <<<"$spec") with $("$go" env GOVERSION)"
    ("$recipe" "$spec" "$dir/src" "$dir/bin")
    # The sources are a build input only: about 60 MB, not kept.
    rm -rf "$dir/src"
    touch "$dir/.complete"
    log "$name $version: built in $((SECONDS - start_s))s"
done
# Builds of other keys (older pins) are never used again, nor the tarballs made from the proxy's copies.
rm -rf "$CACHE/.proxy"
for dir in "$CACHE"/*; do
    [[ -d $dir ]] || continue
    [[ " ${keep[*]} " == *" $(basename "$dir") "* ]] || rm -rf "$dir"
done
printf '%s\n' "$CACHE"
