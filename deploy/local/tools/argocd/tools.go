//go:build tools

// Package tools pins the command this wrapper builds so `go mod tidy` keeps its dependencies.
package tools

import (
	_ "github.com/argoproj/argo-cd/v3/cmd"
)
