package hostevents_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vfnet-io/vfnet/driver/kernel/hostevents"
)

func uevent(fields ...string) []byte {
	return []byte(strings.Join(fields, "\x00") + "\x00")
}

func TestParseUevent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		msg  []byte
		want string // Event.String(); "" for not an event
	}{
		{"VF bound", uevent("bind@/devices/pci0000:3a/0000:3a:00.0/0000:3b:02.1", "ACTION=bind", "DEVPATH=/devices/pci0000:3a/0000:3a:00.0/0000:3b:02.1",
			"SUBSYSTEM=pci", "DRIVER=vfio-pci", "PCI_SLOT_NAME=0000:3b:02.1", "SEQNUM=4711"), "uevent bind pci 0000:3b:02.1 vfio-pci"},
		{"sriov_numvfs written", uevent("change@/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0", "ACTION=change", "DEVPATH=/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0",
			"SUBSYSTEM=pci", "PCI_SLOT_NAME=0000:3b:00.0"), "uevent change pci 0000:3b:00.0"},
		{"PCI slot name missing", uevent("remove@/devices/pci0000:3a/0000:3b:02.1", "ACTION=remove", "DEVPATH=/devices/pci0000:3a/0000:3b:02.1", "SUBSYSTEM=pci"),
			"uevent remove pci 0000:3b:02.1"},
		{"netdev renamed", uevent("move@/devices/x/net/ens1f0", "ACTION=move", "DEVPATH=/devices/x/net/ens1f0", "SUBSYSTEM=net", "INTERFACE=ens1f0", "DEVPATH_OLD=/devices/x/net/eth0"),
			"uevent move net ens1f0 was eth0"},
		{"virtual netdev", uevent("add@/devices/virtual/net/veth1a2b", "ACTION=add", "DEVPATH=/devices/virtual/net/veth1a2b", "SUBSYSTEM=net", "INTERFACE=veth1a2b"),
			"uevent add net veth1a2b"},
		{"another subsystem", uevent("add@/devices/virtual/block/loop0", "ACTION=add", "SUBSYSTEM=block"), ""},
		{"udevd's re-broadcast", append([]byte("libudev\x00\xfe\xed\xca\xfe"), uevent("ACTION=add", "SUBSYSTEM=pci")...), ""},
		{"no header", uevent("ACTION=add", "SUBSYSTEM=pci"), ""},
		{"no action", uevent("add@/devices/x", "SUBSYSTEM=pci", "PCI_SLOT_NAME=0000:3b:02.1"), ""},
		{"empty", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, ok := hostevents.ParseUevent(tc.msg)
			got := ""
			if ok {
				got = e.String()
			}
			if got != tc.want {
				t.Errorf("ParseUevent = %q (ok %v), want %q", got, ok, tc.want)
			}
		})
	}
}

// TestUeventFunction: a PCI netdev's uevent names its function, a virtual
// one's none.
func TestUeventFunction(t *testing.T) {
	t.Parallel()
	for devpath, want := range map[string]string{
		"/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/net/ens1f0": "0000:3b:00.0",
		"/devices/pci0000:3a/0000:3a:00.0/0000:3b:02.1/net/eth7":   "0000:3b:02.1",
		"/devices/virtual/net/veth1a2b":                            "",
		"/devices/pci0000:00/0000:00:03.0/virtio0/net/eth0":        "",
	} {
		e, ok := hostevents.ParseUevent(uevent("add@"+devpath, "ACTION=add", "DEVPATH="+devpath, "SUBSYSTEM=net", "INTERFACE=x"))
		if !ok || e.Function != want {
			t.Errorf("%s: Function %q (ok %v), want %q", devpath, e.Function, ok, want)
		}
	}
}

// TestCoalesce: a burst is one call with all its events; a stream that
// never pauses is still delivered once max has passed.
func TestCoalesce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	t.Run("burst", func(t *testing.T) {
		in := make(chan hostevents.Event, 10)
		got := make(chan []hostevents.Event, 10)
		done := make(chan struct{})
		go func() {
			defer close(done)
			hostevents.Coalesce(ctx, in, 200*time.Millisecond, time.Hour, func(b []hostevents.Event) { got <- b })
		}()
		for i := range 5 {
			in <- hostevents.Event{Kind: hostevents.Uevent, Action: "add", Subsystem: "pci", Device: fmt.Sprint(i)}
		}
		if b := <-got; len(b) != 5 {
			t.Fatalf("first call had %d events, want the burst's 5", len(b))
		}
		close(in)
		<-done
		select {
		case b := <-got:
			t.Fatalf("another call with %v after the burst", b)
		default:
		}
	})
	t.Run("never quiet", func(t *testing.T) {
		in := make(chan hostevents.Event)
		got := make(chan []hostevents.Event, 1)
		go hostevents.Coalesce(ctx, in, time.Hour, 100*time.Millisecond, func(b []hostevents.Event) {
			select {
			case got <- b:
			default:
			}
		})
		stop := make(chan struct{})
		go func() {
			for {
				select {
				case <-stop:
					return
				case in <- hostevents.Event{Kind: hostevents.Link, Device: "pf0"}:
				}
			}
		}()
		defer close(stop)
		if b := <-got; len(b) == 0 {
			t.Fatal("called with no events")
		}
	})
}

func TestSummary(t *testing.T) {
	t.Parallel()
	evs := []hostevents.Event{
		{Kind: hostevents.Uevent, Action: "add", Subsystem: "pci", Device: "0000:3b:02.0"},
		{Kind: hostevents.Uevent, Action: "add", Subsystem: "pci", Device: "0000:3b:02.1"},
		{Kind: hostevents.Uevent, Action: "add", Subsystem: "pci", Device: "0000:3b:02.1"},
		{Kind: hostevents.Link, Action: "new", Device: "pf0", Detail: "down"},
		{Kind: hostevents.Uevent, Action: "change", Subsystem: "pci", Device: "0000:3b:00.0"},
	}
	want := "1 link, 4 uevent: link new pf0 down; uevent add pci 0000:3b:02.0; uevent add pci 0000:3b:02.1; ...; uevent change pci 0000:3b:00.0"
	if got := hostevents.Summary(evs); got != want {
		t.Errorf("Summary = %q, want %q", got, want)
	}
}

// TestRealKernelNotifications runs both kernel sources against this
// machine's kernel, in a network namespace of their own (a netdev's uevents
// and link notifications go only to the namespace it is in): a bridge
// netdev is added, set up, renamed and deleted there.
func TestRealKernelNotifications(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: it creates a network namespace (make test runs as root)")
	}
	nsPath, h := freshNetns(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	events := make(chan hostevents.Event, 64)
	watched := func(n string) bool { return strings.HasPrefix(n, "vfnetev") }
	for _, src := range []hostevents.Source{hostevents.UeventSource{Netns: nsPath}, hostevents.LinkSource{Netns: nsPath, Watch: watched}} {
		go func() {
			if err := src.Run(ctx, events); err != nil && ctx.Err() == nil {
				t.Errorf("%s: %v", src.Name(), err)
			}
		}()
	}
	// The subscriptions are made asynchronously: retry the first change
	// until an event shows they are in place.
	deadline := time.Now().Add(30 * time.Second)
	var first hostevents.Event
	for i := 0; first.Kind == "" && time.Now().Before(deadline); i++ {
		name := fmt.Sprintf("vfnetev%d", i)
		if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
			t.Fatalf("add bridge netdev (a netdev type this kernel has built in): %v", err)
		}
		select {
		case first = <-events:
		case <-time.After(time.Second):
		}
	}
	if first.Kind == "" {
		t.Fatal("no event for an added netdev within 30 s")
	}
	drain := func() []string {
		var out []string
		for {
			select {
			case e := <-events:
				out = append(out, e.String())
			case <-time.After(time.Second):
				return out
			}
		}
	}
	drain()
	l, err := h.LinkByName("vfnetev0")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetName(l, "vfnetevR"); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "vfnetevR", Index: l.Attrs().Index}}); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkDel(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Index: l.Attrs().Index}}); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(drain(), "\n")
	for _, want := range []string{"uevent move net vfnetevR was vfnetev0", "link new vfnetevR", "uevent remove net vfnetevR", "link del vfnetevR"} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q among the events:\n%s", want, got)
		}
	}
}

// freshNetns makes a network namespace that lives as long as the test, and
// a netlink handle in it.
func freshNetns(t *testing.T) (string, *netlink.Handle) {
	t.Helper()
	ready := make(chan string)
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the namespace
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			t.Errorf("unshare -n: %v", err)
			close(ready)
			return
		}
		ready <- fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		<-done
	}()
	p, ok := <-ready
	if !ok {
		t.FailNow()
	}
	ns, err := netns.GetFromPath(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return p, h
}

// TestFileSource: the file replaced by rename and a ConfigMap volume's
// "..data" swap are changes; another file written in the same directory
// is not.
func TestFileSource(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "node-config.yaml")
	if err := os.WriteFile(path, []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	events := make(chan hostevents.Event, 64)
	go func() {
		if err := (hostevents.FileSource{Path: path}).Run(ctx, events); err != nil {
			t.Errorf("FileSource: %v", err)
		}
	}()
	next := func() (hostevents.Event, bool) {
		select {
		case e := <-events:
			return e, true
		case <-time.After(2 * time.Second):
			return hostevents.Event{}, false
		}
	}
	// The watch is added asynchronously: write until the first event.
	var first hostevents.Event
	for i := 0; first.Kind == "" && i < 30; i++ {
		if err := os.WriteFile(path, []byte(fmt.Sprint(i)), 0o644); err != nil {
			t.Fatal(err)
		}
		first, _ = next()
	}
	if first.Kind != hostevents.Config {
		t.Fatalf("no event for the file written: %+v", first)
	}
	for ok := true; ok; _, ok = next() {
	}
	if err := os.WriteFile(filepath.Join(dir, "driver.log"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if e, ok := next(); ok {
		t.Fatalf("an event for another file in the directory: %v", e)
	}
	tmp := filepath.Join(dir, "..2026_12_06")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Base(tmp), filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if e, ok := next(); !ok || e.Kind != hostevents.Config {
		t.Fatalf("no event for the ..data swap: %+v", e)
	}
}
