package peers

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// pinnedCommit is the kubernetes-sigs/dra-example-driver commit that
// BENCHMARKS.md measured. `make bench-peers` prepares the source at the
// Makefile's PEER_COMMIT, which must be the same (TestPeerCommitPinned).
const pinnedCommit = "31914ceacda29bbc55208ef75e68c0991e1c9568"

// peerSrcFix is how to provide the source at pin in src.
func peerSrcFix(src, pin string) string {
	return fmt.Sprintf("provide it at the pinned commit:\n"+
		"  rm -rf %[1]s && git clone https://github.com/kubernetes-sigs/dra-example-driver %[1]s && git -C %[1]s checkout --detach %[2]s\n"+
		"or let make prepare it from a local git directory that has the commit: make bench-peers PEER_GIT_DIR=<dir>", src, pin)
}

func git(ctx context.Context, dir string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "git", append([]string{"-C", dir}, args...)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("git -C %s %s: %w: %s", dir, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// gitLine is git's one line of output, trimmed.
func gitLine(ctx context.Context, dir string, args ...string) (string, error) {
	out, err := git(ctx, dir, args...)
	return strings.TrimSpace(out), err
}

// checkSource returns an error naming the fix unless src is a git checkout
// of its own (not a directory inside another repository, whose HEAD git
// would report) whose HEAD is pin. changed lists the tracked files that
// differ from pin: the caller decides whether a changed copy may be
// measured.
func checkSource(ctx context.Context, src, pin string) (changed []string, err error) {
	if _, err := os.Stat(filepath.Join(src, "cmd", "dra-example-kubeletplugin")); err != nil {
		return nil, fmt.Errorf("no dra-example-driver source in %s (%v); %s", src, err, peerSrcFix(src, pin))
	}
	top, err := gitLine(ctx, src, "rev-parse", "--show-toplevel")
	if err != nil {
		return nil, fmt.Errorf("%s is not a git checkout, so the commit measured cannot be checked (%v); %s", src, err, peerSrcFix(src, pin))
	}
	abs, err := filepath.Abs(src)
	if err != nil {
		return nil, err
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	if top != abs {
		return nil, fmt.Errorf("%s is not a git checkout of its own (it is inside %s), so the commit measured cannot be checked; %s", src, top, peerSrcFix(src, pin))
	}
	head, err := gitLine(ctx, src, "rev-parse", "HEAD")
	if err != nil {
		return nil, err
	}
	if head != pin {
		return nil, fmt.Errorf("%s is at commit %s, not the pinned %s (Makefile PEER_COMMIT, the commit BENCHMARKS.md measured): "+
			"git -C %s fetch origin %s && git -C %s checkout --detach %s (or, to measure another commit, change the pin and re-measure)",
			src, head, pin, src, pin, src, pin)
	}
	st, err := git(ctx, src, "status", "--porcelain", "--untracked-files=no")
	if err != nil {
		return nil, err
	}
	for _, l := range strings.Split(st, "\n") {
		if len(l) > 3 {
			changed = append(changed, l[3:])
		}
	}
	return changed, nil
}

// TestCheckSource runs checkSource on real git repositories: the pinned
// HEAD passes and reports local changes; another HEAD, a plain directory
// inside a repository, and no source fail, each naming the fix.
func TestCheckSource(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	outer := t.TempDir()
	run := func(dir string, args ...string) string {
		t.Helper()
		out, err := gitLine(ctx, dir, append([]string{"-c", "user.name=vfnet", "-c", "user.email=vfnet@example.com"}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	write := func(path, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run(outer, "init", "-q")
	src := filepath.Join(outer, "src")
	main := filepath.Join(src, "cmd", "dra-example-kubeletplugin", "main.go")
	write(main, "package main\n")

	// A plain copy inside another repository: git would answer with the
	// outer repository's HEAD.
	run(outer, "add", ".")
	run(outer, "commit", "-q", "-m", "outer")
	if _, err := checkSource(ctx, src, run(outer, "rev-parse", "HEAD")); err == nil || !strings.Contains(err.Error(), "not a git checkout of its own") {
		t.Errorf("directory inside another repository: got %v, want an error saying it is not a checkout of its own", err)
	}

	run(src, "init", "-q")
	run(src, "add", ".")
	run(src, "commit", "-q", "-m", "first")
	first := run(src, "rev-parse", "HEAD")
	write(main, "package main\n\nfunc main() {}\n")
	run(src, "commit", "-q", "-am", "second")
	second := run(src, "rev-parse", "HEAD")

	if changed, err := checkSource(ctx, src, second); err != nil || len(changed) != 0 {
		t.Errorf("HEAD at the pin: got changed %q, %v; want none", changed, err)
	}
	_, err := checkSource(ctx, src, first)
	if err == nil {
		t.Fatal("HEAD not at the pin: no error")
	}
	for _, want := range []string{second, first, "checkout --detach " + first} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("HEAD not at the pin: error %q does not contain %q", err, want)
		}
	}

	write(main, "package main\n\nfunc main() { println() }\n")
	if changed, err := checkSource(ctx, src, second); err != nil || len(changed) != 1 || changed[0] != "cmd/dra-example-kubeletplugin/main.go" {
		t.Errorf("changed tracked file: got %q, %v; want [cmd/dra-example-kubeletplugin/main.go]", changed, err)
	}

	missing := filepath.Join(t.TempDir(), "src")
	if _, err := checkSource(ctx, missing, second); err == nil || !strings.Contains(err.Error(), "git clone https://github.com/kubernetes-sigs/dra-example-driver "+missing) {
		t.Errorf("no source: got %v, want the git clone command", err)
	}
}

// TestPeerCommitPinned: the Makefile prepares the commit the test checks,
// and BENCHMARKS.md names it as the one measured.
func TestPeerCommitPinned(t *testing.T) {
	t.Parallel()
	for file, want := range map[string]string{
		"Makefile":      "\nPEER_COMMIT := " + pinnedCommit + "\n",
		"BENCHMARKS.md": "(commit `" + pinnedCommit[:7] + "`",
	} {
		b, err := os.ReadFile(filepath.Join("..", "..", file))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), want) {
			t.Errorf("%s does not contain %q: pin dra-example-driver at test/peers' pinnedCommit in both (and re-measure when it changes)", file, want)
		}
	}
}
