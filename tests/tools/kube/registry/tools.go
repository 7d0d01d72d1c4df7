//go:build tools

// registry: github.com/distribution/distribution/v3 v3.0.0 (tests/tools/kube/manifest.json, tests/kube_programs.py).
package tools

import (
	_ "github.com/distribution/distribution/v3/cmd/registry"
)
