//go:build tools

// Package tools pins kube-score's command for `go build` in this module (see go.mod).
package tools

import _ "github.com/zegl/kube-score/cmd/kube-score"
