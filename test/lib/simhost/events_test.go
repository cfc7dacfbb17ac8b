package simhost

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/vfnet-io/vfnet/driver/kernel/hostevents"
)

// listen starts the host's event sources, as the driver does, and returns
// a function that collects what arrived until a second passes quietly.
func listen(t *testing.T, h *Host, watch func(string) bool) func() string {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	events := make(chan hostevents.Event, 4096)
	for _, src := range h.EventSources(watch) {
		go func() {
			if err := src.Run(ctx, events); err != nil && ctx.Err() == nil {
				t.Errorf("%s: %v", src.Name(), err)
			}
		}()
	}
	// The sockets are bound asynchronously: wait until both are there.
	deadline := time.Now().Add(10 * time.Second)
	for !(h.hasListeners("uevent-") && h.hasListeners("rtnl-")) {
		if time.Now().After(deadline) {
			t.Fatal("the event sources bound no socket within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return func() string {
		var out []string
		for {
			select {
			case e := <-events:
				out = append(out, e.String())
			case <-time.After(time.Second):
				return strings.Join(out, "\n")
			}
		}
	}
}

func wantEvents(t *testing.T, what, got string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("%s: no %q among the events:\n%s", what, w, got)
		}
	}
}

// TestNotifications: each change the simulated kernel makes reaches a
// listener in the kernel's wire format, decoded by the driver's own
// decoders, as a real kernel's would.
func TestNotifications(t *testing.T) {
	t.Parallel()
	h := build(t, E810Host())
	collect := listen(t, h, func(n string) bool { return strings.HasPrefix(n, "enp59s0f0") && !strings.Contains(n, "v") })

	toVFIO(t, h, "0000:3b:02.1", "iavf")
	wantEvents(t, "VF handed to vfio-pci", collect(),
		"uevent remove net enp59s0f0v1", "uevent unbind pci 0000:3b:02.1", "uevent bind pci 0000:3b:02.1 vfio-pci")

	if err := h.SetNumVFs("0000:3b:00.0", 2); err != nil {
		t.Fatal(err)
	}
	got := collect()
	wantEvents(t, "sriov_numvfs through 0 to 2", got,
		"uevent remove pci 0000:3b:02.3", "uevent add pci 0000:3b:02.0", "uevent bind pci 0000:3b:02.0 iavf", "uevent change pci 0000:3b:00.0")
	if strings.Contains(got, "add pci 0000:3b:02.3") {
		t.Errorf("VF 3 added back although the count is 2:\n%s", got)
	}

	if err := h.SetOperState("enp59s0f0", "down"); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, "PF link down", collect(), "link new enp59s0f0 down")

	mac, _ := net.ParseMAC("02:00:00:00:00:01")
	if err := h.Links().SetMAC("enp59s0f0", 1, mac); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, "VF MAC set through the PF", collect(), "link new enp59s0f0")

	if got := collect(); got != "" {
		t.Errorf("events without a change:\n%s", got)
	}
	// A netdev the driver does not watch: no link event, its uevents still.
	if err := h.RenameNetdev("enp59s0f0v0", "vfx0"); err != nil {
		t.Fatal(err)
	}
	got = collect()
	wantEvents(t, "VF netdev renamed", got, "uevent move net vfx0 was enp59s0f0v0")
	if strings.Contains(got, "link new vfx0") {
		t.Errorf("a link event for a netdev the watch rejects:\n%s", got)
	}

	if err := h.RemovePF("0000:3b:00.0"); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, "PF hot-unplugged", collect(), "uevent remove pci 0000:3b:02.1", "uevent remove pci 0000:3b:00.0", "uevent remove net enp59s0f0")
}

// TestNotificationsNoListener: without a listener nothing is sent, and a
// listener that went away without removing its socket is cleaned up.
func TestNotificationsNoListener(t *testing.T) {
	t.Parallel()
	h := build(t, E810Host())
	ctx, cancel := context.WithCancel(t.Context())
	src := h.EventSources(nil)[0]
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, make(chan hostevents.Event, 1)) }()
	for !h.hasListeners("uevent-") {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if h.hasListeners("uevent-") {
		t.Fatal("a stopped listener left its socket")
	}
	toVFIO(t, h, "0000:3b:02.1", "iavf") // must not fail or block
}
