package kernel

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vfnet-io/vfnet/test/kernel/layout"
)

// readNewc is an independent reader of the newc format (as the kernel's
// initramfs unpacker reads it): 110-byte ASCII header, name, padding to 4.
func readNewc(t *testing.T, data []byte) (names []string, modes []uint32, bodies map[string]string) {
	t.Helper()
	bodies = map[string]string{}
	off := 0
	field := func(i int) uint32 {
		v, err := strconv.ParseUint(string(data[off+6+8*i:off+14+8*i]), 16, 32)
		if err != nil {
			t.Fatalf("header at %d field %d: %v", off, i, err)
		}
		return uint32(v)
	}
	align := func(n int) int { return (n + 3) &^ 3 }
	for {
		if string(data[off:off+6]) != "070701" {
			t.Fatalf("bad magic at %d: %q", off, data[off:off+6])
		}
		mode, size, namesize := field(1), int(field(6)), int(field(11))
		name := string(data[off+110 : off+110+namesize-1])
		if data[off+110+namesize-1] != 0 {
			t.Fatalf("name %q not NUL-terminated", name)
		}
		off = align(off + 110 + namesize)
		if name == "TRAILER!!!" {
			break
		}
		names = append(names, name)
		modes = append(modes, mode)
		bodies[name] = string(data[off : off+size])
		off = align(off + size)
	}
	if len(data)%512 != 0 {
		t.Errorf("archive is %d bytes, not padded to 512", len(data))
	}
	return names, modes, bodies
}

func TestCPIOWritesNewc(t *testing.T) {
	src := filepath.Join(t.TempDir(), "prog")
	if err := os.WriteFile(src, []byte("#!x\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	c := NewCPIO(&buf)
	c.Dir("/dev", 0o755)
	c.File("etc/vfnet/layout.json", 0o644, []byte("{}"))
	c.CopyFile("/usr/bin/prog", src)
	c.Symlink("/bin/sh", "busybox")
	c.File("/etc/vfnet/odd", 0o600, []byte("12345")) // needs padding
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	names, modes, bodies := readNewc(t, buf.Bytes())
	wantNames := []string{"dev", "etc", "etc/vfnet", "etc/vfnet/layout.json", "usr", "usr/bin", "usr/bin/prog", "bin", "bin/sh", "etc/vfnet/odd"}
	if !reflect.DeepEqual(names, wantNames) {
		t.Fatalf("entries %v, want %v (parents before children, each once)", names, wantNames)
	}
	wantModes := map[string]uint32{"dev": 0o40755, "usr/bin/prog": 0o100755, "bin/sh": 0o120777, "etc/vfnet/odd": 0o100600}
	for i, n := range names {
		if m, ok := wantModes[n]; ok && modes[i] != m {
			t.Errorf("%s mode %o, want %o", n, modes[i], m)
		}
	}
	if bodies["usr/bin/prog"] != "#!x\n" || bodies["bin/sh"] != "busybox" || bodies["etc/vfnet/odd"] != "12345" {
		t.Errorf("bodies %q", bodies)
	}
}

func TestCPIOReportsMissingFile(t *testing.T) {
	c := NewCPIO(&bytes.Buffer{})
	c.CopyFile("/x", filepath.Join(t.TempDir(), "absent"))
	if err := c.Close(); err == nil || !strings.Contains(err.Error(), "absent") {
		t.Fatalf("Close = %v, want an error naming the missing file", err)
	}
}

func TestLoadOrderPutsDependenciesFirst(t *testing.T) {
	deps := map[string][]string{
		"vfio_pci":         {"vfio_pci_core", "vfio"},
		"vfio_pci_core":    {"vfio", "irqbypass"},
		"vfio":             {},
		"irqbypass":        {},
		"vfio_iommu_type1": {"vfio"},
		"igb":              {"dca", "i2c_algo_bit", "ptp"},
		"ptp":              {"pps_core"},
	}
	builtin := map[string]bool{"dca": true, "i2c_algo_bit": true, "pps_core": true}
	got, err := LoadOrder([]string{"vfio-pci", "vfio_iommu_type1", "igb"}, func(n string) ([]string, bool, error) {
		return deps[n], !builtin[n], nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"vfio", "irqbypass", "vfio_pci_core", "vfio_pci", "vfio_iommu_type1", "ptp", "igb"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

func TestLoadOrderCycle(t *testing.T) {
	_, err := LoadOrder([]string{"a"}, func(n string) ([]string, bool, error) {
		return map[string][]string{"a": {"b"}, "b": {"a"}}[n], true, nil
	})
	if err == nil || !strings.Contains(err.Error(), "a -> b -> a") {
		t.Fatalf("err = %v, want the cycle named", err)
	}
}

func TestParseDepends(t *testing.T) {
	info := []byte("license=GPL\x00depends=vfio,vfio-pci-core,irqbypass\x00retpoline=Y\x00name=vfio_pci\x00")
	if got, want := parseDepends(info), []string{"vfio", "vfio_pci_core", "irqbypass"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("depends %v, want %v", got, want)
	}
	if got := parseDepends([]byte("depends=\x00name=vfio\x00")); len(got) != 0 {
		t.Fatalf("empty depends = %v", got)
	}
}

func TestParseConsole(t *testing.T) {
	log := strings.Join([]string{
		"[    0.000000] Linux version 6.1.0",
		"vfnet init: machine ready",
		"VFNET-CASE discovery BEGIN",
		"=== RUN   TestDiscoveryAndInspect",
		"[   12.3] igb 0000:01:00.0: 4 VFs allocated",
		"--- PASS: TestDiscoveryAndInspect (1.2s)",
		"VFNET-CASE discovery PASS (1.3s)",
		"VFNET-CASE prepare BEGIN",
		"    prepare_test.go:10: VF not restored",
		"[  13.0] some kernel text VFNET-CASE prepare FAIL exit status 1 (2s)",
		"VFNET-CASE vfio BEGIN",
		"guest hangs here",
	}, "\r\n") + "\r\n"
	c, err := ParseConsole(strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	if c.Done {
		t.Error("Done without VFNET-DONE")
	}
	d, _ := c.Case("discovery")
	if d.Status != "PASS" || d.Detail != "(1.3s)" || !strings.Contains(d.Output, "4 VFs allocated") {
		t.Errorf("discovery = %+v", d)
	}
	p, _ := c.Case("prepare")
	if p.Status != "FAIL" || p.Detail != "exit status 1 (2s)" || !strings.Contains(p.Output, "VF not restored") || !strings.Contains(p.Output, "some kernel text") {
		t.Errorf("prepare = %+v", p)
	}
	v, ok := c.Case("vfio")
	if !ok || v.Status != "" || !strings.Contains(v.Output, "guest hangs here") {
		t.Errorf("vfio = %+v, %v: want an unfinished case with its output", v, ok)
	}
	if _, ok := c.Case("crash"); ok {
		t.Error("a case that never began has a result")
	}
	c, _ = ParseConsole(strings.NewReader("VFNET-CASE a BEGIN\nVFNET-CASE a SKIP\nVFNET-DONE\n"))
	if a, _ := c.Case("a"); !c.Done || a.Status != "SKIP" {
		t.Errorf("got %+v done=%v", c.Results, c.Done)
	}
}

func TestCaseCPUMeasuresBetweenMarks(t *testing.T) {
	m := NewCaseCPU()
	m.start(os.Getpid())
	// Marks may arrive split across writes and after other text.
	fmt.Fprint(m, "[ 1.0] kernel says hi\nVFNET-CASE busy BE")
	fmt.Fprint(m, "GIN\nVFNET-CASE hung BEGIN\n"+layout.MarkWindow+" idle BEGIN\n")
	// Spin until this process has used 200ms of CPU, by getrusage: on a
	// loaded machine wall time says nothing of the CPU a spin gets.
	begin := selfCPU(t)
	for n := 0; selfCPU(t)-begin < 200*time.Millisecond; n++ {
		_ = n * n
	}
	fmt.Fprint(m, "output\nVFNET-CASE busy PASS (0.3s)\n"+layout.MarkWindow+" idle END\n")
	used, ok := m.Used("busy")
	// /proc/<pid>/stat counts in 10ms ticks.
	if !ok || used < 150*time.Millisecond {
		t.Fatalf("busy used %v (%v), want at least 150ms of the 200ms of CPU spun", used, ok)
	}
	if _, ok := m.Used("hung"); ok {
		t.Fatal("a case that never ended has a CPU time")
	}
	if w := m.Windows(); w["idle"] < 150*time.Millisecond || len(w) != 1 {
		t.Fatalf("windows %v, want idle with at least 150ms", w)
	}
}

func selfCPU(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestLoadVirtReadsVersion: the env file hack/virt-deps.sh writes gives the
// libvirt version the tier logs, next to the paths.
func TestLoadVirtReadsVersion(t *testing.T) {
	dir := t.TempDir()
	env := "VIRT_ROOT=/c/virt/root\nLIBVIRT_VERSION=/c/virt/root/usr/sbin/libvirtd (libvirt) 11.3.0\nVIRT_LIBS=/c/a:/c/b\n"
	if err := os.WriteFile(filepath.Join(dir, "env"), []byte(env), 0o644); err != nil {
		t.Fatal(err)
	}
	v, err := LoadVirt(dir)
	if err != nil {
		t.Fatal(err)
	}
	if v.Root != "/c/virt/root" || v.Version != "/c/virt/root/usr/sbin/libvirtd (libvirt) 11.3.0" || !reflect.DeepEqual(v.Libs, []string{"/c/a", "/c/b"}) {
		t.Errorf("LoadVirt: root %q, version %q, libs %q", v.Root, v.Version, v.Libs)
	}
}

// The wire (a hub between layout.WirePF and the peer NIC) is in the
// machine only when a case needs it, and never on the main PF, whose VFs
// the crash case rebinds.
func TestQEMUArgsWireOnlyWhenACaseNeedsIt(t *testing.T) {
	e := &Env{Vmlinux: "vmlinux"}
	for _, tc := range []struct {
		cases []string
		wire  bool
	}{
		{[]string{"prepare", "crash"}, false},
		{[]string{"prepare", "vm"}, true},
		{[]string{"wire"}, true},
		{[]string{"prepare", "wire"}, true},
		{[]string{"failover"}, true},
		{nil, true}, // every case
	} {
		args := strings.Join(e.QEMUArgs("initrd", tc.cases, false), " ")
		hub := strings.Contains(args, "hubport") || strings.Contains(args, "netdev=wire0") ||
			strings.Contains(args, "addr=0x6") || strings.Contains(args, "iomem=relaxed") || strings.Contains(args, "rp4")
		if hub != tc.wire {
			t.Errorf("cases %v: wire in the machine %v, want %v: %s", tc.cases, hub, tc.wire, args)
		}
		if tc.wire && !strings.Contains(args, "igb,bus=rp4,addr=0x0,netdev=wire0") {
			t.Errorf("cases %v: the wire's PF is not on the hub: %s", tc.cases, args)
		}
		if strings.Contains(args, "igb,bus=rp1,addr=0x0,") {
			t.Errorf("cases %v: the main PF has a network backend: %s", tc.cases, args)
		}
	}
}

// A guest with memory above 4 GiB (the kubevirt case's) keeps its VF BARs
// under 4 GiB: with 36 or more physical address bits SeaBIOS maps them
// high, where QEMU's igb VFs never see the guest's writes. QEMU refuses
// the 35 bits unless the 64-bit hole fits in them.
func TestQEMUArgsKeepVFBARsLowWithMemoryAbove4G(t *testing.T) {
	e := &Env{Vmlinux: "vmlinux"}
	for _, tc := range []struct {
		cases []string
		low   bool
	}{
		{[]string{"prepare", "vm"}, false},
		{nil, false},
		{[]string{"kubevirt"}, true},
	} {
		args := e.QEMUArgs("initrd", tc.cases, true)
		joined := strings.Join(args, " ")
		mem := ""
		for i, a := range args {
			if a == "-m" && i+1 < len(args) {
				mem = args[i+1]
			}
		}
		var mib int
		if _, err := fmt.Sscanf(mem, "%dM", &mib); err != nil {
			t.Fatalf("cases %v: -m %q: %v", tc.cases, mem, err)
		}
		if above := mib > q35LowMemMiB; above != tc.low {
			t.Errorf("cases %v: %d MiB, memory above 4 GiB %v, want %v", tc.cases, mib, above, tc.low)
		}
		phys35 := strings.Contains(joined, "-cpu qemu64,-monitor,phys-bits=35 ")
		hole := strings.Contains(joined, "-global q35-pcihost.pci-hole64-size=2G")
		if phys35 != tc.low || hole != tc.low {
			t.Errorf("cases %v: phys-bits=35 %v, 2G 64-bit hole %v, want both %v: %s", tc.cases, phys35, hole, tc.low, joined)
		}
	}
}
