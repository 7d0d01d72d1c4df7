//go:build tools

// kubernetes-1.35: k8s.io/kubernetes v1.35.8 (tests/tools/kube/manifest.json, tests/kube_programs.py).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubeadm"
)
