//go:build tools

// flannel: github.com/flannel-io/flannel v0.28.9 (tests/tools/kube/manifest.json, tests/kube_programs.py).
package tools

import (
	_ "github.com/flannel-io/flannel/cmd/install_conf"
)
