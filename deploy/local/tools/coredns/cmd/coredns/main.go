// Command coredns is CoreDNS with only the plugins the kubelet node tier's cluster DNS uses: the
// kubernetes plugin answers for cluster.local from the API (Services, headless Services, pods), the rest
// answers with NXDOMAIN or goes to the machine's resolver. Fewer plugins than upstream's default build
// (no cloud DNS providers), so it builds in a fraction of the time.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// directives is the order in which the plugins above run (a subset of upstream's plugin.cfg order).
var directives = []string{
	"bind",
	"ready",
	"health",
	"errors",
	"log",
	"cache",
	"kubernetes",
	"forward",
}

func main() {
	dnsserver.Directives = directives
	coremain.Run()
}
