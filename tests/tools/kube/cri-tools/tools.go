//go:build tools

// cri-tools: sigs.k8s.io/cri-tools v1.37.0 (tests/tools/kube/manifest.json, tests/kube_programs.py).
package tools

import (
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
)
