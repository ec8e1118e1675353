// Package main pins kube-router's command for `go build` in this module (see go.mod).
package main

import _ "github.com/cloudnativelabs/kube-router/v2/pkg/cmd"

func main() {}
