// Command vfnet-driver is vfnet's DRA driver for SR-IOV VFs (see
// cmd/vfnet-driver/app), plus `vfnet-driver inspect`.
package main

import (
	"os"

	"github.com/vfnet-io/vfnet/cmd/vfnet-driver/app"
)

func main() {
	os.Exit(app.Main(os.Args[1:], os.Stdout, os.Stderr))
}
