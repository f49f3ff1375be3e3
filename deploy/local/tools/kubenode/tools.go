//go:build tools

// Package tools pins the commands this wrapper builds so `go mod tidy` keeps their dependencies.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
