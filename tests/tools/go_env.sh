#!/usr/bin/env bash
# Sourced by the scripts that build Go tools for the tests (build_vcsim.sh, build_toolchain.sh).
# Picks the machine's own Go, never Debian's golang-go: bookworm's is 1.19, older than the
# `go 1.25` our wrapper modules need, and /usr/bin/go can come first in a PATH.
# The modules come from the Go module proxy the machine is configured for (`go env GOPROXY`).

# go_binary: print the path of a Go >= 1.25 (the first on PATH, else /usr/local/go/bin/go).
go_binary() {
    local candidate version
    for candidate in "$(command -v go 2>/dev/null || true)" /usr/local/go/bin/go; do
        [[ -n $candidate && -x $candidate ]] || continue
        version=$("$candidate" env GOVERSION 2>/dev/null) || continue
        # go1.25.3 -> 1 25
        if [[ $version =~ ^go([0-9]+)\.([0-9]+) ]] &&
            (( BASH_REMATCH[1] > 1 || (BASH_REMATCH[1] == 1 && BASH_REMATCH[2] >= 25) )); then
            printf '%s\n' "$candidate"
            return 0
        fi
    done
    echo "no Go 1.25 or newer found (tried go on PATH and /usr/local/go/bin/go); install Go from" \
        "the Go toolchain your machine provides (Debian's golang-go 1.19 is too old)" >&2
    return 1
}

# go_inputs_digest GO FILE...: a short digest of the files' contents and the Go version, a cache
# key that is the same in every checkout (no paths in it).
go_inputs_digest() {
    local go=$1 file
    shift
    { "$go" env GOVERSION; for file in "$@"; do sha256sum <"$file"; done; } | sha256sum | cut -c1-16
}
