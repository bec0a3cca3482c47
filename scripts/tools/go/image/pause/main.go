// pause is the process of a pod's sandbox container (the role of registry.k8s.io/pause): it holds
// the pod's namespaces, reaps the zombies it inherits when it is PID 1 of a shared PID
// namespace, and exits 0 on SIGINT or SIGTERM. Static (CGO_ENABLED=0), no files, any UID.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every exited child without blocking.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
