//go:build tools

// Package tools pins the commands this wrapper builds so `go mod tidy` keeps their dependencies.
package tools

import (
	_ "sigs.k8s.io/karpenter/kwok"
)
