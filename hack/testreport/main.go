// Command testreport reads `go test -json` on stdin, prints what a person
// reads from `go test` (or `go test -v` with -v), and ends with one line per
// tier: how many tests ran, passed, failed and skipped. It exits non-zero
// when a test failed, when any test or subtest skipped, when no test ran,
// or when a test named by -want did not run and pass.
//
// Why: under `make test` a skip is a failure. A skip turns a missing
// dependency, a moved file or a gated case into a green run that tested
// nothing, and `go test -run '^TestX$'` passes with "no tests to run" when
// TestX is renamed. Every tier of `make test` runs through this.
//
//	set -o pipefail; go test -json ./... | go run ./hack/testreport -tier unit
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

func main() {
	var opts Options
	flag.StringVar(&opts.Tier, "tier", "", "the tier's name for the summary line (required)")
	flag.BoolVar(&opts.Verbose, "v", false, "print every test's output as it comes, as go test -v does (default: only failed and skipped tests' output, as go test does)")
	want := flag.String("want", "", "comma-separated top-level tests that must have run and passed (the tier's -run pattern names them)")
	flag.Parse()
	if opts.Tier == "" {
		fmt.Fprintln(os.Stderr, "testreport: -tier is required (the name printed in the summary)")
		os.Exit(2)
	}
	if *want != "" {
		opts.Want = strings.Split(*want, ",")
	}
	os.Exit(Run(os.Stdin, os.Stdout, opts))
}

// Run reports the stream and returns the exit code.
func Run(in io.Reader, out io.Writer, opts Options) int {
	sum, err := Report(in, out, opts)
	if err != nil {
		fmt.Fprintf(out, "testreport: %v\n", err)
		return 1
	}
	fmt.Fprintln(out, sum.Line(opts.Tier))
	if problems := sum.Problems(opts.Want); len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintf(out, "== %s FAILED: %s\n", opts.Tier, p)
		}
		return 1
	}
	return 0
}
