package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// goTestJSON runs the real go test -json on testdata/sample.
func goTestJSON(t *testing.T, run string, env ...string) []byte {
	t.Helper()
	cmd := exec.Command("go", "test", "-json", "-count=1", "-run", run, ".")
	cmd.Dir = filepath.Join("testdata", "sample")
	cmd.Env = append(os.Environ(), append([]string{"GOFLAGS=", "GOWORK=off"}, env...)...)
	out, _ := cmd.Output() // a failing run exits 1; the stream says why
	if len(out) == 0 {
		t.Fatalf("go test -json printed nothing")
	}
	return out
}

func TestReport(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, run  string
		env        []string
		want       []string
		verbose    bool
		code       int
		has, lacks []string
	}{
		{name: "all pass", run: ".", want: []string{"TestPass", "TestSub"}, code: 0,
			has:   []string{"== tier: 4 tests ran in 1 packages: 4 passed, 0 failed, 0 skipped; subtests: 2 passed, 0 failed, 0 skipped", "ok  \tsample"},
			lacks: []string{"quiet unless verbose", "FAILED"}},
		{name: "verbose shows every test", run: "^TestPass$", verbose: true, code: 0,
			has: []string{"quiet unless verbose", "=== RUN   TestPass"}},
		{name: "a skip fails", run: ".", env: []string{"SAMPLE_SKIP=1"}, code: 1,
			has: []string{"no frobnicator here", "1 skipped (a skip under make test is a failure", "TestMaybeSkip (sample)"}},
		{name: "a subtest skip fails", run: ".", env: []string{"SAMPLE_SUBSKIP=1"}, code: 1,
			has: []string{"subtest b skipped", "TestSub/b (sample)", "subtests: 1 passed, 0 failed, 1 skipped"}},
		{name: "a failure fails", run: ".", env: []string{"SAMPLE_FAIL=1"}, code: 1,
			has: []string{"the widget broke", "1 tests and 0 subtests failed"}},
		{name: "renamed test", run: "^TestRenamed$", want: []string{"TestRenamed"}, code: 1,
			has: []string{"no test ran", "TestRenamed did not run: renamed or removed?"}},
		{name: "wanted test skipped", run: ".", env: []string{"SAMPLE_SKIP=1"}, want: []string{"TestMaybeSkip"}, code: 1,
			has: []string{"TestMaybeSkip ran but did not pass"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			code := Run(bytes.NewReader(goTestJSON(t, c.run, c.env...)), &out, Options{Tier: "tier", Verbose: c.verbose, Want: c.want})
			if code != c.code {
				t.Errorf("exit code %d, want %d; output:\n%s", code, c.code, out.String())
			}
			for _, h := range c.has {
				if !strings.Contains(out.String(), h) {
					t.Errorf("output lacks %q:\n%s", h, out.String())
				}
			}
			for _, l := range c.lacks {
				if strings.Contains(out.String(), l) {
					t.Errorf("output has %q:\n%s", l, out.String())
				}
			}
		})
	}
}

// A build failure has no test events: it must not look like a pass.
func TestReportBuildFailure(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for name, body := range map[string]string{
		"go.mod":    "module broken\n\ngo 1.26\n",
		"x_test.go": "package broken\n\nimport \"testing\"\n\nfunc TestX(t *testing.T) { undefined() }\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("go", "test", "-json", ".")
	cmd.Dir, cmd.Env = dir, append(os.Environ(), "GOFLAGS=", "GOWORK=off")
	stream, _ := cmd.Output()
	var out bytes.Buffer
	if code := Run(bytes.NewReader(stream), &out, Options{Tier: "tier"}); code != 1 {
		t.Fatalf("exit %d for a build failure, want 1:\n%s", code, out.String())
	}
	if !strings.Contains(out.String(), "undefined") || !strings.Contains(out.String(), "no test ran") {
		t.Errorf("the compiler's message or the verdict is missing:\n%s", out.String())
	}
}
