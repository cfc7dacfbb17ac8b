// Command vfnet-driver is vfnet's DRA driver for SR-IOV VFs (see
// cmd/vfnet-driver/app), plus `vfnet-driver inspect`. This is the shipped
// build: it passes no simulator, so test/lib/simhost is not linked (main_test.go
// keeps it so) and --simulate fails naming vfnet-driver-sim.
package main

import (
	"os"

	"github.com/vfnet-io/vfnet/cmd/vfnet-driver/app"
)

func main() {
	os.Exit(app.Main(os.Args[1:], os.Stdout, os.Stderr, nil))
}
