//go:build tools

// coredns-1.14.6: github.com/coredns/coredns v1.14.6 (tests/tools/kube/manifest.json, tests/kube_programs.py).
package tools

import (
	_ "github.com/coredns/coredns"
)
