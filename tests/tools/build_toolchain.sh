#!/usr/bin/env bash
# Build the Pulumi toolchain the real-engine tests run (never a release download): the CLI from Go
# modules, and the plugins the proxy refuses from ../shared/third_party (build_plugins.sh); print
# the directory holding the CLI and the language host on stdout (progress goes to stderr), with
# plugins.json beside it naming the provider plugins to install.
#
# What and why: tests/tools/toolchain/manifest.json, one entry a binary. Every entry's status is
# printed on each run (exact, or substitute and why), and each module the proxy refused is asked
# for again, so the day the Go module proxy serves it the output says so.
#
# Idempotent: the outputs are cached under $REPO/.cache/toolchain/<key>/bin, where the key is a
# digest of the manifest, the wrapper module (go.mod, go.sum, tools.go) and the Go version; a warm
# run rebuilds nothing. The Go build cache (go env GOCACHE) is the machine's, as for any Go build.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TOOLS="$REPO/tests/tools"
WRAPPER="$TOOLS/toolchain/pulumi"
MANIFEST="$TOOLS/toolchain/manifest.json"
# shellcheck source=go_env.sh source-path=SCRIPTDIR
source "$TOOLS/go_env.sh"

log() { printf 'build_toolchain: %s\n' "$*" >&2; }

# A user's installed Pulumi and plugins at exactly the pinned versions: linked, nothing compiled, no
# Go needed (tests/installed_toolchain.py; it says in one line which version differs otherwise).
# LABS_K8S_BUILD_PULUMI=1 forces the source build below (.ci/run sets it).
INSTALLED="$REPO/.cache/toolchain/installed"
if python3 "$REPO/tests/installed_toolchain.py" "$MANIFEST" "$INSTALLED"; then
    printf '%s\n' "$INSTALLED/bin"
    exit 0
fi

go=$(go_binary)
key=$(go_inputs_digest "$go" "$MANIFEST" "$WRAPPER/go.mod" "$WRAPPER/go.sum" "$WRAPPER/tools.go")
OUT="$REPO/.cache/toolchain/$key"
BIN="$OUT/bin"

# manifest NAME FIELD: one field of one manifest entry ("" when absent).
manifest() {
    jq -r --arg name "$1" --arg field "$2" \
        '.binaries[] | select(.name == $name) | .[$field] // ""' "$MANIFEST"
}

report() {
    local name status refused
    while read -r name; do
        status=$(manifest "$name" status)
        case $status in
            exact) log "$name: $(manifest "$name" module)@$(manifest "$name" version) (exact)" ;;
            substitute) log "$name: $(manifest "$name" module)@$(manifest "$name" version)" \
                "(substitute for $(manifest "$name" wanted): $(manifest "$name" why))" ;;
            *) log "$name: unknown status '$status' in $MANIFEST"; return 1 ;;
        esac
        refused=$(manifest "$name" refused_module)
        # Built from a source snapshot because the proxy refuses the module: ask again (the
        # version list answers 200 once any version is served).
        if [[ -n $refused ]] && (cd "$WRAPPER" && GOFLAGS=-mod=mod "$go" list -m -versions "$refused" \
            >/dev/null 2>&1); then
            log "$name: the proxy now serves $refused: build it from the proxy and update the manifest"
        fi
    done < <(jq -r '.binaries[].name' "$MANIFEST")
}

command -v jq >/dev/null || { log "jq is needed (scripts/install-test-deps.sh installs it)"; exit 1; }
report

# build_plugins: the plugins built from ../shared/third_party (build_plugins.sh), linked next to
# the CLI (the language host must sit beside pulumi-language-python-exec), and plugins.json: what
# a test installs into its private PULUMI_HOME with `pulumi plugin install ... --file`.
link_plugins() {
    local root name kind plugin version binary names
    mapfile -t names < <(jq -r '.binaries[] | select(.archives) | .name' "$MANIFEST")
    root=$(bash "$TOOLS/build_plugins.sh" "${names[@]}" | tail -n1)
    printf '[]' >"$OUT/plugins.json.new"
    while read -r name; do
        kind=$(manifest "$name" kind)
        version=$(manifest "$name" version)
        binary=$(find "$root" -mindepth 3 -maxdepth 3 -path "*/$name-$version-*/bin/$name" -type f | head -n1)
        [[ -x $binary ]] || { log "$name: build_plugins.sh left no $name $version under $root"; return 1; }
        if [[ $kind == language ]]; then
            ln -f "$binary" "$BIN/$name"
            continue
        fi
        plugin=$(manifest "$name" plugin)
        jq --arg kind "$kind" --arg name "$plugin" --arg version "$version" --arg path "$binary" \
            '. + [{kind: $kind, name: $name, version: $version, path: $path}]' \
            "$OUT/plugins.json.new" >"$OUT/plugins.json.tmp"
        mv "$OUT/plugins.json.tmp" "$OUT/plugins.json.new"
    done < <(printf '%s\n' "${names[@]}")
    mv "$OUT/plugins.json.new" "$OUT/plugins.json"
}

if [[ -x "$BIN/pulumi" && -f "$OUT/.complete" ]]; then
    link_plugins
    printf '%s\n' "$BIN"
    exit 0
fi

start_s=$SECONDS
version=$(manifest pulumi version)
module_version=$(cd "$WRAPPER" && "$go" list -m -f '{{.Version}}' github.com/pulumi/pulumi/pkg/v3)
sdk_version=$(cd "$WRAPPER" && "$go" list -m -f '{{.Version}}' github.com/pulumi/pulumi/sdk/v3)
if [[ $module_version != "$version" || $sdk_version != "$version" ]]; then
    log "the wrapper pins pkg/v3 $module_version and sdk/v3 $sdk_version, the manifest says $version"
    exit 1
fi
rm -rf "$OUT"
mkdir -p "$BIN"
log "building the Pulumi CLI $version with $("$go" env GOVERSION) (cold: about 10 minutes on 2 cores)"
(cd "$WRAPPER" && CGO_ENABLED=0 GOFLAGS=-mod=readonly "$go" build -trimpath -tags osusergo,grpcnotrace \
    -ldflags "-X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$version" \
    -o "$BIN/pulumi" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi)

# The scripts that ship inside the sdk/v3 module, next to the CLI (where it looks for bundled plugins).
sdk_dir=$(cd "$WRAPPER" && "$go" list -m -f '{{.Dir}}' github.com/pulumi/pulumi/sdk/v3)
for name in pulumi-language-python-exec pulumi-resource-pulumi-python; do
    install -m 0755 "$sdk_dir/$(manifest "$name" file)" "$BIN/$name"
done

reported=$("$BIN/pulumi" version)
if [[ $reported != "$version" ]]; then
    log "the built CLI reports version '$reported', not $version"
    exit 1
fi
touch "$OUT/.complete"
link_plugins
# Toolchains of other keys (older pins) are never used again: about 170 MB each.
find "$REPO/.cache/toolchain" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf {} +
log "built $BIN in $((SECONDS - start_s))s"
printf '%s\n' "$BIN"
