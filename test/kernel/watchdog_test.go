package kernel

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vfnet-io/vfnet/test/kernel/layout"
)

func TestMarkWatcherSeesMarksSplitAcrossWrites(t *testing.T) {
	var out bytes.Buffer
	w := newMarkWatcher(&out, layout.MarkInitStarted, layout.MarkInitReady)
	for _, p := range []string{"[    1.0] kernel line\nvfnet in", "it: sta", "rted\n", "vfnet init: machine"} {
		if _, err := w.Write([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	if !w.has(layout.MarkInitStarted) {
		t.Error("a mark written in three pieces was not seen")
	}
	if w.has(layout.MarkInitReady) {
		t.Error("half a mark counted as the mark")
	}
	w.Write([]byte(" ready after 1s\n"))
	if !w.has(layout.MarkInitReady) {
		t.Error("the ready mark was not seen once whole")
	}
	if !strings.HasSuffix(out.String(), "machine ready after 1s\n") || !strings.HasPrefix(out.String(), "[    1.0]") {
		t.Errorf("the writes were not passed through whole: %q", out.String())
	}
}

func TestSymbolsLookup(t *testing.T) {
	t.Parallel()
	s := &symbols{
		addr: []uint64{0xffffffff81000000, 0xffffffff81000800, 0xffffffff81001000},
		name: []string{"_stext", "do_one_initcall", "default_idle"},
	}
	for addr, want := range map[uint64]string{
		0xffffffff81001004: "near default_idle+0x4",
		0xffffffff81000810: "near do_one_initcall+0x10",
		0xffffffff80ffffff: "",
		0x00007f0000001000: "",
	} {
		if got := s.lookup(addr); got != want {
			t.Errorf("lookup(%x) = %q, want %q", addr, got, want)
		}
	}
}

// The exported-symbol table of the tier's kernel (when hack/kernel-deps.sh
// has prepared it) holds well-known functions at kernel text addresses.
func TestKsymtabOfTheTierKernel(t *testing.T) {
	t.Parallel()
	env, err := LoadEnv(filepath.Join(cacheDir(t, repoRoot(t)), "kernel"))
	if err != nil {
		t.Fatalf("no prepared kernel (%v): run make kernel-deps", err)
	}
	s, err := loadKsymtab(env.Vmlinux)
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]uint64{}
	for i, n := range s.name {
		found[n] = s.addr[i]
	}
	for _, n := range []string{"_printk", "schedule", "kmalloc_trace", "pci_enable_sriov"} {
		a, ok := found[n]
		if !ok || a < 0xffffffff80000000 {
			t.Errorf("exported symbol %s: address %#x found %v", n, a, ok)
		} else if got := s.lookup(a + 1); got != "near "+n+"+0x1" && !strings.HasSuffix(got, "+0x1") {
			t.Errorf("lookup(%s+1) = %q", n, got)
		}
	}
	t.Logf("%d exported symbols", len(s.addr))
}

// fakeQEMU writes an executable standing in for QEMU.
func fakeQEMU(t *testing.T, script string) *Env {
	t.Helper()
	dir := t.TempDir()
	q := filepath.Join(dir, "qemu")
	if err := os.WriteFile(q, []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return &Env{Dir: dir, QEMU: q, KernelRelease: "none"}
}

func TestRunStopsAStalledBoot(t *testing.T) {
	t.Parallel()
	// A kernel that prints and then hangs before its init.
	e := fakeQEMU(t, `echo "[    0.5] Linux version 6.1"; exec sleep 60`)
	var console bytes.Buffer
	start := time.Now()
	err := e.Run(context.Background(), RunOptions{Console: &console, BootTimeout: 300 * time.Millisecond})
	var stall *BootStallError
	if !errors.As(err, &stall) {
		t.Fatalf("Run = %v, want a BootStallError", err)
	}
	if stall.Started {
		t.Error("the init never started, yet the stall says it did")
	}
	if !strings.Contains(err.Error(), "never started the init") || !strings.Contains(stall.CPUs, "sample 1:") {
		t.Errorf("the error does not say where the boot stopped: %v", err)
	}
	if time.Since(start) > 50*time.Second {
		t.Error("the stalled QEMU was not stopped")
	}
	if !strings.Contains(console.String(), "Linux version") {
		t.Errorf("the console lost what the kernel printed: %q", console.String())
	}
}

func TestRunLetsAReadyGuestFinish(t *testing.T) {
	t.Parallel()
	e := fakeQEMU(t, `echo "`+layout.MarkInitStarted+`"; sleep 0.5; echo "`+layout.MarkInitReady+` after 1s"; sleep 1; echo `+MarkDone)
	var console bytes.Buffer
	if err := e.Run(context.Background(), RunOptions{Console: &console, BootTimeout: 5 * time.Second}); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if !strings.Contains(console.String(), MarkDone) {
		t.Errorf("the run ended before the guest did: %q", console.String())
	}
}

func TestRunStallAfterInitStarted(t *testing.T) {
	t.Parallel()
	e := fakeQEMU(t, `echo "`+layout.MarkInitStarted+`"; exec sleep 60`)
	err := e.Run(context.Background(), RunOptions{Console: &bytes.Buffer{}, BootTimeout: 300 * time.Millisecond})
	var stall *BootStallError
	if !errors.As(err, &stall) || !stall.Started || !strings.Contains(err.Error(), "machine set-up") {
		t.Fatalf("Run = %v, want a stall after the init started", err)
	}
}
