// Command vfnet-driver-sim is vfnet-driver with --simulate: the same
// program (cmd/vfnet-driver/app) plus the simulated host of test/lib/simhost, for
// the demo and the tests that run the driver on a synthetic node (the
// real-node tier's image among them). The shipped vfnet-driver links no
// simulator and refuses --simulate, naming this binary.
package main

import (
	"os"

	"github.com/vfnet-io/vfnet/cmd/vfnet-driver/app"
	"github.com/vfnet-io/vfnet/test/lib/simulate"
)

func main() {
	os.Exit(app.Main(os.Args[1:], os.Stdout, os.Stderr, simulate.Open))
}
