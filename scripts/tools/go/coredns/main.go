// CoreDNS with the plugins a one-node test cluster's DNS needs: the kubernetes zone, a cache,
// health and readiness for the probes, loop detection, reload, logs and errors, and bind (a
// Corefile naming an address to listen on needs the plugin that reads it). They run in
// CoreDNS's own order (dnsserver.Directives, from its plugin.cfg); unlinked ones are unused.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() { coremain.Run() }
