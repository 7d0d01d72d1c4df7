//go:build tools

// containerd: github.com/containerd/containerd/v2 v2.4.2 (tests/tools/kube/manifest.json, tests/kube_programs.py).
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
