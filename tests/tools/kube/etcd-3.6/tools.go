//go:build tools

// etcd-3.6: go.etcd.io/etcd/server/v3 v3.6.8 (tests/tools/kube/manifest.json, tests/kube_programs.py).
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "go.etcd.io/etcd/etcdctl/v3"
	_ "go.etcd.io/etcd/etcdutl/v3"
)
