//go:build tools

// crane: github.com/google/go-containerregistry v0.22.1 (tests/tools/kube/manifest.json, tests/kube_programs.py).
package tools

import (
	_ "github.com/google/go-containerregistry/cmd/crane"
)
