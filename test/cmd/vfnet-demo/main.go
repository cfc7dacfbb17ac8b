// Command vfnet-demo shows vfnet's whole flow on a real Kubernetes control
// plane and a simulated SR-IOV node (`make demo`). It exits non-zero naming
// the failing step.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/test/lib/flow"
)

func main() {
	klog.InitFlags(nil)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := flow.Demo(ctx, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "vfnet demo FAILED: %v\n", err)
		klog.Flush()
		os.Exit(1)
	}
	fmt.Println("vfnet demo: all steps passed")
}
