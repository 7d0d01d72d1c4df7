//go:build tools

// The Pulumi CLI, built from its Go module at the version go.mod pins (build_toolchain.sh).
// pkg/v3's own go.mod replaces sdk/v3 with ../sdk, so `go install pkg@version` refuses; this
// wrapper module requires pkg/v3 and sdk/v3 at the same release and builds the main package.
package tools

import (
	_ "github.com/pulumi/pulumi/pkg/v3/cmd/pulumi"
)
