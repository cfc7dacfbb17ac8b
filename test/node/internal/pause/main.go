// Command pause is the real-node tier's pod sandbox image: it sleeps until
// SIGTERM or SIGINT and exits 0, as the Kubernetes pause container does
// (built static, so the image needs nothing else). As PID 1 of a container
// it also reaps orphans the kernel hands it.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	chld := make(chan os.Signal, 16)
	signal.Notify(chld, syscall.SIGCHLD)
	for {
		select {
		case <-sig:
			os.Exit(0)
		case <-chld:
			for {
				pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}
