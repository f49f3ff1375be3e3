// Command pause is the sandbox ("pause") container of the kubelet node tier: it holds a pod's namespaces,
// reaps the zombies of a shared PID namespace and exits on SIGINT or SIGTERM. Built static (no cgo), it is
// the only file of the sandbox image that the test bed pushes to its local registry.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		os.Stdout.WriteString("pause (elastic-llm-operator test bed)\n")
		return
	}
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
