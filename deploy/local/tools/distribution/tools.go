//go:build tools

// Package tools pins the commands this wrapper builds so `go mod tidy` keeps their dependencies.
package tools

import (
	_ "github.com/distribution/distribution/v3/cmd/registry"
)
