// Command gengolden regenerates the golden OnDefineDomain inputs (domain XML
// and VMI JSON) with KubeVirt v1.9.0's own converter:
//
//	cd test/kubevirt && go run ./cmd/gengolden
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/vfnet-io/vfnet/test/kubevirt/internal/golden"
)

func main() {
	out := flag.String("o", "testdata/golden", "directory to write <case>.domain.xml and <case>.vmi.json into")
	flag.Parse()
	if err := golden.WriteAll(*out); err != nil {
		fmt.Fprintln(os.Stderr, "gengolden:", err)
		os.Exit(1)
	}
}
