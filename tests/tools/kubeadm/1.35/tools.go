//go:build tools

// kubeadm v1.35.4, built from the k8s.io/kubernetes module (tests/tools/build_kubeadm.sh). The
// staging modules are pinned at v0.35.4 in go.mod (why: tests/tools/kubeadm/pin.sh).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubeadm"
)
