//go:build tools

// Package tools pins Prometheus's and promtool's commands for `go build` in this module (see
// go.mod).
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
