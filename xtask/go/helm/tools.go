//go:build tools

// Package tools pins the helm command this module builds (the chart in deploy/helm is checked
// with `helm template` against deploy/operator.yaml).
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
