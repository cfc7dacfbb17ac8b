package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
)

// Options says how to report one tier.
type Options struct {
	Tier    string
	Verbose bool
	Want    []string
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	ImportPath string // build-output and build-fail events
}

// Summary counts a tier's results. Tests are top-level tests, subtests
// are counted apart; a skip at either level is a skip.
type Summary struct {
	Packages                                   int
	Tests, Passed, Failed, Skipped             int
	Subtests, SubPassed, SubFailed, SubSkipped int
	// SkippedNames lists each skipped test or subtest with its package.
	SkippedNames []string
	// FailedPackages lists packages whose test binary failed outside any
	// test (build failure, panic in TestMain, timeout).
	FailedPackages []string
	passed         map[string]bool // top-level test name -> passed
	ran            map[string]bool
}

// Report copies the readable part of the stream to out and counts it.
func Report(in io.Reader, out io.Writer, opts Options) (*Summary, error) {
	s := &Summary{passed: map[string]bool{}, ran: map[string]bool{}}
	// Output of a test still running, printed if it fails or skips (a
	// skip is a failure here, so its reason must be seen).
	pending := map[string]*strings.Builder{}
	key := func(e event) string { return e.Package + "\x00" + e.Test }
	pkgs := map[string]bool{}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			// go test's own messages (a build error before any test
			// binary, "no Go files") are not JSON: show them as they are.
			fmt.Fprintf(out, "%s\n", line)
			continue
		}
		switch {
		case e.Action == "build-output":
			io.WriteString(out, e.Output)
			continue
		case e.Action == "build-fail":
			s.FailedPackages = append(s.FailedPackages, e.ImportPath+" (build failed)")
			continue
		case e.Test == "" && e.Package != "":
			pkgs[e.Package] = true
		}
		if e.Test == "" {
			switch e.Action {
			case "output":
				// The package's own lines: "ok  pkg 1.2s", "FAIL pkg",
				// panics and timeouts; the bare "PASS" adds nothing.
				if e.Output != "PASS\n" || opts.Verbose {
					io.WriteString(out, e.Output)
				}
			case "fail":
				// Flush what tests that never ended printed (a timeout or
				// a panic ends the binary in the middle of them).
				for k, b := range pending {
					if strings.HasPrefix(k, e.Package+"\x00") {
						io.WriteString(out, b.String())
						delete(pending, k)
					}
				}
				s.FailedPackages = append(s.FailedPackages, e.Package)
			}
			continue
		}
		top := !strings.Contains(e.Test, "/")
		switch e.Action {
		case "run":
			if top {
				s.ran[e.Test] = true
			}
		case "output":
			if opts.Verbose {
				io.WriteString(out, e.Output)
				continue
			}
			b := pending[key(e)]
			if b == nil {
				b = &strings.Builder{}
				pending[key(e)] = b
			}
			b.WriteString(e.Output)
		case "pass", "fail", "skip":
			if b := pending[key(e)]; b != nil && e.Action != "pass" {
				io.WriteString(out, b.String())
			}
			delete(pending, key(e))
			s.count(e, top)
		}
	}
	if err := sc.Err(); err != nil {
		return s, fmt.Errorf("read go test -json: %w", err)
	}
	s.Packages = len(pkgs)
	return s, nil
}

func (s *Summary) count(e event, top bool) {
	switch {
	case top && e.Action == "pass":
		s.Tests++
		s.Passed++
		s.passed[e.Test] = true
	case top && e.Action == "fail":
		s.Tests++
		s.Failed++
	case top:
		s.Tests++
		s.Skipped++
	case e.Action == "pass":
		s.Subtests++
		s.SubPassed++
	case e.Action == "fail":
		s.Subtests++
		s.SubFailed++
	default:
		s.Subtests++
		s.SubSkipped++
	}
	if e.Action == "skip" {
		s.SkippedNames = append(s.SkippedNames, e.Test+" ("+e.Package+")")
	}
}

// Line is the tier's summary line.
func (s *Summary) Line(tier string) string {
	return fmt.Sprintf("== %s: %d tests ran in %d packages: %d passed, %d failed, %d skipped; subtests: %d passed, %d failed, %d skipped",
		tier, s.Tests, s.Packages, s.Passed, s.Failed, s.Skipped, s.SubPassed, s.SubFailed, s.SubSkipped)
}

// Problems lists why the tier fails; none means it passed.
func (s *Summary) Problems(want []string) []string {
	var p []string
	if s.Failed+s.SubFailed > 0 {
		p = append(p, fmt.Sprintf("%d tests and %d subtests failed (their output is above)", s.Failed, s.SubFailed))
	}
	if len(s.FailedPackages) > 0 {
		sort.Strings(s.FailedPackages)
		p = append(p, "packages failed: "+strings.Join(s.FailedPackages, ", "))
	}
	if n := len(s.SkippedNames); n > 0 {
		p = append(p, fmt.Sprintf("%d skipped (a skip under make test is a failure: make the test run here, or fail with the fix): %s",
			n, strings.Join(s.SkippedNames, ", ")))
	}
	if s.Tests == 0 {
		p = append(p, "no test ran (a -run pattern that matches nothing, or no test files)")
	}
	for _, w := range want {
		switch {
		case !s.ran[w]:
			p = append(p, fmt.Sprintf("%s did not run: renamed or removed? The Makefile's -run and -want name it", w))
		case !s.passed[w]:
			p = append(p, fmt.Sprintf("%s ran but did not pass", w))
		}
	}
	return p
}
