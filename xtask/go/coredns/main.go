// Command coredns: CoreDNS with only the plugins a local cluster needs (bind, errors, cache,
// the kubernetes zone), so the build pulls none of the cloud providers' SDKs.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
)

func init() {
	dnsserver.Directives = []string{"bind", "errors", "cache", "kubernetes"}
}

func main() { coremain.Run() }
