// Command vfnet-binding is the KubeVirt network binding plugin sidecar that
// passes a vfnet VF into the VM as a VFIO hostdev.
package main

import (
	"context"
	"errors"
	"flag"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/vfnet-io/vfnet/cmd/vfnet-binding/app"
)

func main() {
	if pct, ok := app.GCPercent(os.Getenv); ok {
		debug.SetGCPercent(pct)
	}
	opts, err := app.Parse(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		klog.ErrorS(err, "invalid command line")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background())
	if err := app.Run(ctx, opts); err != nil {
		klog.ErrorS(err, "vfnet-binding failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}
